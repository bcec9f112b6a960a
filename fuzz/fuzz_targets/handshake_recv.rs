//! Arbitrary bytes into a responder's handshake with a fixed configuration. The first input byte picks how far a
//! valid initiator gets before the fuzzer's bytes take over:
//! - raw: the fuzzer's bytes are the whole stream (key share, garbage, terminator search);
//! - after the terminator: a valid opening, then raw bytes (packet lengths, tags, limits);
//! - version: a valid opening and a version packet whose contents are the fuzzer's, sealed with the real keys
//!   (offer parsing, suite choice, the switch to the suite keys), then raw bytes.
//!
//! The handshake must never panic, and must never finish: the fuzzer cannot authenticate.
#![no_main]

use ferry_channel::{Auth, Role};
use ferry_channel_fuzz::{handshake, initiator_opening};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let mut stream = Vec::new();
    let mut rest = data;
    if mode % 3 != 0 {
        let (opening, mut sealer) = initiator_opening();
        stream.extend_from_slice(&opening);
        if mode % 3 == 2 {
            let n =
                usize::from(rest.first().copied().unwrap_or(0)).min(rest.len().saturating_sub(1));
            let contents = rest.get(1..1 + n).unwrap_or(&[]);
            sealer
                .seal_into(&mut stream, 0, contents)
                .expect("small packet");
            rest = &rest[(1 + n).min(rest.len())..];
        }
    }
    stream.extend_from_slice(rest);

    let mut hs = handshake(Role::Responder, Auth::Code(b"7-fuzz-code".to_vec()));
    // Feed in pieces whose size the mode byte also varies, to cover partial input.
    let piece = usize::from(mode / 3) * 7 + 1;
    for chunk in stream.chunks(piece) {
        if hs.feed(chunk).is_err() {
            assert!(
                hs.feed(b"more").is_err(),
                "a failed handshake accepts nothing more"
            );
            break;
        }
    }
    let _ = hs.take_output();
    let _ = hs.eof_error();
    assert!(!hs.is_done(), "the fuzzer cannot know the code");
});
