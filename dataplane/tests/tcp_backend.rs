//! `server::serve` picks io_uring or the blocking fallback. One test per binary: it sets
//! `MC_DISABLE_IO_URING`, which the process's other threads would otherwise race with.

use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::server::{probe, serve};

#[test]
fn serve_uses_io_uring_unless_refused_or_disabled() {
    let addr = "127.0.0.1:0".parse().unwrap();
    let memory = ServedMemory::new();
    let auto = serve(addr, memory.clone(), ServerConfig::default(), Some(0)).unwrap();
    match probe::probe() {
        status if status.is_available() => {
            assert_eq!((auto.backend(), auto.fallback_reason()), ("io_uring", None));
        }
        status => {
            println!("io_uring unavailable here: {status}");
            assert_eq!(auto.backend(), "blocking");
            assert_eq!(auto.fallback_reason(), Some(status.to_string().as_str()));
        }
    }
    drop(auto);
    std::env::set_var("MC_DISABLE_IO_URING", "1");
    let forced = serve(addr, memory, ServerConfig::default(), None).unwrap();
    std::env::remove_var("MC_DISABLE_IO_URING");
    assert_eq!(forced.backend(), "blocking");
    assert!(
        forced
            .fallback_reason()
            .unwrap()
            .contains("MC_DISABLE_IO_URING"),
        "{:?}",
        forced.fallback_reason()
    );
    // Same surface either way.
    assert_ne!(forced.local_addr().port(), 0);
    assert_eq!(forced.connection_count(), 0);
}
