//! The directory share between an owner and a same-host reader, both in this test process
//! (the abstract socket and `SCM_RIGHTS` work within one process as between two): the reader
//! reads exactly what the owner's tier holds, and everything else is an error that sends the
//! real caller to the listener.

use std::path::PathBuf;

use dataplane::mem::{Dst, Src};
use protocol::Version;

use super::io::AlignedBuf;
use super::share::{DirOffer, DirShare, SharedDir, DIR_OFFER_BYTES};
use super::tests::pattern;
use super::{DiskConfig, DiskTier, Pins};

const BASE: u64 = 1 << 60;

fn v(seq: u64) -> Version {
    Version { term: 3, seq }
}

/// A tier in a fresh directory on the build's real filesystem, shared under a unique name.
fn shared_tier(tag: &str) -> (PathBuf, std::sync::Arc<DiskTier>, DirShare, String) {
    let under = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/disk-tests");
    let dir = under.join(format!("mc-share-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = DiskConfig::new(&dir);
    cfg.size_limit_bytes = 1 << 30;
    cfg.workers = 3;
    let t = DiskTier::open(cfg, BASE).unwrap();
    let endpoint = format!("share-test-{tag}-{}:1", std::process::id());
    let share = DirShare::start(&endpoint, t.dir(), t.share_offer()).unwrap();
    (dir, t, share, endpoint)
}

#[test]
fn a_same_host_reader_reads_what_the_owner_holds_and_nothing_else() {
    let (dir, t, share, endpoint) = shared_tier("reads");
    let reader = SharedDir::import(&endpoint).unwrap().expect("shared");
    assert!(reader.owner_alive());
    // Two objects on different workers: a 3-block one with a partial last block, and one
    // a block exactly.
    let (a, b) = (BASE, BASE + (1 << 20));
    let data_a = pattern(3 * 4096 + 100, 1);
    let data_b = pattern(4096, 2);
    t.write(a, "key-a", v(7), Pins::default(), Src::from(&data_a[..]))
        .unwrap();
    t.write(b, "key-b", v(8), Pins::default(), Src::from(&data_b[..]))
        .unwrap();

    // Whole object into aligned memory: in place.
    let mut aligned = AlignedBuf::new(4 * 4096);
    let whole = &mut aligned.as_mut_slice()[..data_a.len()];
    reader
        .read(a, v(7), data_a.len() as u64, 0, Dst::from(&mut *whole))
        .unwrap();
    assert_eq!(&whole[..], &data_a[..]);
    // A range into unaligned memory: through the reader's own buffer.
    let mut out = vec![0u8; 5000];
    reader
        .read(a, v(7), data_a.len() as u64, 1000, Dst::from(&mut out[1..]))
        .unwrap();
    assert_eq!(&out[1..], &data_a[1000..5999]);
    let mut out = vec![0u8; 4096];
    reader
        .read(b, v(8), 4096, 0, Dst::from(&mut out[..]))
        .unwrap();
    assert_eq!(out, data_b);

    // Another version, another size, another address: errors, not bytes.
    let mut out = vec![0u8; data_a.len()];
    let size = data_a.len() as u64;
    let e = reader
        .read(a, v(6), size, 0, Dst::from(&mut out[..]))
        .unwrap_err();
    assert!(e.contains("header names"), "{e}");
    let e = reader
        .read(
            a,
            v(7),
            size - 1,
            0,
            Dst::from(&mut out[..size as usize - 1]),
        )
        .unwrap_err();
    assert!(e.contains("header names"), "{e}");
    let e = reader
        .read(BASE + (2 << 20), v(7), size, 0, Dst::from(&mut out[..]))
        .unwrap_err();
    assert!(e.contains("opening"), "{e}");

    // A flipped data byte fails the crc; the owner's own read finds it too.
    let path = t.shared.path_of(a);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096 + 2000] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let e = reader
        .read(a, v(7), size, 0, Dst::from(&mut out[..]))
        .unwrap_err();
    assert!(e.contains("checksum"), "{e}");
    assert_eq!(share.refused(), 0);

    // The owner gone: the reader sees it.
    drop(share);
    drop(t);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while reader.owner_alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!reader.owner_alive());
    assert!(
        SharedDir::import(&endpoint).unwrap().is_none(),
        "nobody shares it now"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_directory_offer_decodes_only_from_its_own_bytes() {
    let o = DirOffer {
        workers: 4,
        direct: true,
    };
    let b = o.encode();
    assert_eq!(b.len(), DIR_OFFER_BYTES);
    assert_eq!(DirOffer::decode(&b), Ok(o));
    assert!(DirOffer::decode(&b[..15]).is_err());
    let mut bad = b;
    bad[0] = b'X';
    assert!(DirOffer::decode(&bad).is_err(), "magic");
    let mut bad = b;
    bad[4] = 2;
    assert!(DirOffer::decode(&bad).is_err(), "version");
    for workers in [0u32, 65, u32::MAX] {
        let mut bad = b;
        bad[8..12].copy_from_slice(&workers.to_le_bytes());
        assert!(DirOffer::decode(&bad).is_err(), "{workers} workers");
    }
    let mut bad = b;
    bad[12] = 3;
    assert!(DirOffer::decode(&bad).is_err(), "unknown flags");
}
