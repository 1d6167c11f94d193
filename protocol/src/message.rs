//! Control RPC messages: one request struct per operation, each with its reply type.
//!
//! A request travels as the body of a [`crate::frame`] whose `opcode` is [`Rpc::OP`]. A
//! response body is an `i32` status (0 or a negative [`ErrorCode`]) followed, when the status is
//! 0, by the encoded [`Rpc::Reply`]. Batch replies carry one such status (and value) per item,
//! so one bad key never fails its neighbours.

use crate::error::ErrorCode;
use crate::limits::BATCH_MAX_ITEMS;
use crate::types::*;
use crate::wire::{DecodeError, Reader, Wire};
use crate::wire_struct;

/// An operation of the control RPC.
pub trait Rpc: Wire + Clone {
    /// The frame opcode.
    const OP: u16;
    /// Human-readable name used in logs and metrics.
    const NAME: &'static str;
    /// What a successful call returns.
    type Reply: Wire;
}

impl Wire for () {
    const MIN_BYTES: usize = 0;
    fn encode(&self, _out: &mut Vec<u8>) {}
    fn decode(_r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(())
    }
}

impl Wire for ErrorCode {
    const MIN_BYTES: usize = 4;
    fn encode(&self, out: &mut Vec<u8>) {
        self.code().encode(out)
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let v = i32::decode(r)?;
        ErrorCode::from_i32(v).ok_or(DecodeError::Invalid {
            what: "error code",
            got: v as u64,
        })
    }
}

/// `Result<T, ErrorCode>` is an `i32` status, then `T` when the status is 0.
impl<T: Wire> Wire for Result<T, ErrorCode> {
    const MIN_BYTES: usize = 4;
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Ok(v) => {
                0i32.encode(out);
                v.encode(out);
            }
            Err(e) => e.encode(out),
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match ErrorCode::decode(r)? {
            ErrorCode::Ok => Ok(Ok(T::decode(r)?)),
            e => Ok(Err(e)),
        }
    }
}

/// Per-item status of a batch operation without a value.
pub type ItemStatus = Result<(), ErrorCode>;

macro_rules! messages {
    ($($op:literal $name:ident { $($field:ident : $ty:ty),* $(,)? } -> $reply:ty;)*) => {
        $(
            #[derive(Clone, Debug, PartialEq)]
            pub struct $name { $(pub $field: $ty,)* }
            wire_struct!($name { $($field: $ty),* });
            impl Rpc for $name {
                const OP: u16 = $op;
                const NAME: &'static str = stringify!($name);
                type Reply = $reply;
            }
        )*

        /// Any request, as a server receives it.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Request { $($name($name),)* InTenant(InTenant), }

        impl Request {
            /// Decodes the body of a request frame with the given opcode. No list in it may
            /// hold more than [`BATCH_MAX_ITEMS`] items (keys, sizes, segments, held objects,
            /// a config's names), checked before anything is reserved.
            pub fn decode(opcode: u16, body: &[u8]) -> Result<Request, DecodeError> {
                match opcode {
                    $($op => Ok(Request::$name(capped(body)?)),)*
                    IN_TENANT_OP => Ok(Request::InTenant(InTenant::decode_body(body)?)),
                    other => Err(DecodeError::Invalid { what: "opcode", got: other as u64 }),
                }
            }

            pub fn opcode(&self) -> u16 {
                match self { $(Request::$name(_) => $op,)* Request::InTenant(_) => IN_TENANT_OP, }
            }

            pub fn name(&self) -> &'static str {
                match self { $(Request::$name(_) => stringify!($name),)* Request::InTenant(_) => "InTenant", }
            }

            pub fn encode_body(&self, out: &mut Vec<u8>) {
                match self {
                    $(Request::$name(m) => m.encode(out),)*
                    Request::InTenant(m) => m.encode_body(out),
                }
            }
        }

        /// Every opcode with its name, for docs and metrics.
        pub const OPCODES: &[(u16, &str)] = &[$(($op, stringify!($name)),)* (IN_TENANT_OP, "InTenant")];

        /// Decodes a response body for `opcode` just far enough to check it is well formed.
        pub fn validate_response(opcode: u16, body: &[u8]) -> Result<(), DecodeError> {
            match opcode {
                $($op => Result::<$reply, ErrorCode>::from_bytes(body).map(|_| ()),)*
                // The answer of the inner request, whose opcode the answer does not repeat:
                // only its status can be checked.
                IN_TENANT_OP => ErrorCode::decode(&mut Reader::new(body)).map(|_| ()),
                other => Err(DecodeError::Invalid { what: "opcode", got: other as u64 }),
            }
        }
    };
}

/// Decodes a whole request body with every list capped at [`BATCH_MAX_ITEMS`].
fn capped<T: Wire>(body: &[u8]) -> Result<T, DecodeError> {
    let mut r = Reader::with_count_max(body, BATCH_MAX_ITEMS);
    let v = T::decode(&mut r)?;
    r.finish()?;
    Ok(v)
}

/// Opcode of the tenant envelope ([`InTenant`], [`Tenanted`]).
pub const IN_TENANT_OP: u16 = 40;

/// Whether requests with this opcode may travel in a tenant envelope: the object operations
/// (keys, patterns, removals), not liveness or segments, which belong to no tenant.
pub fn tenant_scoped(opcode: u16) -> bool {
    matches!(opcode, 10..=23 | 30..=39)
}

/// A request of a named tenant (`crate::tenant`), as a server receives it. Body: the tenant
/// (`String`), the inner request's opcode (`u16`, one of [`tenant_scoped`]), then the inner
/// request's body. The answer is the inner request's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct InTenant {
    pub tenant: String,
    pub inner: Box<Request>,
}

impl InTenant {
    fn decode_body(body: &[u8]) -> Result<InTenant, DecodeError> {
        let mut r = Reader::new(body);
        let tenant = String::decode(&mut r)?;
        if !crate::tenant::valid_tenant(&tenant) {
            return Err(DecodeError::Invalid {
                what: "tenant name",
                got: tenant.len() as u64,
            });
        }
        let op = u16::decode(&mut r)?;
        if !tenant_scoped(op) {
            return Err(DecodeError::Invalid {
                what: "opcode in a tenant envelope",
                got: op as u64,
            });
        }
        let rest = r.take(r.remaining())?;
        Ok(InTenant {
            tenant,
            inner: Box::new(Request::decode(op, rest)?),
        })
    }

    fn encode_body(&self, out: &mut Vec<u8>) {
        self.tenant.encode(out);
        self.inner.opcode().encode(out);
        self.inner.encode_body(out);
    }
}

/// The client's side of [`InTenant`]: a typed request of `tenant`, answered as `R` is.
#[derive(Clone, Debug, PartialEq)]
pub struct Tenanted<R> {
    pub tenant: String,
    pub inner: R,
}

impl<R: Rpc> Wire for Tenanted<R> {
    const MIN_BYTES: usize = 4 + 2 + R::MIN_BYTES;
    fn encode(&self, out: &mut Vec<u8>) {
        self.tenant.encode(out);
        R::OP.encode(out);
        self.inner.encode(out);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let tenant = String::decode(r)?;
        let op = u16::decode(r)?;
        if op != R::OP {
            return Err(DecodeError::Invalid {
                what: "opcode in a tenant envelope",
                got: op as u64,
            });
        }
        Ok(Tenanted {
            tenant,
            inner: R::decode(r)?,
        })
    }
}

impl<R: Rpc> Rpc for Tenanted<R> {
    const OP: u16 = IN_TENANT_OP;
    const NAME: &'static str = "InTenant";
    type Reply = R::Reply;
}

messages! {
    // Liveness and segments.
    1 Ping { client_id: Uuid } -> PingResponse;
    2 MountSegment { client_id: Uuid, segment: Segment } -> ();
    3 ReMountSegment { client_id: Uuid, segments: Vec<Segment>, held: Vec<HeldObject> } -> ();
    4 UnmountSegment { client_id: Uuid, segment_id: Uuid } -> ();
    5 GracefulUnmountSegment { client_id: Uuid, segment_id: Uuid, grace_ms: u64 } -> ();
    6 ServiceReady {} -> String;
    // Replica tasks (`controlplane/src/service/tasks.rs`): the state of one task, and the
    // executor's side: the tasks assigned to it (now PROCESSING, with their target ranges
    // allocated), and its report of one.
    7 QueryTask { task_id: Uuid } -> TaskInfo;
    8 FetchTasks { client_id: Uuid } -> Vec<TaskWork>;
    9 CompleteTask { client_id: Uuid, task_id: Uuid, ok: bool, message: String } -> ();
    // Single-object operations.
    10 PutStart { client_id: Uuid, key: String, size: u64, config: ReplicateConfig }
        -> Vec<ReplicaDescriptor>;
    11 PutEnd { client_id: Uuid, key: String } -> ();
    12 PutRevoke { client_id: Uuid, key: String } -> ();
    13 UpsertStart { client_id: Uuid, key: String, size: u64, config: ReplicateConfig }
        -> UpsertStarted;
    14 UpsertEnd { client_id: Uuid, key: String } -> ();
    15 UpsertRevoke { client_id: Uuid, key: String } -> ();
    16 GetReplicaList { key: String } -> ReplicaList;
    17 ExistKey { key: String } -> bool;
    18 Remove { key: String, force: bool } -> Vec<ReplicaDescriptor>;
    19 RemoveByRegex { pattern: String, force: bool } -> u64;
    20 RemoveAll { force: bool } -> u64;
    // Owner-checked clear (upstream's `BatchReplicaClear`): per key, the replicas freed for
    // the caller to bury when the whole object went (empty when one segment's replica went
    // and others stay), or why the key was skipped.
    21 BatchReplicaClear { client_id: Uuid, keys: Vec<String>, segment_name: String }
        -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>;
    // Replica tasks of one object: the new task's id.
    22 CreateCopyTask { key: String, targets: Vec<String> } -> Uuid;
    23 CreateMoveTask { key: String, source: String, target: String } -> Uuid;
    // Batch forms: one status (and value) per key.
    30 BatchPutStart { client_id: Uuid, keys: Vec<String>, sizes: Vec<u64>, config: ReplicateConfig }
        -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>;
    31 BatchPutEnd { client_id: Uuid, keys: Vec<String> } -> Vec<ItemStatus>;
    32 BatchPutRevoke { client_id: Uuid, keys: Vec<String> } -> Vec<ItemStatus>;
    33 BatchUpsertStart { client_id: Uuid, keys: Vec<String>, sizes: Vec<u64>, config: ReplicateConfig }
        -> Vec<Result<UpsertStarted, ErrorCode>>;
    34 BatchUpsertEnd { client_id: Uuid, keys: Vec<String> } -> Vec<ItemStatus>;
    35 BatchUpsertRevoke { client_id: Uuid, keys: Vec<String> } -> Vec<ItemStatus>;
    36 BatchGetReplicaList { keys: Vec<String> } -> Vec<Result<ReplicaList, ErrorCode>>;
    37 BatchExistKey { keys: Vec<String> } -> Vec<Result<bool, ErrorCode>>;
    38 BatchRemove { keys: Vec<String>, force: bool }
        -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>;
    // Durability of removals (`docs/ha.md`, "removals the owners have not heard of").
    // Removed keys (each with the version it was removed at) that the remover could not
    // bury in an owner's catalog: the master keeps them as tombstones, and under HA stores
    // them in etcd before answering.
    39 KeepRemoved { keys: Vec<String>, versions: Vec<Version> } -> ();
    // An owner's re-report to a new term is complete (every `ReMountSegment` of it, memory
    // and disk, answered): once every owner the term waits for said so, its recovery fence
    // ends early (`docs/ha.md`, "A recovery fence").
    41 ReMountDone { client_id: Uuid } -> ();
    // A put in one round trip (`docs/recovery.md`, "A put committed after its bytes"): a
    // range of `size` bytes in a memory segment of host `host_id` (the client's), reserved
    // for one later put of that size by the client (PROCESSING, with the version its intent
    // and provisional record carry); and the commit of such a reservation as `key` (first
    // writer wins: OBJECT_ALREADY_EXISTS leaves the reservation to the client), with the next
    // reservation on `next_host_id` when it is not empty.
    42 ReservePut { client_id: Uuid, size: u64, host_id: String } -> ReplicaDescriptor;
    43 CommitReservedPut { client_id: Uuid, key: String, reserved: ReplicaDescriptor, next_host_id: String }
        -> ReservedCommit;
}

/// Opcodes whose requests carry no list (everything else is in [`list_bodies`]).
pub const LISTLESS_OPCODES: &[u16] = &[
    Ping::OP,
    ReMountDone::OP,
    ReservePut::OP,
    CommitReservedPut::OP,
    MountSegment::OP,
    UnmountSegment::OP,
    GracefulUnmountSegment::OP,
    ServiceReady::OP,
    QueryTask::OP,
    FetchTasks::OP,
    CompleteTask::OP,
    PutEnd::OP,
    PutRevoke::OP,
    UpsertEnd::OP,
    UpsertRevoke::OP,
    GetReplicaList::OP,
    ExistKey::OP,
    Remove::OP,
    RemoveByRegex::OP,
    RemoveAll::OP,
    CreateMoveTask::OP,
];

/// Every list a request can carry, as `(opcode, what, body)`: a request body whose list
/// `what` holds `n` items (its other lists empty, its items the smallest valid ones). For
/// tests of [`BATCH_MAX_ITEMS`]; a new request with a list belongs here.
pub fn list_bodies(n: usize) -> Vec<(u16, &'static str, Vec<u8>)> {
    let id = Uuid::NIL.to_bytes();
    let key = String::new().to_bytes();
    let keys = list(n, &key);
    let none = list(0, &[]);
    let cfg = ReplicateConfig::default().to_bytes();
    let put = |cfg: &[u8]| [&id[..], &key, &0u64.to_bytes(), cfg].concat();
    let batch_put = |k: &[u8], s: &[u8], cfg: &[u8]| [&id[..], k, s, cfg].concat();
    let sizes = list(n, &0u64.to_bytes());
    let mut v = vec![
        (
            ReMountSegment::OP,
            "segments",
            [&id[..], &list(n, &segment()), &none].concat(),
        ),
        (
            ReMountSegment::OP,
            "held",
            [&id[..], &none, &list(n, &held())].concat(),
        ),
        (
            BatchReplicaClear::OP,
            "keys",
            [&id[..], &keys, &key].concat(),
        ),
        (CreateCopyTask::OP, "targets", [&key[..], &keys].concat()),
        (BatchPutEnd::OP, "keys", [&id[..], &keys].concat()),
        (BatchPutRevoke::OP, "keys", [&id[..], &keys].concat()),
        (BatchUpsertEnd::OP, "keys", [&id[..], &keys].concat()),
        (BatchUpsertRevoke::OP, "keys", [&id[..], &keys].concat()),
        (BatchGetReplicaList::OP, "keys", keys.clone()),
        (BatchExistKey::OP, "keys", keys.clone()),
        (BatchRemove::OP, "keys", [&keys[..], &[0]].concat()),
        (KeepRemoved::OP, "keys", [&keys[..], &none].concat()),
        (
            KeepRemoved::OP,
            "versions",
            [&none[..], &list(n, &Version::default().to_bytes())].concat(),
        ),
    ];
    for op in [PutStart::OP, UpsertStart::OP] {
        v.push((op, "preferred_segments", put(&config(&keys, &none))));
        v.push((op, "group_ids", put(&config(&none, &keys))));
    }
    for op in [BatchPutStart::OP, BatchUpsertStart::OP] {
        v.push((op, "keys", batch_put(&keys, &none, &cfg)));
        v.push((op, "sizes", batch_put(&none, &sizes, &cfg)));
        v.push((
            op,
            "preferred_segments",
            batch_put(&none, &none, &config(&keys, &none)),
        ));
        v.push((
            op,
            "group_ids",
            batch_put(&none, &none, &config(&none, &keys)),
        ));
    }
    let in_tenant = [
        &"t".to_string().to_bytes()[..],
        &BatchRemove::OP.to_bytes(),
        &keys,
        &[0],
    ];
    v.push((IN_TENANT_OP, "keys", in_tenant.concat()));
    v
}

/// A list of `n` copies of the encoded `item`.
fn list(n: usize, item: &[u8]) -> Vec<u8> {
    let mut out = (n as u32).to_bytes();
    out.reserve(n * item.len());
    for _ in 0..n {
        out.extend_from_slice(item);
    }
    out
}

/// A default `ReplicateConfig` with these encoded lists.
fn config(preferred_segments: &[u8], group_ids: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    1u32.encode(&mut out);
    SoftPinAction::Preserve.encode(&mut out);
    None::<u64>.encode(&mut out);
    false.encode(&mut out);
    out.extend_from_slice(preferred_segments);
    String::new().encode(&mut out);
    false.encode(&mut out);
    ObjectDataType::Unknown.encode(&mut out);
    out.extend_from_slice(group_ids);
    out
}

fn segment() -> Vec<u8> {
    Segment {
        id: Uuid::NIL,
        name: String::new(),
        base: 0,
        size: 0,
        te_endpoint: String::new(),
        protocol: String::new(),
        host_id: String::new(),
        ..Default::default()
    }
    .to_bytes()
}

fn held() -> Vec<u8> {
    HeldObject {
        key: String::new(),
        size: 0,
        segment_name: String::new(),
        buffer_address: 0,
        with_hard_pin: false,
        version: Version::default(),
        soft_pin_ttl_ms: None,
    }
    .to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_list_of_every_request_is_capped() {
        let listed: std::collections::HashSet<u16> =
            list_bodies(0).iter().map(|(op, ..)| *op).collect();
        for (op, name) in OPCODES {
            assert!(
                listed.contains(op) != LISTLESS_OPCODES.contains(op),
                "{name}: in list_bodies or in LISTLESS_OPCODES, not both or neither"
            );
        }
        let at = list_bodies(BATCH_MAX_ITEMS);
        let over = list_bodies(BATCH_MAX_ITEMS + 1);
        for ((op, what, at), (_, _, over)) in at.iter().zip(&over) {
            assert!(Request::decode(*op, at).is_ok(), "{op} {what} at the cap");
            let got = Request::decode(*op, over);
            let want = DecodeError::TooLong {
                what: "vec",
                len: BATCH_MAX_ITEMS + 1,
                max: BATCH_MAX_ITEMS,
            };
            assert_eq!(got, Err(want), "{op} {what} over the cap");
        }
    }

    #[test]
    fn request_round_trips_through_opcode() {
        let req = PutStart {
            client_id: Uuid::from_parts(1, 2),
            key: "k".into(),
            size: 4096,
            config: ReplicateConfig::default(),
        };
        let body = req.to_bytes();
        let decoded = Request::decode(PutStart::OP, &body).unwrap();
        assert_eq!(decoded, Request::PutStart(req));
        assert_eq!(decoded.name(), "PutStart");
        assert!(Request::decode(999, &body).is_err());
        assert!(Request::decode(PutEnd::OP, &body).is_err());
    }

    #[test]
    fn tenant_envelope_round_trips_and_refuses_what_it_cannot_carry() {
        let inner = RemoveAll { force: true };
        let t = Tenanted {
            tenant: "ta".to_string(),
            inner: inner.clone(),
        };
        let body = t.to_bytes();
        let got = Request::decode(IN_TENANT_OP, &body).unwrap();
        let Request::InTenant(env) = &got else {
            panic!("not an envelope: {got:?}")
        };
        assert_eq!(env.tenant, "ta");
        assert_eq!(*env.inner, Request::RemoveAll(inner));
        let mut again = Vec::new();
        got.encode_body(&mut again);
        assert_eq!(again, body);
        assert_eq!(Tenanted::<RemoveAll>::from_bytes(&body).unwrap(), t);
        // No nesting, no liveness or segment requests, no empty or NUL tenant.
        let nested = Tenanted {
            tenant: "a".to_string(),
            inner: t.clone(),
        };
        assert!(Request::decode(IN_TENANT_OP, &nested.to_bytes()).is_err());
        let ping = Tenanted {
            tenant: "a".to_string(),
            inner: Ping {
                client_id: Uuid::NIL,
            },
        };
        assert!(Request::decode(IN_TENANT_OP, &ping.to_bytes()).is_err());
        for bad in ["", "a\0b"] {
            let e = Tenanted {
                tenant: bad.to_string(),
                inner: RemoveAll { force: false },
            };
            assert!(Request::decode(IN_TENANT_OP, &e.to_bytes()).is_err());
        }
        assert!(validate_response(IN_TENANT_OP, &0i32.to_le_bytes()).is_ok());
        assert!(validate_response(IN_TENANT_OP, &[1]).is_err());
    }

    #[test]
    fn opcodes_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for (op, name) in OPCODES {
            assert!(seen.insert(*op), "opcode {op} ({name}) used twice");
        }
    }

    #[test]
    fn results_encode_status_then_value() {
        let ok: Result<u64, ErrorCode> = Ok(7);
        assert_eq!(ok.to_bytes(), [0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        let err: Result<u64, ErrorCode> = Err(ErrorCode::ObjectNotFound);
        assert_eq!(err.to_bytes(), (-704i32).to_le_bytes());
        assert_eq!(
            Result::<u64, ErrorCode>::from_bytes(&err.to_bytes()).unwrap(),
            err
        );
        // An undefined status number is a decode error, not a silent success.
        assert!(Result::<u64, ErrorCode>::from_bytes(&(-3i32).to_le_bytes()).is_err());
    }
}
