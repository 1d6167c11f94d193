//! The Rust store client against the real master binary: two clients in this process, each
//! contributing a segment served over real loopback sockets.

use client::store::StoreError;
use client::store::{Dst, Lookup, ObjectRead, Src};
use client::{Store, StoreConfig};
use mooncake_tests::Master;
use protocol::{ErrorCode, ReplicateConfig};

fn store(m: &Master, seg_mib: u64, buf_mib: u64) -> Store {
    Store::setup(StoreConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: format!("http://127.0.0.1:{}/metadata", m.http_metadata_port),
        global_segment_size: seg_mib << 20,
        local_buffer_size: buf_mib << 20,
        protocol: "tcp".into(),
        rdma_devices: String::new(),
        master_server_addr: m.rpc_addr(),
        tenant_id: String::new(),
        ssd_offload: None,
    })
    .expect("setup")
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn put_on_one_client_get_on_another() {
    let m = Master::start(&["--default_kv_lease_ttl=200"]);
    let a = store(&m, 64, 32);
    let b = store(&m, 64, 32);
    let port = |s: &Store| {
        s.hostname()
            .rsplit_once(':')
            .unwrap()
            .1
            .parse::<u16>()
            .unwrap()
    };
    assert!((12300..=14300).contains(&port(&a)), "{}", a.hostname());
    assert_ne!(a.hostname(), b.hostname());

    let cfg = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    for (i, len) in [1usize, 4096, 100_000, 3 << 20].into_iter().enumerate() {
        let key = format!("obj-{i}");
        let v = pattern(i as u8, len);
        a.put(&key, &v, &cfg, false).unwrap();
        assert_eq!(b.get(&key).unwrap(), v, "{key}");
        assert_eq!(a.get(&key).unwrap(), v, "{key}");
        assert_eq!(b.get_size(&key), Ok(len as u64));
        let list = b.replicas(&key).unwrap();
        let names: std::collections::HashSet<_> =
            list.replicas.iter().map(|r| &r.segment_name).collect();
        assert_eq!(names.len(), 2, "replicas must sit on distinct segments");
    }
    // First writer wins: a second put succeeds but does not overwrite; upsert does.
    a.put("obj-0", b"zz", &cfg, false).unwrap();
    assert_eq!(b.get("obj-0").unwrap(), pattern(0, 1));
    a.put("obj-0", b"new!", &cfg, true).unwrap();
    assert_eq!(b.get("obj-0").unwrap(), b"new!");

    assert_eq!(
        b.get("missing").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(b.is_exist("obj-1"), Ok(true));
    assert_eq!(
        b.remove("obj-1", false).map_err(ErrorCode::from),
        Err(ErrorCode::ObjectHasLease)
    );
    std::thread::sleep(std::time::Duration::from_millis(250));
    assert_eq!(b.remove("obj-1", false), Ok(()));
    assert_eq!(b.is_exist("obj-1"), Ok(false));
}

#[test]
fn data_survives_the_writers_close_only_with_a_second_replica() {
    let m = Master::start(&[]);
    let a = store(&m, 32, 16);
    let b = store(&m, 32, 16);
    let one = ReplicateConfig {
        replica_num: 1,
        preferred_segment: a.hostname().into(),
        ..Default::default()
    };
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    a.put("only-on-a", b"solo", &one, false).unwrap();
    a.put("on-both", b"duo", &two, false).unwrap();
    a.close();
    a.close(); // idempotent
    assert_eq!(b.get("on-both").unwrap(), b"duo");
    assert!(b.get("only-on-a").is_err());
    assert_eq!(b.is_exist("only-on-a"), Ok(false));
}

#[test]
fn local_buffer_bounds_the_copying_calls() {
    let m = Master::start(&[]);
    let s = store(&m, 16, 0);
    assert_eq!(
        s.put("k", b"value", &ReplicateConfig::default(), false)
            .map_err(ErrorCode::from),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(s.is_exist("k"), Ok(false));
    let big = store(&m, 16, 1);
    assert_eq!(
        big.put(
            "k2",
            &vec![7u8; 2 << 20],
            &ReplicateConfig::default(),
            false
        )
        .map_err(ErrorCode::from),
        Err(ErrorCode::InvalidParams)
    );

    // The batch and copy-out forms keep the same bound, with the reason; zero-copy calls
    // on the same bytes are not bounded by it.
    let cfg = ReplicateConfig::default();
    let keys: Vec<String> = vec!["b1".into(), "b2".into()];
    let vals = [vec![1u8; 600 << 10], vec![2u8; 600 << 10]];
    let parts: Vec<Vec<Src<'_>>> = vals.iter().map(|v| vec![Src::from(v)]).collect();
    for r in big.put_many_copied(&keys, &parts, &cfg, false) {
        let e = r.expect_err("1.2 MiB in a 1 MiB local buffer");
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert!(
            e.cause.contains("does not fit in the free local buffer"),
            "{e}"
        );
    }
    assert_eq!(big.batch_is_exist(&keys), vec![Ok(false), Ok(false)]);
    for r in big.put_many(&keys, &parts, &cfg, false) {
        assert_eq!(r, Ok(()));
    }
    assert!(big.put_many_copied(&keys[..1], &parts[..1], &cfg, true)[0].is_ok());
    let (list, held) = big.locate_copy("b1").expect("b1 fits");
    assert_eq!(held.bytes(), 600 << 10);
    let e = big
        .locate_copy("b2")
        .map(|_| ())
        .expect_err("b1's copy holds the buffer");
    assert!(e.cause.starts_with("get b2: "), "{e}");
    drop(held);
    let mut out = [vec![0u8; 600 << 10], vec![0u8; 600 << 10]];
    let lists = [list, big.replicas("b2").expect("b2 stored")];
    for r in big.read_many_copied(whole_reads(&lists, &mut out)) {
        assert_eq!(r.map_err(|e| e.code), Err(ErrorCode::InvalidParams));
    }
    assert!(big
        .read_many_from(whole_reads(&lists, &mut out))
        .iter()
        .all(Result::is_ok));
    assert_eq!(out, vals);
}

/// Reads of each whole object of `lists` into the buffer of the same index.
fn whole_reads<'a>(lists: &'a [Lookup], out: &'a mut [Vec<u8>]) -> Vec<ObjectRead<'a>> {
    (lists.iter().zip(out))
        .map(|(list, o)| ObjectRead {
            list,
            offset: 0,
            dst: Dst::from(&mut o[..]),
        })
        .collect()
}

#[test]
fn zero_copy_calls_use_registered_or_mapped_memory() {
    let m = Master::start(&[]);
    let s = store(&m, 16, 4);
    let src = pattern(3, 8192);
    let mut dst = vec![0u8; 8192];
    let (sp, dp) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    let cfg = ReplicateConfig::default();
    // Unmapped memory is refused before any byte moves; mapped memory is used registered or
    // not, as upstream over TCP does.
    assert_eq!(
        s.caller_range(8, 8192).err(),
        Some(ErrorCode::InvalidParams)
    );
    assert_eq!(s.caller_range(sp, 8192).map(|r| r.len()), Ok(8192));
    // A destination must be writable: constant bytes are mapped read-only.
    static CONSTANT: [u8; 64] = [5; 64];
    let ro = CONSTANT.as_ptr() as u64;
    assert_eq!(s.caller_range(ro, 64).map(|r| r.len()), Ok(64));
    assert_eq!(
        s.caller_range_mut(ro, 64).err(),
        Some(ErrorCode::InvalidParams)
    );
    // SAFETY: `src` and `dst` are not moved or freed before their `unregister_buffer`s
    // below.
    unsafe {
        s.register_buffer(sp, 8192).unwrap();
        s.register_buffer(dp, 8192).unwrap();
        s.register_buffer(sp, 8192).unwrap(); // same buffer again: fine
    }
    // SAFETY: as above (refused anyway: it overlaps).
    let e = unsafe { s.register_buffer(sp + 10, 10) }.expect_err("overlaps");
    assert_eq!(e.code, ErrorCode::InvalidParams);
    assert!(e.cause.contains("register_buffer: 10 bytes at"), "{e}");
    // A range that starts in a registered buffer must end in it.
    assert_eq!(
        s.caller_range(sp + 100, 8192).err(),
        Some(ErrorCode::InvalidParams)
    );
    let whole = s.caller_range(sp, 8192).unwrap();
    // SAFETY: `src` is live and untouched by Rust references until the put returns.
    s.put_parts("zc", &[unsafe { whole.src() }], &cfg, false)
        .unwrap();
    // SAFETY: `dst` is live and nothing else touches it during the call.
    let too_small = unsafe { s.get_into("zc", dp, 100) }.map_err(ErrorCode::from);
    assert_eq!(too_small, Err(ErrorCode::InvalidParams));
    // SAFETY: as above.
    assert_eq!(unsafe { s.get_into("zc", dp, 8192) }, Ok(8192));
    assert_eq!(dst, src);
    s.unregister_buffer(dp).unwrap();
    let e = s.unregister_buffer(dp).expect_err("not registered");
    assert!(
        e == ErrorCode::InvalidParams && e.cause.starts_with("unregister_buffer"),
        "{e}"
    );
    dst.fill(0);
    // SAFETY: as above; unregistered, `dst` is still mapped and ours.
    assert_eq!(unsafe { s.get_into("zc", dp, 8192) }, Ok(8192));
    assert_eq!(dst, src);
    // SAFETY: address 8 is refused by the check before any byte moves.
    let unmapped = unsafe { s.get_into("zc", 8, 8192) }.map_err(ErrorCode::from);
    assert_eq!(unmapped, Err(ErrorCode::InvalidParams));
    s.unregister_buffer(sp).unwrap();
}

#[test]
fn batches_report_per_key() {
    let m = Master::start(&[]);
    let s = store(&m, 32, 16);
    let keys: Vec<String> = (0..20).map(|i| format!("bk{i}")).collect();
    let vals: Vec<Vec<u8>> = (0..20).map(|i| pattern(i as u8, 1000 + i)).collect();
    let parts: Vec<Vec<Src<'_>>> = vals.iter().map(|v| vec![Src::from(v)]).collect();
    let r = s.put_many(&keys, &parts, &ReplicateConfig::default(), false);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let mut probe = keys.clone();
    probe.push("nope".into());
    let ex = s.batch_is_exist(&probe);
    assert!(ex[..20].iter().all(|x| *x == Ok(true)));
    assert_eq!(ex[20], Ok(false));
    for (k, v) in keys.iter().zip(&vals) {
        assert_eq!(&s.get(k).unwrap(), v);
    }
    assert!(s
        .put_many(&keys[..2], &parts[..1], &ReplicateConfig::default(), false)
        .iter()
        .all(|x| x.as_ref().is_err_and(|e| *e == ErrorCode::InvalidParams)));
    assert_eq!(s.remove_by_regex("^bk1", true), Ok(11));
    assert_eq!(s.remove_all(true), Ok(9));
}

/// A master granting `ttl_ms` read leases, a store on it, and `k` put there with
/// `pattern(1, size)`, `size` extent-sized so that the next put of that size can reuse the
/// range once it is freed.
fn store_holding_k(ttl_ms: u64) -> (Master, Store, usize) {
    let m = Master::start(&[&format!("--default_kv_lease_ttl={ttl_ms}")]);
    let a = store(&m, 64, 16);
    let size = 2usize << 20;
    a.put("k", &pattern(1, size), &ReplicateConfig::default(), false)
        .unwrap();
    (m, a, size)
}

/// A get session keeps replica lists across calls; a list read after its window (the lease
/// the master gave it) could point at buffers the master has handed to another key. The
/// session looks such a list up again; a key removed meanwhile fails with `LEASE_EXPIRED`
/// rather than returning the next put's bytes.
#[test]
fn a_get_session_never_reads_a_list_past_its_window() {
    const TTL_MS: u64 = 300;
    let (_m, a, size) = store_holding_k(TTL_MS);
    let cfg = ReplicateConfig::default();
    let keys = vec!["k".to_string()];
    assert_eq!(a.get_session_start(&keys), vec![Ok(())]);
    let old = a.replicas("k").unwrap().replicas[0].buffer_address;
    let read = |keys: &[String]| {
        let mut dst = vec![0u8; size];
        // SAFETY: `dst` is ours, mapped and untouched by anything else until the call returns.
        let r = unsafe {
            a.get_ranges(
                keys,
                &[vec![dst.as_mut_ptr() as u64]],
                &[vec![size as u64]],
                &[vec![0]],
            )
        };
        let r: Vec<Result<u64, ErrorCode>> =
            r.into_iter().map(|r| r.map_err(ErrorCode::from)).collect();
        (r, dst)
    };
    let (r, dst) = read(&keys);
    assert_eq!(r, vec![Ok(size as u64)]);
    assert!(dst == pattern(1, size), "k's bytes inside the window");

    std::thread::sleep(std::time::Duration::from_millis(2 * TTL_MS));
    assert_eq!(a.remove("k", true), Ok(()));
    a.put("other", &pattern(2, size), &cfg, false).unwrap();
    let reused = a.replicas("other").unwrap().replicas[0].buffer_address == old;
    let (r, dst) = read(&keys);
    assert!(
        dst != pattern(2, size),
        "the session read another key's bytes"
    );
    assert_eq!(
        r,
        vec![Err(ErrorCode::LeaseExpired)],
        "range reused: {reused}"
    );

    // A key still there is looked up again and read whole.
    let keys = vec!["other".to_string()];
    assert_eq!(a.get_session_start(&keys), vec![Ok(())]);
    std::thread::sleep(std::time::Duration::from_millis(2 * TTL_MS));
    let (r, dst) = read(&keys);
    assert_eq!(r, vec![Ok(size as u64)]);
    assert!(dst == pattern(2, size));
    a.get_session_end(&keys);
}

/// A plain read of a replica list must end inside the list's window, counted from before the
/// lookup was sent. A reader held up between the master's answer and the end of its read (a
/// late reply, a descheduled thread, a slow copy) past the window could otherwise read buffers
/// the master has since handed to another key: an upsert with a new size parks the old ones
/// only until the last window ends. Counting from the start of the read instead, as the client
/// did when the fault harness found violation 2 (`docs/reliability.md`), accepts this read.
#[test]
fn a_read_that_ends_after_its_lookups_window_is_refused() {
    const TTL_MS: u64 = 300;
    let (_m, a, size) = store_holding_k(TTL_MS);
    let cfg = ReplicateConfig::default();
    a.put("pad", &pattern(4, size), &cfg, false).unwrap(); // k's range stays a hole of its own
    let lookup = a.replicas("k").unwrap();
    let old = lookup.replicas[0].buffer_address;

    std::thread::sleep(std::time::Duration::from_millis(2 * TTL_MS));
    a.put("k", &pattern(3, 2 * size), &cfg, true).unwrap();
    a.put("other", &pattern(2, size), &cfg, false).unwrap();
    let reused = a.replicas("other").unwrap().replicas[0].buffer_address == old;
    let mut dst = vec![0u8; size];
    let r = a.read_from(&lookup, 0, Dst::from(&mut dst[..]));
    assert_eq!(
        r.map_err(|e| e.code),
        Err(ErrorCode::LeaseExpired),
        "range reused: {reused}"
    );
    assert!(reused, "the next put of the same size took k's old range");
    assert!(
        dst != pattern(2, size),
        "the read returned another key's bytes"
    );
    assert_eq!(a.get("k").unwrap(), pattern(3, 2 * size));
}

/// A failed put or lookup carries its reason beside the code (`client::store::StoreError`):
/// what the master was asked to place, and the master's address once it is gone. The Python
/// binding logs exactly this text.
#[test]
fn failed_calls_say_why() {
    let mut m = Master::start(&[]);
    let s = store(&m, 16, 64);
    let cfg = ReplicateConfig::default();
    let e = s
        .put("too-big", &vec![1u8; 32 << 20], &cfg, false)
        .expect_err("32 MiB cannot fit a 16 MiB segment");
    assert!(
        e.cause
            .contains("put too-big: the master placed no 32 MiB x 1 replica(s)"),
        "{e}"
    );
    assert!(e.to_string().starts_with(e.code.name()), "{e}");

    s.put("small", &[7u8; 64], &cfg, false).unwrap();
    let mut dst = [0u8; 8];
    // SAFETY: `dst` is ours, mapped and untouched by anything else until the call returns.
    let e = unsafe { s.get_into("small", dst.as_mut_ptr() as u64, 8) }.expect_err("too small");
    assert!(
        e.cause
            .contains("get_into small: the object's 64 bytes do not fit in the 8-byte buffer"),
        "{e}"
    );
    let e = s.get("nothing").expect_err("a miss");
    assert!(e.is_miss() && e.cause.starts_with("get nothing"), "{e}");

    let addr = m.rpc_addr();
    m.signal_and_wait(libc::SIGKILL, std::time::Duration::from_secs(10))
        .expect("master stopped");
    let e = s
        .put("after-master", b"v", &cfg, false)
        .expect_err("no master to ask");
    assert!(e.code != ErrorCode::InvalidParams, "{e}");
    assert!(e.cause.contains("put after-master"), "{e}");
    assert!(e.cause.contains(&addr), "the cause names the master: {e}");
    let e = s.replicas("after-master").expect_err("no master to ask");
    assert!(e.cause.contains("lookup of after-master"), "{e}");
    assert!(e.cause.contains(&addr), "the cause names the master: {e}");
}

/// Sessions and extra segments say why too: each refusal names the call, the key or
/// segment, and what was wrong, with upstream's code unchanged.
#[test]
fn session_and_segment_failures_say_why() {
    let m = Master::start(&[]);
    let s = store(&m, 16, 64);
    let cfg = ReplicateConfig::default();
    let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
    fn cause<T>(r: &Result<T, StoreError>) -> String {
        r.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
    }

    let started = s.put_session_start(&keys(&["a", "b"]), &[64], &cfg);
    assert!(started.iter().all(|r| r
        .as_ref()
        .is_err_and(|e| e.code == ErrorCode::InvalidParams)));
    assert!(
        cause(&started[0]).contains("put session start: 2 keys but 1 sizes"),
        "{}",
        cause(&started[0])
    );

    assert!(s.put_session_start(&keys(&["a"]), &[64], &cfg)[0].is_ok());
    let again = s.put_session_start(&keys(&["a"]), &[64], &cfg);
    assert!(
        cause(&again[0]).contains("a already has an open put session"),
        "{}",
        cause(&again[0])
    );
    let src = [1u8; 32];
    // SAFETY: `src` is ours and unchanged until the calls return.
    let put = unsafe {
        s.put_ranges(
            &keys(&["a", "nope"]),
            &[vec![src.as_ptr() as u64], vec![src.as_ptr() as u64]],
            &[vec![32], vec![32]],
            &[vec![48], vec![0]],
        )
    };
    assert!(
        cause(&put[0]).contains("ranged put a: range [48, +32) is outside the object of 64 bytes"),
        "{}",
        cause(&put[0])
    );
    assert!(
        cause(&put[1]).contains("ranged put nope: no open put session"),
        "{}",
        cause(&put[1])
    );
    let ended = s.put_session_end(&keys(&["nope"]));
    assert!(
        cause(&ended[0]).contains("put session end nope: no open put session"),
        "{}",
        cause(&ended[0])
    );
    let revoked = s.put_session_revoke(&keys(&["a", "nope"]));
    assert!(revoked[0].is_ok(), "{}", cause(&revoked[0]));
    assert!(
        cause(&revoked[1]).contains("put session revoke nope"),
        "{}",
        cause(&revoked[1])
    );

    let got = s.get_session_start(&keys(&["missing"]));
    let e = got[0].as_ref().expect_err("a miss");
    assert!(
        e.is_miss() && e.cause.contains("get session start missing"),
        "{e}"
    );
    let mut dst = [0u8; 8];
    // SAFETY: `dst` is ours, mapped and untouched by anything else until the call returns.
    let read = unsafe {
        s.get_ranges(
            &keys(&["missing"]),
            &[vec![dst.as_mut_ptr() as u64]],
            &[vec![8]],
            &[vec![0]],
        )
    };
    assert!(
        cause(&read[0]).contains("ranged read missing: no open get session"),
        "{}",
        cause(&read[0])
    );

    let e = s.allocate_and_mount_segment(0).expect_err("zero bytes");
    assert!(
        e.cause
            .contains("allocate_and_mount_segment: cannot map a segment of 0 bytes"),
        "{e}"
    );
    let e = s
        .mount_file_segment("/nonexistent/segment", 4096, 0)
        .expect_err("no such file");
    assert!(
        e.cause.starts_with("mount_segment: /nonexistent/segment"),
        "{e}"
    );
    let e = s
        .unmount_segments(&["not-a-uuid".to_string()], std::time::Duration::ZERO)
        .expect_err("not an id");
    assert!(
        e.cause
            .contains("unmount_segment: invalid segment_id \"not-a-uuid\""),
        "{e}"
    );
}
