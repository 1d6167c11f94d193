//! Responses and the `sendmsg` batch that carries them.
//!
//! A [`Response`] is a 24-byte header plus, for a successful READ, the range of registered
//! memory to send (under a lease). A [`SendBatch`] takes up to
//! [`SEND_BATCH_RESPONSES_MAX`] queued responses and lays them out as one `iovec` list:
//! `header, payload, header, header, payload, ...`. The batch is boxed and never moves or
//! grows after [`SendBatch::new`], so the `msghdr` and `iovec` pointers handed to the kernel
//! stay valid until the batch is dropped. A partial send advances the list in place.

use std::collections::VecDeque;

use protocol::auth;

use crate::limits::{SEND_BATCH_BYTES_MAX, SEND_BATCH_RESPONSES_MAX};
use crate::shard::view::MemoryLease;
use crate::transport::header::{ResponseHeader, RESPONSE_HEADER_BYTES};
use crate::TeError;

/// Room for the bytes a response starts with: a response header, or a whole handshake frame.
const HEAD_SLOT_BYTES: usize = if auth::FRAME_BYTES > RESPONSE_HEADER_BYTES {
    auth::FRAME_BYTES
} else {
    RESPONSE_HEADER_BYTES
};

/// One response waiting to be sent.
pub(crate) struct Response {
    header: [u8; HEAD_SLOT_BYTES],
    /// Bytes of `header` sent: [`RESPONSE_HEADER_BYTES`], or [`auth::FRAME_BYTES`] for a
    /// handshake frame.
    header_len: usize,
    /// For a READ that succeeded: `(addr, len)` of the checked range and its lease.
    payload: Option<(u64, u64, MemoryLease)>,
    /// Counts as a served request once sent.
    ok: bool,
}

impl Response {
    /// An OK response without payload (a WRITE that landed).
    pub(crate) fn ok(request_id: u64) -> Response {
        Response::plain(request_id, 0, true)
    }

    /// An error response.
    pub(crate) fn error(request_id: u64, code: TeError) -> Response {
        Response::plain(request_id, code.code(), false)
    }

    fn plain(request_id: u64, status: i32, ok: bool) -> Response {
        let header = ResponseHeader {
            status,
            request_id,
            len: 0,
        }
        .encode();
        Response::with_head(&header, None, ok)
    }

    fn with_head(head: &[u8], payload: Option<(u64, u64, MemoryLease)>, ok: bool) -> Response {
        let mut header = [0u8; HEAD_SLOT_BYTES];
        header[..head.len()].copy_from_slice(head);
        Response {
            header,
            header_len: head.len(),
            payload,
            ok,
        }
    }

    /// A handshake frame (CHALLENGE, ACCEPT or REFUSE); not a served request.
    pub(crate) fn handshake(frame: [u8; auth::FRAME_BYTES]) -> Response {
        Response::with_head(&frame, None, false)
    }

    /// An OK READ response carrying `[addr, addr + len)`.
    pub(crate) fn read(request_id: u64, addr: u64, len: u64, lease: MemoryLease) -> Response {
        let header = ResponseHeader {
            status: 0,
            request_id,
            len,
        }
        .encode();
        Response::with_head(&header, Some((addr, len, lease)), true)
    }

    /// The lease this response holds, if any (to release when it is dropped unsent).
    pub(crate) fn into_lease(self) -> Option<MemoryLease> {
        self.payload.map(|(_, _, lease)| lease)
    }

    fn wire_bytes(&self) -> u64 {
        self.header_len as u64 + self.payload.as_ref().map_or(0, |p| p.1)
    }
}

/// Where a zero-copy send is in its two-completion life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendStage {
    /// Submitted; no completion yet.
    Submitted,
    /// `SENDMSG_ZC` reported `result` and a notification (buffers released by the kernel)
    /// is still to come.
    AwaitingNotif { result: i32 },
}

/// Responses laid out for one `sendmsg`; see the module docs.
pub(crate) struct SendBatch {
    headers: Vec<[u8; HEAD_SLOT_BYTES]>,
    iov: Vec<libc::iovec>,
    msg: libc::msghdr,
    leases: Vec<MemoryLease>,
    /// First iovec not fully sent.
    first: usize,
    /// Bytes still to send.
    remaining: u64,
    /// Payload bytes of READ responses in the batch.
    pub(crate) payload_bytes: u64,
    /// Responses that count as served requests.
    pub(crate) ok_count: u64,
    pub(crate) zero_copy: bool,
    pub(crate) stage: SendStage,
}

impl SendBatch {
    /// Takes responses from the front of `queue` (at least one if it is non-empty) up to the
    /// batch limits.
    pub(crate) fn new(queue: &mut VecDeque<Response>) -> Box<SendBatch> {
        let mut taken: Vec<Response> = Vec::new();
        let mut bytes = 0u64;
        while let Some(next) = queue.front() {
            let more = next.wire_bytes();
            if taken.len() == SEND_BATCH_RESPONSES_MAX
                || (!taken.is_empty() && bytes + more > SEND_BATCH_BYTES_MAX)
            {
                break;
            }
            bytes += more;
            if let Some(r) = queue.pop_front() {
                taken.push(r);
            }
        }
        let mut batch = Box::new(SendBatch {
            headers: taken.iter().map(|r| r.header).collect(),
            iov: Vec::with_capacity(taken.len() * 2),
            // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
            msg: unsafe { std::mem::zeroed() },
            leases: Vec::new(),
            first: 0,
            remaining: bytes,
            payload_bytes: 0,
            ok_count: 0,
            zero_copy: false,
            stage: SendStage::Submitted,
        });
        // `headers` is complete and never changes again, so pointers into it stay valid.
        for (i, r) in taken.into_iter().enumerate() {
            let header_ptr = batch.headers[i].as_mut_ptr();
            batch.iov.push(libc::iovec {
                iov_base: header_ptr.cast(),
                iov_len: r.header_len,
            });
            batch.ok_count += u64::from(r.ok);
            if let Some((addr, len, lease)) = r.payload {
                // `len` fits usize: it was checked addressable by MemoryView::check.
                batch.iov.push(libc::iovec {
                    iov_base: addr as usize as *mut libc::c_void,
                    iov_len: len as usize,
                });
                batch.payload_bytes += len;
                batch.leases.push(lease);
            }
        }
        batch.point_msg();
        batch
    }

    fn point_msg(&mut self) {
        let rest = &mut self.iov[self.first..];
        self.msg.msg_iov = rest.as_mut_ptr();
        self.msg.msg_iovlen = rest.len() as _;
    }

    /// The `msghdr` to submit; valid while the batch lives and is not advanced.
    pub(crate) fn msg_ptr(&self) -> *const libc::msghdr {
        &self.msg
    }

    /// Accounts `sent` bytes; returns true when everything has been sent.
    pub(crate) fn advance(&mut self, sent: u64) -> bool {
        assert!(
            sent <= self.remaining,
            "the kernel reported {sent} bytes sent of {} submitted",
            self.remaining
        );
        let mut left = sent;
        self.remaining -= left;
        while left > 0 && self.first < self.iov.len() {
            let v = &mut self.iov[self.first];
            let here = (v.iov_len as u64).min(left);
            // SAFETY: `here <= iov_len`, so the new base stays inside (or one past) the range
            // this iovec described.
            v.iov_base = unsafe { v.iov_base.cast::<u8>().add(here as usize) }.cast();
            v.iov_len -= here as usize;
            left -= here;
            if v.iov_len == 0 {
                self.first += 1;
            }
        }
        assert_eq!(left, 0, "the iovecs describe fewer bytes than `remaining`");
        self.point_msg();
        self.remaining == 0
    }

    /// The leases of the batch, to release once the kernel is done with it.
    pub(crate) fn take_leases(&mut self) -> Vec<MemoryLease> {
        std::mem::take(&mut self.leases)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::header::ResponseHeader;

    fn bytes_of(batch: &SendBatch) -> Vec<u8> {
        let mut out = Vec::new();
        for v in &batch.iov[batch.first..] {
            // SAFETY: each iovec points into `headers` or into the test's `data`, both live.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
            });
        }
        out
    }

    #[test]
    fn lays_out_headers_and_payloads_and_advances_over_partial_sends() {
        let data = [7u8; 10];
        let mut q = VecDeque::new();
        q.push_back(Response::ok(1));
        q.push_back(Response::read(
            2,
            data.as_ptr() as u64,
            10,
            MemoryLease::detached(),
        ));
        q.push_back(Response::error(3, TeError::AddressNotRegistered));
        let mut b = SendBatch::new(&mut q);
        assert!(q.is_empty());
        assert_eq!((b.ok_count, b.payload_bytes), (2, 10));
        let all = bytes_of(&b);
        assert_eq!(all.len(), 3 * 24 + 10);
        let h = ResponseHeader::decode(&all[24..48]).unwrap();
        assert_eq!((h.status, h.request_id, h.len), (0, 2, 10));
        assert_eq!(&all[48..58], &data);
        assert!(!b.advance(30));
        assert_eq!(bytes_of(&b), all[30..]);
        assert!(!b.advance(28));
        assert_eq!(bytes_of(&b), all[58..]);
        assert!(b.advance(24));
        assert_eq!(b.take_leases().len(), 1);
    }

    #[test]
    fn batches_stop_at_the_response_limit() {
        let mut q: VecDeque<Response> = (0..SEND_BATCH_RESPONSES_MAX as u64 + 5)
            .map(Response::ok)
            .collect();
        let b = SendBatch::new(&mut q);
        assert_eq!(b.ok_count, SEND_BATCH_RESPONSES_MAX as u64);
        assert_eq!(q.len(), 5);
    }
}
