// SPDX-License-Identifier: Apache-2.0
//! Outlier thresholds: the duration past which a call's stack is captured,
//! per op, learnt from the windows' latency histograms.

use std::collections::HashMap;

use aya::maps::{Array, MapData};
use ingero_proto::hist::Histogram;

use crate::probe_loop::LoopConfig;
use crate::probes::drain;
use crate::probes::load::{Probes, map};
use crate::probes::ops;
use crate::probes::unpreempted::Unpreempted;

/// Outlier thresholds per op: N × the op's running median, at least `min`.
pub(crate) fn update_thresholds(
    probes: &mut Probes,
    d: &drain::Drained,
    medians: &mut HashMap<u32, f64>,
    cfg: &LoopConfig,
) {
    let mut per_op: HashMap<u32, Histogram> = HashMap::new();
    for (k, v) in &d.calls {
        let h = per_op.entry(k.op).or_default();
        for (i, &n) in v.hist.iter().enumerate() {
            if n > 0 {
                h.add(i as u8, n as u64);
            }
        }
    }
    let _rt = Unpreempted::for_maps(&probes.features);
    let Ok(mut thr): std::result::Result<Array<&mut MapData, u64>, _> = map(&mut probes.ebpf, "thresholds") else {
        return;
    };
    for op in ops::all().iter().filter(|o| o.timed) {
        let id = op.id as u32;
        let t = match cfg.outlier_abs {
            Some(a) => a.as_nanos() as u64,
            None => {
                if let Some(m) = per_op.get(&id).and_then(|h| h.quantile(0.5)) {
                    let e = medians.entry(id).or_insert(m as f64);
                    *e = 0.8 * *e + 0.2 * m as f64;
                }
                match medians.get(&id) {
                    Some(m) => ((m * cfg.outlier_factor) as u64).max(cfg.outlier_min.as_nanos() as u64),
                    None => 0,
                }
            }
        };
        let _ = thr.set(id, t, 0);
    }
}
