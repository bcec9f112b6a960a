//! Arbitrary bytes as a listener's control stream, read by both ends: the relay's (`ToRelay::decode`) and
//! the listener's (`FromRelay::decode`), each splitting messages off the front of its buffer as it does on
//! a socket. The first byte picks which end and how the bytes arrive (in pieces of 1 to 64 bytes).
//!
//! Neither decoder may panic; a message it splits off encodes to bytes that decode to it again (and for
//! `ToRelay`, to exactly the bytes it took); every prefix of a message is "need more bytes", never an error
//! nor another message; and a buffer as long as the longest message never waits for more (the ends' buffers
//! are that long, so a message that does not fit would stall the connection).
#![no_main]

use ferry_relay::protocol::{FromRelay, ToRelay, MAX_CONTROL_LEN, MAX_LISTEN_HASHES};
use ferry_wire::WireError;
use libfuzzer_sys::fuzz_target;

/// The longest message from the relay: `INCOMING`.
const MAX_FROM_RELAY: usize = 1 + 32 + 32;

type Decoded<T> = Result<Option<(T, usize)>, WireError>;

/// Reads `stream` arriving in pieces of `piece` bytes into a buffer of `cap` bytes, as the ends do, checking
/// each message with `check`; returns the messages.
fn read<T: Clone + PartialEq + std::fmt::Debug>(
    stream: &[u8],
    piece: usize,
    cap: usize,
    decode: impl Fn(&[u8]) -> Decoded<T>,
    encode: impl Fn(&T) -> Vec<u8>,
    exact: bool,
) -> Vec<T> {
    let mut got = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut rest = stream;
    loop {
        loop {
            match decode(&buf) {
                Ok(Some((msg, used))) => {
                    assert!(used > 0 && used <= buf.len() && used <= cap);
                    let again = encode(&msg);
                    assert_eq!(
                        decode(&again),
                        Ok(Some((msg.clone(), again.len()))),
                        "round trip"
                    );
                    if exact {
                        assert_eq!(again, buf[..used], "not canonical");
                    }
                    // Every short prefix, then a sample of the long ones (a set of 64 hashes is 2 KiB).
                    for cut in (0..used).filter(|c| *c < 40 || c % 31 == 0 || c + 1 == used) {
                        assert_eq!(decode(&buf[..cut]), Ok(None), "a prefix of a message");
                    }
                    buf.drain(..used);
                    got.push(msg);
                }
                Ok(None) => {
                    assert!(buf.len() < cap, "a full buffer waits for more");
                    break;
                }
                Err(_) => return got,
            }
        }
        if rest.is_empty() {
            return got;
        }
        let n = rest.len().min(piece).min(cap - buf.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, stream)) = input.split_first() else {
        return;
    };
    let piece = usize::from(mode >> 1) % 64 + 1;
    if mode & 1 == 0 {
        for msg in read(
            stream,
            piece,
            MAX_CONTROL_LEN,
            ToRelay::decode,
            ToRelay::encode,
            true,
        ) {
            if let ToRelay::SetHashes(h) = msg {
                assert!(h.len() <= MAX_LISTEN_HASHES);
            }
        }
    } else {
        read(
            stream,
            piece,
            MAX_FROM_RELAY,
            FromRelay::decode,
            FromRelay::encode,
            false,
        );
    }
});
