//! Each way a handshake or a packet can be refused ends in its own typed error, on the side that must see it.

use ferry_channel::keys::{fill_random, ELLSWIFT_LEN, TERMINATOR_LEN};
use ferry_channel::{
    Auth, ChannelError, Config, Handshake, PeerKey, Role, Suite, DEFAULT_MAX_PAYLOAD, FERRY_MAGIC,
    MAX_GARBAGE, MAX_HANDSHAKE_DECOYS, PROTOCOL_VERSION,
};

use crate::common::*;

#[test]
fn wrong_code_fails_on_both_sides_after_one_attempt() {
    let mut a = initiator(aes_config(), code());
    let mut b = responder(aes_config(), Auth::Code(b"7-amber-otter-viola".to_vec()));
    let (ea, eb) = pump(&mut a, &mut b, |_, bytes| bytes);
    assert!(
        matches!(ea, Some(ChannelError::WrongCode)),
        "initiator: {ea:?}"
    );
    assert!(
        matches!(eb, Some(ChannelError::WrongCode)),
        "responder: {eb:?}"
    );
    // One attempt per connection: a failed handshake takes nothing more.
    assert!(matches!(a.feed(&[0; 100]), Err(ChannelError::Closed)));
    assert!(matches!(b.feed(&[0; 100]), Err(ChannelError::Closed)));
    assert!(a.finish().is_err() && b.finish().is_err());
}

#[test]
fn identity_not_matching_the_pinned_key_is_identity_mismatch() {
    // The initiator expects key 3 but the responder holds key 2; the responder's pin is right.
    let (a, b) = drive(
        initiator(aes_config(), pinned(1, 3)),
        responder(aes_config(), pinned(2, 1)),
    );
    assert!(
        matches!(a, Err(ChannelError::IdentityMismatch)),
        "initiator: {:?}",
        a.err()
    );
    // Both pins wrong: the responder refuses first, and the initiator hears only that it was refused.
    let (a, b2) = drive(
        initiator(aes_config(), pinned(1, 3)),
        responder(aes_config(), pinned(2, 3)),
    );
    assert!(matches!(a, Err(ChannelError::NotAdmitted)), "{:?}", a.err());
    assert!(matches!(b2, Err(ChannelError::IdentityMismatch)));
    // The responder's own check passed in the first case; it learned the initiator's real key.
    assert_eq!(
        b.expect("responder pinned correctly").peer_identity,
        Some(identity(1).public())
    );
}

#[test]
fn unpinned_identity_is_accepted_and_reported() {
    let unpinned = Auth::Identity {
        key: identity(1),
        peer: PeerKey::Any,
    };
    let (a, b) = establish(
        initiator(aes_config(), unpinned),
        responder(aes_config(), pinned(2, 1)),
    );
    assert_eq!(a.peer_identity, Some(identity(2).public()));
    assert_eq!(b.peer_identity, Some(identity(1).public()));
}

#[test]
fn mixed_authentication_modes_are_a_protocol_violation() {
    let (a, b) = drive(
        initiator(aes_config(), code()),
        responder(aes_config(), pinned(2, 1)),
    );
    assert!(
        matches!(a, Err(ChannelError::AuthProtocol(_))),
        "{:?}",
        a.err()
    );
    assert!(
        matches!(b, Err(ChannelError::AuthProtocol(_))),
        "{:?}",
        b.err()
    );
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_random(&mut v);
    v
}

#[test]
fn random_bytes_without_terminator_are_not_ferry() {
    for role in [Role::Initiator, Role::Responder] {
        let noise = random_bytes(ELLSWIFT_LEN + MAX_GARBAGE + TERMINATOR_LEN);
        // One byte short of the limit, the terminator could still come.
        let mut hs = Handshake::new(role, aes_config(), code());
        hs.feed(&noise[..noise.len() - 1])
            .expect("still within the garbage limit");
        assert!(!hs.is_done());
        assert!(matches!(
            hs.feed(&noise[noise.len() - 1..]),
            Err(ChannelError::NotFerry)
        ));
        // Fed all at once, byte by byte across the boundary: the same.
        let mut hs = Handshake::new(role, aes_config(), code());
        assert!(matches!(hs.feed(&noise), Err(ChannelError::NotFerry)));
    }
}

#[test]
fn eof_during_key_share_or_garbage_is_not_ferry() {
    let mut hs = responder(aes_config(), code());
    assert!(matches!(hs.eof_error(), ChannelError::NotFerry));
    hs.feed(&random_bytes(ELLSWIFT_LEN - 1)).unwrap();
    assert!(matches!(hs.eof_error(), ChannelError::NotFerry));
    hs.feed(&random_bytes(100)).unwrap();
    assert!(
        matches!(hs.eof_error(), ChannelError::NotFerry),
        "in the garbage"
    );
}

#[test]
fn eof_after_key_agreement_is_truncated() {
    let mut a = initiator(aes_config(), code());
    let mut b = responder(aes_config(), code());
    let hello = a.take_output();
    b.feed(&hello).unwrap();
    a.feed(&b.take_output()).unwrap();
    // The initiator's terminator, version and PAKE message arrive, its confirmation never does.
    let (flight, _confirmation) = split_confirmation(a.take_output());
    b.feed(&flight).unwrap();
    assert!(!b.is_done());
    assert!(matches!(b.eof_error(), ChannelError::Truncated));
}

/// A peer whose version packet, sealed with the real key schedule, names protocol version 2.
#[test]
fn another_protocol_version_is_version_mismatch() {
    let theirs = PROTOCOL_VERSION + 1;
    let mut rewriter = VersionRewriter::new(
        vec![theirs, Suite::ChaCha20Poly1305.bit(), 0],
        9,
        5,
        FERRY_MAGIC,
    );
    let a = fixed_handshake(Role::Initiator, aes_config(), code(), 9, 5);
    let (a, b) = drive_via(a, responder(aes_config(), code()), |d, bytes| {
        rewriter.edit(d, bytes)
    });
    assert!(a.is_err());
    match b {
        Err(ChannelError::VersionMismatch { ours, theirs: t }) => {
            assert_eq!((ours, t), (PROTOCOL_VERSION, theirs))
        }
        other => panic!("expected a version mismatch, got {:?}", other.err()),
    }
}

/// A plain BIP324 peer (empty version packet) meeting a ferry peer with the same magic.
#[test]
fn plain_bip324_peer_is_version_mismatch() {
    // The config hack: BIP324's empty version packet, under ferry's magic so key agreement still matches.
    let plain = Config::bip324(FERRY_MAGIC);
    let (a, b) = drive(initiator(plain, code()), responder(aes_config(), code()));
    assert!(a.is_err());
    assert!(
        matches!(
            b,
            Err(ChannelError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: 0
            })
        ),
        "{:?}",
        b.err()
    );
}

#[test]
fn disjoint_suite_offers_are_suite_mismatch() {
    let chacha_only = config(Suite::ChaCha20Poly1305.bit(), true, 0);
    let aes_only = config(Suite::Aes256Gcm.bit(), true, 0);
    let nothing = config(0, true, 0);
    for (x, y) in [
        (chacha_only.clone(), aes_only.clone()),
        (aes_only, chacha_only),
        (nothing.clone(), aes_config()),
    ] {
        let (a, b) = drive(initiator(x, code()), responder(y, code()));
        assert!(
            matches!(a, Err(ChannelError::SuiteMismatch)),
            "{:?}",
            a.err()
        );
        assert!(
            matches!(b, Err(ChannelError::SuiteMismatch)),
            "{:?}",
            b.err()
        );
    }
}

/// A handshake packet announcing more than a handshake packet may hold is refused from its length alone.
#[test]
fn oversized_handshake_packet_is_refused_from_its_length() {
    let mut rewriter = VersionRewriter::new(vec![PROTOCOL_VERSION; 5000], 9, 0, FERRY_MAGIC);
    let mut a = fixed_handshake(Role::Initiator, aes_config(), code(), 9, 0);
    let mut b = responder(aes_config(), code());
    let (_, eb) = pump(&mut a, &mut b, |d, bytes| {
        let mut edited = rewriter.edit(d, bytes);
        if edited.len() > 5000 {
            // Deliver the terminator and the packet's length bytes, none of its contents.
            edited.truncate(TERMINATOR_LEN + 3);
        }
        edited
    });
    assert!(
        // 5000 bytes, and the initiator's PAKE message that the rewriter keeps.
        matches!(
            eb,
            Some(ChannelError::Oversized {
                len: 5034,
                max: 4096
            })
        ),
        "{eb:?}"
    );
}
/// A packet over the negotiated maximum is refused by the sender, and by the receiver as soon as it has read the
/// three length bytes, before the contents arrive (so before any memory could be reserved for them).
#[test]
fn a_length_above_max_payload_is_oversized_before_its_contents_arrive() {
    let mut big = aes_config();
    big.max_payload = 2 * DEFAULT_MAX_PAYLOAD;
    let (mut a, mut b) = establish(initiator(big, code()), responder(aes_config(), code()));
    assert!(matches!(
        b.sealer.seal_into(&mut Vec::new(), 0, &vec![0; DEFAULT_MAX_PAYLOAD + 1]),
        Err(ChannelError::Oversized { len, max }) if len == DEFAULT_MAX_PAYLOAD + 1 && max == DEFAULT_MAX_PAYLOAD
    ));
    let wire = seal_all(&mut a.sealer, &[payload(0, DEFAULT_MAX_PAYLOAD + 1)], false);
    assert_eq!(b.opener.feed(&wire[..3]), 3);
    assert!(matches!(
        b.opener.next(),
        Err(ChannelError::Oversized { len, max }) if len == DEFAULT_MAX_PAYLOAD + 1 && max == DEFAULT_MAX_PAYLOAD
    ));
}

/// A peer that sends more decoys in its handshake than a ferry ever pads with is refused once it passes
/// [`MAX_HANDSHAKE_DECOYS`]; decoys up to that bound are dropped and the handshake ends.
#[test]
fn a_handshake_flooded_with_decoys_is_refused_past_the_bound() {
    let packet = 4096;
    let within = MAX_HANDSHAKE_DECOYS / (packet + 64);
    for (count, refused) in [(within, false), (within * 2, true)] {
        let mut flooding = aes_config();
        flooding.decoys = vec![packet; count];
        let (a, b) = drive(initiator(flooding, code()), responder(aes_config(), code()));
        if refused {
            assert!(
                matches!(b, Err(ChannelError::AuthProtocol(m)) if m.contains("decoy")),
                "{count} decoys: the responder says {:?}",
                b.err()
            );
        } else {
            assert!(
                a.is_ok() && b.is_ok(),
                "{count} decoys: {:?} {:?}",
                a.err(),
                b.err()
            );
        }
    }
}

/// Bytes the responder sent the initiator, and both results, for a stranger's key `stranger` against a
/// responder holding key 2 and admitting only key 1.
fn stranger_meets_responder(stranger: u8) -> (usize, HsResult, HsResult) {
    let admit: ferry_channel::Admit = std::sync::Arc::new(|key: &[u8; 32]| {
        (*key == identity(1).public())
            .then_some(())
            .ok_or_else(|| "not paired".to_string())
    });
    let mut sent = 0;
    let (a, b) = drive_via(
        initiator(
            aes_config(),
            Auth::Identity {
                key: identity(stranger),
                peer: PeerKey::Any,
            },
        ),
        responder(
            aes_config(),
            Auth::Identity {
                key: identity(2),
                peer: PeerKey::Admitted(admit),
            },
        ),
        |dir, bytes| {
            if matches!(dir, Dir::BtoA) {
                sent += bytes.len();
            }
            bytes
        },
    );
    (sent, a, b)
}

#[test]
fn a_stranger_learns_no_identity_from_the_responder() {
    let (refused_bytes, a, b) = stranger_meets_responder(9);
    // The stranger hears only that it was refused: no key, so no fingerprint, and no signature.
    assert!(matches!(a, Err(ChannelError::NotAdmitted)), "{:?}", a.err());
    assert!(
        matches!(&b, Err(ChannelError::Refused(why)) if why == "not paired"),
        "{:?}",
        b.err()
    );
    // The admitted key gets the responder's identity packet (key and signature, 96 bytes more); the stranger
    // got none of it.
    let (admitted_bytes, a, b) = stranger_meets_responder(1);
    assert_eq!(
        a.expect("admitted").peer_identity,
        Some(identity(2).public())
    );
    assert_eq!(
        b.expect("admitted").peer_identity,
        Some(identity(1).public())
    );
    assert!(
        admitted_bytes >= refused_bytes + 96,
        "refused: {refused_bytes} B, admitted: {admitted_bytes} B"
    );
}
