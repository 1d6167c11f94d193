//! Fuzzes the frames a `mooncake.pg` link reads after its hello
//! (`collective::net::decode_frame`, what the receive thread calls before it
//! touches a replica): a stream of frame headers, each WRITE followed by its payload, checked
//! against a replica whose size comes from the input's first byte (a real group's segment,
//! or any size). Nothing may panic; an accepted frame re-encodes to exactly its header; the
//! decoder accepts a WRITE exactly when `offset + len` (without overflow) is at most the
//! replica's size, and a STORE exactly when it names an 8-aligned counter inside the header
//! and the replica; the stream stops at the first refused frame, as the link does, so a
//! refused frame's payload is never applied.
#![no_main]

use collective::net::{decode_frame, Frame, FRAME_BYTES};
use collective::seg::segment_bytes;
use collective::limits::{PG_HEADER_BYTES, PG_MAX_RANKS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, mut rest)) = data.split_first() else {
        return;
    };
    // Below 128: the replica of a group of 1..=64 ranks; else any size, from 8 bytes.
    let seg_len = if pick < 128 {
        segment_bytes(usize::from(pick) % PG_MAX_RANKS + 1)
    } else {
        let Some((len, tail)) = rest.split_first_chunk::<8>() else {
            return;
        };
        rest = tail;
        u64::from_le_bytes(*len) as usize
    };
    while !rest.is_empty() {
        let got = decode_frame(rest, seg_len);
        let Some(h) = rest.first_chunk::<FRAME_BYTES>() else {
            assert!(got.is_err(), "a short header decoded: {got:?}");
            return;
        };
        let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let reserved = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let mut w = [0u8; 8];
        w.copy_from_slice(&h[8..16]);
        let off = u64::from_le_bytes(w);
        w.copy_from_slice(&h[16..24]);
        let n = u64::from_le_bytes(w);
        // The rules, spelled independently in u128 (no sum can wrap).
        let (off_w, n_w, len_w) = (u128::from(off), u128::from(n), seg_len as u128);
        let fits = off_w + n_w <= len_w;
        let counter = off % 8 == 0 && off_w + 8 <= (PG_HEADER_BYTES as u128).min(len_w);
        let want = reserved == 0
            && match kind {
                1 => fits,
                2 => counter,
                3 => off == 0 && n == 0,
                _ => false,
            };
        assert_eq!(got.is_ok(), want, "{h:?} against {seg_len} bytes: {got:?}");
        let Ok(f) = got else { return };
        assert_eq!(&f.encode(), h, "not canonical: {f:?}");
        rest = &rest[FRAME_BYTES..];
        match f {
            Frame::Write { offset, len } => {
                let end = offset
                    .checked_add(len)
                    .expect("an accepted WRITE cannot wrap");
                assert!(end <= seg_len, "WRITE {offset}+{len} outside {seg_len}");
                // The payload follows; the stream continues after it (or ends inside it).
                rest = &rest[len.min(rest.len())..];
            }
            Frame::Store { offset, .. } => {
                assert!(offset % 8 == 0 && offset + 8 <= PG_HEADER_BYTES.min(seg_len));
            }
            Frame::Heartbeat => {}
        }
    }
});
