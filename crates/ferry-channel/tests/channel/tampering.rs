//! Flipping any single byte of a recorded session — key share, garbage, terminator, or the length, header,
//! contents or tag of a decoy, the version packet, an authentication packet, a data packet or the close — makes
//! the receiver fail, and never makes it deliver contents other than what was sent.
//!
//! Identity authentication is deterministic (Ed25519 signatures), so a session with fixed keys and garbage can be
//! recorded once and each direction replayed into a fresh copy of its receiver. SPAKE2 is randomised, so code
//! sessions are tampered with in flight instead.

use ferry_channel::{Config, Role};

use crate::common::*;

const SEED_A: u8 = 11;
const SEED_B: u8 = 22;
const GARBAGE_A: usize = 9;
const GARBAGE_B: usize = 21;
const DECOY: usize = 5;
/// Contents of the identity message: type byte, public key, signature.
const IDENTITY_MSG: usize = 1 + 32 + 64;
const DATA_SIZES: [usize; 3] = [0, 1, 40];

fn recorded_config() -> Config {
    let mut c = aes_config();
    // A small maximum keeps each replay's buffers small; framing and crypto are the same.
    c.max_payload = 4096;
    c.decoys = vec![DECOY];
    c
}

/// The deterministic side `role` of the recorded session.
fn side(role: Role) -> ferry_channel::Handshake {
    match role {
        Role::Initiator => {
            fixed_handshake(role, recorded_config(), pinned(1, 2), SEED_A, GARBAGE_A)
        }
        Role::Responder => {
            fixed_handshake(role, recorded_config(), pinned(2, 1), SEED_B, GARBAGE_B)
        }
    }
}

/// One direction of a recorded session.
struct Recorded {
    /// The side that receives this stream.
    receiver: Role,
    stream: Vec<u8>,
    data: Vec<Vec<u8>>,
    layout: Layout,
}

/// Records a full session: handshake, three data packets and a close each way.
fn record() -> [Recorded; 2] {
    let mut streams = [Vec::new(), Vec::new()];
    let (a, b) = drive_via(side(Role::Initiator), side(Role::Responder), |d, bytes| {
        streams[d as usize].extend_from_slice(&bytes);
        bytes
    });
    let (mut a, mut b) = (
        a.expect("recorded initiator"),
        b.expect("recorded responder"),
    );
    assert_agree(&a, &b);
    let [mut to_b, mut to_a] = streams;
    let data = |salt: usize| -> Vec<Vec<u8>> {
        DATA_SIZES.iter().map(|&n| payload(salt + n, n)).collect()
    };
    let (a_data, b_data) = (data(100), data(200));
    to_b.extend(seal_all(&mut a.sealer, &a_data, true));
    to_a.extend(seal_all(&mut b.sealer, &b_data, true));
    [
        Recorded::new(Role::Responder, to_b, a_data, GARBAGE_A),
        Recorded::new(Role::Initiator, to_a, b_data, GARBAGE_B),
    ]
}

impl Recorded {
    fn new(receiver: Role, stream: Vec<u8>, data: Vec<Vec<u8>>, garbage: usize) -> Self {
        let mut layout = Layout::default();
        layout
            .opening(garbage)
            .frame("handshake decoy", DECOY)
            .frame("version", 3)
            .frame("identity", IDENTITY_MSG);
        for (i, d) in data.iter().enumerate() {
            layout.frame(&format!("data {i}"), d.len());
        }
        layout.frame("close", 0);
        assert_eq!(
            layout.total(),
            stream.len(),
            "the layout must describe the recording exactly"
        );
        Recorded {
            receiver,
            stream,
            data,
            layout,
        }
    }

    /// Feeds `stream` into a fresh copy of the receiver, to the end of file.
    fn replay(&self, stream: &[u8]) -> Received {
        let mut hs = side(self.receiver);
        let err = hs.feed(stream).err();
        match settle(hs, err) {
            Ok(mut est) => receive(&mut est.opener, &[], usize::MAX),
            Err(e) => Received {
                error: Some(e),
                ..Received::default()
            },
        }
    }
}

#[test]
fn untouched_recording_replays_exactly() {
    for rec in record() {
        let got = rec.replay(&rec.stream);
        assert!(
            got.error.is_none(),
            "{:?} replay failed: {:?}",
            rec.receiver,
            got.error
        );
        assert!(got.closed);
        assert_eq!(got.packets, rec.data);
    }
}

#[test]
fn every_flipped_byte_of_a_recorded_session_is_an_error() {
    for rec in record() {
        for region in &rec.layout.regions {
            for at in region.range.clone() {
                let mut stream = rec.stream.clone();
                stream[at] ^= 1 << (at % 8);
                let got = rec.replay(&stream);
                let what = format!("{:?} receiving, {} byte {at}", rec.receiver, region.name);
                assert!(got.error.is_some(), "{what}: accepted");
                for (i, p) in got.packets.iter().enumerate() {
                    assert_eq!(p, &rec.data[i], "{what}: packet {i} delivered altered");
                }
            }
        }
    }
}

/// A wire hook that flips one byte at `offset` of direction `dir`'s stream.
fn flip_at(dir: Dir, offset: usize) -> impl FnMut(Dir, Vec<u8>) -> Vec<u8> {
    let mut seen = 0;
    move |d, mut bytes| {
        if d == dir {
            if (seen..seen + bytes.len()).contains(&offset) {
                bytes[offset - seen] ^= 0x20;
            }
            seen += bytes.len();
        }
        bytes
    }
}

#[test]
fn tampering_a_code_handshake_in_flight_fails_it() {
    const GARBAGE: usize = 12;
    // SPAKE2 message (in the version packet): type byte and 33 bytes; confirmation: type byte and 32 bytes.
    let mut layout = Layout::default();
    layout
        .opening(GARBAGE)
        .frame("version and PAKE", 3 + 34)
        .frame("confirmation", 33);
    let cfg = || config(aes_config().suites, true, GARBAGE);
    // Control: untouched, the handshake succeeds and each direction is exactly the layout.
    let mut lens = [0, 0];
    let (a, b) = drive_via(
        initiator(cfg(), code()),
        responder(cfg(), code()),
        |d, bytes| {
            lens[d as usize] += bytes.len();
            bytes
        },
    );
    assert!(a.is_ok() && b.is_ok());
    assert_eq!(lens, [layout.total(); 2]);
    for dir in [Dir::AtoB, Dir::BtoA] {
        for region in &layout.regions {
            let r = &region.range;
            for at in [r.start, (r.start + r.end) / 2, r.end - 1] {
                let (a, b) = drive_via(
                    initiator(cfg(), code()),
                    responder(cfg(), code()),
                    flip_at(dir, at),
                );
                let receiver = if dir == Dir::AtoB {
                    b.is_err()
                } else {
                    a.is_err()
                };
                assert!(
                    receiver,
                    "{dir:?} {} byte {at}: receiver accepted",
                    region.name
                );
            }
        }
    }
}

/// A public key of small order proves nobody: with R = the key and S = 0 its "signature" verifies for a share
/// of all messages without any secret (found by the `pairing` fuzz target for the all-zero key), so it is
/// refused whatever it signs, in pairing and in the handshake's identity check alike.
#[test]
fn a_signature_by_a_key_of_small_order_proves_nothing() {
    let mut weak: Vec<[u8; 32]> = Vec::new();
    for first in [0u8, 1] {
        let mut k = [0u8; 32];
        k[0] = first;
        weak.push(k);
    }
    for first in [0xecu8, 0xed, 0xee] {
        let mut k = [0xffu8; 32];
        k[0] = first;
        k[31] = 0x7f;
        weak.push(k);
    }
    weak.push(*b"\x26\xe8\x95\x8f\xc2\xb2\x27\xb0\x45\xc3\xf4\x89\xf2\xef\x98\xf0\xd5\xdf\xac\x05\xd3\xc6\x33\x39\xb1\x38\x02\x88\x6d\x53\xfc\x05");
    weak.push(*b"\xc7\x17\x6a\x70\x3d\x4d\xd8\x4f\xba\x3c\x0b\x76\x0d\x10\x67\x0f\x2a\x20\x53\xfa\x2c\x39\xcc\xc6\x4e\xc7\xfd\x77\x92\xac\x03\x7a");
    for key in weak {
        for sign in [0u8, 0x80] {
            let mut key = key;
            key[31] |= sign;
            let mut signature = [0u8; 64];
            signature[..32].copy_from_slice(&key);
            for m in 0..=255u8 {
                assert!(
                    !ferry_channel::verify_signature(&key, &[m; 7], &signature),
                    "key {key:02x?}, message {m}"
                );
            }
        }
    }
    // An ordinary key still verifies its own signature.
    let key = identity(1);
    assert!(ferry_channel::verify_signature(
        &key.public(),
        b"m",
        &key.sign(b"m")
    ));
}
