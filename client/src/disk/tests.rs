//! The disk store on real files: a temporary directory on the build machine's filesystem
//! (under the target directory, a real disk) and, for the buffered fallback, `/dev/shm`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dataplane::mem::{Dst, Src};

use dataplane::recovery::{CatalogRecord, RecordKind};
use dataplane::transport::client::{ClientConfig, TcpClient, TransferError, TransferOp};
use protocol::Version;

use super::*;

const BASE: u64 = 1 << 60;

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(under: &Path, tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = under.join(format!("mc-disk-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// On the real filesystem the build runs on (never tmpfs).
    fn real(tag: &str) -> TempDir {
        let under = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/disk-tests");
        std::fs::create_dir_all(&under).unwrap();
        TempDir::new(&under, tag)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(dir: &Path, uring: bool) -> DiskConfig {
    let mut c = DiskConfig::new(dir);
    c.size_limit_bytes = 1 << 30;
    c.use_uring = uring;
    c.workers = 2;
    c
}

pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn v(seq: u64) -> Version {
    Version { term: 1, seq }
}

fn put(t: &DiskTier, addr: u64, key: &str, data: &[u8]) -> Result<(), DiskError> {
    t.write(addr, key, v(1), Pins::default(), Src::from(data))
}

fn get(t: &DiskTier, addr: u64, len: usize) -> Result<Vec<u8>, DiskError> {
    let mut out = vec![0u8; len];
    t.read(addr, Dst::from(&mut out[..]))?;
    Ok(out)
}

fn file_of(t: &DiskTier, addr: u64) -> PathBuf {
    t.shared.path_of(addr)
}

fn round_trip(uring: bool) {
    let d = TempDir::real(if uring { "rt-uring" } else { "rt-blocking" });
    let t = DiskTier::open(cfg(&d.0, uring), BASE).unwrap();
    assert!(t.direct_io(), "ext4 under target/ takes O_DIRECT");
    if uring {
        // Rings exactly where the kernel gives them (under seccomp this test covers the
        // fallback twice).
        let kernel = dataplane::server::probe::probe_kernel().is_available();
        assert_eq!(t.uring(), kernel);
    } else {
        assert!(!t.uring());
    }
    let sizes = [1usize, 4096, (4 << 20) + 1, 3 * 4096 + 7];
    let mut addr = BASE;
    let mut placed = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data = pattern(n, i as u8);
        put(&t, addr, &format!("k{i}"), &data).unwrap();
        placed.push((addr, data));
        addr += (n as u64).next_multiple_of(1 << 23);
    }
    for (a, data) in &placed {
        assert_eq!(&get(&t, *a, data.len()).unwrap(), data);
    }
    // Ranged reads: from inside the object, across bounce-buffer boundaries.
    let (a, data) = &placed[2];
    let got = get(&t, a + 1_000_000, 3_000_000).unwrap();
    assert_eq!(&got[..], &data[1_000_000..4_000_000]);
    assert_eq!(
        get(&t, a + data.len() as u64 - 1, 1).unwrap(),
        [data[data.len() - 1]]
    );
    // Past an object's end, or between objects: not found.
    assert!(matches!(
        get(&t, a + data.len() as u64 - 1, 2),
        Err(DiskError::NotFound { .. })
    ));
    assert!(matches!(
        get(&t, BASE + 2, 4096),
        Err(DiskError::NotFound { .. })
    ));
    let s = t.stats();
    assert_eq!(s.objects, 4);
    assert_eq!(s.logical_bytes, sizes.iter().sum::<usize>() as u64);
    assert!(s.physical_bytes >= s.logical_bytes);
    assert_eq!(s.writes, 4);
    assert_eq!(s.reads, 6);
    assert!(t.last_read(placed[0].0).is_some());
    // Replacing an object at the same address.
    put(&t, placed[0].0, "k0", b"xy").unwrap();
    assert_eq!(get(&t, placed[0].0, 2).unwrap(), b"xy");
    assert_eq!(t.stats().objects, 4);
}

#[test]
fn disk_round_trip_uring() {
    round_trip(true);
}

#[test]
fn disk_round_trip_blocking() {
    round_trip(false);
}

#[test]
fn disk_restart_reads_everything_back() {
    let d = TempDir::real("restart");
    let a = pattern(5000, 1);
    let b = pattern(1 << 20, 2);
    {
        let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
        t.write(
            BASE,
            "a",
            v(3),
            Pins {
                hard: true,
                soft_ttl_ms: None,
            },
            Src::from(&a[..]),
        )
        .unwrap();
        t.write(
            BASE + (1 << 24),
            "b",
            v(4),
            Pins {
                hard: false,
                soft_ttl_ms: Some(7),
            },
            Src::from(&b[..]),
        )
        .unwrap();
    }
    // Another worker count: files move to their new owners.
    let mut c = cfg(&d.0, false);
    c.workers = 3;
    let t = DiskTier::open(c, BASE).unwrap();
    assert_eq!(get(&t, BASE, a.len()).unwrap(), a);
    assert_eq!(get(&t, BASE + (1 << 24), b.len()).unwrap(), b);
    let held = t.held();
    assert_eq!(held.len(), 2);
    assert_eq!(
        (held[0].key.as_str(), held[0].version, held[0].hard_pin),
        ("a", v(3), true)
    );
    assert_eq!(
        (held[1].key.as_str(), held[1].soft_pin_ttl_ms),
        ("b", Some(7))
    );
    assert_eq!(t.stats().scan_dropped, 0);
    drop(t);
    // Down to one worker: everything moves to 0/, the others' directories go.
    let mut c = cfg(&d.0, true);
    c.workers = 1;
    let t = DiskTier::open(c, BASE).unwrap();
    assert_eq!(get(&t, BASE, a.len()).unwrap(), a);
    assert_eq!(t.held().len(), 2);
    assert!(!d.0.join("1").exists() && !d.0.join("2").exists());
}

#[test]
fn disk_flipped_byte_is_corrupt_and_dropped() {
    let d = TempDir::real("flip");
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    let data = pattern(10_000, 3);
    put(&t, BASE, "k", &data).unwrap();
    let path = file_of(&t, BASE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096 + 9_999] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    // A ranged read that does not cover the flipped byte still checks the whole object.
    assert!(matches!(get(&t, BASE, 10), Err(DiskError::Corrupt { .. })));
    assert!(!path.exists());
    assert_eq!(t.stats().checksum_failures, 1);
    assert_eq!(t.stats().objects, 0);
    assert!(matches!(get(&t, BASE, 10), Err(DiskError::NotFound { .. })));
}

#[test]
fn disk_scan_drops_truncated_and_temp_files() {
    let d = TempDir::real("scan");
    let (good, cut) = (BASE, BASE + (1 << 24));
    let temp;
    {
        let t = DiskTier::open(cfg(&d.0, false), BASE).unwrap();
        put(&t, good, "good", &pattern(9000, 1)).unwrap();
        put(&t, cut, "cut", &pattern(9000, 2)).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(file_of(&t, cut))
            .unwrap();
        f.set_len(4096 + 4096).unwrap();
        temp = file_of(&t, BASE + 4096).with_extension("mco.tmp");
        std::fs::write(&temp, b"half a write").unwrap();
        // Something that is not ours stays.
        std::fs::write(d.0.join("README"), b"x").unwrap();
    }
    let t = DiskTier::open(cfg(&d.0, false), BASE).unwrap();
    let s = t.stats();
    assert_eq!((s.objects, s.scan_dropped, s.scan_temp_removed), (1, 1, 1));
    assert!(!temp.exists());
    assert!(d.0.join("README").exists());
    assert_eq!(get(&t, good, 9000).unwrap(), pattern(9000, 1));
}

#[test]
fn disk_key_limit_and_physical_cap_refuse() {
    let d = TempDir::real("limits");
    let mut c = cfg(&d.0, true);
    c.keys_limit = 2;
    c.max_physical_bytes = Some(3 * 4096 + 2 * 4096);
    let t = DiskTier::open(c, BASE).unwrap();
    put(&t, BASE, "a", b"1").unwrap(); // 2 blocks
    put(&t, BASE + 4096, "b", b"2").unwrap(); // 2 blocks
    let e = put(&t, BASE + 8192, "c", b"3").unwrap_err();
    assert!(matches!(e, DiskError::KeysLimit { limit: 2 }), "{e}");
    // Replacing does not add a key; a bigger one breaks the physical cap.
    put(&t, BASE, "a", b"11").unwrap();
    let e = put(&t, BASE, "a", &pattern(3 * 4096, 0)).unwrap_err();
    assert!(matches!(e, DiskError::PhysicalCap { .. }), "{e}");
    assert!(e
        .to_string()
        .contains("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES"));
    assert_eq!(t.stats().write_refusals, 2);
    assert_eq!(get(&t, BASE, 2).unwrap(), b"11");
    assert!(!t.writes_stopped());
}

#[test]
fn disk_bad_directories_are_clear_errors() {
    let d = TempDir::real("dirs");
    let file = d.0.join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let e = DiskTier::open(cfg(&file, true), BASE).err().unwrap();
    assert!(e.to_string().contains("not a directory"), "{e}");
    // A missing directory is created.
    let missing = d.0.join("a/b");
    assert!(DiskTier::open(cfg(&missing, true), BASE).is_ok());
    assert!(missing.is_dir());
    // A path under a file cannot be created.
    let e = DiskTier::open(cfg(&file.join("sub"), true), BASE)
        .err()
        .unwrap();
    assert!(e.to_string().contains("is a file, not a directory"), "{e}");
    // Not writable: a read-only directory. Root ignores modes: then a read-only tmpfs, or
    // where mounting is not allowed, /proc/self, where nobody may create files.
    let ro_mount = d.0.join("ro-mount");
    std::fs::create_dir(&ro_mount).unwrap();
    let _m;
    let ro = if running_as_root() {
        if mount_tmpfs(&ro_mount, "ro,size=64k") {
            _m = Mount(ro_mount.clone());
            ro_mount
        } else {
            PathBuf::from("/proc/self")
        }
    } else {
        let p = d.0.join("ro");
        std::fs::create_dir(&p).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o555)).unwrap();
        p
    };
    let e = DiskTier::open(cfg(&ro, true), BASE).err().unwrap();
    assert!(e.to_string().contains("not writable"), "{e}");
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// tmpfs: before Linux 6.6 it refuses `O_DIRECT` and the probe falls back to buffered I/O;
/// from 6.6 it accepts it. Either way the probe's answer must work.
#[test]
fn disk_tmpfs_works_with_whatever_the_probe_finds() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm here");
        return;
    }
    let d = TempDir::new(shm, "tmpfs");
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    eprintln!("tmpfs O_DIRECT: {}", t.direct_io());
    let data = pattern(70_000, 9);
    put(&t, BASE, "k", &data).unwrap();
    assert_eq!(get(&t, BASE + 5, 60_000).unwrap(), &data[5..60_005]);
}

/// The buffered path, forced by the configuration, on both I/O engines.
#[test]
fn disk_buffered_io_round_trip() {
    for uring in [true, false] {
        let d = TempDir::real("buffered");
        let mut c = cfg(&d.0, uring);
        c.direct_io = false;
        let t = DiskTier::open(c, BASE).unwrap();
        assert!(!t.direct_io());
        let data = pattern((1 << 20) + 4097, 4);
        put(&t, BASE, "k", &data).unwrap();
        assert_eq!(get(&t, BASE, data.len()).unwrap(), data);
        assert_eq!(get(&t, BASE + 4097, 1 << 20).unwrap(), &data[4097..]);
    }
}

#[test]
fn disk_forget_and_bury_delete_files() {
    let d = TempDir::real("forget");
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    for i in 0..4u64 {
        put(&t, BASE + i * 8192, &format!("k{i}"), b"abc").unwrap();
    }
    let f1 = file_of(&t, BASE + 8192);
    assert_eq!(t.forget(BASE + 8192, 2 * 8192, u64::MAX), 2);
    assert!(!f1.exists());
    assert_eq!(t.stats().objects, 2);
    // A tombstone of another key or an older version deletes nothing.
    assert_eq!(t.bury(BASE, 3, "other", v(9)), 0);
    assert_eq!(t.bury(BASE, 3, "k0", Version::ZERO), 0);
    assert_eq!(t.bury(BASE, 3, "k0", v(1)), 1);
    assert_eq!(t.held().len(), 1);
}

#[test]
fn disk_out_of_segment_writes_are_refused() {
    let d = TempDir::real("range");
    let t = DiskTier::open(cfg(&d.0, false), BASE).unwrap();
    assert!(matches!(
        put(&t, BASE - 1, "k", b"x"),
        Err(DiskError::InvalidArgument(_))
    ));
    let end = BASE + t.size_limit();
    assert!(put(&t, end - 1, "k", b"xy").is_err());
    assert!(put(&t, BASE, "", b"x").is_err());
    assert!(put(&t, BASE, "k", b"").is_err());
}

fn listener_tier(tag: &str) -> (TempDir, Arc<DiskTier>, Vec<u8>) {
    let d = TempDir::real(tag);
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    let data = pattern(300_000, 5);
    put(&t, BASE, "obj", &data).unwrap();
    (d, t, data)
}

fn client_cfg(auth: Option<&'static protocol::auth::Token>) -> ClientConfig {
    ClientConfig {
        auth,
        lanes: 1,
        ..ClientConfig::default()
    }
}

#[test]
fn disk_listener_serves_reads_to_the_dataplane_client() {
    let (_d, t, data) = listener_tier("listen");
    let l = t.serve("127.0.0.1:0".parse().unwrap(), None).unwrap();
    // A writer's client declares its term with a FENCE on connect: answered OK.
    let fenced = ClientConfig {
        term: 3,
        ..client_cfg(None)
    };
    let c = TcpClient::connect(l.local_addr(), fenced).unwrap();
    let mut out = vec![0u8; 100_000];
    let mut ops = [TransferOp::Read {
        remote_addr: BASE + 7,
        dst: Dst::from(&mut out[..]),
    }];
    let r = c.submit(&mut ops);
    assert_eq!(r, vec![Ok(())]);
    assert_eq!(&out[..], &data[7..100_007]);
    // Unknown address: not registered.
    let mut small = [0u8; 8];
    assert_eq!(
        c.read(BASE + 1_000_000, &mut small),
        Err(TransferError::Refused { status: -3 })
    );
    // A READ beyond the object's end, though it starts inside: not registered either.
    let mut past = vec![0u8; 16];
    assert_eq!(
        c.read(BASE + data.len() as u64 - 8, &mut past),
        Err(TransferError::Refused { status: -3 })
    );
    // A WRITE is refused and the connection goes on.
    assert_eq!(
        c.write(BASE, b"nope"),
        Err(TransferError::Refused { status: -303 })
    );
    // A tombstone deletes the file.
    let rec = CatalogRecord {
        len: data.len() as u64,
        hard_pin: false,
        key: "obj",
        version: v(1),
        kind: RecordKind::Tombstone,
        soft_pin_ttl_ms: None,
    }
    .encode();
    let mut ops = [TransferOp::CatalogPut {
        remote_addr: BASE,
        record: Src::from(&rec[..]),
    }];
    assert_eq!(c.submit(&mut ops), vec![Ok(())]);
    assert_eq!(t.stats().objects, 0);
    assert_eq!(
        c.read(BASE, &mut small),
        Err(TransferError::Refused { status: -3 })
    );
}

#[test]
fn disk_listener_reports_corruption_distinctly() {
    let (_d, t, _data) = listener_tier("listen-bad");
    let path = file_of(&t, BASE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096 + 1] ^= 0x80;
    std::fs::write(&path, &bytes).unwrap();
    let l = t.serve("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let c = TcpClient::connect(l.local_addr(), client_cfg(None)).unwrap();
    let mut out = [0u8; 16];
    assert_eq!(
        c.read(BASE, &mut out),
        Err(TransferError::Refused { status: -302 })
    );
    assert_eq!(t.stats().checksum_failures, 1);
}

#[test]
fn disk_listener_asks_for_the_cluster_secret() {
    let (_d, t, data) = listener_tier("listen-auth");
    let secret: &'static protocol::auth::Token = Box::leak(Box::new(
        protocol::auth::Token::new(b"disk-tier-test-secret-0123456789").unwrap(),
    ));
    let wrong: &'static protocol::auth::Token = Box::leak(Box::new(
        protocol::auth::Token::new(b"another-secret-entirely-98765432").unwrap(),
    ));
    let l = t
        .serve("127.0.0.1:0".parse().unwrap(), Some(secret))
        .unwrap();
    let c = TcpClient::connect(l.local_addr(), client_cfg(Some(secret))).unwrap();
    let mut out = vec![0u8; data.len()];
    c.read(BASE, &mut out).unwrap();
    assert_eq!(out, data);
    // A wrong secret, or none, gets nothing.
    let bad = TcpClient::connect(l.local_addr(), client_cfg(Some(wrong)));
    let refused = match bad {
        Err(_) => true,
        Ok(c) => c.read(BASE, &mut out[..8]).is_err(),
    };
    assert!(refused);
    let none = TcpClient::connect(l.local_addr(), client_cfg(None)).unwrap();
    assert!(none.read(BASE, &mut out[..8]).is_err());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while l.connections_unauthenticated() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(l.connections_unauthenticated(), 2);
}

#[test]
fn disk_write_errors_stop_writes_until_resume() {
    let d = TempDir::real("stop");
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    put(&t, BASE, "k", b"kept").unwrap();
    // What a full disk does to a write, injected: writes stop, once.
    let e = t
        .shared
        .write_failed(BASE + 4096, std::io::Error::from_raw_os_error(libc::ENOSPC));
    assert!(matches!(e, DiskError::Io { .. }));
    assert!(t.writes_stopped() && t.stats().writes_stopped);
    let e = put(&t, BASE + 4096, "k2", b"x").unwrap_err();
    assert!(matches!(e, DiskError::Stopped { .. }), "{e}");
    // Reads go on.
    assert_eq!(get(&t, BASE, 4).unwrap(), b"kept");
    // A permission error is not a full disk: it does not stop writes.
    t.resume().unwrap();
    t.shared
        .write_failed(BASE, std::io::Error::from_raw_os_error(libc::EACCES));
    assert!(!t.writes_stopped());
    put(&t, BASE + 4096, "k2", b"x").unwrap();
}

/// Unmounts (lazily) when dropped, so a failed assertion leaves no mount behind.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Mounts a tmpfs with `options` on `at`; false where this process may not mount.
fn mount_tmpfs(at: &Path, options: &str) -> bool {
    std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", options, "tmpfs"])
        .arg(at)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A real full filesystem (a 1 MiB tmpfs): needs the right to mount, else skipped.
#[test]
fn disk_full_filesystem_stops_writes() {
    let d = TempDir::real("full");
    if !mount_tmpfs(&d.0, "size=1m") {
        eprintln!("cannot mount a tmpfs here; the injected-error test covers the logic");
        return;
    }
    let _m = Mount(d.0.clone());
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    assert!(
        t.size_limit() <= 1 << 20,
        "the 1 GiB limit is capped to the filesystem"
    );
    // Something else fills the disk after the tier opened.
    let filler = d.0.join("filler");
    std::fs::write(&filler, vec![1u8; 900 * 1024]).unwrap();
    let e = put(&t, BASE, "big", &pattern(200 * 1024, 1)).unwrap_err();
    assert!(e.to_string().contains("No space left"), "{e}");
    assert!(t.writes_stopped());
    assert!(matches!(
        put(&t, BASE, "small", b"x"),
        Err(DiskError::Stopped { .. })
    ));
    assert!(
        std::fs::read_dir(t.shared.worker_dir(worker_of(BASE, 2)))
            .unwrap()
            .next()
            .is_none(),
        "the temporary file is gone"
    );
    std::fs::remove_file(&filler).unwrap();
    // Before the probe interval: still refused, though there is room again.
    assert!(matches!(
        put(&t, BASE, "small", b"x"),
        Err(DiskError::Stopped { .. })
    ));
    // At the interval, the refused write's probe finds room and the write goes through.
    if let Some(stop) = t.shared.stopped.lock().as_mut() {
        stop.next_probe = std::time::Instant::now();
    }
    put(&t, BASE, "big", &pattern(200 * 1024, 1)).unwrap();
    assert!(!t.writes_stopped());
    assert_eq!(get(&t, BASE, 200 * 1024).unwrap(), pattern(200 * 1024, 1));
}

/// Many callers at once on every worker: each reads back its own bytes.
#[test]
fn disk_concurrent_writers_and_readers() {
    let d = TempDir::real("concurrent");
    let mut c = cfg(&d.0, true);
    c.workers = 3;
    let t = DiskTier::open(c, BASE).unwrap();
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let t = &t;
            s.spawn(move || {
                for i in 0..20u64 {
                    let addr = BASE + (th * 100 + i) * (1 << 20);
                    let data = pattern(100_000 + i as usize * 1000, (th * 7 + i) as u8);
                    put(t, addr, &format!("t{th}-{i}"), &data).unwrap();
                    assert_eq!(get(t, addr, data.len()).unwrap(), data);
                }
            });
        }
    });
    assert_eq!(t.stats().objects, 80);
}

/// A file swapped or deleted behind the tier's back is a miss, never another key's bytes.
#[test]
fn disk_foreign_or_missing_file_is_corrupt() {
    let d = TempDir::real("foreign");
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    let (a, b) = (BASE, BASE + (1 << 20));
    put(&t, a, "a", &pattern(5000, 1)).unwrap();
    put(&t, b, "b", &pattern(5000, 2)).unwrap();
    std::fs::copy(file_of(&t, a), file_of(&t, b)).unwrap();
    let e = get(&t, b, 5000).unwrap_err();
    assert!(
        matches!(&e, DiskError::Corrupt { why, .. } if why.contains("header names")),
        "{e}"
    );
    std::fs::remove_file(file_of(&t, a)).unwrap();
    let e = get(&t, a, 10).unwrap_err();
    assert!(
        matches!(&e, DiskError::Corrupt { why, .. } if why.contains("missing")),
        "{e}"
    );
    let s = t.stats();
    assert_eq!((s.checksum_failures, s.objects), (2, 0));
}

/// Two files whose ranges overlap (left by hand, or by a bug): the scan keeps the first.
#[test]
fn disk_scan_drops_an_overlapping_file() {
    let d = TempDir::real("overlap");
    let c = cfg(&d.0, false);
    let data = pattern(9000, 1);
    {
        let t = DiskTier::open(c.clone(), BASE).unwrap();
        put(&t, BASE, "a", &data).unwrap();
        std::fs::copy(file_of(&t, BASE), file_of(&t, BASE + 4096)).unwrap();
    }
    let t = DiskTier::open(c, BASE).unwrap();
    assert_eq!(t.stats().scan_dropped, 1);
    assert_eq!(t.held().len(), 1);
    assert_eq!(get(&t, BASE, 9000).unwrap(), data);
    // A write over part of a stored object's range replaces it (the master reused it).
    put(&t, BASE + 4096, "b", b"new").unwrap();
    assert_eq!(t.held().len(), 1);
    assert!(!file_of(&t, BASE).exists());
}

/// A header that does not decode closes the connection after an ERR_INVALID_ARGUMENT.
#[test]
fn disk_listener_closes_on_a_malformed_header() {
    use std::io::{Read, Write};
    let (_d, t, _data) = listener_tier("listen-malformed");
    let l = t.serve("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let mut s = std::net::TcpStream::connect(l.local_addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut bad = dataplane::transport::header::RequestHeader {
        opcode: dataplane::transport::header::Opcode::Read,
        request_id: 42,
        addr: BASE,
        len: 8,
    }
    .encode();
    bad[6] = 1; // flags must be 0
    s.write_all(&bad).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let h = dataplane::transport::header::ResponseHeader::decode(&answer).unwrap();
    assert_eq!((h.status, h.request_id, h.len), (-1, 42, 0));
    assert_eq!(answer.len(), 24, "closed after the answer");
}

/// Past `DISK_LISTENER_CONNECTIONS_MAX` connections, a new one is closed at once and counted;
/// the ones already served are not disturbed.
#[test]
fn disk_listener_bounds_its_connections() {
    use std::io::Read;
    let (_d, t, data) = listener_tier("listen-cap");
    let l = t.serve("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let first = TcpClient::connect(l.local_addr(), client_cfg(None)).unwrap();
    let mut out = vec![0u8; 64];
    first.read(BASE, &mut out).unwrap();
    let idle: Vec<std::net::TcpStream> = (1..limits::DISK_LISTENER_CONNECTIONS_MAX)
        .map(|_| std::net::TcpStream::connect(l.local_addr()).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut extra = std::net::TcpStream::connect(l.local_addr()).unwrap();
    extra
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        extra.read(&mut byte).unwrap_or(0),
        0,
        "closed without an answer"
    );
    while l.connections_refused() < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(l.connections_refused(), 1);
    first.read(BASE + 64, &mut out).unwrap();
    assert_eq!(&out[..], &data[64..128]);
    drop(idle);
}

#[test]
fn disk_listener_streams_a_large_object_and_cuts_a_bad_one_short() {
    let d = TempDir::real("listen-stream");
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    let data = pattern(3 << 20, 9);
    put(&t, BASE, "big", &data).unwrap();
    let l = t.serve("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let c = TcpClient::connect(l.local_addr(), client_cfg(None)).unwrap();
    let mut out = vec![0u8; data.len()];
    c.read(BASE, &mut out).unwrap();
    assert_eq!(out, data, "streamed in pieces, byte-exact");
    // A byte flipped near the end: its pieces go out before the checksum is known, so the
    // reply is cut short and the read fails; never a success with wrong bytes.
    let path = file_of(&t, BASE);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 8192;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let mut out = vec![0u8; data.len()];
    assert!(c.read(BASE, &mut out).is_err());
    assert_eq!(t.stats().checksum_failures, 1);
    // The object is gone; the listener still serves (a fresh connection is refused -3).
    let c = TcpClient::connect(l.local_addr(), client_cfg(None)).unwrap();
    assert_eq!(
        c.read(BASE, &mut out[..16]),
        Err(TransferError::Refused { status: -3 })
    );
}

/// `len` bytes of `pattern` at `skew` bytes past a block-aligned address (`skew` 0: aligned,
/// so the direct path takes them).
fn placed(len: usize, skew: usize, seed: u8) -> (super::io::AlignedBuf, usize) {
    let mut b = super::io::AlignedBuf::new(format::round_up((len + skew) as u64).unwrap() as usize);
    b.as_mut_slice()[skew..skew + len].copy_from_slice(&pattern(len, seed));
    (b, skew)
}

#[test]
fn disk_direct_and_bounce_paths_read_each_others_files() {
    // Sizes: one block, a partial block, whole pieces, a partial last block after many pieces.
    let sizes = [
        4096usize,
        13,
        4 << 20,
        (4 << 20) + 100,
        (1 << 20) + 4095,
        3 * (512 << 10) + 1,
    ];
    for uring in [true, false] {
        let d = TempDir::real(if uring {
            "direct-uring"
        } else {
            "direct-blocking"
        });
        let t = DiskTier::open(cfg(&d.0, uring), BASE).unwrap();
        assert!(t.direct_io(), "ext4 under target/ takes O_DIRECT");
        let mut addr = BASE;
        for (n, &len) in sizes.iter().enumerate() {
            for write_skew in [0usize, 64] {
                let (src, s) = placed(len, write_skew, n as u8);
                let data = &src.as_slice()[s..s + len];
                let before = t.stats();
                put(&t, addr, "k", data).unwrap();
                let after = t.stats();
                assert_eq!(
                    after.direct_writes - before.direct_writes,
                    u64::from(write_skew == 0)
                );
                for read_skew in [0usize, 64] {
                    let (mut dst, s) = placed(len, read_skew, 0xee);
                    let before = t.stats();
                    t.read(addr, Dst::from(&mut dst.as_mut_slice()[s..s + len]))
                        .unwrap();
                    let direct = t.stats().direct_reads - before.direct_reads;
                    assert_eq!(direct, u64::from(read_skew == 0), "size {len}");
                    assert!(
                        dst.as_slice()[s..s + len] == *data,
                        "size {len} uring {uring}"
                    );
                }
                // A part of the object takes the bounce path and checks the whole.
                if len > 100 {
                    assert_eq!(get(&t, addr + 50, len - 50).unwrap(), &data[50..]);
                }
                addr += format::round_up(len as u64).unwrap() + 4096;
            }
        }
    }
}

#[test]
fn disk_direct_read_finds_a_flipped_byte_in_any_piece() {
    let len = (4 << 20) + 100;
    let d = TempDir::real("direct-flip");
    let t = DiskTier::open(cfg(&d.0, true), BASE).unwrap();
    // In the header's key, in the third and the last whole piece, in the partial last block.
    for (n, at) in [
        70usize,
        4096 + (1 << 20) + 5,
        4096 + (4 << 20) - 1,
        4096 + (4 << 20) + 99,
    ]
    .into_iter()
    .enumerate()
    {
        let addr = BASE + n as u64 * (8 << 20);
        let (src, _) = placed(len, 0, 9);
        put(&t, addr, "key", &src.as_slice()[..len]).unwrap();
        let path = file_of(&t, addr);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let (mut dst, _) = placed(len, 0, 0);
        let r = t.read(addr, Dst::from(&mut dst.as_mut_slice()[..len]));
        assert!(
            matches!(r, Err(DiskError::Corrupt { .. })),
            "flip at {at}: {r:?}"
        );
        assert!(!path.exists(), "flip at {at}");
    }
    assert_eq!(t.stats().checksum_failures, 4);
    assert_eq!(t.stats().direct_reads, 4);
}

#[test]
fn disk_writes_run_at_background_priority_and_reads_come_back() {
    use super::config::WritePriority;
    use super::priority::{policy_now as policy, Background, Priority, Urgent};
    std::thread::spawn(|| {
        let root = running_as_root();
        let idle = if root {
            libc::SCHED_IDLE
        } else {
            libc::SCHED_OTHER
        };
        assert_eq!(policy(), libc::SCHED_OTHER);
        let urgent = Arc::new(Urgent::default());
        let mut p = Priority::probe(WritePriority::Idle, Arc::clone(&urgent));
        assert_eq!(
            policy(),
            libc::SCHED_OTHER,
            "the probe leaves the thread as it found it"
        );
        if root {
            assert_eq!(p.mode(), Background::Idle);
        }
        p.set_background(true);
        assert_eq!(policy(), idle);
        // A reader queues behind the write: it raises the worker from its own thread.
        let u = Arc::clone(&urgent);
        std::thread::spawn(move || u.arrive()).join().unwrap();
        assert_eq!(
            policy(),
            libc::SCHED_OTHER,
            "a waiting read raises the write"
        );
        p.set_background(true);
        assert_eq!(
            policy(),
            libc::SCHED_OTHER,
            "no background write while a read waits"
        );
        urgent.taken();
        p.set_background(true);
        assert_eq!(policy(), idle);
        p.set_background(false);
        assert_eq!(
            policy(),
            libc::SCHED_OTHER,
            "a read never runs at the writes' priority"
        );
    })
    .join()
    .unwrap();
}
