//! Fuzzes the transfer engine's handshake port decoding (`dataplane::metadata::handshake`):
//! arbitrary bytes as a stream of frames (length, type, JSON), each Notify body as a
//! `NotifyMsg`, each Metadata body as a `SegmentRequest`. Nothing may panic; a decoded frame
//! re-encodes to the bytes it came from, a frame never claims more than the bytes given, and a
//! decoded notify or segment request survives a JSON round trip.
#![no_main]

use dataplane::metadata::handshake::{
    decode_frame, decode_notify, decode_segment_request, encode_frame, segment_request, FrameType,
    FRAME_MAX_BYTES, LEN_BYTES,
};
use libfuzzer_sys::fuzz_target;

fn frame_type(ty: u8) -> FrameType {
    match ty {
        0 => FrameType::Connection,
        1 => FrameType::Metadata,
        2 => FrameType::Notify,
        _ => FrameType::Probe,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((ty, json, used))) = decode_frame(rest) {
        assert!(ty <= FrameType::Probe as u8);
        assert!(used <= rest.len() && used as u64 <= LEN_BYTES as u64 + FRAME_MAX_BYTES);
        assert_eq!(encode_frame(frame_type(ty), json), &rest[..used]);
        if ty == FrameType::Notify as u8 {
            if let Some(msg) = decode_notify(json) {
                let again = serde_json::to_vec(&msg).expect("a NotifyMsg serializes");
                assert_eq!(decode_notify(&again), Some(msg));
            }
        }
        if ty == FrameType::Metadata as u8 {
            if let Some(name) = decode_segment_request(json) {
                assert_eq!(decode_segment_request(&segment_request(&name)), Some(name));
            }
        }
        rest = &rest[used..];
    }
    // The same bytes as a notify's JSON body.
    let _ = decode_notify(data);
    let _ = decode_segment_request(data);
});
