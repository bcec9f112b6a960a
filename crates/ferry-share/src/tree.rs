//! Verified ranges: each file version is identified by its BLAKE3 root hash (the same hash as `b3sum` and as
//! ferry's transfers), and every piece of a read carries the proof that ties its bytes to that root.
//!
//! The tree is BLAKE3's own, with the lower levels pruned into groups of [`GROUP`] bytes (16 KiB, bao-tree's
//! chunk groups): the sharer keeps an outboard of the tree's parent hashes above the groups (64 bytes per
//! group, 0.39 % of the file), and a piece is a group-aligned range: the parent hashes from the root down
//! to it, in pre-order, then its data (bao's encoding). A client that knows a version's root verifies a
//! piece without any other state, so pieces can arrive in any order and interleaved with other requests.
//!
//! The size of a version is bound to its root only through the tree's shape: a piece from the middle of a
//! file can verify under a claimed size that differs in its last groups. A client that reports or relies
//! on a size (end of file, `ferry pull`'s completion) verifies the last group first ([`last_group`]).

use std::io;
use std::ops::Range;

use bao_tree::io::outboard::PreOrderOutboard;
use bao_tree::io::sync::{encode_ranges, CreateOutboard, DecodeResponseIter, ReadAt, Size};
use bao_tree::io::BaoContentItem;
use bao_tree::{BaoTree, BlockSize, ChunkNum, ChunkRanges};

/// log2 of the chunks (1 KiB) in a group.
pub const GROUP_CHUNK_LOG: u8 = 4;
/// Bytes in a group: the smallest verifiable unit.
pub const GROUP: u64 = 1024 << GROUP_CHUNK_LOG;

fn block_size() -> BlockSize {
    BlockSize::from_chunk_log(GROUP_CHUNK_LOG)
}

/// A file version: what a read is verified against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3 root hash of the content.
    pub root: [u8; 32],
}

/// The parent hashes of one version's tree, kept by the sharer.
#[derive(Debug, Clone)]
pub struct Outboard(PreOrderOutboard<Vec<u8>>);

impl Outboard {
    /// Hashes `size` bytes of `data` into an outboard.
    pub fn compute(data: impl io::Read, size: u64) -> io::Result<Outboard> {
        PreOrderOutboard::<Vec<u8>>::create_sized(data, size, block_size()).map(Outboard)
    }

    /// An outboard read back from storage; `None` when `bytes` cannot be the outboard of such a version.
    pub fn from_parts(version: Version, bytes: Vec<u8>) -> Option<Outboard> {
        let tree = BaoTree::new(version.size, block_size());
        (bytes.len() as u64 == tree.outboard_size()).then(|| {
            Outboard(PreOrderOutboard {
                root: blake3_hash(version.root),
                tree,
                data: bytes,
            })
        })
    }

    /// The version it describes.
    pub fn version(&self) -> Version {
        Version {
            size: self.0.tree.size(),
            root: *self.0.root.as_bytes(),
        }
    }

    /// Its bytes, to store.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0.data
    }
}

fn blake3_hash(bytes: [u8; 32]) -> bao_tree::blake3::Hash {
    bao_tree::blake3::Hash::from_bytes(bytes)
}

/// The groups that cover `[offset, offset + len)`, cut at `size`: the byte range a piece for it spans.
pub fn covering(size: u64, offset: u64, len: u64) -> Range<u64> {
    let end = offset.saturating_add(len).min(size);
    let start = (offset.min(end) / GROUP) * GROUP;
    let end = end.div_ceil(GROUP).saturating_mul(GROUP).min(size);
    start..end
}

/// The range of the last group of a version of `size` bytes (empty for an empty file).
pub fn last_group(size: u64) -> Range<u64> {
    covering(size, size.saturating_sub(1), 1)
}

/// Whether a piece may cover `range` in a file of `size` bytes: it starts on a group and ends on one or at
/// the end of the file.
fn is_piece_range(size: u64, range: &Range<u64>) -> bool {
    range.start.is_multiple_of(GROUP)
        && range.start <= range.end
        && range.end <= size
        && (range.end.is_multiple_of(GROUP) || range.end == size)
}

fn chunks(range: &Range<u64>) -> ChunkRanges {
    ChunkRanges::from(ChunkNum(range.start / 1024)..ChunkNum(range.end.div_ceil(1024)))
}

/// Appends the piece for `range` (group-aligned, inside the file: from [`covering`]) to `out`: the parent
/// hashes on its path, then its data read from `data`. It does not re-hash the data: a sharer whose file
/// changed under its outboard sends bytes that fail the client's check, never bytes that pass.
pub fn encode_piece(
    data: impl ReadAt + Size,
    outboard: &Outboard,
    range: Range<u64>,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let size = outboard.0.tree.size();
    if !is_piece_range(size, &range) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "piece range is not group-aligned inside the file",
        ));
    }
    if range.is_empty() && size != 0 {
        return Ok(());
    }
    encode_ranges(data, &outboard.0, &chunks(&range), out).map_err(io::Error::other)
}

/// A piece that does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The piece's bytes or proof do not match the version's root.
    #[error("the data does not match its version's hash")]
    Mismatch,
    /// The piece is shorter or longer than its range needs.
    #[error("the piece has the wrong length")]
    Length,
    /// The range is not one a piece may cover.
    #[error("the piece's range is not group-aligned inside the file")]
    Range,
}

/// Verifies a piece for `range` (group-aligned, as [`covering`] gives) against `version` and appends its
/// data, verified, to `out`. Nothing is appended unless the whole piece verifies.
pub fn verify_piece(
    version: &Version,
    range: Range<u64>,
    piece: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), VerifyError> {
    let size = version.size;
    if !is_piece_range(size, &range) {
        return Err(VerifyError::Range);
    }
    if size == 0 {
        // Nothing to prove but the root itself: an empty file has one.
        if version.root != *bao_tree::blake3::hash(&[]).as_bytes() {
            return Err(VerifyError::Mismatch);
        }
        return if piece.is_empty() {
            Ok(())
        } else {
            Err(VerifyError::Length)
        };
    }
    let tree = BaoTree::new(size, block_size());
    let ranges = chunks(&range);
    let mut reader = piece;
    let mark = out.len();
    let mut expected = range.start;
    let items = DecodeResponseIter::new(blake3_hash(version.root), tree, &mut reader, &ranges);
    for item in items {
        match item {
            Ok(BaoContentItem::Leaf(leaf)) => {
                if leaf.offset != expected {
                    out.truncate(mark);
                    return Err(VerifyError::Mismatch);
                }
                expected += leaf.data.len() as u64;
                out.extend_from_slice(&leaf.data);
            }
            Ok(BaoContentItem::Parent(_)) => {}
            Err(bao_tree::io::DecodeError::LeafNotFound(_))
            | Err(bao_tree::io::DecodeError::ParentNotFound(_)) => {
                out.truncate(mark);
                return Err(VerifyError::Length);
            }
            Err(_) => {
                out.truncate(mark);
                return Err(VerifyError::Mismatch);
            }
        }
    }
    if expected != range.end.max(range.start) || !reader.is_empty() {
        out.truncate(mark);
        return Err(VerifyError::Length);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        ferry_testkit::pseudo_random(len, 0x2545f4914f6cdd1d)
    }

    #[test]
    fn the_root_is_blake3_of_the_content() {
        for len in [
            0,
            1,
            1024,
            GROUP as usize,
            GROUP as usize + 1,
            1 << 20,
            3_000_007,
        ] {
            let d = data(len);
            let ob = Outboard::compute(&d[..], len as u64).unwrap();
            assert_eq!(ob.version().root, *blake3::hash(&d).as_bytes(), "len {len}");
            let again = Outboard::from_parts(ob.version(), ob.as_bytes().to_vec()).unwrap();
            assert_eq!(again.version(), ob.version());
            assert!(
                Outboard::from_parts(ob.version(), vec![0; ob.as_bytes().len() + 64]).is_none()
            );
        }
    }

    #[test]
    fn every_piece_verifies_and_gives_exactly_its_bytes() {
        let len = 5 * GROUP as usize + 777;
        let d = data(len);
        let ob = Outboard::compute(&d[..], len as u64).unwrap();
        let v = ob.version();
        for (offset, want) in [
            (0u64, 1u64),
            (4096, 4096),
            (GROUP - 1, 2),
            (3 * GROUP, 10_000_000),
            (0, u64::MAX),
        ] {
            let range = covering(v.size, offset, want);
            let mut piece = Vec::new();
            encode_piece(&d[..], &ob, range.clone(), &mut piece).unwrap();
            let mut out = Vec::new();
            verify_piece(&v, range.clone(), &piece, &mut out).unwrap();
            assert_eq!(out, &d[range.start as usize..range.end as usize]);
        }
        let last = last_group(v.size);
        assert_eq!(last, 5 * GROUP..len as u64);
    }

    #[test]
    fn a_flipped_bit_anywhere_or_a_cut_is_caught() {
        let len = 4 * GROUP as usize;
        let d = data(len);
        let ob = Outboard::compute(&d[..], len as u64).unwrap();
        let v = ob.version();
        let range = covering(v.size, GROUP, GROUP);
        let mut piece = Vec::new();
        encode_piece(&d[..], &ob, range.clone(), &mut piece).unwrap();
        // Parent hashes first, then data: flip a bit in each part.
        for at in [0, 40, piece.len() - GROUP as usize, piece.len() - 1] {
            let mut bad = piece.clone();
            bad[at] ^= 1;
            let mut out = vec![1, 2, 3];
            assert_eq!(
                verify_piece(&v, range.clone(), &bad, &mut out),
                Err(VerifyError::Mismatch),
                "bit at {at}"
            );
            assert_eq!(out, [1, 2, 3], "nothing appended");
        }
        let mut out = Vec::new();
        assert_eq!(
            verify_piece(&v, range.clone(), &piece[..piece.len() - 1], &mut out),
            Err(VerifyError::Length)
        );
        let mut long = piece.clone();
        long.push(0);
        assert_eq!(
            verify_piece(&v, range.clone(), &long, &mut out),
            Err(VerifyError::Length)
        );
        // The right bytes under another version's root, or another range's label.
        let other = Version { root: [0; 32], ..v };
        assert_eq!(
            verify_piece(&other, range.clone(), &piece, &mut out),
            Err(VerifyError::Mismatch)
        );
        assert!(verify_piece(&v, 2 * GROUP..3 * GROUP, &piece, &mut out).is_err());
        assert_eq!(
            verify_piece(&v, 1..GROUP, &piece, &mut out),
            Err(VerifyError::Range)
        );
        assert!(out.is_empty());
    }

    #[test]
    fn data_changed_under_the_outboard_never_verifies() {
        let len = 3 * GROUP as usize;
        let d = data(len);
        let ob = Outboard::compute(&d[..], len as u64).unwrap();
        let mut changed = d.clone();
        changed[GROUP as usize + 5] ^= 0xff;
        let range = covering(len as u64, GROUP, 1);
        let mut piece = Vec::new();
        encode_piece(&changed[..], &ob, range.clone(), &mut piece).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            verify_piece(&ob.version(), range, &piece, &mut out),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn a_lie_about_the_size_shows_in_the_last_group() {
        let len = 3 * GROUP as usize;
        let d = data(len);
        let ob = Outboard::compute(&d[..], len as u64).unwrap();
        let truth = ob.version();
        let mut out = Vec::new();
        for claimed in [
            truth.size - 1,
            truth.size + 1,
            truth.size + GROUP,
            4 * GROUP,
        ] {
            let lie = Version {
                size: claimed,
                ..truth
            };
            // Whatever the sharer sends as the last group under the lie, it does not verify.
            let range = last_group(claimed);
            let honest = covering(truth.size, range.start, range.end - range.start);
            let mut piece = Vec::new();
            encode_piece(&d[..], &ob, honest, &mut piece).unwrap();
            assert!(
                verify_piece(&lie, range, &piece, &mut out).is_err(),
                "claimed {claimed}"
            );
        }
        assert!(out.is_empty());
    }
}
