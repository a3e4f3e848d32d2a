// SPDX-License-Identifier: Apache-2.0
//! The tables `sql` reads, described for an assistant: the agents' tables
//! with units and meanings (the same source as proto/README.md) and the
//! aggregator's signal tiers.

use serde_json::{Value, json};

use ingero_model::schema::Table;
use ingero_store::tiers::{self, Tier};

pub(crate) fn tables() -> Vec<Value> {
    let mut out: Vec<Value> = Table::ALL
        .iter()
        .map(|t| {
            let cols: Vec<Value> = t
                .columns()
                .iter()
                .map(|c| {
                    json!({"name": c.name, "type": c.ty.data_type().to_string(), "nullable": c.nullable,
                           "unit": c.unit, "meaning": c.doc})
                })
                .collect();
            json!({"name": t.name(), "meaning": t.doc(), "columns": cols})
        })
        .collect();
    let tier_cols: Vec<Value> = tiers::schema()
        .fields()
        .iter()
        .map(|f| json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()}))
        .collect();
    for tier in Tier::ALL {
        out.push(json!({
            "name": tier.name(),
            "meaning": format!(
                "Straggler detector inputs per job, node and {} (written by the aggregator). Every measure is a \
                 sum: GROUP BY job, node, window_start. Shares are e.g. device_wait_ns / (window_us * 1000).",
                match tier.width_us() { Some(w) => format!("{} s bin", w / 1_000_000), None => "agent window".into() }
            ),
            "columns": tier_cols,
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_documented_columns() {
        let t = tables();
        assert_eq!(t.len(), Table::ALL.len() + Tier::ALL.len());
        let calls = t.iter().find(|x| x["name"] == "call_windows").unwrap();
        let start = calls["columns"].as_array().unwrap().iter().find(|c| c["name"] == "window_start").unwrap();
        assert!(start["type"].as_str().unwrap().starts_with("Timestamp"), "{start}");
        assert!(!start["meaning"].as_str().unwrap().is_empty());
        assert!(t.iter().any(|x| x["name"] == "signal_windows_60s" && x["meaning"].as_str().unwrap().contains("60 s")));
    }
}
