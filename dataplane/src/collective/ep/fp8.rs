//! FP8 (E4M3, "fn": no infinities, one NaN pattern per sign, max 448) quantisation of bf16
//! rows with one float32 scale per 128 channels, as upstream's dispatch does:
//!
//! ```text
//! amax  = max(1e-4, max |x_g|)          per group g of 128 channels, in f32
//! q     = e4m3(x_g * (448 / amax))      round to nearest even, saturating at +-448
//! scale = amax / 448                    dequantised value = q * scale
//! ```
//!
//! A quantised row is `H` fp8 bytes followed by `H / 128` little-endian f32 scales.

use super::layout::FP8_GROUP;
use crate::collective::reduce::bf16_to_f32;

/// Largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// `f32` to E4M3 bits, round to nearest even, saturating to +-448 (NaN stays NaN).
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return sign | 0x7f;
    }
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < 1.0 / 64.0 {
        // Subnormal range: multiples of 2^-9. `a * 512` is exact; q = 8 encodes the smallest
        // normal (exponent field 1, mantissa 0), which is the right carry.
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    let b = a.to_bits();
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 7; // 1..=15 here
    let m = b & 0x7f_ffff;
    let mut r = (exp as u32) << 3 | (m >> 20);
    let rem = m & 0xf_ffff;
    if rem > 0x8_0000 || (rem == 0x8_0000 && r & 1 == 1) {
        r += 1; // a carry into the exponent is the right rounding
    }
    sign | r.min(0x7e) as u8
}

/// E4M3 bits to `f32`.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = (b >> 3) & 0xf;
    let m = (b & 7) as f32;
    if e == 0xf && b & 7 == 7 {
        return f32::NAN;
    }
    if e == 0 {
        return sign * m / 512.0;
    }
    sign * (1.0 + m / 8.0) * 2f32.powi(e as i32 - 7)
}

/// Quantises one bf16 row (`src`, H elements) into `dst` (`H + 4H/128` bytes).
pub fn quantize_row(src: &[u16], dst: &mut [u8]) {
    let h = src.len();
    debug_assert_eq!(dst.len(), h + 4 * (h / FP8_GROUP));
    let (q, scales) = dst.split_at_mut(h);
    for (g, (xs, qs)) in src
        .chunks_exact(FP8_GROUP)
        .zip(q.chunks_exact_mut(FP8_GROUP))
        .enumerate()
    {
        let amax = xs
            .iter()
            .fold(0f32, |m, &v| m.max(bf16_to_f32(v).abs()))
            .max(1e-4);
        let k = E4M3_MAX / amax;
        for (d, &v) in qs.iter_mut().zip(xs) {
            *d = f32_to_e4m3(bf16_to_f32(v) * k);
        }
        scales[4 * g..4 * g + 4].copy_from_slice(&(amax / E4M3_MAX).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(f32_to_e4m3(0.0), 0x00);
        assert_eq!(f32_to_e4m3(1.0), 0x38);
        assert_eq!(f32_to_e4m3(-1.0), 0xb8);
        assert_eq!(f32_to_e4m3(448.0), 0x7e);
        assert_eq!(f32_to_e4m3(1.0e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1.0e6), 0xfe);
        assert_eq!(f32_to_e4m3(2f32.powi(-9)), 0x01);
        assert_eq!(f32_to_e4m3(2f32.powi(-6)), 0x08);
        assert_eq!(f32_to_e4m3(f32::NAN) & 0x7f, 0x7f);
        // ties to even: 1 + 1/16 lies between 1 (even) and 1.125
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
    }

    #[test]
    fn every_finite_code_round_trips_and_rounding_is_nearest() {
        for b in 0u8..=255 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            let back = f32_to_e4m3(v);
            assert_eq!(
                e4m3_to_f32(back),
                v,
                "code {b:#x} ({v}) came back as {back:#x}"
            );
        }
        let mut x = -500.0f32;
        while x < 500.0 {
            let q = e4m3_to_f32(f32_to_e4m3(x));
            let clamped = x.clamp(-E4M3_MAX, E4M3_MAX);
            // relative error of a 3-bit mantissa is at most 2^-4; absolute 2^-10 near zero
            assert!(
                (q - clamped).abs() <= clamped.abs() / 16.0 + 1.0 / 1024.0,
                "{x} -> {q}"
            );
            x += 0.37;
        }
    }

    #[test]
    fn a_row_dequantises_within_the_bound() {
        let h = 256;
        let src: Vec<u16> = (0..h)
            .map(|i| crate::collective::reduce::f32_to_bf16((i as f32 - 100.0) * 0.3))
            .collect();
        let mut dst = vec![0u8; h + 8];
        quantize_row(&src, &mut dst);
        for g in 0..2 {
            let s = f32::from_le_bytes(dst[h + 4 * g..h + 4 * g + 4].try_into().unwrap());
            for i in g * 128..(g + 1) * 128 {
                let x = bf16_to_f32(src[i]);
                let y = e4m3_to_f32(dst[i]) * s;
                assert!((x - y).abs() <= s * 448.0 / 16.0, "{x} vs {y}");
            }
        }
    }
}
