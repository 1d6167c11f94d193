//! Keys this store is writing: at most one put/upsert per key at a time within one store.
//!
//! The master knows a put in flight by (client id, key), not by put, and every thread of a
//! process shares its store's client id. Two overlapping writes of one key from one store
//! would therefore be one put to the master: the first `PutEnd` would mark the second
//! write's buffers COMPLETE while its bytes are still on the wire, and a remove or eviction
//! could then hand those buffers to another key under the late write (the concurrency soak,
//! `python/tests/test_soak.py`, read other keys' bytes that way). So a write waits until no
//! other thread of the store is writing any of its keys; a batch takes all its keys at once
//! (never some while waiting for others, so two batches cannot deadlock). Every write is
//! bounded (RPC and transfer timeouts), so every wait is.

use std::collections::HashSet;

use parking_lot::{Condvar, Mutex};

#[derive(Default)]
pub struct KeyLocks {
    held: Mutex<HashSet<String>>,
    freed: Condvar,
}

/// Keys held until dropped.
pub struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    keys: Vec<String>,
}

impl KeyLocks {
    /// Waits until none of `keys` is being written by another thread of this store, then
    /// holds them all.
    pub fn lock<'a, 'k>(&'a self, keys: impl IntoIterator<Item = &'k str>) -> KeyGuard<'a> {
        let mut keys: Vec<String> = keys.into_iter().map(str::to_string).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut held = self.held.lock();
        while keys.iter().any(|k| held.contains(k)) {
            self.freed.wait(&mut held);
        }
        held.extend(keys.iter().cloned());
        KeyGuard { locks: self, keys }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock();
        for k in &self.keys {
            held.remove(k);
        }
        drop(held);
        self.locks.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn one_writer_per_key_and_batches_do_not_deadlock() {
        let locks = Arc::new(KeyLocks::default());
        let inside = Arc::new([const { AtomicUsize::new(0) }; 4]);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (locks, inside) = (locks.clone(), inside.clone());
                std::thread::spawn(move || {
                    for i in 0..300 {
                        // Overlapping batches in opposite orders, and single keys.
                        let ks: Vec<usize> = match (t + i) % 3 {
                            0 => vec![0, 1, 2],
                            1 => vec![2, 1, 3, 3],
                            _ => vec![(t + i) % 4],
                        };
                        let names: Vec<String> = ks.iter().map(|k| format!("k{k}")).collect();
                        let _g = locks.lock(names.iter().map(String::as_str));
                        let mut uniq = ks.clone();
                        uniq.sort_unstable();
                        uniq.dedup();
                        for &k in &uniq {
                            assert_eq!(inside[k].fetch_add(1, Ordering::SeqCst), 0);
                        }
                        std::thread::yield_now();
                        for &k in &uniq {
                            inside[k].fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(locks.held.lock().is_empty());
    }
}
