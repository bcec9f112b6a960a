//! The record of one version on disk: which groups are present, each one's value, and the entry's last use.
//!
//! Layout (little-endian): magic `FRYCACH1`, size u64, root 32 bytes, last use u64, run count u64; per run its
//! first group u64, its length u64 and one 32-byte value per group; then BLAKE3 of everything before. A
//! record that is short, long, unsorted, out of its file's range or whose hash does not match is damaged:
//! the caller treats it as empty (the data is fetched again), never trusts part of it.

use ferry_share::tree::Version;

use crate::groups::{Cv, Groups};
use crate::verify::group_count;

const MAGIC: &[u8; 8] = b"FRYCACH1";
const HEADER: usize = 8 + 8 + 32 + 8 + 8;
const RUN: usize = 16;
const TRAILER: usize = 32;

/// What a record holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// Present groups and their values.
    pub(crate) groups: Groups,
    /// The entry's last use (the cache's logical clock).
    pub(crate) last_use: u64,
}

/// The largest record a version can have: every group its own run.
pub(crate) fn max_len(version: &Version) -> u64 {
    group_count(version.size)
        .saturating_mul((RUN + 32) as u64)
        .saturating_add((HEADER + TRAILER) as u64)
}

/// The bytes of `groups` and `last_use` for `version`.
pub(crate) fn encode(version: &Version, groups: &Groups, last_use: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        HEADER + TRAILER + groups.run_count() * RUN + groups.count() as usize * 32,
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&version.size.to_le_bytes());
    out.extend_from_slice(&version.root);
    out.extend_from_slice(&last_use.to_le_bytes());
    out.extend_from_slice(&(groups.run_count() as u64).to_le_bytes());
    for (first, cvs) in groups.runs() {
        out.extend_from_slice(&first.to_le_bytes());
        out.extend_from_slice(&(cvs.len() as u64).to_le_bytes());
        for cv in cvs {
            out.extend_from_slice(cv);
        }
    }
    let sum = *blake3::hash(&out).as_bytes();
    out.extend_from_slice(&sum);
    out
}

/// The record of `version` in `bytes`; `None` when damaged.
pub(crate) fn decode(version: &Version, bytes: &[u8]) -> Option<Record> {
    if bytes.len() < HEADER + TRAILER || bytes.len() as u64 > max_len(version) {
        return None;
    }
    let (body, sum) = bytes.split_at(bytes.len() - TRAILER);
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    let mut r = Reader(body);
    if r.take(8)? != MAGIC || r.u64()? != version.size || r.take(32)? != version.root {
        return None;
    }
    let last_use = r.u64()?;
    let runs = r.u64()?;
    let groups_in_file = group_count(version.size);
    let mut groups = Groups::default();
    let mut next_free = 0u64;
    for _ in 0..runs {
        let first = r.u64()?;
        let len = r.u64()?;
        let end = first.checked_add(len)?;
        if len == 0 || first < next_free || end > groups_in_file {
            return None;
        }
        let cvs: Vec<Cv> = r
            .take(usize::try_from(len).ok()?.checked_mul(32)?)?
            .chunks_exact(32)
            .map(|c| c.try_into().expect("32 bytes"))
            .collect();
        groups.insert(first, &cvs);
        next_free = end;
    }
    r.0.is_empty().then_some(Record { groups, last_use })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_share::tree::GROUP;

    #[test]
    fn a_record_round_trips_and_any_damage_is_refused() {
        let version = Version {
            size: 10 * GROUP + 3,
            root: [7; 32],
        };
        let mut groups = Groups::default();
        groups.insert(1, &[[1; 32], [2; 32]]);
        groups.insert(5, &[[5; 32]]);
        groups.insert(10, &[[10; 32]]);
        let bytes = encode(&version, &groups, 42);
        let back = decode(&version, &bytes).unwrap();
        assert_eq!(back.groups, groups);
        assert_eq!(back.last_use, 42);
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert_eq!(decode(&version, &bad), None, "byte {at}");
        }
        for len in 0..bytes.len() {
            assert_eq!(decode(&version, &bytes[..len]), None, "cut at {len}");
        }
        let other = Version {
            size: version.size + 1,
            ..version
        };
        assert_eq!(decode(&other, &bytes), None);
        assert_eq!(
            decode(&version, &encode(&version, &Groups::default(), 1)),
            Some(Record {
                groups: Groups::default(),
                last_use: 1
            })
        );
    }

    #[test]
    fn a_well_hashed_record_out_of_its_files_range_is_refused() {
        let version = Version {
            size: 2 * GROUP,
            root: [7; 32],
        };
        let mut groups = Groups::default();
        groups.insert(1, &[[1; 32], [2; 32]]);
        // Group 2 does not exist in a file of two groups.
        let big = Version {
            size: 4 * GROUP,
            ..version
        };
        let mut bytes = encode(&big, &groups, 0);
        bytes[8..16].copy_from_slice(&version.size.to_le_bytes());
        let body = bytes.len() - TRAILER;
        let sum = *blake3::hash(&bytes[..body]).as_bytes();
        bytes[body..].copy_from_slice(&sum);
        assert_eq!(decode(&version, &bytes), None);
    }
}
