//! Arbitrary bytes as what a mount's cache directory holds (a tampered directory is input too): the record of
//! a version and the names of the cache's files. The first byte picks the mode:
//! - record: the fuzzer's bytes are a record's body for the version it names, and the target appends their
//!   BLAKE3 (else nothing gets past the hash);
//! - laid out: the fuzzer's bytes are a size, a last use and runs (first group, length); the target lays
//!   them out as the record format says, with the magic and the hash, so that most inputs reach the runs;
//! - raw record: the fuzzer's bytes are the whole record, hash included;
//! - name: the fuzzer's bytes are a file name in the directory.
//!
//! Decoding must never panic; a record it accepts encodes again to canonical bytes that decode to
//! themselves and are no longer than the input; a name it accepts is the cache's own (made from its
//! version).
#![no_main]

use ferry_cache::fuzzing;
use ferry_share::tree::Version;
use libfuzzer_sys::fuzz_target;

/// The version a record's body names (size at 8, root at 16), if it is long enough.
fn named(body: &[u8]) -> Option<Version> {
    Some(Version {
        size: u64::from_le_bytes(body.get(8..16)?.try_into().ok()?),
        root: body.get(16..48)?.try_into().ok()?,
    })
}

fn check_record(version: &Version, bytes: &[u8]) {
    if let Some(again) = fuzzing::record(version, bytes) {
        assert!(again.len() <= bytes.len(), "re-encoded longer");
        assert_eq!(
            fuzzing::record(version, &again).as_deref(),
            Some(&again[..]),
            "round trip"
        );
    }
}

/// A record body from `size u32 (in 4 KiB), last use u8, then runs of (first u8, length u8)`, laid out as
/// `record.rs` documents: magic, size, root, last use, run count, per run its first group, its length and
/// one 32-byte value per group.
fn laid_out(input: &[u8]) -> Option<Vec<u8>> {
    let (head, runs) = input.split_at_checked(5)?;
    let size = u64::from(u32::from_le_bytes(head[..4].try_into().ok()?)) << 12;
    let mut body = b"FRYCACH1".to_vec();
    body.extend_from_slice(&size.to_le_bytes());
    body.extend_from_slice(&[7; 32]);
    body.extend_from_slice(&u64::from(head[4]).to_le_bytes());
    let runs = runs.chunks_exact(2);
    body.extend_from_slice(&(runs.len() as u64).to_le_bytes());
    for (i, run) in runs.enumerate() {
        let (first, len) = (u64::from(run[0]), u64::from(run[1] % 8));
        body.extend_from_slice(&first.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        for g in 0..len {
            body.extend_from_slice(&[(i as u64 * 8 + g) as u8; 32]);
        }
    }
    Some(body)
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    match mode % 4 {
        0 | 1 => {
            let body = match mode % 4 {
                0 => rest.to_vec(),
                _ => match laid_out(rest) {
                    Some(body) => body,
                    None => return,
                },
            };
            let Some(version) = named(&body) else {
                return;
            };
            let mut bytes = body.clone();
            bytes.extend_from_slice(blake3::hash(&body).as_bytes());
            check_record(&version, &bytes);
        }
        2 => {
            if let Some(version) = named(rest) {
                check_record(&version, rest);
            }
        }
        _ => {
            let Ok(name) = std::str::from_utf8(rest) else {
                return;
            };
            if let Some((version, kind)) = fuzzing::name(name) {
                assert_eq!(name, format!("{}.{kind}", fuzzing::base_name(&version)));
            }
        }
    }
});
