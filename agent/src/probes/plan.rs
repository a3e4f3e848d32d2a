// SPDX-License-Identifier: Apache-2.0
//! Where each op's probe goes in a library file: its symbol's file offset
//! and the cookie that names the op to the shared call programs.

use std::path::Path;

use super::abi::COOKIE_STATIC_RT;
use super::ops::{self, Lib, Op};
use crate::error::{Error, Result};

/// A call probe to place: the op at its file offset, with its cookie.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planned {
    pub(crate) op: Op,
    pub(crate) offset: u64,
    pub(crate) cookie: u64,
    /// Its return is probed too (durations, errors, outliers).
    pub(crate) ret: bool,
}

/// Every op of `lib` found in the file at `path`, in the ops' order.
pub(crate) fn plan(path: &Path, lib: Lib, static_runtime: bool) -> Result<Vec<Planned>> {
    let wanted: Vec<&str> = ops::all().iter().filter(|o| o.lib == lib).map(|o| o.symbol).collect();
    let offsets = super::offsets::resolve(path, &wanted)
        .map_err(|e| Error::Open { what: format!("{} (symbols)", path.display()), cause: e })?;
    let mut plan = Vec::new();
    for op in ops::all().into_iter().filter(|o| o.lib == lib) {
        // Absent in this build of the library (e.g. no _ptsz variants).
        let Some(&offset) = offsets.get(op.symbol) else {
            tracing::debug!(symbol = op.symbol, path = %path.display(), "symbol not in this library");
            continue;
        };
        let placed = if static_runtime && op.bracketed() { COOKIE_STATIC_RT } else { 0 };
        plan.push(Planned { op, offset, cookie: op.cookie() | placed, ret: op.return_probed() });
    }
    Ok(plan)
}
