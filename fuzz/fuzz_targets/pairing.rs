//! Arbitrary bytes as the peer's pairing message, after a (fixed) channel handshake. The first byte picks the
//! mode: raw (the fuzzer's bytes are the message) or edited (a genuine message from the fixed peer, with bytes
//! the fuzzer flips, cuts or appends).
//!
//! `PairingMessage::decode` must never panic and is canonical (what it accepts encodes to the same bytes);
//! the name it yields always sanitizes to a valid peer name; and `Pairing::finish` accepts exactly the
//! genuine message: nothing the fuzzer changed verifies.
#![no_main]

use std::sync::OnceLock;

use ferry_channel::{IdentityKey, Role};
use ferry_peers::pairing::{Pairing, PairingMessage, MAX_MESSAGE, MAX_SUGGESTED_NAME};
use ferry_peers::PeerName;
use libfuzzer_sys::fuzz_target;

const TRANSCRIPT: [u8; 32] = [0x5a; 32];

/// Our side (the responder) and the genuine message of the peer (the initiator), for one transcript.
fn fixture() -> &'static (Pairing, Vec<u8>) {
    static F: OnceLock<(Pairing, Vec<u8>)> = OnceLock::new();
    F.get_or_init(|| {
        let ours = Pairing::new(
            Role::Responder,
            TRANSCRIPT,
            &IdentityKey::from_seed([1; 32]),
            "responder",
        );
        let theirs = Pairing::new(
            Role::Initiator,
            TRANSCRIPT,
            &IdentityKey::from_seed([2; 32]),
            "the initiator's laptop",
        );
        (ours, theirs.message().encode())
    })
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let (ours, genuine) = fixture();
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        // Edits: (position, xor) pairs; a last lone byte cuts (high bit clear) or appends that many bytes.
        let mut bytes = genuine.clone();
        let mut edits = rest.chunks_exact(2);
        for e in &mut edits {
            let at = usize::from(e[0]) % bytes.len().max(1);
            if let Some(b) = bytes.get_mut(at) {
                *b ^= e[1];
            }
        }
        if let [n] = edits.remainder() {
            match n & 0x80 {
                0 => bytes.truncate(bytes.len().saturating_sub(usize::from(*n))),
                _ => bytes.extend(std::iter::repeat_n(*n, usize::from(n & 0x7f))),
            }
        }
        bytes
    };
    let Ok(msg) = PairingMessage::decode(&bytes) else {
        return;
    };
    assert!(bytes.len() <= MAX_MESSAGE);
    assert!(msg.name.len() <= MAX_SUGGESTED_NAME);
    assert_eq!(msg.encode(), bytes, "not canonical");
    let sanitized = PeerName::sanitized(&msg.name);
    assert!(PeerName::new(sanitized.as_str()).is_ok(), "{sanitized:?}");
    match ours.finish(&msg) {
        Ok(paired) => {
            assert_eq!(&bytes, genuine, "a message the fuzzer changed was accepted");
            assert_eq!(paired.peer_key, msg.key);
        }
        Err(_) => assert_ne!(&bytes, genuine, "the genuine message was refused"),
    }
});
