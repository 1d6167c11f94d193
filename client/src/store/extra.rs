//! Segments a store client mounts after `setup` (`allocate_and_mount_segment`, and
//! `mount_segment` of a file or shared-memory path), and their unmounting (`unmount_segment`,
//! `unmount_and_free_segment`).
//!
//! Each extra segment is served like a storage-node shard: its own [`Segment`] (a memfd, or
//! the file mapped shared), its own [`ServedMemory`] table (and catalog), its own data server
//! on an ephemeral port of the client's address, and its same-host offer (none for a mapped
//! file, which takes no seals: peers then use TCP), mounted at the master under the name
//! `ip:data_port` with `te_endpoint` the same. Writers reach it as any remote segment (memcpy
//! through the offer on this host, TCP elsewhere); the pinger re-mounts it with its catalog
//! after a master failover exactly as it does the first segment ([`Mounted`]).
//!
//! Unmounting tells the master first (it drops the replicas held there, as upstream's
//! unmount), then stops serving: at once, or after `grace_period_seconds` so that reads that
//! already hold the replica's address finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::mem::{Segment, SegmentOptions};
use dataplane::server::blocking::TcpServer;
use parking_lot::RwLock;
use protocol::message::{MountSegment, UnmountSegment};
use protocol::{ErrorCode, Segment as SegmentDesc, Uuid};

use super::error::bytes;
use super::{rpc, Store, StoreError};
use crate::limits::EXTRA_SEGMENTS_MAX;

/// The segments the pinger reports and re-mounts: the client's own (first, when it has one)
/// and every extra segment mounted now.
pub type Mounted = Arc<RwLock<Vec<(SegmentDesc, Arc<ServedMemory>)>>>;

/// One extra segment and what serves it.
pub struct ExtraSegment {
    pub desc: SegmentDesc,
    /// Dropped first: stops serving.
    server: TcpServer,
    shm: Option<dataplane::mem::ShmExport>,
    segment: Arc<Segment>,
}

impl ExtraSegment {
    fn stop(self, grace: Duration) {
        let ExtraSegment {
            server,
            shm,
            segment,
            ..
        } = self;
        let done = move || {
            drop(shm);
            drop(server);
            drop(segment);
        };
        if grace.is_zero() {
            done();
        } else {
            let _ = std::thread::Builder::new()
                .name("mc-unmount-grace".into())
                .spawn(move || {
                    std::thread::sleep(grace);
                    done();
                });
        }
    }
}

impl Store {
    /// Maps `size` bytes, serves them and mounts them at the master as a new segment of this
    /// client: its id (`hi-lo`) and the size mapped (rounded up to the page size).
    pub fn allocate_and_mount_segment(&self, size: u64) -> Result<(String, u64), StoreError> {
        const WHAT: &str = "allocate_and_mount_segment";
        self.check_open().map_err(|e| e.context(WHAT))?;
        if size == 0 || usize::try_from(size).is_err() {
            let cause = format!("{WHAT}: cannot map a segment of {size} bytes");
            return Err(StoreError::invalid(cause));
        }
        self.mount_extra(WHAT, || {
            dataplane::mem::shm::serving_segment(
                size as usize,
                SegmentOptions::default(),
                dataplane::mem::shm::Owner::Node,
            )
            .map_err(|e| format!("{size} bytes: {e}"))
        })
    }

    /// Maps `size` bytes of the file at `path` from `offset` (a regular file of ours in
    /// `/dev/shm` or under a directory of `MC_MOUNT_FILE_DIRS`; see [`Segment::map_file`]),
    /// serves them and mounts them as a new segment of this client, as
    /// [`Self::allocate_and_mount_segment`]: its id and the size mapped. Same-host peers reach
    /// it over TCP (a file takes no seals). Unmounting unmaps it; the file stays.
    pub fn mount_file_segment(
        &self,
        path: &str,
        size: u64,
        offset: u64,
    ) -> Result<(String, u64), StoreError> {
        const WHAT: &str = "mount_segment";
        self.check_open().map_err(|e| e.context(WHAT))?;
        let Ok(len) = usize::try_from(size) else {
            let cause = format!("{WHAT}: {path}: cannot map {size} bytes");
            return Err(StoreError::invalid(cause));
        };
        self.mount_extra(WHAT, || {
            Segment::map_file(std::path::Path::new(path), len, offset)
                .map_err(|e| format!("{path} ({size} bytes at {offset}): {e}"))
        })
    }

    /// Serves the segment `map` makes and mounts it at the master under this client.
    fn mount_extra(
        &self,
        what: &str,
        map: impl FnOnce() -> Result<Segment, String>,
    ) -> Result<(String, u64), StoreError> {
        let failed = |code: ErrorCode, why: String| StoreError::new(code, format!("{what}: {why}"));
        let mut extra = self.extra.lock();
        if extra.len() >= EXTRA_SEGMENTS_MAX {
            let why = format!("{EXTRA_SEGMENTS_MAX} segments are mounted already");
            return Err(failed(ErrorCode::InvalidParams, why));
        }
        let seg = Arc::new(map().map_err(|why| failed(ErrorCode::InvalidParams, why))?);
        let memory = ServedMemory::new();
        memory.register_segment(seg.clone()).map_err(|e| {
            failed(
                ErrorCode::InternalError,
                format!("cannot register the segment: {e:?}"),
            )
        })?;
        let server = TcpServer::bind(
            SocketAddr::new(self.ip, 0),
            memory.clone(),
            ServerConfig::default(),
        )
        .map_err(|e| {
            failed(
                ErrorCode::InternalError,
                format!("cannot serve the segment: {e}"),
            )
        })?;
        let endpoint = server.local_addr().to_string();
        let desc = SegmentDesc {
            id: protocol::Uuid::random(),
            name: endpoint.clone(),
            base: seg.addr() as u64,
            size: seg.len() as u64,
            te_endpoint: endpoint.clone(),
            protocol: "tcp".into(),
            host_id: self.ip.to_string(),
            ..Default::default()
        };
        rpc(self.master.call(&MountSegment {
            client_id: self.client_id,
            segment: desc.clone(),
        }))
        .map_err(|e| {
            e.context(format_args!(
                "{what}: mounting {} at the master",
                bytes(desc.size)
            ))
        })?;
        let shm = dataplane::mem::shm::export_segment(&endpoint, &seg, &memory);
        self.mounted.write().push((desc.clone(), memory));
        let id = desc.id.to_string();
        let len = desc.size;
        extra.push(ExtraSegment {
            desc,
            server,
            shm,
            segment: seg,
        });
        Ok((id, len))
    }

    /// Unmounts the extra segments `ids` (all or nothing: an id this client did not mount is
    /// `INVALID_PARAMS` before anything changes). The master drops the replicas held there;
    /// the memory stops being served after `grace`.
    pub fn unmount_segments(&self, ids: &[String], grace: Duration) -> Result<(), StoreError> {
        const WHAT: &str = "unmount_segment";
        self.check_open().map_err(|e| e.context(WHAT))?;
        let refused = |why: String| StoreError::invalid(format!("{WHAT}: {why}"));
        let mut extra = self.extra.lock();
        let mut wanted = Vec::with_capacity(ids.len());
        for id in ids {
            let uuid: Uuid = id
                .parse()
                .map_err(|_| refused(format!("invalid segment_id {id:?}")))?;
            if !extra.iter().any(|e| e.desc.id == uuid) {
                return Err(refused(format!(
                    "segment {id} is not mounted by this client"
                )));
            }
            wanted.push(uuid);
        }
        let mut first_err = None;
        for uuid in wanted {
            let Some(at) = extra.iter().position(|e| e.desc.id == uuid) else {
                continue; // named twice
            };
            let r = rpc(self.master.call(&UnmountSegment {
                client_id: self.client_id,
                segment_id: uuid,
            }));
            match r {
                // A master that no longer knows it (restarted, expired us) has nothing to drop.
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::SegmentNotFound => {}
                Err(e) => {
                    first_err.get_or_insert(e.context(format_args!("{WHAT} {uuid}")));
                    continue;
                }
            }
            self.mounted.write().retain(|(d, _)| d.id != uuid);
            extra.remove(at).stop(grace);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Ids of the extra segments mounted now.
    pub fn extra_segment_ids(&self) -> Vec<String> {
        self.extra
            .lock()
            .iter()
            .map(|e| e.desc.id.to_string())
            .collect()
    }

    /// Unmounts every extra segment (close).
    pub(super) fn unmount_all_extra(&self) {
        let all: Vec<ExtraSegment> = self.extra.lock().drain(..).collect();
        for e in all {
            let _ = self.master.call(&UnmountSegment {
                client_id: self.client_id,
                segment_id: e.desc.id,
            });
            self.mounted.write().retain(|(d, _)| d.id != e.desc.id);
            e.stop(Duration::ZERO);
        }
    }
}
