//! The scan at start: what the directory holds becomes the index.
//!
//! Temporary files (a write a crash cut short) are deleted. Every object file's header is
//! decoded and checked, and its length must be the one its header implies; a file that
//! fails, or that lies outside the segment, or overlaps an object already kept, is deleted,
//! logged and counted (`DiskStats::scan_dropped`). A file kept in another worker's
//! subdirectory (the worker count changed) is moved to its owner's. Data checksums are not
//! read here (that would read the whole disk at every start); every read checks them.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::format::{self, FileHeader, FILE_HEADER_FIXED_BYTES, TEMP_SUFFIX};
use super::{bump, worker_of, Counters, DiskConfig, DiskError, Entry, Index};

/// The index of what the directory holds: temporary files deleted, every object file checked
/// and kept or dropped, kept files moved to their owners' subdirectories.
pub(super) fn scan(
    cfg: &DiskConfig,
    base: u64,
    workers: usize,
    counters: &Counters,
) -> Result<Index, DiskError> {
    let top = read_dir(&cfg.dir)?;
    let mut found: Vec<(u64, Entry, std::path::PathBuf)> = Vec::new();
    // Subdirectories of workers that no longer exist (the count went down): emptied below.
    let mut stale_dirs: Vec<std::path::PathBuf> = Vec::new();
    for entry in top {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(TEMP_SUFFIX) {
            remove_temp(&path, counters);
            continue;
        }
        if !(path.is_dir() && name.bytes().all(|c| c.is_ascii_digit())) {
            continue;
        }
        stale_dirs.extend(
            name.parse::<usize>()
                .ok()
                .filter(|&w| w >= workers)
                .map(|_| path.clone()),
        );
        scan_worker_dir(&path, counters, &mut found)?;
    }
    let index = keep_found(cfg, base, workers, found, counters);
    for d in stale_dirs {
        // Fails, harmlessly, when something that is not ours is left in it.
        let _ = std::fs::remove_dir(d);
    }
    Ok(index)
}

/// Adds the object files of one worker subdirectory whose headers check to `found`; deletes
/// temporary files and drops files that fail.
fn scan_worker_dir(
    dir: &Path,
    counters: &Counters,
    found: &mut Vec<(u64, Entry, std::path::PathBuf)>,
) -> Result<(), DiskError> {
    for file in read_dir(dir)? {
        let fpath = file.path();
        let fname = file.file_name().to_string_lossy().into_owned();
        if fname.ends_with(TEMP_SUFFIX) {
            remove_temp(&fpath, counters);
            continue;
        }
        let Some(addr) = format::parse_object_name(&fname) else {
            continue;
        };
        match check_file(&fpath) {
            Ok((h, physical)) => {
                let e = Entry {
                    key: h.key,
                    size: h.size,
                    version: h.version,
                    hard_pin: h.hard_pin,
                    soft_pin_ttl_ms: h.soft_pin_ttl_ms,
                    physical,
                    last_read_ms: 0,
                    seq: 0,
                };
                found.push((addr, e, fpath));
            }
            Err(why) => drop_file(&fpath, &why, counters),
        }
    }
    Ok(())
}

/// The index of the found files in address order: drops those outside the segment or
/// overlapping one kept before, and moves each kept file to its owner's subdirectory.
fn keep_found(
    cfg: &DiskConfig,
    base: u64,
    workers: usize,
    mut found: Vec<(u64, Entry, std::path::PathBuf)>,
    counters: &Counters,
) -> Index {
    let mut index = Index::default();
    found.sort_by_key(|(a, _, _)| *a);
    let mut end_of_kept = 0u64;
    for (addr, e, path) in found {
        let end = addr.checked_add(e.size);
        if addr < base || end.is_none() {
            drop_file(&path, "outside the disk segment", counters);
            continue;
        }
        if addr < end_of_kept {
            drop_file(&path, "overlaps an object kept before it", counters);
            continue;
        }
        let owner = cfg.dir.join(worker_of(addr, workers).to_string());
        if path.parent() != Some(owner.as_path()) {
            let to = owner.join(format::object_name(addr));
            if let Err(e) = std::fs::rename(&path, &to) {
                drop_file(
                    &path,
                    &format!("cannot move it to {}: {e}", to.display()),
                    counters,
                );
                continue;
            }
        }
        end_of_kept = end.unwrap_or(u64::MAX);
        index.insert(addr, e);
    }
    index
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>, DiskError> {
    let rd = std::fs::read_dir(dir).map_err(|e| DiskError::Io {
        op: "list",
        path: dir.to_path_buf(),
        source: e,
    })?;
    Ok(rd.filter_map(Result::ok).collect())
}

fn remove_temp(path: &Path, counters: &Counters) {
    if std::fs::remove_file(path).is_ok() {
        bump(&counters.scan_temp_removed);
    }
}

fn drop_file(path: &Path, why: &str, counters: &Counters) {
    tracing::warn!(file = %path.display(), "disk tier scan: {why}; file deleted");
    let _ = std::fs::remove_file(path);
    bump(&counters.scan_dropped);
}

/// The header of the file at `path` and its physical bytes, or why it is not an object.
fn check_file(path: &Path) -> Result<(FileHeader, u64), String> {
    let mut f = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    let mut fixed = vec![0u8; FILE_HEADER_FIXED_BYTES];
    f.read_exact(&mut fixed)
        .map_err(|e| format!("cannot read the header: {e}"))?;
    let need = FileHeader::needed(&fixed).unwrap_or(0);
    let max = format::header_len(protocol::limits::KEY_MAX_BYTES) as usize;
    if need < FILE_HEADER_FIXED_BYTES || need > max {
        return Err(format!("header length {need} is not in 64..={max}"));
    }
    let mut block = fixed;
    block.resize(need, 0);
    f.read_exact(&mut block[FILE_HEADER_FIXED_BYTES..])
        .map_err(|e| format!("cannot read the header: {e}"))?;
    let h = FileHeader::decode(&block).map_err(|e| format!("bad header: {e}"))?;
    if meta.len() != h.file_len() {
        return Err(format!(
            "file is {} bytes, its header says {}",
            meta.len(),
            h.file_len()
        ));
    }
    Ok((h, meta.blocks() * 512))
}

/// The logical limit, lowered to what the filesystem can hold: its free bytes plus what our
/// files already use.
pub(super) fn cap_to_filesystem(cfg: &DiskConfig, index: &Index) -> u64 {
    let Some(free) = free_bytes(&cfg.dir) else {
        return cfg.size_limit_bytes;
    };
    let room = free.saturating_add(index.physical);
    if cfg.size_limit_bytes > room {
        tracing::info!(
            dir = %cfg.dir.display(),
            configured = cfg.size_limit_bytes,
            capped = room,
            "disk tier: the logical limit (MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES) is more \
             than the filesystem can hold; using its free space plus what the tier already \
             stores"
        );
        room
    } else {
        cfg.size_limit_bytes
    }
}

pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable `statvfs` for the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Drops the objects that end beyond the segment after the cap.
pub(super) fn drop_beyond(
    cfg: &DiskConfig,
    base: u64,
    size_limit: u64,
    workers: usize,
    index: &mut Index,
    counters: &Counters,
) {
    let end = base.saturating_add(size_limit);
    let doomed: Vec<u64> = index
        .by_addr
        .iter()
        .filter(|(&a, e)| a.saturating_add(e.size) > end)
        .map(|(&a, _)| a)
        .collect();
    for a in doomed {
        index.remove(a);
        let path = cfg
            .dir
            .join(worker_of(a, workers).to_string())
            .join(format::object_name(a));
        drop_file(&path, "lies beyond the disk segment's size", counters);
    }
}
