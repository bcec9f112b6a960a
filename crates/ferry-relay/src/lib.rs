//! The ferry relay: the rendezvous + relay server behind `ferry relay`, the client function
//! `ferry send` / `ferry receive` use to reach a peer through it, and the [`Listener`] a
//! long-running server (`ferry share`) uses to stay reachable through it.
//!
//! Two peers that register under the same nameplate hash (one sender, one receiver) are paired,
//! and from then on the relay forwards bytes both ways. It holds no keys: everything after the
//! pairing is the peers' own encrypted, pseudorandom channel, so the relay learns only timing
//! and volume (security property 9). Its memory, connections and idle time are all bounded.
//!
//! # Wire protocol
//! The client sends a 34-byte hello `[version = 1][role: 1 sender, 2 receiver][hash: 32]`; the
//! relay answers one status byte: `0 WAITING` (first side; later followed by `1 PAIRED`), `1
//! PAIRED` (from the next byte on, a transparent pipe), or an error followed by a close: `2
//! RATE_LIMITED`, `3 FULL`, `4 TIMEOUT`, `5 BAD_HELLO`, `6 TAKEN`, `7 TOO_MANY`. See [`protocol`].
//!
//! # Listeners: one server, many clients, one after another
//! A listener opens a *control connection* (hello role `3`, answered `8 LISTENING`) and
//! registers up to 64 hashes with `SET_HASHES` (all or nothing; replaceable while connected, so
//! the hourly renewal of meeting hashes needs no reconnect; a hash another listener holds is
//! refused with `TAKEN`). A client that arrives under a listened hash, in either role, is
//! registered as a waiter found by a fresh one-time token (256 bits from the OS) instead of by
//! its hash, and the relay sends the listener `INCOMING [token][hash]`. The listener opens a
//! *data connection* (hello role `4` with the token in the hash's place), which the relay pairs
//! with that client exactly as a second side: the client sees `WAITING` then `PAIRED` as today,
//! so two clients under one hash are two sessions with the listener and never each other's
//! peer. A token pairs once; a token nobody waits under is answered `TIMEOUT`.
//!
//! Bounds: listeners at once ([`RelayConfig::max_listeners`]) and from one source
//! ([`RelayConfig::max_listeners_per_ip`]; more get `TOO_MANY`); each holds a session slot and
//! its source's place under the per-source session cap, and its registration costs a token of
//! the rate limit, as does each data connection; announced-but-unanswered clients per listener
//! ([`RelayConfig::max_pending_per_listener`]; more get `FULL`); a token expires after
//! [`RelayConfig::listener_answer_timeout`] (the client gets `TIMEOUT`); the relay pings every
//! [`RelayConfig::keepalive_interval`] and drops a listener silent for three intervals, or one
//! sending more than a burst of 16 messages plus 4 per interval, or anything it does not know.
//! A listener that goes frees its hashes at once, and the clients announced to it get
//! `TIMEOUT`. A client already waiting when its hash becomes listened is announced at once.
//!
//! # Design
//! - **One tokio runtime for everything.** Accept, hello, pairing, timers and forwarding are
//!   tasks; sockets are non-blocking. A connection that never sends costs one task and one
//!   descriptor until the hello timeout, a waiting one until the wait limit, and an idle paired
//!   session holds no thread, so thousands of idle connections exhaust nothing. (A blocking
//!   thread per direction would be simpler but costs two threads per session; readiness-driven
//!   splice is as cheap per byte and scales with sessions, not threads.)
//! - **Zero-copy forwarding.** Each direction splices socket → pipe → socket
//!   (`SPLICE_F_MOVE`, and `SPLICE_F_MORE` when more data is known to follow), driven by
//!   readiness through `TcpStream::try_io`. A fixed-buffer copy loop is the fallback, per
//!   direction when the kernel refuses splice, or for every session with [`Forwarding::Copy`].
//!   See the [`forward`] module notes for the `EAGAIN` subtlety.
//! - **Half-close** is propagated: when one side shuts down its writing, the relay shuts down
//!   writing towards the other side once everything is delivered; when both directions are done
//!   both sockets close. An error in either direction closes both.
//! - **Bounds** ([`RelayConfig`]): concurrent sessions (waiting + paired), outstanding hellos,
//!   new sessions per source per minute (token bucket; an IPv6 source is its /64), idle time of
//!   a paired session, wait for the second side, hello read time, and a fixed buffer per
//!   direction (pipe capacity or copy buffer). Nothing grows with traffic.
//! - **No one source can starve the rest**: per source, outstanding hellos are capped at accept
//!   (before a byte is read), connections in sessions and listeners at the hello; when the
//!   hellos outstanding reach a limit (the source's or the relay's), a newcomer takes the place
//!   of the connection that did least (the oldest that sent nothing, else the oldest: see the
//!   `seats` module), so silent sockets from many sources cannot keep a real client out; a paired
//!   session must move a minimum number of bytes per idle-timeout window (and optionally ends
//!   at a hard lifetime), so a trickle of bytes cannot hold a slot for ever.
//! - **Pairing** is a table keyed by hash under one mutex: the second side hands its stream to
//!   the first side's task through a oneshot channel, under the lock, so a wait that ends at the
//!   same moment never loses a peer. A waiting client that hangs up leaves the table at once.
//! - **Listeners** share that table: waiters are kept by id and found by hash (ordinary) or by
//!   token (announced); a listener's registration is a seat in the table that its control task
//!   drops whichever way it ends. See the `control` module for the task's bounds.
//! - **Shutdown**: [`RelayHandle::shutdown`] stops accepting and closes waiting and handshaking
//!   connections; paired sessions get [`RelayConfig::shutdown_grace`] to finish, then are closed.
//!
//! # Example
//! ```
//! use std::io::{Read, Write};
//! use std::time::Duration;
//! use ferry_relay::{connect, Relay, RelayConfig, Role};
//!
//! let config = RelayConfig { print_stats: false, ..RelayConfig::default() };
//! let relay = Relay::bind("127.0.0.1:0", config).unwrap();
//! let (addr, handle) = (relay.local_addr(), relay.shutdown_handle());
//! let server = std::thread::spawn(move || relay.run_blocking());
//!
//! let hash = [42u8; 32]; // the nameplate hash both peers derive from the code
//! let receiver = std::thread::spawn(move || {
//!     let mut s = connect(addr, Role::Receiver, hash, Duration::from_secs(10)).unwrap();
//!     let mut buf = [0u8; 5];
//!     s.read_exact(&mut buf).unwrap();
//!     buf
//! });
//! let mut s = connect(addr, Role::Sender, hash, Duration::from_secs(10)).unwrap();
//! s.write_all(b"hello").unwrap();
//! assert_eq!(&receiver.join().unwrap(), b"hello");
//! drop(s); // both sides closed: the session ends
//!
//! handle.shutdown();
//! let stats = server.join().unwrap().unwrap();
//! assert_eq!(stats.paired_total, 1);
//! ```

#![warn(missing_docs, unreachable_pub)]

mod client;
mod control;
pub mod forward;
mod listener;
mod pairing;
pub mod protocol;
mod seats;
mod server;
mod stats;

use std::time::Duration;

pub use client::{connect, RelayError};
pub use forward::Forwarding;
pub use listener::{accept_token, Listener, KEEPALIVE};
pub use pairing::source_key;
pub use protocol::Role;
pub use server::{Relay, RelayHandle};
pub use stats::Stats;

/// Limits and behaviour of a relay. Every limit has a default meant for a public relay.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// How paired sessions move bytes. Default: [`Forwarding::Splice`].
    pub forwarding: Forwarding,
    /// Concurrent sessions, waiting plus paired; more get `FULL`. Default: 1024.
    pub max_sessions: usize,
    /// Accepted connections whose hello is not read yet. At the limit a newcomer takes the place
    /// of the one that did least (the oldest that sent nothing, else the oldest), which is closed,
    /// so silent sockets cannot keep a real client out. Default: 1024.
    pub max_handshakes: usize,
    /// Accepted connections from one source (an IPv4 address, an IPv6 /64) whose hello is not
    /// read yet; at the limit a newcomer from that source takes the place of the source's own
    /// connection that did least, so one source cannot fill
    /// [`max_handshakes`](Self::max_handshakes). Default: 16.
    pub max_handshakes_per_ip: usize,
    /// Connections from one source (IPv4 address, IPv6 /64) that are in a session, waiting or
    /// paired, at once; more get `TOO_MANY`. A session whose two sides share a source counts
    /// twice. Default: 16.
    pub max_sessions_per_ip: usize,
    /// New sessions (valid hellos) per source address per minute, as a token bucket with this
    /// burst; more get `RATE_LIMITED`. An IPv6 source is its /64. Default: 60.
    pub sessions_per_ip_per_minute: u32,
    /// A paired session with no byte either way for this long is closed. Also the window of
    /// [`min_bytes_per_window`](Self::min_bytes_per_window). Default: 10 min.
    pub idle_timeout: Duration,
    /// A paired session must move at least this many bytes (both ways together) in every
    /// [`idle_timeout`](Self::idle_timeout) window counted from the pairing, or it is closed, so
    /// a byte now and then does not hold a session for ever. 0 turns the rule off. Default:
    /// 64 KiB (about 110 B/s with the default window; any real transfer moves far more, and a
    /// receiver thinking at the prompt may take up to one window, as with the idle rule).
    pub min_bytes_per_window: u64,
    /// A paired session is closed this long after pairing, whatever it moves; `None` for no
    /// limit. Default: `None` (a 100 GB transfer at 10 MB/s takes about 3 hours).
    pub max_session_lifetime: Option<Duration>,
    /// How long the first side waits for the second before `TIMEOUT`. Default: 10 min.
    pub max_wait: Duration,
    /// How long a new connection has to send its hello. A client sends its 34 bytes as it
    /// connects (well under a millisecond on loopback), so this only has to cover a lost segment
    /// or two on a slow network. Default: 3 s.
    pub hello_timeout: Duration,
    /// Bytes buffered per direction of a paired session: the pipe capacity for splice (rounded
    /// by the kernel to a power-of-two number of pages) or the copy buffer. The memory of a
    /// session is at most twice this. Default: 256 KiB.
    pub buffer_size: usize,
    /// Period of the stats line on stderr; `None` for no periodic line. Default: 60 s.
    pub stats_interval: Option<Duration>,
    /// Whether to print stats lines at all (periodic and at shutdown). Default: true.
    pub print_stats: bool,
    /// After shutdown, how long paired sessions may keep forwarding before being closed.
    /// Default: 5 s.
    pub shutdown_grace: Duration,
    /// Runtime worker threads for [`Relay::run_blocking`]; 0 means one per core. Default: 0.
    pub worker_threads: usize,
    /// Listeners' control connections at once; more get `FULL`. Each also holds a session slot
    /// and its source's place under [`max_sessions_per_ip`](Self::max_sessions_per_ip). Default: 256.
    pub max_listeners: usize,
    /// Listeners' control connections from one source (an IPv4 address, an IPv6 /64) at once;
    /// more get `TOO_MANY`, so a few addresses cannot take every one of
    /// [`max_listeners`](Self::max_listeners). Default: 4.
    pub max_listeners_per_ip: usize,
    /// Clients announced to one listener and not yet answered by an accept connection; a client
    /// beyond it gets `FULL`. Default: 16.
    pub max_pending_per_listener: usize,
    /// How long a listener has to open the accept connection for an announced client; then the
    /// token expires and the client gets `TIMEOUT`. Default: 30 s.
    pub listener_answer_timeout: Duration,
    /// The relay pings a listener's control connection this often and drops it after three
    /// intervals without a byte from it. It also bounds the listener's messages: a burst of 16,
    /// then 4 per interval; more closes the control connection. Default: 30 s.
    pub keepalive_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            forwarding: Forwarding::Splice,
            max_sessions: 1024,
            max_handshakes: 1024,
            max_handshakes_per_ip: 16,
            max_sessions_per_ip: 16,
            sessions_per_ip_per_minute: 60,
            idle_timeout: Duration::from_secs(600),
            min_bytes_per_window: 64 * 1024,
            max_session_lifetime: None,
            max_wait: Duration::from_secs(600),
            hello_timeout: Duration::from_secs(3),
            buffer_size: 256 * 1024,
            stats_interval: Some(Duration::from_secs(60)),
            print_stats: true,
            shutdown_grace: Duration::from_secs(5),
            worker_threads: 0,
            max_listeners: 256,
            max_listeners_per_ip: 4,
            max_pending_per_listener: 16,
            listener_answer_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(30),
        }
    }
}

/// Raises the soft open-file limit to the hard limit and returns the new soft limit.
/// A relay holds up to six descriptors per session (two sockets, two pipes).
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct for the duration of both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}
