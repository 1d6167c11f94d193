//! Fuzzes the decoder of a disk-tier object file's header (`client::disk::format`): nothing
//! may panic; a header that decodes has a key of 1 ..= `KEY_MAX_BYTES` bytes and a size above
//! 0, and encoding it gives back exactly the header block it was decoded from (the format has
//! no two spellings of one header, so the scan at start never keeps a file it would write
//! differently). The same bytes also go to the decoder of the directory offer a same-host
//! reader receives from a disk owner (`client::disk::share`): one that decodes has a worker
//! count in range and re-encodes to exactly its bytes.
#![no_main]

use client::disk::format::FileHeader;
use client::disk::share::DirOffer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = FileHeader::needed(data);
    if let Ok(h) = FileHeader::decode(data) {
        assert!(!h.key.is_empty() && h.key.len() <= protocol::limits::KEY_MAX_BYTES);
        assert!(h.size > 0);
        let block = h.encode();
        assert_eq!(block.len() as u64, h.header_len());
        assert_eq!(&data[..block.len()], &block[..], "round trip");
        assert!(h.file_len() > h.header_len());
    }
    if let Ok(o) = DirOffer::decode(data) {
        assert!(o.workers > 0 && o.workers as usize <= client::disk::limits::DISK_WORKERS_MAX);
        assert_eq!(&o.encode()[..], data, "not canonical");
    }
});
