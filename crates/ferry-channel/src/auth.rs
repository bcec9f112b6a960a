//! Authentication inside the channel, bound to the session: SPAKE2 on a short code, or a pinned identity key.
//!
//! Both run after the version exchange, so every message is already encrypted, and both cover the transcript
//! hash (session id, both key shares, both version packets), so a man in the middle, who necessarily has a
//! different session id on each side, and an edited suite offer both make authentication fail.

use std::sync::{Arc, Mutex};

use aws_lc_rs::hmac;
use aws_lc_rs::signature::{self, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use spake2::{Ed25519Group, Identity, Password, Spake2};

use crate::error::ChannelError;
use crate::Role;

const MSG_SPAKE: u8 = 1;
const MSG_CONFIRM: u8 = 2;
const MSG_IDENTITY: u8 = 3;
/// The responder's answer to a confirmation that did not verify: "wrong code", so the initiator fails with the
/// same cause instead of a cut connection. It carries nothing a guess could be checked against.
const MSG_REJECT: u8 = 4;
/// The responder's answer to an identity it does not admit: empty, so the initiator learns that it was refused
/// and nothing about who refused it.
const MSG_NOT_ADMITTED: u8 = 5;
const SPAKE_MSG_LEN: usize = 33;
const CONFIRM_LEN: usize = 32;
/// Length of an Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Length of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;

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

    /// An Ed25519 signature over `message`, for protocols above the channel (pairing binds keys with it).
    pub fn sign(&self, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        let mut out = [0u8; SIGNATURE_LEN];
        out.copy_from_slice(self.pair.sign(message).as_ref());
        out
    }
}

/// Whether `signature` is `public`'s Ed25519 signature over `message`. A public key of small order is
/// refused whatever the signature: for such a key anyone forges a signature without a secret (the all-zero
/// key with an all-zero signature verifies for a quarter of all messages), so it proves nobody.
pub fn verify_signature(public: &[u8; PUBLIC_KEY_LEN], message: &[u8], signature: &[u8]) -> bool {
    !has_small_order(public)
        && UnparsedPublicKey::new(&signature::ED25519, public)
            .verify(message, signature)
            .is_ok()
}

/// The encodings (y, and y + p where it fits, sign bit cleared) of Ed25519's eight points of small order;
/// libsodium refuses the same list.
const SMALL_ORDER: [[u8; PUBLIC_KEY_LEN]; 7] = {
    const fn ff_then(first: u8) -> [u8; 32] {
        let mut k = [0xff; 32];
        k[0] = first;
        k[31] = 0x7f;
        k
    }
    const fn small(first: u8) -> [u8; 32] {
        let mut k = [0; 32];
        k[0] = first;
        k
    }
    [
        small(0),      // y = 0: order 4
        small(1),      // y = 1: the identity
        ff_then(0xec), // y = p - 1: order 2
        ff_then(0xed), // y = p, i.e. 0
        ff_then(0xee), // y = p + 1, i.e. 1
        [
            0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef,
            0x98, 0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88,
            0x6d, 0x53, 0xfc, 0x05,
        ], // order 8
        [
            0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10,
            0x67, 0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77,
            0x92, 0xac, 0x03, 0x7a,
        ], // order 8
    ]
};

/// Whether `public` encodes a point of small order (either sign of x).
fn has_small_order(public: &[u8; PUBLIC_KEY_LEN]) -> bool {
    SMALL_ORDER
        .iter()
        .any(|k| k[..31] == public[..31] && k[31] == public[31] & 0x7f)
}

/// How the two sides prove who they are.
pub enum Auth {
    /// No authentication: an anonymous, encrypted channel. Only for benchmarks and BIP324 compatibility.
    Unauthenticated,
    /// SPAKE2 on a short code shared out of band, with key confirmation both ways.
    Code(Vec<u8>),
    /// A signature over the transcript by our identity key, checked against `peer`.
    ///
    /// The initiator proves its identity first; the responder checks it against `peer` and only then sends
    /// its own, so a key the responder does not admit learns nothing that identifies the responder.
    Identity {
        /// Our long-term key.
        key: IdentityKey,
        /// Which keys we accept from the peer.
        peer: PeerKey,
    },
}

/// The host's decision on a peer's identity key: `Err` holds why it is refused (for the host's log only; the
/// peer is told nothing but that it was refused).
pub type Admit = Arc<dyn Fn(&[u8; PUBLIC_KEY_LEN]) -> Result<(), String> + Send + Sync>;

/// Which identity keys one side accepts from the other.
#[derive(Clone)]
pub enum PeerKey {
    /// Exactly this key (the peer we set out to reach, or the one paired peer we wait for).
    Pinned([u8; PUBLIC_KEY_LEN]),
    /// Any key the host admits, asked when the key arrives (a sharer and its peer list).
    Admitted(Admit),
    /// Any key; it is reported in [`Established::peer_identity`](crate::Established). A responder with it
    /// reveals its own key to anyone: only for tests and benchmarks.
    Any,
}

impl PeerKey {
    fn check(&self, key: &[u8; PUBLIC_KEY_LEN]) -> Result<(), ChannelError> {
        match self {
            // Public keys are not secret; a plain comparison is fine.
            PeerKey::Pinned(pinned) if pinned != key => Err(ChannelError::IdentityMismatch),
            PeerKey::Admitted(admit) => admit(key).map_err(ChannelError::Refused),
            PeerKey::Pinned(_) | PeerKey::Any => Ok(()),
        }
    }
}

/// The failed-attempt budget of one code, shared by every handshake that uses it (concurrent ones included).
///
/// An attempt is charged when the peer's SPAKE2 message arrives: from then on the peer holds a PAKE state for
/// its guess. An attempt that does not complete (a wrong confirmation, a hang-up, a timeout, any error) counts
/// as failed; after `limit` failures the code is dead and every later attempt fails with
/// [`ChannelError::WrongCode`] before any PAKE work. With [`CodeAttempts::one_guess`], a confirmation that does
/// not verify kills the code at once. Confirmations are checked one at a time under a lock, so concurrent
/// handshakes can never check more guesses than the budget allows.
#[derive(Debug)]
pub struct CodeAttempts {
    state: Mutex<AttemptState>,
    limit: u32,
    wrong_is_fatal: bool,
}

#[derive(Debug, Default)]
struct AttemptState {
    failed: u32,
    dead: bool,
}

/// How many attempts on one code may fail before it is dead (the sender's and the receiver's default).
pub const MAX_FAILED_ATTEMPTS: u32 = 3;

impl CodeAttempts {
    /// The side that checks the first confirmation (the responder, ferry's sender): one wrong confirmation
    /// ends the code, and so do `limit` attempts that reached the PAKE and did not finish.
    pub fn one_guess(limit: u32) -> Arc<Self> {
        Arc::new(CodeAttempts {
            state: Mutex::default(),
            limit: limit.max(1),
            wrong_is_fatal: true,
        })
    }

    /// The side that confirms first (the initiator, ferry's receiver): `limit` failed attempts of any kind,
    /// wrong confirmations included, end the code. Each one gave its peer one guess to check.
    pub fn at_most(limit: u32) -> Arc<Self> {
        Arc::new(CodeAttempts {
            state: Mutex::default(),
            limit: limit.max(1),
            wrong_is_fatal: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AttemptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True once the code may not be used again.
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Attempts that failed so far.
    pub fn failed(&self) -> u32 {
        self.lock().failed
    }

    /// The limit of failed attempts.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    fn begin(self: &Arc<Self>) -> Result<Charge, ChannelError> {
        if self.is_dead() {
            return Err(ChannelError::WrongCode);
        }
        Ok(Charge(Some(Arc::clone(self))))
    }

    fn record_failure(&self, state: &mut AttemptState, wrong: bool) {
        state.failed += 1;
        if state.failed >= self.limit || (wrong && self.wrong_is_fatal) {
            state.dead = true;
        }
    }
}

/// One charged attempt: counted as failed when dropped before [`Charge::settle`].
#[derive(Debug)]
pub(crate) struct Charge(Option<Arc<CodeAttempts>>);

impl Charge {
    /// Runs the confirmation check under the budget's lock: a dead code checks nothing; a check that fails is
    /// counted here. Settles the charge either way.
    fn verify(&mut self, check: impl FnOnce() -> bool) -> Result<(), ChannelError> {
        let Some(attempts) = self.0.take() else {
            return if check() {
                Ok(())
            } else {
                Err(ChannelError::WrongCode)
            };
        };
        let mut state = attempts.lock();
        if state.dead {
            return Err(ChannelError::WrongCode);
        }
        if check() {
            Ok(())
        } else {
            attempts.record_failure(&mut state, true);
            Err(ChannelError::WrongCode)
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(attempts) = self.0.take() {
            let mut state = attempts.lock();
            attempts.record_failure(&mut state, false);
        }
    }
}

/// What an authentication exchange does, driven by the handshake.
pub(crate) enum AuthState {
    Done,
    Spake {
        pending: Option<Box<Spake2<Ed25519Group>>>,
        password: Vec<u8>,
        confirm_key: Option<Box<hmac::Key>>,
        /// The shared failed-attempt budget, if any.
        attempts: Option<Arc<CodeAttempts>>,
        /// This attempt, charged once the peer's PAKE message arrived.
        charge: Option<Charge>,
    },
    Identity {
        key: Box<IdentityKey>,
        peer: PeerKey,
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

/// What the responder sends when a confirmation did not verify (see [`MSG_REJECT`]).
pub(crate) fn reject_message() -> Vec<u8> {
    vec![MSG_REJECT]
}

/// What the responder sends when it does not admit the initiator's identity (see [`MSG_NOT_ADMITTED`]).
pub(crate) fn not_admitted_message() -> Vec<u8> {
    vec![MSG_NOT_ADMITTED]
}

fn identity_packet(key: &IdentityKey, role: Role, transcript: &[u8; 32]) -> Vec<u8> {
    let sig = key.pair.sign(&identity_message(role, transcript));
    let mut out = vec![MSG_IDENTITY];
    out.extend_from_slice(&key.public());
    out.extend_from_slice(sig.as_ref());
    out
}

fn confirm_message(key: &hmac::Key, role: Role, transcript: &[u8; 32]) -> Vec<u8> {
    let mut out = vec![MSG_CONFIRM];
    out.extend_from_slice(hmac::sign(key, &confirm_data(role, transcript)).as_ref());
    out
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
                attempts: None,
                charge: None,
            },
            Auth::Identity { key, peer } => AuthState::Identity {
                key: Box::new(key),
                peer,
            },
        }
    }

    /// Shares a failed-attempt budget with other handshakes on the same code. No effect without a code.
    pub(crate) fn set_attempts(&mut self, budget: Arc<CodeAttempts>) {
        if let AuthState::Spake { attempts, .. } = self {
            *attempts = Some(budget);
        }
    }

    /// True once the peer's PAKE message arrived and the attempt is not settled.
    pub(crate) fn charged(&self) -> bool {
        matches!(
            self,
            AuthState::Spake {
                charge: Some(_),
                ..
            }
        )
    }

    /// Our SPAKE2 message, before the transcript is fixed (it needs only the session id), to send in our
    /// version packet; `None` for the other kinds of authentication, whose first message covers the
    /// transcript. Afterwards [`AuthState::start`] sends nothing more.
    pub(crate) fn start_early(&mut self, role: Role, session_id: &[u8; 32]) -> Option<Vec<u8>> {
        match self {
            AuthState::Spake { .. } => self.start(role, session_id, &[0; 32]).pop(),
            AuthState::Done | AuthState::Identity { .. } => None,
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
            // The responder answers only a key it admits (in `on_message`).
            AuthState::Identity { key, .. } => match role {
                Role::Initiator => vec![identity_packet(key, role, transcript)],
                Role::Responder => Vec::new(),
            },
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
        let peer_role = role.peer();
        match (&mut *self, msg.split_first()) {
            (
                AuthState::Spake {
                    pending,
                    confirm_key,
                    attempts,
                    charge,
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
                // From here on the peer holds a PAKE state for its guess: the attempt counts.
                let this = match attempts {
                    Some(budget) => budget.begin()?,
                    None => Charge(None),
                };
                let secret = state
                    .finish(body)
                    .map_err(|_| ChannelError::AuthProtocol("bad PAKE message"))?;
                let key = hmac::Key::new(hmac::HMAC_SHA256, &secret);
                // Only the initiator confirms first. The responder answers only after it verified the
                // initiator's confirmation, so a peer that guesses a code and hangs up never receives anything
                // it could check its guess against offline.
                let out = match role {
                    Role::Initiator => vec![confirm_message(&key, role, transcript)],
                    Role::Responder => Vec::new(),
                };
                *confirm_key = Some(Box::new(key));
                *charge = Some(this);
                Ok((out, None))
            }
            (
                AuthState::Spake {
                    confirm_key,
                    charge,
                    ..
                },
                Some((&MSG_CONFIRM, body)),
            ) => {
                let key = confirm_key.as_ref().ok_or(ChannelError::AuthProtocol(
                    "confirmation before PAKE message",
                ))?;
                if body.len() != CONFIRM_LEN {
                    return Err(ChannelError::AuthProtocol("confirmation of wrong length"));
                }
                let mut this = charge.take().unwrap_or(Charge(None));
                let verified = this.verify(|| {
                    hmac::verify(key, &confirm_data(peer_role, transcript), body).is_ok()
                });
                verified?;
                let out = match role {
                    Role::Responder => vec![confirm_message(key, role, transcript)],
                    Role::Initiator => Vec::new(),
                };
                *self = AuthState::Done;
                Ok((
                    out,
                    Some(AuthOutcome {
                        peer_identity: None,
                    }),
                ))
            }
            (AuthState::Spake { charge, .. }, Some((&MSG_REJECT, []))) => {
                // The responder says our confirmation did not verify: a wrong guess, counted as such.
                if let Some(mut this) = charge.take() {
                    let _ = this.verify(|| false);
                }
                Err(ChannelError::WrongCode)
            }
            (AuthState::Identity { key, peer }, Some((&MSG_IDENTITY, body))) => {
                if body.len() != PUBLIC_KEY_LEN + SIGNATURE_LEN {
                    return Err(ChannelError::AuthProtocol(
                        "identity message of wrong length",
                    ));
                }
                let (public, sig) = body.split_at(PUBLIC_KEY_LEN);
                let mut peer_key = [0u8; PUBLIC_KEY_LEN];
                peer_key.copy_from_slice(public);
                if !verify_signature(&peer_key, &identity_message(peer_role, transcript), sig) {
                    return Err(ChannelError::Tampered);
                }
                peer.check(&peer_key)?;
                let out = match role {
                    Role::Responder => vec![identity_packet(key, role, transcript)],
                    Role::Initiator => Vec::new(),
                };
                *self = AuthState::Done;
                Ok((
                    out,
                    Some(AuthOutcome {
                        peer_identity: Some(peer_key),
                    }),
                ))
            }
            (AuthState::Identity { .. }, Some((&MSG_NOT_ADMITTED, [])))
                if role == Role::Initiator =>
            {
                Err(ChannelError::NotAdmitted)
            }
            (AuthState::Done, _) => Err(ChannelError::AuthProtocol("message after authentication")),
            _ => Err(ChannelError::AuthProtocol(
                "unexpected authentication message",
            )),
        }
    }
}
