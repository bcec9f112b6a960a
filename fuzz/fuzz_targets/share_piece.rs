//! A sharer's pieces (the `DATA` payload: parent hashes, then the bytes) against the client's verifier, for a
//! fixed file of four groups and a tail. The first byte picks the mode:
//! - raw: the fuzzer's bytes are the piece for a range it picks;
//! - tampered: the genuine piece for the range, with bytes the fuzzer flips, cut or appended;
//! - another root: the genuine piece, verified against a root with one bit the fuzzer picks flipped.
//!
//! The verifier must never panic, and must accept exactly the bytes of the file: a piece that verifies
//! yields the file's bytes for its range and one value per group; a changed piece never verifies.
#![no_main]

use std::ops::Range;
use std::sync::OnceLock;

use ferry_share::tree::{self, Outboard, Version, GROUP};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    data: Vec<u8>,
    outboard: Outboard,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let data: Vec<u8> = (0..4 * GROUP + 1000)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let outboard = Outboard::compute(&data[..], data.len() as u64).expect("outboard");
        Fixture { data, outboard }
    })
}

/// A range from two fuzzer bytes: as a client asks (`covering` an offset and a length) for most values,
/// raw (possibly unaligned) otherwise.
fn range(size: u64, a: u8, b: u8) -> Range<u64> {
    let (a, b) = (u64::from(a), u64::from(b));
    if a < 240 {
        tree::covering(size, a * size / 240, b * 256)
    } else {
        (b * 131)..(b * 131 + (a - 240) * 3001)
    }
}

fuzz_target!(|input: &[u8]| {
    let [mode, a, b, rest @ ..] = input else {
        return;
    };
    let f = fixture();
    let version = f.outboard.version();
    let range = range(version.size, *a, *b);
    let mut genuine = Vec::new();
    let aligned = tree::encode_piece(&f.data[..], &f.outboard, range.clone(), &mut genuine).is_ok();
    let (claimed, piece, changed) = match mode % 3 {
        0 => (
            version,
            rest.to_vec(),
            !aligned || rest != genuine.as_slice(),
        ),
        1 => {
            // Edits: (position u16, xor u8) triples; a last lone byte or two cuts or extends the piece.
            let mut piece = genuine.clone();
            let mut edits = rest.chunks_exact(3);
            for e in &mut edits {
                if !piece.is_empty() {
                    let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % piece.len();
                    piece[at] ^= e[2];
                }
            }
            match edits.remainder() {
                [cut] => piece.truncate(piece.len().saturating_sub(usize::from(*cut))),
                [grow, byte] => piece.extend(std::iter::repeat_n(*byte, usize::from(*grow))),
                _ => {}
            }
            let changed = !aligned || piece != genuine;
            (version, piece, changed)
        }
        _ => {
            let bit = usize::from(rest.first().copied().unwrap_or(0));
            let mut root = version.root;
            root[bit / 8 % 32] ^= 1 << (bit % 8);
            // An empty range carries no bytes, so there is nothing for the root to refuse.
            let changed = !(aligned && range.is_empty());
            (Version { root, ..version }, genuine, changed)
        }
    };
    let mut out = Vec::new();
    let mut cvs = Vec::new();
    match tree::verify_piece_cvs(&claimed, range.clone(), &piece, &mut out, &mut cvs) {
        Ok(()) => {
            assert!(!changed, "a changed piece verified ({range:?})");
            assert_eq!(out, f.data[range.start as usize..range.end as usize]);
            assert_eq!(cvs.len() as u64, (range.end - range.start).div_ceil(GROUP));
        }
        Err(_) => {
            assert!(changed, "the genuine piece was refused ({range:?})");
            assert!(
                out.is_empty() && cvs.is_empty(),
                "a refused piece left output"
            );
        }
    }
});
