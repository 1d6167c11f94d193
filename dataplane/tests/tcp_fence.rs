//! FENCE on both server backends (`recovery::fence`): a connection declares the master's term its
//! WRITEs belong to; once the served memory is fenced at a later term, such WRITEs are refused
//! on their header (ERR_METADATA, payload dropped, memory untouched, the connection goes on), a
//! FENCE of an ended term is refused and the connection closed, and a connection of an ended
//! term that is inside a WRITE's payload is shut down, so the rest of that payload never
//! lands. Undeclared connections (term 0) are not fenced.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{pattern, Backend, Fixture};
use dataplane::transport::client::{ClientConfig, TcpClient, TransferError};
use dataplane::transport::header::{
    Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};
use dataplane::TeError;

const SEGMENT_BYTES: usize = 1 << 20;

fn client_of(f: &Fixture, term: u64) -> Result<TcpClient, TransferError> {
    TcpClient::connect(
        f.addr(),
        ClientConfig {
            lanes: 2,
            io_timeout: Duration::from_secs(5),
            term,
            ..Default::default()
        },
    )
}

fn refused(code: TeError) -> Result<(), TransferError> {
    Err(TransferError::Refused {
        status: code.code(),
    })
}

fn request(opcode: Opcode, id: u64, addr: u64, len: u64) -> [u8; REQUEST_HEADER_BYTES] {
    RequestHeader {
        opcode,
        request_id: id,
        addr,
        len,
    }
    .encode()
}

fn response(s: &mut TcpStream) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_HEADER_BYTES];
    s.read_exact(&mut raw).unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

/// A raw connection that declared `term` with FENCE, and had it accepted.
fn declared(f: &Fixture, term: u64) -> TcpStream {
    let mut s = TcpStream::connect(f.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&request(Opcode::Fence, 1, term, 0)).unwrap();
    assert_eq!(response(&mut s).status, 0);
    s
}

fn writes_are_fenced_by_their_connections_term(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let base = f.base();
    let fences = f.memory.catalog().fences();
    let old = client_of(&f, 10).unwrap();
    let undeclared = client_of(&f, 0).unwrap();
    assert_eq!(old.write(base, &[1u8; 64]), Ok(()), "no fence yet");
    // One small write: the client's first lane, the only one it dialed, declared the term.
    assert_eq!(fences.declared(), 1, "one lane of term 10");

    // The owner hears of term 20. The old term's idle lanes stay up: its WRITEs are refused on
    // their header, its READs still served.
    assert_eq!(f.memory.catalog().fence(20), 0);
    assert_eq!(
        old.write(base + 4096, &[2u8; 64]),
        refused(TeError::Metadata)
    );
    let mut back = [0u8; 64];
    assert_eq!(old.read(base, &mut back), Ok(()));
    assert_eq!(back, [1u8; 64]);
    // A client of the old term cannot connect again: its FENCE is refused.
    match client_of(&f, 10) {
        Err(e) => assert_eq!(Err(e), refused(TeError::Metadata)),
        Ok(_) => panic!("a FENCE of term 10 was taken after the fence rose to 20"),
    }
    // The new term writes; an undeclared connection (the raw transfer engine) too.
    let new = client_of(&f, 20).unwrap();
    assert_eq!(new.write(base + 8192, &[3u8; 64]), Ok(()));
    assert_eq!(undeclared.write(base + 12288, &[4u8; 64]), Ok(()));
    assert_eq!(f.snapshot(0, 64), vec![1u8; 64]);
    assert_eq!(f.snapshot(8192, 64), vec![3u8; 64]);
    assert_eq!(f.snapshot(12288, 64), vec![4u8; 64]);
    f.assert_pattern_outside_all(&[(0, 64), (8192, 64), (12288, 64)]);

    assert_eq!(fences.declared(), 2, "one lane of each term");
    // A closed connection's declaration goes when the server sees the close.
    drop(old);
    drop(new);
    let t0 = std::time::Instant::now();
    while fences.declared() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "declarations outlive their lanes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn a_payload_still_arriving_when_the_fence_rises_does_not_land(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let base = f.base();
    let mut s = declared(&f, 10);
    // A WRITE of 64 KiB whose writer stalls after its first 100 bytes.
    let len = 64 << 10;
    s.write_all(&request(Opcode::Write, 2, base, len as u64))
        .unwrap();
    s.write_all(&[0xAB; 100]).unwrap();
    // Give the server time to take the header and start receiving into memory.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        f.memory.catalog().fence(20),
        1,
        "the stalled connection is cut"
    );
    // The writer wakes up: the rest of its payload is not taken.
    let _ = s.write_all(&[0xAB; 64 << 10]);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    std::thread::sleep(Duration::from_millis(100));
    let after = f.snapshot(100, len - 100);
    assert!(
        after
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(100 + i)),
        "bytes sent after the fence rose landed"
    );
    assert_eq!(
        f.memory.catalog().fences().declared(),
        0,
        "cut at the raise"
    );
}

/// A WRITE of the old term queued behind work the server has not finished (here: READ
/// answers its writer does not take) when the fence rises never lands: the server reads its
/// header after the fence rose, refuses it and drops the payload.
fn a_queued_write_of_an_ended_term_does_not_land(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let base = f.base();
    let mut s = declared(&f, 10);
    // 1 100 READ answers of 1 MiB fill both socket buffers and a shard's queue of
    // answers (1 024): the server stops taking requests.
    let reads = dataplane::limits::CONN_RESPONSES_QUEUED_MAX as u64 + 76;
    let mut headers = Vec::new();
    for id in 0..reads {
        headers.extend_from_slice(&request(Opcode::Read, 10 + id, base, SEGMENT_BYTES as u64));
    }
    s.write_all(&headers).unwrap();
    s.write_all(&request(Opcode::Write, 2, base, 4096)).unwrap();
    s.write_all(&[0xCD; 4096]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = f.snapshot(0, 4096);
    assert!(
        before.iter().enumerate().all(|(i, &b)| b == pattern(i)),
        "the server took the WRITE before the fence rose: the test did not stall it"
    );
    f.memory.catalog().fence(20);
    // Take the READ answers; the WRITE's answer follows them: refused on its header.
    let mut sink = vec![0u8; SEGMENT_BYTES];
    loop {
        let r = response(&mut s);
        if r.request_id == 2 {
            assert_eq!(r.status, TeError::Metadata.code());
            break;
        }
        s.read_exact(&mut sink[..r.len as usize]).unwrap();
    }
    assert!(
        f.snapshot(0, 4096)
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i)),
        "the old term's WRITE landed after the fence rose"
    );
}

both_backends!(
    writes_are_fenced_by_their_connections_term,
    a_payload_still_arriving_when_the_fence_rises_does_not_land,
    a_queued_write_of_an_ended_term_does_not_land,
);
