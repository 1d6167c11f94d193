//! Fuzzes the decoder of a disk-tier object file's header (`client::disk::format`): nothing
//! may panic; a header that decodes has a key of 1 ..= `KEY_MAX_BYTES` bytes and a size above
//! 0, and encoding it gives back exactly the header block it was decoded from (the format has
//! no two spellings of one header, so the scan at start never keeps a file it would write
//! differently).
#![no_main]

use client::disk::format::FileHeader;
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
});
