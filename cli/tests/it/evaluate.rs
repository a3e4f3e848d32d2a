// SPDX-License-Identifier: Apache-2.0
//! `ingero evaluate`: the live detector on a simulated fleet (seeded, so
//! exact): faults are caught within seconds, checkpoints, preemptions, job
//! changes and short data-loader hiccups are not flagged at the default
//! settings, and the measurement can fail (a laxer detector is caught).

use std::process::Command;

fn evaluate(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_ingero"))
        .args(["evaluate", "--nodes", "200", "--duration", "3h", "--faults", "40", "--seed", "7", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn faults_are_caught_and_noise_is_not_flagged() {
    let v = evaluate(&[]);
    assert!(v["faults"].as_u64().unwrap() >= 35, "{v}");
    assert!(v["recall"].as_f64().unwrap() >= 0.99, "{v}");
    assert!(v["flag_latency_p90_s"].as_u64().unwrap() <= 5, "{v}");
    assert_eq!(v["false_flags_over_2m"], 0, "{v}");
    // 25 node-days: back-to-back hiccups may flag a node for seconds, rarely.
    assert!(v["false_flags_per_1000_node_days"].as_f64().unwrap() <= 100.0, "{v}");
}

#[test]
fn the_measurement_catches_a_detector_that_flags_hiccups() {
    // Three windows of evidence: every 3-s data-loader hiccup becomes a flag.
    let v = evaluate(&["--flag-after", "3"]);
    assert!(v["false_flags"].as_u64().unwrap() > 100, "{v}");
}

#[test]
fn bad_arguments_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_ingero")).args(["evaluate", "--nodes", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--nodes"));
}
