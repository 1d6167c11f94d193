//! Value classes of `mooncake.store`: the enums, `ReplicateConfig`, and the replica
//! descriptors, with upstream's attribute names, defaults and `str()`.

use protocol::ErrorCode;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyInt;

/// Generates a pyclass enum mirroring a `protocol` enum, with `.name`, `.value`, `int()` and
/// comparison with ints, like a pybind11 enum.
macro_rules! py_enum {
    ($py:ident, $proto:path, $pyname:literal, { $($var:ident = $val:literal => $name:literal,)* }) => {
        #[pyclass(eq, eq_int, hash, frozen, from_py_object, module = "mooncake.store", name = $pyname)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $py {
            $(#[pyo3(name = $name)] $var = $val,)*
        }

        impl $py {
            pub const VARIANTS: &'static [($py, &'static str)] = &[$(($py::$var, $name),)*];
        }

        #[pymethods]
        impl $py {
            #[getter]
            fn name(&self) -> &'static str {
                match self { $($py::$var => $name,)* }
            }
            #[getter]
            fn value(&self) -> i64 {
                *self as i64
            }
            fn __index__(&self) -> i64 {
                *self as i64
            }
        }

        impl From<$py> for $proto {
            fn from(v: $py) -> $proto {
                use $proto as P;
                match v { $($py::$var => P::$var,)* }
            }
        }

        impl From<$proto> for $py {
            fn from(v: $proto) -> $py {
                use $proto as P;
                match v { $(P::$var => $py::$var,)* }
            }
        }
    };
}

py_enum!(PyObjectDataType, protocol::ObjectDataType, "ObjectDataType", {
    Unknown = 0 => "UNKNOWN",
    Kvcache = 1 => "KVCACHE",
    Tensor = 2 => "TENSOR",
    Weight = 3 => "WEIGHT",
    Sample = 4 => "SAMPLE",
    Activation = 5 => "ACTIVATION",
    Gradient = 6 => "GRADIENT",
    OptimizerState = 7 => "OPTIMIZER_STATE",
    Metadata = 8 => "METADATA",
    General = 9 => "GENERAL",
});

py_enum!(PySoftPinAction, protocol::SoftPinAction, "SoftPinAction", {
    Preserve = 0 => "PRESERVE",
    Enable = 1 => "ENABLE",
    Disable = 2 => "DISABLE",
});

py_enum!(PyReplicaStatus, protocol::ReplicaStatus, "ReplicaStatus", {
    Undefined = 0 => "UNDEFINED",
    Initialized = 1 => "INITIALIZED",
    Processing = 2 => "PROCESSING",
    Complete = 3 => "COMPLETE",
    Removed = 4 => "REMOVED",
    Failed = 5 => "FAILED",
});

/// `ReplicateConfig()`: how a put replicates its object (upstream `replica.h`).
#[pyclass(module = "mooncake.store", name = "ReplicateConfig", from_py_object)]
#[derive(Clone, Debug)]
pub struct PyReplicateConfig {
    #[pyo3(get, set)]
    pub replica_num: usize,
    #[pyo3(get, set)]
    pub nof_replica_num: usize,
    #[pyo3(get, set)]
    pub dfs_replica_num: usize,
    #[pyo3(get, set)]
    pub soft_pin_action: PySoftPinAction,
    pub soft_pin_ttl_ms: Option<u64>,
    #[pyo3(get, set)]
    pub with_hard_pin: bool,
    #[pyo3(get, set)]
    pub preferred_segments: Vec<String>,
    #[pyo3(get, set)]
    pub preferred_nof_segments: Vec<String>,
    #[pyo3(get, set)]
    pub preferred_segment: String,
    #[pyo3(get, set)]
    pub prefer_alloc_in_same_node: bool,
    #[pyo3(get, set)]
    pub data_type: PyObjectDataType,
    #[pyo3(get, set)]
    pub group_ids: Option<Vec<String>>,
}

impl Default for PyReplicateConfig {
    fn default() -> Self {
        PyReplicateConfig {
            replica_num: 1,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            soft_pin_action: PySoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_nof_segments: Vec::new(),
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
            data_type: PyObjectDataType::Unknown,
            group_ids: None,
        }
    }
}

fn list_str(v: &[String]) -> String {
    format!("[{}]", v.join(", "))
}

impl PyReplicateConfig {
    /// The wire config, or `INVALID_PARAMS` for settings this build cannot honour (NVMe-oF
    /// and DFS replicas, as upstream without those features).
    pub fn to_protocol(&self) -> Result<protocol::ReplicateConfig, ErrorCode> {
        if self.nof_replica_num > 0 || self.dfs_replica_num > 0 {
            return Err(ErrorCode::InvalidParams);
        }
        let replica_num = u32::try_from(self.replica_num).map_err(|_| ErrorCode::InvalidParams)?;
        Ok(protocol::ReplicateConfig {
            replica_num,
            soft_pin_action: self.soft_pin_action.into(),
            soft_pin_ttl_ms: self.soft_pin_ttl_ms,
            with_hard_pin: self.with_hard_pin,
            preferred_segments: self.preferred_segments.clone(),
            preferred_segment: self.preferred_segment.clone(),
            prefer_alloc_in_same_node: self.prefer_alloc_in_same_node,
            data_type: self.data_type.into(),
            group_ids: self.group_ids.clone().unwrap_or_default(),
        })
    }
}

#[pymethods]
impl PyReplicateConfig {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// `None` or a non-negative int below 2**64; anything else is a `TypeError` (pybind's
    /// `optional<uint64_t>` conversion).
    #[getter]
    fn get_soft_pin_ttl_ms(&self) -> Option<u64> {
        self.soft_pin_ttl_ms
    }

    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let bad = || PyTypeError::new_err("soft_pin_ttl_ms must be None or an int in [0, 2**64)");
        self.soft_pin_ttl_ms = match value {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => {
                if !v.is_instance_of::<PyInt>() || v.is_instance_of::<pyo3::types::PyBool>() {
                    return Err(bad());
                }
                Some(v.extract::<u64>().map_err(|_| bad())?)
            }
        };
        Ok(())
    }

    /// The seed's older boolean form: `True` soft-pins (ENABLE), `False` leaves it (PRESERVE).
    #[getter]
    fn get_with_soft_pin(&self) -> bool {
        self.soft_pin_action == PySoftPinAction::Enable
    }

    #[setter]
    fn set_with_soft_pin(&mut self, value: bool) {
        self.soft_pin_action = if value {
            PySoftPinAction::Enable
        } else {
            PySoftPinAction::Preserve
        };
    }

    fn __str__(&self) -> String {
        let b = |x: bool| if x { 1 } else { 0 };
        let ttl = self
            .soft_pin_ttl_ms
            .map_or_else(|| "default".to_string(), |t| t.to_string());
        let mut s = format!(
            "ReplicateConfig: {{ replica_num: {}, nof_replica_num: {}, dfs_replica_num: {}, \
             soft_pin_action: {}, soft_pin_ttl_ms: {}, with_hard_pin: {}, preferred_segments: {}, ",
            self.replica_num,
            self.nof_replica_num,
            self.dfs_replica_num,
            self.soft_pin_action.name(),
            ttl,
            b(self.with_hard_pin),
            list_str(&self.preferred_segments),
        );
        if !self.preferred_segment.is_empty() {
            s += &format!(
                "preferred_segment (deprecated): {}, ",
                self.preferred_segment
            );
        }
        s += &format!(
            "preferred_nof_segments: {}, prefer_alloc_in_same_node: {}, data_type: {}",
            list_str(&self.preferred_nof_segments),
            b(self.prefer_alloc_in_same_node),
            self.data_type.name(),
        );
        if let Some(g) = &self.group_ids {
            s += &format!(", group_ids: {}", list_str(g));
        }
        s + " }"
    }

    fn __repr__(&self) -> String {
        self.__str__()
    }
}

/// `Descriptor`: where one replica's bytes are (`AllocatedBuffer::Descriptor`).
#[pyclass(module = "mooncake.store", name = "Descriptor", from_py_object)]
#[derive(Clone, Debug)]
pub struct PyDescriptor {
    #[pyo3(get, set)]
    pub size: u64,
    #[pyo3(get, set)]
    pub buffer_address: u64,
    #[pyo3(get, set)]
    pub transport_endpoint: String,
}

#[pymethods]
impl PyDescriptor {
    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

/// `MemoryDescriptor`: a memory replica's buffer.
#[pyclass(module = "mooncake.store", name = "MemoryDescriptor", frozen)]
pub struct PyMemoryDescriptor {
    desc: PyDescriptor,
}

#[pymethods]
impl PyMemoryDescriptor {
    /// The `Descriptor` of the replica's buffer (segment, address, size).
    #[getter]
    fn buffer_descriptor(&self) -> PyDescriptor {
        self.desc.clone()
    }
}

/// `ReplicaDescriptor`: one replica of an object as the master reports it.
#[pyclass(module = "mooncake.store", name = "ReplicaDescriptor", frozen)]
pub struct PyReplicaDescriptor {
    status: PyReplicaStatus,
    medium: protocol::ReplicaMedium,
    desc: PyDescriptor,
}

impl From<&protocol::ReplicaDescriptor> for PyReplicaDescriptor {
    fn from(r: &protocol::ReplicaDescriptor) -> Self {
        PyReplicaDescriptor {
            status: r.status.into(),
            medium: r.medium,
            desc: PyDescriptor {
                size: r.size,
                buffer_address: r.buffer_address,
                transport_endpoint: r.transport_endpoint.clone(),
            },
        }
    }
}

#[pymethods]
impl PyReplicaDescriptor {
    /// The replica's `ReplicaStatus`, as the master reported it.
    #[getter]
    fn status(&self) -> PyReplicaStatus {
        self.status
    }

    /// True for a replica in a memory segment (upstream's `MEMORY` kind).
    fn is_memory_replica(&self) -> bool {
        self.medium == protocol::ReplicaMedium::Memory
    }

    /// False: upstream's `DISK` kind (a shared file system) does not exist here; a copy on its
    /// owner's disk is a local-disk replica.
    fn is_disk_replica(&self) -> bool {
        false
    }

    /// True for a copy on its owner's local disk (upstream's `LOCAL_DISK` kind).
    fn is_local_disk_replica(&self) -> bool {
        self.medium == protocol::ReplicaMedium::LocalDisk
    }

    /// The `MemoryDescriptor` of this memory replica; a `RuntimeError` for a disk one (as
    /// upstream's variant access fails).
    fn get_memory_descriptor(&self) -> PyResult<PyMemoryDescriptor> {
        if !self.is_memory_replica() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "not a memory replica",
            ));
        }
        Ok(PyMemoryDescriptor {
            desc: self.desc.clone(),
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "<ReplicaDescriptor status={} {} {}>",
            self.status.name(),
            if self.is_memory_replica() {
                "memory"
            } else {
                "local_disk"
            },
            self.desc.__repr__()
        )
    }
}
