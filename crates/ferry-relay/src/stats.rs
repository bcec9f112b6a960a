//! Counters the relay keeps, and their snapshot.
//!
//! Atomics, updated from every task without a lock; a snapshot is a plain struct.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the relay's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Paired sessions currently forwarding.
    pub active: u64,
    /// Sessions registered and waiting for their second side.
    pub waiting: u64,
    /// Connections accepted whose hello has not been read yet.
    pub handshaking: u64,
    /// Sessions paired since the relay started.
    pub paired_total: u64,
    /// Connections accepted since the relay started.
    pub connections_total: u64,
    /// Bytes forwarded, both directions together.
    pub bytes_forwarded: u64,
    /// Paired sessions closed because no byte moved for the idle timeout.
    pub idle_closed: u64,
    /// Paired sessions closed for moving fewer than the minimum bytes in a window.
    pub slow_closed: u64,
    /// Paired sessions closed at the maximum session lifetime.
    pub lifetime_closed: u64,
    /// Session directions forwarded with splice.
    pub spliced_directions: u64,
    /// Session directions forwarded with the copy loop (configured, or splice fallback).
    pub copied_directions: u64,
    /// Refusals with `RATE_LIMITED`.
    pub refused_rate_limited: u64,
    /// Refusals with `FULL` (plus connections closed at accept when a hello limit is 0).
    pub refused_full: u64,
    /// Waiting sessions ended with `TIMEOUT`.
    pub refused_timeout: u64,
    /// Refusals with `BAD_HELLO`, plus hellos that did not arrive in time.
    pub refused_bad_hello: u64,
    /// Refusals with `TAKEN`.
    pub refused_taken: u64,
    /// Connections closed before their hello because a newcomer from their source found it
    /// holding its most hellos outstanding (the source's oldest silent one, else its oldest).
    pub refused_handshakes_per_ip: u64,
    /// Connections closed before their hello because a newcomer found the relay holding its most
    /// hellos outstanding (the oldest that sent nothing, else the oldest).
    pub evicted_handshakes: u64,
    /// Listener registrations refused with `TOO_MANY`: the source already had its most listeners.
    pub refused_listeners_per_ip: u64,
    /// Refusals with `TOO_MANY`: the source already had its most sessions at once.
    pub refused_sessions_per_ip: u64,
    /// Listeners' control connections currently registered.
    pub listeners: u64,
    /// Listeners registered since the relay started.
    pub listeners_total: u64,
    /// Clients announced to a listener (`INCOMING` sent).
    pub notifications: u64,
    /// Announced clients whose listener did not answer in time (the client got `TIMEOUT`).
    pub tokens_expired: u64,
    /// Accept connections refused because no client waits under their token.
    pub refused_token: u64,
    /// Control connections closed by the relay: silent past the keep-alive, flooding, or sending
    /// a message it does not know.
    pub listeners_dropped: u64,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "relay stats: active={} waiting={} handshaking={} paired_total={} connections_total={} \
             bytes_forwarded={} idle_closed={} slow_closed={} lifetime_closed={} spliced={} copied={} \
             listeners={} listeners_total={} notifications={} tokens_expired={} listeners_dropped={} \
             evicted_handshakes={} refused: rate_limited={} full={} timeout={} bad_hello={} taken={} \
             handshakes_per_ip={} sessions_per_ip={} listeners_per_ip={} token={}",
            self.active,
            self.waiting,
            self.handshaking,
            self.paired_total,
            self.connections_total,
            self.bytes_forwarded,
            self.idle_closed,
            self.slow_closed,
            self.lifetime_closed,
            self.spliced_directions,
            self.copied_directions,
            self.listeners,
            self.listeners_total,
            self.notifications,
            self.tokens_expired,
            self.listeners_dropped,
            self.evicted_handshakes,
            self.refused_rate_limited,
            self.refused_full,
            self.refused_timeout,
            self.refused_bad_hello,
            self.refused_taken,
            self.refused_handshakes_per_ip,
            self.refused_sessions_per_ip,
            self.refused_listeners_per_ip,
            self.refused_token
        )
    }
}

/// The live counters behind [`Stats`].
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub(crate) active: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) handshaking: AtomicU64,
    pub(crate) paired_total: AtomicU64,
    pub(crate) connections_total: AtomicU64,
    pub(crate) bytes_forwarded: AtomicU64,
    pub(crate) idle_closed: AtomicU64,
    pub(crate) slow_closed: AtomicU64,
    pub(crate) lifetime_closed: AtomicU64,
    pub(crate) spliced_directions: AtomicU64,
    pub(crate) copied_directions: AtomicU64,
    pub(crate) refused_rate_limited: AtomicU64,
    pub(crate) refused_full: AtomicU64,
    pub(crate) refused_timeout: AtomicU64,
    pub(crate) refused_bad_hello: AtomicU64,
    pub(crate) refused_taken: AtomicU64,
    pub(crate) refused_handshakes_per_ip: AtomicU64,
    pub(crate) refused_sessions_per_ip: AtomicU64,
    pub(crate) evicted_handshakes: AtomicU64,
    pub(crate) refused_listeners_per_ip: AtomicU64,
    pub(crate) listeners: AtomicU64,
    pub(crate) listeners_total: AtomicU64,
    pub(crate) notifications: AtomicU64,
    pub(crate) tokens_expired: AtomicU64,
    pub(crate) refused_token: AtomicU64,
    pub(crate) listeners_dropped: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            active: self.active.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            handshaking: self.handshaking.load(Relaxed),
            paired_total: self.paired_total.load(Relaxed),
            connections_total: self.connections_total.load(Relaxed),
            bytes_forwarded: self.bytes_forwarded.load(Relaxed),
            idle_closed: self.idle_closed.load(Relaxed),
            slow_closed: self.slow_closed.load(Relaxed),
            lifetime_closed: self.lifetime_closed.load(Relaxed),
            spliced_directions: self.spliced_directions.load(Relaxed),
            copied_directions: self.copied_directions.load(Relaxed),
            refused_rate_limited: self.refused_rate_limited.load(Relaxed),
            refused_full: self.refused_full.load(Relaxed),
            refused_timeout: self.refused_timeout.load(Relaxed),
            refused_bad_hello: self.refused_bad_hello.load(Relaxed),
            refused_taken: self.refused_taken.load(Relaxed),
            refused_handshakes_per_ip: self.refused_handshakes_per_ip.load(Relaxed),
            refused_sessions_per_ip: self.refused_sessions_per_ip.load(Relaxed),
            evicted_handshakes: self.evicted_handshakes.load(Relaxed),
            refused_listeners_per_ip: self.refused_listeners_per_ip.load(Relaxed),
            listeners: self.listeners.load(Relaxed),
            listeners_total: self.listeners_total.load(Relaxed),
            notifications: self.notifications.load(Relaxed),
            tokens_expired: self.tokens_expired.load(Relaxed),
            refused_token: self.refused_token.load(Relaxed),
            listeners_dropped: self.listeners_dropped.load(Relaxed),
        }
    }
}

/// Increments a gauge for as long as the guard lives.
pub(crate) struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    pub(crate) fn new(g: &'a AtomicU64) -> Self {
        g.fetch_add(1, Relaxed);
        Gauge(g)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Adds one to a counter.
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}
