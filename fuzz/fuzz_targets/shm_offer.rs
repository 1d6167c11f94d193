//! Fuzzes the same-host segment decoders (`dataplane::mem::shm`): the 24-byte offer an
//! importer receives with a memfd, and the announcement (a fixed part and a catalog record:
//! a write's intent or an object's record) an exporter reads from an importer. Nothing may
//! panic; an offer that decodes has a non-empty range that does not wrap, an announcement
//! too and is never a tombstone, and each re-encodes to exactly the bytes it came from.
#![no_main]

use dataplane::mem::shm::{Announcement, Offer, OFFER_BYTES};
use dataplane::recovery::RecordKind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(o) = Offer::decode(data) {
        assert!(o.len > 0 && o.base.checked_add(o.len).is_some(), "{o:?}");
        assert_eq!(data.len(), OFFER_BYTES);
        assert_eq!(&o.encode()[..], data, "not canonical");
    }
    if let Ok(a) = Announcement::decode(data) {
        let r = a.record;
        assert!(r.len > 0 && a.addr.checked_add(r.len).is_some(), "{a:?}");
        assert_ne!(r.kind, RecordKind::Tombstone, "{a:?}");
        assert_eq!(Announcement::frame_len(data), Ok(data.len()));
        assert_eq!(&a.encode()[..], data, "not canonical");
    }
});
