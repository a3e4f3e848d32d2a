// SPDX-License-Identifier: Apache-2.0
//! What finding steps costs the probe loop per window: `Steps::window` over
//! threads whose history is full, for a short cycle (a copy and a sync, as a
//! data-parallel loop makes) and the longest looked for (256 calls: FSDP's
//! collectives per layer), and for threads with no cycle at all (every
//! period is tried and fails), each with all threads new, and with calls of
//! two durations, when the search is made again with ops split by duration;
//! and the steady case, every thread's cycle known from the window before.
//!
//! `cargo bench -p ingero-agent --bench steps`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ingero_agent::steps::Steps;

const MS: u64 = 1_000_000;

/// `threads` threads of one process each, with `calls` calls of a cycle of
/// `period` ops (or of no cycle), one window's worth of new calls each.
fn loaded(threads: u32, calls: u64, period: u64, cyclic: bool) -> (Steps, u64) {
    loaded_with(threads, calls, period, cyclic, |_| 10_000)
}

/// As `loaded`, each call `dur(i)` long.
fn loaded_with(threads: u32, calls: u64, period: u64, cyclic: bool, dur: impl Fn(u64) -> u64) -> (Steps, u64) {
    let mut s = Steps::default();
    let mut x = 7u64;
    for tid in 1..=threads {
        for i in 0..calls {
            let op = if cyclic {
                (i % period) as u16
            } else {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((x >> 33) % 16) as u16
            };
            s.push_call(tid, tid, op, i * MS, dur(i));
        }
    }
    (s, calls * MS)
}

fn window(c: &mut Criterion) {
    let mut g = c.benchmark_group("steps_window_64_threads");
    for (name, period, cyclic) in [("cycle_of_2", 2, true), ("cycle_of_256", 256, true), ("no_cycle", 2, false)] {
        g.bench_with_input(BenchmarkId::from_parameter(name), &(period, cyclic), |b, &(period, cyclic)| {
            b.iter_batched(
                || loaded(64, 896, period, cyclic),
                |(mut s, end)| s.window(end),
                criterion::BatchSize::LargeInput,
            );
        });
    }
    // No cycle, and every op's calls of two durations 100x apart: the
    // search again with ops split in two kinds (kinds.rs), the worst case.
    g.bench_function("no_cycle_two_kinds", |b| {
        b.iter_batched(
            || loaded_with(64, 896, 2, false, |i| if i % 3 == 0 { 10_000 } else { 1_000_000 }),
            |(mut s, end)| s.window(end),
            criterion::BatchSize::LargeInput,
        );
    });
    // The usual window: every thread's cycle known from the last one, one
    // window of new calls each (20 steps of the cycle), so no search.
    for (name, period) in [("steady_cycle_of_2", 2u64), ("steady_cycle_of_256", 256)] {
        g.bench_with_input(BenchmarkId::from_parameter(name), &period, |b, &period| {
            b.iter_batched(
                || {
                    let (mut s, end) = loaded(64, 896, period, true);
                    s.window(end);
                    let more = 20 * period;
                    for tid in 1..=64u32 {
                        for i in 0..more {
                            s.push_call(tid, tid, ((896 + i) % period) as u16, end + i * MS, 10_000);
                        }
                    }
                    (s, end + more * MS)
                },
                |(mut s, end)| s.window(end),
                criterion::BatchSize::LargeInput,
            );
        });
    }
    g.finish();
}

criterion_group!(benches, window);
criterion_main!(benches);
