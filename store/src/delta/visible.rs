// SPDX-License-Identifier: Apache-2.0
//! An object store whose listings are the tables' Delta snapshots. The query
//! engine lists table directories through it, so a file another writer has
//! written but not committed yet, or one a compaction replaced, is never
//! read twice; and listing an aged table costs a walk of the snapshot in
//! memory, never a paged LIST of the bucket. Reads go to the inner store.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};

type Files = BTreeMap<String, ObjectMeta>;

#[derive(Debug)]
pub struct Visible {
    inner: Arc<dyn ObjectStore>,
    /// Every live data file shown so far, by key as the inner store names it.
    live: Arc<RwLock<Files>>,
}

impl Visible {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Visible {
        Visible { inner, live: Default::default() }
    }

    /// Shows a table's live files (the engine does, the first time a query
    /// reads the table).
    pub fn show(&self, files: impl IntoIterator<Item = ObjectMeta>) {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        live.extend(files.into_iter().map(|m| (m.location.to_string(), m)));
    }

    /// The files under `prefix` (whole path segments, as object stores list).
    fn under(&self, prefix: Option<&Path>) -> Vec<ObjectMeta> {
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        let start = prefix.map(|p| format!("{p}/")).unwrap_or_default();
        live.range(start.clone()..).take_while(|(k, _)| k.starts_with(&start)).map(|(_, m)| m.clone()).collect()
    }

    /// One level under `prefix`: the files directly in it and the
    /// sub-directories, skipping over each sub-directory's files at once.
    fn level(&self, prefix: Option<&Path>) -> ListResult {
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        let start = prefix.map(|p| format!("{p}/")).unwrap_or_default();
        let mut out = ListResult { common_prefixes: Vec::new(), objects: Vec::new() };
        let mut from = start.clone();
        while let Some((k, m)) = live.range(from.clone()..).next().filter(|(k, _)| k.starts_with(&start)) {
            match k[start.len()..].find('/') {
                None => {
                    out.objects.push(m.clone());
                    from = format!("{k}\u{0}");
                }
                Some(i) => {
                    let dir = &k[..start.len() + i];
                    out.common_prefixes.push(Path::from(dir));
                    // '0' sorts right after '/': past every key in `dir/`.
                    from = format!("{dir}0");
                }
            }
        }
        out
    }
}

impl fmt::Display for Visible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Visible({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Visible {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        futures::stream::iter(self.under(prefix).into_iter().map(Ok)).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        Ok(self.level(prefix))
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn meta(key: &str) -> ObjectMeta {
        ObjectMeta { location: Path::from(key), last_modified: Default::default(), size: 1, e_tag: None, version: None }
    }

    /// Listings show only the files shown, by whole segments, and a level
    /// lists each sub-directory once.
    #[tokio::test]
    async fn listings_are_the_files_shown() {
        let v = Visible::new(Arc::new(InMemory::new()));
        v.show(["t/date=1/hour=01/a.parquet", "t/date=1/hour=01/b.parquet", "t/date=1/hour=02/c.parquet"].map(meta));
        v.show(["t/date=2/hour=00/d.parquet", "t/x.parquet", "tt/date=1/e.parquet"].map(meta));
        let keys = |p: &str| -> Vec<String> {
            let got: Vec<ObjectMeta> = futures::executor::block_on(v.list(Some(&Path::from(p))).collect::<Vec<_>>())
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            got.into_iter().map(|m| m.location.to_string()).collect()
        };
        assert_eq!(
            keys("t/date=1"),
            ["t/date=1/hour=01/a.parquet", "t/date=1/hour=01/b.parquet", "t/date=1/hour=02/c.parquet"]
        );
        assert_eq!(keys("t").len(), 5, "not tt/: {:?}", keys("t"));
        let l = v.list_with_delimiter(Some(&Path::from("t"))).await.unwrap();
        let dirs: Vec<String> = l.common_prefixes.iter().map(|p| p.to_string()).collect();
        assert_eq!(dirs, ["t/date=1", "t/date=2"]);
        assert_eq!(l.objects.iter().map(|m| m.location.to_string()).collect::<Vec<_>>(), ["t/x.parquet"]);
        let l = v.list_with_delimiter(Some(&Path::from("t/date=1"))).await.unwrap();
        assert_eq!(l.common_prefixes.len(), 2);
        assert!(l.objects.is_empty());
    }
}
