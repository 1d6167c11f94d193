//! The crc32 of bytes that are not ours, read in place.
//!
//! A file's checksum covers memory the tier does not own: a segment's object on the way to
//! disk, a reader's destination on the way back. Such bytes are never formed into a Rust
//! slice (`dataplane::sys::bytes`), so `crc32fast` cannot take them as they are. The first
//! way was a copy through a small scratch buffer, 32 KiB at a time, and `crc32fast` over
//! that: the copy cost more than the crc (on this project's VM, 4 MiB from memory: about
//! 0.8 ms with the copy, 0.3 ms without), and on a 2-core machine that CPU is taken from the
//! puts (`bench/README.md`, "Where eager offload's cost goes").
//!
//! So on x86-64 with `PCLMULQDQ` the bulk is folded here straight from the raw range, with
//! the same fold as `crc32fast`'s (Gopal et al., "Fast CRC computation for generic
//! polynomials using PCLMULQDQ", Intel 2009, the fold by four with its constants): unaligned
//! 16-byte loads through the pointer, no reference formed. The 128 bits left after the fold
//! and the last few bytes go to `crc32fast`: a crc whose inverted initial value is zero, over
//! the folded 128 bits as a message, is the crc of everything folded (the fold keeps the
//! message's residue), so the final reduction is `crc32fast`'s own. Elsewhere, and below
//! [`CRC_FOLD_MIN_BYTES`] bytes, the scratch copy stays.

use dataplane::mem::{Dst, Src};

use super::limits::CRC_FOLD_MIN_BYTES;

/// Adds the bytes of `src` to `crc`; `scratch` is used where they cannot be read in place.
pub(super) fn crc_of(crc: &mut crc32fast::Hasher, src: Src<'_>, scratch: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= CRC_FOLD_MIN_BYTES && fold::available() {
        let (bulk, rest) = src.split_at(src.len() / 64 * 64);
        let state = crc.clone().finalize();
        // SAFETY: the CPU has the instructions (`available`), and `bulk` is readable for
        // its whole length (a `Src`'s promise), a multiple of 64 bytes, at least 64.
        let folded = unsafe { fold::fold(state, bulk.as_ptr(), bulk.len()) };
        let mut h = crc32fast::Hasher::new_with_initial(u32::MAX);
        h.update(&folded);
        *crc = h;
        copy_crc(crc, rest, scratch);
        return;
    }
    copy_crc(crc, src, scratch);
}

/// The crc of `src` through `scratch`, one copy of it at a time.
fn copy_crc(crc: &mut crc32fast::Hasher, src: Src<'_>, scratch: &mut [u8]) {
    for chunk in src.chunks(scratch.len()) {
        let n = chunk.len();
        chunk.copy_to(&mut Dst::from(&mut scratch[..n]));
        crc.update(&scratch[..n]);
    }
}

#[cfg(target_arch = "x86_64")]
mod fold {
    use std::arch::x86_64 as arch;

    // The fold constants of the paper for the reflected crc32 polynomial, as in `crc32fast`:
    // (K1, K2) fold 512 bits ahead, (K3, K4) 128.
    const K1: i64 = 0x1_5444_2bd4;
    const K2: i64 = 0x1_c6e4_1596;
    const K3: i64 = 0x1_7519_97d0;
    const K4: i64 = 0x0_ccaa_009e;

    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("pclmulqdq") && std::is_x86_feature_detected!("sse4.1")
    }

    #[target_feature(enable = "pclmulqdq", enable = "sse2")]
    fn fold128(a: arch::__m128i, b: arch::__m128i, keys: arch::__m128i) -> arch::__m128i {
        let t1 = arch::_mm_clmulepi64_si128(a, keys, 0x00);
        let t2 = arch::_mm_clmulepi64_si128(a, keys, 0x11);
        arch::_mm_xor_si128(arch::_mm_xor_si128(b, t1), t2)
    }

    /// Folds `len` bytes at `p` (a multiple of 64, at least 64) onto the crc state `crc`:
    /// 16 bytes whose crc from an initial value of `u32::MAX` is the crc of the range from
    /// `crc`.
    ///
    /// # Safety
    /// The CPU has `PCLMULQDQ` and SSE4.1, and `[p, p + len)` is readable.
    #[target_feature(enable = "pclmulqdq", enable = "sse2", enable = "sse4.1")]
    pub(super) unsafe fn fold(crc: u32, p: *const u8, len: usize) -> [u8; 16] {
        debug_assert!(len >= 64 && len.is_multiple_of(64));
        let load = |at: usize| {
            // SAFETY: `[p + at, p + at + 16)` lies in the readable range (every caller's
            // `at + 16 <= len`); an unaligned load through a raw pointer forms no reference.
            unsafe { arch::_mm_loadu_si128(p.add(at).cast()) }
        };
        let mut x3 = arch::_mm_xor_si128(load(0), arch::_mm_cvtsi32_si128(!crc as i32));
        let mut x2 = load(16);
        let mut x1 = load(32);
        let mut x0 = load(48);
        let k1k2 = arch::_mm_set_epi64x(K2, K1);
        let mut at = 64;
        while at < len {
            x3 = fold128(x3, load(at), k1k2);
            x2 = fold128(x2, load(at + 16), k1k2);
            x1 = fold128(x1, load(at + 32), k1k2);
            x0 = fold128(x0, load(at + 48), k1k2);
            at += 64;
        }
        let k3k4 = arch::_mm_set_epi64x(K4, K3);
        let x = fold128(fold128(fold128(x3, x2, k3k4), x1, k3k4), x0, k3k4);
        let mut out = [0u8; 16];
        // SAFETY: `out` is 16 writable bytes; the store needs no alignment.
        unsafe { arch::_mm_storeu_si128(out.as_mut_ptr().cast(), x) };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the fold's edges, every start offset within 16 bytes, and a
    /// state carried in from earlier bytes: the same crc as `crc32fast` over a slice.
    #[test]
    fn crc_of_in_place_matches_crc32fast() {
        let mut data = vec![0u8; (1 << 20) + 300];
        let mut s: u32 = 0x1234_5678;
        for b in data.iter_mut() {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *b = (s >> 24) as u8;
        }
        let mut scratch = vec![0u8; 4096];
        let lens = [
            0,
            1,
            63,
            64,
            255,
            256,
            257,
            319,
            320,
            4095,
            4096,
            65_537,
            1 << 20,
        ];
        for &len in &lens {
            for off in [0usize, 1, 7, 15, 16, 33] {
                let bytes = &data[off..off + len];
                for prefix in [&b""[..], b"mooncake"] {
                    let mut want = crc32fast::Hasher::new();
                    want.update(prefix);
                    want.update(bytes);
                    let mut got = crc32fast::Hasher::new();
                    got.update(prefix);
                    crc_of(&mut got, Src::from(bytes), &mut scratch);
                    assert_eq!(got.finalize(), want.finalize(), "len {len} off {off}");
                }
            }
        }
    }
}
