// SPDX-License-Identifier: Apache-2.0
//! Which file a uprobe really lands on. The kernel places a uprobe on the
//! inode that holds the data: for a file in an overlayfs mount that is the
//! inode of the layer beneath (`d_real_inode`), shared by every container
//! started from one image. Since Linux 6.8 `/proc/PID/maps` shows each
//! overlay mount's own device and inode instead, so identifying libraries
//! by the maps line attaches one set of probes per container, and every
//! call is then counted once per container.
//!
//! A library is identified here by what the kernel probes: `(dev, ino)` from
//! `fstat` on ordinary filesystems; on overlayfs, the file handle overlayfs
//! encodes for it (`name_to_handle_at` with `AT_HANDLE_FID`, Linux 6.6+),
//! which is built from the real file's handle and filesystem uuid, so two
//! mounts of one lower layer give the same bytes and a copied-up file gives
//! its own.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
const AT_HANDLE_FID: i32 = 0x200;
const MAX_HANDLE_SZ: usize = 128;

/// The identity of a probed file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum FileId {
    /// Device and inode (as `stat` reports them).
    Inode(u64, u64),
    /// An overlayfs file: handle type and bytes of the file beneath.
    Overlay(i32, Vec<u8>),
}

/// A library file held open: probes are attached through `/proc/self/fd/N`,
/// so the file stays reachable when the process that mapped it exits first.
#[derive(Debug)]
pub(crate) struct OpenLib {
    file: File,
    pub id: FileId,
}

impl OpenLib {
    /// Opens `path` and identifies the file the kernel would probe.
    pub(crate) fn open(path: &Path) -> std::io::Result<OpenLib> {
        let file = crate::podfs::open_regular(path)?;
        let id = identify(&file)?;
        Ok(OpenLib { file, id })
    }

    /// A path that reaches this open file for as long as it is held.
    pub(crate) fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// The identity of an open file.
pub(crate) fn identify(file: &File) -> std::io::Result<FileId> {
    let md = file.metadata()?;
    if is_overlay(file)
        && let Some((ty, bytes)) = handle_fid(file)
    {
        return Ok(FileId::Overlay(ty, bytes));
    }
    // Kernels before 6.6 cannot encode the handle; those before 6.8
    // also show the real inode in /proc/PID/maps, and stat on an
    // overlay file reports the real inode number: fall through.
    Ok(FileId::Inode(md.dev(), md.ino()))
}

pub(crate) fn is_overlay(file: &File) -> bool {
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into the statfs we own; the fd is open for the call.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    rc == 0 && st.f_type as i64 == OVERLAYFS_SUPER_MAGIC
}

#[repr(C)]
struct Handle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// `name_to_handle_at(fd, "", AT_EMPTY_PATH | AT_HANDLE_FID)`.
fn handle_fid(file: &File) -> Option<(i32, Vec<u8>)> {
    let mut h = Handle { handle_bytes: MAX_HANDLE_SZ as u32, handle_type: 0, f_handle: [0; MAX_HANDLE_SZ] };
    let mut mount_id: i32 = 0;
    // SAFETY: the handle buffer holds handle_bytes bytes after its header, as
    // the syscall requires; the empty C string and mount_id outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            file.as_raw_fd(),
            c"".as_ptr(),
            &mut h as *mut Handle,
            &mut mount_id as *mut i32,
            libc::AT_EMPTY_PATH | AT_HANDLE_FID,
        )
    };
    let n = h.handle_bytes as usize;
    (rc == 0 && n <= MAX_HANDLE_SZ).then(|| (h.handle_type, h.f_handle[..n].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_file_is_its_device_and_inode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("libcudart.so.12");
        std::fs::write(&p, b"x").unwrap();
        let l = OpenLib::open(&p).unwrap();
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(l.id, FileId::Inode(md.dev(), md.ino()));
        // The fd path reaches the same file after the name is gone.
        std::fs::remove_file(&p).unwrap();
        assert_eq!(std::fs::read(l.fd_path()).unwrap(), b"x");
    }
}
