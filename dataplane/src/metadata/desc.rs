//! The JSON documents of transfer-engine metadata, as upstream writes them
//! (`transfer_metadata.cpp`).
//!
//! `mooncake/ram/<name>` holds a [`SegmentDesc`]:
//!
//! ```json
//! {"buffers":[{"addr":139872000000,"length":2147483648,"name":"127.0.0.1:12345"}],
//!  "mooncake_rs_data_port":16201,"name":"127.0.0.1:12345","protocol":"tcp",
//!  "tcp_data_port":16201,"tcp_proto_version":2,"timestamp":"2026-08-22 13:12:18.123456"}
//! ```
//!
//! Members are declared in alphabetical order, so the output matches jsoncpp's order.
//! `mooncake_rs_data_port` is ours: it says the data port speaks mooncake-rs's one-sided
//! frames (`docs/protocol.md`), not upstream's `SessionHeader`. A descriptor without it was
//! written by an upstream engine, whose TCP wire format this crate does not speak.
//!
//! `mooncake/rpc_meta/<name>` holds an [`RpcMeta`]: `{"ip_or_host_name":"..","rpc_port":N}`.
//!
//! Decoding ignores unknown members (RDMA devices, priority matrices, ...) and never panics.

use serde::{Deserialize, Serialize};

/// One registered buffer of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDesc {
    /// Absolute address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// The segment name (upstream's TCP transport writes the segment name here).
    #[serde(default)]
    pub name: String,
}

/// A segment descriptor (`mooncake/ram/<name>`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentDesc {
    /// Registered buffers, in registration order (`buffers[0]` is the first registered).
    #[serde(default)]
    pub buffers: Vec<BufferDesc>,
    /// Our data port; absent in descriptors written by upstream engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mooncake_rs_data_port: Option<u16>,
    /// The segment name.
    pub name: String,
    /// `"tcp"` (upstream may write a list in multi-protocol builds).
    #[serde(default)]
    pub protocol: serde_json::Value,
    /// Upstream's TCP data port member; we write our data port here too.
    #[serde(default)]
    pub tcp_data_port: u16,
    /// Upstream's TCP protocol version (absent means 1).
    #[serde(default = "one")]
    pub tcp_proto_version: u32,
    /// Local time of writing, `%Y-%m-%d %H:%M:%S.ffffff`.
    #[serde(default)]
    pub timestamp: String,
    /// Ours too: where a same-host reader finds this engine's registration table
    /// (`engine::samehost`); absent when the engine has none (or for upstream's). Last, out of
    /// alphabetical order, because a descriptor given as a JSON array decodes by position:
    /// a member added at the end leaves the older positions as they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mooncake_rs_same_host: Option<SameHostDesc>,
}

/// Where a same-host reader finds an engine's registration table (`engine::samehost`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SameHostDesc {
    /// The owner's kernel boot id: a reader on another host sees another.
    pub boot_id: String,
    /// The owner's pid (in its own pid namespace; the reader checks it names the owner).
    pub pid: u32,
    /// The owner's address of its table mapping (its nonce is the second word).
    pub table_addr: u64,
    /// The descriptor number of the table's memfd in the owner (`/proc/<pid>/fd/<n>`).
    pub table_fd: i32,
}

fn one() -> u32 {
    1
}

impl SegmentDesc {
    /// A TCP descriptor of ours for `name` with data port `data_port`, stamped now.
    pub fn tcp(name: &str, data_port: u16, buffers: Vec<BufferDesc>) -> SegmentDesc {
        SegmentDesc {
            buffers,
            mooncake_rs_data_port: Some(data_port),
            mooncake_rs_same_host: None,
            name: name.to_string(),
            protocol: serde_json::Value::String("tcp".into()),
            tcp_data_port: data_port,
            tcp_proto_version: 2,
            timestamp: timestamp_now(),
        }
    }

    /// Compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain structs of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a descriptor; an error says what was wrong.
    pub fn from_json(bytes: &[u8]) -> Result<SegmentDesc, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// The handshake endpoint of a server (`mooncake/rpc_meta/<name>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcMeta {
    pub ip_or_host_name: String,
    pub rpc_port: u16,
}

impl RpcMeta {
    /// Compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses an entry; an error says what was wrong.
    pub fn from_json(bytes: &[u8]) -> Result<RpcMeta, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// Local time as upstream's `getCurrentDateTime()`: `%Y-%m-%d %H:%M:%S.ffffff`.
pub fn timestamp_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: `tm` is plain old data; localtime_r writes only into it and reads `secs`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals of the right types.
    let ok = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    if !ok {
        return format!("{}.{:06}", now.as_secs(), now.subsec_micros());
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_json_matches_upstream_shape() {
        let d = SegmentDesc {
            timestamp: "2026-08-22 13:12:18.123456".into(),
            ..SegmentDesc::tcp(
                "127.0.0.1:12345",
                16201,
                vec![BufferDesc {
                    addr: 4096,
                    length: 8192,
                    name: "127.0.0.1:12345".into(),
                }],
            )
        };
        let text = String::from_utf8(d.to_json()).unwrap();
        assert_eq!(
            text,
            r#"{"buffers":[{"addr":4096,"length":8192,"name":"127.0.0.1:12345"}],"mooncake_rs_data_port":16201,"name":"127.0.0.1:12345","protocol":"tcp","tcp_data_port":16201,"tcp_proto_version":2,"timestamp":"2026-08-22 13:12:18.123456"}"#
        );
        assert_eq!(SegmentDesc::from_json(text.as_bytes()).unwrap(), d);
    }

    #[test]
    fn upstream_descriptor_parses_without_our_port() {
        let up = br#"{"buffers":[{"addr":1,"length":2,"name":"x","rkey":[1]}],"devices":[],
            "name":"h:1","protocol":"rdma","tcp_data_port":3,"timestamp":"t"}"#;
        let d = SegmentDesc::from_json(up).unwrap();
        assert_eq!(d.mooncake_rs_data_port, None);
        assert_eq!(d.tcp_proto_version, 1);
        assert_eq!(d.buffers[0].addr, 1);
        assert!(SegmentDesc::from_json(b"{").is_err());
        assert!(SegmentDesc::from_json(b"[]").is_err());
        assert!(SegmentDesc::from_json(br#"{"name":"a","buffers":[{"addr":-1}]}"#).is_err());
    }

    #[test]
    fn rpc_meta_and_timestamp() {
        let m = RpcMeta {
            ip_or_host_name: "10.0.0.5".into(),
            rpc_port: 15873,
        };
        assert_eq!(
            m.to_json(),
            br#"{"ip_or_host_name":"10.0.0.5","rpc_port":15873}"#
        );
        assert_eq!(RpcMeta::from_json(&m.to_json()).unwrap(), m);
        let t = timestamp_now();
        assert_eq!(t.len(), 26, "{t}");
        assert_eq!(&t[4..5], "-");
        assert_eq!(&t[19..20], ".");
    }

    /// Found by the `segment_desc` fuzz target: a descriptor given as a JSON array with a
    /// 150-digit number for `protocol` must decode to the same value after re-encoding.
    #[test]
    fn huge_numbers_round_trip_exactly() {
        let input: &[u8] = &[
            9, 91, 91, 93, 44, 52, 44, 34, 58, 50, 50, 34, 44, 91, 91, 93, 44, 9, 50, 48, 48, 48,
            48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50,
            50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50,
            50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50,
            50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 48, 48, 48, 48,
            48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 52, 44, 34, 58, 52, 34, 44,
            50, 93, 93,
        ];
        let d = SegmentDesc::from_json(input).expect("decodes");
        assert_eq!(SegmentDesc::from_json(&d.to_json()).expect("re-decodes"), d);
    }
}
