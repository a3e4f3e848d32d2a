// SPDX-License-Identifier: Apache-2.0
//! The track tree of an export: node → (straggler score, flagged spans,
//! processes → (counters, threads → outlier calls)).

use serde_json::Value;

use super::gather::{Nodes, Process, Scope};
use super::perfetto::{Builder, Slice, arg};

#[derive(Debug)]
pub(crate) struct Layout {
    pub builder: Builder,
    pub counters: usize,
    pub spans: usize,
}

const NS_PER_US: i64 = 1_000;

fn ns(us: i64) -> u64 {
    (us.max(0) as u64).saturating_mul(NS_PER_US as u64)
}

/// Where a node's windows start within their length, in ms: agents start
/// their window grids independently, and their clocks are only as close as
/// NTP/PTP keeps them.
fn grid_phase_ms(procs: &std::collections::BTreeMap<i64, Process>) -> Option<(f64, f64)> {
    let [t, w, ..] = procs.values().flat_map(|p| p.sched.first()).next()?;
    (*w > 0).then(|| ((t.rem_euclid(*w)) as f64 / 1e3, *w as f64 / 1e3))
}

fn clock_note(node: &str, phase: Option<(f64, f64)>, reference: Option<(&str, f64)>) -> String {
    let mut s = format!(
        "Times are {node}'s wall clock, as its agent stamped them (CLOCK_REALTIME); nodes line up only as \
         closely as NTP/PTP keeps their clocks."
    );
    if let Some((p, w)) = phase {
        s.push_str(&format!(" Its {w:.0} ms windows start {p:.1} ms past the boundary"));
        match reference {
            Some((r, rp)) if r != node => s.push_str(&format!(" ({:+.1} ms vs {r}).", p - rp)),
            _ => s.push('.'),
        }
    }
    s
}

pub(crate) fn build(nodes: &Nodes, ranking: &Value, scope: &Scope) -> Layout {
    let mut l = Layout { builder: Builder::default(), counters: 0, spans: 0 };
    let first = nodes.iter().find_map(|(n, p)| Some((n.as_str(), grid_phase_ms(p)?.0)));
    for (node, procs) in nodes {
        let track = l.builder.track(None, node, Some(clock_note(node, grid_phase_ms(procs), first)));
        straggler_tracks(&mut l, track, node, ranking, scope);
        for (pid, p) in procs {
            process_tracks(&mut l, track, *pid, p);
        }
    }
    l
}

/// The node's score per bin and its flagged spans, per job, from the
/// detector replayed over the range.
fn straggler_tracks(l: &mut Layout, node_track: u64, node: &str, ranking: &Value, scope: &Scope) {
    let tl = &ranking["timeline"];
    let (start, bin) = (tl["start_us"].as_i64().unwrap_or(scope.start_us), tl["bin_us"].as_i64().unwrap_or(0));
    if bin <= 0 {
        return;
    }
    for row in tl["nodes"].as_array().into_iter().flatten().filter(|r| r["node"] == node) {
        let job = row["job"].as_str().unwrap_or("");
        let c = l.builder.counter_track(node_track, &format!("straggler score · {job}"), "MAD");
        for (i, s) in row["score"].as_array().into_iter().flatten().enumerate() {
            if let Some(s) = s.as_f64().filter(|s| *s >= 0.0) {
                l.builder.counter(c, ns(start + i as i64 * bin), s);
                l.counters += 1;
            }
        }
        let spans: Vec<&Value> = row["flagged"].as_array().into_iter().flatten().collect();
        if spans.is_empty() {
            continue;
        }
        let why = ranking["stragglers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["node"] == node && s["job"] == job)
            .and_then(|s| s["signals"][0]["text"].as_str())
            .unwrap_or("");
        let t = l.builder.track(Some(node_track), &format!("straggler · {job}"), None);
        let slices = spans
            .iter()
            .filter_map(|r| Some((r[0].as_i64()?, r[1].as_i64()?)))
            .map(|(a, b)| Slice {
                start_ns: ns(start + a * bin),
                end_ns: ns(start + (b + 1) * bin),
                name: "flagged straggler".into(),
                category: "straggler".into(),
                args: vec![arg("job", job), arg("signal", why)],
            })
            .collect::<Vec<_>>();
        l.spans += slices.len();
        l.builder.slices(t, slices);
    }
}

/// (window start µs, window µs, value) of one counter.
type Points = Vec<(i64, i64, f64)>;

fn process_name(pid: i64, p: &Process) -> String {
    if pid == 0 {
        return "job-wide annotations".into();
    }
    let mut s = format!("{} {pid}", if p.comm.is_empty() { "pid" } else { &p.comm });
    if let Some(pod) = &p.pod {
        s.push_str(&format!(" · {pod}"));
    }
    if let Some(r) = p.rank {
        s.push_str(&format!(" · rank {r}"));
    }
    s
}

/// Counters per window (value at the window's start, 0 after a gap) and
/// one track per thread with its outlier calls.
fn process_tracks(l: &mut Layout, node_track: u64, pid: i64, p: &Process) {
    let desc = p.job.as_ref().map(|j| format!("job {j}"));
    let pt = l.builder.track(Some(node_track), &process_name(pid, p), desc);
    // [start µs, window µs, on, off, off in call, runq] → average threads in each state.
    let threads = |f: fn(&[i64; 6]) -> i64| {
        p.sched.iter().map(move |r| (r[0], r[1], f(r) as f64 / (r[1].max(1) * NS_PER_US) as f64)).collect::<Vec<_>>()
    };
    let series: [(&str, &str, Points); 5] = [
        ("run-queue wait", "threads", threads(|r| r[5])),
        ("off-CPU in host code", "threads", threads(|r| (r[3] - r[4]).max(0))),
        ("waiting in CUDA/NCCL", "threads", threads(|r| r[4])),
        ("on-CPU", "cores", threads(|r| r[2])),
        (
            "CUDA/NCCL calls",
            "calls/s",
            p.calls.iter().map(|r| (r[0], r[1], r[2] as f64 * 1e6 / r[1].max(1) as f64)).collect(),
        ),
    ];
    for (name, unit, points) in series {
        if points.is_empty() {
            continue;
        }
        let c = l.builder.counter_track(pt, name, unit);
        for (i, (t, w, v)) in points.iter().enumerate() {
            l.builder.counter(c, ns(*t), *v);
            l.counters += 1;
            if points.get(i + 1).is_none_or(|n| n.0 > t + w) {
                l.builder.counter(c, ns(t + w), 0.0);
            }
        }
    }
    annotation_track(l, pt, p);
    for (tid, stalls) in &p.stalls {
        let name = if *tid == pid { format!("thread {tid} (main)") } else { format!("thread {tid}") };
        let tt = l.builder.track(Some(pt), &name, None);
        let slices = stalls
            .iter()
            .map(|s| {
                let mut args = vec![
                    arg("duration_ms", s.duration_ns as f64 / 1e6),
                    arg("threshold_ms", s.threshold_ns as f64 / 1e6),
                    arg("reason", s.reason.as_str()),
                    arg("library", s.library.as_str()),
                ];
                if let Some(id) = s.stack_id {
                    args.push(arg("stack_id", format!("{id:016x}")));
                }
                let start = ns(s.start_us);
                Slice {
                    start_ns: start,
                    end_ns: start + s.duration_ns.max(0) as u64,
                    name: s.op.clone(),
                    category: s.library.clone(),
                    args,
                }
            })
            .collect();
        l.builder.slices(tt, slices);
    }
}

/// What the job wrote about itself: spans as slices, instants as marks,
/// named by their labels (`step=12 epoch=1`).
fn annotation_track(l: &mut Layout, parent: u64, p: &Process) {
    if p.annotations.is_empty() {
        return;
    }
    let t = l.builder.track(Some(parent), "annotations", None);
    let mut spans = Vec::new();
    for a in &p.annotations {
        let name: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let args = a.labels.iter().map(|(k, v)| arg(k, v.as_str())).collect();
        let start = ns(a.start_us);
        if a.span_ns > 0 {
            let end = start + a.span_ns as u64;
            spans.push(Slice {
                start_ns: start,
                end_ns: end,
                name: name.join(" "),
                category: "annotation".into(),
                args,
            });
        } else {
            l.builder.instant(t, start, name.join(" "), "annotation", args);
        }
    }
    l.builder.slices(t, spans);
}
