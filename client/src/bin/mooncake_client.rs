//! `mooncake_client`: a storage node contributing memory to a Mooncake store (upstream's
//! standalone memory provider), with `--shards` shared-nothing shards. See `client::node`.
//!
//! Prints one line per mounted segment, then `mooncake_client ready`, on stdout; pings the
//! master until SIGTERM or SIGINT, then unmounts every segment and exits 0. Exits 1 when it
//! cannot start, 2 on bad flags.

use std::sync::atomic::{AtomicBool, Ordering};

use client::node::{Node, NodeConfig, USAGE};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `sigaction` is plain data, zero is a valid initial value; the handler only
        // stores to an atomic, which is async-signal-safe; the pointers are to live locals.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn main() {
    let cfg = match NodeConfig::parse_args(std::env::args().skip(1)) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("mooncake_client: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    install_signal_handlers();
    let node = match Node::start(&cfg) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("mooncake_client: {e}");
            std::process::exit(1);
        }
    };
    for (i, s) in node.segments().iter().enumerate() {
        println!(
            "shard {i} segment {} te_endpoint {} base {:#x} size {}",
            s.name, s.te_endpoint, s.base, s.size
        );
    }
    println!("mooncake_client ready");
    node.run(&STOP);
    node.shutdown();
    drop(node);
    eprintln!("mooncake_client: stopped");
}
