//! What can stop reaching a peer.

use ferry_channel::ChannelError;
use ferry_relay::RelayError;
use ferry_rendezvous::mdns::DiscoveryError;

/// Why no authenticated channel to the peer came about.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No peer found for the meeting in time, or the peer hung up before it was reached.
    #[error("{0}")]
    PeerNotFound(String),
    /// The address given as a relay answered, but not as a ferry relay does.
    #[error("{0}")]
    NotARelay(String),
    /// `--force-relay` without a relay.
    #[error("--force-relay needs a relay: give --relay HOST:PORT, FERRY_RELAY or `relay` in the config file")]
    NoRelay,
    /// The listener could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why not.
        source: std::io::Error,
    },
    /// Another waiting side on this host announced the same nameplate hash.
    #[error("{0} is in use by another ferry send on this host; choose another code")]
    Taken(String),
    /// This host's registry refused the announcement.
    #[error("cannot announce on this host")]
    Announce(#[source] std::io::Error),
    /// The code was guessed wrong, or too many attempts on it failed: the message says which.
    #[error("{message}")]
    WrongCode {
        /// What happened, and what to do.
        message: String,
        /// Always [`ChannelError::WrongCode`].
        source: ChannelError,
    },
    /// The path upgrade went wrong (the peer sent what does not belong there).
    #[error("{0}")]
    Upgrade(String),
    /// The handshake or the channel failed.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The relay failed.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// LAN discovery could not start.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// A local I/O error (this host's registry, the socket).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The warning when another waiting side holds a paired meeting (`what`) at the relay: who that may be, and
/// that the relay is asked again (every 5 to 30 s) while direct connections are served (when `direct`).
pub(crate) fn taken_at_relay(relay: &str, what: &str, direct: bool) -> String {
    format!(
        "relay {relay}: another waiting side already holds {what} there (TAKEN): another `ferry share` or \
         `ferry send --to` of this pair may be running, or someone holds a copy of this machine's peers.toml \
         and identity key (then `ferry peers remove` the peer on both machines and pair again); asking the \
         relay again every 5 to 30 s{}",
        if direct {
            ", direct connections are still served"
        } else {
            ""
        }
    )
}

/// A relay client's error, in words for the user: an answer that is no relay status means the address
/// is something else, most likely a `ferry send --listen` given as a relay.
pub(crate) fn relay_error(relay: &str, e: RelayError) -> SessionError {
    match e {
        RelayError::UnknownStatus(_) => SessionError::NotARelay(format!(
            "{relay} is not a ferry relay (its answer is not a relay's); to connect to a `ferry send --listen` \
             address directly, give it with --peer"
        )),
        e => e.into(),
    }
}
