//! Key agreement and key schedule, exactly as BIP324 with the network magic as a parameter.
//!
//! `shared = ECDH_xonly(ours, theirs)` hashed with the BIP324 tagged hash over both ElligatorSwift encodings,
//! then HKDF-SHA256 with salt `"bitcoin_v2_shared_secret" || magic` gives the L (length) and P (packet) keys per
//! direction, both garbage terminators and the session id.

use aws_lc_rs::hkdf;
use secp256k1::ellswift::{ElligatorSwift, Party};
use secp256k1::SecretKey;

use crate::suite::Suite;
use crate::Role;

/// Length of an ElligatorSwift-encoded public key.
pub const ELLSWIFT_LEN: usize = 64;
/// Length of a garbage terminator.
pub const TERMINATOR_LEN: usize = 16;

/// An ephemeral secp256k1 key pair with its ElligatorSwift encoding (64 uniformly random-looking bytes).
pub struct EphemeralKey {
    secret: SecretKey,
    encoded: [u8; ELLSWIFT_LEN],
}

impl EphemeralKey {
    /// A fresh key from the operating system's randomness.
    pub fn generate() -> Self {
        loop {
            let mut bytes = [0u8; 32];
            let mut aux = [0u8; 32];
            fill_random(&mut bytes);
            fill_random(&mut aux);
            if let Ok(secret) = SecretKey::from_byte_array(bytes) {
                let encoded =
                    ElligatorSwift::from_seckey(secp256k1::SECP256K1, secret, Some(aux)).to_array();
                return EphemeralKey { secret, encoded };
            }
        }
    }

    /// A key from a fixed secret and a given encoding of its public key (for test vectors).
    pub fn from_parts(secret: [u8; 32], encoded: [u8; ELLSWIFT_LEN]) -> Option<Self> {
        let secret = SecretKey::from_byte_array(secret).ok()?;
        Some(EphemeralKey { secret, encoded })
    }

    /// The 64 bytes that go on the wire.
    pub fn encoded(&self) -> &[u8; ELLSWIFT_LEN] {
        &self.encoded
    }

    /// BIP324's x-only ECDH: the tagged hash of the shared x-coordinate and both encodings.
    pub fn shared_secret(&self, theirs: &[u8; ELLSWIFT_LEN], role: Role) -> [u8; 32] {
        let ours = ElligatorSwift::from_array(self.encoded);
        let theirs = ElligatorSwift::from_array(*theirs);
        let (a, b, party) = match role {
            Role::Initiator => (ours, theirs, Party::Initiator),
            Role::Responder => (theirs, ours, Party::Responder),
        };
        ElligatorSwift::shared_secret(a, b, self.secret, party, None).to_secret_bytes()
    }
}

/// Decodes a 64-byte ElligatorSwift encoding to the x-coordinate of its point.
pub fn ellswift_decode_x(encoded: &[u8; ELLSWIFT_LEN]) -> [u8; 32] {
    let pk = secp256k1::PublicKey::from_ellswift(ElligatorSwift::from_array(*encoded));
    let mut x = [0u8; 32];
    x.copy_from_slice(&pk.serialize()[1..]);
    x
}

/// Fills `buf` from the operating system's CSPRNG (getrandom(2)).
///
/// Not aws-lc's RNG: its first use in a process seeds a jitter-entropy DRBG, which costs about 30 ms here,
/// a tenth of a whole small transfer.
pub fn fill_random(buf: &mut [u8]) {
    getrandom::fill(buf).expect("the system CSPRNG does not fail");
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// Keys of one direction of a channel.
#[derive(Clone)]
pub struct DirectionKeys {
    /// FSChaCha20 key for the 3-byte lengths.
    pub length: [u8; 32],
    /// AEAD key for packet contents.
    pub packet: [u8; 32],
}

/// Everything the key schedule gives one side.
pub struct SessionKeys {
    /// Keys for what we send.
    pub send: DirectionKeys,
    /// Keys for what we receive.
    pub recv: DirectionKeys,
    /// The terminator we send after our garbage.
    pub send_terminator: [u8; TERMINATOR_LEN],
    /// The terminator that ends the peer's garbage.
    pub recv_terminator: [u8; TERMINATOR_LEN],
    /// The session id both sides share; authentication is bound to it.
    pub session_id: [u8; 32],
    prk: hkdf::Prk,
}

impl SessionKeys {
    /// Runs BIP324's key schedule on an ECDH secret.
    pub fn derive(shared_secret: &[u8; 32], magic: [u8; 4], role: Role) -> Self {
        let mut salt = b"bitcoin_v2_shared_secret".to_vec();
        salt.extend_from_slice(&magic);
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(shared_secret);
        let init = DirectionKeys {
            length: expand32(&prk, &[b"initiator_L"]),
            packet: expand32(&prk, &[b"initiator_P"]),
        };
        let resp = DirectionKeys {
            length: expand32(&prk, &[b"responder_L"]),
            packet: expand32(&prk, &[b"responder_P"]),
        };
        let mut terminators = [0u8; 32];
        expand(&prk, &[b"garbage_terminators"], &mut terminators);
        let session_id = expand32(&prk, &[b"session_id"]);
        let (mut t_init, mut t_resp) = ([0u8; 16], [0u8; 16]);
        t_init.copy_from_slice(&terminators[..16]);
        t_resp.copy_from_slice(&terminators[16..]);
        let (send, recv, send_terminator, recv_terminator) = match role {
            Role::Initiator => (init, resp, t_init, t_resp),
            Role::Responder => (resp, init, t_resp, t_init),
        };
        SessionKeys {
            send,
            recv,
            send_terminator,
            recv_terminator,
            session_id,
            prk,
        }
    }

    /// The secret every key of the session's extra connections (lanes) comes from, bound to the transcript
    /// (see [`crate::lanes`]).
    pub fn lane_secret(&self, transcript: &[u8; 32]) -> [u8; 32] {
        expand32(&self.prk, &[b"ferry/lanes/", transcript])
    }

    /// Keys of `suite` for the rest of the session, bound to the transcript of the version exchange.
    ///
    /// Labels are distinct per suite and direction, so no key ever serves two purposes.
    pub fn suite_keys(
        &self,
        suite: Suite,
        transcript: &[u8; 32],
        role: Role,
    ) -> (DirectionKeys, DirectionKeys) {
        let name = suite.name().as_bytes();
        let dir = |who: &[u8]| DirectionKeys {
            length: expand32(&self.prk, &[b"ferry/", name, who, b"_L/", transcript]),
            packet: expand32(&self.prk, &[b"ferry/", name, who, b"_P/", transcript]),
        };
        let (init, resp) = (dir(b"/initiator"), dir(b"/responder"));
        match role {
            Role::Initiator => (init, resp),
            Role::Responder => (resp, init),
        }
    }
}

fn expand(prk: &hkdf::Prk, info: &[&[u8]], out: &mut [u8]) {
    prk.expand(info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("HKDF output length is far below its limit");
}

fn expand32(prk: &hkdf::Prk, info: &[&[u8]]) -> [u8; 32] {
    let mut out = [0u8; 32];
    expand(prk, info, &mut out);
    out
}
