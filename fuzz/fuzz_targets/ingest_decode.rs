// SPDX-License-Identifier: Apache-2.0
//! The aggregator's untrusted-input path: a pushed request's protobuf, each
//! table's Arrow IPC stream (schema check, row limit) and the value checks.
//! Must never panic, hang or allocate without bound, whatever the bytes.
#![no_main]

use ingero_model::{values, Table};
use ingero_proto::ipc;
use libfuzzer_sys::fuzz_target;
use prost::Message;

const MAX_ROWS: usize = 100_000;

fn decode_and_check(table: Table, bytes: &[u8]) {
    if let Ok(batches) = ipc::decode(table, bytes, MAX_ROWS) {
        for b in &batches {
            assert!(b.num_rows() <= MAX_ROWS, "row limit not enforced");
            let _ = values::check(table, b);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // ipc::decode turns arrow's own panics into errors with catch_unwind;
    // libFuzzer's hook would abort before that. Any panic that escapes is
    // still a crash: libfuzzer-sys aborts on it.
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let Some((&first, rest)) = data.split_first() else { return };
    // Byte 0 picks the path: a whole PushRequest, or an IPC stream for one table.
    if first == 0xff {
        if let Ok(req) = ingero_proto::pb::PushRequest::decode(rest) {
            for t in &req.tables {
                if let Some(table) = Table::from_name(&t.table) {
                    decode_and_check(table, &t.arrow_ipc);
                }
            }
        }
    } else {
        let table = Table::ALL[first as usize % Table::ALL.len()];
        decode_and_check(table, rest);
    }
});
