//! Whole records moved around by an attacker are rejected: replayed, reordered, dropped, reflected, spliced in
//! from another session, or cut off before the authenticated close; nothing may follow the close.

use ferry_channel::blocking::SecureReader;
use ferry_channel::{ChannelError, Established, Packet, HEADER_CLOSE};

use crate::common::*;

/// Established sessions for each suite.
fn sessions() -> Vec<(Established, Established)> {
    vec![
        establish(
            initiator(aes_config(), code()),
            responder(aes_config(), code()),
        ),
        establish(
            initiator(chacha_config(), code()),
            responder(chacha_config(), code()),
        ),
    ]
}

/// Seals each payload as its own frame.
fn frames(from: &mut Established, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| seal_all(&mut from.sealer, &[payload(i, 20 + i)], false))
        .collect()
}

/// Receives the concatenation of `parts` and returns what arrived.
fn receive_parts(to: &mut Established, parts: &[&[u8]]) -> Received {
    receive(&mut to.opener, &parts.concat(), usize::MAX)
}

/// The receiver delivered exactly the first `good` packets, then refused the stream.
fn assert_rejected_after(got: &Received, good: usize, what: &str) {
    assert!(
        got.error.as_ref().is_some_and(is_rejection),
        "{what}: expected a rejection, got {:?}",
        got.error
    );
    assert_eq!(
        got.packets.len(),
        good,
        "{what}: packets delivered before the failure"
    );
    for (i, p) in got.packets.iter().enumerate() {
        assert_eq!(p, &payload(i, 20 + i), "{what}: packet {i}");
    }
}

#[test]
fn replayed_packet_is_rejected() {
    for (mut a, mut b) in sessions() {
        let f = frames(&mut a, 2);
        assert_rejected_after(
            &receive_parts(&mut b, &[&f[0], &f[0]]),
            1,
            "replay of packet 0",
        );
        let f = frames(&mut b, 3);
        assert_rejected_after(
            &receive_parts(&mut a, &[&f[0], &f[1], &f[1]]),
            2,
            "replay of packet 1",
        );
    }
}

#[test]
fn reordered_or_dropped_packets_are_rejected() {
    for (mut a, mut b) in sessions() {
        let f = frames(&mut a, 3);
        assert_rejected_after(&receive_parts(&mut b, &[&f[1], &f[0]]), 0, "swap");
        let f = frames(&mut b, 3);
        assert_rejected_after(&receive_parts(&mut a, &[&f[0], &f[2]]), 1, "drop");
    }
}

#[test]
fn reflected_packets_are_rejected() {
    for (mut a, mut b) in sessions() {
        let f = frames(&mut a, 1);
        assert_rejected_after(
            &receive_parts(&mut a, &[&f[0]]),
            0,
            "initiator's own packet",
        );
        let f = frames(&mut b, 1);
        assert_rejected_after(
            &receive_parts(&mut b, &[&f[0]]),
            0,
            "responder's own packet",
        );
    }
}

#[test]
fn reflected_handshake_never_completes() {
    let mut a = initiator(aes_config(), code());
    let hello = a.take_output();
    let r = a.feed(&hello);
    assert!(r.is_err() || !a.is_done());
    let err = r.err().unwrap_or_else(|| a.eof_error());
    // Our own terminator is not the one we look for, so our own garbage never ends.
    assert!(matches!(err, ChannelError::NotFerry), "{err:?}");
}

#[test]
fn packet_spliced_from_another_session_with_the_same_code_is_rejected() {
    let (mut a1, mut b1) = establish(
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    let (mut a2, _) = establish(
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    let own = frames(&mut a1, 2);
    let foreign = frames(&mut a2, 2);
    // Same position in the other session's stream, after one good packet of ours.
    assert_rejected_after(
        &receive_parts(&mut b1, &[&own[0], &foreign[1]]),
        1,
        "splice at position 1",
    );
    let (_, mut b3) = establish(
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    assert_rejected_after(
        &receive_parts(&mut b3, &[&foreign[0]]),
        0,
        "splice at position 0",
    );
}

#[test]
fn stream_ending_without_close_is_truncated() {
    for (mut a, mut b) in sessions() {
        let f = frames(&mut a, 2);
        let got = receive_parts(&mut b, &[&f[0], &f[1]]);
        assert!(
            matches!(got.error, Some(ChannelError::Truncated)),
            "{:?}",
            got.error
        );
        assert_eq!(got.packets.len(), 2);
        // Cut inside a packet: also truncation, and the partial packet is not delivered.
        let f = frames(&mut b, 2);
        let wire = f.concat();
        let mut reader = SecureReader::new(&wire[..f[0].len() + 10], a.opener);
        assert_eq!(
            reader.recv().unwrap().map(|d| d.to_vec()),
            Some(payload(0, 20))
        );
        assert!(matches!(reader.recv(), Err(ChannelError::Truncated)));
    }
}

#[test]
fn close_is_final_and_empty() {
    for (mut a, mut b) in sessions() {
        let mut wire = seal_all(&mut a.sealer, &[payload(0, 20)], true);
        wire.extend(seal_all(&mut a.sealer, &[payload(1, 21)], false));
        let got = receive(&mut b.opener, &wire, usize::MAX);
        assert!(got.closed, "close seen");
        assert_rejected_after(&got, 1, "data after close");

        let mut wire = Vec::new();
        b.sealer
            .seal_into(&mut wire, HEADER_CLOSE, b"trailing")
            .unwrap();
        assert_eq!(a.opener.feed(&wire), wire.len());
        assert!(
            matches!(a.opener.next(), Err(ChannelError::Tampered)),
            "close with contents"
        );
    }
}

/// After a tag failure the opener does not recover, even when the genuine packet follows.
#[test]
fn an_opener_that_failed_keeps_failing() {
    for (mut a, mut b) in sessions() {
        let f = frames(&mut a, 2);
        let mut bad = f[0].clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(b.opener.feed(&bad), bad.len());
        assert!(b.opener.next().is_err());
        assert!(b.opener.next().is_err(), "second try on the same bytes");
        b.opener.feed(&f.concat());
        for _ in 0..3 {
            assert!(
                !matches!(b.opener.next(), Ok(Some(Packet::Data(_)))),
                "delivered after a failure"
            );
        }
    }
}
