//! KV-cache events: the master tells cache-aware routers (NVIDIA Dynamo's KV router) which
//! objects the pool holds, as the original's master does (`docs/kv-events.md`).
//!
//! Owns the publisher: a bounded queue ([`Sink`], `queue.rs`) that the service pushes small
//! events into under its lock, and a background thread (`publisher.rs`) that drains it,
//! encodes batches in msgpack (`encode.rs`) and sends each on a ZeroMQ PUB socket as three
//! frames: an empty topic, an 8-byte big-endian sequence number, the payload.
//!
//! How it works: the service calls [`Sink::push`] with the key, what happened and the medium;
//! the push copies them into the queue's buffer and never blocks (but on the publisher's
//! swap of that buffer, once per poll). A full queue drops the event and counts it; the next
//! batch the thread sends then skips a sequence number, so a subscriber sees the loss as a
//! gap. Everything that costs (tenant split, hash parse, msgpack) happens on the thread.
//!
//! Invariants: sequence numbers start at 1 and grow by 1 per batch, by 2 for the first batch
//! sent after any drop; a loss shows up no later than the first batch holding an event
//! queued after it. `event_id`s grow by 1 per published event, from 1.

mod encode;
mod publisher;
mod queue;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use encode::{encode_batch, parse_hash, EncodeOptions};
pub use publisher::{start, Publisher};
pub use queue::EventRef;
use queue::Queue;

/// The endpoint bound when `--enable_kv_events` is given without `--kv_events_bind_endpoint`
/// (the port the original's examples use).
pub const DEFAULT_ENDPOINT: &str = "tcp://0.0.0.0:5557";

/// The `--kv_events_*` flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    pub enabled: bool,
    /// A ZeroMQ endpoint to bind (`tcp://host:port`, `ipc://path`).
    pub endpoint: String,
    pub backend_id: String,
    /// Kept for the status page: events carry `model_name` nil, as the original's.
    pub model_name: String,
    /// The `tenant_id` of objects of the default tenant.
    pub tenant_id: String,
    pub additional_salt: String,
    pub lora_name: String,
    pub block_size: u32,
    /// The payload's `dp_rank`.
    pub dp_rank: u32,
    pub emit_legacy_compat: bool,
    pub emit_object_key: bool,
    /// Events the queue holds before it drops.
    pub queue_capacity: u32,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            enabled: false,
            endpoint: String::new(),
            backend_id: String::new(),
            model_name: String::new(),
            tenant_id: protocol::tenant::DEFAULT_TENANT.to_string(),
            additional_salt: String::new(),
            lora_name: String::new(),
            block_size: 0,
            dp_rank: 0,
            emit_legacy_compat: true,
            emit_object_key: true,
            queue_capacity: 65536,
        }
    }
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// It became readable, or its medium changed (`medium` says where it is now).
    Stored,
    /// It left the index.
    Removed,
}

/// Where an object's readable replicas are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Medium {
    /// Not readable (a put in flight): nothing announced.
    #[default]
    None,
    /// A COMPLETE memory replica exists.
    Cpu,
    /// Only COMPLETE disk replicas remain.
    Disk,
}

impl Medium {
    pub fn name(self) -> Option<&'static str> {
        match self {
            Medium::None => None,
            Medium::Cpu => Some("cpu"),
            Medium::Disk => Some("disk"),
        }
    }
}

/// One event, owned (the tests' form; the service pushes [`EventRef`]s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    pub medium: Medium,
    /// The key as the index holds it (scoped for a tenant other than the default one).
    pub key: String,
    /// The object's lease group, scoped as the index holds it.
    pub group: Option<String>,
}

impl Event {
    pub fn as_ref(&self) -> EventRef<'_> {
        EventRef {
            kind: self.kind,
            medium: self.medium,
            key: &self.key,
            group: self.group.as_deref(),
        }
    }
}

impl From<EventRef<'_>> for Event {
    fn from(e: EventRef<'_>) -> Event {
        Event {
            kind: e.kind,
            medium: e.medium,
            key: e.key.to_string(),
            group: e.group.map(str::to_string),
        }
    }
}

/// The publisher's counters, shared by the sink and the thread.
#[derive(Debug, Default)]
pub struct Counters {
    pub published_events: AtomicU64,
    pub published_batches: AtomicU64,
    pub dropped_events: AtomicU64,
    pub non_hash_keys: AtomicU64,
}

impl Counters {
    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// The service's end of the queue. Cloning shares the queue.
#[derive(Clone, Debug)]
pub struct Sink {
    queue: Arc<Queue>,
    counters: Arc<Counters>,
}

impl Sink {
    /// Queues `event`, or drops and counts it when the queue is full (or the publisher
    /// stopped). Never blocks but on the publisher's swap of the buffer.
    #[inline]
    pub fn push(&self, event: EventRef<'_>) {
        if !self.queue.push(event) {
            self.counters.dropped_events.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        Counters::get(&self.counters.dropped_events)
    }
}

/// A sink over a queue of `capacity` that the caller drains itself (the service's tests).
#[cfg(test)]
pub(crate) fn test_channel(capacity: usize) -> (Sink, TestDrain) {
    let queue = Arc::new(Queue::new(capacity));
    let sink = Sink {
        queue: queue.clone(),
        counters: Arc::default(),
    };
    (sink, TestDrain(queue))
}

/// The tests' end of a [`test_channel`].
#[cfg(test)]
pub(crate) struct TestDrain(Arc<Queue>);

#[cfg(test)]
impl TestDrain {
    /// The events queued since the last call, in order.
    pub fn try_iter(&self) -> std::vec::IntoIter<Event> {
        let mut p = queue::Packed::default();
        self.0.take(&mut p);
        p.iter().map(Event::from).collect::<Vec<_>>().into_iter()
    }
}

/// What `GET /kv_events/status` and the metrics page report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub enabled: bool,
    pub endpoint: String,
    pub backend_id: String,
    pub queue_capacity: u32,
    pub published_events: u64,
    pub published_batches: u64,
    pub dropped_events: u64,
    pub non_hash_keys: u64,
}

impl Status {
    /// The status of a master without events.
    pub fn disabled() -> Status {
        Status::default()
    }

    /// The counters as Prometheus text.
    pub fn render_metrics(&self, s: &mut String) {
        use std::fmt::Write;
        let rows = [
            (
                "master_kv_events_enabled",
                "Whether KV-cache events are published (--enable_kv_events)",
                "gauge",
                u64::from(self.enabled),
            ),
            (
                "master_kv_events_published_events",
                "KV-cache events sent on the ZeroMQ socket",
                "counter",
                self.published_events,
            ),
            (
                "master_kv_events_published_batches",
                "KV-cache event batches (messages) sent on the ZeroMQ socket",
                "counter",
                self.published_batches,
            ),
            (
                "master_kv_events_dropped_events",
                "KV-cache events dropped because the queue was full",
                "counter",
                self.dropped_events,
            ),
            (
                "master_kv_events_non_hash_keys",
                "Published KV-cache events whose key is not a decimal or 0x hash",
                "counter",
                self.non_hash_keys,
            ),
        ];
        for (name, help, kind, v) in rows {
            // Writing to a String cannot fail.
            let _ = write!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            );
        }
    }
}

/// The status of a running publisher.
pub(crate) fn status_of(cfg: &KvEventsConfig, endpoint: &str, c: &Counters) -> Status {
    Status {
        enabled: true,
        endpoint: endpoint.to_string(),
        backend_id: cfg.backend_id.clone(),
        queue_capacity: cfg.queue_capacity,
        published_events: Counters::get(&c.published_events),
        published_batches: Counters::get(&c.published_batches),
        dropped_events: Counters::get(&c.dropped_events),
        non_hash_keys: Counters::get(&c.non_hash_keys),
    }
}
