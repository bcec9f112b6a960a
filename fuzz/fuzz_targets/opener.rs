//! Arbitrary bytes into the opener of a completed in-memory session. With an even first byte the fuzzer's bytes
//! are the stream itself, cut into pieces; with an odd one they are the plaintexts of genuine packets (and a
//! close), one byte of whose stream is then flipped at a fuzzer-chosen place: every packet delivered must be
//! exactly one that was sent, in order, and a flipped stream must never be accepted to its end.
#![no_main]

use ferry_channel::{Opener, Packet, HEADER_CLOSE};
use ferry_channel_fuzz::established;
use libfuzzer_sys::fuzz_target;

/// Feeds `wire` in pieces of `piece` bytes; returns the packets delivered and whether the stream was accepted
/// whole (no error, closed, clean end of file).
fn receive(opener: &mut Opener, wire: &[u8], piece: usize) -> (Vec<Vec<u8>>, bool) {
    let mut got = Vec::new();
    let mut rest = wire;
    loop {
        loop {
            match opener.next() {
                Ok(Some(Packet::Data(d))) => got.push(d.to_vec()),
                Ok(Some(Packet::Close)) => {}
                Ok(None) => break,
                Err(_) => return (got, false),
            }
        }
        if rest.is_empty() {
            return (got, opener.check_eof().is_ok());
        }
        let n = opener.feed(&rest[..rest.len().min(piece)]);
        assert!(
            n > 0,
            "the opener must take bytes when it has nothing to deliver"
        );
        rest = &rest[n..];
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let (mut a, mut b) = established();
    let piece = usize::from(mode >> 1) * 97 + 1;
    if mode & 1 == 0 {
        let _ = receive(&mut b.opener, data, piece);
        return;
    }
    // Plaintexts: each is a length byte and that many bytes; the first two bytes pick the flipped position.
    let (flip, mut rest) = match data {
        [hi, lo, rest @ ..] => (usize::from(*hi) << 8 | usize::from(*lo), rest),
        _ => return,
    };
    let mut sent = Vec::new();
    let mut wire = Vec::new();
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        a.sealer
            .seal_into(&mut wire, 0, &tail[..n])
            .expect("small packet");
        sent.push(tail[..n].to_vec());
        rest = &tail[n..];
    }
    a.sealer
        .seal_into(&mut wire, HEADER_CLOSE, &[])
        .expect("close");
    let flipped = flip < wire.len();
    if flipped {
        wire[flip] ^= 0x01;
    }
    let (got, accepted) = receive(&mut b.opener, &wire, piece);
    assert!(
        got.len() <= sent.len() && got[..] == sent[..got.len()],
        "delivered something not sent"
    );
    assert_eq!(
        accepted, !flipped,
        "a flipped stream must fail, a genuine one must pass"
    );
});
