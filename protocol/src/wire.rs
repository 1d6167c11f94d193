//! The little-endian encoding of control messages.
//!
//! Primitives (all little-endian, no padding, no alignment):
//!
//! | type            | bytes                                                       |
//! |-----------------|-------------------------------------------------------------|
//! | `bool`          | 1 byte, 0 or 1 (anything else is an error)                  |
//! | `u8/u16/u32/u64/i32/i64` | 1/2/4/8/4/8 bytes                                  |
//! | `f64`           | 8 bytes, IEEE-754 bits                                      |
//! | `String`        | `u32` length, then that many UTF-8 bytes                    |
//! | `Vec<T>`        | `u32` count, then each element                              |
//! | `Option<T>`     | `u8` tag (0 = None, 1 = Some), then `T` when Some           |
//! | structs         | their fields in declaration order                           |
//! | enums (C-like)  | `u8` discriminant                                           |
//!
//! Invariant: [`Wire::decode`] never panics and never reserves more than the input it was given
//! justifies: a count is checked against the bytes that remain (each element takes at least
//! its `MIN_BYTES`), and a list reserves room for no more elements than the remaining bytes
//! would hold in memory, so a claimed count only costs memory once its elements are decoded.
//! A reader made with [`Reader::with_count_max`] also refuses any count above that maximum
//! (requests: `BATCH_MAX_ITEMS`), before anything is reserved.

use crate::limits::STRING_MAX_BYTES;

/// Why bytes could not be decoded. Each variant says what was expected and what arrived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated input: needed {needed} more bytes, {remaining} remain")]
    Truncated { needed: usize, remaining: usize },
    #[error("invalid {what}: got {got}")]
    Invalid { what: &'static str, got: u64 },
    #[error("{what} too long: {len} > {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("invalid utf-8 in string")]
    Utf8,
    #[error("{0} trailing bytes after message")]
    Trailing(usize),
}

/// A cursor over bytes being decoded.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Largest element count [`Reader::count`] accepts (besides the bytes-left bound).
    count_max: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self::with_count_max(buf, usize::MAX)
    }

    /// A reader that refuses every list longer than `count_max` elements, at any depth.
    pub fn with_count_max(buf: &'a [u8], count_max: usize) -> Self {
        Reader {
            buf,
            pos: 0,
            count_max,
        }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated {
                needed: n,
                remaining: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// A borrowed string with the checks of `String::decode` (length bound, UTF-8), for hot
    /// paths that look keys up without allocating them.
    pub fn str_ref(&mut self) -> Result<&'a str, DecodeError> {
        let n = u32::decode(self)? as usize;
        if n > STRING_MAX_BYTES {
            return Err(DecodeError::TooLong {
                what: "string",
                len: n,
                max: STRING_MAX_BYTES,
            });
        }
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Utf8)
    }

    /// Fails unless every byte was consumed.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }

    /// Reads a `u32` element count and checks it against the reader's count maximum and the
    /// bytes left, given that every element takes at least `min_elem_bytes` bytes.
    pub fn count(
        &mut self,
        what: &'static str,
        min_elem_bytes: usize,
    ) -> Result<usize, DecodeError> {
        let n = u32::decode(self)? as usize;
        if n > self.count_max {
            return Err(DecodeError::TooLong {
                what,
                len: n,
                max: self.count_max,
            });
        }
        let need = n.saturating_mul(min_elem_bytes.max(1));
        if need > self.remaining() {
            return Err(DecodeError::TooLong {
                what,
                len: n,
                max: self.remaining(),
            });
        }
        Ok(n)
    }
}

/// A value with a wire encoding.
pub trait Wire: Sized {
    /// Smallest number of bytes any encoding of this type takes (used to bound counts).
    const MIN_BYTES: usize;
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError>;

    /// Decodes a whole buffer, rejecting trailing bytes.
    fn from_bytes(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(buf);
        let v = Self::decode(&mut r)?;
        r.finish()?;
        Ok(v)
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN_BYTES: usize = std::mem::size_of::<$t>();
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
wire_int!(u8, u16, u32, u64, i32, i64);

impl Wire for f64 {
    const MIN_BYTES: usize = 8;
    fn encode(&self, out: &mut Vec<u8>) {
        self.to_bits().encode(out)
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(f64::from_bits(u64::decode(r)?))
    }
}

impl Wire for bool {
    const MIN_BYTES: usize = 1;
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self as u8)
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::decode(r)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::Invalid {
                what: "bool",
                got: b as u64,
            }),
        }
    }
}

/// Encodes `s` as a [`String`] is encoded (u32 length, then the bytes), for encoders that
/// hold a borrowed string.
pub fn encode_str(s: &str, out: &mut Vec<u8>) {
    (s.len() as u32).encode(out);
    out.extend_from_slice(s.as_bytes());
}

impl Wire for String {
    const MIN_BYTES: usize = 4;
    fn encode(&self, out: &mut Vec<u8>) {
        encode_str(self, out);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = u32::decode(r)? as usize;
        if n > STRING_MAX_BYTES {
            return Err(DecodeError::TooLong {
                what: "string",
                len: n,
                max: STRING_MAX_BYTES,
            });
        }
        let bytes = r.take(n)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Utf8)
    }
}

impl<T: Wire> Wire for Vec<T> {
    const MIN_BYTES: usize = 4;
    fn encode(&self, out: &mut Vec<u8>) {
        (self.len() as u32).encode(out);
        for v in self {
            v.encode(out);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.count("vec", T::MIN_BYTES)?;
        let mut v = Vec::with_capacity(reserve_for::<T>(n, r.remaining()));
        for _ in 0..n {
            v.push(T::decode(r)?);
        }
        Ok(v)
    }
}

/// Elements to reserve for a list of `n` with `remaining` bytes left to decode: no more than
/// those bytes would hold in memory. An element can take several times its smallest encoding
/// in memory (a `String` is 24 bytes, its encoding 4), so reserving `n` would let a frame make
/// the decoder reserve several times the frame before one element is known to be there; past
/// this, the list grows as its elements decode.
pub fn reserve_for<T>(n: usize, remaining: usize) -> usize {
    n.min(remaining / std::mem::size_of::<T>().max(1))
}

impl<T: Wire> Wire for Option<T> {
    const MIN_BYTES: usize = 1;
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode(out);
            }
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::decode(r)? {
            0 => Ok(None),
            1 => Ok(Some(T::decode(r)?)),
            b => Err(DecodeError::Invalid {
                what: "option tag",
                got: b as u64,
            }),
        }
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    const MIN_BYTES: usize = A::MIN_BYTES + B::MIN_BYTES;
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
        self.1.encode(out);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok((A::decode(r)?, B::decode(r)?))
    }
}

/// Implements [`Wire`] for a struct by encoding its fields in order.
#[macro_export]
macro_rules! wire_struct {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        impl $crate::wire::Wire for $name {
            const MIN_BYTES: usize = 0 $(+ <$ty as $crate::wire::Wire>::MIN_BYTES)*;
            fn encode(&self, _out: &mut Vec<u8>) {
                $($crate::wire::Wire::encode(&self.$field, _out);)*
            }
            fn decode(_r: &mut $crate::wire::Reader<'_>) -> Result<Self, $crate::wire::DecodeError> {
                Ok($name { $($field: <$ty as $crate::wire::Wire>::decode(_r)?,)* })
            }
        }
    };
}

/// Implements [`Wire`] for a C-like enum as a `u8` discriminant.
#[macro_export]
macro_rules! wire_enum {
    ($name:ident { $($variant:ident = $value:expr),* $(,)? }) => {
        impl $crate::wire::Wire for $name {
            const MIN_BYTES: usize = 1;
            fn encode(&self, out: &mut Vec<u8>) {
                out.push(*self as u8);
            }
            fn decode(r: &mut $crate::wire::Reader<'_>) -> Result<Self, $crate::wire::DecodeError> {
                match <u8 as $crate::wire::Wire>::decode(r)? {
                    $($value => Ok($name::$variant),)*
                    b => Err($crate::wire::DecodeError::Invalid { what: stringify!($name), got: b as u64 }),
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_round_trip() {
        let v: (u64, (String, Vec<Option<i32>>)) = (
            u64::MAX,
            ("ключ".to_string(), vec![None, Some(-5), Some(i32::MAX)]),
        );
        assert_eq!(
            <(u64, (String, Vec<Option<i32>>))>::from_bytes(&v.to_bytes()).unwrap(),
            v
        );
    }

    #[test]
    fn borrowed_strings_decode_like_owned_ones() {
        for bytes in [
            "ключ".to_string().to_bytes(),
            vec![2, 0, 0, 0, 0xff, 0xfe],
            vec![9, 0, 0, 0, b'a'],
            vec![1, 0],
        ] {
            let owned = String::decode(&mut Reader::new(&bytes));
            let borrowed = Reader::new(&bytes).str_ref().map(str::to_owned);
            assert_eq!(owned, borrowed, "{bytes:?}");
        }
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut buf = Vec::new();
        u32::MAX.encode(&mut buf);
        assert!(matches!(
            Vec::<u64>::from_bytes(&buf),
            Err(DecodeError::TooLong { .. })
        ));
        assert!(matches!(
            String::from_bytes(&buf),
            Err(DecodeError::TooLong { .. })
        ));
    }

    #[test]
    fn lists_reserve_no_more_than_the_bytes_left() {
        // 1,000 empty strings: 4 bytes each on the wire, 24 in memory.
        let n = 1000;
        assert_eq!(reserve_for::<String>(n, 4 * n), 4 * n / 24);
        assert_eq!(reserve_for::<u64>(n, 8 * n), n);
        assert_eq!(reserve_for::<()>(n, 0), 0);
        let v = Vec::<String>::from_bytes(&vec![String::new(); n].to_bytes()).unwrap();
        assert_eq!(v.len(), n);
    }

    #[test]
    fn a_count_maximum_refuses_longer_lists_at_any_depth() {
        let flat = vec![1u8, 2, 3].to_bytes();
        let nested = vec![vec![1u8, 2, 3]].to_bytes();
        for (bytes, max, ok) in [(&flat, 3, true), (&flat, 2, false), (&nested, 2, false)] {
            let mut r = Reader::with_count_max(bytes, max);
            let got = if bytes == &flat {
                Vec::<u8>::decode(&mut r).map(|_| ())
            } else {
                Vec::<Vec<u8>>::decode(&mut r).map(|_| ())
            };
            assert_eq!(got.is_ok(), ok, "{bytes:?} with max {max}");
        }
    }

    #[test]
    fn bad_bool_and_trailing_bytes_are_errors() {
        assert!(bool::from_bytes(&[2]).is_err());
        assert_eq!(u8::from_bytes(&[1, 2]), Err(DecodeError::Trailing(1)));
        assert!(u64::from_bytes(&[1, 2, 3]).is_err());
        assert_eq!(
            String::from_bytes(&[2, 0, 0, 0, 0xff, 0xfe]),
            Err(DecodeError::Utf8)
        );
    }
}
