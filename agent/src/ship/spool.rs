// SPDX-License-Identifier: Apache-2.0
//! On-disk spool: every batch is written here before it is sent and removed
//! once acknowledged, so an unreachable aggregator or an agent restart loses
//! nothing. Bounded: when full, the oldest unsent batches are dropped and
//! counted; acknowledged ones (below) are never dropped.
//!
//! The highest sequence ever spooled is kept in `sequence`, so a restarted
//! agent whose spool is empty (everything committed) still numbers its next
//! batch above it when the wall clock has stepped back: the aggregator drops
//! a sequence at or below the node's high-water mark as a duplicate.
//!
//! A batch acknowledged by an aggregator that reports commits stays as
//! `<seq>.ack` until the aggregator says it is in the store: if that replica
//! dies first, the batch is sent again to the next one.
//!
//! The batch written last is also kept in memory: in the steady state (one
//! window spooled, then sent) it is sent from there, not read back and
//! decoded from the file just written; the file is what survives a restart.

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
    /// The batch written last and its file, until `oldest` hands it out.
    last: Option<(PathBuf, PushRequest)>,
    /// Highest sequence ever spooled (also in the file `sequence`).
    high_water: u64,
}

/// The file holding the highest sequence ever spooled.
const HIGH_WATER: &str = "sequence";

fn seq_of(p: &Path) -> Option<u64> {
    p.file_stem()?.to_str()?.parse().ok()
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
        let high_water = read_high_water(&dir.join(HIGH_WATER));
        let s = Spool { dir: dir.to_path_buf(), max_bytes, dropped: 0, last: None, high_water };
        // Not known to be stored: send again (a duplicate is acknowledged, not stored).
        s.requeue_acked();
        Ok(s)
    }

    fn listed(&self, ext: &str) -> Vec<(PathBuf, u64)> {
        let mut v: Vec<(PathBuf, u64)> = fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == ext))
                    .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Acknowledged: kept until committed.
    pub(crate) fn mark_acked(&self, path: &Path) {
        let _ = fs::rename(path, path.with_extension("ack"));
    }

    /// Drops acknowledged batches the aggregator has committed.
    pub(crate) fn forget_committed(&self, committed: u64) {
        for (p, _) in self.listed("ack") {
            if seq_of(&p).is_some_and(|s| s <= committed) {
                let _ = fs::remove_file(p);
            }
        }
    }

    /// Every acknowledged-but-uncommitted batch goes back in the queue.
    pub(crate) fn requeue_acked(&self) -> usize {
        let acked = self.listed("ack");
        for (p, _) in &acked {
            let _ = fs::rename(p, p.with_extension("pb"));
        }
        acked.len()
    }

    /// Spooled files not yet acknowledged, oldest (lowest sequence) first, with sizes.
    pub(crate) fn files(&self) -> Vec<(PathBuf, u64)> {
        self.listed("pb")
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.files().iter().map(|f| f.1).sum()
    }

    /// Highest sequence ever spooled (to keep new sequences above it).
    pub(crate) fn max_sequence(&self) -> u64 {
        let listed = self.files().iter().chain(self.listed("ack").iter()).filter_map(|(p, _)| seq_of(p)).max();
        listed.unwrap_or(0).max(self.high_water)
    }

    /// Records `seq` as the highest sequence (temp file + rename, synced).
    fn raise_high_water(&mut self, seq: u64) -> Result<()> {
        if seq <= self.high_water {
            return Ok(());
        }
        let (path, tmp) = (self.dir.join(HIGH_WATER), self.dir.join(format!("{HIGH_WATER}.tmp")));
        let mut f = fs::File::create(&tmp).map_err(err(&tmp))?;
        f.write_all(seq.to_string().as_bytes()).and_then(|_| f.sync_data()).map_err(err(&tmp))?;
        fs::rename(&tmp, &path).map_err(err(&path))?;
        self.high_water = seq;
        Ok(())
    }

    /// Writes a batch (atomically: temp file + rename), then enforces the cap.
    pub(crate) fn push(&mut self, req: PushRequest) -> Result<()> {
        let path = self.dir.join(format!("{:020}.pb", req.sequence));
        let tmp = self.dir.join(format!("{:020}.tmp", req.sequence));
        let mut f = fs::File::create(&tmp).map_err(err(&tmp))?;
        f.write_all(&req.encode_to_vec()).map_err(err(&tmp))?;
        f.sync_data().map_err(err(&tmp))?;
        fs::rename(&tmp, &path).map_err(err(&path))?;
        self.raise_high_water(req.sequence)?;
        self.last = Some((path, req));
        // Acknowledged batches count but are never dropped: the aggregator
        // has them and commits them within its flush age; if that replica
        // dies first they are the only copy.
        let acked: u64 = self.listed("ack").iter().map(|f| f.1).sum();
        let mut files = self.files();
        let mut total: u64 = acked + files.iter().map(|f| f.1).sum::<u64>();
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
        let files = self.files();
        if let (Some((first, _)), Some((path, _))) = (files.first(), &self.last)
            && first == path
        {
            return self.last.take();
        }
        for (path, _) in files {
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

/// The recorded high-water mark; 0 when absent or unreadable (then the
/// spooled files and the wall clock are all there is to go by).
fn read_high_water(path: &Path) -> u64 {
    match fs::read_to_string(path) {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(file = %path.display(), "unreadable sequence high-water mark; ignored");
            0
        }),
        Err(_) => 0,
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
            s.push(req(seq, 1000)).unwrap();
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

    #[test]
    fn acknowledged_batches_wait_for_their_commit_and_are_resent_after_a_failover() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        for seq in 1..=4 {
            s.push(req(seq, 10)).unwrap();
        }
        for _ in 0..3 {
            let (p, _) = s.oldest().unwrap();
            s.mark_acked(&p);
        }
        assert_eq!(s.oldest().unwrap().1.sequence, 4, "acknowledged batches are not sent again");
        s.forget_committed(1);
        assert_eq!(s.max_sequence(), 4);
        // The replica holding 2 and 3 dies: they go back in the queue, before 4.
        assert_eq!(s.requeue_acked(), 2);
        assert_eq!(s.oldest().unwrap().1.sequence, 2);
        let (p, _) = s.oldest().unwrap();
        s.mark_acked(&p);
        // A restarted agent does not know what was committed: it sends again.
        let mut again = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(again.oldest().unwrap().1.sequence, 2);
        assert_eq!(again.files().len(), 3);
    }

    #[test]
    fn the_batch_just_written_is_sent_from_memory_and_read_back_only_after_that() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        s.push(req(1, 10)).unwrap();
        // Spoil the file: the first send must not read it.
        let (file, _) = s.files()[0].clone();
        std::fs::write(&file, b"\xff\xff not a PushRequest").unwrap();
        assert_eq!(s.oldest().unwrap().1.sequence, 1);
        // Not acknowledged (the send failed): the next try reads the file,
        // which here is spoiled, so it is removed and counted.
        assert!(s.oldest().is_none());
        assert_eq!(s.dropped, 1);
        // A newer batch replaces the one in memory; older ones come from disk.
        s.push(req(2, 10)).unwrap();
        s.push(req(3, 10)).unwrap();
        let (p, r) = s.oldest().unwrap();
        assert_eq!(r.sequence, 2);
        s.remove(&p);
        assert_eq!(s.oldest().unwrap().1.sequence, 3);
    }

    #[test]
    fn the_highest_sequence_outlives_the_batches_that_carried_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        s.push(req(1_000, 10)).unwrap();
        let (p, _) = s.oldest().unwrap();
        s.mark_acked(&p);
        s.forget_committed(1_000);
        assert!(s.files().is_empty() && s.listed("ack").is_empty());
        // Everything committed and gone; a restart still knows 1,000.
        let again = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(again.max_sequence(), 1_000);
    }

    #[test]
    fn a_full_spool_drops_unsent_batches_never_acknowledged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 3_500).unwrap();
        for seq in 1..=3 {
            s.push(req(seq, 1000)).unwrap();
            let (p, _) = s.oldest().unwrap();
            s.mark_acked(&p);
        }
        for seq in 4..=6 {
            s.push(req(seq, 1000)).unwrap();
        }
        let acked: Vec<u64> = s.listed("ack").iter().filter_map(|(p, _)| seq_of(p)).collect();
        assert_eq!(acked, vec![1, 2, 3], "an acknowledged batch was dropped");
        let unsent: Vec<u64> = s.files().iter().filter_map(|(p, _)| seq_of(p)).collect();
        assert_eq!(unsent, vec![6], "the newest unsent batch is kept, older unsent ones dropped");
        assert_eq!(s.dropped, 2);
    }
}
