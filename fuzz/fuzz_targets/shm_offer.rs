//! Fuzzes the same-host segment decoders (`dataplane::mem::shm`): the 24-byte offer an
//! importer receives with a memfd, and the write intent (a fixed part and a catalog record)
//! an exporter reads from an importer. Nothing may panic; an offer that decodes has a
//! non-empty range that does not wrap, an intent too, and each re-encodes to exactly the
//! bytes it came from.
#![no_main]

use dataplane::mem::shm::{Intent, Offer, OFFER_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(o) = Offer::decode(data) {
        assert!(o.len > 0 && o.base.checked_add(o.len).is_some(), "{o:?}");
        assert_eq!(data.len(), OFFER_BYTES);
        assert_eq!(&o.encode()[..], data, "not canonical");
    }
    if let Ok(i) = Intent::decode(data) {
        assert!(i.len > 0 && i.addr.checked_add(i.len).is_some(), "{i:?}");
        assert_eq!(Intent::frame_len(data), Ok(data.len()));
        assert_eq!(&i.encode()[..], data, "not canonical");
    }
});
