// SPDX-License-Identifier: Apache-2.0
//! How far one node's signal lies from its job's: robust z against the
//! median and MAD of the reference nodes.

use super::spec::{SignalSpec, fmt_value};
use super::standing::Deviation;
use ingero_model::time::median;

/// Median and scaled MAD of a set of values.
pub(crate) fn robust(values: &[f64]) -> (f64, f64) {
    let mut v = values.to_vec();
    let m = median(&mut v);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    (m, 1.4826 * median(&mut dev))
}

/// The nodes a signal is compared against, with their median and MAD
/// computed once when every node shares them (no leave-one-out): per node
/// it was O(n² log n) per window, most of a 1,000-node history ranking.
pub(crate) struct Reference<'a> {
    nodes: &'a [usize],
    shared: Option<(f64, f64)>,
}

impl<'a> Reference<'a> {
    pub(crate) fn new(loo_below: usize, values: &[f64], nodes: &'a [usize]) -> Reference<'a> {
        let shared = (nodes.len() >= loo_below).then(|| robust(&nodes.iter().map(|&j| values[j]).collect::<Vec<_>>()));
        Reference { nodes, shared }
    }
}

/// How far `values[i]` deviates in the spec's bad direction from the nodes in
/// `reference` (itself excluded when the set is small: leave-one-out).
pub(crate) fn deviation(
    z_threshold: f64,
    spec: &SignalSpec,
    values: &[f64],
    i: usize,
    reference: &Reference,
) -> Option<Deviation> {
    let (med, mad) = match reference.shared {
        Some(m) => m,
        None => {
            let others: Vec<f64> = reference.nodes.iter().filter(|&&j| j != i).map(|&j| values[j]).collect();
            if others.is_empty() {
                return None;
            }
            robust(&others)
        }
    };
    let effect = spec.direction * (values[i] - med);
    // Scale never below the signal's minimum effect / z, nor 10% of the median:
    // identical peers (MAD 0) must not turn noise into infinite z.
    let scale = mad.max(spec.min_effect / z_threshold).max(0.1 * med.abs());
    let z = effect / scale;
    (z >= z_threshold && effect >= spec.min_effect).then(|| Deviation {
        signal: spec.name.to_string(),
        value: values[i],
        job_median: med,
        z: (z * 10.0).round() / 10.0,
        text: format!("{} {} vs job median {}", spec.label, fmt_value(spec, values[i]), fmt_value(spec, med)),
    })
}
