//! The seats of connections whose hello is not read yet, and who gives a seat up to a newcomer.
//!
//! These seats are what a stranger attacks: anyone who knows the relay's address can open sockets
//! and say nothing. A real client sends its whole hello as it connects, so when the seats are
//! full (the relay's, or one source's) a newcomer takes the place of the connection that did
//! least: the oldest that sent nothing, else the oldest. The shape follows the waiting side's
//! handshake slots in `ferry-session` (its `Handshakes::make_room`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::pairing::source_key;

/// The pre-hello seats of one relay: at most `max`, at most `per_source` for each source.
pub(crate) struct PreHello {
    max: usize,
    per_source: usize,
    seats: Arc<Mutex<Seats>>,
}

/// Every seat under the one lock. Ids grow, so in each ordered set the first id is the oldest.
#[derive(Default)]
struct Seats {
    next_id: u64,
    all: BTreeMap<u64, Seat>,
    /// The seats whose connection has sent nothing yet.
    silent: BTreeSet<u64>,
    /// The seats of each source (at most `per_source`; an entry only while it holds one).
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
}

struct Seat {
    source: IpAddr,
    /// Dropped (or fired) when the seat is given to a newcomer: its connection must close.
    evict: oneshot::Sender<()>,
}

/// Why a newcomer's seat closed another connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MadeRoom {
    /// The newcomer's source held its most: one of its own connections gave way.
    Source,
    /// The relay held its most: the connection that did least, from any source, gave way.
    Relay,
}

/// One connection's seat, held until its hello is read (or it fails); released on drop.
pub(crate) struct PreHelloSeat {
    seats: Arc<Mutex<Seats>>,
    id: u64,
}

/// Resolves when a seat was given to a newcomer.
pub(crate) type Evicted = oneshot::Receiver<()>;

fn lock(m: &Mutex<Seats>) -> MutexGuard<'_, Seats> {
    // Every mutation is done within one call, so a poisoned table is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PreHello {
    pub(crate) fn new(max: usize, per_source: usize) -> Self {
        PreHello {
            max,
            per_source,
            seats: Arc::default(),
        }
    }

    /// A seat for a connection from `ip`, and what says when it was given up; the one that did
    /// least is closed when a limit is reached (and which limit is said). `None` only when a
    /// limit is 0.
    pub(crate) fn take(&self, ip: IpAddr) -> Option<(PreHelloSeat, Evicted, Option<MadeRoom>)> {
        if self.max == 0 || self.per_source == 0 {
            return None;
        }
        let source = source_key(ip);
        let mut seats = lock(&self.seats);
        let mut made = None;
        let mine = seats.by_source.get(&source).map_or(0, BTreeSet::len);
        if mine >= self.per_source {
            let ids = &seats.by_source[&source];
            let victim = ids
                .iter()
                .find(|id| seats.silent.contains(id))
                .or_else(|| ids.first());
            if let Some(&id) = victim {
                seats.evict(id);
                made = Some(MadeRoom::Source);
            }
        }
        if seats.all.len() >= self.max {
            let victim = seats
                .silent
                .first()
                .or_else(|| seats.all.keys().next())
                .copied();
            if let Some(id) = victim {
                seats.evict(id);
                made = made.or(Some(MadeRoom::Relay));
            }
        }
        let id = seats.next_id;
        seats.next_id += 1;
        let (evict, evicted) = oneshot::channel();
        seats.all.insert(id, Seat { source, evict });
        seats.silent.insert(id);
        seats.by_source.entry(source).or_default().insert(id);
        let seat = PreHelloSeat {
            seats: self.seats.clone(),
            id,
        };
        Some((seat, evicted, made))
    }

    #[cfg(test)]
    fn held(&self) -> (usize, usize, usize) {
        let seats = lock(&self.seats);
        (seats.all.len(), seats.silent.len(), seats.by_source.len())
    }
}

impl PreHelloSeat {
    /// The connection sent its first bytes: from now on it gives way only after every silent one.
    pub(crate) fn heard(&self) {
        lock(&self.seats).silent.remove(&self.id);
    }
}

impl Drop for PreHelloSeat {
    fn drop(&mut self) {
        lock(&self.seats).remove(self.id);
    }
}

impl Seats {
    /// Removes seat `id` and every index to it.
    fn remove(&mut self, id: u64) -> Option<Seat> {
        let seat = self.all.remove(&id)?;
        self.silent.remove(&id);
        if let Some(ids) = self.by_source.get_mut(&seat.source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&seat.source);
            }
        }
        Some(seat)
    }

    /// Gives seat `id` up: its connection's task sees `evicted` resolve and closes it.
    fn evict(&mut self, id: u64) {
        if let Some(seat) = self.remove(id) {
            let _ = seat.evict.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_newcomer_takes_the_seat_of_the_oldest_silent_then_of_the_oldest() {
        let pre = PreHello::new(3, 2);
        let (a, mut a_out, _) = pre.take(ip("127.0.0.2")).unwrap();
        let (_b, mut b_out, _) = pre.take(ip("127.0.0.3")).unwrap();
        let (c, mut c_out, _) = pre.take(ip("127.0.0.4")).unwrap();
        a.heard();
        // Full: the oldest that sent nothing (b) gives way, not the older a that spoke.
        let (d, mut d_out, made) = pre.take(ip("127.0.0.5")).unwrap();
        assert_eq!(made, Some(MadeRoom::Relay));
        assert!(b_out.try_recv().is_ok());
        assert!(a_out.try_recv().is_err());
        c.heard();
        d.heard();
        // Everyone spoke: the oldest gives way.
        let (_e, _, made) = pre.take(ip("127.0.0.6")).unwrap();
        assert_eq!(made, Some(MadeRoom::Relay));
        assert!(a_out.try_recv().is_ok());
        assert!(c_out.try_recv().is_err() && d_out.try_recv().is_err());
        assert_eq!(pre.held(), (3, 1, 3));
    }

    #[test]
    fn a_source_at_its_cap_makes_room_among_its_own_and_a_64_is_one_source() {
        let pre = PreHello::new(100, 2);
        let (a, mut a_out, _) = pre.take(ip("2001:db8:1:2::1")).unwrap();
        let (b, mut b_out, _) = pre.take(ip("2001:db8:1:2::ffff")).unwrap();
        let (other, _, _) = pre.take(ip("127.0.0.9")).unwrap();
        b.heard();
        let (c, _, made) = pre.take(ip("2001:db8:1:2:3::4")).unwrap();
        assert_eq!(made, Some(MadeRoom::Source));
        assert!(a_out.try_recv().is_ok(), "the silent one of that /64");
        assert!(b_out.try_recv().is_err());
        drop(other);
        assert_eq!(pre.held(), (2, 1, 1));
        drop((a, b, c));
        assert_eq!(pre.held(), (0, 0, 0));
        assert!(PreHello::new(0, 4).take(ip("127.0.0.1")).is_none());
    }
}
