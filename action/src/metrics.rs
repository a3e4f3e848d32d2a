// SPDX-License-Identifier: Apache-2.0
//! Remediation's counters on the aggregator's `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::policy::Budget;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    pub action: String,
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabel {
    pub budget: String,
}

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// `ingero_remediation_actions_total{action, mode}`.
    pub actions: Family<ActionLabel, Counter>,
    /// `ingero_remediation_held_total{budget}`: marks a budget held back.
    pub held: Family<BudgetLabel, Counter>,
    /// `ingero_remediation_errors_total`: API calls that failed.
    pub errors: Counter,
    /// `ingero_remediation_marked_nodes`: nodes this replica has marked now.
    pub marked: Gauge,
}

impl Metrics {
    /// Adds them to the server's registry (`ServeConfig::extra_metrics`).
    pub fn register(&self, r: &mut Registry) {
        // Every budget's series exists from the start, so increase() and alerts see 0 → n.
        for b in [Budget::Fleet, Budget::Job, Budget::Hour] {
            let _ = self.held.get_or_create(&BudgetLabel { budget: b.label().into() });
        }
        r.register("remediation_actions", "Remediation actions taken (dry-run: would have)", self.actions.clone());
        r.register("remediation_held", "Marks held back by a budget, by budget", self.held.clone());
        r.register("remediation_errors", "Remediation API calls that failed", self.errors.clone());
        r.register("remediation_marked_nodes", "Nodes this replica has marked now", self.marked.clone());
    }

    pub fn action(&self, action: &str, mode: crate::Mode) {
        self.actions.get_or_create(&ActionLabel { action: action.into(), mode: mode.to_string() }).inc();
    }
}
