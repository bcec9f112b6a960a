//! The relay server: accept, read the hello, pair, forward, and stop cleanly.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::forward::{self, Activity, Meter};
use crate::pairing::{
    Join, ListenLimits, Peer, PerSource, RateLimiter, Rendezvous, SessionSlot, Ticket,
};
use crate::protocol::{Request, Status, HELLO_LEN};
use crate::seats::{Evicted, MadeRoom, PreHello, PreHelloSeat};
use crate::stats::{bump, Counters, Gauge, Stats};
use crate::RelayConfig;

/// State every task of one relay shares.
pub(crate) struct Shared {
    pub(crate) config: RelayConfig,
    pub(crate) counters: Counters,
    pub(crate) rendezvous: Rendezvous,
    rate: RateLimiter,
    /// Connections whose hello is not read yet, in all and per source.
    pre_hello: PreHello,
    /// Connections per source in a session (waiting or paired).
    in_session: PerSource,
    /// Listeners' control connections per source.
    listening: PerSource,
    /// Set once: stop accepting, close waiting and handshaking connections.
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set after the grace period: close in-flight sessions too.
    hard_stop: watch::Sender<bool>,
    local_addr: SocketAddr,
}

/// A bound relay, ready to [`run`](Relay::run).
pub struct Relay {
    listener: StdListener,
    shared: Arc<Shared>,
}

/// A cloneable handle to a relay: stop it and read its counters from any thread.
#[derive(Clone)]
pub struct RelayHandle {
    shared: Arc<Shared>,
}

impl RelayHandle {
    /// Stops the relay: no new connections, waiting sessions closed, paired sessions given
    /// [`RelayConfig::shutdown_grace`] to finish. Idempotent; callable from any thread.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// A snapshot of the relay's counters.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The address the relay listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Waits for SIGINT or SIGTERM, then calls [`shutdown`](Self::shutdown), saying on stderr (with
    /// [`RelayConfig::print_stats`]) how long paired sessions may still take; a second signal closes them at
    /// once. Spawn it next to [`Relay::run`] on the same runtime.
    pub async fn shutdown_on_signal(self) -> io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let active = self.stats().active;
        if active > 0 && self.shared.config.print_stats {
            // Without a word the relay would seem to hang for the grace period.
            eprintln!(
                "\nferry relay: stopping; {active} paired session{} may take up to {}s to finish \
                 (Ctrl-C again closes them now)",
                if active == 1 { "" } else { "s" },
                self.shared.config.shutdown_grace.as_secs_f64()
            );
        }
        self.shutdown();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        self.shared.hard_stop.send_replace(true);
        Ok(())
    }
}

impl Relay {
    /// Binds the listening socket (with a deep accept backlog) and raises the process's open file
    /// limit to its hard limit, since every session holds up to six descriptors. Needs no runtime.
    pub fn bind(addr: impl ToSocketAddrs, config: RelayConfig) -> io::Result<Relay> {
        crate::raise_nofile_limit();
        let listener = StdListener::bind(addr)?;
        // SAFETY: the fd is a bound socket owned by `listener`; listen(2) on an already listening
        // socket only changes its backlog (std's default of 128 drops bursts of connects).
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            rendezvous: Rendezvous::new(
                config.max_sessions,
                ListenLimits {
                    max_listeners: config.max_listeners,
                    max_pending: config.max_pending_per_listener,
                    answer_within: config.listener_answer_timeout,
                },
            ),
            rate: RateLimiter::new(config.sessions_per_ip_per_minute),
            pre_hello: PreHello::new(config.max_handshakes, config.max_handshakes_per_ip),
            in_session: PerSource::new(config.max_sessions_per_ip),
            listening: PerSource::new(config.max_listeners_per_ip),
            counters: Counters::default(),
            shutdown: watch::channel(false).0,
            hard_stop: watch::channel(false).0,
            local_addr,
            config,
        });
        Ok(Relay { listener, shared })
    }

    /// The address the relay listens on (useful after binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// A handle to stop the relay and read its counters.
    pub fn shutdown_handle(&self) -> RelayHandle {
        RelayHandle {
            shared: self.shared.clone(),
        }
    }

    /// A snapshot of the relay's counters.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Serves until [`RelayHandle::shutdown`], then waits for every connection to end (paired
    /// sessions at most [`RelayConfig::shutdown_grace`]) and returns the final counters.
    /// Must run inside a tokio runtime with I/O and time enabled.
    pub async fn run(self) -> io::Result<Stats> {
        let shared = self.shared;
        let listener = TcpListener::from_std(self.listener)?;
        let (alive, mut all_done) = mpsc::channel::<()>(1);
        let printer = shared
            .config
            .stats_interval
            .filter(|_| shared.config.print_stats)
            .map(|every| {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let mut tick =
                        tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                    loop {
                        tick.tick().await;
                        eprintln!("{}", shared.counters.snapshot());
                    }
                })
            });
        let mut stop = shared.shutdown.subscribe();
        loop {
            let accepted = tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                r = listener.accept() => r,
            };
            match accepted {
                Ok((stream, peer)) => {
                    bump(&shared.counters.connections_total);
                    // At a limit of hellos outstanding (the source's or the relay's) the newcomer
                    // takes the seat of the connection that did least, which closes.
                    let pre = match shared.pre_hello.take(peer.ip()) {
                        None => {
                            bump(&shared.counters.refused_full);
                            continue;
                        }
                        Some((pre, evicted, made)) => {
                            match made {
                                Some(MadeRoom::Source) => {
                                    bump(&shared.counters.refused_handshakes_per_ip)
                                }
                                Some(MadeRoom::Relay) => bump(&shared.counters.evicted_handshakes),
                                None => {}
                            }
                            (pre, evicted)
                        }
                    };
                    let shared = shared.clone();
                    let alive = alive.clone();
                    tokio::spawn(async move {
                        handle_connection(&shared, stream, peer, pre).await;
                        drop(alive);
                    });
                }
                // Out of descriptors or memory, or an aborted handshake: back off briefly rather
                // than spin or die; existing sessions keep running.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        drop(listener);
        drop(alive);
        let grace = shared.config.shutdown_grace;
        if tokio::time::timeout(grace, all_done.recv()).await.is_err() {
            shared.hard_stop.send_replace(true);
            all_done.recv().await;
        }
        if let Some(p) = printer {
            p.abort();
        }
        let stats = shared.counters.snapshot();
        if shared.config.print_stats {
            eprintln!("{stats}");
        }
        Ok(stats)
    }

    /// Builds a multi-threaded runtime ([`RelayConfig::worker_threads`]) and runs the relay on it.
    pub fn run_blocking(self) -> io::Result<Stats> {
        self.runtime()?.block_on(self.run())
    }

    /// Like [`run_blocking`](Self::run_blocking), and shuts down on SIGINT or SIGTERM.
    pub fn run_blocking_until_signal(self) -> io::Result<Stats> {
        let handle = self.shutdown_handle();
        self.runtime()?.block_on(async move {
            let signals = tokio::spawn(handle.shutdown_on_signal());
            let r = self.run().await;
            signals.abort();
            r
        })
    }

    fn runtime(&self) -> io::Result<tokio::runtime::Runtime> {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if self.shared.config.worker_threads > 0 {
            b.worker_threads(self.shared.config.worker_threads);
        }
        b.thread_name("ferry-relay").enable_all().build()
    }
}

async fn handle_connection(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    (pre_hello, evicted): (PreHelloSeat, Evicted),
) {
    // Interactive traffic (the peers' handshakes) must not wait on Nagle at the relay.
    let _ = stream.set_nodelay(true);
    let mut stop = shared.shutdown.subscribe();
    let (hello, stream) = {
        let _g = Gauge::new(&shared.counters.handshaking);
        // Moved into this block, so the seat is given back as soon as the hello is read.
        let (pre_hello, mut evicted) = (pre_hello, evicted);
        let mut stream = stream;
        let read = tokio::time::timeout(
            shared.config.hello_timeout,
            read_hello(&mut stream, &pre_hello),
        );
        let r = tokio::select! {
            r = read => r,
            // A newcomer took the seat (counted at its accept): closed without a word.
            _ = &mut evicted => return,
            _ = stop.wait_for(|s| *s) => return,
        };
        match r {
            Ok(Ok(Some(hello))) => (hello, stream),
            Ok(Ok(None)) => {
                bump(&shared.counters.refused_bad_hello);
                return refuse(stream, Status::BadHello).await;
            }
            // Timed out, or closed mid-hello: nothing worth answering.
            Err(_) => return bump(&shared.counters.refused_bad_hello),
            Ok(Err(_)) => return,
        }
    };
    // Checked before the rate limit, so a refusal here costs the source no token. A listener's
    // control and accept connections count like the sides of any session.
    let Some(in_session) = shared.in_session.take(peer.ip()) else {
        bump(&shared.counters.refused_sessions_per_ip);
        return refuse(stream, Status::TooMany).await;
    };
    // A few sources must not take every listener seat: a listener's source has its own cap.
    let listening = match hello {
        Request::Listen => match shared.listening.take(peer.ip()) {
            Some(place) => Some(place),
            None => {
                bump(&shared.counters.refused_listeners_per_ip);
                return refuse(stream, Status::TooMany).await;
            }
        },
        _ => None,
    };
    if !shared.rate.allow(peer.ip(), Instant::now()) {
        bump(&shared.counters.refused_rate_limited);
        return refuse(stream, Status::RateLimited).await;
    }
    let joined = match hello {
        Request::Session(hello) => shared.rendezvous.join(&hello, (stream, in_session)),
        Request::Accept { token } => shared.rendezvous.join_token(&token, (stream, in_session)),
        Request::Listen => {
            let places = (in_session, listening.expect("taken for a listener"));
            return crate::control::serve(shared, stream, places).await;
        }
    };
    match joined {
        Join::HandedOver => {}
        Join::Taken(s) => {
            bump(&shared.counters.refused_taken);
            refuse(s, Status::Taken).await
        }
        Join::Full(s) => {
            bump(&shared.counters.refused_full);
            refuse(s, Status::Full).await
        }
        Join::NoToken(s) => {
            bump(&shared.counters.refused_token);
            refuse(s, Status::Timeout).await
        }
        Join::Registered(ticket, slot, p) => wait_for_peer(shared, ticket, slot, p).await,
    }
}

/// Reads the hello, and no byte past it; `Ok(None)` for a wrong version or role, checked on the
/// first two bytes so garbage is refused without waiting for 34 bytes. The first bytes mark the
/// seat as heard.
async fn read_hello(stream: &mut TcpStream, seat: &PreHelloSeat) -> io::Result<Option<Request>> {
    let mut buf = [0u8; HELLO_LEN];
    let mut filled = 0;
    while filled < HELLO_LEN {
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if filled == 0 {
            seat.heard();
        }
        filled += n;
        if filled >= 2 && !Request::valid_prefix([buf[0], buf[1]]) {
            return Ok(None);
        }
    }
    Ok(Request::parse(&buf))
}

/// Sends an error status, then closes (write side first, so the byte is not lost to a reset).
pub(crate) async fn refuse(stream: TcpStream, status: Status) {
    if send_status(&stream, status).await.is_ok() {
        let _ = forward::shutdown_write(&stream);
    }
}

/// Writes one status byte; a fresh socket always has room, the timeout guards the odd case.
pub(crate) async fn send_status(stream: &TcpStream, status: Status) -> io::Result<()> {
    write_within(stream, &[status as u8], Duration::from_secs(5)).await
}

/// Writes all of `bytes`, or fails when the peer does not take them within `limit` (a peer
/// that stops reading cannot hold a task for ever).
pub(crate) async fn write_within(
    stream: &TcpStream,
    mut bytes: &[u8],
    limit: Duration,
) -> io::Result<()> {
    let write = async {
        while !bytes.is_empty() {
            match stream.try_write(bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    tokio::time::timeout(limit, write)
        .await
        .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
}

/// Resolves when the waiting client hangs up; pending until the wait ends otherwise. A client
/// that sends early is left alone (its bytes stay queued for the peer).
async fn hung_up(stream: &TcpStream) {
    let mut b = [0u8; 1];
    match stream.peek(&mut b).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

enum WaitEnd {
    Peer(Peer),
    Timeout,
    Gone,
    /// The listener the client was announced to did not answer in time, or went away.
    Dropped,
}

async fn wait_for_peer(shared: &Arc<Shared>, ticket: Ticket, slot: SessionSlot, me: Peer) {
    // `_mine` keeps this side's place under its source's session cap until the session ends.
    let (stream, _mine) = me;
    let waiting = Gauge::new(&shared.counters.waiting);
    let mut ticket = ticket;
    let end = if send_status(&stream, Status::Waiting).await.is_err() {
        WaitEnd::Gone
    } else {
        let mut stop = shared.shutdown.subscribe();
        tokio::select! {
            r = &mut ticket.rx => r.map_or(WaitEnd::Dropped, WaitEnd::Peer),
            _ = tokio::time::sleep(shared.config.max_wait) => WaitEnd::Timeout,
            _ = hung_up(&stream) => WaitEnd::Gone,
            _ = stop.wait_for(|s| *s) => WaitEnd::Gone,
        }
    };
    let (peer, _theirs) = match end {
        WaitEnd::Peer(p) => p,
        WaitEnd::Dropped => {
            bump(&shared.counters.refused_timeout);
            return refuse(stream, Status::Timeout).await;
        }
        _ if !shared.rendezvous.cancel(&ticket) => {
            // A peer took the registration just as the wait ended (its stream is in the
            // channel), or its listener dropped it (the channel is closed).
            match ticket.rx.await {
                Ok(p) => p,
                Err(_) => return,
            }
        }
        WaitEnd::Timeout => {
            bump(&shared.counters.refused_timeout);
            return refuse(stream, Status::Timeout).await;
        }
        WaitEnd::Gone => return,
    };
    drop(waiting);
    if send_status(&stream, Status::Paired).await.is_err()
        || send_status(&peer, Status::Paired).await.is_err()
    {
        return;
    }
    run_session(shared, stream, peer, slot).await;
}

/// Forwards a paired session until both sides are done, it idles out, it moves too little in a
/// window, it reaches its lifetime, or the relay hard-stops.
async fn run_session(shared: &Arc<Shared>, a: TcpStream, b: TcpStream, slot: SessionSlot) {
    let _slot = slot;
    let _active = Gauge::new(&shared.counters.active);
    bump(&shared.counters.paired_total);
    let activity = Activity::new();
    let meter = Meter {
        bytes: &shared.counters.bytes_forwarded,
        spliced: &shared.counters.spliced_directions,
        copied: &shared.counters.copied_directions,
        activity: &activity,
    };
    let cfg = &shared.config;
    let fwd = forward::forward(&a, &b, cfg.forwarding, cfg.buffer_size, &meter);
    tokio::pin!(fwd);
    let mut hard = shared.hard_stop.subscribe();
    let paired_at = Instant::now();
    let end_of_life = cfg.max_session_lifetime.map(|d| paired_at + d);
    // Fixed windows of `idle_timeout` from the pairing: each must move `min_bytes_per_window`.
    let mut window_end = paired_at + cfg.idle_timeout;
    let mut bytes_at_window_start = 0u64;
    loop {
        let mut deadline = (activity.last() + cfg.idle_timeout).min(window_end);
        if let Some(t) = end_of_life {
            deadline = deadline.min(t);
        }
        tokio::select! {
            _ = &mut fwd => break,
            _ = hard.wait_for(|s| *s) => break,
            _ = tokio::time::sleep_until(deadline.into()) => {
                let now = Instant::now();
                if end_of_life.is_some_and(|t| t <= now) {
                    bump(&shared.counters.lifetime_closed);
                    break;
                }
                if activity.last() + cfg.idle_timeout <= now {
                    bump(&shared.counters.idle_closed);
                    break;
                }
                if window_end <= now {
                    let bytes = activity.bytes();
                    if bytes - bytes_at_window_start < cfg.min_bytes_per_window {
                        bump(&shared.counters.slow_closed);
                        break;
                    }
                    bytes_at_window_start = bytes;
                    window_end += cfg.idle_timeout;
                }
            }
        }
    }
    // Dropping both streams closes them; unread data makes the kernel reset, which is right for
    // a session cut short.
}
