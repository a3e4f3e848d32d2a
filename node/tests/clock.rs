// SPDX-License-Identifier: Apache-2.0
//! The node's wall clock steps back an hour while the real agent ships to
//! the real `ingero serve`, and the agent is restarted after the step on
//! its spool (emptied by commits). Batch sequences come from the wall
//! clock, so without the spool's recorded sequence the restarted agent
//! would number its batches below what the store holds and the aggregator
//! would drop them as re-sends. Asserted: every acknowledged batch is
//! stored, none twice, across the step and the restart (batches the first
//! run left acknowledged-but-uncommitted in the spool are sent again by the
//! second and count once). The clock is faked
//! for the agent alone by libfaketime (Debian `faketime`); monotonic time
//! is left alone, as NTP leaves it. Needs root.

mod fixtures;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::{TimestampMicrosecondType, UInt64Type};
use fixtures::*;
use ingero_model::Table;
use ingero_store::read::read_named;
use ingero_store::state::{BATCHES_TABLE, batches_schema};
use ingero_store::{Store, StoreUrl};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn acked(log: &str) -> u64 {
    let line = log.lines().rev().find(|l| l.contains("ingero-agent stopped")).expect("no stop summary in the log");
    line.split("acked=").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

/// Sets the agent's clock offset (libfaketime re-reads the file on every call).
fn set_clock(file: &Path, offset: &str) {
    std::fs::write(file, format!("{offset}\n")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_back_loses_no_acknowledged_batch() {
    if !can_trace() {
        return;
    }
    if !Path::new(LIBFAKETIME).exists() {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{LIBFAKETIME} is missing in CI");
        eprintln!("SKIP: {LIBFAKETIME} is missing (apt install faketime)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = serve(dir.path(), port);
    let clock = dir.path().join("clock");
    set_clock(&clock, "+0");
    let env = [
        ("LD_PRELOAD", LIBFAKETIME.to_string()),
        ("FAKETIME_TIMESTAMP_FILE", clock.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ];
    let args = vec![
        format!("--aggregator=http://127.0.0.1:{port}"),
        "--node=clock-node".to_string(),
        format!("--spool-dir={}", dir.path().join("spool").display()),
        "--kubernetes=off".into(),
        "--window=100ms".into(),
    ];
    let run = |n: u32| dir.path().join(format!("agent-{n}.log"));

    let a = Agent::start_env(&args, &run(0), &env);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_clock(&clock, "-1h");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let first = acked(&a.stop());
    // Acknowledged but not yet reported committed: the next run sends these
    // again (the aggregator acknowledges a duplicate without storing it).
    let resent = std::fs::read_dir(dir.path().join("spool/batches"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "ack"))
        .count() as u64;
    // Restarted after the step: its clock is an hour behind what it sent.
    let b = Agent::start_env(&args, &run(1), &env);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = acked(&b.stop());
    let mut server = server;
    // SAFETY: kill takes any pid; ours is a child we have not reaped.
    unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) }; // commits what its WAL holds
    assert!(server.0.wait().unwrap().success());

    // What the store holds of this node's batches: ingest_batches lists each
    // stored sequence range with its batch count.
    let store = Store::open(
        &StoreUrl::parse(&format!("file://{}", dir.path().join("data").display())).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let mut ranges = Vec::new();
    for b in read_named(&store, BATCHES_TABLE, &batches_schema()).await.unwrap() {
        let col = |n: &str| b.column_by_name(n).unwrap().as_primitive::<UInt64Type>().clone();
        let (lo, hi, n) = (col("first_sequence"), col("last_sequence"), col("batches"));
        ranges.extend((0..b.num_rows()).map(|i| (lo.value(i), hi.value(i), n.value(i))));
    }
    ranges.sort();
    let stored: u64 = ranges.iter().map(|r| r.2).sum();
    eprintln!("acknowledged {first} + {second} ({resent} re-sent); stored {stored} batches in {} ranges", ranges.len());
    assert!(first >= 3 && second > resent, "too few batches to tell: {first} + {second}");
    assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0), "a batch was stored twice: {ranges:?}");
    assert_eq!(stored, first + second - resent, "stored ≠ acknowledged: {ranges:?}");

    // The rows carry both clocks: windows from before and after the step.
    let mut windows = BTreeSet::new();
    for b in rows(dir.path(), Table::NodeWindows).await {
        let ts = b.column_by_name("window_start").unwrap().as_primitive::<TimestampMicrosecondType>();
        windows.extend(ts.values().iter().copied());
    }
    let (lo, hi) = (windows.first().unwrap(), windows.last().unwrap());
    assert!(hi - lo > 50 * 60 * 1_000_000, "the clock never stepped back: windows span {} s", (hi - lo) / 1_000_000);
}
