//! The queue between the service and the publisher thread: events packed into one buffer.
//!
//! The service pushes an event under its own lock ([`Sink::push`](super::Sink::push)): the
//! key and group are copied into the buffer behind a small header, so once the buffer has
//! grown a push allocates nothing. The publisher takes everything queued at once, once per
//! poll, by swapping buffers ([`Queue::take`]), and reads the events back as borrowed views.
//!
//! Why not a channel of owned events (the first design): each event was a key cloned on the
//! heap by the master's thread and freed on the publisher's, plus a cache line passed between
//! their cores per event. On the 2-core test machine that made the master's saturated put
//! path 0.78x as fast with events on (`master_bench --kv_events_ab`, `bench/README.md`).
//!
//! Layout of one event: kind (1 byte), medium (1), key length (u32 LE), group length (u32 LE,
//! `u32::MAX` for none), key bytes, group bytes. Invariant: the buffer holds exactly `len`
//! whole events, each written from `&str`s, so every view read back is valid UTF-8.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::{Kind, Medium};

/// One event, borrowed: what the service pushes and the publisher encodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventRef<'a> {
    pub kind: Kind,
    pub medium: Medium,
    /// The key as the index holds it (scoped for a tenant other than the default one).
    pub key: &'a str,
    /// The object's lease group, scoped as the index holds it.
    pub group: Option<&'a str>,
}

const HEADER: usize = 10;
const NO_GROUP: u32 = u32::MAX;

/// Events packed in one buffer (module docs).
#[derive(Debug, Default)]
pub struct Packed {
    buf: Vec<u8>,
    len: usize,
}

impl Packed {
    /// Empties it, keeping the buffer's capacity.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.len = 0;
    }

    pub fn push(&mut self, e: EventRef<'_>) {
        let kind = match e.kind {
            Kind::Stored => 0,
            Kind::Removed => 1,
        };
        let medium = match e.medium {
            Medium::None => 0,
            Medium::Cpu => 1,
            Medium::Disk => 2,
        };
        // Keys and groups are far below 4 GiB (the protocol's frames are 64 MiB).
        let group_len = e.group.map_or(NO_GROUP, |g| g.len() as u32);
        self.buf.extend_from_slice(&[kind, medium]);
        self.buf
            .extend_from_slice(&(e.key.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&group_len.to_le_bytes());
        self.buf.extend_from_slice(e.key.as_bytes());
        self.buf.extend_from_slice(e.group.unwrap_or("").as_bytes());
        self.len += 1;
    }

    /// The events, in the order pushed.
    pub fn iter(&self) -> impl Iterator<Item = EventRef<'_>> + '_ {
        let mut rest = &self.buf[..];
        std::iter::from_fn(move || {
            let (head, tail) = rest.split_at_checked(HEADER)?;
            let word = |at: usize| {
                u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]])
            };
            let (key_len, group_len) = (word(2) as usize, word(6));
            let (key, tail) = tail.split_at_checked(key_len)?;
            let (group, tail) = match group_len {
                NO_GROUP => (None, tail),
                n => {
                    let (g, t) = tail.split_at_checked(n as usize)?;
                    (Some(g), t)
                }
            };
            rest = tail;
            Some(EventRef {
                kind: if head[0] == 0 {
                    Kind::Stored
                } else {
                    Kind::Removed
                },
                medium: match head[1] {
                    1 => Medium::Cpu,
                    2 => Medium::Disk,
                    _ => Medium::None,
                },
                key: text(key),
                group: group.map(text),
            })
        })
    }
}

/// Bytes written from a `&str` (module docs).
fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or_default()
}

/// The queue: at most `capacity` events wait in it.
#[derive(Debug)]
pub struct Queue {
    packed: Mutex<Packed>,
    capacity: usize,
    /// Set when the publisher stopped: pushes are dropped from then on.
    closed: AtomicBool,
}

impl Queue {
    pub fn new(capacity: usize) -> Queue {
        Queue {
            packed: Mutex::new(Packed::default()),
            capacity: capacity.max(1),
            closed: AtomicBool::new(false),
        }
    }

    /// Queues `e`; false (dropped) when the queue is full or closed. Never blocks but on the
    /// publisher's swap.
    pub fn push(&self, e: EventRef<'_>) -> bool {
        let mut p = self.packed.lock();
        // Read under the lock: once `close` returned, nothing more is queued.
        if p.len >= self.capacity || self.closed.load(Ordering::Relaxed) {
            return false;
        }
        p.push(e);
        true
    }

    /// Moves everything queued into `into` (emptied first; its buffer becomes the queue's).
    pub fn take(&self, into: &mut Packed) {
        into.clear();
        std::mem::swap(&mut *self.packed.lock(), into);
    }

    /// Refuses every push from now on; the publisher then takes what is left.
    pub fn close(&self) {
        let _queue = self.packed.lock();
        self.closed.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_back_as_pushed_and_the_capacity_holds() {
        let q = Queue::new(3);
        let evs = [
            EventRef {
                kind: Kind::Stored,
                medium: Medium::Cpu,
                key: "k1",
                group: None,
            },
            EventRef {
                kind: Kind::Removed,
                medium: Medium::Disk,
                key: "",
                group: Some("g"),
            },
            EventRef {
                kind: Kind::Stored,
                medium: Medium::None,
                key: "ключ",
                group: Some(""),
            },
        ];
        for e in evs {
            assert!(q.push(e));
        }
        assert!(!q.push(evs[0]), "full");
        let mut out = Packed::default();
        q.take(&mut out);
        assert_eq!(out.len, 3);
        assert_eq!(out.iter().collect::<Vec<_>>(), evs);
        // The queue got the (emptied) buffer back: room again.
        assert!(q.push(evs[0]));
        q.take(&mut out);
        assert_eq!(out.iter().collect::<Vec<_>>(), [evs[0]]);
        q.close();
        assert!(!q.push(evs[0]), "closed");
    }
}
