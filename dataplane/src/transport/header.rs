//! Frames of the one-sided TCP data plane.
//!
//! A connection carries requests from the client and responses from the server. Each
//! request is a 32-byte header, followed for a WRITE or a CATALOG_PUT by exactly `len`
//! payload bytes. Each
//! response is a 24-byte header followed by exactly `len` payload bytes (the data of a
//! successful READ; 0 otherwise). All integers are little-endian.
//!
//! ```text
//! Request header (32 bytes)
//!  0               4       5       6               8
//!  +---------------+-------+-------+---------------+
//!  | magic "MCDQ"  | ver=1 | opcode| flags = 0     |   opcode: 0 READ, 1 WRITE, 2 CATALOG_PUT,
//!  |               |       |       |               |           3 FENCE
//!  +---------------+-------+-------+---------------+
//!  8                                               16
//!  | request_id (u64): echoed in the response      |
//!  16                                              24
//!  | addr (u64): absolute address at the server    |
//!  24                                              32
//!  | len (u64): bytes, 1 ..= REQUEST_PAYLOAD_MAX   |
//!  +-----------------------------------------------+
//!  then, for WRITE and CATALOG_PUT: len payload bytes
//!
//! CATALOG_PUT records the object just written at `addr` in the server's catalog; its payload
//! is a record (object length, flags, key; see `recovery::catalog`), at most
//! CATALOG_RECORD_MAX_BYTES, and the range checked is [addr, addr + object length).
//!
//! FENCE (`len` 0, no payload) declares that the WRITEs that follow on this connection belong
//! to writes of the master's term `addr`; a server whose memory is fenced at a later term
//! (`recovery::Catalog::fence`) refuses them with ERR_METADATA. A connection that declares nothing
//! (term 0) is not fenced: the raw transfer engine's writes have no term.
//!
//! Response header (24 bytes)
//!  0               4               8
//!  +---------------+---------------+
//!  | magic "MCDR"  | status (i32)  |   0 = OK, else a TE error code (-3 not registered, ...)
//!  +---------------+---------------+
//!  8                               16
//!  | request_id (u64)              |
//!  16                              24
//!  | len (u64): payload that follows (READ OK: the request's len; otherwise 0)
//!  +-------------------------------+
//!  then len payload bytes
//! ```
//!
//! Invariants: decoding never panics; a request header that decodes has a known version and
//! opcode, zero flags, and `len <= REQUEST_PAYLOAD_MAX_BYTES` (`CATALOG_RECORD_MAX_BYTES` for
//! a CATALOG_PUT), so a peer cannot make the
//! receiver expect an unbounded payload. `len == 0` decodes (it is well framed) and is
//! refused by the server with `ERR_INVALID_ARGUMENT`.

use crate::limits::{CATALOG_RECORD_MAX_BYTES, REQUEST_PAYLOAD_MAX_BYTES};

/// Request magic, the bytes `MCDQ` on the wire.
pub const REQUEST_MAGIC: u32 = u32::from_le_bytes(*b"MCDQ");
/// Response magic, the bytes `MCDR` on the wire.
pub const RESPONSE_MAGIC: u32 = u32::from_le_bytes(*b"MCDR");
/// The only protocol version spoken.
pub const PROTOCOL_VERSION: u8 = 1;
/// Encoded size of a [`RequestHeader`].
pub const REQUEST_HEADER_BYTES: usize = 32;
/// Encoded size of a [`ResponseHeader`].
pub const RESPONSE_HEADER_BYTES: usize = 24;

/// Operation of a request, numbered as upstream's `TransferRequest::OpCode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Server sends `len` bytes from `addr`.
    Read = 0,
    /// Client sends `len` bytes; the server stores them at `addr`.
    Write = 1,
    /// Client sends a catalog record (`len` bytes); the server records the object at `addr`.
    CatalogPut = 2,
    /// The connection's WRITEs are of term `addr` (no payload, `len` 0).
    Fence = 3,
}

impl Opcode {
    /// Whether `len` payload bytes follow the header.
    pub fn has_payload(self) -> bool {
        matches!(self, Opcode::Write | Opcode::CatalogPut)
    }

    /// Largest `len` a request with this opcode may announce.
    pub fn len_max(self) -> u64 {
        match self {
            Opcode::Read | Opcode::Write => REQUEST_PAYLOAD_MAX_BYTES,
            Opcode::CatalogPut => CATALOG_RECORD_MAX_BYTES,
            Opcode::Fence => 0,
        }
    }
}

/// A decoded request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub opcode: Opcode,
    pub request_id: u64,
    pub addr: u64,
    pub len: u64,
}

/// A decoded response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    /// 0 for success, else a TE error code.
    pub status: i32,
    pub request_id: u64,
    pub len: u64,
}

/// Why a header did not decode. Each variant says what was expected and what arrived.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("header needs {expected} bytes, got {got}")]
    Short { expected: usize, got: usize },
    #[error("bad magic: expected {expected:#010x}, got {got:#010x}")]
    BadMagic { expected: u32, got: u32 },
    #[error("bad version: expected {expected}, got {got}")]
    BadVersion { expected: u8, got: u8 },
    #[error("bad opcode: expected 0 (READ), 1 (WRITE), 2 (CATALOG_PUT) or 3 (FENCE), got {got}")]
    BadOpcode { got: u8 },
    #[error("bad flags: expected 0, got {got:#06x}")]
    BadFlags { got: u16 },
    #[error("payload length {got} exceeds the maximum {max}")]
    TooLong { got: u64, max: u64 },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

impl RequestHeader {
    /// The little-endian encoding.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
        b[4] = PROTOCOL_VERSION;
        b[5] = self.opcode as u8;
        // b[6..8]: flags, zero.
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes the first [`REQUEST_HEADER_BYTES`] of `b`.
    pub fn decode(b: &[u8]) -> Result<RequestHeader, HeaderError> {
        if b.len() < REQUEST_HEADER_BYTES {
            return Err(HeaderError::Short {
                expected: REQUEST_HEADER_BYTES,
                got: b.len(),
            });
        }
        let magic = u32_at(b, 0);
        if magic != REQUEST_MAGIC {
            return Err(HeaderError::BadMagic {
                expected: REQUEST_MAGIC,
                got: magic,
            });
        }
        if b[4] != PROTOCOL_VERSION {
            return Err(HeaderError::BadVersion {
                expected: PROTOCOL_VERSION,
                got: b[4],
            });
        }
        let opcode = match b[5] {
            0 => Opcode::Read,
            1 => Opcode::Write,
            2 => Opcode::CatalogPut,
            3 => Opcode::Fence,
            got => return Err(HeaderError::BadOpcode { got }),
        };
        let flags = u16_at(b, 6);
        if flags != 0 {
            return Err(HeaderError::BadFlags { got: flags });
        }
        let len = u64_at(b, 24);
        if len > opcode.len_max() {
            return Err(HeaderError::TooLong {
                got: len,
                max: opcode.len_max(),
            });
        }
        Ok(RequestHeader {
            opcode,
            request_id: u64_at(b, 8),
            addr: u64_at(b, 16),
            len,
        })
    }

    /// The request id of a header that may not decode, for an error response; `None` when
    /// the bytes do not even carry the request magic.
    pub fn salvage_request_id(b: &[u8]) -> Option<u64> {
        (b.len() >= REQUEST_HEADER_BYTES && u32_at(b, 0) == REQUEST_MAGIC).then(|| u64_at(b, 8))
    }
}

impl ResponseHeader {
    /// The little-endian encoding.
    pub fn encode(&self) -> [u8; RESPONSE_HEADER_BYTES] {
        let mut b = [0u8; RESPONSE_HEADER_BYTES];
        b[0..4].copy_from_slice(&RESPONSE_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes the first [`RESPONSE_HEADER_BYTES`] of `b`.
    pub fn decode(b: &[u8]) -> Result<ResponseHeader, HeaderError> {
        if b.len() < RESPONSE_HEADER_BYTES {
            return Err(HeaderError::Short {
                expected: RESPONSE_HEADER_BYTES,
                got: b.len(),
            });
        }
        let magic = u32_at(b, 0);
        if magic != RESPONSE_MAGIC {
            return Err(HeaderError::BadMagic {
                expected: RESPONSE_MAGIC,
                got: magic,
            });
        }
        let len = u64_at(b, 16);
        if len > REQUEST_PAYLOAD_MAX_BYTES {
            return Err(HeaderError::TooLong {
                got: len,
                max: REQUEST_PAYLOAD_MAX_BYTES,
            });
        }
        Ok(ResponseHeader {
            status: u32_at(b, 4) as i32,
            request_id: u64_at(b, 8),
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_layout_is_the_documented_one() {
        let h = RequestHeader {
            opcode: Opcode::Write,
            request_id: 0x0102,
            addr: 0x1000,
            len: 5,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], b"MCDQ");
        assert_eq!(b[4], 1);
        assert_eq!(b[5], 1);
        assert_eq!(&b[6..8], &[0, 0]);
        assert_eq!(&b[8..16], &[2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..24], &[0, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[24..32], &[5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(RequestHeader::decode(&b), Ok(h));
    }

    #[test]
    fn response_layout_is_the_documented_one() {
        let h = ResponseHeader {
            status: -3,
            request_id: 9,
            len: 0,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], b"MCDR");
        assert_eq!(&b[4..8], &(-3i32).to_le_bytes());
        assert_eq!(ResponseHeader::decode(&b), Ok(h));
    }

    #[test]
    fn bad_requests_are_errors() {
        let good = RequestHeader {
            opcode: Opcode::Read,
            request_id: 1,
            addr: 2,
            len: 3,
        }
        .encode();
        let with = |at: usize, v: u8| {
            let mut b = good;
            b[at] = v;
            RequestHeader::decode(&b)
        };
        assert!(matches!(with(0, b'X'), Err(HeaderError::BadMagic { .. })));
        assert_eq!(
            with(4, 2),
            Err(HeaderError::BadVersion {
                expected: 1,
                got: 2
            })
        );
        assert_eq!(with(5, 4), Err(HeaderError::BadOpcode { got: 4 }));
        // FENCE carries no payload: a length is malformed.
        let fence = RequestHeader {
            opcode: Opcode::Fence,
            request_id: 1,
            addr: 7,
            len: 0,
        };
        assert_eq!(RequestHeader::decode(&fence.encode()), Ok(fence));
        assert_eq!(
            RequestHeader::decode(&RequestHeader { len: 1, ..fence }.encode()),
            Err(HeaderError::TooLong { got: 1, max: 0 })
        );
        let catalog = RequestHeader {
            opcode: Opcode::CatalogPut,
            request_id: 1,
            addr: 2,
            len: CATALOG_RECORD_MAX_BYTES,
        };
        assert_eq!(RequestHeader::decode(&catalog.encode()), Ok(catalog));
        let too_long = RequestHeader {
            len: CATALOG_RECORD_MAX_BYTES + 1,
            ..catalog
        };
        assert!(matches!(
            RequestHeader::decode(&too_long.encode()),
            Err(HeaderError::TooLong { .. })
        ));
        assert_eq!(with(7, 1), Err(HeaderError::BadFlags { got: 0x100 }));
        assert_eq!(
            with(31, 1),
            Err(HeaderError::TooLong {
                got: 1 << 56 | 3,
                max: REQUEST_PAYLOAD_MAX_BYTES
            })
        );
        assert_eq!(
            RequestHeader::decode(&good[..31]),
            Err(HeaderError::Short {
                expected: 32,
                got: 31
            })
        );
        assert_eq!(
            RequestHeader::salvage_request_id(&with_flags(good)),
            Some(1)
        );
        assert_eq!(RequestHeader::salvage_request_id(&[0u8; 32]), None);
    }

    fn with_flags(mut b: [u8; 32]) -> [u8; 32] {
        b[6] = 1;
        b
    }

    #[test]
    fn max_length_is_accepted_and_one_more_is_not() {
        let mut h = RequestHeader {
            opcode: Opcode::Read,
            request_id: 1,
            addr: 2,
            len: REQUEST_PAYLOAD_MAX_BYTES,
        };
        assert!(RequestHeader::decode(&h.encode()).is_ok());
        h.len += 1;
        assert!(matches!(
            RequestHeader::decode(&h.encode()),
            Err(HeaderError::TooLong { .. })
        ));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = RequestHeader::decode(&bytes);
            let _ = ResponseHeader::decode(&bytes);
            let _ = RequestHeader::salvage_request_id(&bytes);
        }

        #[test]
        fn round_trips(write in any::<bool>(), id in any::<u64>(), addr in any::<u64>(),
                       len in 0..=REQUEST_PAYLOAD_MAX_BYTES, status in any::<i32>()) {
            let opcode = if write { Opcode::Write } else { Opcode::Read };
            let h = RequestHeader { opcode, request_id: id, addr, len };
            prop_assert_eq!(RequestHeader::decode(&h.encode()), Ok(h));
            let r = ResponseHeader { status, request_id: id, len };
            prop_assert_eq!(ResponseHeader::decode(&r.encode()), Ok(r));
        }
    }
}
