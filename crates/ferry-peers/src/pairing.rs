//! Pairing: what two machines exchange inside a channel that SPAKE2 on a code authenticated.
//!
//! Each side sends one [`PairingMessage`]: its identity public key, a random half of the pair's secret, a name
//! it suggests for itself, and an Ed25519 signature by that identity key over all of it, the sender's role and
//! the channel's transcript hash. The signature proves the sender holds the key it presents (nobody can pin
//! someone else's key to their own pairing), and the transcript binds it to this channel: the code already
//! authenticated the channel, so a man in the middle would have had to guess the code.
//!
//! The pair's secret is `BLAKE3-derive_key("ferry 2026 pair secret v1", transcript || initiator half ||
//! responder half)`: fresh for every pairing, known only to the two ends.
//!
//! Wire form (one channel packet each way): version u8 (= 1), public key [32], secret half [32], name length
//! u8, name (UTF-8, at most [`MAX_SUGGESTED_NAME`] bytes), signature [64].

use ferry_channel::{verify_signature, IdentityKey, Role, PUBLIC_KEY_LEN, SIGNATURE_LEN};

use crate::store::PeerName;
use crate::{PairSecret, PeersError};

/// Version byte of the pairing message.
pub const VERSION: u8 = 1;
/// Longest name a side may suggest for itself.
pub const MAX_SUGGESTED_NAME: usize = 64;
/// Longest pairing message.
pub const MAX_MESSAGE: usize = 1 + PUBLIC_KEY_LEN + 32 + 1 + MAX_SUGGESTED_NAME + SIGNATURE_LEN;
const SIGNED_CONTEXT: &[u8] = b"ferry 2026 pairing v1/";
const SECRET_CONTEXT: &str = "ferry 2026 pair secret v1";

/// One side's pairing message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairingMessage {
    /// The sender's identity public key.
    pub key: [u8; PUBLIC_KEY_LEN],
    /// The sender's half of the pair's secret.
    pub half: [u8; 32],
    /// The name the sender suggests for itself (its host name); the receiver cleans it up.
    pub name: String,
    /// The sender's signature (see the module docs).
    pub signature: [u8; SIGNATURE_LEN],
}

impl PairingMessage {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_MESSAGE);
        out.push(VERSION);
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.half);
        out.push(self.name.len() as u8);
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&self.signature);
        out
    }

    /// Parses a message, checking every length.
    pub fn decode(bytes: &[u8]) -> Result<Self, PeersError> {
        let mut rest = bytes;
        let mut take = |n: usize| -> Result<&[u8], PeersError> {
            if rest.len() < n {
                return Err(PeersError::Malformed("too short"));
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        if take(1)?[0] != VERSION {
            return Err(PeersError::Malformed(
                "unknown version (is the other side a newer ferry?)",
            ));
        }
        let key = take(PUBLIC_KEY_LEN)?.try_into().expect("length taken");
        let half = take(32)?.try_into().expect("length taken");
        let name_len = take(1)?[0] as usize;
        if name_len > MAX_SUGGESTED_NAME {
            return Err(PeersError::Malformed("name too long"));
        }
        let name = std::str::from_utf8(take(name_len)?)
            .map_err(|_| PeersError::Malformed("name is not UTF-8"))?
            .to_string();
        let signature = take(SIGNATURE_LEN)?.try_into().expect("length taken");
        if !rest.is_empty() {
            return Err(PeersError::Malformed("trailing bytes"));
        }
        Ok(PairingMessage {
            key,
            half,
            name,
            signature,
        })
    }
}

/// What a completed pairing gives one side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paired {
    /// The peer's identity key, to pin.
    pub peer_key: [u8; PUBLIC_KEY_LEN],
    /// The secret both sides now share.
    pub secret: PairSecret,
    /// The peer's suggested name, cleaned up.
    pub suggested_name: PeerName,
}

/// One side of a pairing, after the channel's handshake.
pub struct Pairing {
    role: Role,
    transcript: [u8; 32],
    own_key: [u8; PUBLIC_KEY_LEN],
    message: PairingMessage,
}

impl Pairing {
    /// Prepares our message. `transcript` is the channel's [`ferry_channel::Established::transcript`];
    /// `name` is what we suggest the peer calls us (cut to [`MAX_SUGGESTED_NAME`] bytes).
    pub fn new(role: Role, transcript: [u8; 32], key: &IdentityKey, name: &str) -> Self {
        let mut half = [0u8; 32];
        ferry_channel::keys::fill_random(&mut half);
        let name = ferry_wire::truncate_text(name, MAX_SUGGESTED_NAME).to_string();
        let own_key = key.public();
        let signature = key.sign(&signed_bytes(role, &transcript, &own_key, &half, &name));
        Pairing {
            role,
            transcript,
            own_key,
            message: PairingMessage {
                key: own_key,
                half,
                name,
                signature,
            },
        }
    }

    /// The message to send to the peer.
    pub fn message(&self) -> &PairingMessage {
        &self.message
    }

    /// Checks the peer's message and derives what both sides keep.
    pub fn finish(&self, theirs: &PairingMessage) -> Result<Paired, PeersError> {
        if theirs.key == self.own_key {
            return Err(PeersError::OwnKey);
        }
        let signed = signed_bytes(
            self.role.peer(),
            &self.transcript,
            &theirs.key,
            &theirs.half,
            &theirs.name,
        );
        if !verify_signature(&theirs.key, &signed, &theirs.signature) {
            return Err(PeersError::BadSignature);
        }
        let (first, second) = match self.role {
            Role::Initiator => (&self.message.half, &theirs.half),
            Role::Responder => (&theirs.half, &self.message.half),
        };
        let mut material = Vec::with_capacity(96);
        material.extend_from_slice(&self.transcript);
        material.extend_from_slice(first);
        material.extend_from_slice(second);
        Ok(Paired {
            peer_key: theirs.key,
            secret: PairSecret(blake3::derive_key(SECRET_CONTEXT, &material)),
            suggested_name: PeerName::sanitized(&theirs.name),
        })
    }
}

fn signed_bytes(
    role: Role,
    transcript: &[u8; 32],
    key: &[u8; PUBLIC_KEY_LEN],
    half: &[u8; 32],
    name: &str,
) -> Vec<u8> {
    let mut m = SIGNED_CONTEXT.to_vec();
    m.push(match role {
        Role::Initiator => b'i',
        Role::Responder => b'r',
    });
    m.extend_from_slice(transcript);
    m.extend_from_slice(key);
    m.extend_from_slice(half);
    m.push(name.len() as u8);
    m.extend_from_slice(name.as_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ta: [u8; 32], tb: [u8; 32]) -> (Pairing, Pairing, IdentityKey, IdentityKey) {
        let (ka, kb) = (IdentityKey::generate(), IdentityKey::generate());
        let a = Pairing::new(Role::Initiator, ta, &ka, "alice");
        let b = Pairing::new(Role::Responder, tb, &kb, "bob's mac");
        (a, b, ka, kb)
    }

    /// Found by the `pairing` fuzz target: the all-zero key (a point of small order) with an all-zero
    /// signature was accepted for about a quarter of all messages, so a pairing could pin a key whose
    /// signatures anyone makes.
    #[test]
    fn a_key_of_small_order_is_refused_whatever_it_signs() {
        let (a, ..) = pair([3; 32], [3; 32]);
        let mut weak = [[0u8; 32], [1; 32], [0xff; 32]];
        weak[1] = [0; 32];
        weak[1][0] = 1;
        weak[2][0] = 0xec;
        weak[2][31] = 0x7f;
        for key in weak {
            for i in 0..=255u8 {
                let mut signature = [0u8; SIGNATURE_LEN];
                signature[..32].copy_from_slice(&key);
                let forged = PairingMessage {
                    key,
                    half: [i; 32],
                    name: String::new(),
                    signature,
                };
                assert!(a.finish(&forged).is_err(), "key {key:02x?}, half {i}");
            }
        }
    }

    #[test]
    fn both_sides_pin_each_other_and_agree_on_the_secret() {
        let (a, b, ka, kb) = pair([3; 32], [3; 32]);
        let at_a = a
            .finish(&PairingMessage::decode(&b.message().encode()).unwrap())
            .unwrap();
        let at_b = b
            .finish(&PairingMessage::decode(&a.message().encode()).unwrap())
            .unwrap();
        assert_eq!(at_a.peer_key, kb.public());
        assert_eq!(at_b.peer_key, ka.public());
        assert_eq!(at_a.secret, at_b.secret);
        assert_eq!(at_a.suggested_name.as_str(), "bob-s-mac");
        // A second pairing of the same keys gets a fresh secret.
        let (a2, b2, ..) = pair([3; 32], [3; 32]);
        let again = a2.finish(b2.message()).unwrap();
        assert_ne!(again.secret, at_a.secret);
    }

    #[test]
    fn a_message_from_another_channel_is_refused() {
        // A man in the middle relaying a genuine message between two channels: the transcripts differ.
        let (a, b, ..) = pair([3; 32], [4; 32]);
        assert!(matches!(
            a.finish(b.message()),
            Err(PeersError::BadSignature)
        ));
    }

    #[test]
    fn a_presented_key_without_its_signature_is_refused() {
        let (a, b, ..) = pair([3; 32], [3; 32]);
        let victim = IdentityKey::generate().public();
        let mut forged = b.message().clone();
        forged.key = victim;
        assert!(matches!(a.finish(&forged), Err(PeersError::BadSignature)));
        let mut renamed = b.message().clone();
        renamed.name = "mallory".into();
        assert!(matches!(a.finish(&renamed), Err(PeersError::BadSignature)));
        // Our own message reflected back: refused (own key), and with its role it would not verify anyway.
        assert!(matches!(a.finish(a.message()), Err(PeersError::OwnKey)));
    }

    #[test]
    fn decoding_checks_every_length() {
        let (a, ..) = pair([3; 32], [3; 32]);
        let good = a.message().encode();
        for cut in 0..good.len() {
            assert!(
                PairingMessage::decode(&good[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(PairingMessage::decode(&long).is_err());
        let mut version = good.clone();
        version[0] = 2;
        assert!(PairingMessage::decode(&version).is_err());
        let mut name_len = good.clone();
        name_len[1 + 64] = (MAX_SUGGESTED_NAME + 1) as u8;
        assert!(PairingMessage::decode(&name_len).is_err());
        let long_name = Pairing::new(
            Role::Initiator,
            [0; 32],
            &IdentityKey::generate(),
            &"é".repeat(60),
        );
        assert!(long_name.message().name.len() <= MAX_SUGGESTED_NAME);
        assert!(PairingMessage::decode(&long_name.message().encode()).is_ok());
    }
}
