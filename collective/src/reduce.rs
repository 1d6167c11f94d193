//! Element types, reduce operations and the fold kernels the collectives run on slot bytes.
//!
//! Codes follow upstream's C API (`mooncake_pg.h`): datatypes in its enum order, reduce ops
//! `Sum=0, Avg=1, Product=2, Min=3, Max=4`. Which pairs reduce is decided once in
//! [`check_reducible`]; the kernels assume a checked pair.
//!
//! Invariants: a fold combines whole elements (every chunk boundary is a multiple of
//! [`crate::limits::PG_CHUNK_ALIGN_BYTES`], a multiple of every element size); 16-bit floats
//! are widened to `f32` for each step and rounded back to nearest-even; integers wrap (as
//! torch's CPU kernels do); `bool` sums are logical OR and products logical AND.

/// Element type of a tensor, numbered as upstream's C API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DType {
    Int8 = 0,
    Uint8,
    Int16,
    Uint16,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
    Bool,
    Float8e4m3fn,
    Float8e5m2,
    Float8e4m3fnuz,
    Float8e5m2fnuz,
    Float8e8m0fnu,
}

const DTYPES: [DType; 18] = [
    DType::Int8,
    DType::Uint8,
    DType::Int16,
    DType::Uint16,
    DType::Int32,
    DType::Uint32,
    DType::Int64,
    DType::Uint64,
    DType::Float16,
    DType::Float32,
    DType::Float64,
    DType::Bfloat16,
    DType::Bool,
    DType::Float8e4m3fn,
    DType::Float8e5m2,
    DType::Float8e4m3fnuz,
    DType::Float8e5m2fnuz,
    DType::Float8e8m0fnu,
];

impl DType {
    /// The type with upstream's code `code`, if any.
    pub fn from_code(code: u32) -> Option<DType> {
        DTYPES.get(code as usize).copied()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Int8 | DType::Uint8 | DType::Bool => 1,
            DType::Float8e4m3fn
            | DType::Float8e5m2
            | DType::Float8e4m3fnuz
            | DType::Float8e5m2fnuz
            | DType::Float8e8m0fnu => 1,
            DType::Int16 | DType::Uint16 | DType::Float16 | DType::Bfloat16 => 2,
            DType::Int32 | DType::Uint32 | DType::Float32 => 4,
            DType::Int64 | DType::Uint64 | DType::Float64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(
            self,
            DType::Float16 | DType::Float32 | DType::Float64 | DType::Bfloat16
        )
    }
}

/// Reduce operation, numbered as upstream's C API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ReduceOp {
    Sum = 0,
    Avg = 1,
    Product = 2,
    Min = 3,
    Max = 4,
}

impl ReduceOp {
    /// The op with upstream's code `code`, if any.
    pub fn from_code(code: u32) -> Option<ReduceOp> {
        Some(match code {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Avg,
            2 => ReduceOp::Product,
            3 => ReduceOp::Min,
            4 => ReduceOp::Max,
            _ => return None,
        })
    }
}

/// Whether `op` is defined on `dt`: every op on the four float types, SUM/PRODUCT/MIN/MAX on
/// the integers and `bool`, nothing on the fp8 types (no arithmetic is defined for them on CPU).
pub fn check_reducible(dt: DType, op: ReduceOp) -> Result<(), String> {
    let fp8 = dt.size() == 1 && !matches!(dt, DType::Int8 | DType::Uint8 | DType::Bool);
    if fp8 {
        return Err(format!("reductions are not supported on {dt:?}"));
    }
    if op == ReduceOp::Avg && !dt.is_float() {
        return Err(format!(
            "AVG needs a floating-point tensor (float16, bfloat16, float32, float64), got {dt:?}"
        ));
    }
    Ok(())
}

/// `f16` bits to `f32`.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h as u32) & 0x3ff;
    if exp == 0 {
        let v = man as f32 * (1.0 / 16_777_216.0); // 2^-24
        return if sign != 0 { -v } else { v };
    }
    if exp == 31 {
        return f32::from_bits(sign | 0x7f80_0000 | (man << 13));
    }
    f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
}

/// `f32` to `f16` bits, rounding to nearest-even (overflow to infinity, NaN stays NaN).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 255 {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e16 = exp - 112;
    if e16 >= 31 {
        return sign | 0x7c00;
    }
    if e16 <= 0 {
        if e16 < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e16) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1u32 << shift) - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e16 as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1; // a carry into the exponent is the correct rounding (up to infinity)
    }
    sign | r as u16
}

/// `bf16` bits to `f32`.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `f32` to `bf16` bits, rounding to nearest-even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// Widening and narrowing of one 16-bit float format.
type HalfConv = (fn(u16) -> f32, fn(f32) -> u16);

fn fold_slice<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

macro_rules! fold_int {
    ($t:ty, $op:expr, $d:expr, $s:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => fold_slice::<$t>($d, $s, |a, b| a.wrapping_add(b)),
            ReduceOp::Product => fold_slice::<$t>($d, $s, |a, b| a.wrapping_mul(b)),
            ReduceOp::Min => fold_slice::<$t>($d, $s, |a, b| a.min(b)),
            ReduceOp::Max => fold_slice::<$t>($d, $s, |a, b| a.max(b)),
        }
    };
}

macro_rules! fold_float {
    ($t:ty, $op:expr, $d:expr, $s:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => fold_slice::<$t>($d, $s, |a, b| a + b),
            ReduceOp::Product => fold_slice::<$t>($d, $s, |a, b| a * b),
            ReduceOp::Min => {
                fold_slice::<$t>($d, $s, |a, b| if b < a || b.is_nan() { b } else { a })
            }
            ReduceOp::Max => {
                fold_slice::<$t>($d, $s, |a, b| if b > a || b.is_nan() { b } else { a })
            }
        }
    };
}

fn fold_half(op: ReduceOp, d: &mut [u16], s: &[u16], to: fn(u16) -> f32, from: fn(f32) -> u16) {
    let f = |a: f32, b: f32| match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Product => a * b,
        ReduceOp::Min => {
            if b < a || b.is_nan() {
                b
            } else {
                a
            }
        }
        ReduceOp::Max => {
            if b > a || b.is_nan() {
                b
            } else {
                a
            }
        }
    };
    fold_slice::<u16>(d, s, |a, b| from(f(to(a), to(b))));
}

/// Typed view of `len` bytes at `p` (aligned for `T`; `len` a multiple of its size).
///
/// # Safety
/// `p` must be valid for `len` bytes, aligned for `T`, and not aliased mutably elsewhere for
/// the returned lifetime.
unsafe fn typed<'a, T>(p: *mut u8, len: usize) -> &'a mut [T] {
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts_mut(p.cast::<T>(), len / std::mem::size_of::<T>()) }
}

/// `dst[i] = dst[i] op src[i]` over `bytes` bytes of `dt` elements (AVG folds as SUM; divide
/// with [`divide`] at the end). The pair must have passed [`check_reducible`].
///
/// # Safety
/// `dst` and `src` must be valid for `bytes` bytes and must not overlap.
pub unsafe fn fold(dt: DType, op: ReduceOp, dst: *mut u8, src: *const u8, bytes: usize) {
    let align = dt.size();
    if !(dst as usize).is_multiple_of(align) || !(src as usize).is_multiple_of(align) {
        // Rare (a tensor whose storage offset is not element-aligned cannot come from torch):
        // fold through aligned copies.
        let mut a = vec![0u64; bytes.div_ceil(8)];
        let mut b = vec![0u64; bytes.div_ceil(8)];
        let (pa, pb) = (a.as_mut_ptr().cast::<u8>(), b.as_mut_ptr().cast::<u8>());
        // SAFETY: both vectors hold at least `bytes` bytes; the caller vouches for dst/src.
        unsafe {
            std::ptr::copy_nonoverlapping(dst, pa, bytes);
            std::ptr::copy_nonoverlapping(src, pb, bytes);
            fold(dt, op, pa, pb, bytes);
            std::ptr::copy_nonoverlapping(pa, dst, bytes);
        }
        return;
    }
    let s = src.cast_mut();
    // SAFETY: both pointers are aligned for the element type (checked above), valid for
    // `bytes` bytes and disjoint (caller's contract).
    unsafe {
        match dt {
            DType::Int8 => fold_int!(i8, op, typed(dst, bytes), typed(s, bytes)),
            DType::Uint8 => fold_int!(u8, op, typed(dst, bytes), typed(s, bytes)),
            DType::Int16 => fold_int!(i16, op, typed(dst, bytes), typed(s, bytes)),
            DType::Uint16 => fold_int!(u16, op, typed(dst, bytes), typed(s, bytes)),
            DType::Int32 => fold_int!(i32, op, typed(dst, bytes), typed(s, bytes)),
            DType::Uint32 => fold_int!(u32, op, typed(dst, bytes), typed(s, bytes)),
            DType::Int64 => fold_int!(i64, op, typed(dst, bytes), typed(s, bytes)),
            DType::Uint64 => fold_int!(u64, op, typed(dst, bytes), typed(s, bytes)),
            DType::Float32 => fold_float!(f32, op, typed(dst, bytes), typed(s, bytes)),
            DType::Float64 => fold_float!(f64, op, typed(dst, bytes), typed(s, bytes)),
            DType::Float16 => fold_half(
                op,
                typed(dst, bytes),
                typed(s, bytes),
                f16_to_f32,
                f32_to_f16,
            ),
            DType::Bfloat16 => fold_half(
                op,
                typed(dst, bytes),
                typed(s, bytes),
                bf16_to_f32,
                f32_to_bf16,
            ),
            DType::Bool => {
                let d: &mut [u8] = typed(dst, bytes);
                let s: &[u8] = typed(s, bytes);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Max => {
                        fold_slice(d, s, |a, b| u8::from(a != 0 || b != 0))
                    }
                    ReduceOp::Product | ReduceOp::Min => {
                        fold_slice(d, s, |a, b| u8::from(a != 0 && b != 0))
                    }
                }
            }
            _ => debug_assert!(false, "fold on an unchecked dtype {dt:?}"),
        }
    }
}

/// `dst[i] /= k` over `bytes` bytes of a float type (the end of an AVG).
///
/// # Safety
/// `dst` must be valid for `bytes` bytes.
pub unsafe fn divide(dt: DType, dst: *mut u8, bytes: usize, k: usize) {
    if k <= 1 {
        return;
    }
    let n = bytes / dt.size();
    // SAFETY: `dst` is valid for `bytes` bytes (caller); unaligned accesses are used, so
    // alignment does not matter.
    unsafe {
        match dt {
            DType::Float32 => {
                let p = dst.cast::<f32>();
                for i in 0..n {
                    p.add(i)
                        .write_unaligned(p.add(i).read_unaligned() / k as f32);
                }
            }
            DType::Float64 => {
                let p = dst.cast::<f64>();
                for i in 0..n {
                    p.add(i)
                        .write_unaligned(p.add(i).read_unaligned() / k as f64);
                }
            }
            DType::Float16 | DType::Bfloat16 => {
                let (to, from): HalfConv = if dt == DType::Float16 {
                    (f16_to_f32, f32_to_f16)
                } else {
                    (bf16_to_f32, f32_to_bf16)
                };
                let p = dst.cast::<u16>();
                for i in 0..n {
                    p.add(i)
                        .write_unaligned(from(to(p.add(i).read_unaligned()) / k as f32));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trips_exact_values() {
        for v in [
            0.0f32,
            1.0,
            -2.5,
            65504.0,
            0.000_061_035_156,
            1.0 / 4_194_304.0, // 2^-22, a subnormal
            1023.5,
        ] {
            assert_eq!(f16_to_f32(f32_to_f16(v)), v, "{v}");
        }
        assert!(f16_to_f32(f32_to_f16(1.0e6)).is_infinite());
        for v in [0.0f32, 1.0, -3.5, 256.0, 1.5 * 2f32.powi(99)] {
            assert_eq!(bf16_to_f32(f32_to_bf16(v)), v, "{v}");
        }
        // Nearest-even: 1 + 2^-11 sits halfway between two f16 values and rounds to 1.
        assert_eq!(f16_to_f32(f32_to_f16(1.0 + 1.0 / 2048.0)), 1.0);
    }

    #[test]
    fn fold_each_op_on_ints_floats_and_bool() {
        let mut d = [3i32, -4, 5];
        let s = [2i32, 7, -9];
        let b = |x: &mut [i32]| x.as_mut_ptr().cast::<u8>();
        for (op, want) in [
            (ReduceOp::Sum, [5, 3, -4]),
            (ReduceOp::Product, [10, 21, 36]),
            (ReduceOp::Min, [2, 7, -9]),
            (ReduceOp::Max, [2, 7, -9]),
        ] {
            // SAFETY: both arrays are 12 bytes, aligned and disjoint.
            unsafe { fold(DType::Int32, op, b(&mut d), s.as_ptr().cast(), 12) };
            assert_eq!(d, want, "{op:?}");
        }
        let mut h = [f32_to_bf16(1.5), f32_to_bf16(-2.0)];
        let g = [f32_to_bf16(2.0), f32_to_bf16(4.0)];
        // SAFETY: 4 bytes each, aligned, disjoint.
        unsafe {
            fold(
                DType::Bfloat16,
                ReduceOp::Sum,
                h.as_mut_ptr().cast(),
                g.as_ptr().cast(),
                4,
            );
            divide(DType::Bfloat16, h.as_mut_ptr().cast(), 4, 2);
        }
        assert_eq!([bf16_to_f32(h[0]), bf16_to_f32(h[1])], [1.75, 1.0]);
        let mut t = [1u8, 0, 1, 0];
        let u = [1u8, 1, 0, 0];
        // SAFETY: 4 bytes each, disjoint.
        unsafe {
            fold(
                DType::Bool,
                ReduceOp::Product,
                t.as_mut_ptr(),
                u.as_ptr(),
                4,
            )
        };
        assert_eq!(t, [1, 0, 0, 0]);
    }

    #[test]
    fn reducible_pairs() {
        assert!(check_reducible(DType::Bfloat16, ReduceOp::Avg).is_ok());
        assert!(check_reducible(DType::Int32, ReduceOp::Avg).is_err());
        assert!(check_reducible(DType::Float8e5m2, ReduceOp::Sum).is_err());
        assert!(check_reducible(DType::Bool, ReduceOp::Max).is_ok());
    }
}
