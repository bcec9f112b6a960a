//! The waiting side of a long-running server (`ferry share`): reachable under a set of hashes that changes
//! (every paired peer's meeting hash, renewed when the time window turns), handing over one authenticated
//! peer after another.
//!
//! Unlike [`Rendezvous`](crate::Rendezvous), which waits for one peer and stops, a [`Standing`] keeps its
//! listener, its announcements (this host's registry, mDNS) and its registration at the relay (a relay
//! listener, registered again with backoff when the relay goes away) for as long as it lives. Who the peer
//! is, is the host's to decide: the handshakes accept any identity (the host's [`MeetingAuth`] says how) and
//! report it in [`Established::peer_identity`](ferry_channel::Established), so the host checks it against its
//! peer list before it reads a single request.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_relay::{Listener, RelayError};
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::{mdns, NameplateHash};

use crate::error::{relay_error, taken_at_relay};
use crate::handshake::{Event, Handshakes, Purpose};
use crate::rendezvous::listen_for_peers;
use crate::{Connected, Events, MeetingAuth, PathKind, PeerOptions, SessionError};

/// The hashes to be reachable under now: asked again every [`RENEW_EVERY`] (the window turns, peers are
/// paired and removed while a share runs).
pub type HashSource = Arc<dyn Fn() -> Vec<NameplateHash> + Send + Sync>;

/// How often the hashes are asked for again. A window lasts an hour and a looking side also tries the
/// previous window, so a turn noticed this late costs nobody a meeting.
const RENEW_EVERY: Duration = Duration::from_secs(20);
/// How long one registration at the relay (and each accept connection, each change of hashes) may take.
const RELAY_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause before registering at the relay again; it doubles up to [`RELAY_BACKOFF_MOST`].
const RELAY_BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest pause between two registrations at the relay.
const RELAY_BACKOFF_MOST: Duration = Duration::from_secs(30);
/// The shortest pause after a meeting was taken at the relay: whoever holds it stays a while.
const RELAY_BACKOFF_TAKEN: Duration = Duration::from_secs(5);

/// A long-running waiting side. Dropping it withdraws every announcement and the relay registration.
pub struct Standing {
    rx: mpsc::Receiver<Event>,
    handshakes: Handshakes,
    auth: MeetingAuth,
    source: HashSource,
    hashes: Vec<NameplateHash>,
    /// This host's registry and the loopback address announced in it, unless `--force-relay`.
    registry: Option<(LocalRegistry, SocketAddr)>,
    /// The port advertised by mDNS, when discovery is on.
    mdns_port: Option<u16>,
    /// The current announcements (registry entries, mDNS advertisements), as [`Events::keep_until_exit`]
    /// keeps them.
    announced: Vec<Box<dyn Any + Send>>,
    relay: Option<Arc<RelaySeat>>,
    renew_every: Duration,
    renew_at: Instant,
    /// Where it listens, unless `--force-relay`.
    pub listen: Option<SocketAddr>,
}

/// What the relay thread and the [`Standing`] share.
struct RelaySeat {
    /// Whether direct connections are served too (not `--force-relay`), for the warnings.
    direct: bool,
    hashes: Mutex<Vec<[u8; 32]>>,
    listener: Mutex<Option<Arc<Listener>>>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Standing {
    /// Starts listening (unless `--force-relay`; where, as [`Rendezvous::start`](crate::Rendezvous::start)
    /// says), announces the hashes of `source` on this host and the LAN, and registers them at the relay.
    /// Each handshake authenticates with `auth`.
    pub fn start(
        source: HashSource,
        auth: MeetingAuth,
        opts: &PeerOptions,
        listen: Option<SocketAddr>,
        events: &mut dyn Events,
    ) -> Result<Self, SessionError> {
        if opts.force_relay && opts.relay.is_none() {
            return Err(SessionError::NoRelay);
        }
        let (tx, rx) = mpsc::channel();
        let (mut registry, mut mdns_port, mut local) = (None, None, None);
        if !opts.force_relay {
            let bound = listen_for_peers(opts, listen, tx.clone())?;
            registry = Some((
                LocalRegistry::open_default()?,
                SocketAddr::from(([127, 0, 0, 1], bound.port())),
            ));
            if !opts.no_discovery {
                mdns_port = Some(bound.port());
            }
            local = Some(bound);
        }
        let relay = opts.relay.clone().map(|relay| {
            let seat = Arc::new(RelaySeat {
                direct: local.is_some(),
                hashes: Mutex::new(Vec::new()),
                listener: Mutex::new(None),
                stop: AtomicBool::new(false),
            });
            let (seat2, tx) = (Arc::clone(&seat), tx.clone());
            std::thread::spawn(move || stay_at_relay(&relay, &seat2, &tx));
            seat
        });
        let mut standing = Standing {
            handshakes: Handshakes::new(tx),
            rx,
            auth,
            source,
            hashes: Vec::new(),
            registry,
            mdns_port,
            announced: Vec::new(),
            relay,
            renew_every: RENEW_EVERY,
            renew_at: Instant::now(),
            listen: local,
        };
        standing.renew(events);
        Ok(standing)
    }

    /// Asks for the hashes every `every` instead of every 20 s (from the next renewal on).
    pub fn renew_every(&mut self, every: Duration) {
        self.renew_every = every;
        self.renew_at = self.renew_at.min(Instant::now() + every);
    }

    /// The hashes announced now.
    pub fn hashes(&self) -> &[NameplateHash] {
        &self.hashes
    }

    /// Asks for the hashes again and, when they changed, announces the new set everywhere.
    fn renew(&mut self, events: &mut dyn Events) {
        self.renew_at = Instant::now() + self.renew_every;
        let mut hashes = (self.source)();
        hashes.sort_by_key(|h| h.0);
        hashes.dedup();
        if hashes == self.hashes {
            return;
        }
        // The old announcements go first: the registry refuses a hash that is announced already.
        self.announced.clear();
        if let Some((registry, addr)) = &self.registry {
            for hash in &hashes {
                match registry.announce(hash, *addr) {
                    Ok(a) => self.announced.push(events.keep_until_exit(Box::new(a))),
                    Err(e) => events.warn(&format!(
                        "cannot announce a meeting on this host ({e}); this host's peers reach it \
                         through the other paths"
                    )),
                }
            }
        }
        if let Some(port) = self.mdns_port {
            for hash in &hashes {
                match mdns::advertise(hash, port) {
                    Ok(a) => self.announced.push(events.keep_until_exit(Box::new(a))),
                    Err(e) => events.warn(&format!("cannot advertise on the LAN: {e}")),
                }
            }
        }
        if let Some(seat) = &self.relay {
            let mut raw: Vec<[u8; 32]> = hashes.iter().map(|h| h.0).collect();
            if raw.len() > ferry_relay::protocol::MAX_LISTEN_HASHES {
                events.warn(&format!(
                    "{} meetings, more than a relay holds for one listener ({}): the others are reachable \
                     only directly",
                    raw.len(),
                    ferry_relay::protocol::MAX_LISTEN_HASHES
                ));
                raw.truncate(ferry_relay::protocol::MAX_LISTEN_HASHES);
            }
            *lock(&seat.hashes) = raw.clone();
            let listener = lock(&seat.listener).clone();
            if let Some(listener) = listener {
                if let Err(e) = listener.set_hashes(&raw) {
                    // The registration is renewed with the new hashes by the relay thread, which says why
                    // when a meeting is taken.
                    if !matches!(e, RelayError::HashTaken(_)) {
                        events.warn(&format!("cannot renew the meetings at the relay: {e}"));
                    }
                    listener.close();
                }
            }
        }
        self.hashes = hashes;
    }

    /// Waits for the next peer that completes the handshake, on any path; handshakes run side by side (as
    /// many as [`Rendezvous`](crate::Rendezvous) allows). Failed handshakes and relay trouble are reported
    /// to `events` and waiting goes on.
    pub fn accept(&mut self, events: &mut dyn Events) -> Result<Connected, SessionError> {
        loop {
            let now = Instant::now();
            if now >= self.renew_at {
                self.renew(events);
            }
            let left = self.renew_at.saturating_duration_since(Instant::now());
            let event = match self.rx.recv_timeout(left) {
                Ok(e) => e,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(SessionError::PeerNotFound("no path is left".into()))
                }
            };
            match event {
                Event::RelayFailed(e) => events.warn(&crate::with_causes(&e)),
                Event::RelayWarning(warning) => events.warn(&warning),
                Event::Offered(stream, path, peer) => {
                    let started = self.handshakes.start(
                        stream,
                        path,
                        peer.clone(),
                        Purpose::Meeting,
                        self.auth.auth(),
                        None,
                    );
                    if let Err(why) = started {
                        events.warn(&format!("refused a connection from {peer}: {why}"));
                    }
                }
                Event::Finished(f) => {
                    self.handshakes.finished(&f);
                    match f.result {
                        Ok((stream, established)) => {
                            return Ok(Connected {
                                stream,
                                established,
                                path: f.path,
                                peer: f.peer,
                                handshake: Some(f.took),
                            })
                        }
                        Err(ferry_channel::ChannelError::Refused(reason)) => {
                            events.refused(&f.peer, &reason)
                        }
                        Err(e) => {
                            if self.handshakes.worth_a_warning(f.keyed, &f.peer, events) {
                                events.warn(&format!("dropped a connection from {}: {e}", f.peer))
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Drop for Standing {
    fn drop(&mut self) {
        if let Some(seat) = &self.relay {
            seat.stop.store(true, Ordering::Relaxed);
            let listener = lock(&seat.listener).take();
            if let Some(l) = listener {
                l.close();
            }
        }
        self.handshakes.stop_all();
    }
}

/// The relay thread: registers as a listener under the seat's hashes, hands over every client, and
/// registers again (after a pause that doubles, up to [`RELAY_BACKOFF_MOST`]) whenever the registration
/// ends, until the seat is stopped.
fn stay_at_relay(relay: &str, seat: &RelaySeat, tx: &mpsc::Sender<Event>) {
    let mut backoff = RELAY_BACKOFF_FIRST;
    let report = |e: RelayError, what: &str| {
        let e = relay_error(relay, e);
        let e = SessionError::PeerNotFound(format!(
            "relay {relay}: {what}: {}; trying again",
            crate::with_causes(&e)
        ));
        tx.send(Event::RelayFailed(e)).is_ok()
    };
    while !seat.stop.load(Ordering::Relaxed) {
        let hashes = lock(&seat.hashes).clone();
        match Listener::register(relay, &hashes, RELAY_TIMEOUT) {
            Ok(listener) => {
                backoff = RELAY_BACKOFF_FIRST;
                let listener = Arc::new(listener);
                *lock(&seat.listener) = Some(Arc::clone(&listener));
                // The hashes may have changed while registering.
                let now = lock(&seat.hashes).clone();
                if now != hashes && listener.set_hashes(&now).is_err() {
                    listener.close();
                }
                let ended = loop {
                    match listener.accept() {
                        Ok((stream, _hash)) => {
                            let offered =
                                Event::Offered(stream, PathKind::Relay, relay.to_string());
                            if tx.send(offered).is_err() {
                                return;
                            }
                        }
                        Err(e) => break e,
                    }
                };
                lock(&seat.listener).take();
                if seat.stop.load(Ordering::Relaxed) || !report(ended, "the registration ended") {
                    return;
                }
            }
            Err(RelayError::HashTaken(_)) => {
                let direct = seat.direct;
                let warning = taken_at_relay(relay, "one of this share's meetings", direct);
                if tx.send(Event::RelayWarning(warning)).is_err() {
                    return;
                }
                backoff = backoff.max(RELAY_BACKOFF_TAKEN);
            }
            Err(e) => {
                if !report(e, "cannot register") {
                    return;
                }
            }
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !seat.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        backoff = (backoff * 2).min(RELAY_BACKOFF_MOST);
    }
}
