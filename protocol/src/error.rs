//! Store error codes, numbered as upstream Mooncake numbers them (`types.h`).
//!
//! Python callers see these as plain negative integers, so the numbers are the contract.

macro_rules! error_codes {
    ($($name:ident = $value:expr => $text:literal,)*) => {
        /// A store error code. `Ok` is 0; every failure is negative.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum ErrorCode {
            $($name = $value,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            /// The code for a number, or `None` for a number upstream does not define.
            pub fn from_i32(value: i32) -> Option<ErrorCode> {
                match value {
                    $($value => Some(ErrorCode::$name),)*
                    _ => None,
                }
            }

            /// Upstream's `toString` name, e.g. `OBJECT_NOT_FOUND`.
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$name => $text,)*
                }
            }
        }
    };
}

error_codes! {
    Ok = 0 => "OK",
    InternalError = -1 => "INTERNAL_ERROR",
    BufferOverflow = -10 => "BUFFER_OVERFLOW",
    ShardIndexOutOfRange = -100 => "SHARD_INDEX_OUT_OF_RANGE",
    SegmentNotFound = -101 => "SEGMENT_NOT_FOUND",
    SegmentAlreadyExists = -102 => "SEGMENT_ALREADY_EXISTS",
    ClientNotFound = -103 => "CLIENT_NOT_FOUND",
    NoAvailableHandle = -200 => "NO_AVAILABLE_HANDLE",
    InvalidVersion = -300 => "INVALID_VERSION",
    InvalidKey = -400 => "INVALID_KEY",
    WriteFail = -500 => "WRITE_FAIL",
    InvalidParams = -600 => "INVALID_PARAMS",
    IllegalClient = -601 => "ILLEGAL_CLIENT",
    InvalidWrite = -700 => "INVALID_WRITE",
    InvalidRead = -701 => "INVALID_READ",
    InvalidReplica = -702 => "INVALID_REPLICA",
    ReplicaIsNotReady = -703 => "REPLICA_IS_NOT_READY",
    ObjectNotFound = -704 => "OBJECT_NOT_FOUND",
    ObjectAlreadyExists = -705 => "OBJECT_ALREADY_EXISTS",
    ObjectHasLease = -706 => "OBJECT_HAS_LEASE",
    LeaseExpired = -707 => "LEASE_EXPIRED",
    ObjectHasReplicationTask = -708 => "OBJECT_HAS_REPLICATION_TASK",
    ObjectNoReplicationTask = -709 => "OBJECT_NO_REPLICATION_TASK",
    ReplicaNotFound = -710 => "REPLICA_NOT_FOUND",
    ReplicaAlreadyExists = -711 => "REPLICA_ALREADY_EXISTS",
    ReplicaIsGone = -712 => "REPLICA_IS_GONE",
    ReplicaNotInLocalMemory = -713 => "REPLICA_NOT_IN_LOCAL_MEMORY",
    ObjectReplicaBusy = -714 => "OBJECT_REPLICA_BUSY",
    TransferFail = -800 => "TRANSFER_FAIL",
    ChecksumMismatch = -801 => "CHECKSUM_MISMATCH",
    RpcFail = -900 => "RPC_FAIL",
    RpcTimeout = -901 => "RPC_TIMEOUT",
    EtcdOperationError = -1000 => "ETCD_OPERATION_ERROR",
    EtcdKeyNotExist = -1001 => "ETCD_KEY_NOT_EXIST",
    EtcdTransactionFail = -1002 => "ETCD_TRANSACTION_FAIL",
    EtcdCtxCancelled = -1003 => "ETCD_CTX_CANCELLED",
    OplogEntryNotFound = -1004 => "OPLOG_ENTRY_NOT_FOUND",
    K8sLeaseOperationError = -1005 => "K8S_LEASE_OPERATION_ERROR",
    K8sLeaseNotFound = -1006 => "K8S_LEASE_NOT_FOUND",
    IncompleteOplogCatchUp = -1007 => "INCOMPLETE_OPLOG_CATCH_UP",
    UnavailableInCurrentStatus = -1010 => "UNAVAILABLE_IN_CURRENT_STATUS",
    UnavailableInCurrentMode = -1011 => "UNAVAILABLE_IN_CURRENT_MODE",
    NotSupported = -1012 => "NOT_SUPPORTED",
    FileNotFound = -1100 => "FILE_NOT_FOUND",
    FileOpenFail = -1101 => "FILE_OPEN_FAIL",
    FileReadFail = -1102 => "FILE_READ_FAIL",
    FileWriteFail = -1103 => "FILE_WRITE_FAIL",
    FileInvalidBuffer = -1104 => "FILE_INVALID_BUFFER",
    FileLockFail = -1105 => "FILE_LOCK_FAIL",
    FileInvalidHandle = -1106 => "FILE_INVALID_HANDLE",
    BucketNotFound = -1200 => "BUCKET_NOT_FOUND",
    BucketAlreadyExists = -1201 => "BUCKET_ALREADY_EXISTS",
    KeysExceedBucketLimit = -1202 => "KEYS_EXCEED_BUCKET_LIMIT",
    KeysUltraLimit = -1203 => "KEYS_ULTRA_LIMIT",
    UnableOffload = -1300 => "UNABLE_OFFLOAD",
    UnableOffloading = -1301 => "UNABLE_OFFLOADING",
    TaskNotFound = -1400 => "TASK_NOT_FOUND",
    TaskPendingLimitExceeded = -1401 => "TASK_PENDING_LIMIT_EXCEEDED",
    JobNotFound = -1402 => "JOB_NOT_FOUND",
    SerializeUnsupported = -1500 => "SERIALIZE_UNSUPPORTED",
    SerializeFail = -1501 => "SERIALIZE_FAIL",
    DeserializeFail = -1502 => "DESERIALIZE_FAIL",
    PersistentFail = -1503 => "PERSISTENT_FAIL",
    DfsNetworkTimeout = -1600 => "DFS_NETWORK_TIMEOUT",
    DfsServiceUnavailable = -1601 => "DFS_SERVICE_UNAVAILABLE",
    DfsQuotaExceeded = -1602 => "DFS_QUOTA_EXCEEDED",
    DfsPermissionDenied = -1603 => "DFS_PERMISSION_DENIED",
    DfsStaleHandle = -1604 => "DFS_STALE_HANDLE",
    DfsPartialWrite = -1605 => "DFS_PARTIAL_WRITE",
    TenantQuotaExceeded = -1700 => "TENANT_QUOTA_EXCEEDED",
    TenantNotRegistered = -1701 => "TENANT_NOT_REGISTERED",
    TenantNotEmpty = -1702 => "TENANT_NOT_EMPTY",
}

impl ErrorCode {
    /// The number Python sees.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// Upstream's `toString` of an arbitrary number: `UNKNOWN_ERROR` when it is not a code.
    pub fn name_of(value: i32) -> &'static str {
        ErrorCode::from_i32(value).map_or("UNKNOWN_ERROR", ErrorCode::name)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl std::error::Error for ErrorCode {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_upstream() {
        assert_eq!(ErrorCode::Ok.code(), 0);
        assert_eq!(ErrorCode::NoAvailableHandle.code(), -200);
        assert_eq!(ErrorCode::InvalidParams.code(), -600);
        assert_eq!(ErrorCode::ObjectHasLease.code(), -706);
        assert_eq!(ErrorCode::ObjectReplicaBusy.code(), -714);
        assert_eq!(ErrorCode::TenantNotEmpty.code(), -1702);
        assert_eq!(ErrorCode::ALL.len(), 72);
    }

    #[test]
    fn every_code_round_trips_and_has_a_unique_name() {
        let mut names = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_i32(c.code()), Some(c));
            assert!(names.insert(c.name()), "duplicate name {}", c.name());
        }
        assert_eq!(ErrorCode::from_i32(-2), None);
        assert_eq!(ErrorCode::name_of(-2), "UNKNOWN_ERROR");
        assert_eq!(ErrorCode::name_of(-704), "OBJECT_NOT_FOUND");
    }
}
