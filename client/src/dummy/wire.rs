//! The wire between a dummy client and the standalone `mooncake_client` that serves it.
//!
//! One stream connection per dummy client on the abstract unix socket
//! [`socket_name`]`(port)`. Every message is a frame: a `u32` little-endian payload length (at
//! most [`FRAME_MAX_BYTES`]), then the payload, a [`Request`] (dummy to server) or a
//! [`Response`] (server to dummy) in `protocol::wire`'s encoding: a `u8` tag, then the fields
//! in order. The dummy sends one request and waits for its response; the first request on a
//! connection is a [`Request::Hello`], anything else first is refused and the connection
//! closed. `docs/protocol.md` ("Dummy client wire") has the tables.
//!
//! Addresses in requests are the dummy's own addresses inside the shared region it offered in
//! its `Hello`; the server translates and bounds-checks each one, so a request can never make
//! the server touch memory outside that region.
//!
//! Invariant: decoding never panics and never allocates more than a small multiple of its
//! input (fuzzed by `fuzz/fuzz_targets/dummy_wire.rs`).

use crate::limits::FRAME_MAX_BYTES;
use protocol::wire::{DecodeError, Reader, Wire};
use protocol::{wire_struct, ReplicateConfig, TaskInfo, Uuid};

/// Version in `Hello`; a server refuses any other (2 since `ReplicateConfig` carries
/// `group_ids`, 3 since ranged reads and replica tasks).
pub const WIRE_VERSION: u32 = 3;

/// The abstract unix socket name (without the leading NUL) a standalone client started with
/// `--port=port` listens on for dummy clients.
pub fn socket_name(port: u16) -> String {
    format!("mooncake-rs-dummy/{port}")
}

/// A range of the dummy's shared region, in the dummy's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub addr: u64,
    pub len: u64,
}
wire_struct!(Range {
    addr: u64,
    len: u64
});

/// One key and the range that holds (put) or receives (get) its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub addr: u64,
    pub len: u64,
}
wire_struct!(Item {
    key: String,
    addr: u64,
    len: u64
});

/// Bytes `[offset, offset + len)` of the object `key`, read into the region at `addr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRead {
    pub key: String,
    pub offset: u64,
    pub addr: u64,
    pub len: u64,
}
wire_struct!(RangeRead {
    key: String,
    offset: u64,
    addr: u64,
    len: u64
});

/// Dummy to server.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// First message: the dummy exported its shared region (a memfd) under the same-host
    /// segment name `shm_name` (`dataplane::mem::shm`); the server maps it and checks that it
    /// is `[base, base + len)` of the dummy.
    Hello {
        version: u32,
        shm_name: String,
        base: u64,
        len: u64,
    },
    /// `put` / `upsert` of the concatenation of `parts`.
    Put {
        upsert: bool,
        config: ReplicateConfig,
        key: String,
        parts: Vec<Range>,
    },
    /// Batch put / upsert, one range per key.
    BatchPut {
        upsert: bool,
        config: ReplicateConfig,
        items: Vec<Item>,
    },
    /// Reads each whole object into its range; answers each object's size or a code.
    GetInto { items: Vec<Item> },
    /// Each object's size or a code.
    GetSize { keys: Vec<String> },
    /// 1, 0 or a code per key.
    IsExist { keys: Vec<String> },
    /// 0 or a code per key.
    Remove { keys: Vec<String>, force: bool },
    /// Objects removed, or a code.
    RemoveAll { force: bool },
    /// Objects removed, or a code.
    RemoveByRegex { pattern: String, force: bool },
    /// The standalone client's `health_check` (0, 1, 2).
    Health,
    /// Ranged reads into the region: per read the bytes read or a code (`INVALID_PARAMS` for
    /// a range past the object's end).
    ReadRanges { reads: Vec<RangeRead> },
    /// `create_copy_task` (no `source`, any number of targets) or `create_move_task`
    /// (`source`, one target): [`Response::TaskCreated`], or one code.
    CreateTask {
        key: String,
        targets: Vec<String>,
        source: Option<String>,
    },
    /// `query_task`: [`Response::Task`], or one code.
    QueryTask { id: Uuid },
}

/// Server to dummy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The `Hello` was accepted; `hostname` is the standalone client's name.
    Welcome { version: u32, hostname: String },
    /// One value per key of the request (one for the single-valued requests): a size, a count
    /// or 0 / 1 on success, a negative `ErrorCode` otherwise.
    Codes(Vec<i64>),
    /// The request was refused as a whole (`code` a negative `ErrorCode`, `why` for the log).
    Refused { code: i32, why: String },
    /// The id of the task `CreateTask` made.
    TaskCreated { id: Uuid },
    /// The state of the task `QueryTask` named.
    Task(TaskInfo),
}

fn tag_error(what: &'static str, got: u8) -> DecodeError {
    DecodeError::Invalid {
        what,
        got: u64::from(got),
    }
}

impl Wire for Request {
    const MIN_BYTES: usize = 1;

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Request::Hello {
                version,
                shm_name,
                base,
                len,
            } => {
                out.push(0);
                version.encode(out);
                shm_name.encode(out);
                base.encode(out);
                len.encode(out);
            }
            Request::Put {
                upsert,
                config,
                key,
                parts,
            } => {
                out.push(1);
                upsert.encode(out);
                config.encode(out);
                key.encode(out);
                parts.encode(out);
            }
            Request::BatchPut {
                upsert,
                config,
                items,
            } => {
                out.push(2);
                upsert.encode(out);
                config.encode(out);
                items.encode(out);
            }
            Request::GetInto { items } => {
                out.push(3);
                items.encode(out);
            }
            Request::GetSize { keys } => {
                out.push(4);
                keys.encode(out);
            }
            Request::IsExist { keys } => {
                out.push(5);
                keys.encode(out);
            }
            Request::Remove { keys, force } => {
                out.push(6);
                keys.encode(out);
                force.encode(out);
            }
            Request::RemoveAll { force } => {
                out.push(7);
                force.encode(out);
            }
            Request::RemoveByRegex { pattern, force } => {
                out.push(8);
                pattern.encode(out);
                force.encode(out);
            }
            Request::Health => out.push(9),
            Request::ReadRanges { reads } => {
                out.push(10);
                reads.encode(out);
            }
            Request::CreateTask {
                key,
                targets,
                source,
            } => {
                out.push(11);
                key.encode(out);
                targets.encode(out);
                source.encode(out);
            }
            Request::QueryTask { id } => {
                out.push(12);
                id.encode(out);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match u8::decode(r)? {
            0 => Request::Hello {
                version: u32::decode(r)?,
                shm_name: String::decode(r)?,
                base: u64::decode(r)?,
                len: u64::decode(r)?,
            },
            1 => Request::Put {
                upsert: bool::decode(r)?,
                config: ReplicateConfig::decode(r)?,
                key: String::decode(r)?,
                parts: Vec::decode(r)?,
            },
            2 => Request::BatchPut {
                upsert: bool::decode(r)?,
                config: ReplicateConfig::decode(r)?,
                items: Vec::decode(r)?,
            },
            3 => Request::GetInto {
                items: Vec::decode(r)?,
            },
            4 => Request::GetSize {
                keys: Vec::decode(r)?,
            },
            5 => Request::IsExist {
                keys: Vec::decode(r)?,
            },
            6 => Request::Remove {
                keys: Vec::decode(r)?,
                force: bool::decode(r)?,
            },
            7 => Request::RemoveAll {
                force: bool::decode(r)?,
            },
            8 => Request::RemoveByRegex {
                pattern: String::decode(r)?,
                force: bool::decode(r)?,
            },
            9 => Request::Health,
            10 => Request::ReadRanges {
                reads: Vec::decode(r)?,
            },
            11 => Request::CreateTask {
                key: String::decode(r)?,
                targets: Vec::decode(r)?,
                source: Option::decode(r)?,
            },
            12 => Request::QueryTask {
                id: Uuid::decode(r)?,
            },
            t => return Err(tag_error("dummy request tag", t)),
        })
    }
}

impl Wire for Response {
    const MIN_BYTES: usize = 1;

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Response::Welcome { version, hostname } => {
                out.push(0);
                version.encode(out);
                hostname.encode(out);
            }
            Response::Codes(v) => {
                out.push(1);
                v.encode(out);
            }
            Response::Refused { code, why } => {
                out.push(2);
                code.encode(out);
                why.encode(out);
            }
            Response::TaskCreated { id } => {
                out.push(3);
                id.encode(out);
            }
            Response::Task(t) => {
                out.push(4);
                t.encode(out);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match u8::decode(r)? {
            0 => Response::Welcome {
                version: u32::decode(r)?,
                hostname: String::decode(r)?,
            },
            1 => Response::Codes(Vec::decode(r)?),
            2 => Response::Refused {
                code: i32::decode(r)?,
                why: String::decode(r)?,
            },
            3 => Response::TaskCreated {
                id: Uuid::decode(r)?,
            },
            4 => Response::Task(TaskInfo::decode(r)?),
            t => return Err(tag_error("dummy response tag", t)),
        })
    }
}

/// Writes one frame holding `msg`.
pub fn write_frame<W: std::io::Write, M: Wire>(w: &mut W, msg: &M) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4];
    msg.encode(&mut buf);
    let len = buf.len() - 4;
    if len > FRAME_MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("dummy frame of {len} bytes exceeds {FRAME_MAX_BYTES}"),
        ));
    }
    buf[..4].copy_from_slice(&(len as u32).to_le_bytes());
    w.write_all(&buf)
}

/// Reads one frame's payload; `Ok(None)` on a clean end of stream before a frame starts.
pub fn read_frame<R: std::io::Read>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("dummy frame of {len} bytes exceeds {FRAME_MAX_BYTES}"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip() {
        let reqs = vec![
            Request::Hello {
                version: WIRE_VERSION,
                shm_name: "dummy/1/2".into(),
                base: 0x7000_0000,
                len: 1 << 20,
            },
            Request::Put {
                upsert: true,
                config: ReplicateConfig::default(),
                key: "k".into(),
                parts: vec![Range { addr: 1, len: 2 }, Range { addr: 3, len: 4 }],
            },
            Request::BatchPut {
                upsert: false,
                config: ReplicateConfig::default(),
                items: vec![Item {
                    key: "a".into(),
                    addr: 5,
                    len: 6,
                }],
            },
            Request::GetInto { items: vec![] },
            Request::GetSize {
                keys: vec!["x".into()],
            },
            Request::IsExist { keys: vec![] },
            Request::Remove {
                keys: vec!["y".into()],
                force: true,
            },
            Request::RemoveAll { force: false },
            Request::RemoveByRegex {
                pattern: "^a".into(),
                force: true,
            },
            Request::Health,
            Request::ReadRanges {
                reads: vec![RangeRead {
                    key: "r".into(),
                    offset: 7,
                    addr: 8,
                    len: 9,
                }],
            },
            Request::CreateTask {
                key: "c".into(),
                targets: vec!["s1".into(), "s2".into()],
                source: None,
            },
            Request::CreateTask {
                key: "m".into(),
                targets: vec!["s2".into()],
                source: Some("s1".into()),
            },
            Request::QueryTask {
                id: Uuid::from_parts(1, 2),
            },
        ];
        for r in reqs {
            assert_eq!(Request::from_bytes(&r.to_bytes()).unwrap(), r);
        }
        for r in [
            Response::Welcome {
                version: 1,
                hostname: "h:1".into(),
            },
            Response::Codes(vec![0, -704, 1 << 40]),
            Response::Refused {
                code: -600,
                why: "no".into(),
            },
            Response::TaskCreated {
                id: Uuid::from_parts(3, 4),
            },
            Response::Task(TaskInfo {
                id: Uuid::from_parts(5, 6),
                task_type: protocol::TaskType::ReplicaMove,
                status: protocol::TaskStatus::Success,
                created_at_ms_epoch: 7,
                last_updated_at_ms_epoch: 8,
                assigned_client: Uuid::from_parts(9, 10),
                message: "done".into(),
            }),
        ] {
            assert_eq!(Response::from_bytes(&r.to_bytes()).unwrap(), r);
        }
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert!(Request::from_bytes(&[]).is_err());
        assert!(Request::from_bytes(&[42]).is_err());
        assert!(Request::from_bytes(&[9, 0]).is_err()); // trailing byte
        assert!(Response::from_bytes(&[1, 0xff, 0xff, 0xff, 0xff]).is_err()); // huge count
        let mut frame = Vec::new();
        frame.extend_from_slice(&(FRAME_MAX_BYTES as u32 + 1).to_le_bytes());
        assert!(read_frame(&mut &frame[..]).is_err());
        assert!(read_frame(&mut &[][..]).unwrap().is_none());
        assert!(read_frame(&mut &[1u8, 0][..]).is_err());
    }

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Request::Health).unwrap();
        let payload = read_frame(&mut &buf[..]).unwrap().unwrap();
        assert_eq!(Request::from_bytes(&payload).unwrap(), Request::Health);
    }
}
