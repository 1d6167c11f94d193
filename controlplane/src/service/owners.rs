//! The owners' registry: which clients hold segments, kept in etcd by an HA leader, so that the
//! next leader knows whom to wait for (`docs/ha.md`, "The owners' registry").
//!
//! An owner re-reports its objects with its first ping to a new leader. The recovery fence
//! ([`super::RECOVERY_FENCE_MS`]) covers every owner that pings on time; an owner stalled past
//! it (a long pause, a stopped process) re-reports later, and until then a read of one of its
//! keys would find nothing and answer `OBJECT_NOT_FOUND` for an object that exists. With the
//! registry the new leader knows who has not re-mounted yet: while any registered owner is
//! missing, a key the index does not hold is answered `UNAVAILABLE_IN_CURRENT_STATUS` (ask
//! again) instead of "not found", and pattern removes wait, for at most `client_ttl` after the
//! election, the silence after which any master would have expired the owner anyway.
//!
//! The leader registers an owner when it mounts its first segment, in etcd before the mount is
//! answered (so an owner holding an acknowledged object is always registered), and forgets it
//! when it unmounts its last segment or is expired; forgetting is told to etcd afterwards, at
//! leisure (a stale entry costs the next leader a wait, no wrong answer).
//!
//! Invariants:
//! - an owner in `awaited` is in `registered`;
//! - `to_store` and `to_forget` hold only changes not yet drained, and only while the state is
//!   an HA leader's (`State::durable_on`).

use std::collections::HashSet;

use protocol::Uuid;

#[derive(Default)]
pub(crate) struct Owners {
    /// Owners this term knows to be in etcd (loaded at the election, or stored since).
    registered: HashSet<Uuid>,
    /// Registered owners that have not re-mounted in this term yet.
    awaited: HashSet<Uuid>,
    /// Registered owners whose re-report is not complete yet (`ReMountDone`).
    unreported: HashSet<Uuid>,
    /// Whether the registry was loaded for this term (an HA leader's, `awaiting`).
    loaded: bool,
    /// The wait for `awaited` ends here (the election plus `client_ttl`).
    awaited_until_ms: u64,
    /// Newly registered: to store in etcd before the batch's answers go out.
    to_store: Vec<Uuid>,
    /// No longer owners: to delete from etcd.
    to_forget: Vec<Uuid>,
}

impl Owners {
    /// The registry loaded at an election: every owner in it is waited for until `until_ms`.
    pub fn awaiting(owners: &[Uuid], until_ms: u64) -> Owners {
        Owners {
            registered: owners.iter().copied().collect(),
            awaited: owners.iter().copied().collect(),
            unreported: owners.iter().copied().collect(),
            loaded: true,
            awaited_until_ms: until_ms,
            ..Owners::default()
        }
    }

    /// `client` mounted a segment (or re-mounted its segments). A delete of its entry not yet
    /// sent is dropped: it would undo this registration.
    pub fn mounted(&mut self, client: Uuid) {
        self.awaited.remove(&client);
        if self.registered.insert(client) {
            self.to_forget.retain(|&c| c != client);
            self.to_store.push(client);
        }
    }

    /// `client`'s re-report to this term is complete.
    pub fn reported(&mut self, client: Uuid) {
        self.unreported.remove(&client);
    }

    /// Whether every owner registered before this term re-reported all it holds: then no
    /// newer version of any key is still to come, and the recovery fence can end.
    pub fn all_reported(&self) -> bool {
        self.loaded && self.unreported.is_empty()
    }

    /// `client` holds no segment any more (unmounted its last one, or expired).
    pub fn gone(&mut self, client: Uuid) {
        self.awaited.remove(&client);
        self.unreported.remove(&client);
        if self.registered.remove(&client) {
            self.to_forget.push(client);
        }
    }

    /// Whether a registered owner may still re-report: a key missing from the index may be
    /// one of its.
    pub fn missing_any(&self, now: u64) -> bool {
        self.awaited(now) > 0
    }

    /// How many registered owners are still waited for.
    pub fn awaited(&self, now: u64) -> usize {
        if now < self.awaited_until_ms {
            self.awaited.len()
        } else {
            0
        }
    }

    /// Ends the wait once it is over: the owners still missing are forgotten and returned.
    pub fn stop_waiting(&mut self, now: u64) -> Vec<Uuid> {
        if self.awaited.is_empty() || now < self.awaited_until_ms {
            return Vec::new();
        }
        let late: Vec<Uuid> = self.awaited.drain().collect();
        for &c in &late {
            self.gone(c);
        }
        late
    }

    /// Owners to store in etcd before the current batch's answers go out.
    pub fn take_to_store(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.to_store)
    }

    /// `owners` could not be stored: they count as unregistered, so that their next mount
    /// (the owner mounts again when its answer is lost) stores them again.
    pub fn unstored(&mut self, owners: &[Uuid]) {
        for c in owners {
            self.registered.remove(c);
        }
    }

    /// Owners to delete from etcd.
    pub fn take_to_forget(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.to_forget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> Uuid {
        Uuid::from_parts(n, n)
    }

    #[test]
    fn an_election_waits_for_each_registered_owner_until_it_re_mounts_or_the_wait_ends() {
        let mut o = Owners::awaiting(&[id(1), id(2)], 10_000);
        assert!(o.missing_any(0));
        o.mounted(id(1));
        assert!(o.missing_any(0), "owner 2 is still missing");
        assert!(
            o.take_to_store().is_empty(),
            "owner 1 was registered already"
        );
        assert!(o.stop_waiting(9_999).is_empty());
        assert!(o.missing_any(9_999));
        assert!(!o.missing_any(10_000));
        assert_eq!(o.stop_waiting(10_000), vec![id(2)]);
        assert_eq!(o.take_to_forget(), vec![id(2)]);
        assert!(!o.missing_any(0));
    }

    #[test]
    fn new_owners_are_stored_once_and_forgotten_when_gone() {
        let mut o = Owners::default();
        assert!(!o.missing_any(0));
        o.mounted(id(3));
        o.mounted(id(3));
        assert_eq!(o.take_to_store(), vec![id(3)]);
        o.gone(id(3));
        o.gone(id(3));
        assert_eq!(o.take_to_forget(), vec![id(3)]);
        // Expired, then back before the delete went out: registered again, nothing deleted.
        o.mounted(id(5));
        o.take_to_store();
        o.gone(id(5));
        o.mounted(id(5));
        assert!(o.take_to_forget().is_empty());
        assert_eq!(o.take_to_store(), vec![id(5)]);
        // A failed store: the next mount stores it again.
        o.mounted(id(4));
        let failed = o.take_to_store();
        o.unstored(&failed);
        o.mounted(id(4));
        assert_eq!(o.take_to_store(), vec![id(4)]);
    }
}
