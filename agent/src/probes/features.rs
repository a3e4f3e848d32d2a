// SPDX-License-Identifier: Apache-2.0
//! What this kernel's BPF can do, and what the agent loses without each
//! feature. Probed by loading one tiny program per feature
//! (ebpf/features.bpf.c), never inferred from the kernel version:
//! distributions backport BPF features, and a version says nothing of them.

use aya::EbpfLoader;
use std::os::fd::AsFd;

use aya::programs::UProbe;

use crate::error::Result;

/// The feature probes (built by build.rs from ebpf/features.bpf.c).
pub(crate) static FEATURES_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/features.bpf.o"));

/// One kernel feature: the program that needs it, the first mainline
/// kernel that has it, and what the agent does without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    pub program: &'static str,
    pub since: &'static str,
    pub without: &'static str,
}

pub const ATTACH_COOKIE: Feature = Feature {
    name: "attach cookies",
    program: "has_attach_cookie",
    since: "5.15",
    without: "nothing: one call program per op instead (more programs loaded)",
};
pub const LOOP: Feature = Feature {
    name: "bpf_loop",
    program: "has_loop",
    since: "5.17",
    without: "Python frames of slow calls (native call sites kept), and off-CPU call sites",
};
pub const CMPXCHG: Feature = Feature {
    name: "cmpxchg",
    program: "has_cmpxchg",
    since: "5.12",
    without: "exact max durations when two CPUs race (the smaller may be kept)",
};
pub const SLEEPABLE_UPROBE: Feature = Feature {
    name: "sleepable uprobe",
    program: "has_sleepable_uprobe",
    since: "5.19",
    without: "first calls into a CUDA library a process dlopens and calls at once",
};
pub const FIND_VMA: Feature =
    Feature { name: "bpf_find_vma", program: "has_find_vma", since: "5.17", without: "as above (both are needed)" };

pub const UPROBE_MULTI: Feature = Feature {
    name: "uprobe_multi",
    program: "has_uprobe_multi",
    since: "6.6",
    without: "fast stops and detaches: each probe closes on its own, with an RCU wait (~80 ms; 10 s for 130 probes)",
};

/// Every probed feature, in the order `check` prints them.
pub const ALL: [Feature; 6] = [ATTACH_COOKIE, LOOP, CMPXCHG, SLEEPABLE_UPROBE, FIND_VMA, UPROBE_MULTI];

/// Which features this kernel has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    has: Vec<(Feature, bool)>,
}

/// Which of the two call-program objects a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// Cookies, bpf_loop, compare-and-exchange: Linux >= 5.17.
    Full,
    /// One program per op, no Python frames, racy maxima: 5.10 to 5.16.
    Compat,
}

impl Features {
    /// Loads each feature's program (and unloads it: nothing is attached).
    pub fn probe() -> Result<Features> {
        let mut ebpf = EbpfLoader::new().load(FEATURES_OBJECT)?;
        let has = ALL
            .iter()
            .map(|f| {
                let p = ebpf.program_mut(f.program).and_then(|p| <&mut UProbe>::try_from(p).ok());
                let ok = match p {
                    Some(p) if *f == UPROBE_MULTI => {
                        p.load_multi().is_ok() && p.fd().is_ok_and(|fd| super::multi::supported(fd.as_fd()))
                    }
                    Some(p) => p.load().is_ok(),
                    None => false,
                };
                (*f, ok)
            })
            .collect();
        Ok(Features { has })
    }

    /// As if the kernel lacked `f` (a flag turned it off).
    pub fn without(&mut self, f: Feature) {
        for (g, ok) in &mut self.has {
            if *g == f {
                *ok = false;
            }
        }
    }

    pub fn has(&self, f: Feature) -> bool {
        self.has.iter().any(|&(g, ok)| g == f && ok)
    }

    pub fn table(&self) -> &[(Feature, bool)] {
        &self.has
    }

    /// The full object needs all three; any one missing means compat.
    pub fn object(&self) -> Object {
        if self.has(ATTACH_COOKIE) && self.has(LOOP) && self.has(CMPXCHG) { Object::Full } else { Object::Compat }
    }

    /// Call probes as one uprobe_multi link per program and file (the full
    /// object only: the compat one has a program per op).
    pub fn multi_links(&self) -> bool {
        self.object() == Object::Full && self.has(UPROBE_MULTI)
    }

    /// The library hold is a program of the full object.
    pub fn library_hold(&self) -> bool {
        self.object() == Object::Full && self.has(SLEEPABLE_UPROBE) && self.has(FIND_VMA)
    }
}
