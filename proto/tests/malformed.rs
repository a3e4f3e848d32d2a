// SPDX-License-Identifier: Apache-2.0
//! Inputs the fuzzer found (fuzz/fuzz_targets/ingest_decode.rs): each must be
//! refused with an error, never a panic or an abort.

use ingero_model::{Error, Table};
use ingero_proto::ipc;

fn decode(data: &[u8]) -> Result<usize, Error> {
    // Byte 0 selects the table in the fuzz target; the rest is the IPC stream.
    let table = Table::ALL[data[0] as usize % Table::ALL.len()];
    ipc::decode(table, &data[1..], 100_000).map(|b| b.len())
}

#[test]
fn a_schema_field_of_type_none_is_an_error_not_a_panic() {
    // arrow-ipc 59 panics (`unimplemented!`) on this schema.
    let e = decode(include_bytes!("data/ipc-type-none.bin")).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
}

#[test]
fn a_buffer_claiming_exabytes_is_refused_before_allocation() {
    // A zstd buffer whose length prefix claims ~1.6 EB: decoding it would
    // allocate that much up front and abort the process.
    let e = decode(include_bytes!("data/ipc-huge-buffer.bin")).unwrap_err();
    assert!(matches!(e, Error::Invalid(_) | Error::TooLarge(_)), "{e}");
}
