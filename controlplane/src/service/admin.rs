//! The admin HTTP server's read-only view of the master. Nothing here grants a lease or
//! changes recency; copies are made under the lock and formatting happens after it.

use protocol::wire::Wire;
use protocol::{ErrorCode, ReplicaDescriptor};

use super::dispatch::encode_replicas;
use super::MasterService;
use crate::view::{AdminView, SegmentDetail};

impl AdminView for MasterService {
    fn query_key(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let mut buf = Vec::new();
        {
            let mut st = self.state.lock();
            let (obj, segs) = st.read(0, key, false)?;
            encode_replicas(&mut buf, obj, segs, true);
        }
        // Decoding our own encoding cannot fail; map it to an internal error regardless.
        Vec::<ReplicaDescriptor>::from_bytes(&buf).map_err(|_| ErrorCode::InternalError)
    }

    fn all_keys(&self) -> Vec<String> {
        let st = self.state.lock();
        st.objects.keys().cloned().collect()
    }

    fn all_segments(&self) -> Vec<String> {
        let st = self.state.lock();
        st.segs.iter().map(|s| s.name.clone()).collect()
    }

    fn segments_detail(&self) -> Vec<SegmentDetail> {
        let st = self.state.lock();
        st.segs
            .iter()
            .map(|s| SegmentDetail {
                segment_name: s.name.clone(),
                segment_id: s.id.to_string(),
                client_id: s.client.to_string(),
                base_address: s.base,
                size_bytes: s.size,
                te_endpoint: s.te_endpoint.clone(),
                protocol: s.protocol.clone(),
                status: if s.draining_until.is_some() {
                    "DRAINING".to_string()
                } else {
                    "OK".to_string()
                },
                allocator_used_bytes: s.alloc.used_bytes(),
                allocator_capacity_bytes: s.alloc.capacity(),
            })
            .collect()
    }

    fn render_metrics(&self) -> String {
        let g = self.gauges();
        self.metrics.render(&g)
    }
}
