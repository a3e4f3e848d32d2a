// SPDX-License-Identifier: Apache-2.0
//! An object store that lists only the files live in the tables' Delta
//! snapshots. The query engine lists table directories through it, so a
//! file another writer has written but not committed yet, or one a
//! compaction replaced, is never read twice.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};

#[derive(Debug)]
pub struct Visible {
    inner: Arc<dyn ObjectStore>,
    /// Keys (as the inner store names them) of every live data file.
    live: Arc<HashSet<String>>,
}

impl Visible {
    pub fn new(inner: Arc<dyn ObjectStore>, live: HashSet<String>) -> Visible {
        Visible { inner, live: Arc::new(live) }
    }

    fn shown(live: &HashSet<String>, m: &ObjectMeta) -> bool {
        !m.location.as_ref().ends_with(".parquet") || live.contains(m.location.as_ref())
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
        let live = self.live.clone();
        self.inner
            .list(prefix)
            .filter(move |r| futures::future::ready(r.as_ref().map_or(true, |m| Visible::shown(&live, m))))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let mut r = self.inner.list_with_delimiter(prefix).await?;
        r.objects.retain(|m| Visible::shown(&self.live, m));
        Ok(r)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
