//! Finding and reaching the peer: same host, LAN discovery, or the relay; then the secure handshake.
//!
//! Direct paths come first; the relay is the fallback (or the only path with `--force-relay`). Whatever the
//! path, the PAKE decides who the peer is: a path only proposes a connection.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_channel::blocking;
use ferry_channel::{Auth, ChannelError, Config, Established, Handshake, Role};
use ferry_rendezvous::local::{Announcement, LocalRegistry};
use ferry_rendezvous::{Code, NameplateHash};

use crate::failure::PeerNotFound;
use crate::ui::Ui;

/// How long a handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a receiver looks for its sender on this host when there is no other way to find it.
const FIND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a receiver looks on this host before trying other paths.
const FIND_BRIEFLY: Duration = Duration::from_millis(500);
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
    mut stream: TcpStream,
    role: Role,
    code: &Code,
) -> Result<(TcpStream, Established), ChannelError> {
    stream.set_nodelay(true).ok();
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let hs = Handshake::new(role, Config::ferry(), Auth::Code(code.password()));
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
    /// Where the sender listens, if it does.
    pub listen: Option<SocketAddr>,
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
        let (mut announcement, mut local) = (None, None);
        if !opts.force_relay {
            let addr = listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
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
            listen: local,
            has_direct: local.is_some(),
        })
    }

    /// Waits for the receiver: the first connection that completes the PAKE. A wrong code ends the send (one
    /// guess per code); connections that do not speak ferry are dropped and waiting goes on.
    pub fn accept(self, code: &Code, ui: &Ui) -> anyhow::Result<Connected> {
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
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The receiver's side: `--peer`, then this host, then the relay.
pub fn receiver_connect(
    code: &Code,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    ui: &Ui,
) -> anyhow::Result<Connected> {
    if opts.force_relay && opts.relay.is_none() {
        anyhow::bail!("--force-relay needs a relay: give --relay HOST:PORT, FERRY_RELAY or `relay` in the config file");
    }
    let mut candidates: Vec<(SocketAddr, &'static str)> = Vec::new();
    if let Some(addr) = peer {
        candidates.push((addr, "direct"));
    } else if !opts.force_relay {
        let wait = if opts.relay.is_some() {
            FIND_BRIEFLY
        } else {
            FIND_TIMEOUT
        };
        if let Some(addr) = find_local(&code.nameplate_hash(), wait)? {
            candidates.push((addr, "same-host"));
        }
    }
    for (addr, path) in candidates {
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
            Err(ChannelError::WrongCode) => return Err(ChannelError::WrongCode.into()),
            Err(e) if opts.relay.is_none() => return Err(e.into()),
            Err(e) => ui.warn(&format!("direct path to {addr} failed: {e}")),
        }
    }
    let Some(relay) = &opts.relay else {
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
