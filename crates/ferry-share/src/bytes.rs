//! The bytes a read hands on: in a buffer of their own, or left in the buffer the packet that carried them
//! was received and verified in, which goes back to a [`Pool`] when they are dropped.
//!
//! A 1 MiB piece of an aligned read is its packet's data in one run ([`crate::tree`]), so a client that owns
//! the packet's buffer passes it on as it is: the mount's held pieces, its FUSE replies and its cache writes
//! read the bytes where the packet was decrypted, and nothing copies them out first. The buffers circulate:
//! a fresh one would be zeroed at the cost of the copy saved.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::{Arc, Mutex};

/// Buffers to receive packets in, given back by the [`Bytes`] that held them. Keeps at most a few idle
/// buffers; the rest are freed.
#[derive(Debug)]
pub struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl Pool {
    /// A pool keeping at most `keep` idle buffers.
    pub fn new(keep: usize) -> Arc<Pool> {
        Arc::new(Pool {
            free: Mutex::new(Vec::new()),
            keep,
        })
    }

    /// A buffer of at least `len` bytes: an idle one, else a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let idle = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(mut buf) => {
                if buf.len() < len {
                    buf.resize(len, 0);
                }
                buf
            }
            None => vec![0; len],
        }
    }

    /// Idle buffers now.
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Takes back a buffer no longer in use (kept if fewer than `keep` are idle).
    pub(crate) fn give(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.keep {
            free.push(buf);
        }
    }
}

/// Bytes of a read: `buf[range]`, given back to `pool` (if any) when dropped.
pub struct Bytes {
    buf: Vec<u8>,
    range: Range<usize>,
    pool: Option<Arc<Pool>>,
}

impl Bytes {
    /// `buf[range]`, with `buf` given back to `pool` when the bytes are dropped. Panics if `range` is not
    /// inside `buf`.
    pub fn in_buffer(buf: Vec<u8>, range: Range<usize>, pool: Option<Arc<Pool>>) -> Bytes {
        assert!(range.start <= range.end && range.end <= buf.len());
        Bytes { buf, range, pool }
    }

    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }

    /// Whether the bytes lie in a buffer that holds more than them (a packet's).
    pub fn is_in_packet(&self) -> bool {
        self.range.len() != self.buf.len()
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.buf));
        }
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(buf: Vec<u8>) -> Bytes {
        let range = 0..buf.len();
        Bytes {
            buf,
            range,
            pool: None,
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Clone for Bytes {
    /// A copy in a buffer of its own.
    fn clone(&self) -> Bytes {
        Bytes::from(self.as_slice().to_vec())
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_slice(), f)
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Bytes {}

impl PartialEq<[u8]> for Bytes {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<&[u8]> for Bytes {
    fn eq(&self, other: &&[u8]) -> bool {
        self.as_slice() == *other
    }
}

impl PartialEq<Vec<u8>> for Bytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_a_pooled_buffer_go_back_to_the_pool_and_the_pool_keeps_only_a_few() {
        let pool = Pool::new(2);
        let b = pool.take(100);
        assert_eq!(b.len(), 100);
        let held: Vec<Bytes> = (0..3)
            .map(|i| {
                let mut buf = pool.take(10);
                buf[i] = 7;
                Bytes::in_buffer(buf, i..i + 1, Some(Arc::clone(&pool)))
            })
            .collect();
        assert!(held.iter().all(|b| *b == [7u8][..]));
        assert!(held[0].is_in_packet());
        assert_eq!(pool.idle(), 0);
        drop(held);
        assert_eq!(pool.idle(), 2, "kept two of three");
        // A recycled buffer keeps its length (and old bytes: callers overwrite what they use).
        assert!(pool.take(5).len() >= 10);
        let own = Bytes::from(vec![1, 2, 3]);
        assert!(!own.is_in_packet());
        assert_eq!(own.clone(), vec![1u8, 2, 3]);
    }
}
