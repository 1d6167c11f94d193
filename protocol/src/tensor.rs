//! The tensor object format: upstream Mooncake's 304-byte `TensorMetadata` header followed by
//! the tensor's raw C-contiguous element bytes.
//!
//! `put_tensor` stores one object `[TensorMetadata][data]`; `get_tensor` parses the header and
//! views the rest. The header is a `memcpy` of a C struct on a little-endian host, so the
//! encoding here is byte-for-byte the one upstream writes (`integration_utils.h`), and objects
//! written by either implementation read back in the other.
//!
//! ```text
//! offset size  field                               (all little-endian)
//!      0    4  magic          u32 = 0x4d4f4f4e      bytes "NOOM"
//!      4    2  version        u16 = 1
//!      6    2  header_size    u16 = 304
//!      8    4  dtype          i32  TensorDtype
//!     12    4  ndim           i32  0..=8
//!     16    4  layout_kind    u32  0 FULL, 1 SHARD
//!     20    4  reserved_flags u32 = 0
//!     24    8  data_offset    u64 = 304
//!     32    8  data_bytes     u64  = total_len - data_offset
//!     40   64  global_shape   i64[8]  dims >= ndim are -1
//!    104   64  local_shape    i64[8]  dims >= ndim are -1
//!    168    4  axis_count     u32  0..=4
//!    172    4  reserved0      u32 = 0
//!    176  128  axes[4]        32 bytes each:
//!                +0 kind i32 (0 DP, 1 TP, 2 EP, 3 PP, 4 RESERVED)  +4 axis_index i32
//!                +8 shard_rank i32  +12 shard_count i32  +16 split_dim i32 (-1 or < ndim)
//!                +20 reserved0 i32 (expert / stage id)  +24 reserved1 i64 (local extent)
//!    304       data
//! ```
//!
//! Invariant: [`TensorMetadata::decode`] never panics; it accepts exactly what upstream's
//! `ValidateTensorMetadata` accepts (with zero-sized dimensions allowed, as upstream HEAD
//! stores zero-element tensors), and [`TensorMetadata::encode`] of a decoded header gives back
//! the same 304 bytes except for unused axis slots, which are always written as zeros.

/// `sizeof(TensorMetadata)`: what `_tensor_metadata_size()` returns.
pub const TENSOR_METADATA_BYTES: usize = 304;
/// `"MOON"` as a little-endian u32 (`kTensorObjectMagic`).
pub const TENSOR_MAGIC: u32 = 0x4d4f_4f4e;
pub const TENSOR_VERSION: u16 = 1;
/// Dimensions a header can describe (`kMaxTensorDims`).
pub const MAX_TENSOR_DIMS: usize = 8;
/// Layout axes a header can describe (`kMaxLayoutAxes`).
pub const MAX_LAYOUT_AXES: usize = 4;

const HEADER_BYTES: usize = 40;
const SHAPE_BYTES: usize = 8 * MAX_TENSOR_DIMS;
const AXIS_BYTES: usize = 32;
const GLOBAL_SHAPE_AT: usize = HEADER_BYTES;
const LOCAL_SHAPE_AT: usize = GLOBAL_SHAPE_AT + SHAPE_BYTES;
const AXIS_COUNT_AT: usize = LOCAL_SHAPE_AT + SHAPE_BYTES;
const AXES_AT: usize = AXIS_COUNT_AT + 8;
const _: () = assert!(AXES_AT + MAX_LAYOUT_AXES * AXIS_BYTES == TENSOR_METADATA_BYTES);
const _: () = assert!(AXES_AT - HEADER_BYTES == 136);

/// Element type of a stored tensor (upstream `TensorDtype`; the numbers are the format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TensorDtype {
    Float32 = 0,
    Float64 = 1,
    Int8 = 2,
    Uint8 = 3,
    Int16 = 4,
    Uint16 = 5,
    Int32 = 6,
    Uint32 = 7,
    Int64 = 8,
    Uint64 = 9,
    Bool = 10,
    Float16 = 11,
    Bfloat16 = 12,
    Float8E4m3 = 13,
    Float8E5m2 = 14,
}

impl TensorDtype {
    pub const ALL: [TensorDtype; 15] = [
        TensorDtype::Float32,
        TensorDtype::Float64,
        TensorDtype::Int8,
        TensorDtype::Uint8,
        TensorDtype::Int16,
        TensorDtype::Uint16,
        TensorDtype::Int32,
        TensorDtype::Uint32,
        TensorDtype::Int64,
        TensorDtype::Uint64,
        TensorDtype::Bool,
        TensorDtype::Float16,
        TensorDtype::Bfloat16,
        TensorDtype::Float8E4m3,
        TensorDtype::Float8E5m2,
    ];

    pub fn from_i32(v: i32) -> Option<TensorDtype> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// Bytes per element.
    pub fn element_bytes(self) -> u64 {
        use TensorDtype::*;
        match self {
            Float64 | Int64 | Uint64 => 8,
            Float32 | Int32 | Uint32 => 4,
            Int16 | Uint16 | Float16 | Bfloat16 => 2,
            Int8 | Uint8 | Bool | Float8E4m3 | Float8E5m2 => 1,
        }
    }

    /// The `torch` attribute naming this dtype (`torch.float8_e4m3fn` for `Float8E4m3`).
    pub fn torch_name(self) -> &'static str {
        use TensorDtype::*;
        match self {
            Float32 => "float32",
            Float64 => "float64",
            Int8 => "int8",
            Uint8 => "uint8",
            Int16 => "int16",
            Uint16 => "uint16",
            Int32 => "int32",
            Uint32 => "uint32",
            Int64 => "int64",
            Uint64 => "uint64",
            Bool => "bool",
            Float16 => "float16",
            Bfloat16 => "bfloat16",
            Float8E4m3 => "float8_e4m3fn",
            Float8E5m2 => "float8_e5m2",
        }
    }

    pub fn from_torch_name(name: &str) -> Option<TensorDtype> {
        Self::ALL.into_iter().find(|d| d.torch_name() == name)
    }
}

/// Whether the object holds a whole tensor or one shard of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum LayoutKind {
    Full = 0,
    Shard = 1,
}

/// Kinds of parallel axis (`LayoutAxisKind`).
pub const AXIS_DP: i32 = 0;
pub const AXIS_TP: i32 = 1;
pub const AXIS_EP: i32 = 2;
pub const AXIS_PP: i32 = 3;
pub const AXIS_RESERVED: i32 = 4;

/// One parallel axis of a shard's layout (`LayoutAxis`, 32 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayoutAxis {
    pub kind: i32,
    pub axis_index: i32,
    pub shard_rank: i32,
    pub shard_count: i32,
    /// -1 (not split) or a dimension below `ndim`.
    pub split_dim: i32,
    /// Expert id (EP) or stage id (PP), else 0.
    pub reserved0: i32,
    /// Local extent along `split_dim`, or 0.
    pub reserved1: i64,
}

/// A decoded, validated tensor header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMetadata {
    pub dtype: TensorDtype,
    pub layout_kind: LayoutKind,
    /// Shape of the whole tensor; `len()` is `ndim`.
    pub global_shape: Vec<i64>,
    /// Shape of the bytes in this object; same `ndim`.
    pub local_shape: Vec<i64>,
    pub axes: Vec<LayoutAxis>,
    /// Where the element bytes start (304 for everything we write).
    pub data_offset: u64,
    /// Element bytes following the header.
    pub data_bytes: u64,
}

/// Why a header was refused; each says what was expected and what arrived.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TensorHeaderError {
    #[error("tensor object too short: need at least {TENSOR_METADATA_BYTES} bytes, got {0}")]
    TooShort(u64),
    #[error("bad tensor header magic/version/size: got magic {magic:#x}, version {version}, header_size {header_size}")]
    BadPreamble {
        magic: u32,
        version: u16,
        header_size: u16,
    },
    #[error("unsupported tensor dtype {0} (expected 0..15)")]
    BadDtype(i32),
    #[error("bad ndim {0} (expected 0..=8)")]
    BadNdim(i32),
    #[error("bad layout kind {0} (expected 0 or 1)")]
    BadLayoutKind(u32),
    #[error("bad axis count {0} (expected 0..=4)")]
    BadAxisCount(u32),
    #[error("bad data offset {offset} for an object of {total} bytes")]
    BadDataOffset { offset: u64, total: u64 },
    #[error("data_bytes {data_bytes} does not match the object: expected {expected}")]
    BadDataBytes { data_bytes: u64, expected: u64 },
    #[error("bad shape: dimension {dim} is {value}")]
    BadShape { dim: usize, value: i64 },
    #[error("shape needs {needed:?} bytes of {dtype:?} data, object has {data_bytes}")]
    ShapeSizeMismatch {
        needed: Option<u64>,
        dtype: TensorDtype,
        data_bytes: u64,
    },
    #[error("bad layout axis {index}: {reason}")]
    BadAxis { index: usize, reason: &'static str },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    u32_at(b, at) as i32
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    u64_at(b, at) as i64
}

/// Number of elements of `shape`, or `None` on overflow or a negative dimension.
pub fn element_count(shape: &[i64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

impl TensorMetadata {
    /// A FULL header for a whole tensor of `shape` (what `put_tensor` writes).
    pub fn full(dtype: TensorDtype, shape: &[i64]) -> Option<TensorMetadata> {
        let data_bytes = element_count(shape)?.checked_mul(dtype.element_bytes())?;
        (shape.len() <= MAX_TENSOR_DIMS).then(|| TensorMetadata {
            dtype,
            layout_kind: LayoutKind::Full,
            global_shape: shape.to_vec(),
            local_shape: shape.to_vec(),
            axes: Vec::new(),
            data_offset: TENSOR_METADATA_BYTES as u64,
            data_bytes,
        })
    }

    /// The SHARD header `put_tensor_with_tp` writes for rank `rank` of `count` along
    /// `split_dim`: one TP axis whose `reserved1` is the shard's extent.
    pub fn tp_shard(
        dtype: TensorDtype,
        global_shape: &[i64],
        local_shape: &[i64],
        rank: i32,
        count: i32,
        split_dim: i32,
    ) -> Option<TensorMetadata> {
        let mut m = Self::full(dtype, local_shape)?;
        if global_shape.len() != local_shape.len() {
            return None;
        }
        let extent = *local_shape.get(usize::try_from(split_dim).ok()?)?;
        m.layout_kind = LayoutKind::Shard;
        m.global_shape = global_shape.to_vec();
        m.axes = vec![LayoutAxis {
            kind: AXIS_TP,
            axis_index: 0,
            shard_rank: rank,
            shard_count: count,
            split_dim,
            reserved0: 0,
            reserved1: extent,
        }];
        Some(m)
    }

    pub fn ndim(&self) -> usize {
        self.local_shape.len()
    }

    /// The 304 header bytes. Shapes longer than 8 dims or more than 4 axes are truncated
    /// (constructors never produce them).
    pub fn encode(&self) -> [u8; TENSOR_METADATA_BYTES] {
        let mut b = [0u8; TENSOR_METADATA_BYTES];
        let ndim = self.local_shape.len().min(MAX_TENSOR_DIMS);
        let axes = &self.axes[..self.axes.len().min(MAX_LAYOUT_AXES)];
        b[0..4].copy_from_slice(&TENSOR_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&TENSOR_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(TENSOR_METADATA_BYTES as u16).to_le_bytes());
        b[8..12].copy_from_slice(&(self.dtype as i32).to_le_bytes());
        b[12..16].copy_from_slice(&(ndim as i32).to_le_bytes());
        b[16..20].copy_from_slice(&(self.layout_kind as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.data_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.data_bytes.to_le_bytes());
        for (at, shape) in [
            (GLOBAL_SHAPE_AT, &self.global_shape),
            (LOCAL_SHAPE_AT, &self.local_shape),
        ] {
            for i in 0..MAX_TENSOR_DIMS {
                let d = if i < ndim {
                    shape.get(i).copied().unwrap_or(-1)
                } else {
                    -1
                };
                b[at + 8 * i..at + 8 * i + 8].copy_from_slice(&d.to_le_bytes());
            }
        }
        b[AXIS_COUNT_AT..AXIS_COUNT_AT + 4].copy_from_slice(&(axes.len() as u32).to_le_bytes());
        for (i, a) in axes.iter().enumerate() {
            let at = AXES_AT + i * AXIS_BYTES;
            for (j, v) in [
                a.kind,
                a.axis_index,
                a.shard_rank,
                a.shard_count,
                a.split_dim,
                a.reserved0,
            ]
            .into_iter()
            .enumerate()
            {
                b[at + 4 * j..at + 4 * j + 4].copy_from_slice(&v.to_le_bytes());
            }
            b[at + 24..at + 32].copy_from_slice(&a.reserved1.to_le_bytes());
        }
        b
    }

    /// Parses and validates the header at the start of an object of `total_len` bytes whose
    /// first bytes are `bytes` (at least 304 of them must be present).
    pub fn decode(bytes: &[u8], total_len: u64) -> Result<TensorMetadata, TensorHeaderError> {
        if bytes.len() < TENSOR_METADATA_BYTES || total_len < TENSOR_METADATA_BYTES as u64 {
            return Err(TensorHeaderError::TooShort(
                total_len.min(bytes.len() as u64),
            ));
        }
        let b = &bytes[..TENSOR_METADATA_BYTES];
        let (magic, version, header_size) = (u32_at(b, 0), u16_at(b, 4), u16_at(b, 6));
        if magic != TENSOR_MAGIC
            || version != TENSOR_VERSION
            || header_size as usize != TENSOR_METADATA_BYTES
        {
            return Err(TensorHeaderError::BadPreamble {
                magic,
                version,
                header_size,
            });
        }
        let raw_dtype = i32_at(b, 8);
        let dtype =
            TensorDtype::from_i32(raw_dtype).ok_or(TensorHeaderError::BadDtype(raw_dtype))?;
        let raw_ndim = i32_at(b, 12);
        let ndim = usize::try_from(raw_ndim)
            .ok()
            .filter(|n| *n <= MAX_TENSOR_DIMS)
            .ok_or(TensorHeaderError::BadNdim(raw_ndim))?;
        let axis_count = u32_at(b, AXIS_COUNT_AT);
        if axis_count as usize > MAX_LAYOUT_AXES {
            return Err(TensorHeaderError::BadAxisCount(axis_count));
        }
        let layout_kind = match u32_at(b, 16) {
            0 => LayoutKind::Full,
            1 => LayoutKind::Shard,
            k => return Err(TensorHeaderError::BadLayoutKind(k)),
        };
        let data_offset = u64_at(b, 24);
        if data_offset < TENSOR_METADATA_BYTES as u64 || data_offset > total_len {
            return Err(TensorHeaderError::BadDataOffset {
                offset: data_offset,
                total: total_len,
            });
        }
        let data_bytes = u64_at(b, 32);
        if data_bytes != total_len - data_offset {
            return Err(TensorHeaderError::BadDataBytes {
                data_bytes,
                expected: total_len - data_offset,
            });
        }
        let mut shapes = [Vec::with_capacity(ndim), Vec::with_capacity(ndim)];
        for (s, at) in [GLOBAL_SHAPE_AT, LOCAL_SHAPE_AT].into_iter().enumerate() {
            for i in 0..MAX_TENSOR_DIMS {
                let d = i64_at(b, at + 8 * i);
                let ok = if i < ndim { d >= 0 } else { d == -1 };
                if !ok {
                    return Err(TensorHeaderError::BadShape { dim: i, value: d });
                }
                if i < ndim {
                    shapes[s].push(d);
                }
            }
        }
        let [global_shape, local_shape] = shapes;
        let needed = element_count(&local_shape).and_then(|n| n.checked_mul(dtype.element_bytes()));
        if needed != Some(data_bytes) {
            return Err(TensorHeaderError::ShapeSizeMismatch {
                needed,
                dtype,
                data_bytes,
            });
        }
        let mut axes = Vec::with_capacity(axis_count as usize);
        for index in 0..axis_count as usize {
            let at = AXES_AT + index * AXIS_BYTES;
            let a = LayoutAxis {
                kind: i32_at(b, at),
                axis_index: i32_at(b, at + 4),
                shard_rank: i32_at(b, at + 8),
                shard_count: i32_at(b, at + 12),
                split_dim: i32_at(b, at + 16),
                reserved0: i32_at(b, at + 20),
                reserved1: i64_at(b, at + 24),
            };
            let reason = if !(AXIS_DP..=AXIS_RESERVED).contains(&a.kind) {
                Some("kind out of range")
            } else if a.shard_count <= 0 || a.shard_rank < 0 || a.shard_rank >= a.shard_count {
                Some("shard rank not in 0..shard_count")
            } else if a.split_dim < -1 || a.split_dim >= raw_ndim {
                Some("split_dim not -1 or below ndim")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(TensorHeaderError::BadAxis { index, reason });
            }
            axes.push(a);
        }
        Ok(TensorMetadata {
            dtype,
            layout_kind,
            global_shape,
            local_shape,
            axes,
            data_offset,
            data_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header of a float32 [2, 3] tensor, written out field by field as upstream lays
    /// out the C struct.
    fn hand_built_f32_2x3() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"NOOM");
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&304u16.to_le_bytes());
        b.extend_from_slice(&0i32.to_le_bytes()); // FLOAT32
        b.extend_from_slice(&2i32.to_le_bytes()); // ndim
        b.extend_from_slice(&0u32.to_le_bytes()); // FULL
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&304u64.to_le_bytes());
        b.extend_from_slice(&24u64.to_le_bytes());
        for _ in 0..2 {
            for d in [2i64, 3, -1, -1, -1, -1, -1, -1] {
                b.extend_from_slice(&d.to_le_bytes());
            }
        }
        b.extend_from_slice(&[0u8; 8]); // axis_count, reserved0
        b.extend_from_slice(&[0u8; 128]);
        b
    }

    #[test]
    fn encodes_byte_for_byte_like_upstream() {
        let m = TensorMetadata::full(TensorDtype::Float32, &[2, 3]).unwrap();
        let enc = m.encode();
        assert_eq!(enc.as_slice(), hand_built_f32_2x3().as_slice());
        assert_eq!(TensorMetadata::decode(&enc, 304 + 24), Ok(m));
    }

    #[test]
    fn every_dtype_and_zero_elements_round_trip() {
        for dtype in TensorDtype::ALL {
            assert_eq!(TensorDtype::from_i32(dtype as i32), Some(dtype));
            assert_eq!(
                TensorDtype::from_torch_name(dtype.torch_name()),
                Some(dtype)
            );
            for shape in [
                &[][..],
                &[0],
                &[2, 0, 3],
                &[4, 5],
                &[1, 1, 1, 1, 1, 1, 1, 2],
            ] {
                let m = TensorMetadata::full(dtype, shape).unwrap();
                let total = 304 + m.data_bytes;
                assert_eq!(TensorMetadata::decode(&m.encode(), total).as_ref(), Ok(&m));
            }
        }
        assert_eq!(TensorDtype::from_i32(15), None);
        assert_eq!(TensorDtype::from_i32(-1), None);
        assert!(TensorMetadata::full(TensorDtype::Int8, &[1; 9]).is_none());
    }

    #[test]
    fn tp_shard_layout() {
        let m = TensorMetadata::tp_shard(TensorDtype::Bfloat16, &[8, 4], &[2, 4], 3, 4, 0).unwrap();
        let b = m.encode();
        assert_eq!(u32_at(&b, 16), 1);
        assert_eq!(u32_at(&b, AXIS_COUNT_AT), 1);
        assert_eq!(i32_at(&b, AXES_AT), AXIS_TP);
        assert_eq!(i32_at(&b, AXES_AT + 8), 3);
        assert_eq!(i32_at(&b, AXES_AT + 12), 4);
        assert_eq!(i64_at(&b, AXES_AT + 24), 2);
        assert_eq!(TensorMetadata::decode(&b, 304 + 16), Ok(m));
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        let good = TensorMetadata::full(TensorDtype::Float32, &[2, 3])
            .unwrap()
            .encode();
        let total = 304 + 24;
        let bad = |at: usize, bytes: &[u8]| {
            let mut b = good;
            b[at..at + bytes.len()].copy_from_slice(bytes);
            TensorMetadata::decode(&b, total)
        };
        assert!(bad(0, b"MOON").is_err());
        assert!(bad(4, &2u16.to_le_bytes()).is_err());
        assert!(bad(8, &15i32.to_le_bytes()).is_err());
        assert!(bad(12, &9i32.to_le_bytes()).is_err());
        assert!(bad(16, &2u32.to_le_bytes()).is_err());
        assert!(bad(24, &303u64.to_le_bytes()).is_err());
        assert!(bad(32, &23u64.to_le_bytes()).is_err());
        assert!(bad(GLOBAL_SHAPE_AT + 16, &0i64.to_le_bytes()).is_err());
        assert!(bad(LOCAL_SHAPE_AT, &(-2i64).to_le_bytes()).is_err());
        assert!(bad(AXIS_COUNT_AT, &5u32.to_le_bytes()).is_err());
        assert!(TensorMetadata::decode(&good, total + 1).is_err());
        assert!(TensorMetadata::decode(&good[..303], total).is_err());
        // An axis with rank >= count.
        let mut b = good;
        b[AXIS_COUNT_AT..AXIS_COUNT_AT + 4].copy_from_slice(&1u32.to_le_bytes());
        b[AXES_AT + 8..AXES_AT + 12].copy_from_slice(&2i32.to_le_bytes());
        b[AXES_AT + 12..AXES_AT + 16].copy_from_slice(&2i32.to_le_bytes());
        assert!(TensorMetadata::decode(&b, total).is_err());
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
                               extra in 0u64..1 << 40) {
            let total = bytes.len() as u64 + extra;
            if let Ok(m) = TensorMetadata::decode(&bytes, total) {
                let again = m.encode();
                proptest::prop_assert_eq!(TensorMetadata::decode(&again, total), Ok(m));
            }
        }
    }
}
