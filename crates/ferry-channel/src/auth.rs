//! Authentication inside the channel, bound to the session: SPAKE2 on a short code, or a pinned identity key.
//!
//! Both run after the version exchange, so every message is already encrypted, and both cover the transcript
//! hash (session id, both key shares, both version packets), so a man in the middle, who necessarily has a
//! different session id on each side, and an edited suite offer both make authentication fail.

use aws_lc_rs::hmac;
use aws_lc_rs::signature::{self, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use spake2::{Ed25519Group, Identity, Password, Spake2};

use crate::error::ChannelError;
use crate::Role;

const MSG_SPAKE: u8 = 1;
const MSG_CONFIRM: u8 = 2;
const MSG_IDENTITY: u8 = 3;
const SPAKE_MSG_LEN: usize = 33;
const CONFIRM_LEN: usize = 32;
/// Length of an Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
const SIGNATURE_LEN: usize = 64;

/// A long-term Ed25519 identity key.
pub struct IdentityKey {
    pair: Ed25519KeyPair,
    seed: [u8; 32],
}

impl IdentityKey {
    /// A fresh identity key.
    pub fn generate() -> Self {
        let mut seed = [0u8; 32];
        crate::keys::fill_random(&mut seed);
        Self::from_seed(seed)
    }

    /// The identity key with this 32-byte seed.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let pair =
            Ed25519KeyPair::from_seed_unchecked(&seed).expect("any 32 bytes are an Ed25519 seed");
        IdentityKey { pair, seed }
    }

    /// The seed, to store the key (mode 0600).
    pub fn seed(&self) -> &[u8; 32] {
        &self.seed
    }

    /// The public key peers pin.
    pub fn public(&self) -> [u8; PUBLIC_KEY_LEN] {
        let mut out = [0u8; PUBLIC_KEY_LEN];
        out.copy_from_slice(self.pair.public_key().as_ref());
        out
    }
}

/// How the two sides prove who they are.
pub enum Auth {
    /// No authentication: an anonymous, encrypted channel. Only for benchmarks and BIP324 compatibility.
    Unauthenticated,
    /// SPAKE2 on a short code shared out of band, with key confirmation both ways.
    Code(Vec<u8>),
    /// A signature over the transcript by our identity key; the peer's key must equal `pinned` when given.
    Identity {
        /// Our long-term key.
        key: IdentityKey,
        /// The peer's public key we expect; `None` accepts any key and reports it.
        pinned: Option<[u8; PUBLIC_KEY_LEN]>,
    },
}

/// What an authentication exchange does, driven by the handshake.
pub(crate) enum AuthState {
    Done,
    Spake {
        pending: Option<Box<Spake2<Ed25519Group>>>,
        password: Vec<u8>,
        confirm_key: Option<Box<hmac::Key>>,
    },
    Identity {
        key: Box<IdentityKey>,
        pinned: Option<[u8; PUBLIC_KEY_LEN]>,
    },
}

/// The result of authentication.
pub(crate) struct AuthOutcome {
    pub(crate) peer_identity: Option<[u8; PUBLIC_KEY_LEN]>,
}

fn role_name(role: Role) -> &'static [u8] {
    match role {
        Role::Initiator => b"initiator",
        Role::Responder => b"responder",
    }
}

fn identity_message(role: Role, transcript: &[u8; 32]) -> Vec<u8> {
    let mut m = b"ferry/identity/v1/".to_vec();
    m.extend_from_slice(role_name(role));
    m.extend_from_slice(transcript);
    m
}

fn confirm_data(role: Role, transcript: &[u8; 32]) -> Vec<u8> {
    let mut data = b"ferry/confirm/v1/".to_vec();
    data.extend_from_slice(role_name(role));
    data.extend_from_slice(transcript);
    data
}

impl AuthState {
    pub(crate) fn new(auth: Auth) -> Self {
        match auth {
            Auth::Unauthenticated => AuthState::Done,
            Auth::Code(password) => AuthState::Spake {
                pending: None,
                password,
                confirm_key: None,
            },
            Auth::Identity { key, pinned } => AuthState::Identity {
                key: Box::new(key),
                pinned,
            },
        }
    }

    /// The first messages we send, once the transcript is fixed.
    pub(crate) fn start(
        &mut self,
        role: Role,
        session_id: &[u8; 32],
        transcript: &[u8; 32],
    ) -> Vec<Vec<u8>> {
        match self {
            AuthState::Done => Vec::new(),
            AuthState::Spake {
                pending, password, ..
            } => {
                let mut id_a = b"ferry/initiator/".to_vec();
                id_a.extend_from_slice(session_id);
                let mut id_b = b"ferry/responder/".to_vec();
                id_b.extend_from_slice(session_id);
                let (pw, a, b) = (
                    Password::new(&password[..]),
                    Identity::new(&id_a),
                    Identity::new(&id_b),
                );
                let (state, msg) = match role {
                    Role::Initiator => Spake2::<Ed25519Group>::start_a(&pw, &a, &b),
                    Role::Responder => Spake2::<Ed25519Group>::start_b(&pw, &a, &b),
                };
                *pending = Some(Box::new(state));
                let mut out = vec![MSG_SPAKE];
                out.extend_from_slice(&msg);
                vec![out]
            }
            AuthState::Identity { key, .. } => {
                let sig = key.pair.sign(&identity_message(role, transcript));
                let mut out = vec![MSG_IDENTITY];
                out.extend_from_slice(&key.public());
                out.extend_from_slice(sig.as_ref());
                vec![out]
            }
        }
    }

    /// Handles one authentication message from the peer. Returns the messages to send and, when the peer is
    /// authenticated, the outcome.
    pub(crate) fn on_message(
        &mut self,
        role: Role,
        transcript: &[u8; 32],
        msg: &[u8],
    ) -> Result<(Vec<Vec<u8>>, Option<AuthOutcome>), ChannelError> {
        let peer = role.peer();
        match (&mut *self, msg.split_first()) {
            (
                AuthState::Spake {
                    pending,
                    confirm_key,
                    ..
                },
                Some((&MSG_SPAKE, body)),
            ) => {
                let state = pending
                    .take()
                    .ok_or(ChannelError::AuthProtocol("unexpected PAKE message"))?;
                if body.len() != SPAKE_MSG_LEN {
                    return Err(ChannelError::AuthProtocol("PAKE message of wrong length"));
                }
                let secret = state
                    .finish(body)
                    .map_err(|_| ChannelError::AuthProtocol("bad PAKE message"))?;
                let key = hmac::Key::new(hmac::HMAC_SHA256, &secret);
                let mut out = vec![MSG_CONFIRM];
                out.extend_from_slice(hmac::sign(&key, &confirm_data(role, transcript)).as_ref());
                *confirm_key = Some(Box::new(key));
                Ok((vec![out], None))
            }
            (AuthState::Spake { confirm_key, .. }, Some((&MSG_CONFIRM, body))) => {
                let key = confirm_key.as_ref().ok_or(ChannelError::AuthProtocol(
                    "confirmation before PAKE message",
                ))?;
                if body.len() != CONFIRM_LEN {
                    return Err(ChannelError::AuthProtocol("confirmation of wrong length"));
                }
                hmac::verify(key, &confirm_data(peer, transcript), body)
                    .map_err(|_| ChannelError::WrongCode)?;
                *self = AuthState::Done;
                Ok((
                    Vec::new(),
                    Some(AuthOutcome {
                        peer_identity: None,
                    }),
                ))
            }
            (AuthState::Identity { pinned, .. }, Some((&MSG_IDENTITY, body))) => {
                if body.len() != PUBLIC_KEY_LEN + SIGNATURE_LEN {
                    return Err(ChannelError::AuthProtocol(
                        "identity message of wrong length",
                    ));
                }
                let (public, sig) = body.split_at(PUBLIC_KEY_LEN);
                UnparsedPublicKey::new(&signature::ED25519, public)
                    .verify(&identity_message(peer, transcript), sig)
                    .map_err(|_| ChannelError::Tampered)?;
                let mut peer_key = [0u8; PUBLIC_KEY_LEN];
                peer_key.copy_from_slice(public);
                if let Some(pinned) = pinned {
                    // Public keys are not secret; a plain comparison is fine.
                    if *pinned != peer_key {
                        return Err(ChannelError::IdentityMismatch);
                    }
                }
                *self = AuthState::Done;
                Ok((
                    Vec::new(),
                    Some(AuthOutcome {
                        peer_identity: Some(peer_key),
                    }),
                ))
            }
            (AuthState::Done, _) => Err(ChannelError::AuthProtocol("message after authentication")),
            _ => Err(ChannelError::AuthProtocol(
                "unexpected authentication message",
            )),
        }
    }
}
