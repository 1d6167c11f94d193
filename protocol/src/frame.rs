//! The control-RPC envelope: a length-prefixed, versioned frame with a request id.
//!
//! ```text
//!  0       4     5     6        8                16
//!  +-------+-----+-----+--------+----------------+----------------------+
//!  | len   | ver | kind| opcode | request_id     | body (len - 12 bytes) |
//!  | u32   | u8  | u8  | u16    | u64            |                      |
//!  +-------+-----+-----+--------+----------------+----------------------+
//! ```
//! All little-endian. `len` counts the bytes after itself (12 + body) and is at most
//! `12 + FRAME_PAYLOAD_MAX_BYTES`. `ver` is [`VERSION`]. `kind` is 0 for a request and 1 for a
//! response. A response repeats the request's `opcode` and `request_id`, so a client may keep
//! many requests in flight on one connection (pipelining) and match answers by id; the
//! server answers requests of one connection in the order it received them.

use crate::limits::FRAME_PAYLOAD_MAX_BYTES;

/// Protocol version carried in every frame: 5 since `ReplicateConfig` carries `group_ids`
/// (4: the upsert answers carry the object's soft pin; 3: `HeldObject` carries the soft pin;
/// 2: versioned catalogs; `docs/protocol.md`).
pub const VERSION: u8 = 5;
/// Bytes before the body.
pub const HEADER_BYTES: usize = 16;
/// Bytes of the header counted by `len`.
const LEN_COVERED_HEADER_BYTES: u32 = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Request = 0,
    Response = 1,
}

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub opcode: u16,
    pub request_id: u64,
    pub body_len: usize,
}

/// Why a frame was refused. A connection that sends one is closed: the stream can no longer
/// be trusted to be in step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {len} outside [{min}, {max}]")]
    Length { len: u64, min: u64, max: u64 },
    #[error("unsupported protocol version {got}, expected {expected}")]
    Version { got: u8, expected: u8 },
    #[error("invalid frame kind {0}")]
    Kind(u8),
}

impl Header {
    /// Parses the 16 header bytes.
    pub fn parse(b: &[u8; HEADER_BYTES]) -> Result<Header, FrameError> {
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let max = LEN_COVERED_HEADER_BYTES as u64 + FRAME_PAYLOAD_MAX_BYTES as u64;
        if len < LEN_COVERED_HEADER_BYTES || len as u64 > max {
            return Err(FrameError::Length {
                len: len as u64,
                min: LEN_COVERED_HEADER_BYTES as u64,
                max,
            });
        }
        if b[4] != VERSION {
            return Err(FrameError::Version {
                got: b[4],
                expected: VERSION,
            });
        }
        let kind = match b[5] {
            0 => Kind::Request,
            1 => Kind::Response,
            k => return Err(FrameError::Kind(k)),
        };
        Ok(Header {
            kind,
            opcode: u16::from_le_bytes([b[6], b[7]]),
            request_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            body_len: (len - LEN_COVERED_HEADER_BYTES) as usize,
        })
    }
}

/// Appends a frame header for a body of `body_len` bytes.
///
/// Panics if `body_len` exceeds [`FRAME_PAYLOAD_MAX_BYTES`]: callers build bodies from bounded
/// inputs and check with [`body_fits`] where the input is not bounded.
pub fn write_header(out: &mut Vec<u8>, kind: Kind, opcode: u16, request_id: u64, body_len: usize) {
    assert!(body_fits(body_len), "frame body {body_len} too large");
    out.extend_from_slice(&(body_len as u32 + LEN_COVERED_HEADER_BYTES).to_le_bytes());
    out.push(VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&opcode.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
}

/// Whether a body of this size can be framed.
pub fn body_fits(body_len: usize) -> bool {
    body_len <= FRAME_PAYLOAD_MAX_BYTES
}

/// Appends a whole frame: header then the body written by `body`. The length is patched in
/// after the body is written, so no intermediate buffer is needed.
pub fn encode_with(
    out: &mut Vec<u8>,
    kind: Kind,
    opcode: u16,
    request_id: u64,
    body: impl FnOnce(&mut Vec<u8>),
) -> Result<(), FrameError> {
    let start = out.len();
    write_header(out, kind, opcode, request_id, 0);
    body(out);
    let body_len = out.len() - start - HEADER_BYTES;
    if !body_fits(body_len) {
        out.truncate(start);
        return Err(FrameError::Length {
            len: body_len as u64,
            min: 0,
            max: FRAME_PAYLOAD_MAX_BYTES as u64,
        });
    }
    let len = body_len as u32 + LEN_COVERED_HEADER_BYTES;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// A frame borrowed from a receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct FrameRef<'a> {
    pub header: Header,
    pub body: &'a [u8],
}

/// Splits the first complete frame off `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((frame, consumed)))` for a frame,
/// and an error when the header is invalid (the connection must be closed).
pub fn split_frame(buf: &[u8]) -> Result<Option<(FrameRef<'_>, usize)>, FrameError> {
    let Some(head) = buf.first_chunk::<HEADER_BYTES>() else {
        return Ok(None);
    };
    let header = Header::parse(head)?;
    let total = HEADER_BYTES + header.body_len;
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some((
        FrameRef {
            header,
            body: &buf[HEADER_BYTES..total],
        },
        total,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_as_documented() {
        let mut out = Vec::new();
        encode_with(&mut out, Kind::Response, 0x0102, 0x1122334455667788, |b| {
            b.extend_from_slice(b"xyz")
        })
        .unwrap();
        assert_eq!(
            out,
            [
                15, 0, 0, 0, 5, 1, 2, 1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, b'x',
                b'y', b'z'
            ]
        );
        let (f, used) = split_frame(&out).unwrap().unwrap();
        assert_eq!(used, out.len());
        assert_eq!(f.header.opcode, 0x0102);
        assert_eq!(f.header.request_id, 0x1122334455667788);
        assert_eq!(f.body, b"xyz");
        assert_eq!(split_frame(&out[..out.len() - 1]).unwrap(), None);
        assert_eq!(split_frame(&out[..3]).unwrap(), None);
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut h = [0u8; HEADER_BYTES];
        h[0..4].copy_from_slice(&11u32.to_le_bytes());
        h[4] = VERSION;
        assert!(matches!(Header::parse(&h), Err(FrameError::Length { .. })));
        h[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Header::parse(&h), Err(FrameError::Length { .. })));
        h[0..4].copy_from_slice(&12u32.to_le_bytes());
        h[4] = 9;
        assert!(matches!(Header::parse(&h), Err(FrameError::Version { .. })));
        h[4] = VERSION;
        h[5] = 7;
        assert_eq!(Header::parse(&h), Err(FrameError::Kind(7)));
    }
}
