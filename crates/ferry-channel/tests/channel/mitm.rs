//! A man in the middle makes authentication fail on both sides, never succeeds silently; an edited suite offer
//! makes the handshake fail instead of downgrading it, because the offers are bound into the transcript.
//!
//! The attacker runs its own handshakes: it is the responder toward the real initiator and the initiator toward
//! the real responder. Either it relays the authentication messages it decrypts on one leg into the other, or it
//! authenticates itself with a code or identity of its own. An attacker that holds the right code is, to the
//! protocol, the peer; that is what the code is for, so it is not a case here.

use aws_lc_rs::digest;
use ferry_channel::keys::{EphemeralKey, SessionKeys, ELLSWIFT_LEN, TERMINATOR_LEN};
use ferry_channel::{
    Auth, ChannelError, Config, Handshake, Opener, Packet, PeerKey, Role, Sealer, Suite,
    FERRY_MAGIC, MAX_ENCODABLE, PROTOCOL_VERSION,
};

use crate::common::*;

/// One leg of the relaying attacker, run by hand from the crate's key schedule: the attacker can then put the
/// PAKE message it relays into its own version packet, as a real attacker would.
struct Leg {
    sealer: Sealer,
    opener: Opener,
}

/// Decrypts what arrived on one leg and re-encrypts it for the other.
fn relay(from: &mut Leg, to: &mut Leg, bytes: &[u8]) -> Vec<u8> {
    let got = receive_available(&mut from.opener, bytes, usize::MAX);
    assert!(
        got.error.is_none(),
        "the attacker's own legs work: {:?}",
        got.error
    );
    seal_all(&mut to.sealer, &got.packets, false)
}

/// What a real side sent first: its key share, garbage, terminator and version packet, opened by the attacker
/// (whose key `ours` plays `role` toward it).
struct Opening {
    share: [u8; ELLSWIFT_LEN],
    keys: SessionKeys,
    version: Vec<u8>,
}

fn open_first_flight(ours: &EphemeralKey, role: Role, bytes: &[u8]) -> Opening {
    let share: [u8; ELLSWIFT_LEN] = bytes[..ELLSWIFT_LEN].try_into().unwrap();
    let keys = SessionKeys::derive(&ours.shared_secret(&share, role), FERRY_MAGIC, role);
    let rest = &bytes[ELLSWIFT_LEN..];
    let at = rest
        .windows(TERMINATOR_LEN)
        .position(|w| w == keys.recv_terminator)
        .expect("the real side's terminator");
    let mut opener = Opener::with_keys(
        &keys.recv,
        Suite::ChaCha20Poly1305,
        rest[..at].to_vec(),
        MAX_ENCODABLE,
    );
    opener.feed(&rest[at + TERMINATOR_LEN..]);
    let version = match opener.next() {
        Ok(Some(Packet::Data(d))) => d.to_vec(),
        other => panic!("the real side's version packet: {other:?}"),
    };
    Opening {
        share,
        keys,
        version,
    }
}

/// The attacker's side of one leg: its terminator and version packet (`offer`, then the PAKE message it
/// relays, if any) for the real side, and the leg's keys bound to the transcript the real side computes.
fn leg(
    ours: &EphemeralKey,
    role: Role,
    real: &Opening,
    offer: &[u8],
    relayed: &[u8],
) -> (Vec<u8>, Leg) {
    let mut version = offer.to_vec();
    version.extend_from_slice(relayed);
    let mut out = real.keys.send_terminator.to_vec();
    Sealer::new(
        &real.keys.send,
        Suite::ChaCha20Poly1305,
        Vec::new(),
        MAX_ENCODABLE,
    )
    .seal_into(&mut out, 0, &version)
    .unwrap();
    let (init_k, resp_k, init_v, resp_v) = match role {
        Role::Initiator => (ours.encoded(), &real.share, &version, &real.version),
        Role::Responder => (&real.share, ours.encoded(), &real.version, &version),
    };
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(b"ferry/transcript/v1");
    ctx.update(&FERRY_MAGIC);
    ctx.update(&real.keys.session_id);
    ctx.update(init_k);
    ctx.update(resp_k);
    for v in [init_v, resp_v] {
        ctx.update(&(v.len() as u32).to_le_bytes());
        ctx.update(v);
    }
    let transcript: [u8; 32] = ctx.finish().as_ref().try_into().unwrap();
    // The suite both ends of this leg choose (ferry's rule).
    let (theirs, mine) = (real.version[1], offer[1]);
    let aes = Suite::Aes256Gcm.bit();
    let suite = if theirs & mine & aes != 0 && real.version[2] == 1 && offer[2] == 1 {
        Suite::Aes256Gcm
    } else {
        Suite::ChaCha20Poly1305
    };
    let (send, recv) = real.keys.suite_keys(suite, &transcript, role);
    let leg = Leg {
        sealer: Sealer::new(&send, suite, Vec::new(), MAX_ENCODABLE),
        opener: Opener::with_keys(&recv, suite, Vec::new(), MAX_ENCODABLE),
    };
    (out, leg)
}

/// The real sides `a` and `b` through an attacker whose legs offer `attacker`'s suites and no authentication of
/// their own; it relays every authentication message both ways, the PAKE messages inside its version packets.
fn through_relaying_attacker(
    mut a: Handshake,
    mut b: Handshake,
    attacker: Config,
) -> (HsResult, HsResult) {
    let (toward_a, toward_b) = (fixed_key(41), fixed_key(42));
    a.feed(toward_a.encoded()).unwrap();
    b.feed(toward_b.encoded()).unwrap();
    let from_a = open_first_flight(&toward_a, Role::Responder, &a.take_output());
    let from_b = open_first_flight(&toward_b, Role::Initiator, &b.take_output());
    let offer = [
        PROTOCOL_VERSION,
        attacker.suites,
        u8::from(attacker.aes_hardware),
    ];
    let (to_a, mut leg_a) = leg(
        &toward_a,
        Role::Responder,
        &from_a,
        &offer,
        &from_b.version[3..],
    );
    let (to_b, mut leg_b) = leg(
        &toward_b,
        Role::Initiator,
        &from_b,
        &offer,
        &from_a.version[3..],
    );
    let mut ea = a.feed(&to_a).err();
    let mut eb = b.feed(&to_b).err();
    loop {
        let (from_a, from_b) = (a.take_output(), b.take_output());
        let to_b = relay(&mut leg_a, &mut leg_b, &from_a);
        let to_a = relay(&mut leg_b, &mut leg_a, &from_b);
        if to_a.is_empty() && to_b.is_empty() {
            return (settle(a, ea), settle(b, eb));
        }
        if eb.is_none() && !to_b.is_empty() {
            eb = b.feed(&to_b).err();
        }
        if ea.is_none() && !to_a.is_empty() {
            ea = a.feed(&to_a).err();
        }
    }
}

/// The real sides through an attacker that authenticates each leg itself.
fn through_authenticating_attacker(
    a: Handshake,
    b: Handshake,
    toward_a: Auth,
    toward_b: Auth,
) -> (HsResult, HsResult) {
    let (a, _) = drive(a, responder(aes_config(), toward_a));
    let (_, b) = drive(initiator(aes_config(), toward_b), b);
    (a, b)
}

fn assert_both_fail(
    (a, b): (HsResult, HsResult),
    expected: impl Fn(&ChannelError) -> bool,
    what: &str,
) -> (ChannelError, ChannelError) {
    let (ea, eb) = (expect_err(a, what), expect_err(b, what));
    assert!(expected(&ea), "{what}: initiator failed with {ea:?}");
    assert!(expected(&eb), "{what}: responder failed with {eb:?}");
    (ea, eb)
}

#[test]
fn relaying_attacker_fails_code_authentication_on_both_sides() {
    let sides = (
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    let result = through_relaying_attacker(sides.0, sides.1, aes_config());
    assert_both_fail(
        result,
        |e| matches!(e, ChannelError::WrongCode),
        "relayed PAKE",
    );
}

#[test]
fn relaying_attacker_fails_identity_authentication_on_both_sides() {
    let sides = (
        initiator(aes_config(), pinned(1, 2)),
        responder(aes_config(), pinned(2, 1)),
    );
    let (a, b) = through_relaying_attacker(sides.0, sides.1, aes_config());
    // The initiator's signature is genuine but covers the other leg's transcript: the responder refuses it
    // and hangs up without signing anything itself, so the initiator sees only the connection end.
    let what = "relayed signatures";
    let (ea, eb) = (expect_err(a, what), expect_err(b, what));
    assert!(
        matches!(eb, ChannelError::Tampered),
        "{what}: responder failed with {eb:?}"
    );
    assert!(
        matches!(ea, ChannelError::Truncated),
        "{what}: initiator failed with {ea:?}"
    );
}

#[test]
fn attacker_with_another_code_fails_on_both_sides() {
    let other = || Auth::Code(b"7-amber-otter-viola".to_vec());
    let sides = (
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    let result = through_authenticating_attacker(sides.0, sides.1, other(), other());
    assert_both_fail(
        result,
        |e| matches!(e, ChannelError::WrongCode),
        "attacker's own code",
    );
}

#[test]
fn attacker_with_its_own_identity_fails_on_both_sides() {
    let sides = (
        initiator(aes_config(), pinned(1, 2)),
        responder(aes_config(), pinned(2, 1)),
    );
    let own = || Auth::Identity {
        key: identity(66),
        peer: PeerKey::Any,
    };
    let result = through_authenticating_attacker(sides.0, sides.1, own(), own());
    assert_both_fail(
        result,
        |e| matches!(e, ChannelError::IdentityMismatch),
        "attacker's own identity",
    );
}

/// The honest sides' authentication, for each mode.
fn honest_auth() -> [(Auth, Auth); 2] {
    [(code(), code()), (pinned(1, 2), pinned(2, 1))]
}

#[test]
fn downgrading_attacker_fails_on_both_sides() {
    for (auth_a, auth_b) in honest_auth() {
        let sides = (
            initiator(aes_config(), auth_a),
            responder(aes_config(), auth_b),
        );
        // The attacker offers ChaCha20-Poly1305 only to both sides.
        let result = through_relaying_attacker(sides.0, sides.1, chacha_config());
        assert_both_fail(result, |_| true, "downgrade through a relaying attacker");
    }
}

const SEED: u8 = 5;
const GARBAGE: usize = 7;

/// The initiator's offer, rewritten in flight to `offer` by an attacker that knows the initiator's ephemeral
/// secret (stronger than any network attacker), within one session.
fn with_rewritten_offer(offer: Vec<u8>, (auth_a, auth_b): (Auth, Auth)) -> (HsResult, HsResult) {
    let mut rewriter = VersionRewriter::new(offer, SEED, GARBAGE, FERRY_MAGIC);
    let a = fixed_handshake(Role::Initiator, aes_config(), auth_a, SEED, GARBAGE);
    drive_via(a, responder(aes_config(), auth_b), |d, bytes| {
        rewriter.edit(d, bytes)
    })
}

fn unauthenticated() -> (Auth, Auth) {
    (Auth::Unauthenticated, Auth::Unauthenticated)
}

fn offer(suites: u8) -> Vec<u8> {
    vec![PROTOCOL_VERSION, suites, 1]
}

#[test]
fn rewritten_suite_offer_fails_authentication_instead_of_downgrading() {
    for auth in honest_auth() {
        let result = with_rewritten_offer(offer(Suite::ChaCha20Poly1305.bit()), auth);
        // Each side's authentication packets are sealed under keys bound to its own transcript.
        assert_both_fail(result, is_rejection, "rewritten offer");
    }
}

#[test]
fn different_offers_give_different_transcripts() {
    let both = Suite::ChaCha20Poly1305.bit() | Suite::Aes256Gcm.bit();
    // Control: the rewriter re-seals the genuine offer; the sides agree and data flows.
    let (a, b) = with_rewritten_offer(offer(both), unauthenticated());
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    assert_agree(&a, &b);
    assert_round_trip(&mut a, &mut b, &[payload(1, 10)]);

    // Without authentication both sides finish, each with its own view of the offers.
    let (a, b) = with_rewritten_offer(offer(Suite::ChaCha20Poly1305.bit()), unauthenticated());
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.session_id, b.session_id, "same key agreement");
    assert_ne!(
        a.transcript, b.transcript,
        "the offers are in the transcript"
    );
    assert_eq!(
        (a.suite, b.suite),
        (Suite::Aes256Gcm, Suite::ChaCha20Poly1305)
    );
    // And the keys derived from the two transcripts do not match: nothing gets through.
    let wire = seal_all(&mut a.sealer, &[payload(1, 10)], true);
    let got = receive(&mut b.opener, &wire, usize::MAX);
    assert!(
        got.packets.is_empty() && got.error.as_ref().is_some_and(is_rejection),
        "{got:?}"
    );
}
