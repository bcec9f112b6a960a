//! Packet sizes at the start of a stream: small first, then growing to the full size, as TLS's dynamic
//! record sizing does.
//!
//! A packet can be opened only once all of it has arrived. A fresh TCP connection is in slow start: from an
//! initial window of 10 segments (~14 KB), doubling each round trip, and BBR paces even that first window over
//! the round trip. A 1 MiB first packet therefore opens ~6 round trips after its first byte arrived (measured on
//! a 24 ms link: 145 ms). Here the first packet is [`FIRST_PACKET`] bytes and each later one may be half as
//! large as everything the writer wrote before it (the offer's packets included), so each round
//! trip of slow start, which carries about as much as all the ones before it, completes about two packets;
//! the full size is reached once about twice the full size has gone out (~2 MiB for 1 MiB packets: on
//! loopback, a millisecond). After a pause of [`IDLE_RESTART`], when TCP may have
//! shrunk its window again, the sizes start small again.
//!
//! Sans-IO: the caller passes the time.

use std::time::{Duration, Instant};

/// The first packet's largest contents: a few segments, which the initial window carries at once.
pub const FIRST_PACKET: usize = 4 << 10;
/// Nothing written for this long and packets start small again (TCP restarts slow start after an idle
/// retransmission timeout, at least 200 ms).
pub const IDLE_RESTART: Duration = Duration::from_millis(500);

/// How large the next packet may be, from what was written so far and when.
#[derive(Clone, Debug)]
pub struct PacketSizing {
    max: usize,
    /// Bytes written since the stream started or last paused.
    sent: u64,
    /// When bytes were last written.
    last: Option<Instant>,
}

impl PacketSizing {
    /// Sizes growing to `max`.
    pub fn new(max: usize) -> Self {
        PacketSizing {
            max,
            sent: 0,
            last: None,
        }
    }

    /// Sizes growing to `max` from now on.
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The largest contents the next packet should carry, if it is built at `now`.
    pub fn limit(&self, now: Instant) -> usize {
        let paused = self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) >= IDLE_RESTART);
        let sent = if paused { 0 } else { self.sent };
        usize::try_from(sent / 2)
            .unwrap_or(usize::MAX)
            .clamp(FIRST_PACKET, self.max.max(FIRST_PACKET))
            .min(self.max)
    }

    /// `bytes` were written at `now`.
    pub fn wrote(&mut self, bytes: usize, now: Instant) {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) >= IDLE_RESTART)
        {
            self.sent = 0;
        }
        self.sent = self.sent.saturating_add(bytes as u64);
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Writes packets of the allowed size, each at `now`, until `total` bytes went out; the sizes used.
    fn stream(s: &mut PacketSizing, total: usize, now: Instant) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut sent = 0;
        while sent < total {
            let n = s.limit(now);
            s.wrote(n, now);
            sizes.push(n);
            sent += n;
        }
        sizes
    }

    #[test]
    fn packets_start_small_and_grow_up_to_the_maximum() {
        let now = Instant::now();
        let mut s = PacketSizing::new(MIB);
        let sizes = stream(&mut s, 6 * MIB, now);
        assert_eq!(sizes[..3], [FIRST_PACKET; 3]);
        // Each packet is half as large as everything before it, until the maximum.
        let mut before = 0;
        for &n in &sizes {
            assert_eq!(n, (before / 2).clamp(FIRST_PACKET, MIB));
            before += n;
        }
        let first_full = sizes.iter().position(|&n| n == MIB).unwrap();
        assert!((2 * MIB..3 * MIB).contains(&sizes[..first_full].iter().sum::<usize>()));
        assert!(sizes[first_full..].iter().all(|&n| n == MIB));
    }

    #[test]
    fn a_pause_starts_small_again() {
        let t0 = Instant::now();
        let mut s = PacketSizing::new(MIB);
        stream(&mut s, 4 * MIB, t0);
        assert_eq!(s.limit(t0 + IDLE_RESTART / 2), MIB);
        let later = t0 + IDLE_RESTART;
        assert_eq!(s.limit(later), FIRST_PACKET);
        assert_eq!(stream(&mut s, 12 << 10, later), [FIRST_PACKET; 3]);
        assert_eq!(s.limit(later), 6 << 10);
    }

    #[test]
    fn a_maximum_below_the_first_size_is_kept() {
        let now = Instant::now();
        let mut s = PacketSizing::new(1000);
        assert_eq!(s.limit(now), 1000);
        s.wrote(1000, now);
        assert_eq!(s.limit(now), 1000);
    }
}
