//! The waiting side: listen, announce on this host and the LAN, wait at the relay, and race the handshakes of
//! whoever comes.

use std::any::Any;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferry_channel::{ChannelError, CodeAttempts, Established, MAX_FAILED_ATTEMPTS};
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::{mdns, netif};

use crate::error::{relay_error, taken_at_relay};
use crate::handshake::{Event, Handshakes, Purpose};
use crate::upgrade::DirectPaths;
use crate::{Connected, Events, Meeting, MeetingAuth, PathKind, PeerOptions, SessionError};

/// How long the waiting side waits at the relay for the other.
const RELAY_WAIT: Duration = Duration::from_secs(600);
/// The first pause before a paired meeting taken at the relay is asked for again; it doubles up to
/// [`TAKEN_BACKOFF_MOST`].
const TAKEN_BACKOFF_FIRST: Duration = Duration::from_secs(5);
/// The longest pause between two attempts on a taken meeting.
const TAKEN_BACKOFF_MOST: Duration = Duration::from_secs(30);

/// The waiting side (`ferry send`, the side of `ferry pair` that prints the code) and what it keeps alive while
/// it waits: its listener, its announcements, its wait at the relay.
pub struct Rendezvous {
    pub(crate) rx: mpsc::Receiver<Event>,
    handshakes: Handshakes,
    meeting: Meeting,
    /// The code's guess budget (one guess), when the meeting is on a code.
    attempts: Option<Arc<CodeAttempts>>,
    /// The same-host announcement and the mDNS advertisement, as [`Events::keep_until_exit`] keeps them.
    _announcement: Option<Box<dyn Any + Send>>,
    _advertisement: Option<Box<dyn Any + Send>>,
    /// Where the waiting side listens, if it does.
    pub listen: Option<SocketAddr>,
    explicit_listen: bool,
    has_direct: bool,
    /// Tells the relay thread to stop asking for a taken meeting.
    relay_stop: Arc<AtomicBool>,
}

impl Rendezvous {
    /// Starts listening (unless `--force-relay`), announces on this host, and registers at the relay.
    ///
    /// Where it listens: `--listen ADDR` when given (every source accepted: the user chose the address);
    /// otherwise loopback with `--no-discovery`, and with discovery every interface, accepting connections only
    /// from this host and from directly attached networks (where mDNS reaches), never from a routed address.
    pub fn start(
        meeting: Meeting,
        opts: &PeerOptions,
        listen: Option<SocketAddr>,
        events: &mut dyn Events,
    ) -> Result<Self, SessionError> {
        if opts.force_relay && opts.relay.is_none() {
            return Err(SessionError::NoRelay);
        }
        let (tx, rx) = mpsc::channel();
        let (mut announcement, mut advertisement, mut local) = (None, None, None);
        if !opts.force_relay {
            let bound = listen_for_peers(opts, listen, tx.clone())?;
            let loopback = SocketAddr::from(([127, 0, 0, 1], bound.port()));
            let registry = LocalRegistry::open_default()?;
            let announced = registry.announce(&meeting.hash, loopback).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    SessionError::Taken(meeting.label.clone())
                } else {
                    SessionError::Announce(e)
                }
            })?;
            announcement = Some(events.keep_until_exit(Box::new(announced)));
            if !opts.no_discovery {
                let advertised = mdns::advertise(&meeting.hash, bound.port())?;
                advertisement = Some(events.keep_until_exit(Box::new(advertised)));
            }
            local = Some(bound);
        }
        let relay_stop = Arc::new(AtomicBool::new(false));
        if let Some(relay) = opts.relay.clone() {
            let hash = meeting.hash.0;
            let tx = tx.clone();
            // A code's meeting taken is a clash of codes; a paired meeting taken is another waiting side of
            // the pair (or someone holding its secret), which may leave: ask again.
            let paired = matches!(meeting.auth, MeetingAuth::Other(_));
            let what = format!("the meeting of this {}", meeting.label);
            let (stop, direct) = (Arc::clone(&relay_stop), local.is_some());
            std::thread::spawn(move || {
                let mut backoff = TAKEN_BACKOFF_FIRST;
                let mut warned = false;
                let offered = loop {
                    match ferry_relay::connect(
                        relay.as_str(),
                        ferry_relay::Role::Sender,
                        hash,
                        RELAY_WAIT,
                    ) {
                        Ok(stream) => break Event::Offered(stream, PathKind::Relay, relay),
                        Err(ferry_relay::RelayError::Taken(_)) if paired => {
                            // Said once: the attempts go on quietly until the meeting is free.
                            if !warned {
                                warned = true;
                                let warning = taken_at_relay(&relay, &what, direct);
                                if tx.send(Event::RelayWarning(warning)).is_err() {
                                    return;
                                }
                            }
                            let until = Instant::now() + backoff;
                            while Instant::now() < until {
                                if stop.load(Ordering::Relaxed) {
                                    return;
                                }
                                std::thread::sleep(Duration::from_millis(100));
                            }
                            backoff = (backoff * 2).min(TAKEN_BACKOFF_MOST);
                        }
                        Err(e) => break Event::RelayFailed(relay_error(&relay, e)),
                    }
                };
                let _ = tx.send(offered);
            });
        }
        let attempts = match meeting.auth {
            MeetingAuth::Code(_) => Some(CodeAttempts::one_guess(MAX_FAILED_ATTEMPTS)),
            MeetingAuth::Other(_) => None,
        };
        Ok(Rendezvous {
            rx,
            handshakes: Handshakes::new(tx),
            meeting,
            attempts,
            _announcement: announcement,
            _advertisement: advertisement,
            listen: local,
            explicit_listen: listen.is_some(),
            has_direct: local.is_some(),
            relay_stop,
        })
    }

    /// Waits for the peer: the first connection that completes the handshake. Handshakes run side by side, each
    /// with its own deadline. On a code, one wrong confirmation ends the wait (one guess per code), and so do
    /// [`MAX_FAILED_ATTEMPTS`] attempts that reached the PAKE and did not finish; connections that fail
    /// before the PAKE (not ferry, too slow) are dropped and waiting goes on.
    pub fn accept(&mut self, events: &mut dyn Events) -> Result<Connected, SessionError> {
        loop {
            let event = self.rx.recv().map_err(|_| {
                SessionError::PeerNotFound("no path to the receiver is left".to_string())
            })?;
            match event {
                Event::RelayWarning(warning) => events.warn(&warning),
                Event::RelayFailed(e) => {
                    if !self.has_direct {
                        return Err(e);
                    }
                    events.warn(&format!(
                        "relay path failed: {}; still waiting for a direct connection",
                        crate::with_causes(&e)
                    ));
                }
                Event::Offered(stream, path, peer) => {
                    let started = self.handshakes.start(
                        stream,
                        path,
                        peer.clone(),
                        Purpose::Meeting,
                        self.meeting.auth.auth(),
                        self.attempts.clone(),
                    );
                    if let Err(why) = started {
                        events.warn(&format!("refused a connection from {peer}: {why}"));
                    }
                }
                Event::Finished(f) => {
                    self.handshakes.finished(&f);
                    if f.purpose != Purpose::Meeting {
                        continue;
                    }
                    match f.result {
                        Ok((stream, established)) => {
                            self.handshakes.stop_all();
                            self.relay_stop.store(true, Ordering::Relaxed);
                            return Ok(Connected {
                                stream,
                                established,
                                path: f.path,
                                peer: f.peer,
                                handshake: Some(f.took),
                            });
                        }
                        Err(e) if self.attempts.as_ref().is_some_and(|a| a.is_dead()) => {
                            self.handshakes.stop_all();
                            return Err(self.spent(e));
                        }
                        Err(e) if f.path == PathKind::Relay => {
                            // The relay pairing was spent on a peer that failed; no second relay attempt.
                            events.warn(&format!("dropped the relay connection: {e}"));
                            if !self.has_direct {
                                return Err(e.into());
                            }
                        }
                        Err(e) => {
                            if self.handshakes.worth_a_warning(f.keyed, &f.peer, events) {
                                events.warn(&format!(
                                    "dropped a connection from {}: {e}{}",
                                    f.peer,
                                    self.attempts_note()
                                ))
                            }
                        }
                    }
                }
            }
        }
    }

    /// How many attempts on the code failed so far, when any did.
    fn attempts_note(&self) -> String {
        match &self.attempts {
            Some(a) if a.failed() > 0 => format!(
                " ({} of {} failed attempts on this code)",
                a.failed(),
                a.limit()
            ),
            _ => String::new(),
        }
    }

    /// The error that ends a send whose code is dead.
    fn spent(&self, last: ChannelError) -> SessionError {
        let failed = self.attempts.as_ref().map_or(0, |a| a.failed());
        let why = if matches!(last, ChannelError::WrongCode) && failed == 1 {
            "a receiver gave the wrong code".to_string()
        } else {
            format!("{failed} attempts to connect with this code failed (last: {last})")
        };
        SessionError::WrongCode {
            message: format!(
                "{why}; the code is spent (one guess per code), start a new {}",
                self.meeting.other_side
            ),
            source: ChannelError::WrongCode,
        }
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        self.relay_stop.store(true, Ordering::Relaxed);
    }
}

/// Listens for the looking side (where, as [`Rendezvous::start`] says) and offers each connection on `tx`, on
/// a thread of its own; returns the bound address.
pub(crate) fn listen_for_peers(
    opts: &PeerOptions,
    listen: Option<SocketAddr>,
    tx: mpsc::Sender<Event>,
) -> Result<SocketAddr, SessionError> {
    // With discovery the peer may be on the LAN, so listen on every interface.
    let any = if opts.no_discovery {
        [127, 0, 0, 1]
    } else {
        [0, 0, 0, 0]
    };
    let addr = listen.unwrap_or_else(|| SocketAddr::from((any, 0)));
    let listener =
        TcpListener::bind(addr).map_err(|source| SessionError::Listen { addr, source })?;
    let bound = listener.local_addr()?;
    let only_on_link = listen.is_none();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(stream) = conn else { continue };
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            // Interfaces are read per connection: addresses come and go while a sender waits.
            if only_on_link && !netif::on_link(peer.ip(), &netif::interfaces()) {
                continue;
            }
            if tx
                .send(Event::Offered(stream, PathKind::Direct, peer.to_string()))
                .is_err()
            {
                return;
            }
        }
    });
    Ok(bound)
}

impl DirectPaths for Rendezvous {
    /// Addresses where a peer elsewhere could reach this listener: the listen address when it is a specific
    /// one, else every non-loopback interface address with the listener's port.
    fn direct_candidates(&self) -> Vec<SocketAddr> {
        let Some(listen) = self.listen else {
            return Vec::new();
        };
        if !listen.ip().is_unspecified() {
            // A loopback address only helps a receiver on this host, which finds us through the registry;
            // it is offered only when the user chose it with --listen.
            return if listen.ip().is_loopback() && !self.explicit_listen {
                Vec::new()
            } else {
                vec![listen]
            };
        }
        netif::interface_addresses()
            .into_iter()
            .filter(|ip| ip.is_ipv4() == listen.is_ipv4() || listen.is_ipv6())
            .map(|ip| SocketAddr::new(ip, listen.port()))
            .collect()
    }

    /// Runs an upgrade handshake (password `secret`) on each new direct connection, side by side, and returns
    /// the first that completes within `wait`.
    fn next_upgraded(
        &mut self,
        secret: &[u8],
        wait: Duration,
        events: &mut dyn Events,
    ) -> Option<(TcpStream, Established)> {
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let event = self.rx.recv_timeout(left).ok()?;
            match event {
                Event::Offered(stream, PathKind::Direct, peer) => {
                    let started = self.handshakes.start(
                        stream,
                        PathKind::Direct,
                        peer.clone(),
                        Purpose::Upgrade,
                        ferry_channel::Auth::Code(secret.to_vec()),
                        None,
                    );
                    if let Err(why) = started {
                        events.warn(&format!("refused a connection from {peer}: {why}"));
                    }
                }
                Event::Finished(f) => {
                    self.handshakes.finished(&f);
                    match (f.purpose, f.result) {
                        (Purpose::Upgrade, Ok(done)) => {
                            self.handshakes.stop_all();
                            return Some(done);
                        }
                        (Purpose::Upgrade, Err(e)) => events.warn(&format!(
                            "a direct connection from {} failed the path upgrade: {e}",
                            f.peer
                        )),
                        // A late handshake on the meeting, after the relay path won: nothing to do.
                        (Purpose::Meeting, _) => {}
                    }
                }
                Event::Offered(..) | Event::RelayFailed(_) | Event::RelayWarning(_) => {}
            }
        }
    }
}
