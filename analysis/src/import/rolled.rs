// SPDX-License-Identifier: Apache-2.0
//! Rolled-over traces: the reference product renames a full trace file to
//! `<stem>.<UTC stamp>.db` beside the live `<stem>.db` and starts a new
//! one. `ingero import <stem>.db` takes the whole set, oldest first.
//!
//! Stamps: `20260510T191425Z` (older releases) or
//! `20260510T191425.123456789Z-deadbeef` (nanoseconds and a random suffix).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The stamp's sort key (seconds, nanoseconds, suffix), if `s` is one.
fn stamp_key(s: &str) -> Option<(String, String, String)> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let secs_ok = b.len() >= 16 && digits(0..8) && b[8] == b'T' && digits(9..15);
    match b.len() {
        16 if secs_ok && b[15] == b'Z' => Some((s[..15].into(), "000000000".into(), String::new())),
        35 if secs_ok
            && b[15] == b'.'
            && digits(16..25)
            && &s[25..27] == "Z-"
            && b[27..].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)) =>
        {
            Some((s[..15].into(), s[16..25].into(), s[27..].into()))
        }
        _ => None,
    }
}

/// (stem, extension with its dot, stamp key) of a rolled file's name.
fn rolled_name(name: &str) -> Option<(&str, &str, (String, String, String))> {
    let (rest, ext) = name.rsplit_once('.').map(|(r, _)| (r, &name[r.len()..]))?;
    let (stem, stamp) = rest.split_once('.')?;
    Some((stem, ext, stamp_key(stamp)?))
}

/// The files to import, as sets that are one trace each: a live file
/// brings its rolled-over siblings, oldest first, itself last; a file
/// named twice (or as a sibling and by name) is read once.
pub(crate) fn sets(files: &[PathBuf]) -> Result<Vec<Vec<PathBuf>>> {
    let mut out: Vec<Vec<PathBuf>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for f in files {
        let mut set = Vec::new();
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if rolled_name(name).is_none() && f.is_file() {
            set.extend(siblings(f)?);
        }
        set.push(f.clone());
        // Canonical paths: the same file through another path is read once.
        set.retain(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())));
        if !set.is_empty() {
            out.push(set);
        }
    }
    Ok(out)
}

/// `<stem>.<stamp><ext>` beside `live`, oldest first.
fn siblings(live: &Path) -> Result<Vec<PathBuf>> {
    let name = live.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let Some(dot) = name.rfind('.') else { return Ok(Vec::new()) };
    let (stem, ext) = (&name[..dot], &name[dot..]);
    let dir = live.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Import {
        path: dir.display().to_string(),
        reason: format!("listing rolled-over files: {e}"),
    })?;
    let mut found = Vec::new();
    for e in entries.flatten() {
        let n = e.file_name();
        let Some(n) = n.to_str() else { continue };
        if let Some((_, _, key)) = rolled_name(n).filter(|(s, x, _)| *s == stem && *x == ext) {
            found.push((key, e.path()));
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_of_both_forms_sort_in_time_order() {
        let old = rolled_name("trace.20260510T191425Z.db").unwrap();
        let new = rolled_name("trace.20260510T191425.123456789Z-deadbeef.db").unwrap();
        assert_eq!((old.0, old.1), ("trace", ".db"));
        assert!(old.2 < new.2, "same second: the whole-second form first");
        assert!(rolled_name("trace.db").is_none());
        assert!(rolled_name("trace.notes.db").is_none());
        assert!(rolled_name("trace.20260510T191425.123456789Z-DEADBEEF.db").is_none(), "hex is lower case");
    }

    #[test]
    fn a_live_file_brings_its_siblings_oldest_first_and_nothing_twice() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        for n in [
            "t.db",
            "t.20260102T000000Z.db",
            "t.20260101T000000.000000001Z-0badcafe.db",
            "t.notes.db",
            "u.20260101T000000Z.db",
            "t.20260101T000000Z.sqlite",
        ] {
            std::fs::write(p(n), b"x").unwrap();
        }
        let got = sets(&[p("t.db"), p("t.20260102T000000Z.db"), p("u.20260101T000000Z.db")]).unwrap();
        let want = vec![
            vec![p("t.20260101T000000.000000001Z-0badcafe.db"), p("t.20260102T000000Z.db"), p("t.db")],
            vec![p("u.20260101T000000Z.db")],
        ];
        assert_eq!(got, want);
    }
}
