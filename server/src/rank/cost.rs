// SPDX-License-Identifier: Apache-2.0
//! What a straggler costs. A synchronous job runs at its slowest rank's
//! pace, so every GPU of the job loses the time its peers spend waiting for
//! the straggler: cost = (job time lost) × (the job's GPUs) × (their
//! GPU-hour price). The job time lost comes from the detector (see
//! [`super::episode`]); the GPUs from each node's agent (the NVIDIA driver's
//! GPU list), else `--gpus-per-node`; the price from `--gpu-price` rules.

use ingero_model::signals::Host;
use serde::{Deserialize, Serialize};

/// Which nodes a price applies to.
#[derive(Debug, Clone, PartialEq)]
pub enum PriceRule {
    /// Node names: exact, or a prefix ending in `*` (node pools are in the
    /// names GKE, AKS and most installers give nodes: `gke-prod-a3-pool-…`).
    Node(String),
    /// A GPU model containing this text, any case (`H100`, `A100-SXM4-80GB`).
    Model(String),
    /// Every other node.
    Default,
}

/// GPU-hour prices and the GPU count assumed where an agent read none.
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    /// (rule, USD per GPU-hour); node rules are tried first, then models,
    /// then the default, each in the order given.
    pub rules: Vec<(PriceRule, f64)>,
    pub gpus_per_node: u32,
}

impl Default for Prices {
    fn default() -> Self {
        Prices { rules: Vec::new(), gpus_per_node: 8 }
    }
}

/// One episode's (or a standing's) cost.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Cost {
    /// GPUs of the job (every node the job ran on).
    pub gpus: u32,
    /// GPU-hours the job lost to the straggler.
    pub gpu_hours: f64,
    /// In USD, where every node of the job has a price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
}

impl Prices {
    /// Parses one `--gpu-price` rule: `node:PATTERN=USD`, `model:TEXT=USD`,
    /// `default=USD`, or `TEXT=USD` (a model).
    pub fn parse_rule(s: &str) -> Result<(PriceRule, f64), String> {
        let (key, usd) =
            s.rsplit_once('=').ok_or_else(|| format!("`{s}`: expected RULE=USD, e.g. model:H100=3.50 or default=2"))?;
        let usd: f64 = usd.trim().parse().map_err(|_| format!("`{s}`: `{usd}` is not a price in USD"))?;
        if !(usd >= 0.0 && usd.is_finite()) {
            return Err(format!("`{s}`: a price must be 0 or more"));
        }
        let key = key.trim();
        let rule = if key == "default" || key == "*" {
            PriceRule::Default
        } else if let Some(p) = key.strip_prefix("node:") {
            PriceRule::Node(p.to_string())
        } else {
            PriceRule::Model(key.strip_prefix("model:").unwrap_or(key).to_lowercase())
        };
        match &rule {
            PriceRule::Node(p) | PriceRule::Model(p) if p.is_empty() => Err(format!("`{s}`: the rule names nothing")),
            _ => Ok((rule, usd)),
        }
    }

    /// USD per GPU-hour of `node`, or None when no rule covers it.
    pub fn price(&self, node: &str, host: Option<&Host>) -> Option<f64> {
        let model = host.and_then(|h| h.gpu_model.as_deref()).map(str::to_lowercase);
        let node_rule = self.rules.iter().find(|(r, _)| match r {
            PriceRule::Node(p) => p.strip_suffix('*').map_or(p == node, |prefix| node.starts_with(prefix)),
            _ => false,
        });
        let model_rule = || {
            self.rules.iter().find(|(r, _)| match (r, &model) {
                (PriceRule::Model(t), Some(m)) => m.contains(t.as_str()),
                _ => false,
            })
        };
        let default = || self.rules.iter().find(|(r, _)| *r == PriceRule::Default);
        node_rule.or_else(model_rule).or_else(default).map(|(_, usd)| *usd)
    }

    /// GPUs of a node: what its agent read, else `gpus_per_node`.
    pub fn gpus(&self, host: Option<&Host>) -> u32 {
        host.and_then(|h| h.gpus).filter(|&g| g > 0).unwrap_or(self.gpus_per_node)
    }

    /// The cost of `lost_s` seconds of a job running on `nodes`.
    pub fn cost<'a>(&self, lost_s: f64, nodes: impl Iterator<Item = (&'a str, Option<&'a Host>)>) -> Cost {
        let (mut gpus, mut usd_per_hour) = (0u32, Some(0.0));
        for (node, host) in nodes {
            let g = self.gpus(host);
            gpus += g;
            usd_per_hour = usd_per_hour.zip(self.price(node, host)).map(|(sum, p)| sum + p * g as f64);
        }
        let hours = lost_s / 3600.0;
        Cost {
            gpus,
            gpu_hours: round(hours * gpus as f64, 3),
            usd: usd_per_hour.filter(|_| !self.rules.is_empty()).map(|r| round(hours * r, 2)),
        }
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(model: &str, gpus: u32) -> Host {
        Host { gpu_model: Some(model.into()), gpus: Some(gpus) }
    }

    #[test]
    fn node_rules_win_over_models_and_models_over_the_default() {
        let rules = ["model:H100=4", "node:gke-spot-*=1.5", "default=2", "a100=3"];
        let p = Prices { rules: rules.iter().map(|r| Prices::parse_rule(r).unwrap()).collect(), gpus_per_node: 8 };
        let h100 = host("NVIDIA H100 80GB HBM3", 8);
        assert_eq!(p.price("gke-spot-7", Some(&h100)), Some(1.5));
        assert_eq!(p.price("node-1", Some(&h100)), Some(4.0));
        assert_eq!(p.price("node-1", Some(&host("NVIDIA A100-SXM4-80GB", 8))), Some(3.0));
        assert_eq!(p.price("node-1", None), Some(2.0));
        let none = Prices::default();
        assert_eq!(none.price("node-1", Some(&h100)), None);
    }

    #[test]
    fn a_job_loses_its_slowdown_on_every_gpu() {
        let p = Prices { rules: vec![Prices::parse_rule("model:H100=4").unwrap()], gpus_per_node: 8 };
        let (a, b) = (host("NVIDIA H100 80GB HBM3", 8), host("NVIDIA H100 80GB HBM3", 4));
        // Half an hour of job time lost on 12 GPUs at $4: 6 GPU-hours, $24.
        let c = p.cost(1800.0, [("a", Some(&a)), ("b", Some(&b))].into_iter());
        assert_eq!(c, Cost { gpus: 12, gpu_hours: 6.0, usd: Some(24.0) });
        // A node no rule prices: GPU-hours, no dollars (never a partial sum).
        let c = p.cost(1800.0, [("a", Some(&a)), ("c", None)].into_iter());
        assert_eq!(c, Cost { gpus: 16, gpu_hours: 8.0, usd: None });
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        for bad in ["H100", "H100=abc", "H100=-1", "node:=2", "model:=2", "default=inf"] {
            assert!(Prices::parse_rule(bad).is_err(), "{bad}");
        }
    }
}
