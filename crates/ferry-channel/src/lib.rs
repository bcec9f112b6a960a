//! ferry's secure channel: BIP324's v2 transport, generalised.
//!
//! Every byte ferry sends travels through this crate. Key agreement is BIP324's (ephemeral secp256k1 keys
//! encoded with ElligatorSwift, x-only ECDH, HKDF-SHA256), so the wire is pseudorandom from the first byte.
//! Packets use BIP324's framing (FSChaCha20-encrypted 3-byte length, header byte, AEAD contents, 16-byte tag)
//! with either ChaCha20-Poly1305 exactly as BIP324 or AES-256-GCM with the same forward-secure rekey, chosen in
//! the version packets and bound to the transcript. Authentication (SPAKE2 on a short code, or a pinned Ed25519
//! identity) runs inside the channel and is bound to the session id.
//!
//! The core is sans-IO: [`Handshake`] takes bytes and gives bytes; [`Sealer`] and [`Opener`] seal and open
//! packets in place. [`blocking`] and [`tokio_io`] are thin adapters over real streams.
//!
//! ```
//! use ferry_channel::{Auth, Config, Handshake, Role};
//!
//! let mut a = Handshake::new(Role::Initiator, Config::ferry(), Auth::Code(b"7-amber-otter".to_vec()));
//! let mut b = Handshake::new(Role::Responder, Config::ferry(), Auth::Code(b"7-amber-otter".to_vec()));
//! while !(a.is_done() && b.is_done()) {
//!     let (to_b, to_a) = (a.take_output(), b.take_output());
//!     b.feed(&to_b).unwrap();
//!     a.feed(&to_a).unwrap();
//! }
//! let (mut a, mut b) = (a.finish().unwrap(), b.finish().unwrap());
//! let mut wire = Vec::new();
//! a.sealer.seal_into(&mut wire, 0, b"hello").unwrap();
//! b.opener.feed(&wire);
//! assert_eq!(b.opener.next().unwrap(), Some(ferry_channel::Packet::Data(&mut b"hello".to_vec()[..])));
//! ```
#![warn(missing_docs, unreachable_pub)]

mod auth;
pub mod blocking;
mod error;
mod fschacha;
mod handshake;
pub mod keys;
pub mod lanes;
mod packet;
pub mod sizing;
mod suite;
#[cfg(feature = "tokio")]
pub mod tokio_io;

pub use auth::{
    verify_signature, Admit, Auth, CodeAttempts, IdentityKey, PeerKey, MAX_FAILED_ATTEMPTS,
    PUBLIC_KEY_LEN, SIGNATURE_LEN,
};
pub use error::ChannelError;
pub use fschacha::FsChaCha20;
pub use handshake::{
    Config, Established, Handshake, BITCOIN_MAINNET_MAGIC, FERRY_MAGIC, MAX_GARBAGE,
    MAX_HANDSHAKE_DECOYS, MAX_PAD, PROTOCOL_VERSION,
};
pub use packet::{
    frame_len, Opener, Packet, Ready, Sealer, CONTENTS_OFFSET, DEFAULT_MAX_PAYLOAD, FRAME_OVERHEAD,
    HEADER_CLOSE, HEADER_DECOY, LENGTH_LEN, MAX_ENCODABLE,
};
pub use suite::{has_aes_hardware, AeadKey, AwsLcKey, FsAead, Suite, TagMismatch, TAG_LEN};

/// Packets between two rekeys, in both the length cipher and the packet AEAD (BIP324).
pub const REKEY_INTERVAL: u32 = 224;

/// Which side of the connection we are. The initiator is the side that connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The side that opened the connection.
    Initiator,
    /// The side that accepted it.
    Responder,
}

impl Role {
    /// The other side.
    pub fn peer(self) -> Role {
        match self {
            Role::Initiator => Role::Responder,
            Role::Responder => Role::Initiator,
        }
    }
}
