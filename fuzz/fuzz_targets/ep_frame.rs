//! Fuzzes the frames an EP link reads after its hello
//! (`collective::ep::net::decode_frame`, what the receive thread calls before it
//! touches its buffer; and `desc_decode` for a DESC's payload): a stream of frame headers,
//! each followed by its payload, checked against a data area whose size comes from the
//! input's first 8 bytes. Nothing may panic; an accepted frame re-encodes to exactly its
//! header, and a DESC payload to exactly its 16 bytes; the decoder accepts a WRITE exactly
//! when `offset + len` (without overflow) is at most the data area, a DESC exactly with
//! phase 0/1, set 0/1 and 16 bytes, a POST or ACK exactly with phase 0/1; the stream stops
//! at the first refused frame, as the link does, so a refused frame's payload is never
//! applied.
#![no_main]

use collective::ep::net::{decode_frame, desc_decode, desc_encode, Frame, DESC_BYTES};
use collective::net::FRAME_BYTES;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((len, mut rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let data_bytes = u64::from_le_bytes(*len) as usize;
    while !rest.is_empty() {
        let got = decode_frame(rest, data_bytes);
        let Some(h) = rest.first_chunk::<FRAME_BYTES>() else {
            assert!(got.is_err(), "a short header decoded: {got:?}");
            return;
        };
        let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let reserved = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let mut w = [0u8; 8];
        w.copy_from_slice(&h[8..16]);
        let a = u64::from_le_bytes(w);
        w.copy_from_slice(&h[16..24]);
        let n = u64::from_le_bytes(w);
        // The rules, spelled independently (u128: no sum can wrap).
        let want = reserved == 0
            && match kind {
                1 => u128::from(a) + u128::from(n) <= data_bytes as u128,
                3 => a == 0 && n == 0,
                4 => a & 0xff <= 1 && a >> 8 <= 1 && n == 16,
                5 | 6 => a <= 1,
                _ => false,
            };
        assert_eq!(
            got.is_ok(),
            want,
            "{h:?} against {data_bytes} bytes: {got:?}"
        );
        let Ok(f) = got else { return };
        assert_eq!(&f.encode(), h, "not canonical: {f:?}");
        rest = &rest[FRAME_BYTES..];
        let payload = match f {
            Frame::Write { offset, len } => {
                let end = offset
                    .checked_add(len)
                    .expect("an accepted WRITE cannot wrap");
                assert!(
                    end <= data_bytes,
                    "WRITE {offset}+{len} outside {data_bytes}"
                );
                len
            }
            Frame::Desc { .. } => {
                let Some(p) = rest.first_chunk::<DESC_BYTES>() else {
                    return;
                };
                assert_eq!(
                    &desc_encode(&desc_decode(p)),
                    p,
                    "DESC payload not canonical"
                );
                DESC_BYTES
            }
            Frame::Heartbeat | Frame::Post { .. } | Frame::Ack { .. } => 0,
        };
        rest = &rest[payload.min(rest.len())..];
    }
});
