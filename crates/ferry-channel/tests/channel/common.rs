//! Helpers shared by the channel tests: an in-memory pump for two handshakes, deterministic keys, a peer that
//! rewrites version packets with the real key schedule, and packet senders and receivers.

use std::ops::Range;

use ferry_channel::keys::{EphemeralKey, SessionKeys, ELLSWIFT_LEN, TERMINATOR_LEN};
use ferry_channel::{
    frame_len, Auth, ChannelError, Config, Established, Handshake, IdentityKey, Opener, Packet,
    PeerKey, Role, Sealer, Suite, LENGTH_LEN, MAX_ENCODABLE, TAG_LEN,
};
use secp256k1::ellswift::ElligatorSwift;
use secp256k1::{Secp256k1, SecretKey};

/// The code both honest sides use.
pub const CODE: &[u8] = b"7-amber-otter-violin";

/// The result of one side's handshake.
pub type HsResult = Result<Established, ChannelError>;

/// Which way bytes travel between the initiator (A) and the responder (B).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Initiator to responder.
    AtoB,
    /// Responder to initiator.
    BtoA,
}

/// ferry's configuration with everything that varies per test made explicit.
pub fn config(suites: u8, aes_hardware: bool, garbage: usize) -> Config {
    Config {
        suites,
        aes_hardware,
        garbage_len: Some(garbage),
        ..Config::ferry()
    }
}

/// Both suites offered, AES instructions claimed: two such sides pick AES-256-GCM.
pub fn aes_config() -> Config {
    config(
        Suite::ChaCha20Poly1305.bit() | Suite::Aes256Gcm.bit(),
        true,
        17,
    )
}

/// Only ChaCha20-Poly1305 offered.
pub fn chacha_config() -> Config {
    config(Suite::ChaCha20Poly1305.bit(), true, 17)
}

/// Authentication by the shared code [`CODE`].
pub fn code() -> Auth {
    Auth::Code(CODE.to_vec())
}

/// A fixed identity key (`seed` picks which).
pub fn identity(seed: u8) -> IdentityKey {
    IdentityKey::from_seed([seed; 32])
}

/// Identity authentication with our key `ours` and the peer's key `theirs` pinned.
pub fn pinned(ours: u8, theirs: u8) -> Auth {
    Auth::Identity {
        key: identity(ours),
        peer: PeerKey::Pinned(identity(theirs).public()),
    }
}

/// A deterministic ephemeral key: the same `seed` always gives the same secret and the same encoding, so a test
/// can build a second copy of a side, or act with its key.
pub fn fixed_key(seed: u8) -> EphemeralKey {
    let secret = [seed; 32];
    let sk =
        SecretKey::from_byte_array(secret).expect("a small repeated byte is a valid secret key");
    let encoded = ElligatorSwift::from_seckey(&Secp256k1::new(), sk, Some([seed; 32])).to_array();
    EphemeralKey::from_parts(secret, encoded).expect("valid secret")
}

/// A deterministic handshake: fixed key from `seed` and `garbage_len` bytes of fixed garbage.
pub fn fixed_handshake(
    role: Role,
    config: Config,
    auth: Auth,
    seed: u8,
    garbage_len: usize,
) -> Handshake {
    let garbage = (0..garbage_len)
        .map(|i| (i as u8).wrapping_mul(seed))
        .collect();
    Handshake::with_key(role, config, auth, fixed_key(seed), garbage)
}

/// A handshake with fresh keys.
pub fn initiator(config: Config, auth: Auth) -> Handshake {
    Handshake::new(Role::Initiator, config, auth)
}

/// A handshake with fresh keys.
pub fn responder(config: Config, auth: Auth) -> Handshake {
    Handshake::new(Role::Responder, config, auth)
}

/// Moves bytes between two handshakes until neither has anything more to say. Each side's bytes pass through
/// `wire`, which may record, alter or drop them. A side that failed still gets its last output delivered (as
/// the adapters do), so the peer can fail with the same cause. Returns each side's error, if any.
pub fn pump(
    a: &mut Handshake,
    b: &mut Handshake,
    mut wire: impl FnMut(Dir, Vec<u8>) -> Vec<u8>,
) -> (Option<ChannelError>, Option<ChannelError>) {
    let (mut err_a, mut err_b) = (None, None);
    loop {
        let to_b = wire(Dir::AtoB, a.take_output());
        let to_a = wire(Dir::BtoA, b.take_output());
        if to_b.is_empty() && to_a.is_empty() {
            return (err_a, err_b);
        }
        deliver(b, &mut err_b, &to_b);
        deliver(a, &mut err_a, &to_a);
    }
}

fn deliver(hs: &mut Handshake, err: &mut Option<ChannelError>, bytes: &[u8]) {
    if err.is_none() && !bytes.is_empty() {
        *err = hs.feed(bytes).err();
    }
}

/// The outcome of a side once its peer went quiet: its error, or the established channel, or (when it still
/// waits) what it reports at end of file.
pub fn settle(hs: Handshake, err: Option<ChannelError>) -> HsResult {
    match err {
        Some(e) => Err(e),
        None if hs.is_done() => hs.finish(),
        None => Err(hs.eof_error()),
    }
}

/// Runs two handshakes to the end through `wire`.
pub fn drive_via(
    mut a: Handshake,
    mut b: Handshake,
    wire: impl FnMut(Dir, Vec<u8>) -> Vec<u8>,
) -> (HsResult, HsResult) {
    let (ea, eb) = pump(&mut a, &mut b, wire);
    (settle(a, ea), settle(b, eb))
}

/// Runs two handshakes to the end over a perfect wire.
pub fn drive(a: Handshake, b: Handshake) -> (HsResult, HsResult) {
    drive_via(a, b, |_, bytes| bytes)
}

/// Runs two handshakes that must both succeed, and checks that they agree on what they negotiated.
pub fn establish(a: Handshake, b: Handshake) -> (Established, Established) {
    let (a, b) = drive(a, b);
    let (a, b) = (
        a.expect("initiator handshake"),
        b.expect("responder handshake"),
    );
    assert_agree(&a, &b);
    (a, b)
}

/// Both sides of one connection derived the same session id, transcript and suite.
pub fn assert_agree(a: &Established, b: &Established) {
    assert_eq!(a.session_id, b.session_id, "session ids differ");
    assert_eq!(a.transcript, b.transcript, "transcripts differ");
    assert_eq!(a.suite, b.suite, "suites differ");
    assert_eq!((a.role, b.role), (Role::Initiator, Role::Responder));
}

/// An error, with a message naming what was expected of it.
pub fn expect_err<T>(r: Result<T, ChannelError>, what: &str) -> ChannelError {
    match r {
        Ok(_) => panic!("{what}: expected an error, got success"),
        Err(e) => e,
    }
}

/// How a receiver refuses a packet it cannot authenticate. Under a wrong key or at a wrong position the length
/// decrypts to noise, so the refusal is a tag failure, an oversized length, or a wait for bytes that never come.
pub fn is_rejection(e: &ChannelError) -> bool {
    matches!(
        e,
        ChannelError::Tampered | ChannelError::Oversized { .. } | ChannelError::Truncated
    )
}

/// Length on the wire of a key confirmation packet (type byte and a 32-byte HMAC).
pub const CONFIRMATION_FRAME: usize = LENGTH_LEN + 1 + 1 + 32 + TAG_LEN;

/// Splits a handshake's output into what comes before its key confirmation and the confirmation (its last
/// packet).
pub fn split_confirmation(mut out: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    assert!(
        out.len() > CONFIRMATION_FRAME,
        "a confirmation ends the output"
    );
    let confirmation = out.split_off(out.len() - CONFIRMATION_FRAME);
    (out, confirmation)
}

/// Payload `index` of a test: `len` bytes that differ between packets and positions.
pub fn payload(index: usize, len: usize) -> Vec<u8> {
    ferry_testkit::pseudo_random(len, index as u64)
}

/// Seals each payload as one data packet, then the close packet when `close`; returns the wire bytes.
pub fn seal_all(sealer: &mut Sealer, payloads: &[Vec<u8>], close: bool) -> Vec<u8> {
    let mut wire = Vec::new();
    for p in payloads {
        sealer
            .seal_into(&mut wire, 0, p)
            .expect("payload within the maximum");
    }
    if close {
        sealer
            .seal_into(&mut wire, ferry_channel::HEADER_CLOSE, &[])
            .expect("close packet");
    }
    wire
}

/// What a receiver made of a byte stream.
#[derive(Debug, Default)]
pub struct Received {
    /// Data packets delivered, in order.
    pub packets: Vec<Vec<u8>>,
    /// Whether the authenticated close arrived.
    pub closed: bool,
    /// The first error, if any (a stream that ends without close reports `Truncated`).
    pub error: Option<ChannelError>,
}

/// Feeds `wire` into `opener` in pieces of at most `chunk` bytes, opens every packet, and checks end of file.
pub fn receive(opener: &mut Opener, wire: &[u8], chunk: usize) -> Received {
    receive_chopped(opener, wire, &[chunk])
}

/// Like [`receive`], with piece sizes taken from `cuts` in turn.
pub fn receive_chopped(opener: &mut Opener, wire: &[u8], cuts: &[usize]) -> Received {
    let mut got = feed_chopped(opener, wire, cuts);
    if got.error.is_none() {
        got.error = opener.check_eof().err();
    }
    got
}

/// Like [`receive`], for a stream that goes on: no end-of-file check.
pub fn receive_available(opener: &mut Opener, wire: &[u8], chunk: usize) -> Received {
    feed_chopped(opener, wire, &[chunk])
}

fn feed_chopped(opener: &mut Opener, wire: &[u8], cuts: &[usize]) -> Received {
    let mut got = Received::default();
    let mut rest = wire;
    let mut cuts = cuts.iter().cycle();
    loop {
        loop {
            match opener.next() {
                Ok(Some(Packet::Data(d))) => got.packets.push(d.to_vec()),
                Ok(Some(Packet::Close)) => got.closed = true,
                Ok(None) => break,
                Err(e) => {
                    got.error = Some(e);
                    return got;
                }
            }
        }
        if rest.is_empty() {
            return got;
        }
        let piece = *cuts.next().expect("at least one cut");
        let n = opener.feed(&rest[..rest.len().min(piece)]);
        assert!(
            n > 0,
            "the opener took no bytes although it had nothing to deliver"
        );
        rest = &rest[n..];
    }
}

/// Sends `payloads` then close from `from` to `to` and checks they arrive exactly.
pub fn assert_round_trip(from: &mut Established, to: &mut Established, payloads: &[Vec<u8>]) {
    let wire = seal_all(&mut from.sealer, payloads, true);
    let got = receive(&mut to.opener, &wire, 1 << 16);
    assert!(got.error.is_none(), "receiving failed: {:?}", got.error);
    assert!(got.closed, "close packet not seen");
    assert_eq!(got.packets.len(), payloads.len(), "packet count");
    for (i, (g, p)) in got.packets.iter().zip(payloads).enumerate() {
        assert!(g == p, "packet {i} of {} bytes differs", p.len());
    }
}

/// A labelled byte range of a recorded stream.
#[derive(Clone, Debug)]
pub struct Region {
    /// What the bytes are, for messages.
    pub name: String,
    /// Where they are.
    pub range: Range<usize>,
}

/// Lays out a recorded stream region by region, as the sender produced it.
#[derive(Default)]
pub struct Layout {
    /// Regions in wire order.
    pub regions: Vec<Region>,
    end: usize,
}

impl Layout {
    /// Appends a region of `len` bytes.
    pub fn raw(&mut self, name: &str, len: usize) -> &mut Self {
        if len > 0 {
            self.regions.push(Region {
                name: name.to_string(),
                range: self.end..self.end + len,
            });
        }
        self.end += len;
        self
    }

    /// The start of a handshake stream: key share, garbage and terminator.
    pub fn opening(&mut self, garbage: usize) -> &mut Self {
        self.raw("key share", ELLSWIFT_LEN)
            .raw("garbage", garbage)
            .raw("terminator", TERMINATOR_LEN)
    }

    /// Appends the four parts of a frame with `contents` bytes of contents.
    pub fn frame(&mut self, what: &str, contents: usize) -> &mut Self {
        self.raw(&format!("{what} length"), LENGTH_LEN)
            .raw(&format!("{what} header"), 1)
            .raw(&format!("{what} contents"), contents)
            .raw(&format!("{what} tag"), TAG_LEN)
    }

    /// Total bytes laid out.
    pub fn total(&self) -> usize {
        self.end
    }
}

/// A man in the middle who knows the initiator's ephemeral secret, so it can rewrite the initiator's version
/// packet with the real key schedule (an adversary far stronger than a network one). Everything else passes
/// untouched. It needs the initiator's garbage length and fixed key seed.
pub struct VersionRewriter {
    /// The contents the responder will see instead of the initiator's version packet (followed by the
    /// initiator's PAKE message, when its version packet carried one).
    pub contents: Vec<u8>,
    /// The initiator's key seed (see [`fixed_key`]).
    pub seed: u8,
    /// The initiator's garbage, authenticated with its first packet.
    pub garbage: Vec<u8>,
    /// Magic of the key schedule.
    pub magic: [u8; 4],
    responder_share: Vec<u8>,
    seen_a: usize,
}

impl VersionRewriter {
    /// A rewriter for an initiator made by [`fixed_handshake`] with `seed` and `garbage_len`.
    pub fn new(contents: Vec<u8>, seed: u8, garbage_len: usize, magic: [u8; 4]) -> Self {
        let garbage = (0..garbage_len)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect();
        VersionRewriter {
            contents,
            seed,
            garbage,
            magic,
            responder_share: Vec::new(),
            seen_a: 0,
        }
    }

    /// The wire hook for [`drive_via`].
    pub fn edit(&mut self, dir: Dir, mut bytes: Vec<u8>) -> Vec<u8> {
        if dir == Dir::BtoA {
            let need = ELLSWIFT_LEN
                .saturating_sub(self.responder_share.len())
                .min(bytes.len());
            self.responder_share.extend_from_slice(&bytes[..need]);
            return bytes;
        }
        // The initiator's version packet (no decoys) follows its key share, garbage and terminator.
        let start = ELLSWIFT_LEN + self.garbage.len() + TERMINATOR_LEN;
        let from = self.seen_a;
        self.seen_a += bytes.len();
        if from <= start && start < self.seen_a {
            let at = start - from;
            let keys = self.initiator_keys();
            // Open the original to learn its length and keep its PAKE message, if it carries one.
            let mut opener = Opener::with_keys(
                &keys.send,
                Suite::ChaCha20Poly1305,
                self.garbage.clone(),
                MAX_ENCODABLE,
            );
            opener.feed(&bytes[at..]);
            let original = match opener.next() {
                Ok(Some(Packet::Data(d))) => d.to_vec(),
                other => panic!("the version packet in one write: {other:?}"),
            };
            let mut contents = self.contents.clone();
            contents.extend_from_slice(original.get(3..).unwrap_or_default());
            let replacement = self.sealed_version(&keys, &contents);
            bytes.splice(at..at + frame_len(original.len()), replacement);
        }
        bytes
    }

    fn initiator_keys(&self) -> SessionKeys {
        let theirs: [u8; ELLSWIFT_LEN] = self.responder_share[..]
            .try_into()
            .expect("responder key share seen");
        let secret = fixed_key(self.seed).shared_secret(&theirs, Role::Initiator);
        SessionKeys::derive(&secret, self.magic, Role::Initiator)
    }

    fn sealed_version(&self, keys: &SessionKeys, contents: &[u8]) -> Vec<u8> {
        let mut sealer = Sealer::new(
            &keys.send,
            Suite::ChaCha20Poly1305,
            self.garbage.clone(),
            MAX_ENCODABLE,
        );
        let mut out = Vec::new();
        sealer
            .seal_into(&mut out, 0, contents)
            .expect("small version packet");
        out
    }
}
