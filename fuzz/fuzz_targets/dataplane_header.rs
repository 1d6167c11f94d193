//! Fuzzes the one-sided TCP data plane's header decoders
//! (`dataplane::transport::header`), both directions, as a server and a client meet them on a
//! stream: a run of back-to-back headers. Nothing may panic; a header that decodes obeys the
//! documented bounds (`len <= REQUEST_PAYLOAD_MAX_BYTES`, tighter per opcode) and re-encodes to exactly the bytes it
//! came from (both codecs are canonical: version and flags are fixed, every other field is
//! carried as is); `salvage_request_id` agrees with a successful decode.
#![no_main]

use dataplane::limits::REQUEST_PAYLOAD_MAX_BYTES;
use dataplane::transport::header::{
    RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES, REQUEST_MAGIC, RESPONSE_HEADER_BYTES,
};
use libfuzzer_sys::fuzz_target;

fn check_request(b: &[u8]) {
    let salvaged = RequestHeader::salvage_request_id(b);
    match RequestHeader::decode(b) {
        Ok(h) => {
            assert!(
                h.len <= h.opcode.len_max(),
                "{h:?} exceeds its opcode's bound"
            );
            assert!(
                h.len <= REQUEST_PAYLOAD_MAX_BYTES,
                "{h:?} exceeds the bound"
            );
            assert_eq!(&h.encode()[..], &b[..REQUEST_HEADER_BYTES], "not canonical");
            assert_eq!(salvaged, Some(h.request_id));
        }
        Err(_) => {
            let magic = b.len() >= REQUEST_HEADER_BYTES && b[..4] == REQUEST_MAGIC.to_le_bytes();
            assert_eq!(
                salvaged.is_some(),
                magic,
                "salvage disagrees with the magic"
            );
        }
    }
}

fn check_response(b: &[u8]) {
    if let Ok(h) = ResponseHeader::decode(b) {
        assert!(
            h.len <= REQUEST_PAYLOAD_MAX_BYTES,
            "{h:?} exceeds the bound"
        );
        assert_eq!(
            &h.encode()[..],
            &b[..RESPONSE_HEADER_BYTES],
            "not canonical"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    // Every offset, so that a header straddling any alignment is seen.
    for at in 0..data.len().min(64) {
        check_request(&data[at..]);
        check_response(&data[at..]);
    }
    // Back to back, the way a connection carries them.
    for chunk in data.chunks(REQUEST_HEADER_BYTES) {
        check_request(chunk);
    }
    for chunk in data.chunks(RESPONSE_HEADER_BYTES) {
        check_response(chunk);
    }
});
