//! `fault_slow_writer <master_addr> <key> <size_bytes>`: a writer that dies mid-put.
//!
//! Asks the master for one replica of `size_bytes` (`PutStart`), writes the first half of the
//! object's bytes straight into the replica with the data-plane client (no `CATALOG_PUT`, no
//! `PutEnd`), prints `half-written <segment> <addr> <size>` and sleeps until it is killed.
//! `tests/tests/fault_client_kill.rs` SIGKILLs it there and checks that the half-written
//! object never becomes readable and that its space comes back.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use client::dataplane::transport::client::{ClientConfig, TcpClient};
use client::MasterClient;
use protocol::message::PutStart;
use protocol::{ReplicateConfig, Uuid};

/// The byte at `i` of the killed writer's object (the test tells it from a later writer's).
pub fn byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(13).wrapping_add(0x5a)
}

fn fail(why: String) -> ! {
    eprintln!("fault_slow_writer: {why}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        fail("usage: fault_slow_writer <master_addr> <key> <size_bytes>".into());
    }
    let size: u64 = args[3]
        .parse()
        .unwrap_or_else(|_| fail(format!("size must be a number, got {:?}", args[3])));
    let master =
        MasterClient::new(&args[1]).unwrap_or_else(|e| fail(format!("master {}: {e}", args[1])));
    let replicas = master
        .call(&PutStart {
            client_id: Uuid::from_parts(0x51, u64::from(std::process::id())),
            key: args[2].clone(),
            size,
            config: ReplicateConfig::default(),
        })
        .unwrap_or_else(|e| fail(format!("PutStart: {e}")))
        .unwrap_or_else(|e| fail(format!("PutStart refused: {e:?}")));
    let r = replicas
        .first()
        .unwrap_or_else(|| fail("PutStart gave no replica".into()));
    let peer: SocketAddr = r
        .transport_endpoint
        .parse()
        .unwrap_or_else(|_| fail(format!("endpoint {:?}", r.transport_endpoint)));
    let data = TcpClient::connect(peer, ClientConfig::default())
        .unwrap_or_else(|e| fail(format!("connect {peer}: {e}")));
    let half: Vec<u8> = (0..(size / 2) as usize).map(byte).collect();
    data.write(r.buffer_address, &half)
        .unwrap_or_else(|e| fail(format!("write: {e}")));
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "half-written {} {:#x} {}",
        r.segment_name, r.buffer_address, size
    );
    let _ = out.flush();
    drop(out);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
