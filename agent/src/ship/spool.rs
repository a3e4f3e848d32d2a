// SPDX-License-Identifier: Apache-2.0
//! On-disk spool: every batch is written here before it is sent and removed
//! once acknowledged, so an unreachable aggregator or an agent restart loses
//! nothing. Bounded: when full, the oldest batches are dropped and counted.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use ingero_proto::pb::PushRequest;
use prost::Message;

use crate::error::{Error, Result};

pub(crate) struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    /// Batches dropped because the spool was full, since start.
    pub dropped: u64,
}

fn err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Spool { path: path.display().to_string(), source }
}

impl Spool {
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> Result<Spool> {
        fs::create_dir_all(dir).map_err(err(dir))?;
        // A batch a killed agent was writing was never committed (renamed):
        // it was not sent either, so it is dropped, not left to pile up.
        for e in fs::read_dir(dir).map_err(err(dir))?.flatten() {
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(Spool { dir: dir.to_path_buf(), max_bytes, dropped: 0 })
    }

    /// Spooled files, oldest (lowest sequence) first, with sizes.
    pub(crate) fn files(&self) -> Vec<(PathBuf, u64)> {
        let mut v: Vec<(PathBuf, u64)> = fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".pb"))
                    .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.files().iter().map(|f| f.1).sum()
    }

    /// Highest sequence in the spool (to keep new sequences above it).
    pub(crate) fn max_sequence(&self) -> u64 {
        self.files().last().and_then(|(p, _)| p.file_stem()?.to_str()?.parse().ok()).unwrap_or(0)
    }

    /// Writes a batch (atomically: temp file + rename), then enforces the cap.
    pub(crate) fn push(&mut self, req: &PushRequest) -> Result<()> {
        let path = self.dir.join(format!("{:020}.pb", req.sequence));
        let tmp = self.dir.join(format!("{:020}.tmp", req.sequence));
        let mut f = fs::File::create(&tmp).map_err(err(&tmp))?;
        f.write_all(&req.encode_to_vec()).map_err(err(&tmp))?;
        f.sync_data().map_err(err(&tmp))?;
        fs::rename(&tmp, &path).map_err(err(&path))?;
        let mut files = self.files();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        while total > self.max_bytes && files.len() > 1 {
            let (oldest, size) = files.remove(0);
            if fs::remove_file(&oldest).is_ok() {
                self.dropped += 1;
                total -= size;
                tracing::warn!(file = %oldest.display(), "spool full: dropped the oldest batch");
            }
        }
        Ok(())
    }

    /// The oldest batch (None when empty). Unreadable files are removed and counted.
    pub(crate) fn oldest(&mut self) -> Option<(PathBuf, PushRequest)> {
        for (path, _) in self.files() {
            match fs::read(&path).ok().and_then(|b| PushRequest::decode(b.as_slice()).ok()) {
                Some(r) => return Some((path, r)),
                None => {
                    let _ = fs::remove_file(&path);
                    self.dropped += 1;
                }
            }
        }
        None
    }

    pub(crate) fn remove(&self, path: &Path) {
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(seq: u64, size: usize) -> PushRequest {
        PushRequest {
            node: "n".into(),
            sequence: seq,
            tables: vec![ingero_proto::pb::TableBatch { table: "x".into(), arrow_ipc: vec![1u8; size].into() }],
        }
    }

    #[test]
    fn an_uncommitted_batch_is_cleared_on_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("00000000000000000007.tmp"), b"half").unwrap();
        let s = Spool::open(dir.path(), 1 << 20).unwrap();
        assert!(s.files().is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn keeps_order_and_drops_the_oldest_when_full() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 3_500).unwrap();
        for seq in 1..=5 {
            s.push(&req(seq, 1000)).unwrap();
        }
        assert_eq!(s.dropped, 2);
        assert!(s.bytes() <= 3_500);
        let (p, r) = s.oldest().unwrap();
        assert_eq!(r.sequence, 3);
        s.remove(&p);
        assert_eq!(s.oldest().unwrap().1.sequence, 4);
        assert_eq!(s.max_sequence(), 5);
        // A restarted agent finds the same queue.
        let mut again = Spool::open(dir.path(), 3_500).unwrap();
        assert_eq!(again.oldest().unwrap().1.sequence, 4);
    }
}
