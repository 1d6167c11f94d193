//! Segments: the memory a storage node offers to remote readers and writers.
//!
//! A [`Segment`] is one private anonymous mapping whose length is the requested size rounded
//! up to a whole number of its pages. Which pages it got is recorded in [`SegmentKind`]:
//!
//! - [`SegmentKind::HugeTlb`]: 2 MiB pages from the reserved pool (`MAP_HUGETLB`), used only
//!   when hugepages are wanted ([`HugepagePolicy`], `MC_STORE_USE_HUGEPAGE`) and the pool has
//!   enough free pages; the kernel reserves them at `mmap` time, so a later fault cannot fail.
//! - [`SegmentKind::Thp`]: ordinary anonymous memory advised with `MADV_HUGEPAGE`, so the
//!   kernel backs it with transparent hugepages where it can.
//! - [`SegmentKind::Plain`]: ordinary pages (THP disabled or the advice refused).
//!
//! A segment made by [`Segment::new_shared`] is instead a shared mapping of a memfd (hugetlb
//! pages when wanted and available), whose descriptor [`Segment::shared_fd`] can be handed to
//! another process on the same host so that it maps the same pages (`mem::shm`). The memfd is
//! sealed at its size once sized (`F_SEAL_SHRINK | F_SEAL_GROW`), so that no holder can
//! shrink it under another's mapping. Shared memory gets transparent hugepages only where
//! `shmem_enabled` allows them.
//!
//! Invariants: `ptr` is page aligned and `ptr..ptr+len` is mapped readable and writable for
//! the whole life of the value; nothing else unmaps it; `Drop` unmaps exactly that range.
//! The segment hands out raw pointers only: it is shared memory that remote peers write, so
//! no `&[u8]` to it is ever created by this crate.

use std::io;
use std::ptr::NonNull;

use crate::limits::{HUGE_PAGE_BYTES, MAPPED_FILE_MAX_BYTES};
pub use crate::sys::mmap::base_page_bytes;
use crate::sys::mmap::{mmap_shared, mmap_shared_at, sized_memfd};

/// Which kind of pages back a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    /// Explicit 2 MiB pages from the hugetlb pool (`MAP_HUGETLB`).
    HugeTlb,
    /// Anonymous memory advised with `MADV_HUGEPAGE` (transparent hugepages).
    Thp,
    /// Anonymous memory with base pages only.
    Plain,
}

impl SegmentKind {
    /// Short lowercase name for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentKind::HugeTlb => "hugetlb",
            SegmentKind::Thp => "thp",
            SegmentKind::Plain => "plain",
        }
    }
}

/// Whether to ask for pages from the hugetlb pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugepagePolicy {
    /// Use `MAP_HUGETLB` when enough pages are free, else fall back to THP.
    Prefer,
    /// Never use `MAP_HUGETLB`.
    Never,
}

impl HugepagePolicy {
    /// `Prefer` when `MC_STORE_USE_HUGEPAGE` is set to a true value
    /// ([`protocol::env::TRUE_WORDS`]), else `Never`.
    pub fn from_env() -> HugepagePolicy {
        Self::from_value(std::env::var("MC_STORE_USE_HUGEPAGE").ok().as_deref())
    }

    fn from_value(value: Option<&str>) -> HugepagePolicy {
        match value.and_then(protocol::env::parse_bool) {
            Some(true) => HugepagePolicy::Prefer,
            _ => HugepagePolicy::Never,
        }
    }
}

/// How to create a segment.
#[derive(Clone, Copy, Debug)]
pub struct SegmentOptions {
    /// Whether to try the hugetlb pool first.
    pub hugepages: HugepagePolicy,
    /// Fault every page in at creation (`MADV_POPULATE_WRITE`, else touching each page) so
    /// that the first remote requests do not stall on page faults.
    pub prefault: bool,
}

impl Default for SegmentOptions {
    fn default() -> Self {
        SegmentOptions {
            hugepages: HugepagePolicy::from_env(),
            prefault: false,
        }
    }
}

/// One memory mapping; see the module docs for its invariants.
#[derive(Debug)]
pub struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    kind: SegmentKind,
    page_bytes: usize,
    /// The memfd behind a shared segment.
    fd: Option<std::os::fd::OwnedFd>,
}

// SAFETY: a Segment owns its mapping exclusively and exposes it only through raw pointers;
// moving it to another thread or sharing `&Segment` between threads cannot create a data race
// by itself (every access through the pointers is the accessor's own unsafe contract).
unsafe impl Send for Segment {}
// SAFETY: see `Send`: `&Segment` only offers `addr`, `len`, `kind` and raw pointers.
unsafe impl Sync for Segment {}

impl Segment {
    /// Maps at least `len_bytes` bytes (rounded up to the page size of the kind obtained).
    ///
    /// Errors: `InvalidInput` for `len_bytes == 0` or a size that overflows when rounded;
    /// the `mmap` error when even plain anonymous memory cannot be mapped.
    pub fn new(len_bytes: usize, options: SegmentOptions) -> io::Result<Segment> {
        if len_bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "segment of 0 bytes",
            ));
        }
        let mut segment = None;
        if options.hugepages == HugepagePolicy::Prefer {
            let len = round_up(len_bytes, HUGE_PAGE_BYTES)?;
            if free_hugetlb_bytes() >= len as u64 {
                segment = map_hugetlb(len).ok();
            }
        }
        let mut segment = match segment {
            Some(s) => s,
            None => map_anonymous(round_up(len_bytes, base_page_bytes())?)?,
        };
        if options.prefault {
            segment.prefault();
        }
        Ok(segment)
    }

    /// Like [`Self::new`], but backed by a memfd mapped shared, so that the pages can be
    /// mapped by another process too (see `mem::shm`). Falls back to [`Self::new`]'s private
    /// memory if the memfd cannot be made or mapped; [`Self::shared_fd`] tells which it got.
    pub fn new_shared(len_bytes: usize, options: SegmentOptions) -> io::Result<Segment> {
        if len_bytes == 0 {
            return Self::new(len_bytes, options);
        }
        let mut segment = None;
        if options.hugepages == HugepagePolicy::Prefer {
            let len = round_up(len_bytes, HUGE_PAGE_BYTES)?;
            if free_hugetlb_bytes() >= len as u64 {
                segment = map_memfd(len, true).ok();
            }
        }
        if segment.is_none() {
            segment = map_memfd(round_up(len_bytes, base_page_bytes())?, false).ok();
        }
        match segment {
            Some(mut s) => {
                if options.prefault {
                    s.prefault();
                }
                Ok(s)
            }
            None => Self::new(len_bytes, options),
        }
    }

    /// Maps `len_bytes` (rounded up to the page size) of the file at `path` from byte
    /// `offset`, shared (`mount_segment(path, size, offset)`): a file in `/dev/shm`, on a
    /// tmpfs or a disk, whose pages other processes may map too.
    ///
    /// The path comes from outside (Python, the REST service), so only a regular file of
    /// ours in an allowed directory is opened, never through a symbolic link
    /// ([`super::file::open_for_mapping`]: `/dev/shm` and `MC_MOUNT_FILE_DIRS`); otherwise
    /// `PermissionDenied` or `InvalidInput`. A size over [`MAPPED_FILE_MAX_BYTES`] is
    /// `InvalidInput`. The whole range must lie inside the file (a page past its end would
    /// fault with `SIGBUS` when served), and `offset` must be a multiple of the page size
    /// (`mmap`'s rule); both are `InvalidInput` otherwise. The mapping is served as the file
    /// is: whoever shrinks the file while it is mounted breaks that contract. The file is not
    /// offered to same-host peers ([`Self::shared_fd`] is `None`; they use TCP): a file takes
    /// no seals, so nothing would stop it shrinking under their mappings (`mem::shm` maps
    /// sealed memfds only).
    pub fn map_file(path: &std::path::Path, len_bytes: usize, offset: u64) -> io::Result<Segment> {
        use std::os::fd::{AsFd, OwnedFd};
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        if len_bytes == 0 {
            return Err(invalid("segment of 0 bytes".into()));
        }
        if len_bytes as u64 > MAPPED_FILE_MAX_BYTES {
            return Err(invalid(format!(
                "{len_bytes} bytes is over the {MAPPED_FILE_MAX_BYTES} a file segment may map"
            )));
        }
        let page = base_page_bytes();
        if !offset.is_multiple_of(page as u64) {
            return Err(invalid(format!(
                "offset {offset} is not a multiple of the page size {page}"
            )));
        }
        let len = round_up(len_bytes, page)?;
        let (file, meta) = super::file::open_for_mapping(path)?;
        let file_len = meta.len();
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| invalid("offset + size overflows".into()))?;
        if end > file_len {
            return Err(invalid(format!(
                "{} holds {file_len} bytes; bytes {offset}..{end} are asked for",
                path.display()
            )));
        }
        let at = libc::off_t::try_from(offset).map_err(|_| invalid("offset too large".into()))?;
        let fd = OwnedFd::from(file);
        let ptr = mmap_shared_at(fd.as_fd(), len, at)?;
        Ok(Segment {
            ptr,
            len,
            kind: SegmentKind::Plain,
            page_bytes: page,
            fd: None,
        })
    }

    /// The memfd of a shared segment, sealed at its size (`None` for private memory and for
    /// a mapped file).
    pub fn shared_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Start address of the mapping.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Raw pointer to the first byte. Reads and writes through it are the caller's contract.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Mapped length in bytes: the requested size rounded up to `page_bytes()`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a segment has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Which kind of pages back the segment.
    pub fn kind(&self) -> SegmentKind {
        self.kind
    }

    /// The page size the length was rounded to.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Faults every page in, writably, now: [`Self::populate`] chunk by chunk (transparent
    /// hugepages where the kernel collapses them), and where the kernel cannot populate
    /// (before Linux 5.14), one zero byte written per page, which is harmless: fresh memory
    /// is already zero, and the caller runs this before the segment is registered.
    pub fn prefault(&mut self) {
        for offset in (0..self.len).step_by(HUGE_PAGE_BYTES) {
            let len = HUGE_PAGE_BYTES.min(self.len - offset);
            if self.populate(offset, len).is_ok() {
                continue;
            }
            let step = base_page_bytes().min(self.page_bytes);
            for at in (offset..offset + len).step_by(step) {
                // SAFETY: at < len, so the byte is inside our writable mapping; `&mut self`
                // means nobody else holds a reference to it.
                unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(at), 0) };
            }
        }
    }

    /// Populates `offset..offset + len` (inside the segment, page aligned) without changing
    /// any byte of it, so it is safe while peers read and write the range: the pages are
    /// faulted in writably (`MADV_POPULATE_WRITE`, which leaves a present page as it is).
    /// A shared segment of base pages is then offered to the kernel as one transparent
    /// hugepage per whole, aligned 2 MiB (`MADV_COLLAPSE`: the kernel copies what is there
    /// into a 2 MiB page under the pages' locks, so concurrent writers wait, never lose a
    /// write; it works even where `shmem_enabled` is `never`, not where it is `deny`), so that
    /// a process mapping it takes one fault per 2 MiB. Only the first page is populated
    /// before the collapse (the rest comes zeroed with the hugepage), the whole range after a
    /// collapse the kernel refuses.
    ///
    /// Returns whether the range is now one hugepage (always true for a hugetlb segment).
    /// Errors: `InvalidInput` for a range outside the segment; the `madvise` error when the
    /// kernel cannot populate (older than 5.14).
    pub fn populate(&self, offset: usize, len: usize) -> io::Result<bool> {
        self.check_page_range(offset, len)?;
        if len == 0 {
            return Ok(false);
        }
        let at = self.addr() + offset;
        let whole_huge = len == HUGE_PAGE_BYTES && at.is_multiple_of(HUGE_PAGE_BYTES);
        if self.kind == SegmentKind::HugeTlb {
            self.advise(offset, len, libc::MADV_POPULATE_WRITE)?;
            return Ok(true);
        }
        if whole_huge && self.fd.is_some() {
            self.advise(offset, base_page_bytes(), libc::MADV_POPULATE_WRITE)?;
            if self.advise(offset, len, libc::MADV_COLLAPSE).is_ok() {
                return Ok(true);
            }
        }
        self.advise(offset, len, libc::MADV_POPULATE_WRITE)?;
        Ok(false)
    }

    /// Whether any page of `offset..offset + len` (page-aligned, inside the segment) is
    /// resident (`mincore`): a page somebody wrote, or one populated ahead. The populator
    /// asks it of each chunk before it takes it, to leave alone the chunks puts touched
    /// first and to see whether puts have reached its walk.
    pub fn any_resident(&self, offset: usize, len: usize) -> io::Result<bool> {
        self.check_page_range(offset, len)?;
        let mut vec = vec![0u8; len.div_ceil(base_page_bytes())];
        // SAFETY: mincore reads no byte of the range, which lies inside our live mapping
        // (checked above); `vec` holds one byte for each of its pages.
        let rc = unsafe {
            libc::mincore(
                self.ptr.as_ptr().add(offset).cast(),
                len,
                vec.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().any(|b| b & 1 == 1))
    }

    /// `InvalidInput` unless `offset..offset + len` lies inside the segment and starts on a
    /// page (what [`Segment::populate`] and [`Segment::any_resident`] take).
    fn check_page_range(&self, offset: usize, len: usize) -> io::Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.len);
        if end.is_none() || !offset.is_multiple_of(base_page_bytes()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{offset}+{len} is not a page-aligned range of {}", self.len),
            ));
        }
        Ok(())
    }

    /// `madvise(advice)` over `offset..offset + len` of the mapping, retried on `EINTR` and
    /// `EAGAIN` (a populate interrupted by a signal, a collapse that met a busy page) a few
    /// times.
    fn advise(&self, offset: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
        debug_assert!(offset + len <= self.len);
        let mut tries = 0;
        loop {
            // SAFETY: the range lies inside our own live mapping (checked by the callers);
            // the advice used here changes no byte of it.
            let rc = unsafe { libc::madvise(self.ptr.as_ptr().add(offset).cast(), len, advice) };
            if rc == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            tries += 1;
            let again = matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN));
            if !again || tries >= 3 {
                return Err(e);
            }
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping created in `new`, unmapped only here.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        debug_assert_eq!(rc, 0, "munmap of a segment failed");
    }
}

fn round_up(len: usize, page: usize) -> io::Result<usize> {
    debug_assert!(page.is_power_of_two());
    len.checked_add(page - 1)
        .map(|v| v & !(page - 1))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "segment size overflows"))
}

/// Free bytes in the 2 MiB hugetlb pool (`HugePages_Free` x `Hugepagesize` from
/// `/proc/meminfo`); 0 when it cannot be read or the default huge page is not 2 MiB.
pub fn free_hugetlb_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return 0;
    };
    parse_free_hugetlb_bytes(&text)
}

fn parse_free_hugetlb_bytes(meminfo: &str) -> u64 {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    match (field("HugePages_Free:"), field("Hugepagesize:")) {
        (Some(free), Some(kib)) if kib * 1024 == HUGE_PAGE_BYTES as u64 => {
            free.saturating_mul(HUGE_PAGE_BYTES as u64)
        }
        _ => 0,
    }
}

fn mmap_anon(len: usize, extra_flags: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh private anonymous mapping at a kernel-chosen address aliases nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

fn map_hugetlb(len: usize) -> io::Result<Segment> {
    let ptr = mmap_anon(len, libc::MAP_HUGETLB)?;
    Ok(Segment {
        ptr,
        len,
        kind: SegmentKind::HugeTlb,
        page_bytes: HUGE_PAGE_BYTES,
        fd: None,
    })
}

/// A memfd of `len` bytes mapped shared (hugetlb pages with `huge`; the kernel reserves them
/// at `mmap`, so a later fault cannot fail), sealed at that size ([`sized_memfd`]).
fn map_memfd(len: usize, huge: bool) -> io::Result<Segment> {
    use std::os::fd::AsFd;
    let fd = sized_memfd(c"mooncake-segment", len, huge)?;
    let ptr = mmap_shared(fd.as_fd(), len)?;
    let (kind, page_bytes) = if huge {
        (SegmentKind::HugeTlb, HUGE_PAGE_BYTES)
    } else {
        // SAFETY: ptr..ptr+len is the mapping just created; the advice changes no contents.
        let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        let thp = rc == 0 && shmem_thp_enabled();
        (
            if thp {
                SegmentKind::Thp
            } else {
                SegmentKind::Plain
            },
            base_page_bytes(),
        )
    };
    Ok(Segment {
        ptr,
        len,
        kind,
        page_bytes,
        fd: Some(fd),
    })
}

/// Whether shared memory advised with `MADV_HUGEPAGE` may get transparent hugepages
/// (`/sys/kernel/mm/transparent_hugepage/shmem_enabled` is not `never` or `deny`).
pub fn shmem_thp_enabled() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .map(|s| !s.contains("[never]") && !s.contains("[deny]"))
        .unwrap_or(false)
}

fn map_anonymous(len: usize) -> io::Result<Segment> {
    let ptr = mmap_anon(len, 0)?;
    // SAFETY: ptr..ptr+len is the mapping just created; the advice changes no contents.
    let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
    let kind = if rc == 0 && thp_enabled() {
        SegmentKind::Thp
    } else {
        SegmentKind::Plain
    };
    Ok(Segment {
        ptr,
        len,
        kind,
        page_bytes: base_page_bytes(),
        fd: None,
    })
}

/// False when `/sys/kernel/mm/transparent_hugepage/enabled` selects `[never]`.
fn thp_enabled() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| !s.contains("[never]"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(hugepages: HugepagePolicy, prefault: bool) -> SegmentOptions {
        SegmentOptions {
            hugepages,
            prefault,
        }
    }

    #[test]
    fn a_file_mapping_shares_the_files_bytes_and_refuses_what_it_cannot_serve() {
        let page = base_page_bytes();
        let path = std::path::PathBuf::from(format!("/dev/shm/mc-map-file-{}", std::process::id()));
        let mut bytes = vec![0u8; 3 * page];
        bytes[page] = 42;
        std::fs::write(&path, &bytes).unwrap();

        let seg = Segment::map_file(&path, page, page as u64).unwrap();
        assert_eq!((seg.len(), seg.kind()), (page, SegmentKind::Plain));
        // SAFETY: inside the live mapping; no references to it exist.
        unsafe {
            assert_eq!(seg.as_ptr().read(), 42);
            seg.as_ptr().add(1).write(7);
        }
        drop(seg);
        assert_eq!(
            std::fs::read(&path).unwrap()[page + 1],
            7,
            "writes reach the file"
        );
        let whole = Segment::map_file(&path, 3 * page - 1, 0).unwrap();
        assert_eq!(whole.len(), 3 * page);
        assert!(whole.shared_fd().is_none(), "a file takes no seals");

        for (len, offset) in [
            (0, 0),
            (page, 1),
            (3 * page + 1, 0),
            (page, 3 * page as u64),
        ] {
            let e = Segment::map_file(&path, len, offset).unwrap_err();
            assert_eq!(
                e.kind(),
                io::ErrorKind::InvalidInput,
                "{len} at {offset}: {e}"
            );
        }
        assert!(Segment::map_file(&path.with_extension("none"), page, 0).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    /// Paths made for a test under `/dev/shm` and the temp dir, removed on drop.
    struct Scratch {
        tag: String,
    }

    impl Scratch {
        fn new(test: &str) -> Scratch {
            Scratch {
                tag: format!("mc-{test}-{}", std::process::id()),
            }
        }

        fn shm(&self, name: &str) -> std::path::PathBuf {
            format!("/dev/shm/{}-{name}", self.tag).into()
        }

        /// A directory of its own in the temp dir (not an allowed one).
        fn elsewhere(&self) -> std::path::PathBuf {
            let dir = std::env::temp_dir().join(&self.tag);
            std::fs::create_dir_all(&dir).unwrap();
            dir
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&self.tag));
            for e in std::fs::read_dir("/dev/shm")
                .into_iter()
                .flatten()
                .flatten()
            {
                if e.file_name().to_string_lossy().starts_with(&self.tag) {
                    let p = e.path();
                    let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir(&p));
                }
            }
        }
    }

    /// `mount_segment`'s path comes from outside: only a regular file of ours in an allowed
    /// directory is mapped, each rule broken is refused with its kind and a message naming
    /// it, and the file that passes maps as before.
    #[test]
    fn a_file_mapping_maps_only_a_regular_file_of_ours_in_an_allowed_directory() {
        use std::os::unix::ffi::OsStrExt;
        let page = base_page_bytes();
        let t = Scratch::new("map-rules");
        let ok = t.shm("ok");
        std::fs::write(&ok, vec![0u8; page]).unwrap();
        let refused = |path: &std::path::Path, kind: io::ErrorKind, says: &str| {
            let e = Segment::map_file(path, page, 0).expect_err(&path.display().to_string());
            assert_eq!(e.kind(), kind, "{}: {e}", path.display());
            assert!(e.to_string().contains(says), "{}: {e}", path.display());
        };

        let link = t.shm("link");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        refused(&link, io::ErrorKind::PermissionDenied, "symbolic link");

        let outside = t.elsewhere().join("file");
        std::fs::write(&outside, vec![0u8; page]).unwrap();
        refused(&outside, io::ErrorKind::PermissionDenied, "not in /dev/shm");
        // An allowed-looking path whose directory is elsewhere (a link to a directory).
        let dir_link = t.shm("dir-link");
        std::os::unix::fs::symlink(t.elsewhere(), &dir_link).unwrap();
        refused(
            &dir_link.join("file"),
            io::ErrorKind::PermissionDenied,
            "not in /dev/shm",
        );

        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = t.shm("theirs");
            std::fs::write(&theirs, vec![0u8; page]).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            refused(
                &theirs,
                io::ErrorKind::PermissionDenied,
                "owned by uid 65534",
            );
        } else {
            eprintln!("not root: a file of another user cannot be made; not checked");
        }

        let fifo = t.shm("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || tx.send(Segment::map_file(&f, page, 0).err()));
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a FIFO blocked")
            .expect("a FIFO was mapped");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("not a regular file"), "{e}");

        let dir = t.shm("dir");
        std::fs::create_dir(&dir).unwrap();
        refused(&dir, io::ErrorKind::InvalidInput, "directory");

        // A sparse file larger than the cap costs nothing; a size past the cap is refused.
        let huge = t.shm("huge");
        let over = MAPPED_FILE_MAX_BYTES + page as u64;
        std::fs::File::create(&huge).unwrap().set_len(over).unwrap();
        let e = Segment::map_file(&huge, over as usize, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("a file segment may map"), "{e}");

        let seg = Segment::map_file(&ok, page, 0).unwrap();
        // SAFETY: inside the live mapping; no references to it exist.
        unsafe { seg.as_ptr().add(5).write(9) };
        drop(seg);
        assert_eq!(std::fs::read(&ok).unwrap()[5], 9, "the allowed file maps");
    }

    #[test]
    fn rounds_to_the_page_and_is_writable() {
        let page = base_page_bytes();
        let seg = Segment::new(page + 1, opts(HugepagePolicy::Never, false)).unwrap();
        assert_eq!(seg.len(), 2 * page);
        assert_eq!(seg.addr() % page, 0);
        assert_ne!(seg.kind(), SegmentKind::HugeTlb);
        // SAFETY: inside the live mapping; no references to it exist.
        unsafe {
            seg.as_ptr().add(seg.len() - 1).write(7);
            assert_eq!(seg.as_ptr().add(seg.len() - 1).read(), 7);
            assert_eq!(seg.as_ptr().read(), 0);
        }
    }

    #[test]
    fn zero_size_is_refused() {
        let err = Segment::new(0, opts(HugepagePolicy::Never, false)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            round_up(usize::MAX - 10, 4096).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn prefault_keeps_memory_zero() {
        let mut seg =
            Segment::new(3 * HUGE_PAGE_BYTES, opts(HugepagePolicy::Never, false)).unwrap();
        seg.prefault();
        for off in (0..seg.len()).step_by(4096) {
            // SAFETY: inside the live mapping.
            assert_eq!(unsafe { seg.as_ptr().add(off).read() }, 0);
        }
    }

    #[test]
    fn hugetlb_preference_falls_back_or_uses_the_pool() {
        // Works on machines with and without a reserved pool: with enough free pages the
        // segment is HugeTlb and 2 MiB rounded, otherwise it falls back to THP or plain.
        let seg = Segment::new(1, opts(HugepagePolicy::Prefer, true)).unwrap();
        match seg.kind() {
            SegmentKind::HugeTlb => assert_eq!(seg.len(), HUGE_PAGE_BYTES),
            _ => assert_eq!(seg.len(), base_page_bytes()),
        }
        println!(
            "segment kind with hugepages preferred: {}",
            seg.kind().as_str()
        );
    }

    #[test]
    fn env_policy_values() {
        assert_eq!(
            HugepagePolicy::from_value(Some("1")),
            HugepagePolicy::Prefer
        );
        assert_eq!(
            HugepagePolicy::from_value(Some(" TRUE ")),
            HugepagePolicy::Prefer
        );
        assert_eq!(HugepagePolicy::from_value(Some("0")), HugepagePolicy::Never);
        assert_eq!(HugepagePolicy::from_value(Some("")), HugepagePolicy::Never);
        assert_eq!(HugepagePolicy::from_value(None), HugepagePolicy::Never);
    }

    #[test]
    fn meminfo_parsing() {
        let text = "MemTotal: 1 kB\nHugePages_Total:      8\nHugePages_Free:       3\n\
                    Hugepagesize:       2048 kB\n";
        assert_eq!(parse_free_hugetlb_bytes(text), 3 * HUGE_PAGE_BYTES as u64);
        let gig = "HugePages_Free: 3\nHugepagesize: 1048576 kB\n";
        assert_eq!(parse_free_hugetlb_bytes(gig), 0);
        assert_eq!(parse_free_hugetlb_bytes("garbage"), 0);
    }
}
