//! Fuzzes the dummy-client wire (`client::dummy::wire`): the standalone client decodes every
//! request a dummy sends, the dummy every response. Nothing may panic; a message that decodes
//! re-encodes to exactly the bytes it came from; the frame reader never accepts more than its
//! limit.
#![no_main]

use client::dummy::wire::{read_frame, Request, Response};
use client::limits::FRAME_MAX_BYTES;
use libfuzzer_sys::fuzz_target;
use protocol::wire::Wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Request::from_bytes(data) {
        assert_eq!(r.to_bytes(), data, "request not canonical: {r:?}");
    }
    if let Ok(r) = Response::from_bytes(data) {
        assert_eq!(r.to_bytes(), data, "response not canonical: {r:?}");
    }
    let mut input = data;
    while let Ok(Some(payload)) = read_frame(&mut input) {
        assert!(payload.len() <= FRAME_MAX_BYTES);
        let _ = Request::from_bytes(&payload);
    }
});
