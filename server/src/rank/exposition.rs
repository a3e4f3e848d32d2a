// SPDX-License-Identifier: Apache-2.0
//! The live ranking as Prometheus gauges on `/metrics`: per node its score
//! and flag, per deviating signal its value and robust z (what the
//! dashboard's per-node panels show). Read from the ranking at scrape time,
//! so nodes that leave the ranking disappear instead of going stale.
//!
//! The training job is the label `training_job`, not `job`: Prometheus gives
//! every series a `job` label of its own (the scrape job) and would rename ours.

use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::LiveRanker;
use super::standing::{Deviation, Standing};

/// A label value escaped as the text format requires: prometheus-client
/// writes label values as given, and node and job names come from agents
/// and pods (a quote or newline in one must not forge a series).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Escaped(String);

impl Escaped {
    fn new(v: &str) -> Escaped {
        Escaped(v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
    }
}

impl EncodeLabelValue for Escaped {
    fn encode(&self, enc: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(enc, &self.0)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    training_job: Escaped,
    node: Escaped,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    training_job: Escaped,
    node: Escaped,
    signal: Escaped,
}

impl NodeLabels {
    fn of(st: &Standing) -> NodeLabels {
        NodeLabels { training_job: Escaped::new(&st.job), node: Escaped::new(&st.node) }
    }
}

/// Registered on the aggregator's registry (prefix `ingero`).
#[derive(Debug)]
pub struct RankingMetrics(pub LiveRanker);

impl Collector for RankingMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let list = self.0.ranking(None).stragglers;
        let node = NodeLabels::of;
        let signals = || {
            list.iter().flat_map(|st| {
                st.signals.iter().map(move |d| {
                    let NodeLabels { training_job, node } = NodeLabels::of(st);
                    (SignalLabels { training_job, node, signal: Escaped::new(&d.signal) }, d)
                })
            })
        };
        gauges(
            &mut enc,
            "straggler_score",
            "Robust deviation of the node from its job (MAD units).",
            list.iter().map(|st| (node(st), st.score)),
        )?;
        gauges(
            &mut enc,
            "straggler_flagged",
            "1 while the node is flagged as a straggler.",
            list.iter().map(|st| (node(st), if st.flagged { 1.0 } else { 0.0 })),
        )?;
        gauges(
            &mut enc,
            "straggler_signal_z",
            "Robust z-score of each signal the node deviates in (MAD units from its job's median).",
            signals().map(|(l, d): (SignalLabels, &Deviation)| (l, d.z)),
        )?;
        gauges(
            &mut enc,
            "straggler_signal_value",
            "The node's value of each signal it deviates in (a share of the window, or a rate).",
            signals().map(|(l, d)| (l, d.value)),
        )?;
        let costs = || list.iter().filter_map(|st| st.cost.map(|c| (node(st), c)));
        gauges(
            &mut enc,
            "straggler_lost_gpu_hours",
            "GPU-hours the node's job has lost to it in its current episode (every GPU of the job waits for it).",
            costs().map(|(l, c)| (l, c.gpu_hours)),
        )?;
        gauges(
            &mut enc,
            "straggler_cost_dollars",
            "What those GPU-hours cost at --gpu-price (only where every node of the job has a price).",
            costs().filter_map(|(l, c)| Some((l, c.usd?))),
        )?;
        let queue = [
            (
                "ranking_handovers",
                "Jobs this replica started ranking (new, or taken over from another replica) and rebuilt from the set's recent windows.",
                &self.0.handovers,
            ),
            ("ranking_dropped", "Batches not ranked because the ranking queue was full.", &self.0.dropped),
        ];
        for (name, help, n) in queue {
            let c = ConstCounter::new(n.load(Ordering::Relaxed));
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

/// One gauge family: a sample per label set.
fn gauges<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (L, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Hostile;

    impl Collector for Hostile {
        fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            let labels = NodeLabels { training_job: Escaped::new("job"), node: Escaped::new("n\"} 1\nforged 2\\") };
            gauges(&mut enc, "straggler_score", "help", std::iter::once((labels, 3.5)))
        }
    }

    #[test]
    fn a_hostile_node_name_cannot_forge_a_series() {
        let mut r = Registry::with_prefix("ingero");
        r.register_collector(Box::new(Hostile));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let line = r#"ingero_straggler_score{training_job="job",node="n\"} 1\nforged 2\\"} 3.5"#;
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        assert!(text.lines().all(|l| l.starts_with('#') || l.starts_with("ingero_")), "{text}");
    }
}
