//! Finding and reaching the peer: same host, LAN discovery, or the relay; then the secure handshake.
//!
//! Direct paths come first; the relay is the fallback (or the only path with `--force-relay`). Whatever the
//! path, the PAKE decides who the peer is: a path only proposes a connection.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_channel::blocking;
use ferry_channel::{Auth, ChannelError, Config, Established, Handshake, Role};
use ferry_rendezvous::local::{Announcement, LocalRegistry};
use ferry_rendezvous::mdns;
use ferry_rendezvous::{Code, NameplateHash};

use crate::failure::PeerNotFound;
use crate::ui::Ui;

/// How long a handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a receiver looks for its sender on this host when there is no other way to find it.
const FIND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a receiver looks on this host before trying other paths.
const FIND_BRIEFLY: Duration = Duration::from_millis(500);
/// How long one mDNS browse listens for the sender.
const BROWSE_TIMEOUT: Duration = Duration::from_secs(2);
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

fn handshake(
    stream: TcpStream,
    role: Role,
    code: &Code,
) -> Result<(TcpStream, Established), ChannelError> {
    handshake_with(stream, role, code.password(), HANDSHAKE_TIMEOUT)
}

/// The handshake with any PAKE password (the code, or a one-time secret for a path upgrade).
pub fn handshake_with(
    mut stream: TcpStream,
    role: Role,
    password: Vec<u8>,
    timeout: Duration,
) -> Result<(TcpStream, Established), ChannelError> {
    stream.set_nodelay(true).ok();
    stream.set_read_timeout(Some(timeout))?;
    let hs = Handshake::new(role, Config::ferry(), Auth::Code(password));
    let est = blocking::handshake(&mut stream, hs)?;
    stream.set_read_timeout(None)?;
    Ok((stream, est))
}

/// A connection offered to the sender, from its listener or from the relay.
enum Offered {
    Stream(TcpStream, &'static str, String),
    RelayFailed(ferry_relay::RelayError),
}

/// What the sender keeps alive while it waits: its announcement and listener.
pub struct SenderRendezvous {
    rx: mpsc::Receiver<Offered>,
    _announcement: Option<Announcement>,
    _advertisement: Option<mdns::Advertisement>,
    /// Where the sender listens, if it does.
    pub listen: Option<SocketAddr>,
    explicit_listen: bool,
    has_direct: bool,
}

impl SenderRendezvous {
    /// Starts listening (unless `--force-relay`), announces on this host, and registers at the relay.
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
            announcement = Some(registry.announce(&code.nameplate_hash(), loopback).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    anyhow::anyhow!(
                        "nameplate {} is in use by another ferry send on this host; choose another code",
                        code.nameplate()
                    )
                } else {
                    anyhow::Error::new(e).context("cannot announce on this host")
                }
            })?);
            if !opts.no_discovery {
                advertisement = Some(mdns::advertise(&code.nameplate_hash(), bound.port())?);
            }
            local = Some(bound);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(stream) = conn else { continue };
                    let peer = stream
                        .peer_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default();
                    if tx.send(Offered::Stream(stream, "direct", peer)).is_err() {
                        return;
                    }
                }
            });
        }
        if let Some(relay) = opts.relay.clone() {
            let hash = code.nameplate_hash().0;
            std::thread::spawn(move || {
                let offered = match ferry_relay::connect(
                    relay.as_str(),
                    ferry_relay::Role::Sender,
                    hash,
                    RELAY_WAIT,
                ) {
                    Ok(stream) => Offered::Stream(stream, "relay", relay),
                    Err(e) => Offered::RelayFailed(e),
                };
                let _ = tx.send(offered);
            });
        }
        Ok(SenderRendezvous {
            rx,
            _announcement: announcement,
            _advertisement: advertisement,
            listen: local,
            explicit_listen: listen.is_some(),
            has_direct: local.is_some(),
        })
    }

    /// Waits for the receiver: the first connection that completes the PAKE. A wrong code ends the send (one
    /// guess per code); connections that do not speak ferry are dropped and waiting goes on.
    pub fn accept(&self, code: &Code, ui: &Ui) -> anyhow::Result<Connected> {
        loop {
            let offered = self
                .rx
                .recv()
                .map_err(|_| PeerNotFound("no path to the receiver is left".to_string()))?;
            match offered {
                Offered::RelayFailed(e) => {
                    if !self.has_direct {
                        return Err(e.into());
                    }
                    ui.warn(&format!(
                        "relay path failed: {e}; still waiting for a direct connection"
                    ));
                }
                Offered::Stream(stream, path, peer) => {
                    match handshake(stream, Role::Responder, code) {
                        Ok((stream, established)) => {
                            return Ok(Connected {
                                stream,
                                established,
                                path,
                                peer,
                            })
                        }
                        Err(ChannelError::WrongCode) => return Err(ChannelError::WrongCode.into()),
                        Err(e) if path == "relay" => {
                            // The relay pairing was spent on a peer that failed; no second relay attempt.
                            ui.warn(&format!("dropped the relay connection: {e}"));
                            if !self.has_direct {
                                return Err(e.into());
                            }
                        }
                        Err(e) => ui.warn(&format!("dropped a connection from {peer}: {e}")),
                    }
                }
            }
        }
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
        crate::netif::interface_addresses()
            .into_iter()
            .filter(|ip| ip.is_ipv4() == listen.is_ipv4() || listen.is_ipv6())
            .map(|ip| SocketAddr::new(ip, listen.port()))
            .collect()
    }

    /// The next connection made to the listener since the relay path won, if one came within `wait`.
    pub fn next_direct(&self, wait: Duration) -> Option<TcpStream> {
        match self.rx.recv_timeout(wait) {
            Ok(Offered::Stream(stream, "direct", _)) => Some(stream),
            _ => None,
        }
    }
}

/// Finds the sender of `code` on this host, waiting up to `wait` for it to appear.
fn find_local(hash: &NameplateHash, wait: Duration) -> anyhow::Result<Option<SocketAddr>> {
    let registry = LocalRegistry::open_default()?;
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(addr) = registry.lookup(hash)? {
            return Ok(Some(addr));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Where the receiver may find the sender directly: `--peer`, this host, then the LAN (mDNS). Addresses in
/// `tried` already failed and are not proposed again.
fn direct_candidates(
    code: &Code,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    tried: &HashSet<SocketAddr>,
    deadline: Instant,
) -> anyhow::Result<Vec<(SocketAddr, &'static str)>> {
    if let Some(addr) = peer {
        return Ok(vec![(addr, "direct")]);
    }
    if opts.force_relay {
        return Ok(Vec::new());
    }
    let hash = code.nameplate_hash();
    loop {
        let fallback = opts.relay.is_some() || !opts.no_discovery;
        let wait = if fallback { FIND_BRIEFLY } else { FIND_TIMEOUT };
        if let Some(addr) = find_local(&hash, wait)?.filter(|a| !tried.contains(a)) {
            return Ok(vec![(addr, "same-host")]);
        }
        if !opts.no_discovery {
            // A failed browse (no multicast here) is no error: other paths remain.
            let found: Vec<_> = mdns::browse(&hash, BROWSE_TIMEOUT)
                .unwrap_or_default()
                .into_iter()
                .filter(|a| !tried.contains(a))
                .collect();
            if !found.is_empty() {
                return Ok(found.into_iter().map(|a| (a, "lan")).collect());
            }
        }
        if opts.relay.is_some() || Instant::now() >= deadline {
            return Ok(Vec::new());
        }
    }
}

/// The receiver's side: `--peer`, then this host, then the LAN, then the relay.
pub fn receiver_connect(
    code: &Code,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    ui: &Ui,
) -> anyhow::Result<Connected> {
    if opts.force_relay && opts.relay.is_none() {
        anyhow::bail!(
            "--force-relay needs a relay: give --relay HOST:PORT, FERRY_RELAY or `relay` in the config file"
        );
    }
    let deadline = Instant::now() + FIND_TIMEOUT;
    let mut tried = HashSet::new();
    let mut last_error = None;
    loop {
        let candidates = direct_candidates(code, opts, peer, &tried, deadline)?;
        if candidates.is_empty() {
            break;
        }
        for (addr, path) in candidates {
            tried.insert(addr);
            let stream = match TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT) {
                Ok(s) => s,
                Err(e) => {
                    ui.warn(&format!("cannot reach {addr}: {e}"));
                    continue;
                }
            };
            match handshake(stream, Role::Initiator, code) {
                Ok((stream, established)) => {
                    return Ok(Connected {
                        stream,
                        established,
                        path,
                        peer: addr.to_string(),
                    })
                }
                // This host's registry is private to the user: a failed PAKE there means the wrong code. A
                // LAN announcement may be a spoofer's, whose failed PAKE must not stop us from looking on.
                Err(e) if path != "lan" && opts.relay.is_none() => return Err(e.into()),
                Err(ChannelError::WrongCode) if path != "lan" => {
                    return Err(ChannelError::WrongCode.into())
                }
                Err(e) => {
                    ui.warn(&format!("{path} path to {addr} failed: {e}"));
                    last_error = Some(e);
                }
            }
        }
        if peer.is_some() || opts.relay.is_some() || Instant::now() >= deadline {
            break;
        }
    }
    let Some(relay) = &opts.relay else {
        if let Some(e) = last_error {
            return Err(e.into());
        }
        return Err(PeerNotFound(format!(
            "no sender for nameplate {} found (is `ferry send` running? on another machine give --relay or --peer ADDR)",
            code.nameplate()
        ))
        .into());
    };
    let stream = ferry_relay::connect(
        relay.as_str(),
        ferry_relay::Role::Receiver,
        code.nameplate_hash().0,
        RELAY_WAIT,
    )?;
    let (stream, established) = handshake(stream, Role::Initiator, code)?;
    Ok(Connected {
        stream,
        established,
        path: "relay",
        peer: relay.clone(),
    })
}
