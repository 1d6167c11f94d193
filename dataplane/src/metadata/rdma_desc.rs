//! The RDMA members of upstream's metadata: the segment descriptor of an engine whose
//! protocol is `rdma`, and the body of a handshake `Connection` frame (QP exchange).
//!
//! Segment descriptor (`mooncake/ram/<name>`, or the P2P `Metadata` reply), members in
//! jsoncpp's alphabetical order:
//!
//! ```json
//! {"buffers":[{"addr":139872000000,"length":1048576,"lkey":[4660,4661],
//!              "name":"cpu:0","rkey":[4660,4661]}],
//!  "devices":[{"gid":"fe:80:00:..:01","lid":1,"name":"mlx5_0"},{"gid":"..","lid":2,"name":"mlx5_1"}],
//!  "mooncake_rs_data_port":16201,"name":"10.0.0.5:12345",
//!  "priority_matrix":{"*":[["mlx5_0","mlx5_1"],[]],"cpu:0":[["mlx5_0"],["mlx5_1"]]},
//!  "protocol":"rdma","tcp_data_port":16201,"tcp_proto_version":2,
//!  "timestamp":"2026-08-22 13:12:18.123456"}
//! ```
//!
//! `rkey[i]` / `lkey[i]` belong to `devices[i]`. The TCP members stay, so a peer that runs
//! TCP (MC_FORCE_TCP) can still reach this engine; [`super::desc::SegmentDesc`] decodes the
//! same text and ignores the RDMA members.
//!
//! Connection body (both directions; the reply swaps the NIC paths):
//!
//! ```json
//! {"local_gid":"fe:80:..","local_lid":1,"local_nic_path":"10.0.0.5:12345@mlx5_0",
//!  "peer_nic_path":"10.0.0.6:12345@mlx5_1","qp_num":[263],"reply_msg":""}
//! ```
//!
//! A non-empty `reply_msg` in a reply is the peer's refusal. Decoding never panics and
//! checks what the transport relies on: as many keys as devices, parseable GIDs, at least one
//! QP number, NIC paths of the form `<server>@<device>`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A 16-byte GID: what a device descriptor carries (as text), and what the verbs layer
/// (`transport::rdma::verbs`) queries and addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Upstream's text form: 16 bytes as two hex digits each, joined by `:`.
    pub fn to_text(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(|b| format!("{b:02x}")).collect();
        parts.join(":")
    }

    /// Parses [`Gid::to_text`]'s form, or the 8-group IPv6-like form sysfs shows
    /// (`fe80:0000:...`). Anything else is an error naming the input.
    pub fn parse(text: &str) -> Result<Gid, String> {
        let parts: Vec<&str> = text.trim().split(':').collect();
        if !parts
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!("GID {text:?}: expected hex digits"));
        }
        let mut raw = [0u8; 16];
        let bad = || format!("GID {text:?}: expected 16 bytes as xx:xx:.. or 8 groups xxxx:..");
        match parts.len() {
            16 => {
                for (i, p) in parts.iter().enumerate() {
                    if p.len() != 2 {
                        return Err(bad());
                    }
                    raw[i] = u8::from_str_radix(p, 16).map_err(|_| bad())?;
                }
            }
            8 => {
                for (i, p) in parts.iter().enumerate() {
                    if p.len() != 4 {
                        return Err(bad());
                    }
                    let v = u16::from_str_radix(p, 16).map_err(|_| bad())?;
                    raw[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
                }
            }
            _ => return Err(bad()),
        }
        Ok(Gid(raw))
    }

    /// All zero: no GID configured at this index.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

/// One device of an RDMA segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDesc {
    pub gid: String,
    pub lid: u16,
    pub name: String,
}

/// One registered buffer with its keys per device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaBufferDesc {
    pub addr: u64,
    pub length: u64,
    #[serde(default)]
    pub lkey: Vec<u32>,
    /// The buffer's location (`cpu:0`, `*`), as upstream writes it.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub rkey: Vec<u32>,
}

/// An RDMA segment descriptor; see the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RdmaSegmentDesc {
    #[serde(default)]
    pub buffers: Vec<RdmaBufferDesc>,
    #[serde(default)]
    pub devices: Vec<DeviceDesc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mooncake_rs_data_port: Option<u16>,
    pub name: String,
    #[serde(default)]
    pub priority_matrix: BTreeMap<String, Vec<Vec<String>>>,
    pub protocol: String,
    #[serde(default)]
    pub tcp_data_port: u16,
    #[serde(default = "one")]
    pub tcp_proto_version: u32,
    #[serde(default)]
    pub timestamp: String,
}

fn one() -> u32 {
    1
}

impl RdmaSegmentDesc {
    /// Compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses and validates a descriptor whose protocol is `rdma`.
    pub fn from_json(bytes: &[u8]) -> Result<RdmaSegmentDesc, String> {
        let d: RdmaSegmentDesc = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if d.protocol != "rdma" {
            return Err(format!("protocol {:?}, expected \"rdma\"", d.protocol));
        }
        if d.devices.is_empty() {
            return Err("an rdma descriptor without devices".into());
        }
        for dev in &d.devices {
            Gid::parse(&dev.gid)?;
        }
        for b in &d.buffers {
            if b.rkey.len() != d.devices.len() {
                return Err(format!(
                    "buffer at {:#x} has {} rkeys for {} devices",
                    b.addr,
                    b.rkey.len(),
                    d.devices.len()
                ));
            }
            if b.addr.checked_add(b.length).is_none() {
                return Err(format!(
                    "buffer at {:#x} of {} bytes wraps",
                    b.addr, b.length
                ));
            }
        }
        Ok(d)
    }

    /// The buffer holding all of `[addr, addr + len)`, if one does.
    pub fn buffer_covering(&self, addr: u64, len: u64) -> Option<&RdmaBufferDesc> {
        let end = addr.checked_add(len)?;
        self.buffers
            .iter()
            .find(|b| addr >= b.addr && end <= b.addr + b.length)
    }
}

/// The body of a handshake `Connection` frame; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectBody {
    pub local_gid: String,
    pub local_lid: u16,
    pub local_nic_path: String,
    pub peer_nic_path: String,
    pub qp_num: Vec<u32>,
    #[serde(default)]
    pub reply_msg: String,
}

/// Splits `<server>@<device>`.
pub fn split_nic_path(path: &str) -> Option<(&str, &str)> {
    let (s, d) = path.rsplit_once('@')?;
    (!s.is_empty() && !d.is_empty()).then_some((s, d))
}

impl ConnectBody {
    /// Compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses and validates a body.
    pub fn from_json(bytes: &[u8]) -> Result<ConnectBody, String> {
        let b: ConnectBody = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if !b.reply_msg.is_empty() {
            return Ok(b); // a refusal: the other members may be empty
        }
        Gid::parse(&b.local_gid)?;
        if b.qp_num.is_empty() {
            return Err("a connection body without qp_num".into());
        }
        for p in [&b.local_nic_path, &b.peer_nic_path] {
            if split_nic_path(p).is_none() {
                return Err(format!("NIC path {p:?}: expected <server>@<device>"));
            }
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::desc::SegmentDesc;

    fn sample() -> RdmaSegmentDesc {
        let gid = Gid([1; 16]).to_text();
        RdmaSegmentDesc {
            buffers: vec![RdmaBufferDesc {
                addr: 4096,
                length: 8192,
                lkey: vec![7],
                name: "cpu:0".into(),
                rkey: vec![7],
            }],
            devices: vec![DeviceDesc {
                gid,
                lid: 1,
                name: "mlx5_0".into(),
            }],
            mooncake_rs_data_port: Some(9),
            name: "h:1".into(),
            priority_matrix: [("*".to_string(), vec![vec!["mlx5_0".to_string()], vec![]])]
                .into_iter()
                .collect(),
            protocol: "rdma".into(),
            tcp_data_port: 9,
            tcp_proto_version: 2,
            timestamp: "t".into(),
        }
    }

    #[test]
    fn descriptor_round_trips_in_upstream_order_and_tcp_view_still_decodes() {
        let d = sample();
        let text = String::from_utf8(d.to_json()).unwrap();
        let order = [
            "\"buffers\"",
            "\"devices\"",
            "\"mooncake_rs_data_port\"",
            "\"name\":\"h",
            "\"priority_matrix\"",
            "\"protocol\"",
            "\"tcp_data_port\"",
            "\"timestamp\"",
        ];
        let pos: Vec<usize> = order.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(
            text.contains(r#""lkey":[7],"name":"cpu:0","rkey":[7]"#),
            "{text}"
        );
        assert_eq!(RdmaSegmentDesc::from_json(text.as_bytes()).unwrap(), d);
        let tcp = SegmentDesc::from_json(text.as_bytes()).unwrap();
        assert_eq!(tcp.mooncake_rs_data_port, Some(9));
        assert_eq!(tcp.buffers[0].addr, 4096);
        assert_eq!(d.buffer_covering(4096, 8192).unwrap().rkey, vec![7]);
        assert!(d.buffer_covering(4096, 8193).is_none());
        assert!(d.buffer_covering(u64::MAX, 2).is_none());
    }

    #[test]
    fn descriptor_validation_errors() {
        let mut d = sample();
        d.buffers[0].rkey.clear();
        assert!(RdmaSegmentDesc::from_json(&d.to_json())
            .unwrap_err()
            .contains("rkeys"));
        let mut d = sample();
        d.devices[0].gid = "x".into();
        assert!(RdmaSegmentDesc::from_json(&d.to_json()).is_err());
        let mut d = sample();
        d.protocol = "tcp".into();
        assert!(RdmaSegmentDesc::from_json(&d.to_json()).is_err());
        let mut d = sample();
        d.buffers[0].addr = u64::MAX;
        assert!(RdmaSegmentDesc::from_json(&d.to_json()).is_err());
        assert!(RdmaSegmentDesc::from_json(b"{").is_err());
    }

    #[test]
    fn connect_body_round_trip_and_validation() {
        let b = ConnectBody {
            local_gid: Gid([2; 16]).to_text(),
            local_lid: 3,
            local_nic_path: "a:1@sim0".into(),
            peer_nic_path: "b:2@sim1".into(),
            qp_num: vec![263],
            reply_msg: String::new(),
        };
        let t = String::from_utf8(b.to_json()).unwrap();
        assert!(t.starts_with(r#"{"local_gid":"#), "{t}");
        assert_eq!(ConnectBody::from_json(t.as_bytes()).unwrap(), b);
        let mut bad = b.clone();
        bad.qp_num.clear();
        assert!(ConnectBody::from_json(&bad.to_json()).is_err());
        let mut bad = b.clone();
        bad.peer_nic_path = "nodevice@".into();
        assert!(ConnectBody::from_json(&bad.to_json()).is_err());
        let refusal = br#"{"local_gid":"","local_lid":0,"local_nic_path":"","peer_nic_path":"","qp_num":[],"reply_msg":"no device"}"#;
        assert_eq!(
            ConnectBody::from_json(refusal).unwrap().reply_msg,
            "no device"
        );
        assert_eq!(split_nic_path("h:1@mlx5_0"), Some(("h:1", "mlx5_0")));
        assert_eq!(split_nic_path("@x"), None);
    }
}
