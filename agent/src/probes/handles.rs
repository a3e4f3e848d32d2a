// SPDX-License-Identifier: Apache-2.0
//! A loaded object's programs and maps by name, typed, with errors that
//! say which one is missing.

use aya::Ebpf;
use aya::programs::UProbe;

use crate::error::{Error, Result};

pub(crate) fn as_uprobe(p: &mut aya::programs::Program) -> Result<&mut UProbe> {
    p.try_into().map_err(Error::program("uprobe"))
}

pub(crate) fn prog<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name).ok_or_else(|| Error::Missing { kind: "program", name: name.into() })
}

/// A typed view of a map by name.
pub fn map<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf.map_mut(name).ok_or_else(|| Error::Missing { kind: "map", name: name.into() })?;
    T::try_from(m).map_err(Error::map(name))
}
