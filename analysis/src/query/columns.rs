// SPDX-License-Identifier: Apache-2.0
//! Query results read by column name and type: a column renamed or dropped
//! from a query's SELECT, or of another type than the reader expects, is an
//! error that names it, never a wrong column read by position or a panic.

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, ListArray, PrimitiveArray, RecordBatch, StringArray};
use arrow::datatypes::ArrowPrimitiveType;

use crate::error::{Error, Result};

/// Typed access to a result batch's columns by name.
pub(crate) trait Columns {
    fn named(&self, name: &str) -> Result<&ArrayRef>;

    fn strings(&self, name: &str) -> Result<&StringArray> {
        let c = self.named(name)?;
        c.as_string_opt::<i32>().ok_or_else(|| mismatch(name, "Utf8", c))
    }

    fn primitives<T: ArrowPrimitiveType>(&self, name: &str) -> Result<&PrimitiveArray<T>> {
        let c = self.named(name)?;
        c.as_primitive_opt::<T>().ok_or_else(|| mismatch(name, &T::DATA_TYPE.to_string(), c))
    }

    fn lists(&self, name: &str) -> Result<&ListArray> {
        let c = self.named(name)?;
        c.as_list_opt::<i32>().ok_or_else(|| mismatch(name, "List", c))
    }

    fn booleans(&self, name: &str) -> Result<&BooleanArray> {
        let c = self.named(name)?;
        c.as_boolean_opt().ok_or_else(|| mismatch(name, "Boolean", c))
    }
}

impl Columns for RecordBatch {
    fn named(&self, name: &str) -> Result<&ArrayRef> {
        self.column_by_name(name).ok_or_else(|| {
            let have: Vec<String> = self.schema().fields().iter().map(|f| f.name().clone()).collect();
            Error::Engine(format!("a query's result has no column `{name}` (it has {})", have.join(", ")))
        })
    }
}

fn mismatch(name: &str, want: &str, got: &ArrayRef) -> Error {
    Error::Engine(format!("a query's result column `{name}` is {}, not {want}", got.data_type()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, UInt64Array};
    use arrow::datatypes::{Int64Type, UInt64Type};
    use std::sync::Arc;

    #[test]
    fn columns_are_found_by_name_and_checked_by_type() {
        let b = RecordBatch::try_from_iter([
            ("t", Arc::new(Int64Array::from(vec![5])) as ArrayRef),
            ("n", Arc::new(UInt64Array::from(vec![7])) as ArrayRef),
        ])
        .unwrap();
        assert_eq!(b.primitives::<UInt64Type>("n").unwrap().value(0), 7);
        assert_eq!(b.primitives::<Int64Type>("t").unwrap().value(0), 5);
        let missing = b.primitives::<UInt64Type>("count").unwrap_err().to_string();
        assert!(missing.contains("`count`") && missing.contains("t, n"), "{missing}");
        let wrong = b.strings("t").unwrap_err().to_string();
        assert!(wrong.contains("`t` is Int64, not Utf8"), "{wrong}");
    }
}
