//! Finding and choosing RDMA devices: sysfs (`/sys/class/infiniband/*`), the engine's
//! `device_name` list, `MC_MS_AUTO_DISC` and `MC_MS_FILTERS`, and the NUMA locality that
//! the descriptor's `priority_matrix` is built from.
//!
//! ```text
//! /sys/class/infiniband/<dev>/device/numa_node     "0" (or "-1": unknown)
//! /sys/class/infiniband/<dev>/ports/<n>/state      "4: ACTIVE"
//! /sys/class/infiniband/<dev>/ports/<n>/link_layer "InfiniBand" | "Ethernet"
//! ```
//!
//! Rules ([`choose`]):
//! - auto-discovery when `MC_MS_AUTO_DISC=1`, or `device_name` is empty or `auto-discovery`:
//!   every device with an active port, kept only if named in `MC_MS_FILTERS` when that is set;
//! - otherwise the comma-separated `device_name` list, in order; a name the system does not
//!   have is an error naming it and the devices that exist.

use std::collections::BTreeMap;
use std::path::Path;

/// Default sysfs root of RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// One port of a device as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortDesc {
    pub port: u8,
    pub active: bool,
    pub link_layer: String,
}

/// One RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaInfo {
    pub name: String,
    /// NUMA node of the PCI device (`None`: unknown or `-1`).
    pub numa_node: Option<u32>,
    pub ports: Vec<PortDesc>,
}

impl HcaInfo {
    /// Has at least one ACTIVE port (devices not in sysfs, like the model's, count as up).
    pub fn is_up(&self) -> bool {
        self.ports.is_empty() || self.ports.iter().any(|p| p.active)
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Reads every device under `root`, sorted by name. A missing root is no devices.
pub fn scan_sysfs(root: &Path) -> Vec<HcaInfo> {
    let Ok(dir) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<HcaInfo> = dir
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .map(|name| hca_from_sysfs(root, &name))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// What sysfs says about device `name` (empty ports and no NUMA node when absent).
pub fn hca_from_sysfs(root: &Path, name: &str) -> HcaInfo {
    let d = root.join(name);
    let numa_node = read_trim(&d.join("device/numa_node"))
        .and_then(|s| s.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let mut ports = Vec::new();
    if let Ok(pd) = std::fs::read_dir(d.join("ports")) {
        for e in pd.flatten() {
            let Some(port) = e.file_name().to_str().and_then(|s| s.parse::<u8>().ok()) else {
                continue;
            };
            let state = read_trim(&e.path().join("state")).unwrap_or_default();
            ports.push(PortDesc {
                port,
                active: state.starts_with("4:") || state.ends_with("ACTIVE"),
                link_layer: read_trim(&e.path().join("link_layer")).unwrap_or_default(),
            });
        }
    }
    ports.sort_by_key(|p| p.port);
    HcaInfo {
        name: name.to_string(),
        numa_node,
        ports,
    }
}

/// How the devices are to be chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRequest {
    /// The engine's `device_name` argument, split on commas (empty: auto).
    pub names: Vec<String>,
    /// `MC_MS_AUTO_DISC=1`.
    pub auto_discovery: bool,
    /// `MC_MS_FILTERS`, split on commas.
    pub filters: Vec<String>,
}

fn split(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl DeviceRequest {
    /// From `device_name` and the environment values given (None: unset).
    pub fn new(device_name: &str, auto_disc: Option<&str>, filters: Option<&str>) -> Self {
        let names = split(device_name);
        let auto_named = names.is_empty() || names == ["auto-discovery"];
        DeviceRequest {
            names: if auto_named { Vec::new() } else { names },
            auto_discovery: auto_named || auto_disc.map(str::trim) == Some("1"),
            filters: filters.map(split).unwrap_or_default(),
        }
    }

    /// From `device_name` and `MC_MS_AUTO_DISC` / `MC_MS_FILTERS`.
    pub fn from_env(device_name: &str) -> Self {
        let a = std::env::var("MC_MS_AUTO_DISC").ok();
        let f = std::env::var("MC_MS_FILTERS").ok();
        DeviceRequest::new(device_name, a.as_deref(), f.as_deref())
    }
}

/// The devices to use, in order; see the module rules. Errors say what was asked and what
/// exists.
pub fn choose(available: &[HcaInfo], req: &DeviceRequest) -> Result<Vec<HcaInfo>, String> {
    let names: Vec<&str> = available.iter().map(|h| h.name.as_str()).collect();
    if req.auto_discovery {
        let chosen: Vec<HcaInfo> = available
            .iter()
            .filter(|h| h.is_up())
            .filter(|h| req.filters.is_empty() || req.filters.contains(&h.name))
            .cloned()
            .collect();
        if chosen.is_empty() {
            return Err(format!(
                "no usable RDMA device (found {names:?}, active ones filtered by \
                 MC_MS_FILTERS={:?})",
                req.filters
            ));
        }
        return Ok(chosen);
    }
    req.names
        .iter()
        .map(|n| {
            available
                .iter()
                .find(|h| &h.name == n)
                .cloned()
                .ok_or_else(|| format!("RDMA device {n:?} not found (devices: {names:?})"))
        })
        .collect()
}

/// Upstream's `priority_matrix`: for each `cpu:<node>` the devices on that node first, the
/// others second. Devices of unknown locality are preferred everywhere; `"*"` lists all.
pub fn priority_matrix(devs: &[HcaInfo]) -> BTreeMap<String, Vec<Vec<String>>> {
    let mut nodes: Vec<u32> = devs.iter().filter_map(|d| d.numa_node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let mut m = BTreeMap::new();
    for n in &nodes {
        let (pref, other): (Vec<&HcaInfo>, Vec<&HcaInfo>) = devs
            .iter()
            .partition(|d| d.numa_node.is_none_or(|x| x == *n));
        let names = |v: Vec<&HcaInfo>| v.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        m.insert(format!("cpu:{n}"), vec![names(pref), names(other)]);
    }
    m.insert(
        "*".to_string(),
        vec![devs.iter().map(|d| d.name.clone()).collect(), Vec::new()],
    );
    m
}

/// GID table entries scanned by [`roce_v2_gid_index`].
pub const GID_SCAN_MAX: u8 = 128;

/// For RoCE: the first GID index of `dev`'s `port` whose type is `RoCE v2` and whose GID is
/// an IPv4-mapped address (`::ffff:a.b.c.d`), as upstream's automatic choice. `None` when
/// sysfs has no such entry (InfiniBand, or nothing configured).
///
/// ```text
/// <root>/<dev>/ports/<port>/gids/<i>             "0000:0000:0000:0000:0000:ffff:0a00:0005"
/// <root>/<dev>/ports/<port>/gid_attrs/types/<i>  "RoCE v2"
/// ```
pub fn roce_v2_gid_index(root: &Path, dev: &str, port: u8) -> Option<u8> {
    let p = root.join(dev).join("ports").join(port.to_string());
    (0..GID_SCAN_MAX).find(|i| {
        let ty = read_trim(&p.join(format!("gid_attrs/types/{i}"))).unwrap_or_default();
        let gid = read_trim(&p.join(format!("gids/{i}"))).unwrap_or_default();
        ty.eq_ignore_ascii_case("RoCE v2") && gid.starts_with("0000:0000:0000:0000:0000:ffff:")
    })
}

/// The NUMA node the page at `addr` is on (`move_pages` query), if the kernel says.
pub fn numa_node_of(addr: u64) -> Option<u32> {
    let page = (addr & !4095) as *mut libc::c_void;
    let mut status: libc::c_int = -1;
    let pages = [page];
    // SAFETY: move_pages with `nodes == NULL` only reports the node of each page into
    // `status`; one page, one status slot, pid 0 is this process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1usize,
            pages.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            &mut status as *mut libc::c_int,
            0,
        )
    };
    if r == 0 && status >= 0 {
        Some(status as u32)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sysfs() -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "mc-fake-sysfs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let dev = |name: &str, numa: &str, state: &str, ll: &str| {
            let d = root.join(name);
            std::fs::create_dir_all(d.join("device")).unwrap();
            std::fs::create_dir_all(d.join("ports/1")).unwrap();
            std::fs::write(d.join("device/numa_node"), format!("{numa}\n")).unwrap();
            std::fs::write(d.join("ports/1/state"), format!("{state}\n")).unwrap();
            std::fs::write(d.join("ports/1/link_layer"), format!("{ll}\n")).unwrap();
        };
        dev("mlx5_0", "0", "4: ACTIVE", "InfiniBand");
        dev("mlx5_1", "1", "4: ACTIVE", "Ethernet");
        dev("mlx5_2", "-1", "1: DOWN", "InfiniBand");
        root
    }

    #[test]
    fn sysfs_scan_reads_numa_and_ports() {
        let root = fake_sysfs();
        let d = scan_sysfs(&root);
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].name, "mlx5_0");
        assert_eq!(d[0].numa_node, Some(0));
        assert_eq!(d[1].ports[0].link_layer, "Ethernet");
        assert_eq!(d[2].numa_node, None);
        assert!(d[0].is_up() && !d[2].is_up());
        assert!(scan_sysfs(&root.join("missing")).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn choice_follows_names_auto_discovery_and_filters() {
        let root = fake_sysfs();
        let d = scan_sysfs(&root);
        let names = |v: Vec<HcaInfo>| v.into_iter().map(|h| h.name).collect::<Vec<_>>();
        // Auto: the active ones.
        let r = DeviceRequest::new("", None, None);
        assert_eq!(names(choose(&d, &r).unwrap()), ["mlx5_0", "mlx5_1"]);
        let r = DeviceRequest::new("auto-discovery", None, Some("mlx5_1"));
        assert_eq!(names(choose(&d, &r).unwrap()), ["mlx5_1"]);
        // Explicit names win unless MC_MS_AUTO_DISC=1.
        let r = DeviceRequest::new("mlx5_2,mlx5_0", None, None);
        assert_eq!(names(choose(&d, &r).unwrap()), ["mlx5_2", "mlx5_0"]);
        let r = DeviceRequest::new("mlx5_2", Some("1"), Some("mlx5_0"));
        assert_eq!(names(choose(&d, &r).unwrap()), ["mlx5_0"]);
        // Errors name what is missing and what exists.
        let e = choose(&d, &DeviceRequest::new("mlx9", None, None)).unwrap_err();
        assert!(e.contains("mlx9") && e.contains("mlx5_0"), "{e}");
        let e = choose(&d, &DeviceRequest::new("", None, Some("none"))).unwrap_err();
        assert!(e.contains("no usable RDMA device"), "{e}");
        assert!(choose(&[], &DeviceRequest::new("", None, None)).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn priority_matrix_prefers_the_local_node() {
        let root = fake_sysfs();
        let d = scan_sysfs(&root);
        let m = priority_matrix(&d);
        assert_eq!(m["cpu:0"], vec![vec!["mlx5_0", "mlx5_2"], vec!["mlx5_1"]]);
        assert_eq!(m["cpu:1"], vec![vec!["mlx5_1", "mlx5_2"], vec!["mlx5_0"]]);
        assert_eq!(m["*"][0].len(), 3);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn roce_v2_gid_choice() {
        let root = fake_sysfs();
        let p = root.join("mlx5_1/ports/1");
        std::fs::create_dir_all(p.join("gids")).unwrap();
        std::fs::create_dir_all(p.join("gid_attrs/types")).unwrap();
        let gid = |i: u8, g: &str, t: &str| {
            std::fs::write(p.join(format!("gids/{i}")), g).unwrap();
            std::fs::write(p.join(format!("gid_attrs/types/{i}")), t).unwrap();
        };
        gid(0, "fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1");
        gid(1, "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2");
        gid(2, "0000:0000:0000:0000:0000:ffff:0a00:0005", "IB/RoCE v1");
        gid(3, "0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2\n");
        assert_eq!(roce_v2_gid_index(&root, "mlx5_1", 1), Some(3));
        assert_eq!(roce_v2_gid_index(&root, "mlx5_0", 1), None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn numa_node_of_a_touched_page() {
        let v = vec![1u8; 8192];
        // The page is resident (written above); a kernel without NUMA reports node 0 or
        // refuses the call: both are acceptable here, a crash is not.
        if let Some(n) = numa_node_of(v.as_ptr() as u64) {
            assert!(n < 1024);
        }
    }
}
