//! `BatchReplicaClear`: a client clears replicas of the objects it wrote (upstream's
//! owner-checked clear).
//!
//! A key is cleared only when the caller is its writer (`Object::writer`, the client whose put
//! started last), no lease blocks a remove (`Object::remove_blocked`) and every replica is
//! COMPLETE (no put or upsert in flight). Anything else skips the key with the reason as its
//! status; the client reports the cleared keys only.
//!
//! **A disk's owner** may also clear the replica on its own disk segment (the segment named),
//! whoever wrote the object: it does so when that copy's file failed its checksum or went
//! missing (`docs/tiering.md`). Leases and tasks do not stop it, since the bytes are already
//! lost; a reader that holds the range keeps it parked until its window ends, as always.
//!
//! Two kinds of clear, which differ in what they leave behind:
//! - **the whole object** (no segment named, or the named segment held its last replica): as
//!   `Remove`, through [`State::retire`]: a tombstone, the buffers parked while a read window
//!   is open, and the freed replicas returned for the caller to bury in the owners' catalogs
//!   (so a later leader does not bring the key back from the owners' re-reports);
//! - **one segment's replica** while others remain: the replica leaves the object and its span
//!   is released as eviction releases spans (parked while a read window is open, then freed
//!   into the segment's freed outbox, which tells the owner at its next ping). No tombstone:
//!   the other replicas hold the same version and stay readable, and a tombstone re-reported
//!   after a failover would bury them. Nothing is returned to bury, for the same reason.
//!   Until the owner's next ping a failover may bring the cleared replica back (the window of
//!   every range the master frees alone, `docs/recovery.md`).

use protocol::{ErrorCode, Uuid};

use super::object::{check_key, Object};
use super::State;

/// What clearing one key did.
pub(crate) enum Cleared {
    /// The object is gone (tombstoned): its replicas, for the caller to bury.
    Object(Object),
    /// One replica went; the object keeps its others.
    Replica,
}

impl State {
    /// Clears `key` for `client`: the whole object when `segment` is `None`, else only its
    /// replica on that segment (the object too when that was its last).
    pub(crate) fn replica_clear(
        &mut self,
        now: u64,
        client: Uuid,
        key: &str,
        segment: Option<&str>,
    ) -> Result<Cleared, ErrorCode> {
        check_key(key)?;
        self.fenced(now)?;
        let obj = self.objects.get(key).ok_or_else(|| self.missing(now))?;
        let disk_owner = segment
            .and_then(|name| self.segs.by_name(name))
            .and_then(|r| self.segs.get(r))
            .is_some_and(|s| s.is_disk() && s.client == client);
        if !self.objects.written_by(obj, client) && !disk_owner {
            return Err(ErrorCode::IllegalClient);
        }
        if !disk_owner && obj.remove_blocked(now) {
            return Err(ErrorCode::ObjectHasLease);
        }
        if !obj.is_complete() {
            return Err(ErrorCode::ReplicaIsNotReady);
        }
        if !disk_owner && self.tasks.active(key) {
            return Err(ErrorCode::ObjectHasReplicationTask);
        }
        // The replica to drop alone, or `None` to clear the whole object (no segment named,
        // or the named one holds its last replica).
        let single = match segment {
            None => None,
            Some(name) => {
                let seg = self.segs.by_name(name).ok_or(ErrorCode::SegmentNotFound)?;
                let at = obj
                    .replicas
                    .iter()
                    .position(|r| r.seg == seg)
                    .ok_or(ErrorCode::ReplicaNotFound)?;
                (obj.replicas.len() > 1).then_some(at)
            }
        };
        let Some(at) = single else {
            return self
                .retire(now, key)
                .map(Cleared::Object)
                .ok_or(ErrorCode::InternalError);
        };
        let obj = self.objects.get_mut(key).ok_or(ErrorCode::InternalError)?;
        let hold_until = obj.read_hold_until();
        let release_ms = self.cfg.release_timeout_ms();
        let hold_until = hold_until.max(self.tasks.executor_hold(key, now, release_ms));
        let r = obj.replicas.swap_remove(at);
        self.objects.settle(key);
        self.release(r.seg, r.span, hold_until, now);
        Ok(Cleared::Replica)
    }
}
