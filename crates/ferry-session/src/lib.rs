//! Reaching a ferry peer: every path, the race of handshakes, and the move from the relay to a direct path.
//!
//! One side waits ([`Rendezvous`]: `ferry send`, the side of `ferry pair` that prints the code): it listens,
//! announces itself on this host and on the LAN (mDNS), and waits at the relay. The other side looks
//! ([`connect`]): `--peer ADDR`, then this host, then the LAN, then the relay, round after round. Direct paths
//! come first; the relay is the fallback (or the only path with [`PeerOptions::force_relay`]). Whatever the
//! path, the handshake decides who the peer is: a path only proposes a connection. After a meeting at the
//! relay, [`upgrade`] moves the session to a direct connection when one works.
//!
//! What both sides meet on is a [`Meeting`]: the nameplate hash that the registry, mDNS and the relay see, and
//! how the handshake authenticates ([`MeetingAuth`]: a code's password, or an identity). The host (the CLI)
//! hears of what happens through [`Events`].
//!
//! ```no_run
//! use ferry_session::{connect, Connected, Meeting, PeerOptions};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let code: ferry_rendezvous::Code = "7-amber-otter-wagon".parse()?;
//! let opts = PeerOptions { relay: None, force_relay: false, no_discovery: true };
//! let connected: Connected = connect(&Meeting::code(&code), &opts, None, Duration::from_secs(30), &mut ())?;
//! println!("reached the peer {} ({})", connected.peer, connected.path);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_code)]

use std::any::Any;
use std::fmt;
use std::net::TcpStream;
use std::sync::Arc;

use ferry_channel::{Auth, Established};
use ferry_rendezvous::{Code, CodePurpose, NameplateHash};

pub mod congestion;
mod connect;
mod error;
mod handshake;
pub mod lanes;
mod rendezvous;
mod standing;
pub mod upgrade;

pub use connect::connect;
pub use error::SessionError;
pub use handshake::handshake_with;
pub use rendezvous::Rendezvous;
pub use standing::{HashSource, Standing};

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

/// How a connection reached the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// Through this host's registry (a sender on the same machine).
    SameHost,
    /// Found on the LAN by mDNS.
    Lan,
    /// A direct TCP connection: `--peer ADDR`, or a connection to the waiting side's listener.
    Direct,
    /// Through the relay.
    Relay,
}

impl PathKind {
    /// The stable name scripts see (`--json`'s `path`): `same-host`, `lan`, `direct` or `relay`.
    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::SameHost => "same-host",
            PathKind::Lan => "lan",
            PathKind::Direct => "direct",
            PathKind::Relay => "relay",
        }
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated channel and how it was reached.
pub struct Connected {
    /// The transport.
    pub stream: TcpStream,
    /// The established channel.
    pub established: Established,
    /// How the peer was reached.
    pub path: PathKind,
    /// The address connected to (the relay's for [`PathKind::Relay`]).
    pub peer: String,
    /// How long the handshake took on the waiting side, from its connection to the channel (about two round
    /// trips); `None` on the looking side.
    pub handshake: Option<std::time::Duration>,
}

/// What the two sides meet on: where they look for each other, and how they prove who they are.
pub struct Meeting {
    /// What this host's registry, mDNS and the relay see: a code's nameplate hash, or a paired peer's hash of
    /// the current time window.
    pub hash: NameplateHash,
    /// Hashes the looking side also tries, in the same round, after `hash`: a paired peer's neighbouring
    /// time windows, so that clocks a window apart still meet. The waiting side announces `hash` only.
    pub also: Vec<NameplateHash>,
    /// How the meeting is named in messages, e.g. `nameplate 7`.
    pub label: String,
    /// Who the looking side waits for, in its message when nobody came: `sender` (a code's), `sharer`.
    pub waited_for: String,
    /// What runs on the other side, for that message: e.g. `` `ferry send` ``. For a code's meeting it is the
    /// waiting side's command, which that side's own messages name too ("start a new `ferry send`").
    pub other_side: String,
    /// How each handshake authenticates.
    pub auth: MeetingAuth,
}

impl Meeting {
    /// The meeting of a code: its nameplate hash, authenticated by SPAKE2 on the whole code. A pairing code's
    /// messages name `ferry pair`, a transfer code's `ferry send`.
    pub fn code(code: &Code) -> Self {
        let (waited_for, other_side) = match code.purpose() {
            CodePurpose::Transfer => ("sender", "`ferry send`"),
            CodePurpose::Pairing => ("machine to pair with", "`ferry pair`"),
        };
        Meeting {
            hash: code.nameplate_hash(),
            also: Vec::new(),
            label: format!("nameplate {}", code.nameplate()),
            waited_for: waited_for.into(),
            other_side: other_side.into(),
            auth: MeetingAuth::Code(code.password()),
        }
    }

    /// Every hash of the meeting, `hash` first.
    pub fn hashes(&self) -> impl Iterator<Item = &NameplateHash> + '_ {
        std::iter::once(&self.hash).chain(&self.also)
    }
}

/// How the handshakes of a meeting authenticate. Several handshakes run side by side, so each gets its own
/// [`Auth`].
#[derive(Clone)]
pub enum MeetingAuth {
    /// SPAKE2 on this password, with the code's guess budget (one guess for the waiting side, a few for the
    /// looking side).
    Code(Vec<u8>),
    /// Made anew for each handshake, e.g. `Auth::Identity` with our key and the paired peer's pinned key; no
    /// guess budget (nothing to guess).
    Other(Arc<dyn Fn() -> Auth + Send + Sync>),
}

impl MeetingAuth {
    /// The [`Auth`] of one handshake.
    fn auth(&self) -> Auth {
        match self {
            MeetingAuth::Code(password) => Auth::Code(password.clone()),
            MeetingAuth::Other(make) => make(),
        }
    }
}

/// What the host (the CLI) hears of, and the one thing it keeps for the session.
pub trait Events {
    /// A path failed, or a connection was refused or dropped, and looking goes on.
    fn warn(&mut self, message: &str);
    /// The waiting side refused the identity key of the peer at `peer` for `reason` (the host's own, from
    /// its admission check) and told the peer nothing else.
    fn refused(&mut self, peer: &str, reason: &str) {
        self.warn(&format!("refused a connection from {peer}: {reason}"));
    }
    /// The looking side pauses before its next round (`what`: "Waiting for the sender...").
    fn waiting(&mut self, what: &str) {
        let _ = what;
    }
    /// Keeps `value` (this host's announcement, the mDNS advertisement) until the returned handle is dropped,
    /// and drops it also when a signal ends the process, so no announcement outlives it. The default keeps it
    /// only until the handle is dropped.
    fn keep_until_exit(&mut self, value: Box<dyn Any + Send>) -> Box<dyn Any + Send> {
        value
    }
}

/// No host: warnings are dropped.
impl Events for () {
    fn warn(&mut self, _message: &str) {}
}

/// `e` and its causes, as anyhow's `{:#}` shows them: `outer: inner: ...`.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}
