//! The publisher thread: drains the queue, encodes batches and sends them on the PUB socket.
//!
//! The socket is bound in [`start`], on the caller's thread, so that a bad endpoint stops
//! the master with the reason; then socket and queue move to the thread `mc-kv-events`,
//! which owns them until [`Publisher::stop`]. The thread polls the queue every
//! `KV_EVENT_POLL_INTERVAL` (see [`Worker::run`] for why it does not block on it), takes
//! everything queued, and sends it in batches of up to `KV_EVENT_BATCH_EVENTS_MAX` events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::queue::{EventRef, Packed, Queue};
use super::{encode_batch, status_of, Counters, EncodeOptions, KvEventsConfig, Sink};
use crate::limits::{
    KV_EVENT_BATCH_EVENTS_MAX, KV_EVENT_POLL_INTERVAL, KV_EVENT_SOCKET_BATCHES_MAX,
    KV_EVENT_SOCKET_LINGER,
};

/// A running publisher: the sink to hand the service, its counters, and the thread.
pub struct Publisher {
    sink: Sink,
    cfg: KvEventsConfig,
    /// The endpoint as bound (a `tcp://host:*` wildcard resolved to its port).
    endpoint: String,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: parking_lot::Mutex<Option<JoinHandle<()>>>,
}

/// Binds the PUB socket at `cfg.endpoint` and starts the thread.
pub fn start(cfg: &KvEventsConfig) -> Result<Publisher, String> {
    let endpoint = if cfg.endpoint.is_empty() {
        super::DEFAULT_ENDPOINT.to_string()
    } else {
        cfg.endpoint.clone()
    };
    let fail = |what: &str, e: zmq::Error| format!("KV events: cannot {what} {endpoint}: {e}");
    let ctx = zmq::Context::new();
    let socket = ctx
        .socket(zmq::PUB)
        .map_err(|e| fail("open a socket for", e))?;
    socket
        .set_sndhwm(KV_EVENT_SOCKET_BATCHES_MAX)
        .map_err(|e| fail("set the high-water mark of", e))?;
    socket
        .set_linger(KV_EVENT_SOCKET_LINGER.as_millis() as i32)
        .map_err(|e| fail("set the linger of", e))?;
    socket.bind(&endpoint).map_err(|e| fail("bind", e))?;
    let bound = match socket.get_last_endpoint() {
        Ok(Ok(s)) => s,
        _ => endpoint.clone(),
    };
    let queue = Arc::new(Queue::new(cfg.queue_capacity as usize));
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let worker = Worker {
        opts: EncodeOptions::from_config(cfg),
        socket,
        queue: queue.clone(),
        counters: counters.clone(),
        stop: stop.clone(),
        next_seq: 1,
        next_event_id: 1,
        seen_dropped: 0,
    };
    let thread = std::thread::Builder::new()
        .name("mc-kv-events".into())
        .spawn(move || {
            // The context must outlive the socket: both live until the thread ends.
            let _ctx = ctx;
            worker.run();
        })
        .map_err(|e| format!("KV events: cannot start the publisher thread: {e}"))?;
    Ok(Publisher {
        sink: Sink {
            queue,
            counters: counters.clone(),
        },
        cfg: cfg.clone(),
        endpoint: bound,
        counters,
        stop,
        thread: parking_lot::Mutex::new(Some(thread)),
    })
}

impl Publisher {
    /// The service's end of the queue.
    pub fn sink(&self) -> Sink {
        self.sink.clone()
    }

    /// The endpoint bound.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn status(&self) -> super::Status {
        status_of(&self.cfg, &self.endpoint, &self.counters)
    }

    /// Sends what is queued, then ends the thread (at most one poll interval later).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Worker {
    opts: EncodeOptions,
    socket: zmq::Socket,
    queue: Arc<Queue>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    next_seq: u64,
    next_event_id: u64,
    /// The drop counter when the last batch was sent.
    seen_dropped: u64,
}

impl Worker {
    /// Polls the queue rather than blocking on it: a receiver blocked on the queue makes
    /// every push wake it (a futex call, under the master's lock), which cost the put path a
    /// quarter of its throughput in `master_bench --kv_events_ab`; a push into a queue
    /// nobody waits on appends the event's bytes to one buffer. Events wait at most one
    /// poll interval.
    fn run(mut self) {
        let mut taken = Packed::default();
        let mut payload = Vec::with_capacity(64 * 1024);
        loop {
            // Closed before the last take, so nothing queued is left behind unsent.
            let stopping = self.stop.load(Ordering::Relaxed);
            if stopping {
                self.queue.close();
            }
            self.queue.take(&mut taken);
            let events: Vec<EventRef<'_>> = taken.iter().collect();
            for batch in events.chunks(KV_EVENT_BATCH_EVENTS_MAX) {
                self.send(batch, &mut payload);
            }
            if stopping {
                return;
            }
            if events.is_empty() {
                std::thread::sleep(KV_EVENT_POLL_INTERVAL);
            }
        }
    }

    /// Encodes and sends one batch; skips a sequence number when events were dropped since
    /// the last one (read after the batch was drained, so every drop before its events is
    /// seen).
    fn send(&mut self, batch: &[EventRef<'_>], payload: &mut Vec<u8>) {
        let dropped = self.counters.dropped_events.load(Ordering::Relaxed);
        if dropped != self.seen_dropped {
            self.seen_dropped = dropped;
            self.next_seq += 1;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        payload.clear();
        let now = crate::clock::wall_ms();
        let non_hash = encode_batch(&self.opts, now, self.next_event_id, batch, payload);
        self.next_event_id += batch.len() as u64;
        let sent = self
            .socket
            .send("", zmq::SNDMORE)
            .and_then(|()| self.socket.send(&seq.to_be_bytes()[..], zmq::SNDMORE))
            .and_then(|()| self.socket.send(&payload[..], 0));
        let c = &self.counters;
        match sent {
            Ok(()) => {
                c.published_batches.fetch_add(1, Ordering::Relaxed);
                c.published_events
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                c.non_hash_keys.fetch_add(non_hash, Ordering::Relaxed);
            }
            Err(e) => {
                // A PUB socket does not block or fail on a slow subscriber (it drops at the
                // high-water mark); an error here is the socket's own, and the batch is lost.
                tracing::warn!("KV events: cannot send batch {seq}: {e}");
                c.dropped_events
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, Kind, Medium};
    use super::*;

    fn event(key: &str) -> Event {
        Event {
            kind: Kind::Stored,
            medium: Medium::Cpu,
            key: key.into(),
            group: None,
        }
    }

    /// Receives one batch: (sequence number, payload).
    fn recv(sub: &zmq::Socket) -> (u64, Vec<u8>) {
        let frames = sub.recv_multipart(0).expect("a batch");
        assert_eq!(frames.len(), 3);
        assert!(frames[0].is_empty(), "the topic frame is empty");
        let seq = u64::from_be_bytes(frames[1].as_slice().try_into().expect("8 bytes"));
        (seq, frames[2].clone())
    }

    #[test]
    fn batches_go_out_in_three_frames_with_growing_sequence_numbers() {
        let cfg = KvEventsConfig {
            enabled: true,
            endpoint: "tcp://127.0.0.1:*".into(),
            ..Default::default()
        };
        let p = start(&cfg).expect("bind");
        assert!(p.endpoint().starts_with("tcp://127.0.0.1:"));
        assert_ne!(p.endpoint(), "tcp://127.0.0.1:*", "the port as bound");
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.set_rcvtimeo(5000).unwrap();
        sub.connect(p.endpoint()).unwrap();
        // The slow joiner: send until one batch arrives.
        let sink = p.sink();
        let mut seen = None;
        for i in 0..100 {
            sink.push(event(&i.to_string()).as_ref());
            sub.set_rcvtimeo(50).unwrap();
            if let Ok(frames) = sub.recv_multipart(0) {
                seen = Some(frames);
                break;
            }
        }
        let seen = seen.expect("no batch reached the subscriber");
        let seen_seq = u64::from_be_bytes(seen[1].as_slice().try_into().expect("8 bytes"));
        // The counters move just after the send: wait for them to show that batch.
        let settled = |want: u64| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while p.status().published_batches < want {
                assert!(std::time::Instant::now() < deadline, "counters stuck");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            p.status()
        };
        let before = settled(seen_seq);
        assert_eq!(before.published_batches, seen_seq, "no drop, no gap");
        sub.set_rcvtimeo(5000).unwrap();
        sink.push(event("a").as_ref());
        let (seq, payload) = recv(&sub);
        assert_eq!(seq, seen_seq + 1, "no drop, no gap");
        let v = rmpv::decode::read_value(&mut &payload[..]).unwrap();
        assert_eq!(v[1].as_array().unwrap().len(), 1);
        assert_eq!(v[1][0]["object_key"].as_str(), Some("a"));
        let st = settled(seq);
        assert!(st.enabled);
        assert_eq!(st.published_events, before.published_events + 1);
        assert_eq!((st.dropped_events, st.non_hash_keys), (0, 1));
        p.stop();
        sink.push(event("late").as_ref());
        assert_eq!(p.status().dropped_events, 1, "a stopped publisher drops");
    }

    #[test]
    fn a_bad_endpoint_is_refused_with_the_reason() {
        let cfg = KvEventsConfig {
            enabled: true,
            endpoint: "nonsense://x".into(),
            ..Default::default()
        };
        let e = start(&cfg).err().expect("refused");
        assert!(e.contains("nonsense://x"), "{e}");
    }
}
