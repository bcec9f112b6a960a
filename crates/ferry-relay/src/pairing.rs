//! Who is waiting under which nameplate hash, which listener holds which hashes, how many new sessions each source may open, and
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
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::{Hello, Role, Token};

/// The second side of a session: its stream and its place under its source's session cap, which
/// it holds for as long as the session runs.
pub(crate) type Peer = (TcpStream, SourceSlot);

/// One waiting side: its role, under which hash, how it is found, and where to hand the second
/// side.
struct Waiter {
    role: Role,
    hash: [u8; 32],
    /// Set when the waiter was announced to a listener: found by this token from then on.
    token: Option<Token>,
    tx: oneshot::Sender<Peer>,
}

/// A listener registered on a control connection.
struct ListenerEntry {
    hashes: Vec<[u8; 32]>,
    /// Tokens announced and not yet answered, with when each expires; at most
    /// `max_pending` long.
    pending: Vec<(Token, Instant)>,
    notify: mpsc::Sender<Notice>,
}

/// What a listener is told: a client waits under `hash`; it is found by `token`.
#[derive(Clone, Copy)]
pub(crate) struct Notice {
    pub(crate) token: Token,
    pub(crate) hash: [u8; 32],
}

/// Everything under the one lock: waiters by id, the two ways of finding one, and the listeners.
#[derive(Default)]
struct Table {
    waiters: HashMap<u64, Waiter>,
    /// Waiters nobody was told about, found by their hash (at most one per hash).
    by_hash: HashMap<[u8; 32], u64>,
    /// Waiters announced to a listener, found by their token.
    by_token: HashMap<Token, (u64, u64)>,
    /// Which listener holds each listened hash.
    listened: HashMap<[u8; 32], u64>,
    listeners: HashMap<u64, ListenerEntry>,
}

/// The table of waiting sides and listeners.
pub(crate) struct Rendezvous {
    table: Mutex<Table>,
    /// Sessions holding a slot: waiting plus paired, plus listeners' control connections.
    sessions: Arc<AtomicUsize>,
    max_sessions: usize,
    next_id: AtomicU64,
    limits: ListenLimits,
}

/// The bounds on listeners.
#[derive(Clone, Copy)]
pub(crate) struct ListenLimits {
    pub(crate) max_listeners: usize,
    pub(crate) max_pending: usize,
    pub(crate) answer_within: Duration,
}

/// A waiting registration; `rx` yields the second side's stream, or closes when the listener
/// it was announced to is gone or did not answer in time.
pub(crate) struct Ticket {
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
    /// Nobody was waiting: registered (and announced, under a listened hash); wait on the ticket.
    Registered(Ticket, SessionSlot, Peer),
    /// The same role already waits under this hash.
    Taken(TcpStream),
    /// The concurrent session limit is reached, or the hash's listener has as many clients
    /// announced and unanswered as it may.
    Full(TcpStream),
    /// An accept connection whose token nobody waits under (never issued, used, or expired).
    NoToken(TcpStream),
}

/// A registered listener: its id and where its notices arrive. Dropping it unregisters.
pub(crate) struct ListenerSeat<'a> {
    rendezvous: &'a Rendezvous,
    pub(crate) id: u64,
    pub(crate) notices: mpsc::Receiver<Notice>,
    _slot: SessionSlot,
}

impl Drop for ListenerSeat<'_> {
    fn drop(&mut self) {
        self.rendezvous.remove_listener(self.id);
    }
}

impl Rendezvous {
    pub(crate) fn new(max_sessions: usize, limits: ListenLimits) -> Self {
        Rendezvous {
            table: Mutex::new(Table::default()),
            sessions: Arc::new(AtomicUsize::new(0)),
            max_sessions,
            next_id: AtomicU64::new(0),
            limits,
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock leaves the table consistent enough: every entry a
        // mutation leaves behind is found and removed by its owner's cancel or drop.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session slot, checked and taken under the table lock so two racing hellos cannot both
    /// pass.
    fn take_slot(&self, _table: &Table) -> Option<SessionSlot> {
        if self.sessions.load(Relaxed) >= self.max_sessions {
            return None;
        }
        self.sessions.fetch_add(1, Relaxed);
        Some(SessionSlot(self.sessions.clone()))
    }

    /// Pairs `peer` with a waiting peer of the other role, or registers it; under a listened
    /// hash, registers it and announces it to the listener instead.
    pub(crate) fn join(&self, hello: &Hello, mut peer: Peer) -> Join {
        let token = new_token();
        let mut table = self.table();
        if let Some(&lid) = table.listened.get(&hello.hash) {
            if table.listeners[&lid].pending.len() >= self.limits.max_pending {
                return Join::Full(peer.0);
            }
            let Some(slot) = self.take_slot(&table) else {
                return Join::Full(peer.0);
            };
            let (id, ticket) = self.insert(&mut table, hello, Some(token));
            self.announce(&mut table, lid, id, token);
            return Join::Registered(ticket, slot, peer);
        }
        if let Some(&id) = table.by_hash.get(&hello.hash) {
            if table.waiters[&id].role == hello.role {
                return Join::Taken(peer.0);
            }
            let w = table.remove_waiter(id).expect("indexed waiter");
            // Sent under the lock: a waiter that finds its entry gone can count on the stream.
            match w.tx.send(peer) {
                Ok(()) => return Join::HandedOver,
                // The waiting task is gone (it ended without cancelling): take its place.
                Err(p) => peer = p,
            }
        }
        let Some(slot) = self.take_slot(&table) else {
            return Join::Full(peer.0);
        };
        let (_, ticket) = self.insert(&mut table, hello, None);
        Join::Registered(ticket, slot, peer)
    }

    fn insert(&self, table: &mut Table, hello: &Hello, token: Option<Token>) -> (u64, Ticket) {
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        if token.is_none() {
            table.by_hash.insert(hello.hash, id);
        }
        table.waiters.insert(
            id,
            Waiter {
                role: hello.role,
                hash: hello.hash,
                token,
                tx,
            },
        );
        (id, Ticket { id, rx })
    }

    /// Tells listener `lid` about waiter `id` under `token`; the waiter must carry that token.
    fn announce(&self, table: &mut Table, lid: u64, id: u64, token: Token) {
        let hash = table.waiters[&id].hash;
        let entry = table
            .listeners
            .get_mut(&lid)
            .expect("listened by a listener");
        entry
            .pending
            .push((token, Instant::now() + self.limits.answer_within));
        table.by_token.insert(token, (id, lid));
        // The channel holds `max_pending`, and every notice in it is also pending, so it has
        // room; if the listener's task just ended, its seat's drop removes this waiter.
        let _ = entry.notify.try_send(Notice { token, hash });
    }

    /// Hands an accept connection to the client waiting under `token`.
    pub(crate) fn join_token(&self, token: &Token, peer: Peer) -> Join {
        let mut table = self.table();
        let Some(&(id, _)) = table.by_token.get(token) else {
            return Join::NoToken(peer.0);
        };
        let w = table.remove_waiter(id).expect("indexed waiter");
        match w.tx.send(peer) {
            Ok(()) => Join::HandedOver,
            Err(p) => Join::NoToken(p.0),
        }
    }

    /// Withdraws a registration. `false` means it is no longer in the table: a peer took it (its
    /// stream is, or is about to be, in `ticket.rx`), or its listener dropped it (`rx` closes).
    pub(crate) fn cancel(&self, ticket: &Ticket) -> bool {
        self.table().remove_waiter(ticket.id).is_some()
    }

    /// Registers a listener with no hashes yet; `None` at the listener or session limit.
    pub(crate) fn add_listener(&self) -> Option<ListenerSeat<'_>> {
        let mut table = self.table();
        if table.listeners.len() >= self.limits.max_listeners {
            return None;
        }
        let slot = self.take_slot(&table)?;
        let id = self.next_id.fetch_add(1, Relaxed);
        let (notify, notices) = mpsc::channel(self.limits.max_pending.max(1));
        table.listeners.insert(
            id,
            ListenerEntry {
                hashes: Vec::new(),
                pending: Vec::new(),
                notify,
            },
        );
        Some(ListenerSeat {
            rendezvous: self,
            id,
            notices,
            _slot: slot,
        })
    }

    /// Replaces listener `lid`'s hashes, all or nothing: `Err(i)` when hash `i` is another
    /// listener's. A client already waiting under a new hash is announced at once.
    pub(crate) fn set_hashes(&self, lid: u64, hashes: &[[u8; 32]]) -> Result<(), u8> {
        let mut table = self.table();
        for (i, h) in hashes.iter().enumerate() {
            if table.listened.get(h).is_some_and(|&other| other != lid) {
                return Err(i as u8);
            }
        }
        let mut new = hashes.to_vec();
        new.sort_unstable();
        new.dedup();
        let entry = table.listeners.get_mut(&lid).expect("a live listener");
        let old = std::mem::replace(&mut entry.hashes, new.clone());
        for h in old {
            table.listened.remove(&h);
        }
        for h in new {
            table.listened.insert(h, lid);
            let Some(&id) = table.by_hash.get(&h) else {
                continue;
            };
            if table.listeners[&lid].pending.len() >= self.limits.max_pending {
                // The listener is at its cap: left as an ordinary waiter, which (since newcomers
                // under a listened hash go to the listener) waits until its wait limit.
                continue;
            }
            let token = new_token();
            table.by_hash.remove(&h);
            table.waiters.get_mut(&id).expect("indexed waiter").token = Some(token);
            self.announce(&mut table, lid, id, token);
        }
        Ok(())
    }

    /// Drops listener `lid`'s tokens that are past their time; their clients' waits end. Returns
    /// how many expired and when the next one does.
    pub(crate) fn expire(&self, lid: u64, now: Instant) -> (usize, Option<Instant>) {
        let mut table = self.table();
        let Some(entry) = table.listeners.get(&lid) else {
            return (0, None);
        };
        let stale: Vec<Token> = entry
            .pending
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in &stale {
            let (id, _) = table.by_token[t];
            table.remove_waiter(id);
        }
        let next = table.listeners[&lid].pending.iter().map(|p| p.1).min();
        (stale.len(), next)
    }

    /// Unregisters a listener: its hashes are free, and clients announced to it stop waiting.
    fn remove_listener(&self, lid: u64) {
        let mut table = self.table();
        let Some(entry) = table.listeners.remove(&lid) else {
            return;
        };
        for h in entry.hashes {
            table.listened.remove(&h);
        }
        for (t, _) in entry.pending {
            if let Some(&(id, _)) = table.by_token.get(&t) {
                table.remove_waiter(id);
            }
        }
    }
}

impl Table {
    /// Removes a waiter and every index to it; dropping its sender closes its ticket.
    fn remove_waiter(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        match w.token {
            None => {
                self.by_hash.remove(&w.hash);
            }
            Some(t) => {
                if let Some((_, lid)) = self.by_token.remove(&t) {
                    if let Some(l) = self.listeners.get_mut(&lid) {
                        l.pending.retain(|p| p.0 != t);
                    }
                }
            }
        }
        Some(w)
    }
}

/// A one-time token: 256 bits from the OS, so it cannot be guessed.
fn new_token() -> Token {
    let mut t = [0u8; 32];
    getrandom::fill(&mut t).expect("the OS random source failed");
    t
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

/// Per-source counts of something held (connections in sessions, listeners), each source
/// capped at `cap`.
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

/// The unit a per-source limit applies to: one IPv4 address, or one IPv6 /64 (a single host usually
/// owns a whole /64, so counting addresses would let it rotate past the limit). A v4-mapped IPv6
/// address counts as its IPv4 address.
pub fn source_key(ip: IpAddr) -> IpAddr {
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
