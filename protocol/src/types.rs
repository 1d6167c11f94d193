//! Value types of the object store: ids, replication settings, replicas and segments.

use crate::{wire_enum, wire_struct};

/// A 128-bit id (client ids, segment ids). Upstream uses `pair<u64,u64>`; its string form is
/// `"first-second"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid {
    pub hi: u64,
    pub lo: u64,
}
wire_struct!(Uuid { hi: u64, lo: u64 });

impl Uuid {
    pub const NIL: Uuid = Uuid { hi: 0, lo: 0 };

    /// An id from two halves the caller chose. This crate does no I/O, so it has no entropy
    /// source of its own: callers that want a random id pass random halves.
    pub fn from_parts(hi: u64, lo: u64) -> Uuid {
        Uuid { hi, lo }
    }

    /// 128 random bits from the operating system (`getrandom`); if that fails (it does not on
    /// Linux past early boot) the clock, the pid and the std hasher's random keys.
    pub fn random() -> Uuid {
        let mut b = [0u8; 16];
        if getrandom::getrandom(&mut b).is_err() {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            h.write_u32(std::process::id());
            let hi = h.finish();
            h.write_u64(hi);
            b[..8].copy_from_slice(&hi.to_le_bytes());
            b[8..].copy_from_slice(&h.finish().to_le_bytes());
        }
        let (hi, lo) = b.split_at(8);
        Uuid {
            hi: u64::from_le_bytes(hi.try_into().expect("8 bytes")),
            lo: u64::from_le_bytes(lo.try_into().expect("8 bytes")),
        }
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.hi, self.lo)
    }
}

impl std::str::FromStr for Uuid {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let (a, b) = s.split_once('-').ok_or(())?;
        Ok(Uuid {
            hi: a.parse().map_err(|_| ())?,
            lo: b.parse().map_err(|_| ())?,
        })
    }
}

/// Soft-pin request carried by a put (`replica.h` `SoftPinAction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum SoftPinAction {
    /// Keep whatever soft-pin state the object has (none for a new object).
    #[default]
    Preserve = 0,
    /// Soft-pin for `soft_pin_ttl_ms` (or the master's default TTL).
    Enable = 1,
    /// Clear the soft pin.
    Disable = 2,
}
wire_enum!(SoftPinAction { Preserve = 0, Enable = 1, Disable = 2 });

impl SoftPinAction {
    pub fn name(self) -> &'static str {
        match self {
            SoftPinAction::Preserve => "PRESERVE",
            SoftPinAction::Enable => "ENABLE",
            SoftPinAction::Disable => "DISABLE",
        }
    }
}

/// Tag carried with an object (`types.h` `ObjectDataType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ObjectDataType {
    #[default]
    Unknown = 0,
    Kvcache = 1,
    Tensor = 2,
    Weight = 3,
    Sample = 4,
    Activation = 5,
    Gradient = 6,
    OptimizerState = 7,
    Metadata = 8,
    General = 9,
}
wire_enum!(ObjectDataType {
    Unknown = 0, Kvcache = 1, Tensor = 2, Weight = 3, Sample = 4, Activation = 5, Gradient = 6,
    OptimizerState = 7, Metadata = 8, General = 9,
});

impl ObjectDataType {
    pub const ALL: [ObjectDataType; 10] = [
        ObjectDataType::Unknown,
        ObjectDataType::Kvcache,
        ObjectDataType::Tensor,
        ObjectDataType::Weight,
        ObjectDataType::Sample,
        ObjectDataType::Activation,
        ObjectDataType::Gradient,
        ObjectDataType::OptimizerState,
        ObjectDataType::Metadata,
        ObjectDataType::General,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ObjectDataType::Unknown => "UNKNOWN",
            ObjectDataType::Kvcache => "KVCACHE",
            ObjectDataType::Tensor => "TENSOR",
            ObjectDataType::Weight => "WEIGHT",
            ObjectDataType::Sample => "SAMPLE",
            ObjectDataType::Activation => "ACTIVATION",
            ObjectDataType::Gradient => "GRADIENT",
            ObjectDataType::OptimizerState => "OPTIMIZER_STATE",
            ObjectDataType::Metadata => "METADATA",
            ObjectDataType::General => "GENERAL",
        }
    }
}

/// State of one replica (`replica.h` `ReplicaStatus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ReplicaStatus {
    #[default]
    Undefined = 0,
    Initialized = 1,
    Processing = 2,
    Complete = 3,
    Removed = 4,
    Failed = 5,
}
wire_enum!(ReplicaStatus {
    Undefined = 0, Initialized = 1, Processing = 2, Complete = 3, Removed = 4, Failed = 5,
});

/// Answer to a client's ping (`types.h` `ClientStatus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientStatus {
    #[default]
    Undefined = 0,
    Ok = 1,
    /// The master does not know this client (it restarted, or the client expired): re-mount.
    NeedRemount = 2,
}
wire_enum!(ClientStatus { Undefined = 0, Ok = 1, NeedRemount = 2 });

/// How a put wants its object replicated (`replica.h` `ReplicateConfig`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicateConfig {
    /// Number of memory replicas, each on a distinct segment.
    pub replica_num: u32,
    pub soft_pin_action: SoftPinAction,
    /// Only legal with `Enable`.
    pub soft_pin_ttl_ms: Option<u64>,
    pub with_hard_pin: bool,
    /// Segment names tried first.
    pub preferred_segments: Vec<String>,
    /// Deprecated single preferred segment: when non-empty it is used instead of
    /// `preferred_segments`.
    pub preferred_segment: String,
    pub prefer_alloc_in_same_node: bool,
    pub data_type: ObjectDataType,
    /// Lease groups (upstream's `group_ids`): empty for none, else one per key (one for a
    /// single put), in key order. A read lease granted on a key of a group covers the whole
    /// group, and an upsert may not move a key to another group. `""` is no group.
    pub group_ids: Vec<String>,
}
wire_struct!(ReplicateConfig {
    replica_num: u32,
    soft_pin_action: SoftPinAction,
    soft_pin_ttl_ms: Option<u64>,
    with_hard_pin: bool,
    preferred_segments: Vec<String>,
    preferred_segment: String,
    prefer_alloc_in_same_node: bool,
    data_type: ObjectDataType,
    group_ids: Vec<String>,
});

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
            data_type: ObjectDataType::Unknown,
            group_ids: Vec::new(),
        }
    }
}

impl ReplicateConfig {
    /// The preferred segments in the order the allocator tries them.
    pub fn preferred(&self) -> Vec<&str> {
        if !self.preferred_segment.is_empty() {
            return vec![self.preferred_segment.as_str()];
        }
        let mut out: Vec<&str> = Vec::new();
        for s in &self.preferred_segments {
            if !out.contains(&s.as_str()) {
                out.push(s);
            }
        }
        out
    }

    /// The config for the items `at` (indices, in order) of a batch of `n`: when `group_ids`
    /// names one group per item, only the groups of those items are kept.
    pub fn for_items(&self, n: usize, at: &[usize]) -> ReplicateConfig {
        let mut cfg = self.clone();
        if cfg.group_ids.len() == n && at.len() != n {
            cfg.group_ids = at.iter().map(|&i| self.group_ids[i].clone()).collect();
        }
        cfg
    }
}

/// The version of one write of a key: the master's term (the HA election's etcd revision, or
/// the start time in ms of a master without HA) and a counter within the term. Versions of one
/// cluster are totally ordered (`term`, then `seq`), and every put or upsert the master starts
/// gets a version above every earlier one, across failovers. Owners keep it in their catalog
/// so that a new leader rebuilding its index keeps the newest write of each key
/// (`docs/ha.md`, "versions").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    pub term: u64,
    pub seq: u64,
}
wire_struct!(Version {
    term: u64,
    seq: u64
});

impl Version {
    /// The version of an entry written without one (a writer that predates versions): older
    /// than every versioned write.
    pub const ZERO: Version = Version { term: 0, seq: 0 };
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.term, self.seq)
    }
}

/// What holds a replica's bytes (upstream's `ReplicaType`, whose numbers it keeps: `allocator.h`
/// `MEMORY = 0, DISK = 1, LOCAL_DISK = 2`; only the two kinds this store has or prepares).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplicaMedium {
    /// A range of a mounted memory segment: every replica so far.
    #[default]
    Memory = 0,
    /// A copy on its owner's local disk (the SSD tier, `LOCAL_DISK`); read through its owner.
    LocalDisk = 2,
}
wire_enum!(ReplicaMedium { Memory = 0, LocalDisk = 2 });

impl ReplicaMedium {
    fn from_u8(b: u8) -> Option<ReplicaMedium> {
        match b {
            0 => Some(ReplicaMedium::Memory),
            2 => Some(ReplicaMedium::LocalDisk),
            _ => None,
        }
    }
}

/// Where one replica of an object lives: for a memory replica, a contiguous range in a mounted
/// segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaDescriptor {
    pub status: ReplicaStatus,
    /// What holds the bytes. On the wire it shares the status byte (its high nibble, `docs/
    /// protocol.md`), so a memory replica encodes to the bytes it always has.
    pub medium: ReplicaMedium,
    /// The segment (and so the storage process) holding it.
    pub segment_name: String,
    /// Transfer-engine endpoint of that segment (`host:port` of its data plane).
    pub transport_endpoint: String,
    /// Absolute address of the first byte in the segment owner's address space.
    pub buffer_address: u64,
    pub size: u64,
    /// The version of the write these bytes belong to (the writer records it in the owner's
    /// catalog; a remove's answer names the version removed).
    pub version: Version,
}

/// The status byte of a replica descriptor: status in the low nibble, medium in the high one.
fn encode_status_medium(status: ReplicaStatus, medium: ReplicaMedium, out: &mut Vec<u8>) {
    out.push(status as u8 | (medium as u8) << 4);
}

fn decode_status_medium(
    r: &mut crate::wire::Reader<'_>,
) -> Result<(ReplicaStatus, ReplicaMedium), crate::wire::DecodeError> {
    use crate::wire::{DecodeError, Wire};
    let b = u8::decode(r)?;
    let medium = ReplicaMedium::from_u8(b >> 4).ok_or(DecodeError::Invalid {
        what: "ReplicaMedium",
        got: u64::from(b >> 4),
    })?;
    let status = ReplicaStatus::decode(&mut crate::wire::Reader::new(&[b & 0x0f]))?;
    Ok((status, medium))
}

impl crate::wire::Wire for ReplicaDescriptor {
    const MIN_BYTES: usize = 1
        + <String as crate::wire::Wire>::MIN_BYTES * 2
        + 16
        + <Version as crate::wire::Wire>::MIN_BYTES;
    fn encode(&self, out: &mut Vec<u8>) {
        self.as_ref().encode(out);
    }
    fn decode(r: &mut crate::wire::Reader<'_>) -> Result<Self, crate::wire::DecodeError> {
        let (status, medium) = decode_status_medium(r)?;
        Ok(ReplicaDescriptor {
            status,
            medium,
            segment_name: String::decode(r)?,
            transport_endpoint: String::decode(r)?,
            buffer_address: u64::decode(r)?,
            size: u64::decode(r)?,
            version: Version::decode(r)?,
        })
    }
}

impl ReplicaDescriptor {
    /// The same descriptor with borrowed names.
    pub fn as_ref(&self) -> ReplicaDescriptorRef<'_> {
        ReplicaDescriptorRef {
            status: self.status,
            medium: self.medium,
            segment_name: &self.segment_name,
            transport_endpoint: &self.transport_endpoint,
            buffer_address: self.buffer_address,
            size: self.size,
            version: self.version,
        }
    }
}

/// A [`ReplicaDescriptor`] whose names are borrowed, for an encoder that answers from its own
/// tables (the master) without allocating two strings per replica. It encodes to exactly the
/// bytes of the owned descriptor (checked in the tests below); decoding yields the owned one.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaDescriptorRef<'a> {
    pub status: ReplicaStatus,
    pub medium: ReplicaMedium,
    pub segment_name: &'a str,
    pub transport_endpoint: &'a str,
    pub buffer_address: u64,
    pub size: u64,
    pub version: Version,
}

impl ReplicaDescriptorRef<'_> {
    pub fn encode(&self, out: &mut Vec<u8>) {
        use crate::wire::{encode_str, Wire};
        encode_status_medium(self.status, self.medium, out);
        encode_str(self.segment_name, out);
        encode_str(self.transport_endpoint, out);
        self.buffer_address.encode(out);
        self.size.encode(out);
        self.version.encode(out);
    }
}

/// How the master keeps a disk segment within its owner's limits (the owner's
/// `MOONCAKE_OFFLOAD_*` settings; all zero for a memory segment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskPolicy {
    /// Start evicting disk replicas above this share of the segment, in thousandths (0: no
    /// eviction ahead of need).
    pub high_watermark_permille: u16,
    /// Stop at this share, in thousandths (below `high_watermark_permille`).
    pub low_watermark_permille: u16,
    /// Most objects the segment holds (0: no limit).
    pub keys_limit: u64,
}
wire_struct!(DiskPolicy {
    high_watermark_permille: u16,
    low_watermark_permille: u16,
    keys_limit: u64,
});

/// A segment contributed by a client or storage node (`types.h` `Segment`): a range of memory,
/// or (medium `LocalDisk`) an address range its owner maps onto files of its disk tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    pub id: Uuid,
    /// Unique name; for store clients it is their `host:port`.
    pub name: String,
    /// Address of the first byte in the owner's address space.
    pub base: u64,
    pub size: u64,
    /// Transfer-engine endpoint readers and writers connect to.
    pub te_endpoint: String,
    pub protocol: String,
    /// Host identity, so that replicas can be spread over distinct hosts.
    pub host_id: String,
    /// What holds its bytes: memory, or its owner's disk tier.
    pub medium: ReplicaMedium,
    /// For a disk segment, its owner's limits.
    pub disk: DiskPolicy,
}
wire_struct!(Segment {
    id: Uuid,
    name: String,
    base: u64,
    size: u64,
    te_endpoint: String,
    protocol: String,
    host_id: String,
    medium: ReplicaMedium,
    disk: DiskPolicy,
});

/// Reply to `GetReplicaList`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaList {
    pub replicas: Vec<ReplicaDescriptor>,
    /// The read lease granted with this answer.
    pub lease_ttl_ms: u64,
}
wire_struct!(ReplicaList { replicas: Vec<ReplicaDescriptor>, lease_ttl_ms: u64 });

/// Reply to `UpsertStart` (and per key of `BatchUpsertStart`): the replicas to write, and the
/// soft pin the object will carry, which the writer records in each replica's catalog entry
/// so that a master rebuilding its index pins it again (`HeldObject::soft_pin_ttl_ms`,
/// `docs/ha.md`, "Soft pins after a failover"). An upsert with `SoftPinAction::Preserve`
/// keeps a pin only the master knows; this is how its writer learns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpsertStarted {
    pub replicas: Vec<ReplicaDescriptor>,
    /// `Some(ttl_ms)`, never 0: the pin's full ttl when it starts once the upsert completes,
    /// or what is left of a running pin the upsert keeps. `None`: unpinned.
    pub soft_pin_ttl_ms: Option<u64>,
}
wire_struct!(UpsertStarted {
    replicas: Vec<ReplicaDescriptor>,
    soft_pin_ttl_ms: Option<u64>,
});

/// Reply to `CommitReservedPut`: the version the key was committed at (the writer's commit
/// record carries it), and the client's next reservation when it asked for one and the
/// master could make it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservedCommit {
    pub version: Version,
    pub next: Option<ReplicaDescriptor>,
}
wire_struct!(ReservedCommit {
    version: Version,
    next: Option<ReplicaDescriptor>,
});

/// Reply to `Ping`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PingResponse {
    /// The master's term: the HA view version (an etcd revision), or without HA its start
    /// time in ms; the term of every version it hands out. Owners refuse catalog records of
    /// an earlier term from then on (`docs/ha.md`, "Late writes of an earlier term").
    pub view_version: i64,
    pub status: ClientStatus,
    /// `(addr, len)` ranges the master freed in the pinging client's segments since its last
    /// ping (removed, evicted, revoked or discarded objects), at most
    /// `limits::PING_FREED_RANGES_MAX`; the owner drops its catalog entries overlapping them.
    /// See `docs/recovery.md`.
    pub freed: Vec<(u64, u64)>,
    /// `(segment id, ms left to its deadline)` for each of the client's segments that is
    /// draining (`docs/fleet.md`): the owner keeps an admin call's drain going on a restarted
    /// master or a new HA leader, and never re-mounts a segment whose drain ended.
    pub draining: Vec<(Uuid, u64)>,
}
wire_struct!(PingResponse {
    view_version: i64,
    status: ClientStatus,
    freed: Vec<(u64, u64)>,
    draining: Vec<(Uuid, u64)>,
});

/// An object a storage process reports holding, used to rebuild the index after a master
/// restart or failover. `size == 0` reports a *tombstone*: `key` was removed at `version`
/// (`buffer_address` is then 0), so no older version of it may come back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldObject {
    pub key: String,
    pub size: u64,
    pub segment_name: String,
    pub buffer_address: u64,
    pub with_hard_pin: bool,
    pub version: Version,
    /// The soft pin its put asked for: `Some(ttl_ms)`, `Some(0)` for the master's default
    /// ttl, `None` unpinned. The master pins it anew for that ttl from the re-report
    /// (`docs/ha.md`, "Soft pins after a failover").
    pub soft_pin_ttl_ms: Option<u64>,
}
wire_struct!(HeldObject {
    key: String,
    size: u64,
    segment_name: String,
    buffer_address: u64,
    with_hard_pin: bool,
    version: Version,
    soft_pin_ttl_ms: Option<u64>,
});

/// Kind of a replica task (upstream's `TaskType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum TaskType {
    /// Add replicas of an object on named segments.
    #[default]
    ReplicaCopy = 0,
    /// Move an object's replica from one segment to another.
    ReplicaMove = 1,
}
wire_enum!(TaskType { ReplicaCopy = 0, ReplicaMove = 1 });

/// State of a replica task (upstream's `TaskStatus` and its values):
/// `PENDING -> PROCESSING -> SUCCESS | FAILED`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum TaskStatus {
    #[default]
    Pending = 0,
    Processing = 1,
    Failed = 2,
    Success = 3,
}
wire_enum!(TaskStatus { Pending = 0, Processing = 1, Failed = 2, Success = 3 });

/// Reply to `QueryTask` (upstream's `QueryTaskResponse`). Times are wall-clock milliseconds
/// since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    pub id: Uuid,
    pub task_type: TaskType,
    pub status: TaskStatus,
    pub created_at_ms_epoch: u64,
    pub last_updated_at_ms_epoch: u64,
    pub assigned_client: Uuid,
    /// Why a task failed (empty otherwise).
    pub message: String,
}
wire_struct!(TaskInfo {
    id: Uuid,
    task_type: TaskType,
    status: TaskStatus,
    created_at_ms_epoch: u64,
    last_updated_at_ms_epoch: u64,
    assigned_client: Uuid,
    message: String,
});

/// A task handed to its executor by `FetchTasks`, now PROCESSING: read the object from one
/// of `sources`, write it whole into every replica of `targets` (ranges the master allocated
/// for it, recorded in each owner's catalog with the object's pins, as a put records them),
/// then report with `CompleteTask`. A move's source replica is dropped by the master on
/// success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskWork {
    pub task_id: Uuid,
    pub key: String,
    pub sources: Vec<ReplicaDescriptor>,
    pub targets: Vec<ReplicaDescriptor>,
    pub with_hard_pin: bool,
    /// As `UpsertStarted::soft_pin_ttl_ms`.
    pub soft_pin_ttl_ms: Option<u64>,
}
wire_struct!(TaskWork {
    task_id: Uuid,
    key: String,
    sources: Vec<ReplicaDescriptor>,
    targets: Vec<ReplicaDescriptor>,
    with_hard_pin: bool,
    soft_pin_ttl_ms: Option<u64>,
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Wire;

    #[test]
    fn a_batchs_groups_follow_the_items_that_go() {
        let cfg = ReplicateConfig {
            group_ids: vec!["a".into(), "b".into(), "c".into()],
            ..Default::default()
        };
        assert_eq!(cfg.for_items(3, &[0, 2]).group_ids, ["a", "c"]);
        assert_eq!(cfg.for_items(3, &[0, 1, 2]), cfg);
        // Groups that do not name one per item are left for the master to refuse.
        assert_eq!(cfg.for_items(2, &[1]).group_ids, cfg.group_ids);
    }

    #[test]
    fn a_borrowed_replica_descriptor_encodes_as_the_owned_one() {
        let owned = ReplicaDescriptor {
            status: ReplicaStatus::Complete,
            medium: ReplicaMedium::Memory,
            segment_name: "node-a:17001".to_string(),
            transport_endpoint: "127.0.0.1:17001".to_string(),
            buffer_address: 0x7f00_0000_1000,
            size: 4096,
            version: Version { term: 3, seq: 42 },
        };
        let borrowed = ReplicaDescriptorRef {
            status: owned.status,
            medium: ReplicaMedium::Memory,
            segment_name: &owned.segment_name,
            transport_endpoint: &owned.transport_endpoint,
            buffer_address: owned.buffer_address,
            size: owned.size,
            version: owned.version,
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        owned.encode(&mut a);
        borrowed.encode(&mut b);
        assert_eq!(a, b);
        let mut r = crate::wire::Reader::new(&b);
        assert_eq!(ReplicaDescriptor::decode(&mut r).unwrap(), owned);
    }

    /// The medium shares the status byte: a memory replica's bytes are those of a descriptor
    /// from before it had a medium (its fields in order, status alone in the first byte), so
    /// old frames decode as memory replicas; a disk replica round-trips; an unknown medium or
    /// status is an error.
    #[test]
    fn a_replicas_medium_rides_in_its_status_byte() {
        let memory = ReplicaDescriptor {
            status: ReplicaStatus::Complete,
            medium: ReplicaMedium::Memory,
            segment_name: "s".to_string(),
            transport_endpoint: "127.0.0.1:1".to_string(),
            buffer_address: 4096,
            size: 10,
            version: Version { term: 1, seq: 2 },
        };
        let mut old = vec![ReplicaStatus::Complete as u8];
        crate::wire::encode_str("s", &mut old);
        crate::wire::encode_str("127.0.0.1:1", &mut old);
        for v in [4096u64, 10, 1, 2] {
            v.encode(&mut old);
        }
        assert_eq!(memory.to_bytes(), old);
        let disk = ReplicaDescriptor {
            medium: ReplicaMedium::LocalDisk,
            ..memory.clone()
        };
        let bytes = disk.to_bytes();
        assert_eq!(bytes[0], 0x23);
        assert_eq!(ReplicaDescriptor::from_bytes(&bytes).unwrap(), disk);
        for bad in [0x13u8, 0xf3, 0x06, 0x26] {
            let mut b = bytes.clone();
            b[0] = bad;
            assert!(ReplicaDescriptor::from_bytes(&b).is_err(), "{bad:#x}");
        }
    }

    #[test]
    fn config_round_trips() {
        let c = ReplicateConfig {
            replica_num: 3,
            soft_pin_action: SoftPinAction::Enable,
            soft_pin_ttl_ms: Some(1234),
            with_hard_pin: true,
            preferred_segments: vec!["a:1".into(), "b:2".into(), "a:1".into()],
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
            data_type: ObjectDataType::Kvcache,
            group_ids: vec!["g".into(), String::new()],
        };
        assert_eq!(ReplicateConfig::from_bytes(&c.to_bytes()).unwrap(), c);
        assert_eq!(c.preferred(), vec!["a:1", "b:2"]);
        let single = ReplicateConfig {
            preferred_segment: "z:9".into(),
            ..c
        };
        assert_eq!(single.preferred(), vec!["z:9"]);
    }

    #[test]
    fn held_objects_round_trip_with_their_soft_pin() {
        let held = HeldObject {
            key: "k".into(),
            size: 9,
            segment_name: "node:1".into(),
            buffer_address: 1 << 40,
            with_hard_pin: false,
            version: Version { term: 5, seq: 9 },
            soft_pin_ttl_ms: Some(60_000),
        };
        for h in [
            held.clone(),
            HeldObject {
                soft_pin_ttl_ms: Some(0),
                ..held.clone()
            },
            HeldObject {
                soft_pin_ttl_ms: None,
                with_hard_pin: true,
                ..held
            },
        ] {
            let b = h.to_bytes();
            assert_eq!(HeldObject::from_bytes(&b), Ok(h.clone()));
            // The pin is the last field: cutting it off is an error, not an unpinned object.
            assert!(HeldObject::from_bytes(&b[..b.len() - 1]).is_err());
        }
    }

    #[test]
    fn upsert_answers_round_trip_with_their_soft_pin() {
        let replica = ReplicaDescriptor {
            status: ReplicaStatus::Processing,
            medium: ReplicaMedium::Memory,
            segment_name: "node:1".into(),
            transport_endpoint: "127.0.0.1:1".into(),
            buffer_address: 1 << 40,
            size: 9,
            version: Version { term: 5, seq: 9 },
        };
        for soft_pin_ttl_ms in [None, Some(1), Some(60_000), Some(u64::MAX)] {
            let a = UpsertStarted {
                replicas: vec![replica.clone(), replica.clone()],
                soft_pin_ttl_ms,
            };
            let b = a.to_bytes();
            assert_eq!(UpsertStarted::from_bytes(&b), Ok(a.clone()));
            // The pin is the last field: cutting it off is an error, not an unpinned object.
            assert!(UpsertStarted::from_bytes(&b[..b.len() - 1]).is_err());
        }
    }

    #[test]
    fn task_types_round_trip_and_refuse_unknown_values() {
        use crate::wire::Wire;
        let info = TaskInfo {
            id: Uuid::from_parts(1, 2),
            task_type: TaskType::ReplicaMove,
            status: TaskStatus::Failed,
            created_at_ms_epoch: 5,
            last_updated_at_ms_epoch: 6,
            assigned_client: Uuid::from_parts(3, 4),
            message: "no space".into(),
        };
        assert_eq!(TaskInfo::from_bytes(&info.to_bytes()).unwrap(), info);
        let r = ReplicaDescriptor {
            status: ReplicaStatus::Complete,
            medium: ReplicaMedium::Memory,
            segment_name: "s".into(),
            transport_endpoint: "127.0.0.1:1".into(),
            buffer_address: 4096,
            size: 9,
            version: Version { term: 1, seq: 2 },
        };
        let work = TaskWork {
            task_id: Uuid::from_parts(7, 8),
            key: "k".into(),
            sources: vec![r.clone()],
            targets: vec![r.clone(), r],
            with_hard_pin: true,
            soft_pin_ttl_ms: Some(60_000),
        };
        assert_eq!(TaskWork::from_bytes(&work.to_bytes()).unwrap(), work);
        // Status and type bytes past upstream's values are decode errors.
        let mut bad = info.to_bytes();
        bad[17] = 4;
        assert!(TaskInfo::from_bytes(&bad).is_err());
        let mut bad = info.to_bytes();
        bad[16] = 2;
        assert!(TaskInfo::from_bytes(&bad).is_err());
    }

    #[test]
    fn uuid_string_form() {
        let u = Uuid::from_parts(7, 9);
        assert_eq!(u.to_string(), "7-9");
        assert_eq!("7-9".parse::<Uuid>(), Ok(u));
        assert!("x".parse::<Uuid>().is_err());
    }
}
