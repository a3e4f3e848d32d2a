// SPDX-License-Identifier: Apache-2.0
//! The compat object (kernels without attach cookies, `bpf_loop` or
//! compare-and-exchange: 5.10 to 5.16) loads whole on this kernel as well:
//! every op's own programs, verified by several threads at once.

mod fixtures;

use std::time::Instant;

use fixtures::*;
use ingero_agent::probes::features::{ATTACH_COOKIE, Features, Object};
use ingero_agent::probes::load::Probes;
use ingero_agent::probes::ops;

#[test]
fn the_compat_object_loads_every_ops_programs() {
    if !can_trace() {
        return;
    }
    let mut features = Features::probe().expect("loading the feature probes");
    features.without(ATTACH_COOKIE);
    assert_eq!(features.object(), Object::Compat);
    // Program ids only grow: what this test loads is above the highest now.
    let before = aya::programs::loaded_programs().flatten().map(|p| p.id()).max().unwrap_or(0);
    let t = Instant::now();
    let _probes = Probes::load_with(features, &Default::default()).expect("loading the compat object");
    eprintln!("compat object loaded in {:.2} s", t.elapsed().as_secs_f64());
    let mut names: Vec<String> = aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.id() > before)
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .filter(|n| n.starts_with("call_entry_") || n.starts_with("call_return_"))
        .collect();
    names.sort();
    let mut want: Vec<String> = ops::all()
        .iter()
        .flat_map(|op| {
            let entry = format!("call_entry_{}", op.id);
            if op.return_probed() { vec![entry, format!("call_return_{}", op.id)] } else { vec![entry] }
        })
        .collect();
    want.sort();
    assert_eq!(names, want);
}
