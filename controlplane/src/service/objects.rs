//! The index of objects by key, and the bytes each tenant holds in it.
//!
//! With tenant quotas on (`quota.rs`) every object is *charged* to its tenant: its size times
//! its replica count, as upstream charges, counting memory replicas only (a quota shares out
//! the memory pool; disk replicas live in their owners' disk tiers, `docs/tiering.md`). The ledger is kept here, by the only code that can
//! change the index, so no path that adds, drops or changes an object can forget it:
//! [`Objects::insert`], [`Objects::remove`] and [`Objects::retain`] move whole charges (and
//! `retain` settles the objects it changed), and a path that changes an object's replica
//! count through [`Objects::get_mut`] (a copy task's new replica, a re-reported one, one
//! cleared) calls [`Objects::settle`]. Reads go through `Deref` to the map.
//!
//! The same choke points announce KV-cache events (`crate::events`, `docs/kv-events.md`)
//! when a publisher is set: an object that leaves the index (`remove`, a `retain` that drops
//! it) is announced removed if it was announced stored; `settle` and a kept object of
//! `retain` re-read where its COMPLETE replicas are ([`medium_of`]) and announce a new
//! medium as stored; [`Objects::completed`] (a put's end) announces stored. Each object
//! remembers what was last announced for it (`Object::announced`), so nothing is said twice
//! and a removal names the medium the router knows.
//!
//! Invariant (checked by `ledger_matches_the_index` in the tests): for every tenant, the
//! ledger equals the sum of `size × replicas` over its objects, and each object's `charge`
//! is its own `size × replicas`. Without quotas there is no ledger and `charge` stays 0.

use protocol::tenant::split_scoped;
use protocol::Uuid;

use super::index::Index;
use super::object::Object;
use super::FastMap;
use crate::events::{EventRef, Kind, Medium, Sink};
use crate::limits::SWEEP_WRITERS_MIN;

/// The object index (`State::objects`).
#[derive(Default)]
pub(crate) struct Objects {
    map: Index<Object>,
    /// The writers objects name (`Object::writer`), interned (`Writers`).
    writers: Writers,
    /// Bytes charged per tenant (`default` for plain keys); `None` without tenant quotas.
    ledger: Option<FastMap<String, u64>>,
    /// The KV-cache event queue, when `--enable_kv_events` is on.
    events: Option<Sink>,
}

/// Where `obj`'s COMPLETE replicas are: memory first, else disk, else none (not readable).
pub(crate) fn medium_of(obj: &Object) -> Medium {
    let mut disk = false;
    for r in &obj.replicas {
        if r.status == protocol::ReplicaStatus::Complete {
            if !r.on_disk {
                return Medium::Cpu;
            }
            disk = true;
        }
    }
    if disk {
        Medium::Disk
    } else {
        Medium::None
    }
}

fn announce(sink: &Sink, kind: Kind, medium: Medium, key: &str, obj: &Object) {
    sink.push(EventRef {
        kind,
        medium,
        key,
        group: obj.group().map(|g| g.lease.name.as_str()),
    });
}

/// `obj` left the index: removed, if it was announced.
fn announce_removed(events: &Option<Sink>, key: &str, obj: &Object) {
    if let Some(sink) = events {
        if obj.announced() != Medium::None {
            announce(sink, Kind::Removed, obj.announced(), key, obj);
        }
    }
}

/// `obj`'s replicas changed: stored with its new medium, if readable somewhere new.
fn announce_medium(events: &Option<Sink>, key: &str, obj: &mut Object) {
    if let Some(sink) = events {
        let now = medium_of(obj);
        if now != Medium::None && now != obj.announced() {
            obj.set_announced(now);
            announce(sink, Kind::Stored, now, key, obj);
        }
    }
}

/// What an object is charged: its size times its memory replica count.
fn charge_of(obj: &Object) -> u64 {
    let memory = obj.replicas.iter().filter(|r| !r.on_disk).count();
    obj.size().saturating_mul(memory as u64)
}

/// The tenant a held key belongs to.
pub(crate) fn tenant_of(key: &str) -> &str {
    split_scoped(key).0
}

fn add(ledger: &mut FastMap<String, u64>, key: &str, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let tenant = tenant_of(key);
    match ledger.get_mut(tenant) {
        Some(n) => *n = n.saturating_add(bytes),
        None => {
            ledger.insert(tenant.to_string(), bytes);
        }
    }
}

fn sub(ledger: &mut FastMap<String, u64>, key: &str, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let tenant = tenant_of(key);
    if let Some(n) = ledger.get_mut(tenant) {
        debug_assert!(
            *n >= bytes,
            "tenant {tenant:?} charged {n}, releasing {bytes}"
        );
        *n = n.saturating_sub(bytes);
        if *n == 0 {
            ledger.remove(tenant);
        }
    }
}

impl Objects {
    /// An empty index, keeping the tenant ledger when `quotas` is on.
    pub(crate) fn new(quotas: bool) -> Objects {
        Objects {
            map: Index::default(),
            writers: Writers::default(),
            ledger: quotas.then(FastMap::default),
            events: None,
        }
    }

    /// Announces KV-cache events into `sink` from now on.
    pub(crate) fn set_events(&mut self, sink: Option<Sink>) {
        self.events = sink;
    }

    /// The event queue, to carry over to a new index (`MasterService::reset`).
    pub(crate) fn events(&self) -> Option<Sink> {
        self.events.clone()
    }

    /// `key`'s put completed: announced stored (again, for an upsert) where it is now.
    pub(crate) fn completed(&mut self, key: &str) {
        let Objects { map, events, .. } = self;
        if let (Some(sink), Some(obj)) = (events, map.get_mut(key)) {
            let now = medium_of(obj);
            if now != Medium::None {
                obj.set_announced(now);
                announce(sink, Kind::Stored, now, key, obj);
            }
        }
    }

    /// Bytes charged to `tenant` (0 without quotas).
    pub(crate) fn charged(&self, tenant: &str) -> u64 {
        self.ledger
            .as_ref()
            .and_then(|l| l.get(tenant).copied())
            .unwrap_or(0)
    }

    /// Every tenant holding bytes, with its charge.
    pub(crate) fn ledger(&self) -> impl Iterator<Item = (&String, &u64)> {
        self.ledger.iter().flatten()
    }

    /// Adds or replaces `key`'s object; returns the one it replaced.
    pub(crate) fn insert(&mut self, key: &str, obj: Object) -> Option<Object> {
        let old = self.remove(key);
        self.insert_get(key, obj);
        old
    }

    /// [`Self::insert`] for the put path, returning the object now held: one hash lookup
    /// without quotas and events.
    pub(crate) fn insert_get(&mut self, key: &str, mut obj: Object) -> &Object {
        let Objects {
            map,
            ledger,
            events,
            ..
        } = self;
        if let Some(l) = ledger {
            if let Some(old) = map.get(key) {
                sub(l, key, old.charge());
            }
            obj.set_charge(charge_of(&obj));
            add(l, key, obj.charge());
        }
        if events.is_some() {
            if let Some(old) = map.get(key) {
                announce_removed(events, key, old);
            }
            obj.set_announced(Medium::None);
            announce_medium(events, key, &mut obj);
        }
        map.insert(key, obj).0
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<Object> {
        let obj = self.map.remove(key)?;
        if let Some(l) = &mut self.ledger {
            sub(l, key, obj.charge());
        }
        announce_removed(&self.events, key, &obj);
        Some(obj)
    }

    /// Keeps the objects `f` accepts (which may change them, e.g. drop replicas); settles
    /// the charges of the ones dropped or changed.
    pub(crate) fn retain(&mut self, mut f: impl FnMut(&str, &mut Object) -> bool) {
        let Objects {
            map,
            ledger,
            events,
            ..
        } = self;
        let gone_ledger = std::cell::RefCell::new(ledger);
        map.retain(
            |k, obj| {
                let keep = f(k, obj);
                if keep {
                    if let Some(l) = gone_ledger.borrow_mut().as_mut() {
                        settle(l, k, obj);
                    }
                    announce_medium(events, k, obj);
                }
                keep
            },
            |k, obj| {
                if let Some(l) = gone_ledger.borrow_mut().as_mut() {
                    sub(l, k, obj.charge());
                }
                announce_removed(events, k, &obj);
            },
        );
    }

    /// The object of `key` for a change. A change of its replica count must be followed by
    /// [`Self::settle`] (the ledger test catches a path that forgets).
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Object> {
        self.map.get_mut(key)
    }

    /// Moves `key`'s charge to its current `size × replicas` after its replicas changed.
    pub(crate) fn settle(&mut self, key: &str) {
        let Objects {
            map,
            ledger,
            events,
            ..
        } = self;
        let Some(obj) = map.get_mut(key) else {
            return;
        };
        if let Some(l) = ledger {
            settle(l, key, obj);
        }
        announce_medium(events, key, obj);
    }

    /// The ledger recomputed from the index (tests: it must equal the kept one).
    #[cfg(test)]
    pub(crate) fn recomputed(&self) -> FastMap<String, u64> {
        let mut l = FastMap::default();
        for (k, obj) in self.map.iter() {
            add(&mut l, k, charge_of(obj));
        }
        l
    }

    #[cfg(test)]
    pub(crate) fn kept_ledger(&self) -> FastMap<String, u64> {
        self.ledger.clone().unwrap_or_default()
    }
}

/// Moves `obj`'s charge to its current `size × replicas`.
fn settle(ledger: &mut FastMap<String, u64>, key: &str, obj: &mut Object) {
    let now = charge_of(obj);
    if now != obj.charge() {
        sub(ledger, key, obj.charge());
        add(ledger, key, now);
        obj.set_charge(now);
    }
}

impl Objects {
    pub(crate) fn get(&self, key: &str) -> Option<&Object> {
        self.map.get(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Object> + '_ {
        self.map.values()
    }

    pub(crate) fn iter(&self) -> super::index::Iter<'_, Object> {
        self.map.iter()
    }

    /// The id `client` has in the writer table, made if new (for a put that names it as its
    /// object's writer).
    pub(crate) fn writer_id(&mut self, client: Uuid) -> u32 {
        self.writers.intern(client)
    }

    /// Whether `client` wrote `obj` (its put in flight, or the last completed).
    pub(crate) fn written_by(&self, obj: &Object, client: Uuid) -> bool {
        self.writers.id_of(client) == Some(obj.writer())
    }

    /// Forgets writers no object names any more, once the table has doubled since the last
    /// time (a pass over the index, amortised over the writers that came since).
    pub(crate) fn sweep_writers(&mut self) {
        let w = &mut self.writers;
        if w.ids.len() < 2 * w.kept_at + SWEEP_WRITERS_MIN {
            return;
        }
        let mut live = vec![false; w.ids.len()];
        for obj in self.map.values() {
            live[obj.writer() as usize] = true;
        }
        let mut new_id = vec![0u32; w.ids.len()];
        let mut ids = Vec::new();
        for (i, id) in w.ids.iter().enumerate() {
            if live[i] {
                new_id[i] = ids.len() as u32;
                ids.push(*id);
            }
        }
        self.map.retain(
            |_, obj| {
                obj.set_writer(new_id[obj.writer() as usize]);
                true
            },
            |_, _| {},
        );
        w.by_id = ids
            .iter()
            .enumerate()
            .map(|(i, u)| (*u, i as u32))
            .collect();
        w.kept_at = ids.len();
        w.ids = ids;
        w.last = None;
    }

    /// The writer table's size (tests).
    #[cfg(test)]
    pub(crate) fn writers_len(&self) -> usize {
        self.writers.ids.len()
    }
}

/// The clients that wrote objects, each with a small id an object keeps instead of the
/// UUID (`record.rs`). Ids are never reused while an object names them: a sweep
/// ([`Objects::sweep_writers`]) renumbers the live ones and drops the rest.
#[derive(Default)]
struct Writers {
    ids: Vec<Uuid>,
    by_id: FastMap<Uuid, u32>,
    /// Size after the last sweep.
    kept_at: usize,
    /// The writer interned last, and its id (cleared by a sweep).
    last: Option<(Uuid, u32)>,
}

impl Writers {
    fn intern(&mut self, client: Uuid) -> u32 {
        // A batch put names one writer for all its keys: one hash lookup for the batch.
        if let Some((c, i)) = self.last {
            if c == client {
                return i;
            }
        }
        let i = match self.by_id.get(&client) {
            Some(&i) => i,
            None => {
                let i = u32::try_from(self.ids.len()).expect("under 2^32 writers");
                self.ids.push(client);
                self.by_id.insert(client, i);
                i
            }
        };
        self.last = Some((client, i));
        i
    }

    fn id_of(&self, client: Uuid) -> Option<u32> {
        match self.last {
            Some((c, i)) if c == client => Some(i),
            _ => self.by_id.get(&client).copied(),
        }
    }
}

impl<'a> IntoIterator for &'a Objects {
    type Item = (&'a str, &'a Object);
    type IntoIter = super::index::Iter<'a, Object>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::record::Replicas;

    fn obj(writer: u32) -> Object {
        Object::new(
            64,
            protocol::Version::default(),
            writer,
            1000,
            Replicas::default(),
        )
    }

    /// The writer table forgets clients no object names, and renumbering keeps every
    /// object's writer.
    #[test]
    fn sweeping_writers_keeps_the_named_ones() {
        let mut ix = Objects::new(false);
        let n = 3 * SWEEP_WRITERS_MIN as u64;
        for i in 0..n {
            let w = ix.writer_id(Uuid::from_parts(7, i));
            ix.insert(&format!("k{i}"), obj(w));
        }
        for i in 0..n {
            if i % 100 != 0 {
                ix.remove(&format!("k{i}"));
            }
        }
        assert_eq!(ix.writers_len(), n as usize);
        ix.sweep_writers();
        assert_eq!(ix.writers_len(), n.div_ceil(100) as usize);
        for i in 0..n {
            let c = Uuid::from_parts(7, i);
            match ix.get(&format!("k{i}")) {
                Some(o) => {
                    assert!(ix.written_by(o, c), "k{i}");
                    assert!(!ix.written_by(o, Uuid::from_parts(7, i + 1)));
                }
                None => assert_eq!(ix.writers.id_of(c), None),
            }
        }
        // Not again until the table doubles.
        ix.writer_id(Uuid::from_parts(8, 0));
        ix.sweep_writers();
        assert_eq!(ix.writers_len(), n.div_ceil(100) as usize + 1);
    }
}
