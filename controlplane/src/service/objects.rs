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

use std::collections::hash_map;
use std::ops::Deref;

use protocol::tenant::split_scoped;

use super::object::Object;
use super::FastMap;
use crate::events::{Event, Kind, Medium, Sink};

/// The object index (`State::objects`).
#[derive(Default)]
pub(crate) struct Objects {
    map: FastMap<String, Object>,
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
    sink.push(Event {
        kind,
        medium,
        key: key.to_string(),
        group: obj.group.as_ref().map(|g| g.lease.name.clone()),
    });
}

/// `obj` left the index: removed, if it was announced.
fn announce_removed(events: &Option<Sink>, key: &str, obj: &Object) {
    if let Some(sink) = events {
        if obj.announced != Medium::None {
            announce(sink, Kind::Removed, obj.announced, key, obj);
        }
    }
}

/// `obj`'s replicas changed: stored with its new medium, if readable somewhere new.
fn announce_medium(events: &Option<Sink>, key: &str, obj: &mut Object) {
    if let Some(sink) = events {
        let now = medium_of(obj);
        if now != Medium::None && now != obj.announced {
            obj.announced = now;
            announce(sink, Kind::Stored, now, key, obj);
        }
    }
}

/// What an object is charged: its size times its memory replica count.
fn charge_of(obj: &Object) -> u64 {
    let memory = obj.replicas.iter().filter(|r| !r.on_disk).count();
    obj.size.saturating_mul(memory as u64)
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
            map: FastMap::default(),
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
                obj.announced = now;
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
    pub(crate) fn insert(&mut self, key: String, obj: Object) -> Option<Object> {
        let old = self.remove(&key);
        self.insert_get(key, obj);
        old
    }

    /// [`Self::insert`] for the put path, returning the object now held: one hash lookup
    /// without quotas.
    pub(crate) fn insert_get(&mut self, key: String, mut obj: Object) -> &Object {
        let Objects {
            map,
            ledger,
            events,
        } = self;
        if let Some(l) = ledger {
            if let Some(old) = map.get(&key) {
                sub(l, &key, old.charge);
            }
            obj.charge = charge_of(&obj);
            add(l, &key, obj.charge);
        }
        if events.is_some() {
            if let Some(old) = map.get(&key) {
                announce_removed(events, &key, old);
            }
            obj.announced = Medium::None;
            announce_medium(events, &key, &mut obj);
        }
        match map.entry(key) {
            hash_map::Entry::Occupied(mut o) => {
                o.insert(obj);
                o.into_mut()
            }
            hash_map::Entry::Vacant(v) => v.insert(obj),
        }
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<Object> {
        let obj = self.map.remove(key)?;
        if let Some(l) = &mut self.ledger {
            sub(l, key, obj.charge);
        }
        announce_removed(&self.events, key, &obj);
        Some(obj)
    }

    /// Keeps the objects `f` accepts (which may change them, e.g. drop replicas); settles
    /// the charges of the ones dropped or changed.
    pub(crate) fn retain(&mut self, mut f: impl FnMut(&String, &mut Object) -> bool) {
        let Objects {
            map,
            ledger,
            events,
        } = self;
        map.retain(|k, obj| {
            let keep = f(k, obj);
            if let Some(l) = ledger {
                if !keep {
                    sub(l, k, obj.charge);
                } else {
                    settle(l, k, obj);
                }
            }
            if !keep {
                announce_removed(events, k, obj);
            } else {
                announce_medium(events, k, obj);
            }
            keep
        });
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
        for (k, obj) in &self.map {
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
    if now != obj.charge {
        sub(ledger, key, obj.charge);
        add(ledger, key, now);
        obj.charge = now;
    }
}

impl Deref for Objects {
    type Target = FastMap<String, Object>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<'a> IntoIterator for &'a Objects {
    type Item = (&'a String, &'a Object);
    type IntoIter = hash_map::Iter<'a, String, Object>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}
