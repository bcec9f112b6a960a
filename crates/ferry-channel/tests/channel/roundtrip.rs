//! Two honest sides in memory: every suite with every authentication mode agrees on the session and carries
//! data both ways exactly, across several rekey epochs, at the size limits, with decoys and extreme garbage.

use ferry_channel::blocking::{Received, SecureReader, SecureWriter};
use ferry_channel::{
    frame_len, Auth, Config, Established, Handshake, Role, Suite, BITCOIN_MAINNET_MAGIC,
    DEFAULT_MAX_PAYLOAD, MAX_GARBAGE, MAX_PAD, REKEY_INTERVAL,
};

use crate::common::*;

/// Packet sizes for one direction: more than two rekey epochs of mixed small packets, with the two extremes
/// (empty and the 1 MiB maximum) in the middle of an epoch.
fn epoch_spanning_payloads(salt: usize) -> Vec<Vec<u8>> {
    const SIZES: [usize; 9] = [0, 1, 2, 15, 16, 17, 255, 1000, 4096];
    let count = 2 * REKEY_INTERVAL as usize + 60;
    let mut payloads: Vec<Vec<u8>> = (0..count)
        .map(|i| payload(salt + i, SIZES[i % SIZES.len()]))
        .collect();
    payloads[300] = payload(salt, DEFAULT_MAX_PAYLOAD);
    payloads[301] = Vec::new();
    payloads[302] = vec![0xA5];
    payloads
}

/// Both directions, then checks both sides' views of the session.
fn exchange_both_ways(a: &mut Established, b: &mut Established) {
    assert_round_trip(a, b, &epoch_spanning_payloads(0));
    assert_round_trip(b, a, &epoch_spanning_payloads(10_000));
}

#[derive(Clone, Copy, Debug)]
enum AuthMode {
    Code,
    Identity,
}

fn auth_pair(mode: AuthMode) -> (Auth, Auth) {
    match mode {
        AuthMode::Code => (code(), code()),
        AuthMode::Identity => (pinned(1, 2), pinned(2, 1)),
    }
}

/// Runs one (configs, auth mode) case and checks the negotiated suite.
fn run_case(cfg_a: Config, cfg_b: Config, mode: AuthMode, expect: Suite) {
    let (auth_a, auth_b) = auth_pair(mode);
    let (mut a, mut b) = establish(initiator(cfg_a, auth_a), responder(cfg_b, auth_b));
    assert_eq!(a.suite, expect, "{mode:?}");
    match mode {
        AuthMode::Code => assert_eq!((a.peer_identity, b.peer_identity), (None, None)),
        AuthMode::Identity => {
            assert_eq!(a.peer_identity, Some(identity(2).public()));
            assert_eq!(b.peer_identity, Some(identity(1).public()));
        }
    }
    exchange_both_ways(&mut a, &mut b);
}

#[test]
fn every_suite_with_every_auth_mode_round_trips() {
    let no_hw = config(
        Suite::ChaCha20Poly1305.bit() | Suite::Aes256Gcm.bit(),
        false,
        17,
    );
    for mode in [AuthMode::Code, AuthMode::Identity] {
        // ChaCha20-Poly1305 because one side offers only it.
        run_case(aes_config(), chacha_config(), mode, Suite::ChaCha20Poly1305);
        run_case(chacha_config(), aes_config(), mode, Suite::ChaCha20Poly1305);
        // ChaCha20-Poly1305 because one side lacks AES instructions.
        run_case(no_hw.clone(), aes_config(), mode, Suite::ChaCha20Poly1305);
        run_case(aes_config(), no_hw.clone(), mode, Suite::ChaCha20Poly1305);
        // AES-256-GCM when both offer it and both have the instructions.
        run_case(aes_config(), aes_config(), mode, Suite::Aes256Gcm);
    }
}

#[test]
fn only_aes_offered_gives_aes_even_without_hardware() {
    let aes_only = config(Suite::Aes256Gcm.bit(), false, 0);
    run_case(aes_only.clone(), aes_only, AuthMode::Code, Suite::Aes256Gcm);
}

#[test]
fn plain_bip324_mode_interoperates_with_itself() {
    let cfg = Config::bip324(BITCOIN_MAINNET_MAGIC);
    let (mut a, mut b) = establish(
        initiator(cfg.clone(), Auth::Unauthenticated),
        responder(cfg, Auth::Unauthenticated),
    );
    assert_eq!(a.suite, Suite::ChaCha20Poly1305);
    exchange_both_ways(&mut a, &mut b);
}

#[test]
fn garbage_of_zero_and_maximum_length() {
    for (ga, gb) in [
        (0, 0),
        (0, MAX_GARBAGE),
        (MAX_GARBAGE, 0),
        (MAX_GARBAGE, MAX_GARBAGE),
    ] {
        let cfg = |g| {
            config(
                Suite::ChaCha20Poly1305.bit() | Suite::Aes256Gcm.bit(),
                true,
                g,
            )
        };
        let (mut a, mut b) = establish(initiator(cfg(ga), code()), responder(cfg(gb), code()));
        assert_round_trip(&mut a, &mut b, &[payload(1, 100)]);
        assert_round_trip(&mut b, &mut a, &[payload(2, 100)]);
    }
}

#[test]
fn session_ids_differ_between_connections() {
    let (a1, _) = establish(
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    let (a2, _) = establish(
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    assert_ne!(a1.session_id, a2.session_id);
    assert_ne!(a1.transcript, a2.transcript);
}

/// Handshake decoys (from `Config::decoys`) and data-phase decoys (from `SecureWriter::send_decoy`) never reach
/// the application, and do not disturb the packets around them.
#[test]
fn decoys_are_dropped_by_the_receiver() {
    let mut cfg = aes_config();
    cfg.decoys = vec![0, 1, 300, 4096];
    let (a, b) = establish(initiator(cfg.clone(), code()), responder(cfg, code()));
    let Established { sealer, .. } = a;
    let mut writer = SecureWriter::new(Vec::new(), sealer);
    let sent = [
        payload(1, 10),
        Vec::new(),
        payload(2, 70_000),
        payload(3, 1),
    ];
    writer.send_decoy(0).unwrap();
    for (i, p) in sent.iter().enumerate() {
        writer.send(p).unwrap();
        writer.send_decoy(i * 1000).unwrap();
    }
    writer.send_decoy(DEFAULT_MAX_PAYLOAD).unwrap();
    let wire = writer.close().unwrap();
    let mut reader = SecureReader::new(&wire[..], b.opener);
    for p in &sent {
        assert_eq!(reader.recv().unwrap().map(|d| d.to_vec()).as_ref(), Some(p));
    }
    assert!(reader.recv().unwrap().is_none(), "only the close remains");
}

/// Packets built in place (`send_built`) arrive in order with the others, a failed build sends nothing,
/// and a build larger than a packet may carry is refused.
#[test]
fn packets_built_in_place_arrive_in_order_and_failed_builds_send_nothing() {
    let (a, b) = establish(
        initiator(aes_config(), code()),
        responder(aes_config(), code()),
    );
    let mut writer = SecureWriter::new(Vec::new(), a.sealer);
    let first = payload(1, 17_000);
    writer.send(&payload(2, 10)).unwrap();
    let built = writer.send_built(20_000, |buf| {
        buf[..first.len()].copy_from_slice(&first);
        Ok::<_, ()>(first.len())
    });
    assert_eq!(built.unwrap(), Ok(()));
    let failed = writer.send_built(4096, |buf| {
        buf.fill(0xEE);
        Err("no")
    });
    assert_eq!(failed.unwrap(), Err("no"));
    assert!(writer
        .send_built(DEFAULT_MAX_PAYLOAD + 1, |_| Ok::<_, ()>(0))
        .is_err());
    writer.send(&payload(3, 5)).unwrap();
    let wire = writer.close().unwrap();
    let mut reader = SecureReader::new(&wire[..], b.opener);
    for p in [payload(2, 10), first, payload(3, 5)] {
        assert_eq!(reader.recv().unwrap().map(|d| d.to_vec()), Some(p));
    }
    assert!(reader.recv().unwrap().is_none(), "only the close remains");
}

/// The handshake keeps application bytes that arrive in the same read as its last message.
#[test]
fn data_arriving_with_the_last_handshake_message_is_kept() {
    let mut a = Handshake::new(Role::Initiator, aes_config(), Auth::Unauthenticated);
    let mut b = Handshake::new(Role::Responder, aes_config(), Auth::Unauthenticated);
    let (a_hello, b_hello) = (a.take_output(), b.take_output());
    b.feed(&a_hello).unwrap();
    a.feed(&b_hello).unwrap();
    a.feed(&b.take_output()).unwrap();
    // The responder gets the initiator's version packet and its first data packets in one read.
    let mut tail = a.take_output();
    let mut a = a
        .finish()
        .expect("an unauthenticated initiator is done after the version packet");
    tail.extend(seal_all(&mut a.sealer, &[payload(5, 33)], true));
    b.feed(&tail).unwrap();
    let mut b = b.finish().unwrap();
    let got = receive(&mut b.opener, &[], 1);
    assert_eq!(got.packets, vec![payload(5, 33)]);
    assert!(got.closed && got.error.is_none());
}

/// With a code, the SPAKE2 messages ride in the version packets: after the key shares cross, the initiator's
/// second flight (terminator, version with its PAKE message, confirmation) and the responder's answer
/// (its confirmation) finish the handshake. Version 1 needed one more round trip (the PAKE messages in
/// packets of their own after the version packets), and this test fails on such a handshake.
#[test]
fn a_code_handshake_takes_two_flights_each_way() {
    let mut a = initiator(aes_config(), code());
    let mut b = responder(aes_config(), code());
    // Flight 1: the initiator's key share (the responder's own goes out at accept, with its answer).
    b.feed(&a.take_output()).unwrap();
    // The responder's key share, terminator and version packet, with its PAKE message.
    a.feed(&b.take_output()).unwrap();
    assert!(
        a.attempt_charged(),
        "the responder's PAKE message came with its version"
    );
    // Flight 2: the initiator's terminator, version (with its PAKE message) and confirmation.
    b.feed(&a.take_output()).unwrap();
    assert!(b.is_done(), "the responder verified the confirmation");
    // The responder's confirmation.
    a.feed(&b.take_output()).unwrap();
    assert!(a.is_done());
    let (mut a, mut b) = (a.finish().unwrap(), b.finish().unwrap());
    assert_agree(&a, &b);
    assert_round_trip(&mut a, &mut b, &[payload(1, 100)]);
}

/// A flight padded with `pad_next_flight` has the size asked for (the terminator, decoys and version packet:
/// within one empty decoy's frame of it, never more), the peer drops the decoys, and the handshake ends as
/// without them. A request beyond `MAX_PAD` is cut to it.
#[test]
fn a_padded_flight_fills_what_was_asked_and_the_peer_drops_the_decoys() {
    for (pad, want) in [
        (0, None),
        (14_480, Some(14_480)),
        (5_000, Some(5_000)),
        (1 << 20, Some(MAX_PAD)),
    ] {
        let mut a = initiator(aes_config(), code());
        let mut b = responder(aes_config(), code());
        a.pad_next_flight(pad);
        b.pad_next_flight(pad);
        let a_share = a.take_output();
        let b_share = b.take_output();
        b.feed(&a_share).unwrap();
        let b_flight = b.take_output();
        a.feed(&b_share).unwrap();
        a.feed(&b_flight).unwrap();
        let a_flight = a.take_output();
        match want {
            None => assert!(b_flight.len() < 200, "unpadded: {} bytes", b_flight.len()),
            Some(want) => assert!(
                b_flight.len() <= want && b_flight.len() + frame_len(0) > want,
                "asked {want}, the flight took {}",
                b_flight.len()
            ),
        }
        // The initiator's flight also carries its confirmation after the padded part.
        assert!(a_flight.len() >= want.unwrap_or(0).saturating_sub(frame_len(0)));
        b.feed(&a_flight).unwrap();
        assert!(b.is_done());
        a.feed(&b.take_output()).unwrap();
        assert!(a.is_done());
        let (mut a, mut b) = (a.finish().unwrap(), b.finish().unwrap());
        assert_agree(&a, &b);
        assert_round_trip(&mut a, &mut b, &[payload(1, 100), payload(2, 70_000)]);
    }
}

/// Reads at most `step` bytes per call, so packets arrive cut at every kind of place.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// A larger packet size agreed after the handshake carries packets past the default maximum, which a
/// reader still at the default refuses; a reader that takes large packets' buffers hands over each one
/// whole, in order with the small packets between them, whether reads bring several packets at once or cut
/// them anywhere.
#[test]
fn a_raised_packet_size_carries_large_packets_and_taken_buffers_hold_them_whole() {
    let raised = DEFAULT_MAX_PAYLOAD + (32 << 10);
    let sizes = [
        10,
        raised,
        3,
        DEFAULT_MAX_PAYLOAD,
        70_000,
        65_535,
        raised,
        raised,
        0,
        100_000,
        5,
    ];
    let wire_of = || {
        let (a, b) = establish(
            initiator(aes_config(), code()),
            responder(aes_config(), code()),
        );
        let mut writer = SecureWriter::new(Vec::new(), a.sealer);
        writer.set_max_payload(raised);
        for (i, &len) in sizes.iter().enumerate() {
            writer.send(&payload(i, len)).unwrap();
        }
        (writer.close().unwrap(), b.opener)
    };
    for step in [usize::MAX, 1 << 20, 70_001, 4093] {
        let (wire, opener) = wire_of();
        let mut reader = SecureReader::new(Trickle { data: &wire, step }, opener);
        reader.set_max_payload(raised);
        let mut taken = 0;
        for (i, &len) in sizes.iter().enumerate() {
            let got = reader
                .recv_taking(1 << 16, |n| vec![0xAB; n])
                .unwrap()
                .expect("a packet");
            let want = payload(i, len);
            match got {
                Received::Borrowed(p) => {
                    assert!(len < 1 << 16, "packet {i} of {len} bytes borrowed");
                    assert_eq!(p, &want[..], "packet {i}, reads of {step}");
                }
                Received::Taken { buf, contents } => {
                    assert!(len >= 1 << 16, "packet {i} of {len} bytes taken");
                    assert_eq!(&buf[contents], &want[..], "packet {i}, reads of {step}");
                    taken += 1;
                }
            }
        }
        assert_eq!(taken, 6);
        assert!(reader
            .recv_taking(1 << 16, |n| vec![0; n])
            .unwrap()
            .is_none());
    }
    // A reader that did not raise its size refuses the first large packet.
    let (wire, opener) = wire_of();
    let mut reader = SecureReader::new(&wire[..], opener);
    assert_eq!(reader.recv().unwrap().map(|d| d.len()), Some(10));
    assert!(matches!(
        reader.recv(),
        Err(ferry_channel::ChannelError::Oversized { len, max })
            if len == raised && max == DEFAULT_MAX_PAYLOAD
    ));
}
