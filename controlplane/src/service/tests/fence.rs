//! The recovery fence of a new HA term (`docs/ha.md`, "A recovery fence"): which reads and
//! removes wait for the owners' re-reports, and when the wait ends.

use protocol::message::*;
use protocol::*;

use super::tests::{held_at, remount_held, version_segments, C1, C2, MIB};
use super::*;
use crate::model::T;

#[test]
fn a_new_term_fences_reads_and_removes_while_owners_re_report() {
    let (_, s2) = version_segments();
    let t = T::new();
    t.svc.reset(41, &[]);
    t.mount(1, 64 * MIB);
    // An owner re-reports a key written in an earlier term: another owner may still hold a
    // newer version of it, so it waits for the fence.
    let old = Version { term: 40, seq: 9 };
    remount_held(&t, C2, &s2, vec![held_at("old", 4096, &s2, 0, old)]);
    // Writes go on: their versions are above every earlier term's.
    let d = t.put("k", 4096);
    assert_eq!(d[0].version, Version { term: 41, seq: 1 });
    let unavailable = Err(ErrorCode::UnavailableInCurrentStatus);
    assert_eq!(t.get("old").map(|_| ()), unavailable);
    assert_eq!(
        t.call(Request::ExistKey, ExistKey { key: "old".into() }),
        unavailable.map(|()| false)
    );
    // A key whose newest write is this term's is read at once: no re-report can replace it.
    assert_eq!(t.get("k").unwrap().replicas[0].version, d[0].version);
    assert!(t.exist("k"));
    // A key the index does not hold may be a late owner's: ask again.
    assert_eq!(t.get("nowhere").map(|_| ()), unavailable);
    // So is a remove of it: the tombstone at its version refuses every older re-report. A
    // remove of an older key waits: a newer version of it may still be re-reported.
    assert_eq!(t.remove("old", true), unavailable);
    t.put("gone", 4096);
    t.remove("gone", true).unwrap();
    let batch = t
        .call(
            Request::BatchExistKey,
            BatchExistKey {
                keys: vec!["old".into(), "k".into()],
            },
        )
        .unwrap();
    assert_eq!(
        batch,
        vec![Err(ErrorCode::UnavailableInCurrentStatus), Ok(true)]
    );
    t.advance(RECOVERY_FENCE_MS);
    assert!(t.exist("old"));
    assert!(t.exist("k"));
    assert_eq!(t.get("k").unwrap().replicas[0].version, d[0].version);
    // A late re-report of an older version of the key removed in the fence does not bring
    // it back.
    remount_held(&t, C2, &s2, vec![held_at("gone", 4096, &s2, 8192, old)]);
    assert_eq!(t.get("gone").map(|_| ()), Err(ErrorCode::ObjectNotFound));
}

#[test]
fn the_fence_ends_once_every_registered_owner_re_reported_in_full() {
    let (_, s2) = version_segments();
    let t = T::new();
    t.svc.reset(41, &[]);
    t.svc.await_owners(&[C2]);
    let old = Version { term: 40, seq: 9 };
    remount_held(&t, C2, &s2, vec![held_at("old", 4096, &s2, 0, old)]);
    // Re-mounted, but its re-report may go on in more calls: still fenced.
    let unavailable = Err(ErrorCode::UnavailableInCurrentStatus);
    assert_eq!(t.get("old").map(|_| ()), unavailable);
    assert_eq!(
        t.call(Request::ReMountDone, ReMountDone { client_id: C2 }),
        Ok(())
    );
    assert_eq!(t.get("old").unwrap().replicas[0].version, old);
    t.remove("old", true).unwrap();
}

#[test]
fn the_fence_waits_for_an_owner_that_did_not_say_it_is_done() {
    let (_, s2) = version_segments();
    let t = T::new();
    t.svc.reset(41, &[]);
    // Two registered owners; only one says it is done.
    t.svc.await_owners(&[C1, C2]);
    remount_held(
        &t,
        C2,
        &s2,
        vec![held_at("old", 4096, &s2, 0, Version { term: 40, seq: 9 })],
    );
    assert_eq!(
        t.call(Request::ReMountDone, ReMountDone { client_id: C2 }),
        Ok(())
    );
    assert_eq!(
        t.get("old").map(|_| ()),
        Err(ErrorCode::UnavailableInCurrentStatus)
    );
    t.advance(RECOVERY_FENCE_MS);
    assert!(t.exist("old"));
}
