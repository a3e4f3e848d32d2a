// SPDX-License-Identifier: Apache-2.0
//! The one reader of `/proc/PID/maps` lines, in the kernel's format
//! (`show_map_vma`): `start-end perms offset major:minor inode [path]`. The
//! library scan, the static-runtime search, the stack symbolizer and the
//! trap-cost check are filters over it.

/// One mapping, borrowed from the maps text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MapLine<'a> {
    pub start: u64,
    pub end: u64,
    pub perms: &'a str,
    pub offset: u64,
    /// `major:minor` as one number ([`parse_dev`]; 0 where unreadable).
    pub dev: u64,
    pub inode: u64,
    /// The path as the kernel wrote it (spaces kept; newlines come escaped
    /// as `\012`); empty for an anonymous mapping, `[stack]` and the like
    /// for special ones.
    pub path: &'a str,
    /// `start-end` as written: the entry's name under `/proc/PID/map_files`.
    pub range: &'a str,
}

impl MapLine<'_> {
    pub(crate) fn executable(&self) -> bool {
        self.perms.contains('x')
    }

    /// Backed by a file that still exists (not anonymous, special or deleted).
    pub(crate) fn live_file(&self) -> bool {
        self.path.starts_with('/') && !self.path.ends_with("(deleted)")
    }

    /// (device, inode): the file's identity, whatever path maps it.
    pub(crate) fn id(&self) -> (u64, u64) {
        (self.dev, self.inode)
    }
}

/// The well-formed lines of a maps text; others are skipped.
pub(crate) fn lines(text: &str) -> impl Iterator<Item = MapLine<'_>> {
    text.lines().filter_map(parse_line)
}

fn parse_line(line: &str) -> Option<MapLine<'_>> {
    let (range, rest) = field(line)?;
    let (perms, rest) = field(rest)?;
    let (offset, rest) = field(rest)?;
    let (dev, rest) = field(rest)?;
    let (inode, rest) = field(rest)?;
    let (a, b) = range.split_once('-')?;
    Some(MapLine {
        start: u64::from_str_radix(a, 16).ok()?,
        end: u64::from_str_radix(b, 16).ok()?,
        perms,
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: parse_dev(dev).unwrap_or(0),
        inode: inode.parse().ok()?,
        path: rest.trim_start(),
        range,
    })
}

/// The next whitespace-separated field and what follows it.
fn field(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    let end = s.find(char::is_whitespace).unwrap_or(s.len());
    (end > 0).then(|| s.split_at(end))
}

/// `08:01` (hex major:minor) → a single number.
pub(crate) fn parse_dev(s: &str) -> Option<u64> {
    let (a, b) = s.split_once(':')?;
    Some((u64::from_str_radix(a, 16).ok()? << 32) | u64::from_str_radix(b, 16).ok()?)
}

/// A `stat` device number as [`parse_dev`] writes a maps line's.
pub(crate) fn dev_of(st_dev: u64) -> u64 {
    (u64::from(libc::major(st_dev)) << 32) | u64::from(libc::minor(st_dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_fields_and_keeps_spaces_in_paths() {
        let text = "7f00-7f10 r-xp 00001000 fd:01 1234   /opt/my libs/libcudart.so.12\n\
                    7f10-7f20 rw-p 00000000 00:00 0 \n\
                    ffff-1000 r--p 0 08:01 x /bad/inode\n\
                    garbage\n\
                    7fff0-80000 rw-p 00000000 00:00 0                          [stack]\n";
        let l: Vec<_> = lines(text).collect();
        assert_eq!(l.len(), 3, "{l:?}");
        assert_eq!((l[0].start, l[0].end, l[0].offset, l[0].inode), (0x7f00, 0x7f10, 0x1000, 1234));
        assert_eq!(l[0].dev, (0xfd << 32) | 1);
        assert_eq!((l[0].path, l[0].range, l[0].perms), ("/opt/my libs/libcudart.so.12", "7f00-7f10", "r-xp"));
        assert!(l[0].executable() && l[0].live_file());
        assert_eq!(l[1].path, "");
        assert!(!l[1].live_file() && !l[1].executable());
        assert_eq!(l[2].path, "[stack]");
    }

    #[test]
    fn a_deleted_file_is_not_live() {
        let l = lines("1-2 r-xp 0 08:01 7 /usr/lib/libnccl.so.2 (deleted)\n").next().unwrap();
        assert_eq!(l.path, "/usr/lib/libnccl.so.2 (deleted)");
        assert!(!l.live_file());
    }

    #[test]
    fn reads_this_process_maps() {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let all = lines(&text).count();
        assert_eq!(all, text.lines().count(), "every line the kernel writes parses");
        assert!(lines(&text).any(|l| l.executable() && l.live_file() && l.inode != 0));
    }
}
