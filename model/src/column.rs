// SPDX-License-Identifier: Apache-2.0
//! A column and its values: the types a row struct's fields may have
//! ([`Cell`]), what a row is ([`Columns`], [`Row`]). A leaf the row structs,
//! the schemas and the batch builders all use, so none imports another for it.

use arrow::datatypes::{DataType, TimeUnit};

use crate::table::Table;

/// One column: name, Arrow type, nullability, unit and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub ty: ColType,
    pub nullable: bool,
    pub unit: &'static str,
    pub doc: &'static str,
}

/// The position of column `name` in `cols`. Evaluated in a `const`, a
/// name that is not there (a renamed or removed column) fails the build.
pub const fn position(cols: &[Column], name: &str) -> usize {
    let mut i = 0;
    while i < cols.len() {
        if str_eq(cols[i].name, name) {
            return i;
        }
        i += 1;
    }
    panic!("no such column")
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The handful of Arrow types the tables use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColType {
    Utf8,
    Bool,
    I32,
    I64,
    U32,
    U64,
    F64,
    /// UTC timestamp in microseconds.
    TimestampUs,
    /// `List<UInt8>`: sparse histogram bucket indices.
    ListU8,
    /// `List<UInt64>`: sparse histogram bucket counts.
    ListU64,
}

impl ColType {
    pub fn data_type(self) -> DataType {
        match self {
            ColType::Utf8 => DataType::Utf8,
            ColType::Bool => DataType::Boolean,
            ColType::I32 => DataType::Int32,
            ColType::I64 => DataType::Int64,
            ColType::U32 => DataType::UInt32,
            ColType::U64 => DataType::UInt64,
            ColType::F64 => DataType::Float64,
            ColType::TimestampUs => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ColType::ListU8 => DataType::new_list(DataType::UInt8, false),
            ColType::ListU64 => DataType::new_list(DataType::UInt64, false),
        }
    }
}

/// One cell value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val<'a> {
    Null,
    Str(&'a str),
    Bool(bool),
    I(i64),
    U(u64),
    F(f64),
    /// Microseconds since the epoch (UTC).
    Ts(i64),
    U8s(&'a [u8]),
    U64s(&'a [u64]),
}

impl<'a> From<Option<&'a str>> for Val<'a> {
    fn from(v: Option<&'a str>) -> Self {
        v.map_or(Val::Null, Val::Str)
    }
}

/// A UTC timestamp in microseconds since the epoch (a `TimestampUs` column).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimestampUs(pub i64);

/// A Rust type that is one column: its Arrow type, nullability and value.
pub trait Cell {
    const TYPE: ColType;
    const NULLABLE: bool = false;
    fn val(&self) -> Val<'_>;
}

macro_rules! cell {
    ($ty:ty, $col:ident, |$v:ident| $e:expr_2021) => {
        impl Cell for $ty {
            const TYPE: ColType = ColType::$col;
            fn val(&self) -> Val<'_> {
                let $v = self;
                $e
            }
        }
    };
}

cell!(String, Utf8, |v| Val::Str(v));
cell!(&str, Utf8, |v| Val::Str(v));
cell!(bool, Bool, |v| Val::Bool(*v));
cell!(i32, I32, |v| Val::I(*v as i64));
cell!(i64, I64, |v| Val::I(*v));
cell!(u32, U32, |v| Val::U(*v as u64));
cell!(u64, U64, |v| Val::U(*v));
cell!(f64, F64, |v| Val::F(*v));
cell!(TimestampUs, TimestampUs, |v| Val::Ts(v.0));
cell!(&[u8], ListU8, |v| Val::U8s(v));
cell!(&[u64], ListU64, |v| Val::U64s(v));

impl<T: Cell> Cell for Option<T> {
    const TYPE: ColType = T::TYPE;
    const NULLABLE: bool = true;
    fn val(&self) -> Val<'_> {
        self.as_ref().map_or(Val::Null, Cell::val)
    }
}

/// A struct whose fields are columns, in order (see [`crate::tables`]).
pub trait Columns {
    const COLUMNS: &'static [Column];
    /// Calls `f` with the row's values in column order.
    fn with_vals<T>(&self, f: impl FnOnce(&[Val<'_>]) -> T) -> T;
}

/// The table-specific part of a row of [`Row::TABLE`].
pub trait Row: Columns {
    const TABLE: Table;
}
