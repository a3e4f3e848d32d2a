// SPDX-License-Identifier: Apache-2.0
//! Write-ahead log: a batch is acknowledged once its bytes are fsynced here.
//!
//! The log is a directory of numbered segments. A segment is sealed at each
//! flush; its rows become `part-<segment>.parquet` files and the segment is
//! deleted once the commit state says it is stored. Frames are
//! `[len u32][crc32 u32][payload]`; a torn tail from a crash is cut off on
//! replay (it was never acknowledged).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

const MAX_FRAME: u32 = 1 << 30;

#[derive(Debug)]
pub(crate) struct Wal {
    dir: PathBuf,
    segment: u64,
    file: File,
    bytes: u64,
}

/// A segment read back at start.
#[derive(Debug)]
pub(crate) struct Replayed {
    pub segment: u64,
    pub records: Vec<Vec<u8>>,
}

impl Wal {
    /// Opens the log, returning the segments newer than `committed` to replay.
    /// Segments at or below `committed` are already stored and are removed.
    pub(crate) fn open(dir: &Path, committed: u64) -> Result<(Wal, Vec<Replayed>)> {
        fs::create_dir_all(dir).ctx(|| format!("creating WAL directory {}", dir.display()))?;
        let mut segments = Vec::new();
        for entry in fs::read_dir(dir).ctx(|| format!("reading WAL directory {}", dir.display()))? {
            let entry = entry.ctx(|| format!("reading WAL directory {}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(n) = name.strip_prefix("seg-").and_then(|s| s.strip_suffix(".wal"))
                && let Ok(n) = n.parse::<u64>()
            {
                segments.push(n);
            }
        }
        segments.sort_unstable();
        let mut replay = Vec::new();
        for &seg in &segments {
            let path = segment_path(dir, seg);
            if seg <= committed {
                fs::remove_file(&path).ctx(|| format!("removing {}", path.display()))?;
            } else {
                let records = read_segment(&path)?;
                replay.push(Replayed { segment: seg, records });
            }
        }
        let next = segments.last().copied().unwrap_or(0).max(committed) + 1;
        let wal = Wal::create(dir, next)?;
        Ok((wal, replay))
    }

    fn create(dir: &Path, segment: u64) -> Result<Wal> {
        let path = segment_path(dir, segment);
        let file =
            OpenOptions::new().create(true).append(true).open(&path).ctx(|| format!("creating {}", path.display()))?;
        // Make the new directory entry itself durable.
        File::open(dir).and_then(|d| d.sync_all()).ctx(|| format!("fsync {}", dir.display()))?;
        Ok(Wal { dir: dir.to_path_buf(), segment, file, bytes: 0 })
    }

    #[cfg(test)]
    pub(crate) fn segment(&self) -> u64 {
        self.segment
    }

    /// Appends one record (not yet durable: call [`Wal::sync`]).
    pub(crate) fn append(&mut self, payload: &[u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(payload.len() + 8);
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        frame.extend_from_slice(payload);
        self.file.write_all(&frame).ctx(|| self.describe())?;
        self.bytes += frame.len() as u64;
        Ok(())
    }

    /// Appends records and fsyncs them (one group commit). On failure the
    /// segment is cut back to its previous length so a half-written frame
    /// never hides later records from replay.
    pub(crate) fn append_durable<'a>(&mut self, records: impl IntoIterator<Item = &'a [u8]>) -> Result<()> {
        let before = self.bytes;
        let res = records.into_iter().try_for_each(|r| self.append(r)).and_then(|_| self.sync());
        if res.is_err() {
            let _ = self.file.set_len(before);
            self.bytes = before;
        }
        res
    }

    /// Makes every appended record durable.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.file.sync_data().ctx(|| self.describe())
    }

    /// Seals the current segment and starts the next; returns the sealed id.
    pub(crate) fn seal(&mut self) -> Result<u64> {
        self.sync()?;
        let sealed = self.segment;
        *self = Wal::create(&self.dir, sealed + 1)?;
        Ok(sealed)
    }

    /// Deletes a segment whose rows are committed to the store.
    pub(crate) fn remove(dir: &Path, segment: u64) -> Result<()> {
        let path = segment_path(dir, segment);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).ctx(|| format!("removing {}", path.display())),
            _ => Ok(()),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn describe(&self) -> String {
        format!("writing {}", segment_path(&self.dir, self.segment).display())
    }
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("seg-{segment:020}.wal"))
}

/// Reads every intact frame; truncates a torn or corrupt tail.
fn read_segment(path: &Path) -> Result<Vec<Vec<u8>>> {
    let mut data = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut data)).ctx(|| format!("reading {}", path.display()))?;
    let mut records = Vec::new();
    let mut off = 0usize;
    while off + 8 <= data.len() {
        let len = u32::from_le_bytes(data[off..off + 4].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(data[off + 4..off + 8].try_into().unwrap_or_default());
        let end = off + 8 + len as usize;
        if len > MAX_FRAME || end > data.len() || crc32fast::hash(&data[off + 8..end]) != crc {
            break;
        }
        records.push(data[off + 8..end].to_vec());
        off = end;
    }
    if off < data.len() {
        tracing::warn!(
            path = %path.display(),
            dropped_bytes = data.len() - off,
            "cutting torn tail from WAL segment (never acknowledged)"
        );
        let f = OpenOptions::new().write(true).open(path).ctx(|| format!("opening {}", path.display()))?;
        f.set_len(off as u64)
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::Wal { path: path.display().to_string(), reason: e.to_string() })?;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_unsealed_segments_and_cuts_torn_tails() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, replay) = Wal::open(dir.path(), 0).unwrap();
        assert!(replay.is_empty());
        assert_eq!(wal.segment(), 1);
        wal.append(b"one").unwrap();
        wal.append(b"two").unwrap();
        wal.sync().unwrap();
        assert_eq!(wal.seal().unwrap(), 1);
        wal.append(b"three").unwrap();
        wal.sync().unwrap();
        drop(wal);
        // Simulate a crash mid-write: a partial frame at the end of segment 2.
        let seg2 = segment_path(dir.path(), 2);
        let mut f = OpenOptions::new().append(true).open(&seg2).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);

        let (wal, replay) = Wal::open(dir.path(), 0).unwrap();
        assert_eq!(wal.segment(), 3);
        let got: Vec<(u64, Vec<Vec<u8>>)> = replay.into_iter().map(|r| (r.segment, r.records)).collect();
        assert_eq!(got, vec![(1, vec![b"one".to_vec(), b"two".to_vec()]), (2, vec![b"three".to_vec()])]);
        assert_eq!(fs::metadata(&seg2).unwrap().len(), 13);
        drop(wal);

        // Segment 1 committed: it is removed and not replayed again.
        let (_wal, replay) = Wal::open(dir.path(), 1).unwrap();
        assert_eq!(replay.iter().map(|r| r.segment).collect::<Vec<_>>(), vec![2, 3]);
        assert!(!segment_path(dir.path(), 1).exists());
    }
}
