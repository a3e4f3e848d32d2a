// SPDX-License-Identifier: Apache-2.0
//! What finding steps costs the probe loop per window: `Steps::window` over
//! threads whose history is full, for a short cycle (a copy and a sync, as a
//! data-parallel loop makes) and the longest looked for (256 calls: FSDP's
//! collectives per layer), and for threads with no cycle at all (every
//! period is tried and fails: the worst case).
//!
//! `cargo bench -p ingero-agent --bench steps`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ingero_agent::steps::Steps;

const MS: u64 = 1_000_000;

/// `threads` threads of one process each, with `calls` calls of a cycle of
/// `period` ops (or of no cycle), one window's worth of new calls each.
fn loaded(threads: u32, calls: u64, period: u64, cyclic: bool) -> (Steps, u64) {
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
            s.push_call(tid, tid, op, i * MS, 10_000);
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
    g.finish();
}

criterion_group!(benches, window);
criterion_main!(benches);
