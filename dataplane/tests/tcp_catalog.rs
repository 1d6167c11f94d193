//! CATALOG_PUT on both server backends: the range is checked as a WRITE's, a bad record is
//! refused without breaking the connection, a reused range replaces what was recorded there,
//! the request goes on the lane of the WRITE before it, an intent drops what its WRITE goes
//! over, and a lone intent (an RDMA writer's) is answered at once and fenced by its term.

#[macro_use]
mod common;

use dataplane::mem::Src;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Backend, Fixture};
use dataplane::recovery::{CatalogEntry, CatalogRecord, RecordKind};
use dataplane::transport::client::{TransferError, TransferOp};
use dataplane::transport::header::{
    Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};
use dataplane::TeError;

const SEGMENT_BYTES: usize = 4 << 20;

fn record(len: u64, key: &str, hard_pin: bool) -> Vec<u8> {
    CatalogRecord {
        len,
        hard_pin,
        key,
        version: protocol::Version::ZERO,
        kind: RecordKind::Object,
        soft_pin_ttl_ms: None,
    }
    .encode()
}

/// A soft-pinned record (soft pins need a version).
fn soft_pinned(len: u64, key: &str, ttl_ms: u64) -> Vec<u8> {
    CatalogRecord {
        len,
        hard_pin: false,
        key,
        version: protocol::Version { term: 1, seq: 1 },
        kind: RecordKind::Object,
        soft_pin_ttl_ms: Some(ttl_ms),
    }
    .encode()
}

fn catalog_put(f: &Fixture, addr: u64, rec: &[u8]) -> Result<(), TransferError> {
    let client = f.client(1);
    let mut ops = [TransferOp::CatalogPut {
        remote_addr: addr,
        record: Src::from(rec),
    }];
    client.submit(&mut ops).pop().unwrap()
}

/// The catalog's keys, in address order.
fn keys(f: &Fixture) -> Vec<String> {
    f.memory
        .catalog()
        .entries()
        .into_iter()
        .map(|e| e.key)
        .collect()
}

fn refused(code: TeError) -> Result<(), TransferError> {
    Err(TransferError::Refused {
        status: code.code(),
    })
}

fn catalog_put_validates_and_replaces(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let base = f.base();
    let end = base + SEGMENT_BYTES as u64;
    // Inside registered memory: recorded.
    assert_eq!(
        catalog_put(&f, base + 4096, &soft_pinned(100, "a", 600_000)),
        Ok(())
    );
    assert_eq!(
        catalog_put(&f, base + 8192, &record(4096, "b", true)),
        Ok(())
    );
    // Outside, straddling the end, or wrapping: refused like a WRITE, nothing recorded.
    let outside = record(10, "x", false);
    assert_eq!(
        catalog_put(&f, end, &outside),
        refused(TeError::AddressNotRegistered)
    );
    assert_eq!(
        catalog_put(&f, end - 5, &outside),
        refused(TeError::AddressNotRegistered)
    );
    assert_eq!(
        catalog_put(&f, u64::MAX - 3, &outside),
        refused(TeError::AddressNotRegistered)
    );
    // A malformed record: refused, the connection goes on.
    let mut bad = record(10, "x", false);
    bad[8] = 0x80;
    assert_eq!(
        catalog_put(&f, base, &bad),
        refused(TeError::InvalidArgument)
    );
    assert_eq!(
        catalog_put(&f, base, &record(10, "x", false)[..16]),
        refused(TeError::InvalidArgument),
        "an empty key"
    );
    assert_eq!(f.memory.catalog().len(), 2, "only a and b");
    // A reused range replaces everything it overlaps (the tail of "b" here).
    assert_eq!(
        catalog_put(&f, base + 8192 + 4000, &record(200, "c", false)),
        Ok(())
    );
    let entries = f.memory.catalog().entries();
    assert_eq!(
        entries,
        vec![
            CatalogEntry {
                addr: base + 4096,
                len: 100,
                key: "a".into(),
                hard_pin: false,
                soft_pin_ttl_ms: Some(600_000),
                version: protocol::Version { term: 1, seq: 1 },
            },
            CatalogEntry {
                addr: base + 8192 + 4000,
                len: 200,
                key: "c".into(),
                hard_pin: false,
                soft_pin_ttl_ms: None,
                version: protocol::Version::ZERO,
            },
        ]
    );
    // Unregistering the buffer drops its entries.
    f.memory.unregister(base).unwrap();
    assert!(f.memory.catalog().is_empty());
}

/// A WRITE then its CATALOG_PUT in one batch over many lanes: each record lands, and only
/// after its bytes (same lane, in order).
fn catalog_put_follows_its_write(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(4);
    let n = 64usize;
    let data: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 1000 + i]).collect();
    let recs: Vec<Vec<u8>> = (0..n)
        .map(|i| record(data[i].len() as u64, &format!("k{i}"), false))
        .collect();
    let mut ops = Vec::new();
    for i in 0..n {
        let addr = f.base() + (i as u64) * 4096;
        ops.push(TransferOp::Write {
            remote_addr: addr,
            src: Src::from(&data[i][..]),
        });
        ops.push(TransferOp::CatalogPut {
            remote_addr: addr,
            record: Src::from(&recs[i][..]),
        });
    }
    assert!(client.submit(&mut ops).iter().all(Result::is_ok));
    let entries = f.memory.catalog().entries();
    assert_eq!(entries.len(), n);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(
            (e.key.as_str(), e.len),
            (format!("k{i}").as_str(), 1000 + i as u64)
        );
    }
}

/// A header announcing a record longer than the limit is malformed: refused, then closed.
fn oversized_record_is_malformed(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let mut s = TcpStream::connect(f.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut h = RequestHeader {
        opcode: Opcode::CatalogPut,
        request_id: 7,
        addr: f.base(),
        len: dataplane::limits::CATALOG_RECORD_MAX_BYTES,
    }
    .encode();
    h[24..32].copy_from_slice(&(dataplane::limits::CATALOG_RECORD_MAX_BYTES + 1).to_le_bytes());
    assert_eq!(h.len(), REQUEST_HEADER_BYTES);
    s.write_all(&h).unwrap();
    let mut raw = [0u8; RESPONSE_HEADER_BYTES];
    s.read_exact(&mut raw).unwrap();
    let resp = ResponseHeader::decode(&raw).unwrap();
    assert_eq!(
        (resp.status, resp.request_id),
        (TeError::InvalidArgument.code(), 7)
    );
    let mut rest = Vec::new();
    assert_eq!(
        s.read_to_end(&mut rest).unwrap_or(0),
        0,
        "closed after the error"
    );
    assert!(f.memory.catalog().is_empty());
}

/// A record of `key` written in `term`.
fn of_term(len: u64, key: &str, term: u64) -> Vec<u8> {
    CatalogRecord {
        len,
        hard_pin: false,
        key,
        version: protocol::Version { term, seq: 1 },
        kind: RecordKind::Object,
        soft_pin_ttl_ms: None,
    }
    .encode()
}

/// Once the owner heard of term 20, a record of term 10 (a put its master started before the
/// election, landing late) is refused with ERR_METADATA and leaves the newer object's entry in
/// place; records of term 20 and later are taken, and so is a late tombstone.
fn catalog_put_of_an_earlier_term_is_refused_once_fenced(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let base = f.base();
    assert_eq!(catalog_put(&f, base, &of_term(4096, "old", 10)), Ok(()));
    f.memory.catalog().fence(20);
    // The new term's put took the range: its entry replaces the old one.
    assert_eq!(catalog_put(&f, base, &of_term(4096, "new", 20)), Ok(()));
    // The old term's late record for the same range: refused, nothing replaced.
    assert_eq!(
        catalog_put(&f, base + 1024, &of_term(100, "late", 10)),
        refused(TeError::Metadata)
    );
    assert_eq!(keys(&f), vec!["new".to_string()]);
    // A later term is taken before the owner hears of it.
    assert_eq!(
        catalog_put(&f, base + 8192, &of_term(64, "next", 21)),
        Ok(())
    );
    // A late tombstone of the old term is applied (it drops only its own key's older entries)
    // but answered ERR_METADATA: the newer master may have had this owner's re-report
    // already, so the remover must tell it (`KeepRemoved`).
    let tomb = CatalogRecord {
        len: 4096,
        hard_pin: false,
        key: "new",
        version: protocol::Version { term: 10, seq: 2 },
        kind: RecordKind::Tombstone,
        soft_pin_ttl_ms: None,
    }
    .encode();
    assert_eq!(
        catalog_put(&f, base, &tomb),
        Err(TransferError::Refused {
            status: TeError::Metadata.code()
        })
    );
    assert_eq!(keys(&f), vec!["new".to_string(), "next".to_string()]);
    // The connection serves on after a refusal, and fence 0 turns the check off.
    f.memory.catalog().fence(0);
    assert_eq!(
        catalog_put(&f, base + 1024, &of_term(100, "late", 10)),
        Ok(())
    );
    assert_eq!(keys(&f), vec!["late".to_string(), "next".to_string()]);
}

/// A write's intent (a CATALOG_PUT of kind INTENT just before its WRITE, on its lane) drops
/// the older entries of other keys its object overlaps before the bytes land, even when the
/// writer never records; it spares its own key's entry in place (an in-place upsert) and
/// anything newer. A WRITE alone and a READ drop nothing; an intent outside registered memory
/// is refused, as its WRITE is.
fn an_intent_drops_what_its_write_goes_over(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let base = f.base();
    let end = base + SEGMENT_BYTES as u64;
    let at = |seq| protocol::Version { term: 1, seq };
    fn entry(len: u64, key: &str, version: protocol::Version) -> CatalogRecord<'_> {
        CatalogRecord {
            len,
            hard_pin: false,
            key,
            version,
            kind: RecordKind::Object,
            soft_pin_ttl_ms: None,
        }
    }
    let intent = |len, key, v| CatalogRecord::intent(len, key, v).encode();
    for (addr, key) in [(base, "a"), (base + 4096, "b"), (end - 1000, "c")] {
        assert_eq!(
            catalog_put(&f, addr, &entry(1000, key, at(1)).encode()),
            Ok(())
        );
    }
    let client = f.client(4);
    let bytes = vec![7u8; 5000];
    let write = |addr: u64, intent: Option<&[u8]>, n: usize| {
        let mut ops = Vec::new();
        if let Some(rec) = intent {
            ops.push(TransferOp::CatalogIntent {
                remote_addr: addr,
                record: Src::from(rec),
            });
        }
        ops.push(TransferOp::Write {
            remote_addr: addr,
            src: Src::from(&bytes[..n]),
        });
        client.submit(&mut ops)
    };
    // A bare WRITE, a READ: nothing dropped.
    assert_eq!(write(base + 500, None, 100), [Ok(())]);
    let mut back = vec![0u8; 1000];
    assert_eq!(client.read(end - 1000, &mut back), Ok(()));
    assert_eq!(keys(&f), ["a", "b", "c"]);
    // The same key in place: spared; another key over "a" and "b": both go.
    let own = intent(1000, "a", at(2));
    assert_eq!(write(base, Some(&own), 1000), [Ok(()), Ok(())]);
    assert_eq!(keys(&f), ["a", "b", "c"]);
    let other = intent(5000, "x", at(2));
    assert_eq!(write(base, Some(&other), 5000), [Ok(()), Ok(())]);
    assert_eq!(keys(&f), ["c"]);
    // A newer entry stays under a late intent; an intent past the registered memory is
    // refused like its WRITE.
    let newer = intent(1000, "y", at(0));
    assert_eq!(write(end - 1000, Some(&newer), 1000), [Ok(()), Ok(())]);
    assert_eq!(keys(&f), ["c"]);
    let past_end = intent(1000, "z", at(3));
    let outside = refused(TeError::AddressNotRegistered);
    assert_eq!(
        write(end - 100, Some(&past_end), 1000),
        [outside.clone(), outside]
    );
    assert_eq!(keys(&f), ["c"]);
    // A put's intent, WRITE and record: the record stands.
    let rec = entry(200, "d", at(4)).encode();
    let pre = intent(200, "d", at(4));
    let mut ops = [
        TransferOp::CatalogIntent {
            remote_addr: base + 8192,
            record: Src::from(&pre[..]),
        },
        TransferOp::Write {
            remote_addr: base + 8192,
            src: Src::from(&bytes[..200]),
        },
        TransferOp::CatalogPut {
            remote_addr: base + 8192,
            record: Src::from(&rec[..]),
        },
    ];
    assert!(client.submit(&mut ops).iter().all(Result::is_ok));
    assert_eq!(keys(&f), ["d", "c"]);
}

/// An RDMA writer's intent comes alone (its bytes go by RDMA once it is answered): the server
/// answers it at once, though it holds an intent's answer for the WRITE right behind it when
/// that is already arriving. An intent of a term the owner has fenced off is refused and drops
/// nothing, which stops that writer before its bytes.
fn a_lone_intent_is_answered_and_fenced_by_its_term(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let base = f.base();
    for (addr, key) in [(base, "a"), (base + 4096, "b")] {
        assert_eq!(catalog_put(&f, addr, &of_term(1000, key, 10)), Ok(()));
    }
    let client = f.client(1);
    let intent = |addr: u64, rec: &[u8]| {
        let mut ops = [TransferOp::CatalogIntent {
            remote_addr: addr,
            record: Src::from(rec),
        }];
        client.submit(&mut ops).pop().unwrap()
    };
    let of = |key, term| CatalogRecord::intent(1000, key, protocol::Version { term, seq: 2 });
    // Answered (not held until the client's 5 s timeout), and applied.
    assert_eq!(intent(base, &of("x", 10).encode()), Ok(()));
    assert_eq!(keys(&f), ["b"]);
    // Two in one submission, as a batch of RDMA puts to one owner sends them.
    let (y, z) = (of("y", 10).encode(), of("z", 10).encode());
    let mut two = [
        TransferOp::CatalogIntent {
            remote_addr: base + 4096,
            record: Src::from(&y[..]),
        },
        TransferOp::CatalogIntent {
            remote_addr: base + 8192,
            record: Src::from(&z[..]),
        },
    ];
    assert_eq!(client.submit(&mut two), [Ok(()), Ok(())]);
    assert!(f.memory.catalog().is_empty());
    // Fenced: a term-10 intent is refused and drops nothing; the fence's term goes through.
    assert_eq!(catalog_put(&f, base, &of_term(1000, "c", 20)), Ok(()));
    f.memory.catalog().fence(20);
    assert_eq!(
        intent(base, &of("late", 10).encode()),
        refused(TeError::Metadata)
    );
    assert_eq!(keys(&f), ["c"]);
    let current = CatalogRecord::intent(1000, "d", protocol::Version { term: 20, seq: 9 });
    assert_eq!(intent(base, &current.encode()), Ok(()));
    assert!(f.memory.catalog().is_empty());
}

both_backends!(
    a_lone_intent_is_answered_and_fenced_by_its_term,
    an_intent_drops_what_its_write_goes_over,
    catalog_put_of_an_earlier_term_is_refused_once_fenced,
    catalog_put_validates_and_replaces,
    catalog_put_follows_its_write,
    oversized_record_is_malformed,
);
