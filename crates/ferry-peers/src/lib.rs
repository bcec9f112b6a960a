//! ferry's paired machines: who this installation is, whom it trusts, and how two paired machines meet.
//!
//! - [`identity`]: this installation's Ed25519 identity key in `$XDG_CONFIG_HOME/ferry/identity` (0600, created
//!   on first use) and its [`Fingerprint`], eight code words two people can compare aloud.
//! - [`store`]: the pinned peers in `$XDG_CONFIG_HOME/ferry/peers.toml` — name, public key, the secret the pair
//!   shares (sealed with a key derived from the identity key, so the file alone reveals no secret), when it
//!   was last seen and where. Read-modify-write under a lock, written atomically, 0600.
//! - [`pairing`]: the exchange that runs inside a channel authenticated by a code (SPAKE2): both identity keys,
//!   each signed over the channel's transcript, and two random halves of the pair's secret. Sans-IO: bytes in,
//!   bytes out, tested two-sided in memory.
//! - [`meeting`]: the rendezvous hash of a paired session. It is keyed by the pair's secret and the current
//!   time window, so what a relay, the LAN or the same-host registry sees changes every window and never names
//!   a key: an observer cannot link two sessions of the same pair.
//!
//! ```
//! use ferry_channel::IdentityKey;
//! use ferry_peers::pairing::{Pairing, PairingMessage};
//!
//! let transcript = [7u8; 32]; // from the channel both sides share
//! let (alice, bob) = (IdentityKey::generate(), IdentityKey::generate());
//! let a = Pairing::new(ferry_channel::Role::Initiator, transcript, &alice, "alice-laptop");
//! let b = Pairing::new(ferry_channel::Role::Responder, transcript, &bob, "bob-desktop");
//! let (to_b, to_a) = (a.message().encode(), b.message().encode());
//! let at_b = b.finish(&PairingMessage::decode(&to_b).unwrap()).unwrap();
//! let at_a = a.finish(&PairingMessage::decode(&to_a).unwrap()).unwrap();
//! assert_eq!(at_a.peer_key, bob.public());
//! assert_eq!(at_b.peer_key, alice.public());
//! assert_eq!(at_a.secret, at_b.secret);
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod error;
pub mod identity;
pub mod meeting;
pub mod pairing;
pub mod store;

pub use error::PeersError;
pub use identity::Fingerprint;
pub use store::{Peer, PeerName, PeerStore};

/// The secret two paired machines share; it keys their rendezvous hashes ([`meeting`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PairSecret(pub [u8; 32]);

impl std::fmt::Debug for PairSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PairSecret(..)")
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The 32 bytes written as 64 hex digits, or `None`.
pub(crate) fn from_hex32(text: &str) -> Option<[u8; 32]> {
    from_hex(text)
}

/// The `N` bytes written as `2 * N` hex digits, or `None`.
pub(crate) fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let text = text.as_bytes();
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_round_trips_and_rejects_junk() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 37) as u8);
        assert_eq!(super::from_hex32(&super::to_hex(&bytes)), Some(bytes));
        assert_eq!(super::from_hex32("00"), None);
        assert_eq!(super::from_hex32(&"g".repeat(64)), None);
        assert_eq!(super::from_hex32(&"é".repeat(32)), None);
    }
}
