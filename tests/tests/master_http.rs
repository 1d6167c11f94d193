//! The master's HTTP servers over real HTTP: the embedded metadata server and the admin port.

use client::MasterClient;
use mooncake_tests::{http, Master};
use protocol::message::*;
use protocol::{ReplicateConfig, Segment, Uuid};

#[test]
fn embedded_metadata_server_speaks_upstreams_protocol() {
    let m = Master::start(&[]);
    let p = m.http_metadata_port;
    let key = "mooncake%2Fram%2F127.0.0.1%3A12345";
    assert_eq!(
        http("GET", p, &format!("/metadata?key={key}"), b"").status,
        404
    );
    let put = http(
        "PUT",
        p,
        &format!("/metadata?key={key}"),
        br#"{"name":"x"}"#,
    );
    assert_eq!((put.status, put.text().as_str()), (200, "metadata updated"));
    let got = http("GET", p, &format!("/metadata?key={key}"), b"");
    assert_eq!((got.status, got.text().as_str()), (200, r#"{"name":"x"}"#));
    assert!(got
        .headers
        .to_ascii_lowercase()
        .contains("application/json"));
    // rpc_meta keys may be re-put only with an identical body.
    let rk = "/metadata?key=mooncake/rpc_meta/a";
    assert_eq!(http("PUT", p, rk, b"{\"rpc_port\":1}").status, 200);
    assert_eq!(
        http("PUT", p, rk, b"{\"rpc_port\":1}").text(),
        "metadata unchanged"
    );
    assert_eq!(http("PUT", p, rk, b"{\"rpc_port\":2}").status, 400);
    assert_eq!(http("GET", p, "/metadata", b"").status, 400);
    assert_eq!(
        http("DELETE", p, &format!("/metadata?key={key}"), b"").status,
        200
    );
    assert_eq!(
        http("DELETE", p, &format!("/metadata?key={key}"), b"").status,
        404
    );
    assert_eq!(http("GET", p, "/health", b"").status, 200);
}

#[test]
fn admin_port_reports_keys_segments_and_metrics() {
    let m = Master::start(&[]);
    let c = MasterClient::new(&m.rpc_addr()).unwrap();
    let me = Uuid::from_parts(7, 7);
    let seg = Segment {
        id: Uuid::from_parts(7, 70),
        name: "127.0.0.1:14007".into(),
        base: 1 << 40,
        size: 32 << 20,
        te_endpoint: "127.0.0.1:14007".into(),
        protocol: "tcp".into(),
        host_id: "127.0.0.1".into(),
        ..Default::default()
    };
    c.call(&MountSegment {
        client_id: me,
        segment: seg,
    })
    .unwrap()
    .unwrap();
    let cfg = ReplicateConfig::default();
    c.call(&PutStart {
        client_id: me,
        key: "adm".into(),
        size: 777,
        config: cfg,
    })
    .unwrap()
    .unwrap();
    c.call(&PutEnd {
        client_id: me,
        key: "adm".into(),
    })
    .unwrap()
    .unwrap();

    let port = m.metrics_port;
    let metrics = http("GET", port, "/metrics", b"");
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for name in [
        "master_key_count 1",
        "master_total_capacity_bytes 33554432",
        "master_put_start_requests_total",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}:\n{text}");
    }
    assert_eq!(http("GET", port, "/get_all_keys", b"").text().trim(), "adm");
    assert_eq!(
        http("GET", port, "/get_all_segments", b"").text().trim(),
        "127.0.0.1:14007"
    );
    let q = http("GET", port, "/query_key?key=adm", b"");
    assert_eq!(q.status, 200);
    assert!(
        q.text().contains("\"success\":true") && q.text().contains("777"),
        "{}",
        q.text()
    );
    assert_eq!(http("GET", port, "/query_key?key=nope", b"").status, 404);
    let detail = http("GET", port, "/get_segments_detail", b"").text();
    assert!(detail.contains("\"total_segments\":1"), "{detail}");
    assert_eq!(http("GET", port, "/health", b"").status, 200);
}

/// Half-sent requests (a request line and one header, never the blank line) to the admin
/// and metadata ports are closed within the servers' header timeout (10 s), while
/// `/metrics` and `/health` keep answering meanwhile. Before the servers had a timer, none of
/// 300 such connections was closed after 32 s.
#[test]
fn half_sent_requests_are_closed_within_the_header_timeout() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let m = Master::start(&["--enable_http_metadata_server=true"]);
    let mut held = Vec::new();
    for i in 0..300 {
        let port = if i % 2 == 0 {
            m.metrics_port
        } else {
            m.http_metadata_port
        };
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .unwrap();
        held.push(s);
    }
    let start = Instant::now();
    assert_eq!(http("GET", m.metrics_port, "/metrics", b"").status, 200);
    assert_eq!(
        http("GET", m.http_metadata_port, "/health", b"").status,
        200
    );
    let deadline = start + Duration::from_secs(20);
    let mut open = 0;
    for mut s in held {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .unwrap();
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(_) => open += 1,
        }
    }
    assert_eq!(
        open, 0,
        "{open} of 300 half-sent requests still open after 20 s"
    );
    assert_eq!(http("GET", m.metrics_port, "/metrics", b"").status, 200);
}
