//! Tests of the same-host segments: offers, announcements, fences, mappings.

use std::os::fd::{FromRawFd, RawFd};

use super::*;
use crate::mem::{Dst, HugepagePolicy, Segment, SegmentKind, SegmentOptions};
use crate::recovery::{CatalogRecord, RecordKind};
use protocol::Version;

/// The encoded intent record of the put of `key` at `version` over `len` bytes.
fn intent(len: u64, key: &str, version: Version) -> Vec<u8> {
    CatalogRecord::intent(len, key, version).encode()
}

/// Offers `seg` as `endpoint` and maps it back: the export (held for the test), the
/// importer's mapping and the offer.
fn export_and_import(seg: &Segment, endpoint: &str) -> (ShmExport, ShmMapping, Offer) {
    let offer = Offer {
        base: seg.addr() as u64,
        len: seg.len() as u64,
        guards: Guards::None,
    };
    let fd = seg.shared_fd().expect("memfd-backed");
    let export = ShmExport::start(endpoint, fd, offer, None).unwrap();
    let m = ShmMapping::import(endpoint).unwrap().expect("same host");
    assert_eq!(m.offer(), offer);
    (export, m, offer)
}

/// A 1 MiB shared segment registered in a served memory with a catalog and exported as `test-<tag>-<pid>:1`: the
/// segment, its memory, the endpoint and the export (held for the test).
fn served_export(tag: &str) -> (Arc<Segment>, Arc<ServedMemory>, String, ShmExport) {
    let opts = SegmentOptions {
        hugepages: HugepagePolicy::Never,
        prefault: false,
    };
    let seg = Arc::new(Segment::new_shared(1 << 20, opts).unwrap());
    let memory = ServedMemory::new();
    memory.register_segment(seg.clone()).unwrap();
    let endpoint = format!("test-{tag}-{}:1", std::process::id());
    let export = export_segment(&endpoint, &seg, &memory).expect("exported");
    (seg, memory, endpoint, export)
}

#[test]
fn offers_round_trip_and_bad_ones_are_refused() {
    let o = Offer {
        base: 0x7f00_0000_0000,
        len: 1 << 30,
        guards: Guards::Commits,
    };
    assert_eq!(&o.encode()[4..8], &5u32.to_le_bytes());
    assert_eq!(Offer::decode(&o.encode()), Ok(o));
    let v4 = Offer {
        guards: Guards::Records,
        ..o
    };
    assert_eq!(&v4.encode()[4..8], &4u32.to_le_bytes());
    assert_eq!(Offer::decode(&v4.encode()), Ok(v4));
    assert!(v4.guards.records() && !v4.guards.commits() && o.guards.commits());
    let v3 = Offer {
        guards: Guards::IntentsAndPage,
        ..o
    };
    assert_eq!(&v3.encode()[4..8], &3u32.to_le_bytes());
    assert_eq!(Offer::decode(&v3.encode()), Ok(v3));
    let v2 = Offer {
        guards: Guards::Intents,
        ..o
    };
    assert_eq!(&v2.encode()[4..8], &2u32.to_le_bytes());
    assert_eq!(Offer::decode(&v2.encode()), Ok(v2));
    let v1 = Offer {
        guards: Guards::None,
        ..o
    };
    assert_eq!(&v1.encode()[4..8], &1u32.to_le_bytes());
    assert_eq!(Offer::decode(&v1.encode()), Ok(v1));
    let mut bad = o.encode();
    bad[0] ^= 1;
    assert!(Offer::decode(&bad).is_err());
    let mut bad = o.encode();
    bad[4] = 6;
    assert!(Offer::decode(&bad).is_err());
    assert!(Offer::decode(&o.encode()[..23]).is_err());
    let wraps = Offer {
        base: u64::MAX - 1,
        len: 4,
        guards: Guards::IntentsAndPage,
    };
    assert!(Offer::decode(&wraps.encode()).is_err());
    let empty = Offer {
        base: 1,
        len: 0,
        guards: Guards::IntentsAndPage,
    };
    assert!(Offer::decode(&empty.encode()).is_err());
}

#[test]
fn announcements_round_trip_and_bad_ones_are_refused() {
    let v = Version { term: 7, seq: 9 };
    let i = Announcement::intent(0x7f00_0000_1000, 4096, "k/1", v);
    let b = i.encode();
    assert_eq!(b.len(), 16 + 16 + 16 + 3);
    assert_eq!(Announcement::frame_len(&b[..16]), Ok(b.len()));
    assert_eq!(Announcement::decode(&b), Ok(i));
    // An object record is announced too; a tombstone is not.
    let object = CatalogRecord {
        kind: RecordKind::Object,
        soft_pin_ttl_ms: Some(5),
        ..i.record
    };
    let o = Announcement {
        record: object,
        ..i
    };
    assert_eq!(Announcement::decode(&o.encode()), Ok(o));
    let tomb = CatalogRecord {
        kind: RecordKind::Tombstone,
        ..i.record
    };
    let t = Announcement { record: tomb, ..i }.encode();
    assert!(Announcement::decode(&t).is_err());
    // A record without a version (a writer's from before versions) is not announced.
    let legacy = CatalogRecord {
        version: Version::ZERO,
        soft_pin_ttl_ms: None,
        ..object
    };
    let mut unversioned = Vec::new();
    let mut bare = legacy.encode();
    bare[8] &= !(crate::recovery::catalog::CATALOG_FLAG_VERSIONED as u8);
    bare.drain(16..32); // no version follows
    assert_eq!(CatalogRecord::decode(&bare), Ok(legacy), "a record as such");
    Announcement::frame(i.addr, &bare, &mut unversioned);
    assert!(Announcement::decode(&unversioned).is_err());
    // Magic, record length, the record's flags (unknown bits).
    for (at, bit) in [(0, 1), (4, 1), (24, 0x80)] {
        let mut bad = b.clone();
        bad[at] ^= bit;
        assert!(Announcement::decode(&bad).is_err(), "byte {at}");
    }
    assert!(Announcement::decode(&b[..b.len() - 1]).is_err());
    assert!(Announcement::frame_len(&b[..15]).is_err());
    let mut huge = b.clone();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Announcement::frame_len(&huge).is_err());
    let empty = Announcement::intent(1, 0, "k", v);
    assert!(Announcement::decode(&empty.encode()).is_err());
    let wraps = Announcement::intent(u64::MAX, 2, "k", v);
    assert!(Announcement::decode(&wraps.encode()).is_err());
}

/// An exporter serving a catalog reads its importers' intents: a snapshot right after an
/// announcement no longer lists the older entry of another key the write goes over, but
/// keeps the writer's own record (same version), its key's older entry in place (an
/// upsert) and entries elsewhere; an importer that announces and dies has its intent
/// applied too; bytes that are not intents close the importer.
#[test]
fn an_exporter_applies_its_importers_intents_before_a_snapshot() {
    let (seg, memory, endpoint, export) = served_export("intents");
    let base = seg.addr() as u64;
    let catalog = memory.catalog();
    let v = |term, seq| Version { term, seq };
    catalog.insert(base, 4096, "old", false, v(5, 1)).unwrap();
    catalog
        .insert(base + 8192, 4096, "far", false, v(5, 2))
        .unwrap();
    let keys = || -> Vec<String> { catalog.entries().into_iter().map(|e| e.key).collect() };

    let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
    assert!(m.offer().guards.intents());
    m.announce_write(base, &intent(4096, "new", v(6, 1)))
        .unwrap();
    assert_eq!(keys(), ["far"], "the snapshot applied the intent first");
    // The writer's own record, whenever the intent is applied, stays; so does an
    // upsert's old value in place.
    catalog.insert(base, 4096, "new", false, v(6, 1)).unwrap();
    m.announce_write(base, &intent(4096, "new", v(6, 1)))
        .unwrap();
    m.announce_write(base, &intent(4096, "new", v(6, 3)))
        .unwrap();
    assert_eq!(keys(), ["new", "far"]);

    // Announced, then the writer is gone: applied by the export thread at its close.
    let dying = ShmMapping::import(&endpoint).unwrap().expect("same host");
    let long_key = "k".repeat(3000); // intents longer than a gathering read's chunk
    dying
        .announce_write(base + 8192, &intent(100, &long_key, v(6, 2)))
        .unwrap();
    drop(dying);
    let t0 = std::time::Instant::now();
    while catalog.len() != 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", keys());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(keys(), ["new"]);

    // Garbage: the exporter closes that importer, which then sees it gone. Bytes on the
    // socket are wake-ups and carry nothing; bytes in the ring that are not an
    // announcement must not decode.
    let rogue = ShmMapping::import(&endpoint).unwrap().expect("same host");
    let junk = [0xffu8; ANNOUNCEMENT_HEADER_BYTES];
    // SAFETY: `junk` is readable for its length.
    let sent = unsafe { libc::send(rogue.conn.as_raw_fd(), junk.as_ptr().cast(), junk.len(), 0) };
    assert_eq!(sent, ANNOUNCEMENT_HEADER_BYTES as isize);
    std::thread::sleep(Duration::from_millis(50));
    assert!(rogue.exporter_alive(), "wake-ups are not announcements");
    assert!(rogue.ring.as_ref().expect("offer version 4").push(&junk));
    let t0 = std::time::Instant::now();
    while rogue.exporter_alive() {
        assert!(t0.elapsed() < Duration::from_secs(5), "rogue importer kept");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(m.exporter_alive(), "the others stay");
    assert_eq!(keys(), ["new"]);
    drop(export);
}

/// Publishes `key`'s object record for `[addr, addr + 4096)` at `version` in `m`'s ring, as
/// a writer does once its bytes are in.
fn send_record(m: &ShmMapping, addr: u64, key: &str, version: Version) {
    let rec = CatalogRecord {
        len: 4096,
        hard_pin: false,
        key,
        version,
        kind: RecordKind::Object,
        soft_pin_ttl_ms: None,
    };
    m.send_records(&[(addr, &rec.encode())]).unwrap();
}

/// An object record published in the ring is in the catalog before anything that reaches it
/// later another way: a tombstone of its key (the remove its commit made possible), another
/// record over its range, a fence raise (it was published under the old term) and a
/// snapshot. Without the catalog reading it first, each of these would come before it here:
/// the export thread reads the ring only every few milliseconds.
#[test]
fn records_in_the_ring_come_before_what_reaches_the_catalog_later() {
    let (seg, memory, endpoint, export) = served_export("records");
    let base = seg.addr() as u64;
    let catalog = memory.catalog();
    let v = |term, seq| Version { term, seq };
    let keys = || -> Vec<String> { catalog.entries().into_iter().map(|e| e.key).collect() };
    let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
    assert!(m.takes_records() && m.takes_commits() && m.offer().guards.page());

    // A removal's tombstone after the record: the key is gone, and stays gone.
    send_record(&m, base, "removed", v(1, 1));
    catalog.bury(base, 4096, "removed", v(1, 2)).unwrap();
    assert_eq!(keys(), Vec::<String>::new());

    // A newer put into the range, recorded over TCP after ours: the newer one stays.
    send_record(&m, base + 4096, "evicted", v(1, 3));
    let newer = CatalogRecord {
        len: 4096,
        hard_pin: false,
        key: "newer",
        version: v(1, 4),
        kind: RecordKind::Object,
        soft_pin_ttl_ms: None,
    };
    memory.catalog_put(base + 4096, &newer.encode()).unwrap();
    assert_eq!(keys(), ["newer"]);

    // The range handed out again to a TCP writer whose intent comes after our record, and
    // who dies before its own: our key is gone, not listed over its bytes.
    send_record(&m, base + 20480, "freed", v(1, 7));
    let intent = CatalogRecord::intent(4096, "overwriter", v(1, 8)).encode();
    memory.catalog_put(base + 20480, &intent).unwrap();
    assert_eq!(keys(), ["newer"]);

    // Sent under term 1, then the owner hears of term 2: kept. Sent after: refused.
    send_record(&m, base + 8192, "acknowledged", v(1, 5));
    catalog.fence(2);
    send_record(&m, base + 12288, "late", v(1, 6));
    assert_eq!(keys(), ["newer", "acknowledged"]);

    // Ours, a record of a range outside the segment: refused, the importer kept.
    send_record(&m, base + (1 << 20), "outside", v(2, 1));
    send_record(&m, base + 16384, "last", v(2, 2));
    assert_eq!(keys(), ["newer", "acknowledged", "last"]);
    assert!(m.exporter_alive());
    drop(export);
}

/// A put committed in one round trip: its provisional record and, once the master answered,
/// its commit, both in the ring. The provisional entry is not listed; the commit makes it the
/// object. A commit that comes after a removal or a later put's intent reached the catalog
/// another way finds nothing: the late commit never names bytes that are not its own.
#[test]
fn provisional_records_and_their_commits_travel_the_ring_in_order() {
    let (seg, memory, endpoint, export) = served_export("commits");
    let base = seg.addr() as u64;
    let catalog = memory.catalog();
    let v = |term, seq| Version { term, seq };
    let keys = || -> Vec<String> { catalog.entries().into_iter().map(|e| e.key).collect() };
    let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
    assert!(m.takes_commits());
    let send = |addr: u64, key: &str, kind: RecordKind, version: Version| {
        let rec = CatalogRecord {
            len: 4096,
            hard_pin: false,
            key,
            version,
            kind,
            soft_pin_ttl_ms: None,
        };
        m.send_records(&[(addr, &rec.encode())]).unwrap();
    };
    send(base, "k", RecordKind::Provisional, v(1, 1));
    assert_eq!(
        keys(),
        Vec::<String>::new(),
        "not an object before its commit"
    );
    send(base, "k", RecordKind::Commit(v(1, 1)), v(1, 5));
    assert_eq!(keys(), ["k"]);
    assert_eq!(catalog.entries()[0].version, v(1, 5));
    // Removed over TCP before the commit arrived: the commit finds nothing.
    send(base + 4096, "gone", RecordKind::Provisional, v(1, 2));
    catalog.bury(base + 4096, 4096, "gone", v(1, 6)).unwrap();
    send(base + 4096, "gone", RecordKind::Commit(v(1, 2)), v(1, 6));
    // A later put's intent over the range came first, its writer died: nothing over its bytes.
    send(base + 8192, "late", RecordKind::Provisional, v(1, 3));
    let intent = CatalogRecord::intent(4096, "overwriter", v(1, 8)).encode();
    memory.catalog_put(base + 8192, &intent).unwrap();
    send(base + 8192, "late", RecordKind::Commit(v(1, 3)), v(1, 7));
    assert_eq!(keys(), ["k"]);
    assert!(m.exporter_alive(), "the importer is kept");
    drop(export);
}

/// A batch whose records need the ring twice over: the writer wakes the exporter and waits
/// for room, and every record arrives, in order.
#[test]
fn records_beyond_the_rings_room_wait_for_the_exporter() {
    let (seg, memory, endpoint, export) = served_export("full");
    let base = seg.addr() as u64;
    let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
    let n = 10_000u64;
    let keys: Vec<String> = (0..n).map(|i| format!("batch/{i:05}")).collect();
    let records: Vec<Vec<u8>> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            CatalogRecord {
                len: 64,
                hard_pin: false,
                key,
                version: Version {
                    term: 1,
                    seq: i as u64 + 1,
                },
                kind: RecordKind::Object,
                soft_pin_ttl_ms: None,
            }
            .encode()
        })
        .collect();
    let framed: u64 = records
        .iter()
        .map(|r| (ANNOUNCEMENT_HEADER_BYTES + r.len()) as u64)
        .sum();
    assert!(
        framed > 2 * crate::limits::SHM_RING_BYTES as u64,
        "{framed}"
    );
    let batch: Vec<(u64, &[u8])> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (base + i as u64 * 64, &r[..]))
        .collect();
    m.send_records(&batch).unwrap();
    let got: Vec<String> = memory
        .catalog()
        .entries()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(got, keys);
    drop(export);
}

#[test]
fn an_importers_copies_are_fenced_by_the_exporters_term() {
    let (seg, memory, endpoint, export) = served_export("fenced");
    let base = seg.addr() as u64;
    let catalog = memory.catalog();
    let fence = catalog.fences();
    let v = |term, seq| Version { term, seq };
    catalog.fence(5);

    let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
    assert!(m.offer().guards.page());
    assert_eq!(fence.watched(), 1);
    assert!(
        matches!(
            m.begin_write(base, 4, &intent(4096, "late", v(4, 1))),
            Err(WriteRefused::Fenced { fence: 5 })
        ),
        "the term fenced before the importer came is on its page"
    );
    assert_eq!(catalog.len(), 0, "a refused copy sends no intent");
    let under_way = m
        .begin_write(base, 5, &intent(4096, "slow", v(5, 1)))
        .unwrap();

    // A new master (term 6): the fence refuses new copies of term 5 at once, and the
    // owner's wait before its re-mount lasts until the copy under way lets go.
    catalog.fence(6);
    assert!(matches!(
        m.begin_write(base + 4096, 5, &intent(4096, "slow2", v(5, 2))),
        Err(WriteRefused::Fenced { fence: 6 })
    ));
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            drop(under_way);
        });
        assert_eq!(
            fence.wait_for_writes(
                std::time::Instant::now() + crate::recovery::inflight::STALE_WRITES_WAIT
            ),
            (1, 0)
        );
    });
    assert!(
        t0.elapsed() >= Duration::from_millis(90),
        "it waited for the copy"
    );
    assert!(m
        .begin_write(base, 6, &intent(4096, "now", v(6, 1)))
        .is_ok());

    // An importer gone, its copy ended: the fence forgets its page.
    drop(m);
    let t0 = std::time::Instant::now();
    loop {
        let next = ShmMapping::import(&endpoint).unwrap().expect("same host");
        if fence.watched() == 1 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{}", fence.watched());
        drop(next);
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(export);
}

#[test]
fn an_importer_sees_the_exporters_bytes_and_its_departure() {
    let opts = SegmentOptions {
        hugepages: HugepagePolicy::Never,
        prefault: false,
    };
    let seg = Segment::new_shared(1 << 20, opts).unwrap();
    let endpoint = format!("test-{}:1", std::process::id());
    // SAFETY: inside our own segment; nobody else writes it in this test.
    unsafe { seg.as_ptr().add(4096).write_bytes(0xab, 100) };
    let (export, m, offer) = export_and_import(&seg, &endpoint);
    assert!(!m.hugetlb());
    // The page the exporter wrote is resident in our mapping before we touch it (the
    // memfd's page cache); one nobody wrote is not (`paths::copy::write_parts` relies on
    // both).
    let page = |at: u64| {
        // SAFETY: inside the mapping (translate checks), no reference formed over it.
        unsafe { crate::mem::Dst::from_raw(m.translate(offer.base + at, 4096).unwrap(), 4096) }
    };
    assert!(page(4096).resident());
    assert!(!page(16 * 4096).resident());
    let p = m.translate(offer.base + 4096, 100).unwrap();
    // SAFETY: translate checked the range lies in our mapping.
    let got = unsafe { std::slice::from_raw_parts(p, 100) };
    assert!(got.iter().all(|&b| b == 0xab));
    assert!(m.translate(offer.base + offer.len - 1, 2).is_none());
    assert!(m.translate(offer.base - 1, 1).is_none());
    assert!(m.exporter_alive());
    drop(export);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!m.exporter_alive(), "the importer sees the exporter go");
    assert!(
        ShmMapping::import(&endpoint).unwrap().is_none(),
        "nothing exported any more"
    );
    assert!(ShmMapping::import("no-such-endpoint:9").unwrap().is_none());
}

#[test]
fn mapping_ahead_maps_an_exporters_pages_sixteen_at_a_time() {
    fn minor_faults() -> i64 {
        // SAFETY: getrusage into a zeroed struct of our own.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_THREAD counts this thread only.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt
    }
    const LEN: usize = 4 << 20;
    let opts = SegmentOptions {
        hugepages: HugepagePolicy::Never,
        prefault: true,
    };
    let seg = Segment::new_shared(LEN, opts).unwrap();
    let endpoint = format!("test-ahead-{}:1", std::process::id());
    let (_export, m, offer) = export_and_import(&seg, &endpoint);
    // SAFETY: inside the mapping (translate checks), no reference formed over it.
    let mut d =
        unsafe { crate::mem::Dst::from_raw(m.translate(offer.base, LEN as u64).unwrap(), LEN) };
    assert!(d.resident(), "the exporter prefaulted every page");
    let data = vec![5u8; LEN]; // faulted in here, not counted below
    let f0 = minor_faults();
    d.map_ahead();
    let f1 = minor_faults();
    let ahead = f1 - f0;
    // The windows the range touches: one more than LEN / 64 KiB when the mapping does not
    // start on a window boundary (mmap aligns it to a page only).
    let w = crate::sys::bytes::FAULT_AROUND_BYTES as u64;
    let start = d.addr();
    let windows = ((start + LEN as u64 - 1) / w - start / w + 1) as i64;
    assert!(
        ahead <= windows,
        "{ahead} faults mapping {windows} windows ahead"
    );
    // Writing every page now takes (almost) no fault: the pages were mapped writable.
    // Unmapped, each of the 1 024 pages would take a write fault (write faults on a shared
    // mapping get no fault-around). A few stray ones come when the machine is busy (seen
    // 16 under a loaded CI run, on the code before and after intents alike), so the bound
    // is an eighth of the pages: far from what the pages would take unmapped.
    crate::mem::Src::from(&data[..]).stream_to(&mut d);
    let after = minor_faults() - f1;
    let pages = (LEN / crate::mem::segment::base_page_bytes()) as i64;
    assert!(
        after < pages / 8,
        "{after} faults writing the {pages} pages mapped ahead"
    );
    // SAFETY: inside our own segment; the importer's writes above are complete.
    let seen = unsafe { std::slice::from_raw_parts(seg.as_ptr(), LEN) };
    assert!(seen.iter().all(|&b| b == 5));
}

#[test]
fn an_importer_knows_a_hugetlb_segment() {
    let opts = SegmentOptions {
        hugepages: HugepagePolicy::Prefer,
        prefault: true,
    };
    let seg = Segment::new_shared(4 << 20, opts).unwrap();
    if seg.kind() != SegmentKind::HugeTlb {
        eprintln!("no free hugetlb pages (vm.nr_hugepages): only the plain case checked");
        return;
    }
    let endpoint = format!("test-huge-{}:1", std::process::id());
    let (_export, m, offer) = export_and_import(&seg, &endpoint);
    assert!(m.hugetlb());
    // Prefaulted by the exporter, yet not resident here until we touch it.
    // SAFETY: inside the mapping (translate checks), no reference formed over it.
    let d = unsafe { crate::mem::Dst::from_raw(m.translate(offer.base, 4096).unwrap(), 4096) };
    assert!(!d.resident());
}

/// A memfd of `len` bytes, sealed at its size as a segment's is, or not sealed at all.
fn memfd(len: usize, sealed: bool) -> OwnedFd {
    if sealed {
        return crate::sys::mmap::sized_memfd(c"mc-test", len, false).unwrap();
    }
    // SAFETY: a valid NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(c"mc-test-unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0, "{}", io::Error::last_os_error());
    // SAFETY: a descriptor just returned to us.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: our own descriptor.
    let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
    assert_eq!(rc, 0);
    fd
}

/// Binds `endpoint`'s name and serves one importer as an exporter would, but with the
/// descriptors given: `offer` with `segment` attached, then (with `page`) the write page
/// message with `page` attached; then holds the connection until the importer closes it.
fn raw_exporter(
    endpoint: &str,
    offer: Offer,
    segment: OwnedFd,
    page: Option<OwnedFd>,
) -> JoinHandle<()> {
    let addr = SocketAddr::from_abstract_name(socket_name(endpoint).as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        // Errors are the importer's to see: it may close before the page goes.
        let _ = send_with_fd(&conn, &offer.encode(), segment.as_raw_fd());
        if let Some(page) = page {
            let _ = send_with_fd(&conn, &page_message(), page.as_raw_fd());
        }
        let mut byte = [0u8; 1];
        let _ = rawio::recv(conn.as_raw_fd(), &mut Dst::from(&mut byte[..]), 0);
    })
}

/// An exporter will not offer a memfd its holders could shrink, and an importer maps
/// neither a segment memfd nor a write page that lacks the seals; with both sealed the
/// same exporter is mapped.
#[test]
fn memfds_without_size_seals_are_neither_offered_nor_mapped() {
    let endpoint = format!("test-unsealed-{}:1", std::process::id());
    let offer = Offer {
        base: 1 << 30,
        len: 1 << 20,
        guards: Guards::None,
    };
    let unsealed = memfd(1 << 20, false);
    let e = ShmExport::start(&endpoint, unsealed.as_fd(), offer, None)
        .err()
        .expect("an unsealed memfd was offered");
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");

    let refused = exporters_refused();
    let t = raw_exporter(&endpoint, offer, unsealed, None);
    let e = ShmMapping::import(&endpoint).expect_err("an unsealed segment was mapped");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("not sealed"), "{e}");
    t.join().unwrap();

    let paged = Offer {
        guards: Guards::IntentsAndPage,
        ..offer
    };
    let page = memfd(WRITE_PAGE_BYTES, false);
    let t = raw_exporter(&endpoint, paged, memfd(1 << 20, true), Some(page));
    let e = ShmMapping::import(&endpoint).expect_err("an unsealed write page was mapped");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("write page"), "{e}");
    t.join().unwrap();
    assert!(exporters_refused() >= refused + 2);

    let page = memfd(WRITE_PAGE_BYTES, true);
    let t = raw_exporter(&endpoint, paged, memfd(1 << 20, true), Some(page));
    let m = ShmMapping::import(&endpoint)
        .unwrap()
        .expect("sealed: mapped");
    assert_eq!(m.offer(), paged);
    drop(m);
    t.join().unwrap();
}

/// Nobody holding an exported segment's memfd or a write page, its exporter included,
/// can shrink or grow it, nor add a seal.
#[test]
fn an_exported_memfd_cannot_be_resized() {
    let (seg, _memory, endpoint, _export) = served_export("sealed");
    let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
    let (_page, page_fd) = WritePage::shared().unwrap();
    let fds = [seg.shared_fd().expect("memfd-backed"), page_fd.as_fd()];
    for fd in fds {
        let len = crate::sys::mmap::fstat(fd).unwrap().st_size;
        for size in [0, len / 2, len + 1, 2 * len] {
            // SAFETY: ftruncate on a descriptor we hold; refused, as asserted.
            let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), size) };
            let e = io::Error::last_os_error();
            assert_eq!((rc, e.raw_os_error()), (-1, Some(libc::EPERM)), "to {size}");
        }
        // A future-write seal would stop the next importer from mapping it writable (a
        // write seal fails anyway while a writable mapping exists).
        // SAFETY: fcntl on a descriptor we hold; refused, as asserted.
        let rc =
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE) };
        let e = io::Error::last_os_error();
        assert_eq!(
            (rc, e.raw_os_error()),
            (-1, Some(libc::EPERM)),
            "a seal added"
        );
    }
    assert!(m.exporter_alive());
}

/// A process of another user (uid and gid 65534) listening on an endpoint's name, as a
/// local user who bound a node's name first would, offering a sealed memfd named
/// `mc-stranger` to the importer that connects. Killed and reaped on drop.
struct Stranger(libc::pid_t);

const NOBODY: libc::uid_t = 65534;

impl Stranger {
    /// Forks the stranger and waits until it listens.
    fn start(endpoint: &str) -> Stranger {
        let name = socket_name(endpoint);
        // SAFETY: sockaddr_un is plain data; all-zero is valid.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        assert!(name.len() < addr.sun_path.len());
        for (d, b) in addr.sun_path[1..].iter_mut().zip(name.bytes()) {
            *d = b as libc::c_char;
        }
        let addr_len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
        let offer = Offer {
            base: 1 << 30,
            len: 1 << 20,
            guards: Guards::None,
        }
        .encode();
        let mut ready = [-1 as RawFd; 2];
        // SAFETY: `ready` has room for the two descriptors.
        let rc = unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0);
        // SAFETY: the child runs `stranger_child` only, which makes system calls only.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: we are the child just forked; the arguments were made before.
            unsafe { stranger_child(ready[1], &addr, addr_len as libc::socklen_t, &offer) }
        }
        let stranger = Stranger(pid); // reaped even if the checks below fail
        let mut byte = 0u8;
        // SAFETY: our pipe's ends; one writable byte.
        let n = unsafe {
            libc::close(ready[1]);
            let n = libc::read(ready[0], (&mut byte as *mut u8).cast(), 1);
            libc::close(ready[0]);
            n
        };
        assert_eq!(n, 1, "the stranger did not get to listen");
        stranger
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let mut status = 0;
        // SAFETY: our own child; reaping it.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, &mut status, 0);
        }
    }
}

/// The stranger's life: become `NOBODY`, listen on `addr`, say so on `ready`, offer a
/// sealed memfd to the first importer and wait for it to close. Exits with a status
/// naming the step that failed; killed after 10 s at the latest.
///
/// # Safety
///
/// Only in a child just forked from this (multi-threaded) test process: it makes system
/// calls only, no allocation and no lock, since the fork copied the other threads' locks
/// in whatever state they were.
unsafe fn stranger_child(
    ready: RawFd,
    addr: &libc::sockaddr_un,
    addr_len: libc::socklen_t,
    offer: &[u8; OFFER_BYTES],
) -> ! {
    // SAFETY: system calls on our own descriptors and buffers (see the function's doc).
    unsafe {
        libc::alarm(10);
        // Keep only stdio and `ready` (as 3): the other tests' descriptors stay theirs.
        if libc::dup2(ready, 3) != 3 {
            libc::_exit(2);
        }
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setgid, NOBODY) != 0
            || libc::syscall(libc::SYS_setuid, NOBODY) != 0
        {
            libc::_exit(3);
        }
        let sock = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        let sa = (addr as *const libc::sockaddr_un).cast::<libc::sockaddr>();
        if sock < 0 || libc::bind(sock, sa, addr_len) != 0 || libc::listen(sock, 4) != 0 {
            libc::_exit(4);
        }
        let memfd = libc::memfd_create(c"mc-stranger".as_ptr(), libc::MFD_ALLOW_SEALING);
        if memfd < 0
            || libc::ftruncate(memfd, 1 << 20) != 0
            || libc::fcntl(memfd, libc::F_ADD_SEALS, crate::sys::mmap::SIZE_SEALS) != 0
        {
            libc::_exit(5);
        }
        if libc::write(3, b"r".as_ptr().cast(), 1) != 1 {
            libc::_exit(6);
        }
        let conn = libc::accept(sock, std::ptr::null_mut(), std::ptr::null_mut());
        if conn < 0 {
            libc::_exit(7);
        }
        let conn = UnixStream::from_raw_fd(conn);
        let _ = send_with_fd(&conn, offer, memfd);
        let mut byte = 0u8;
        libc::read(conn.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
        libc::_exit(0)
    }
}

/// Another user's process that took a node's name first is refused before a byte of its
/// offer is read: the import fails naming its uid, is counted, and its memfd is never
/// mapped. (The seals are in order: only the uid is wrong.)
#[test]
fn an_exporter_of_another_user_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no process of another user to start; not checked");
        return;
    }
    let endpoint = format!("test-stranger-{}:1", std::process::id());
    let stranger = Stranger::start(&endpoint);
    let refused = exporters_refused();
    let e = ShmMapping::import(&endpoint).expect_err("another user's memfd was mapped");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("uid 65534"), "{e}");
    assert!(exporters_refused() > refused);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        !maps.contains("mc-stranger"),
        "the stranger's memfd is mapped"
    );
    drop(stranger);
}

#[test]
fn a_frame_pushed_in_parts_reads_back_whole_across_the_wrap() {
    use crate::limits::SHM_RING_BYTES;
    let (writer, fd) = Ring::shared().unwrap();
    let mut reader = Ring::map(&fd).unwrap();
    let mut out = Vec::new();
    // Frames of a third of the ring and a bit: the third and fifth cross its end.
    for round in 0..5u8 {
        let header = [round; 16];
        let body = vec![round ^ 0xff; SHM_RING_BYTES / 3];
        assert!(writer.push_parts(&[&header, &body]));
        out.clear();
        reader.read_into(&mut out).unwrap();
        assert_eq!(out, [&header[..], &body].concat(), "round {round}");
    }
    // A frame with no room is refused whole: nothing of it is published.
    let big = vec![7u8; SHM_RING_BYTES];
    assert!(!writer.push_parts(&[&big, &[1]]));
    out.clear();
    reader.read_into(&mut out).unwrap();
    assert!(out.is_empty());
}
