// SPDX-License-Identifier: Apache-2.0
//! How DataFusion reads the store's files into the tables' unsigned types.
//!
//! Files hold unsigned columns as a wider signed type (`store::delta::schema`),
//! which DataFusion's default adapter casts by value. Files written before
//! that held the signed type of the *same* width, where a cast by value
//! fails on any value past the signed maximum (a histogram bucket ≥ 128,
//! i.e. one call ≥ ~8.6 s, made a whole report fail). This adapter reads
//! such a same-width column bit for bit and leaves the rest to the default.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr_adapter::{
    DefaultPhysicalExprAdapterFactory, PhysicalExprAdapter, PhysicalExprAdapterFactory,
};

use ingero_store::delta::schema::convert_array;

/// A file column of signed type read as the table's unsigned type of the
/// same width (lists of them included).
fn same_width_unsigned(file: &DataType, table: &DataType) -> bool {
    match (file, table) {
        (DataType::List(f), DataType::List(t)) => same_width_unsigned(f.data_type(), t.data_type()),
        (f, t) => f.is_signed_integer() && t.is_unsigned_integer() && f.primitive_width() == t.primitive_width(),
    }
}

#[derive(Debug)]
pub(crate) struct StoredTypes;

impl PhysicalExprAdapterFactory for StoredTypes {
    fn create(&self, logical: SchemaRef, physical: SchemaRef) -> Result<Arc<dyn PhysicalExprAdapter>> {
        let mut narrow = Vec::new();
        // The default adapter is shown the narrow columns as already having
        // the table's type, so it leaves them alone; they are wrapped below.
        let shown: Vec<FieldRef> = physical
            .fields()
            .iter()
            .map(|f| match logical.field_with_name(f.name()) {
                Ok(t) if same_width_unsigned(f.data_type(), t.data_type()) => {
                    narrow.push((f.name().clone(), t.data_type().clone()));
                    Arc::new(Field::new(f.name(), t.data_type().clone(), f.is_nullable()))
                }
                _ => f.clone(),
            })
            .collect();
        let inner = DefaultPhysicalExprAdapterFactory.create(logical, Arc::new(Schema::new(shown)))?;
        Ok(Arc::new(Adapter { inner, narrow }))
    }
}

#[derive(Debug)]
struct Adapter {
    inner: Arc<dyn PhysicalExprAdapter>,
    /// Same-width columns of this file: (name, table type).
    narrow: Vec<(String, DataType)>,
}

impl PhysicalExprAdapter for Adapter {
    fn rewrite(&self, expr: Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>> {
        let expr = self.inner.rewrite(expr)?;
        if self.narrow.is_empty() {
            return Ok(expr);
        }
        expr.transform_up(|e| {
            let Some(c) = e.downcast_ref::<Column>() else {
                return Ok(Transformed::no(e));
            };
            match self.narrow.iter().find(|(n, _)| n == c.name()) {
                Some((_, to)) => Ok(Transformed::yes(Arc::new(Reinterpret { input: e.clone(), to: to.clone() }) as _)),
                None => Ok(Transformed::no(e)),
            }
        })
        .data()
    }
}

/// The input's integers as `to`, bits unchanged.
#[derive(Debug)]
struct Reinterpret {
    input: Arc<dyn PhysicalExpr>,
    to: DataType,
}

impl PartialEq for Reinterpret {
    fn eq(&self, other: &Self) -> bool {
        self.to == other.to && self.input.as_ref() == other.input.as_ref()
    }
}

impl Eq for Reinterpret {}

impl Hash for Reinterpret {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.input.as_ref().hash(state);
        self.to.hash(state);
    }
}

impl fmt::Display for Reinterpret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "REINTERPRET({} AS {})", self.input, self.to)
    }
}

impl PhysicalExpr for Reinterpret {
    fn data_type(&self, _input: &Schema) -> Result<DataType> {
        Ok(self.to.clone())
    }

    fn nullable(&self, input: &Schema) -> Result<bool> {
        self.input.nullable(input)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let a = self.input.evaluate(batch)?.into_array(batch.num_rows())?;
        let out = convert_array(&a, &self.to).map_err(|e| DataFusionError::Execution(e.to_string()))?;
        Ok(ColumnarValue::Array(out))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        let input = children.into_iter().next().ok_or_else(|| DataFusionError::Internal("no input".into()))?;
        Ok(Arc::new(Reinterpret { input, to: self.to.clone() }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.input.fmt_sql(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int8Builder, Int32Array, ListBuilder};
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
    use datafusion::prelude::SessionContext;

    /// A file as stores before the wide types wrote it: u32 as i32, u8 as i8.
    fn old_file(dir: &std::path::Path) {
        let mut lb = ListBuilder::new(Int8Builder::new()).with_field(Field::new("item", DataType::Int8, false));
        lb.append_value([Some(12i8), Some(-128), Some(-125)]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int32, false),
            Field::new("hist_bucket", DataType::new_list(DataType::Int8, false), false),
        ]));
        let b = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int32Array::from(vec![-5])), Arc::new(lb.finish())])
            .unwrap();
        let f = std::fs::File::create(dir.join("old.parquet")).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(f, schema, None).unwrap();
        w.write(&b).unwrap();
        w.close().unwrap();
    }

    async fn query(dir: &std::path::Path, adapter: bool, q: &str) -> Result<Vec<RecordBatch>> {
        let table = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::UInt32, false),
            Field::new("hist_bucket", DataType::new_list(DataType::UInt8, false), false),
        ]));
        let url = ListingTableUrl::parse(format!("file://{}/", dir.display()))?;
        let opts = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
        let mut cfg = ListingTableConfig::new(url).with_listing_options(opts).with_schema(table);
        if adapter {
            cfg = cfg.with_expr_adapter_factory(Arc::new(StoredTypes));
        }
        let ctx = SessionContext::new();
        ctx.register_table("t", Arc::new(ListingTable::try_new(cfg)?))?;
        ctx.sql(q).await?.collect().await
    }

    #[tokio::test]
    async fn old_narrow_files_read_bit_for_bit_in_projections_and_filters() {
        let dir = tempfile::tempdir().unwrap();
        old_file(dir.path());
        let q = "SELECT pid, unnest(hist_bucket) AS b FROM t WHERE pid > 4000000000 ORDER BY b";
        let b = query(dir.path(), true, q).await.unwrap();
        let b = arrow::compute::concat_batches(&b[0].schema(), &b).unwrap();
        let pid = arrow::compute::cast(b.column(0), &DataType::UInt64).unwrap();
        let bk = arrow::compute::cast(b.column(1), &DataType::UInt64).unwrap();
        use arrow::array::AsArray;
        use arrow::datatypes::UInt64Type;
        assert_eq!(pid.as_primitive::<UInt64Type>().values(), &[4_294_967_291; 3]);
        assert_eq!(bk.as_primitive::<UInt64Type>().values(), &[12, 128, 131]);
        // What the engine did before: a cast by value, which fails.
        assert!(query(dir.path(), false, q).await.is_err());
    }
}
