//! Files this process maps shared, read and write, on someone else's word: the path of
//! `mount_segment(path, size, offset)` (Python, and the REST service on behalf of whoever
//! reaches it, [`crate::mem::Segment::map_file`]) and the segment paths that `mooncake.pg`
//! and EP peers announce (`collective::seg`, `collective::ep::seg`). Such a mapping reads and
//! writes the file, so a path must not lead it to a file nobody meant to share (a token file,
//! a `.py` of the service, `authorized_keys`) or hang it on a FIFO.
//!
//! [`open_for_mapping`] is the one way in, and its rules are checked on a descriptor, not on
//! the path, so that a rename or a symbolic link swapped in between changes nothing:
//!
//! - the path is first opened `O_PATH | O_NOFOLLOW | O_CLOEXEC`, which opens nothing: no
//!   device acts on its open (a watchdog would start), no FIFO blocks, and a symbolic link as
//!   the last component is the link itself, refused;
//! - a regular file (`fstat`): no directory, FIFO, socket or device;
//! - owned by this process's effective uid;
//! - in an allowed directory: the directory the descriptor's file is in (its canonical path,
//!   read back from `/proc/self/fd`) is `/dev/shm`, or a directory named in
//!   `MC_MOUNT_FILE_DIRS` (colon-separated absolute paths), or lies under one of them;
//! - only then is that same file opened for the mapping, `O_RDWR | O_CLOEXEC | O_NONBLOCK`,
//!   through the descriptor's `/proc/self/fd` entry (the inode, whatever the path names by
//!   now).
//!
//! A broken rule is `InvalidInput` (not a regular file) or `PermissionDenied` (a link, another
//! owner, another directory), with a message that names it; never a panic.

use std::fs::{File, Metadata};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The environment variable naming the directories, besides `/dev/shm`, whose files may be
/// mapped: absolute paths separated by `:`.
pub const MOUNT_FILE_DIRS_VAR: &str = "MC_MOUNT_FILE_DIRS";

/// The directory whose files may always be mapped.
pub const DEFAULT_DIR: &str = "/dev/shm";

/// Opens the file at `path` for a shared read-write mapping if it passes the rules of the
/// module docs; also returns its metadata (its size).
pub fn open_for_mapping(path: &Path) -> io::Result<(File, Metadata)> {
    let raw = std::env::var(MOUNT_FILE_DIRS_VAR).ok();
    open_in(path, &allowed_dirs(raw.as_deref()))
}

/// A segment a pg or EP peer names: `/proc/<pid>/fd/<n>`, a descriptor of a process on this
/// host (how members reach a segment whose file is already unlinked), is opened through that
/// link, which the kernel allows only to a process that may trace `pid` (our user, or root);
/// any other path by [`open_for_mapping`]'s rules. Either way the result is a regular file
/// of this process's effective uid, opened without blocking.
pub fn open_peer_segment(path: &Path) -> io::Result<(File, Metadata)> {
    if !is_proc_fd(path) {
        return open_for_mapping(path);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    check_kind_and_owner(&meta, &path.display().to_string())?;
    Ok((file, meta))
}

/// Whether `path` is exactly `/proc/<digits>/fd/<digits>`.
fn is_proc_fd(path: &Path) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = path.to_str().and_then(|p| p.strip_prefix("/proc/")) else {
        return false;
    };
    rest.split_once("/fd/")
        .is_some_and(|(pid, fd)| digits(pid) && digits(fd))
}

/// `/dev/shm` and the absolute paths of `raw` (the value of [`MOUNT_FILE_DIRS_VAR`]); a
/// relative entry is left out, with a warning.
pub fn allowed_dirs(raw: Option<&str>) -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from(DEFAULT_DIR)];
    for entry in raw.unwrap_or("").split(':').filter(|e| !e.is_empty()) {
        if Path::new(entry).is_absolute() {
            dirs.push(PathBuf::from(entry));
        } else {
            tracing::warn!("{MOUNT_FILE_DIRS_VAR}: {entry:?} is not an absolute path: ignored");
        }
    }
    dirs
}

/// [`open_for_mapping`] with the allowed directories given.
pub fn open_in(path: &Path, dirs: &[PathBuf]) -> io::Result<(File, Metadata)> {
    let shown = path.display().to_string();
    let probe = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)?;
    let meta = probe.metadata()?;
    check_kind_and_owner(&meta, &shown)?;
    let at = check_dir(&probe, &shown, dirs)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&at)?;
    let opened = file.metadata()?;
    if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
        return Err(denied(format!("{shown} changed while it was opened")));
    }
    Ok((file, opened))
}

/// A regular file (a link, a directory, a FIFO, a socket or a device is refused), owned by
/// this process's effective uid.
fn check_kind_and_owner(meta: &Metadata, shown: &str) -> io::Result<()> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(denied(format!("{shown} is a symbolic link")));
    }
    if kind.is_dir() {
        return Err(invalid(format!(
            "{shown} is a directory, not a regular file"
        )));
    }
    if !kind.is_file() {
        return Err(invalid(format!("{shown} is not a regular file")));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(denied(format!(
            "{shown} is owned by uid {}, not by this process's ({me})",
            meta.uid()
        )));
    }
    Ok(())
}

/// The directory of the file `file` has open (as the kernel names it now) must be one of
/// `dirs` or lie under one, each taken canonical (one that does not exist allows nothing).
/// Returns the descriptor's `/proc/self/fd` entry, which opens that very file.
fn check_dir(file: &File, shown: &str, dirs: &[PathBuf]) -> io::Result<PathBuf> {
    let entry = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let at = std::fs::read_link(&entry)
        .map_err(|e| denied(format!("where {shown} lies cannot be read back: {e}")))?;
    let dir = at.parent().unwrap_or(Path::new("/"));
    let allowed = dirs
        .iter()
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .any(|d| dir.starts_with(d));
    if allowed {
        return Ok(entry);
    }
    Err(denied(format!(
        "{shown} lies in {}, not in {DEFAULT_DIR} nor in a directory of {MOUNT_FILE_DIRS_VAR}",
        dir.display()
    )))
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

fn denied(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's `/proc/<pid>/fd/<n>` opens through the link when it names a regular file of
    /// ours; a FIFO behind it is refused without blocking, and a look-alike path is not one.
    #[test]
    fn a_peer_segment_may_be_named_by_its_owners_descriptor() {
        let path = format!("/dev/shm/mc-peer-seg-test-{}", std::process::id());
        let held = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let via = format!("/proc/{}/fd/{}", std::process::id(), held.as_raw_fd());
        let (file, meta) = open_peer_segment(Path::new(&via)).expect("a descriptor of ours");
        assert!(meta.is_file() && file.metadata().unwrap().ino() == held.metadata().unwrap().ino());
        let fifo = std::env::temp_dir().join(format!("mc-peer-fifo-{}", std::process::id()));
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let via_fifo = format!("/proc/self/fd/{}", reader.as_raw_fd());
        assert!(open_peer_segment(Path::new(&via_fifo)).is_err());
        std::fs::remove_file(&fifo).unwrap();
        for fake in [
            "/proc/self/fd/3",
            "/proc/1/fd/x",
            "/proc/1/fdx/3",
            "/dev/shm/proc/1/fd/3",
        ] {
            assert!(!is_proc_fd(Path::new(fake)), "{fake}");
        }
        assert!(is_proc_fd(Path::new(&via)));
    }

    #[test]
    fn the_allowed_directories_are_dev_shm_and_the_absolute_ones_named() {
        assert_eq!(allowed_dirs(None), [PathBuf::from("/dev/shm")]);
        assert_eq!(allowed_dirs(Some("")), [PathBuf::from("/dev/shm")]);
        assert_eq!(
            allowed_dirs(Some("/a:relative:/b/c::")),
            ["/dev/shm", "/a", "/b/c"].map(PathBuf::from)
        );
    }

    /// A directory named besides `/dev/shm` allows its files and those of its
    /// subdirectories, and only those.
    #[test]
    fn a_named_directory_allows_the_files_under_it() {
        let root = std::env::temp_dir().join(format!("mc-file-dirs-{}", std::process::id()));
        let (named, sub, other) = (
            root.join("named"),
            root.join("named/sub"),
            root.join("other"),
        );
        for d in [&sub, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        for d in [&named, &sub, &other] {
            std::fs::write(d.join("f"), b"x").unwrap();
        }
        let dirs = allowed_dirs(Some(named.to_str().unwrap()));
        assert_eq!(open_in(&named.join("f"), &dirs).unwrap().1.len(), 1);
        assert!(open_in(&sub.join("f"), &dirs).is_ok());
        let e = open_in(&other.join("f"), &dirs).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let e = open_in(&other.join("f"), &allowed_dirs(None)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A device is refused as not a regular file, wherever it is allowed to be.
    #[test]
    fn a_device_is_not_a_regular_file() {
        let e = open_in(Path::new("/dev/null"), &[PathBuf::from("/dev")]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
