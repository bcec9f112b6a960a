//! Finding and reaching the peer: same host, LAN discovery, or the relay; then the secure handshake.
//!
//! Direct paths come first; the relay is the fallback (or the only path with `--force-relay`). Whatever the
//! path, the PAKE decides who the peer is: a path only proposes a connection.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferry_channel::blocking;
use ferry_channel::{
    Auth, ChannelError, CodeAttempts, Config, Established, Handshake, Role, MAX_FAILED_ATTEMPTS,
};
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::{mdns, netif};
use ferry_rendezvous::{Code, NameplateHash};

use crate::failure::{NotARelay, PeerNotFound};
use crate::interrupt::{keep_until_exit, KeptUntilExit};
use crate::ui::Ui;

/// How long one handshake may take in all, whatever the peer does (each read and write gets only what is left).
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(15);
/// How long the receiver waits for a TCP connection to a candidate.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes the sender runs at once; a connection beyond it is closed at once.
const MAX_HANDSHAKES: usize = 16;
/// Most handshakes at once from one source address, so one host cannot take every slot.
const MAX_HANDSHAKES_PER_SOURCE: usize = 4;
/// How long a receiver looks on this host before asking the relay.
const FIND_BRIEFLY: Duration = Duration::from_millis(500);
/// The first pause between two rounds over every path; each pause doubles, up to [`RETRY_MOST`].
const RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest pause between two rounds over every path.
const RETRY_MOST: Duration = Duration::from_secs(2);
/// The longest step between two reads of this host's registry during a pause (a local file: cheap).
const REGISTRY_POLL_MOST: Duration = Duration::from_millis(5);
/// Least time given to one TCP connect, even when less of the wait is left.
const CONNECT_LEAST: Duration = Duration::from_secs(3);
/// Least time one wait at the relay lasts, even with `--wait 0`: a round trip and a pairing.
const RELAY_LEAST: Duration = Duration::from_secs(5);
/// How long one mDNS browse listens for the sender.
const BROWSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most LAN (mDNS) candidates one receive dials.
const MAX_LAN_CANDIDATES: usize = 8;
/// How long either side waits at the relay for the other.
const RELAY_WAIT: Duration = Duration::from_secs(600);

/// How to look for the peer.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Relay `HOST:PORT`, if any.
    pub relay: Option<String>,
    /// Use only the relay.
    pub force_relay: bool,
    /// Keep multicast off.
    pub no_discovery: bool,
}

/// An authenticated channel and how it was reached.
pub struct Connected {
    /// The transport.
    pub stream: TcpStream,
    /// The established channel.
    pub established: Established,
    /// `same-host`, `lan`, `direct` or `relay`.
    pub path: &'static str,
    /// The address connected to (the relay's for `relay`).
    pub peer: String,
}

/// The handshake with any PAKE password (the code, or a one-time secret for a path upgrade), finished by
/// `deadline` or failed, and charged to `attempts` when the password is the code.
pub fn handshake_with(
    mut stream: TcpStream,
    role: Role,
    password: Vec<u8>,
    attempts: Option<&Arc<CodeAttempts>>,
    deadline: Instant,
) -> Result<(TcpStream, Established), ChannelError> {
    stream.set_nodelay(true).ok();
    let mut hs = Handshake::new(role, Config::ferry(), Auth::Code(password));
    if let Some(attempts) = attempts {
        hs = hs.with_attempts(Arc::clone(attempts));
    }
    let est = blocking::handshake_until(&mut stream, hs, deadline)?;
    Ok((stream, est))
}

/// What a handshake is for: the code (the first connection) or a path upgrade's one-time secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Authenticated by the code.
    Code,
    /// Authenticated by a path upgrade's secret.
    Upgrade,
}

/// A handshake that ended, one way or the other.
pub struct Finished {
    id: u64,
    purpose: Purpose,
    path: &'static str,
    peer: String,
    result: Result<(TcpStream, Established), ChannelError>,
}

/// What reaches the sender's waiting loop: a connection from its listener or the relay, or a handshake's end.
enum Event {
    Offered(TcpStream, &'static str, String),
    RelayFailed(anyhow::Error),
    Finished(Box<Finished>),
}

/// Handshakes running side by side, each on its own thread and each bounded by [`HANDSHAKE_DEADLINE`], so one
/// slow or hostile connection never holds up the real peer.
struct Handshakes {
    tx: mpsc::Sender<Event>,
    /// Running handshakes: their source address and a handle to close them.
    running: HashMap<u64, (Option<IpAddr>, TcpStream)>,
    next_id: u64,
}

impl Handshakes {
    /// Starts a handshake on its own thread; refuses (closes) the connection when too many run already, in
    /// all or from its source address.
    fn start(
        &mut self,
        stream: TcpStream,
        path: &'static str,
        peer: String,
        purpose: Purpose,
        password: Vec<u8>,
        attempts: Option<Arc<CodeAttempts>>,
    ) -> Result<(), String> {
        let source = stream.peer_addr().ok().map(|a| a.ip().to_canonical());
        let from_source = self
            .running
            .values()
            .filter(|(s, _)| source.is_some() && *s == source)
            .count();
        if self.running.len() >= MAX_HANDSHAKES {
            return Err(format!("{MAX_HANDSHAKES} handshakes are running already"));
        }
        // The relay's connections all come from the relay: only direct ones are limited per source.
        if path != "relay" && from_source >= MAX_HANDSHAKES_PER_SOURCE {
            return Err(format!(
                "{MAX_HANDSHAKES_PER_SOURCE} handshakes from that address are running already"
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Ok(handle) = stream.try_clone() {
            self.running.insert(id, (source, handle));
        }
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + HANDSHAKE_DEADLINE;
            let role = Role::Responder;
            let result = handshake_with(stream, role, password, attempts.as_ref(), deadline);
            let _ = tx.send(Event::Finished(Box::new(Finished {
                id,
                purpose,
                path,
                peer,
                result,
            })));
        });
        Ok(())
    }

    fn finished(&mut self, id: u64) {
        self.running.remove(&id);
    }

    /// Ends every running handshake: their threads fail at once and report, and their connections close.
    fn stop_all(&mut self) {
        for (_, (_, stream)) in self.running.drain() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// What the sender keeps alive while it waits: its announcement and listener.
pub struct SenderRendezvous {
    rx: mpsc::Receiver<Event>,
    handshakes: Handshakes,
    attempts: Arc<CodeAttempts>,
    /// The same-host announcement and the mDNS advertisement, withdrawn also when a signal ends the
    /// process.
    _announcement: Option<KeptUntilExit>,
    _advertisement: Option<KeptUntilExit>,
    /// Where the sender listens, if it does.
    pub listen: Option<SocketAddr>,
    explicit_listen: bool,
    has_direct: bool,
}

impl SenderRendezvous {
    /// Starts listening (unless `--force-relay`), announces on this host, and registers at the relay.
    ///
    /// Where it listens: `--listen ADDR` when given (every source accepted: the user chose the address);
    /// otherwise loopback with `--no-discovery`, and with discovery every interface, accepting connections only
    /// from this host and from directly attached networks (where mDNS reaches), never from a routed address.
    pub fn start(
        code: &Code,
        opts: &PeerOptions,
        listen: Option<SocketAddr>,
    ) -> anyhow::Result<Self> {
        if opts.force_relay && opts.relay.is_none() {
            anyhow::bail!("--force-relay needs a relay: give --relay HOST:PORT, FERRY_RELAY or `relay` in the config file");
        }
        let (tx, rx) = mpsc::channel();
        let (mut announcement, mut advertisement, mut local) = (None, None, None);
        if !opts.force_relay {
            // With discovery the receiver may be on the LAN, so listen on every interface.
            let any = if opts.no_discovery {
                [127, 0, 0, 1]
            } else {
                [0, 0, 0, 0]
            };
            let addr = listen.unwrap_or_else(|| SocketAddr::from((any, 0)));
            let listener = TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
            let bound = listener.local_addr()?;
            let loopback = SocketAddr::from(([127, 0, 0, 1], bound.port()));
            let registry = LocalRegistry::open_default()?;
            let announced = registry.announce(&code.nameplate_hash(), loopback).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    anyhow::anyhow!(
                        "nameplate {} is in use by another ferry send on this host; choose another code",
                        code.nameplate()
                    )
                } else {
                    anyhow::Error::new(e).context("cannot announce on this host")
                }
            })?;
            announcement = Some(keep_until_exit(announced));
            if !opts.no_discovery {
                let advertised = mdns::advertise(&code.nameplate_hash(), bound.port())?;
                advertisement = Some(keep_until_exit(advertised));
            }
            local = Some(bound);
            let only_on_link = listen.is_none();
            let tx = tx.clone();
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
                        .send(Event::Offered(stream, "direct", peer.to_string()))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
        if let Some(relay) = opts.relay.clone() {
            let hash = code.nameplate_hash().0;
            let tx = tx.clone();
            std::thread::spawn(move || {
                let offered = match ferry_relay::connect(
                    relay.as_str(),
                    ferry_relay::Role::Sender,
                    hash,
                    RELAY_WAIT,
                ) {
                    Ok(stream) => Event::Offered(stream, "relay", relay),
                    Err(e) => Event::RelayFailed(relay_error(&relay, e)),
                };
                let _ = tx.send(offered);
            });
        }
        Ok(SenderRendezvous {
            rx,
            handshakes: Handshakes {
                tx,
                running: HashMap::new(),
                next_id: 0,
            },
            attempts: CodeAttempts::one_guess(MAX_FAILED_ATTEMPTS),
            _announcement: announcement,
            _advertisement: advertisement,
            listen: local,
            explicit_listen: listen.is_some(),
            has_direct: local.is_some(),
        })
    }

    /// Waits for the receiver: the first connection that completes the PAKE. Handshakes run side by side, each
    /// with its own deadline. One wrong confirmation ends the send (one guess per code), and so do
    /// [`MAX_FAILED_ATTEMPTS`] attempts that reached the PAKE and did not finish; connections that fail
    /// before the PAKE (not ferry, too slow) are dropped and waiting goes on.
    pub fn accept(&mut self, code: &Code, ui: &Ui) -> anyhow::Result<Connected> {
        loop {
            let event = self
                .rx
                .recv()
                .map_err(|_| PeerNotFound("no path to the receiver is left".to_string()))?;
            match event {
                Event::RelayFailed(e) => {
                    if !self.has_direct {
                        return Err(e);
                    }
                    ui.warn(&format!(
                        "relay path failed: {e:#}; still waiting for a direct connection"
                    ));
                }
                Event::Offered(stream, path, peer) => {
                    let started = self.handshakes.start(
                        stream,
                        path,
                        peer.clone(),
                        Purpose::Code,
                        code.password(),
                        Some(Arc::clone(&self.attempts)),
                    );
                    if let Err(why) = started {
                        ui.warn(&format!("refused a connection from {peer}: {why}"));
                    }
                }
                Event::Finished(f) => {
                    self.handshakes.finished(f.id);
                    if f.purpose != Purpose::Code {
                        continue;
                    }
                    match f.result {
                        Ok((stream, established)) => {
                            self.handshakes.stop_all();
                            return Ok(Connected {
                                stream,
                                established,
                                path: f.path,
                                peer: f.peer,
                            });
                        }
                        Err(e) if self.attempts.is_dead() => {
                            self.handshakes.stop_all();
                            return Err(self.spent(e));
                        }
                        Err(e) if f.path == "relay" => {
                            // The relay pairing was spent on a peer that failed; no second relay attempt.
                            ui.warn(&format!("dropped the relay connection: {e}"));
                            if !self.has_direct {
                                return Err(e.into());
                            }
                        }
                        Err(e) => ui.warn(&format!(
                            "dropped a connection from {}: {e}{}",
                            f.peer,
                            self.attempts_note()
                        )),
                    }
                }
            }
        }
    }

    /// How many attempts on the code failed so far, when any did.
    fn attempts_note(&self) -> String {
        match self.attempts.failed() {
            0 => String::new(),
            n => format!(
                " ({n} of {} failed attempts on this code)",
                self.attempts.limit()
            ),
        }
    }

    /// The error that ends a send whose code is dead.
    fn spent(&self, last: ChannelError) -> anyhow::Error {
        let why = if matches!(last, ChannelError::WrongCode) && self.attempts.failed() == 1 {
            "a receiver gave the wrong code".to_string()
        } else {
            format!(
                "{} attempts to connect with this code failed (last: {last})",
                self.attempts.failed()
            )
        };
        anyhow::Error::new(ChannelError::WrongCode).context(format!(
            "{why}; the code is spent (one guess per code), start a new `ferry send`"
        ))
    }
}

impl SenderRendezvous {
    /// Addresses where a receiver elsewhere could reach this sender's listener: the listen address when it
    /// is a specific one, else every non-loopback interface address with the listener's port.
    pub fn direct_candidates(&self) -> Vec<SocketAddr> {
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

    /// During a path upgrade: runs an upgrade handshake (password `secret`) on each new direct connection, side
    /// by side, and returns the first that completes within `wait`.
    pub fn next_upgraded(
        &mut self,
        secret: &[u8],
        wait: Duration,
        ui: &Ui,
    ) -> Option<(TcpStream, Established)> {
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let event = self.rx.recv_timeout(left).ok()?;
            match event {
                Event::Offered(stream, "direct", peer) => {
                    let started = self.handshakes.start(
                        stream,
                        "direct",
                        peer.clone(),
                        Purpose::Upgrade,
                        secret.to_vec(),
                        None,
                    );
                    if let Err(why) = started {
                        ui.warn(&format!("refused a connection from {peer}: {why}"));
                    }
                }
                Event::Finished(f) => {
                    self.handshakes.finished(f.id);
                    match (f.purpose, f.result) {
                        (Purpose::Upgrade, Ok(done)) => {
                            self.handshakes.stop_all();
                            return Some(done);
                        }
                        (Purpose::Upgrade, Err(e)) => ui.warn(&format!(
                            "a direct connection from {} failed the path upgrade: {e}",
                            f.peer
                        )),
                        // A late handshake on the code, after the relay path won: nothing to do.
                        (Purpose::Code, _) => {}
                    }
                }
                Event::Offered(..) | Event::RelayFailed(_) => {}
            }
        }
    }
}

/// A relay client's error, in words for the user: an answer that is no relay status means the address
/// is something else, most likely a `ferry send --listen` given as a relay.
fn relay_error(relay: &str, e: ferry_relay::RelayError) -> anyhow::Error {
    match e {
        ferry_relay::RelayError::UnknownStatus(_) => NotARelay(format!(
            "{relay} is not a ferry relay (its answer is not a relay's); to connect to a `ferry send --listen` \
             address directly, give it with --peer"
        ))
        .into(),
        e => e.into(),
    }
}

/// The relay's answer to a receiver waiting there: a paired stream, or why not.
type RelayAnswer = Result<TcpStream, ferry_relay::RelayError>;

/// Waits at `relay` for the sender of `hash`, up to `wait`, on its own thread: direct paths are retried
/// meanwhile.
fn wait_at_relay(relay: &str, hash: NameplateHash, wait: Duration) -> mpsc::Receiver<RelayAnswer> {
    let (tx, rx) = mpsc::channel();
    let relay = relay.to_string();
    std::thread::spawn(move || {
        let answer =
            ferry_relay::connect(relay.as_str(), ferry_relay::Role::Receiver, hash.0, wait);
        let _ = tx.send(answer);
    });
    rx
}

/// Where the receiver may find the sender directly, looked at once: `--peer`, this host (`registry`),
/// then the LAN (mDNS). Addresses in `tried` already failed a handshake and are not proposed again.
fn direct_candidates(
    code: &Code,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    registry: Option<&LocalRegistry>,
    tried: &HashSet<SocketAddr>,
) -> anyhow::Result<Vec<(SocketAddr, &'static str)>> {
    if let Some(addr) = peer {
        let fresh = !tried.contains(&addr);
        return Ok(fresh.then_some((addr, "direct")).into_iter().collect());
    }
    let Some(registry) = registry else {
        return Ok(Vec::new());
    };
    let hash = code.nameplate_hash();
    if let Some(addr) = registry.lookup(&hash)?.filter(|a| !tried.contains(a)) {
        return Ok(vec![(addr, "same-host")]);
    }
    if !opts.no_discovery && tried.len() < MAX_LAN_CANDIDATES {
        // A failed browse (no multicast here) is no error: other paths remain. The browse returns only
        // addresses on a directly attached network: an announcement naming a routed one is a spoofer's.
        let found: Vec<_> = mdns::browse(&hash, BROWSE_TIMEOUT)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| !tried.contains(a))
            .take(MAX_LAN_CANDIDATES - tried.len())
            .collect();
        return Ok(found.into_iter().map(|a| (a, "lan")).collect());
    }
    Ok(Vec::new())
}

/// The pause between two rounds over every path, until `until` (`None`: until the relay answers). It
/// ends early when the relay answers (returned) or when a sender with an address not dialled yet
/// (`fresh`) appears in this host's `registry` (a local file, read every few milliseconds, so that a
/// sender started a moment later is met at once; an address that was dialled waits for the next round).
fn pause(
    until: Option<Instant>,
    relay: Option<&mpsc::Receiver<RelayAnswer>>,
    registry: Option<&LocalRegistry>,
    hash: &NameplateHash,
    fresh: impl Fn(&SocketAddr) -> bool,
) -> anyhow::Result<Option<RelayAnswer>> {
    let mut step = Duration::from_millis(2);
    loop {
        if let Some(rx) = relay {
            match rx.try_recv() {
                Ok(answer) => return Ok(Some(answer)),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Ok(Some(Err(ferry_relay::RelayError::Closed)))
                }
            }
        }
        if let Some(registry) = registry {
            if registry.lookup(hash)?.is_some_and(|a| fresh(&a)) {
                return Ok(None);
            }
        }
        let now = Instant::now();
        if until.is_some_and(|u| now >= u) {
            return Ok(None);
        }
        let step_now = until.map_or(step, |u| step.min(u - now));
        std::thread::sleep(step_now);
        step = (step * 2).min(REGISTRY_POLL_MOST);
    }
}

/// The receiver's side: `--peer`, then this host, then the LAN, then the relay, round after round until
/// one answers or `wait` is over (`0`: one round). A connection that never reached the PAKE (nobody
/// listening yet, a timeout) costs the code no guess, so waiting spends none of the budget; a round over
/// the network starts at most every [`RETRY_MOST`] (sooner at first), and the relay is waited at once, on
/// its own thread.
pub fn receiver_connect(
    code: &Code,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    wait: Duration,
    ui: &mut Ui,
) -> anyhow::Result<Connected> {
    if opts.force_relay && opts.relay.is_none() {
        anyhow::bail!(
            "--force-relay needs a relay: give --relay HOST:PORT, FERRY_RELAY or `relay` in the config file"
        );
    }
    let started = Instant::now();
    let deadline = started + wait;
    let hash = code.nameplate_hash();
    let registry = match peer.is_none() && !opts.force_relay {
        true => Some(LocalRegistry::open_default()?),
        false => None,
    };
    let mut tried = HashSet::new();
    let mut unreachable = BTreeMap::new();
    let mut last_error = None;
    // Each attempt that reaches the PAKE hands the peer our confirmation, one guess it can check: a receive
    // gives at most MAX_FAILED_ATTEMPTS of them, whatever the LAN announces.
    let attempts = CodeAttempts::at_most(MAX_FAILED_ATTEMPTS);
    let handshake = |stream| {
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        handshake_with(
            stream,
            Role::Initiator,
            code.password(),
            Some(&attempts),
            deadline,
        )
    };
    let mut relay_answers = None;
    let mut relay_waited = false;
    let mut retry = RETRY_FIRST;
    loop {
        for (addr, path) in direct_candidates(code, opts, peer, registry.as_ref(), &tried)? {
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = CONNECT_TIMEOUT.min(left.max(CONNECT_LEAST));
            let stream = match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => s,
                Err(e) => {
                    // Maybe not listening yet: dialled again next round; said once.
                    if unreachable.insert(addr, e.to_string()).is_none() {
                        ui.warn(&format!("cannot reach {addr}: {e}; trying again"));
                    }
                    continue;
                }
            };
            tried.insert(addr);
            match handshake(stream) {
                Ok((stream, established)) => {
                    return Ok(Connected {
                        stream,
                        established,
                        path,
                        peer: addr.to_string(),
                    })
                }
                // This host's registry is private to the user: a failed PAKE there means the wrong code. A
                // LAN announcement may be a spoofer's, whose failed PAKE must not stop us from looking on,
                // up to the limit of failed attempts.
                Err(e) if path != "lan" && opts.relay.is_none() => return Err(e.into()),
                Err(ChannelError::WrongCode) if path != "lan" => {
                    return Err(ChannelError::WrongCode.into())
                }
                Err(e) if attempts.is_dead() => {
                    return Err(anyhow::Error::new(ChannelError::WrongCode).context(format!(
                        "{} attempts with this code failed (last: {path} path to {addr}: {e}); \
                         giving no more guesses away, check the code",
                        attempts.failed()
                    )))
                }
                Err(e) => {
                    ui.warn(&format!("{path} path to {addr} failed: {e}"));
                    last_error = Some(e);
                }
            }
        }
        // Direct paths come first: the relay is asked once they had a moment, and then waited at for the
        // rest of `wait` (at least RELAY_LEAST) while they are retried.
        if let (Some(relay), None) = (&opts.relay, &relay_answers) {
            if opts.force_relay || started.elapsed() >= FIND_BRIEFLY {
                let left = deadline.saturating_duration_since(Instant::now());
                relay_answers = Some(wait_at_relay(relay, hash, left.max(RELAY_LEAST)));
            }
        }
        let now = Instant::now();
        let until = match (now < deadline, &relay_answers) {
            (true, _) => Some(now + retry.min(deadline - now)),
            // Time is up, but the relay is still being waited at: its answer ends the wait.
            (false, Some(_)) => None,
            // Time is up before the relay was asked (`--wait 0`): it is asked after its moment.
            (false, None) if opts.relay.is_some() => Some(started + FIND_BRIEFLY),
            (false, None) => break,
        };
        ui.waiting("Waiting for the sender...");
        let fresh = |a: &SocketAddr| !tried.contains(a) && !unreachable.contains_key(a);
        match pause(
            until,
            relay_answers.as_ref(),
            registry.as_ref(),
            &hash,
            fresh,
        )? {
            None => {}
            Some(Ok(stream)) => {
                let relay = opts.relay.clone().unwrap_or_default();
                let (stream, established) = handshake(stream)?;
                return Ok(Connected {
                    stream,
                    established,
                    path: "relay",
                    peer: relay,
                });
            }
            Some(Err(ferry_relay::RelayError::TimedOut)) => {
                relay_waited = true;
                break;
            }
            Some(Err(e)) => return Err(relay_error(opts.relay.as_deref().unwrap_or_default(), e)),
        }
        retry = (retry * 2).min(RETRY_MOST);
    }
    if let Some(e) = last_error {
        return Err(e.into());
    }
    Err(not_found(code, opts, peer, wait, &unreachable, relay_waited).into())
}

/// The end of a wait with no sender: what was tried, and what to do.
fn not_found(
    code: &Code,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    wait: Duration,
    unreachable: &BTreeMap<SocketAddr, String>,
    relay_waited: bool,
) -> PeerNotFound {
    let mut tried = Vec::new();
    if let Some(addr) = peer {
        tried.push(format!("--peer {addr}"));
    } else if !opts.force_relay {
        tried.push("this host".to_string());
        if !opts.no_discovery {
            tried.push("the LAN (mDNS)".to_string());
        }
    }
    if let Some(relay) = &opts.relay {
        let how = if relay_waited {
            " (no sender came)"
        } else {
            ""
        };
        tried.push(format!("the relay {relay}{how}"));
    }
    let failures: String = unreachable
        .iter()
        .map(|(addr, e)| format!("; {addr}: {e}"))
        .collect();
    let when = match wait.is_zero() {
        true => "at once (--wait 0)".to_string(),
        false => format!("within {}", exact_duration(wait)),
    };
    PeerNotFound(format!(
        "no sender for nameplate {} found {when} (tried {}{failures}); is `ferry send` running? \
         on another machine give --relay or --peer ADDR; --wait DURATION waits longer",
        code.nameplate(),
        tried.join(", "),
    ))
}

/// `wait` as `--wait` takes it, exactly: `90s`, `5m`, `1h`, `250ms`.
fn exact_duration(wait: Duration) -> String {
    let secs = wait.as_secs();
    match (secs, wait.subsec_millis()) {
        (0, ms) => format!("{ms}ms"),
        (s, 0) if s % 3600 == 0 => format!("{}h", s / 3600),
        (s, 0) if s % 60 == 0 => format!("{}m", s / 60),
        (s, 0) => format!("{s}s"),
        _ => format!("{}ms", wait.as_millis()),
    }
}

#[cfg(test)]
mod tests {
    use super::exact_duration;
    use std::time::Duration;

    #[test]
    fn waits_are_shown_as_given() {
        assert_eq!(exact_duration(Duration::from_secs(90)), "90s");
        assert_eq!(exact_duration(Duration::from_secs(300)), "5m");
        assert_eq!(exact_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(exact_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(exact_duration(Duration::from_millis(1500)), "1500ms");
    }
}
