//! Who is waiting under which nameplate hash, how many new sessions each source may open, and
//! how many connections each source holds at once.
//!
//! Every table is bounded: the rendezvous by the session limit, the rate limiter by a fixed
//! number of tracked sources (full buckets are forgotten, so an address that stops connecting
//! leaves the table after a minute), and the per-source counts by what they count (an entry
//! exists only while its source holds something, and the things held are globally limited).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::protocol::{Hello, Role};

/// The second side of a session: its stream and its place under its source's session cap, which
/// it holds for as long as the session runs.
pub(crate) type Peer = (TcpStream, SourceSlot);

/// One waiting side: its role, which registration it is, and where to hand the second side.
struct Waiter {
    role: Role,
    id: u64,
    tx: oneshot::Sender<Peer>,
}

/// The table of waiting sides, keyed by rendezvous hash.
pub(crate) struct Rendezvous {
    waiting: Mutex<HashMap<[u8; 32], Waiter>>,
    /// Sessions holding a slot: waiting plus paired.
    sessions: Arc<AtomicUsize>,
    max_sessions: usize,
    next_id: AtomicU64,
}

/// A waiting registration; `rx` yields the second side's stream.
pub(crate) struct Ticket {
    hash: [u8; 32],
    id: u64,
    pub(crate) rx: oneshot::Receiver<Peer>,
}

/// One session's place under the concurrent limit, released on drop.
pub(crate) struct SessionSlot(Arc<AtomicUsize>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// What became of a hello.
pub(crate) enum Join {
    /// A peer was waiting: the stream went to its task, which runs the session.
    HandedOver,
    /// Nobody was waiting: registered; wait on the ticket.
    Registered(Ticket, SessionSlot, Peer),
    /// The same role already waits under this hash.
    Taken(TcpStream),
    /// The concurrent session limit is reached.
    Full(TcpStream),
}

impl Rendezvous {
    pub(crate) fn new(max_sessions: usize) -> Self {
        Rendezvous {
            waiting: Mutex::new(HashMap::new()),
            sessions: Arc::new(AtomicUsize::new(0)),
            max_sessions,
            next_id: AtomicU64::new(0),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<[u8; 32], Waiter>> {
        // A panic while holding the lock leaves the map consistent (every mutation is one call).
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pairs `peer` with a waiting peer of the other role, or registers it.
    pub(crate) fn join(&self, hello: &Hello, mut peer: Peer) -> Join {
        let mut table = self.table();
        if let Some(w) = table.get(&hello.hash) {
            if w.role == hello.role {
                return Join::Taken(peer.0);
            }
            let w = table.remove(&hello.hash).expect("entry just seen");
            // Sent under the lock: a waiter that finds its entry gone can count on the stream.
            match w.tx.send(peer) {
                Ok(()) => return Join::HandedOver,
                // The waiting task is gone (it ended without cancelling): take its place.
                Err(p) => peer = p,
            }
        }
        // Checked and taken under the table lock, so two racing hellos cannot both pass.
        if self.sessions.load(Relaxed) >= self.max_sessions {
            return Join::Full(peer.0);
        }
        self.sessions.fetch_add(1, Relaxed);
        let slot = SessionSlot(self.sessions.clone());
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        table.insert(
            hello.hash,
            Waiter {
                role: hello.role,
                id,
                tx,
            },
        );
        Join::Registered(
            Ticket {
                hash: hello.hash,
                id,
                rx,
            },
            slot,
            peer,
        )
    }

    /// Withdraws a registration. `false` means a peer already took it: its stream is (or is
    /// about to be) in `ticket.rx`.
    pub(crate) fn cancel(&self, ticket: &Ticket) -> bool {
        let mut table = self.table();
        match table.get(&ticket.hash) {
            Some(w) if w.id == ticket.id => {
                table.remove(&ticket.hash);
                true
            }
            _ => false,
        }
    }
}

/// Per-source token buckets: a burst of `per_minute`, refilled at `per_minute / 60` per second.
pub(crate) struct RateLimiter {
    per_minute: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Sources tracked at most; beyond this, full buckets are dropped first, then new sources are
/// refused until room frees up (failing closed keeps the table's memory fixed).
const MAX_SOURCES: usize = 65_536;

impl RateLimiter {
    pub(crate) fn new(per_minute: u32) -> Self {
        RateLimiter {
            per_minute: f64::from(per_minute),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `ip`; `false` when its bucket is empty.
    pub(crate) fn allow(&self, ip: IpAddr, now: Instant) -> bool {
        let key = source_key(ip);
        let cap = self.per_minute;
        let refill =
            |b: &Bucket| (b.tokens + now.duration_since(b.at).as_secs_f64() * cap / 60.0).min(cap);
        let mut map = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(&key) && map.len() >= MAX_SOURCES {
            map.retain(|_, b| refill(b) < cap);
            if map.len() >= MAX_SOURCES {
                return false;
            }
        }
        let b = map.entry(key).or_insert(Bucket {
            tokens: cap,
            at: now,
        });
        b.tokens = refill(b);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Per-source counts of something held (connections before their hello, connections in
/// sessions), each source capped at `cap`.
pub(crate) struct PerSource {
    cap: usize,
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One unit held by a source under a [`PerSource`] cap, released on drop.
pub(crate) struct SourceSlot {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    key: IpAddr,
}

fn lock_counts(m: &Mutex<HashMap<IpAddr, usize>>) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
    // Every mutation is one call, so a poisoned map is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PerSource {
    pub(crate) fn new(cap: usize) -> Self {
        PerSource {
            cap,
            counts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Takes one unit for `ip`'s source; `None` when it already holds `cap`.
    pub(crate) fn take(&self, ip: IpAddr) -> Option<SourceSlot> {
        let key = source_key(ip);
        let mut map = lock_counts(&self.counts);
        let n = map.entry(key).or_insert(0);
        if *n >= self.cap {
            if *n == 0 {
                map.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            counts: self.counts.clone(),
            key,
        })
    }

    #[cfg(test)]
    fn sources(&self) -> usize {
        lock_counts(&self.counts).len()
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut map = lock_counts(&self.counts);
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The unit a limit applies to: one IPv4 address, or one IPv6 /64 (a single host usually owns a
/// whole /64, so counting addresses would let it rotate past the limit).
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut seg = v6.segments();
                seg[4..].fill(0);
                IpAddr::V6(seg.into())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_allows_burst_then_refills() {
        let rl = RateLimiter::new(3);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        assert!(rl.allow(ip, t0));
        assert!(rl.allow(ip, t0));
        assert!(rl.allow(ip, t0));
        assert!(!rl.allow(ip, t0));
        // Another source has its own bucket.
        assert!(rl.allow("127.0.0.2".parse().unwrap(), t0));
        // One token back after a third of a minute.
        assert!(rl.allow(ip, t0 + Duration::from_secs(21)));
        assert!(!rl.allow(ip, t0 + Duration::from_secs(21)));
    }

    #[test]
    fn per_source_caps_each_source_and_forgets_empty_ones() {
        let ps = PerSource::new(2);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same64: IpAddr = "2001:db8:1:2::ffff".parse().unwrap();
        let other: IpAddr = "127.0.0.9".parse().unwrap();
        let one = ps.take(a).unwrap();
        let two = ps.take(same64).unwrap();
        assert!(ps.take(a).is_none(), "the /64 holds its cap");
        let three = ps.take(other).unwrap();
        drop(one);
        let four = ps.take(a).unwrap();
        drop((two, three, four));
        assert_eq!(ps.sources(), 0);
        let none = PerSource::new(0);
        assert!(none.take(a).is_none());
        assert_eq!(none.sources(), 0);
    }

    #[test]
    fn ipv6_counts_per_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        let m: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(source_key(m), "127.0.0.1".parse::<IpAddr>().unwrap());
    }
}
