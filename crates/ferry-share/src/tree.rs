//! Verified ranges: each file version is identified by its BLAKE3 root hash (the same hash as `b3sum` and as
//! ferry's transfers), and every piece of a read carries the proof that ties its bytes to that root.
//!
//! The tree is BLAKE3's own, with the lower levels pruned into groups of [`GROUP`] bytes (8 KiB, bao-tree's
//! chunk groups): the sharer keeps an outboard of the tree's parent hashes above the groups (64 bytes per
//! group, 0.78 % of the file), and a piece is a group-aligned range: every parent hash bao's pre-order
//! encoding of the range has (from the root down to it and inside it), in that order, then all its data in
//! one run (bao interleaves them; one run is verified where it lies and handed on without a copy). A client
//! that knows a version's root verifies a piece without any other state, so pieces can arrive in any order
//! and interleaved with other requests.
//!
//! The size of a version is bound to its root only through the tree's shape: a piece from the middle of a
//! file can verify under a claimed size that differs in its last groups. A client that reports or relies
//! on a size (end of file, `ferry pull`'s completion) verifies the last group first ([`last_group`]).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bao_tree::io::sync::{OutboardMut, ReadAt};
use bao_tree::iter::BaoChunk;
use bao_tree::{BaoTree, BlockSize, ChunkNum, ChunkRanges, TreeNode};

/// log2 of the chunks (1 KiB) in a group: 8 KiB groups, chosen by measurement (docs/ARCHITECTURE.md,
/// "Verified ranges").
pub const GROUP_CHUNK_LOG: u8 = 3;
/// Bytes in a group: the smallest verifiable unit.
pub const GROUP: u64 = 1024 << GROUP_CHUNK_LOG;
/// Bytes of one parent node (two hashes) in an outboard and in a piece.
const PAIR: u64 = 64;

fn block_size() -> BlockSize {
    BlockSize::from_chunk_log(GROUP_CHUNK_LOG)
}

fn tree_of(size: u64) -> BaoTree {
    BaoTree::new(size, block_size())
}

/// A file version: what a read is verified against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3 root hash of the content.
    pub root: [u8; 32],
}

/// Bytes of the outboard of a file of `size` bytes.
pub fn outboard_len(size: u64) -> u64 {
    tree_of(size).outboard_size()
}

/// The parent hashes of one version's tree (pre-order, 64 bytes per parent), kept by the sharer: in memory,
/// or in a file read node by node (`pread`) as pieces need them. Cloning shares the storage.
#[derive(Debug, Clone)]
pub struct Outboard {
    version: Version,
    tree: BaoTree,
    store: Store,
}

#[derive(Debug, Clone)]
enum Store {
    Memory(Arc<Vec<u8>>),
    File { file: Arc<File>, offset: u64 },
}

impl Outboard {
    /// Hashes `size` bytes of `data` into an outboard in memory.
    pub fn compute(data: impl io::Read, size: u64) -> io::Result<Outboard> {
        let tree = tree_of(size);
        let mut bytes = MemOut(vec![0; tree.outboard_size() as usize], tree);
        let root = bao_tree::io::sync::outboard(data, tree, &mut bytes)?;
        let version = Version {
            size,
            root: *root.as_bytes(),
        };
        Ok(Outboard::from_parts(version, bytes.0).expect("sized for its tree"))
    }

    /// Hashes `size` bytes of `data` into `file` from `offset` (the outboard's bytes, [`outboard_len`] of
    /// them); returns the version. Memory stays bounded whatever the size: parents are written in sorted
    /// batches.
    pub fn compute_into(
        data: impl io::Read,
        size: u64,
        file: &File,
        offset: u64,
    ) -> io::Result<Version> {
        let tree = tree_of(size);
        let mut out = FileOut {
            file,
            offset,
            tree,
            batch: Vec::with_capacity(BATCH),
        };
        let root = bao_tree::io::sync::outboard(data, tree, &mut out)?;
        out.flush()?;
        Ok(Version {
            size,
            root: *root.as_bytes(),
        })
    }

    /// An outboard held in memory; `None` when `bytes` cannot be the outboard of such a version.
    pub fn from_parts(version: Version, bytes: Vec<u8>) -> Option<Outboard> {
        let tree = tree_of(version.size);
        (bytes.len() as u64 == tree.outboard_size()).then(|| Outboard {
            version,
            tree,
            store: Store::Memory(Arc::new(bytes)),
        })
    }

    /// An outboard read from `file` at `offset` as pieces need it (the caller checked the file holds
    /// [`outboard_len`] bytes there).
    pub fn from_file(version: Version, file: Arc<File>, offset: u64) -> Outboard {
        Outboard {
            version,
            tree: tree_of(version.size),
            store: Store::File { file, offset },
        }
    }

    /// The version it describes.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Its bytes when held in memory.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.store {
            Store::Memory(b) => Some(b),
            Store::File { .. } => None,
        }
    }

    /// Bytes of memory it holds (0 when read from a file).
    pub fn memory(&self) -> u64 {
        self.as_bytes().map_or(0, |b| b.len() as u64)
    }

    /// Whether a clone of it is in use elsewhere.
    pub fn is_shared(&self) -> bool {
        match &self.store {
            Store::Memory(b) => Arc::strong_count(b) > 1,
            Store::File { file, .. } => Arc::strong_count(file) > 1,
        }
    }

    fn pair(&self, node: TreeNode) -> io::Result<Option<[u8; 64]>> {
        let Some(at) = self.tree.pre_order_offset(node) else {
            return Ok(None);
        };
        let at = at * PAIR;
        let mut pair = [0u8; 64];
        match &self.store {
            Store::Memory(b) => pair.copy_from_slice(
                b.get(at as usize..(at + PAIR) as usize)
                    .ok_or_else(|| io::Error::other("outboard too short"))?,
            ),
            Store::File { file, offset } => {
                FileExt::read_exact_at(&**file, &mut pair, offset + at)?
            }
        }
        Ok(Some(pair))
    }
}

/// Parents gathered before they are written to a file outboard (1 MiB; a few in tests, to test batches).
const BATCH: usize = if cfg!(test) { 64 } else { 16 << 10 };

/// An outboard being computed in memory.
struct MemOut(Vec<u8>, BaoTree);

impl OutboardMut for MemOut {
    fn save(&mut self, node: TreeNode, pair: &(Hash, Hash)) -> io::Result<()> {
        if let Some(at) = self.1.pre_order_offset(node) {
            let at = (at * PAIR) as usize;
            self.0[at..at + 32].copy_from_slice(pair.0.as_bytes());
            self.0[at + 32..at + 64].copy_from_slice(pair.1.as_bytes());
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An outboard being computed into a file: the hashing saves parents in post-order, their places are in
/// pre-order, so they are gathered, sorted and written in runs of neighbours.
struct FileOut<'a> {
    file: &'a File,
    offset: u64,
    tree: BaoTree,
    batch: Vec<(u64, [u8; 64])>,
}

impl FileOut<'_> {
    fn flush(&mut self) -> io::Result<()> {
        self.batch.sort_unstable_by_key(|(at, _)| *at);
        let mut run: Vec<u8> = Vec::with_capacity(self.batch.len() * PAIR as usize);
        let mut start = 0;
        for (at, pair) in self.batch.drain(..) {
            if !run.is_empty() && start + run.len() as u64 != at {
                self.file.write_all_at(&run, self.offset + start)?;
                run.clear();
            }
            if run.is_empty() {
                start = at;
            }
            run.extend_from_slice(&pair);
        }
        if !run.is_empty() {
            self.file.write_all_at(&run, self.offset + start)?;
        }
        Ok(())
    }
}

impl OutboardMut for FileOut<'_> {
    fn save(&mut self, node: TreeNode, pair: &(Hash, Hash)) -> io::Result<()> {
        if let Some(at) = self.tree.pre_order_offset(node) {
            let mut bytes = [0u8; 64];
            bytes[..32].copy_from_slice(pair.0.as_bytes());
            bytes[32..].copy_from_slice(pair.1.as_bytes());
            self.batch.push((at * PAIR, bytes));
            if self.batch.len() >= BATCH {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.flush()
    }
}

type Hash = bao_tree::blake3::Hash;

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

/// Bytes of the piece for `range` of a version of `size` bytes: its parent hashes and its data.
pub fn piece_len(size: u64, range: &Range<u64>) -> u64 {
    if range.is_empty() {
        return 0;
    }
    let tree = tree_of(size);
    let parents = tree
        .ranges_pre_order_chunks_iter_ref(&chunks(range), 0)
        .filter(|c| matches!(c, BaoChunk::Parent { .. }))
        .count() as u64;
    parents * PAIR + (range.end - range.start)
}

/// Writes the piece for `range` (group-aligned, inside the file: from [`covering`]) into the front of `out`:
/// the parent hashes on its path, then its data read from `data` straight into place. Returns its length
/// ([`piece_len`]). It does not re-hash the data: a sharer whose file changed under its outboard sends bytes
/// that fail the client's check, never bytes that pass.
pub fn encode_piece_into(
    data: impl ReadAt,
    outboard: &Outboard,
    range: Range<u64>,
    out: &mut [u8],
) -> io::Result<usize> {
    let place = lay_out_piece(outboard, &range, out)?;
    data.read_exact_at(range.start, &mut out[place.clone()])?;
    Ok(place.end)
}

/// [`encode_piece_into`] from a file: the piece's data lies in one run after its parents, so it is read
/// with one `pread` straight into place.
pub fn encode_piece_from_file(
    file: &File,
    outboard: &Outboard,
    range: Range<u64>,
    out: &mut [u8],
) -> io::Result<usize> {
    let place = lay_out_piece(outboard, &range, out)?;
    FileExt::read_exact_at(file, &mut out[place.clone()], range.start)?;
    Ok(place.end)
}

/// Writes the parents of the piece for `range` at the front of `out`, in pre-order, and returns where its
/// data goes: right after them, in one run, up to the piece's end. Data in one run is what lets a client
/// verify a piece where it lies and hand its bytes on without copying them out from between parents.
fn lay_out_piece(
    outboard: &Outboard,
    range: &Range<u64>,
    out: &mut [u8],
) -> io::Result<Range<usize>> {
    let size = outboard.version.size;
    if !is_piece_range(size, range) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "piece range is not group-aligned inside the file",
        ));
    }
    if range.is_empty() {
        return Ok(0..0);
    }
    let short = || io::Error::new(io::ErrorKind::InvalidInput, "piece buffer too small");
    let mut at = 0usize;
    for item in outboard
        .tree
        .ranges_pre_order_chunks_iter_ref(&chunks(range), 0)
    {
        if let BaoChunk::Parent { node, .. } = item {
            let place = out.get_mut(at..at + PAIR as usize).ok_or_else(short)?;
            place.copy_from_slice(
                &outboard
                    .pair(node)?
                    .ok_or_else(|| io::Error::other("outboard misses a parent"))?,
            );
            at += PAIR as usize;
        }
    }
    let end = at + (range.end - range.start) as usize;
    if end > out.len() {
        return Err(short());
    }
    Ok(at..end)
}

/// Appends the piece for `range` to `out` ([`encode_piece_into`] for a growing buffer).
pub fn encode_piece(
    data: impl ReadAt,
    outboard: &Outboard,
    range: Range<u64>,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let mark = out.len();
    let len = if is_piece_range(outboard.version.size, &range) {
        piece_len(outboard.version.size, &range) as usize
    } else {
        0
    };
    out.resize(mark + len, 0);
    let r = encode_piece_into(data, outboard, range, &mut out[mark..]);
    if r.is_err() {
        out.truncate(mark);
    }
    r.map(|_| ())
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
    verify_piece_cvs(version, range, piece, out, &mut Vec::new())
}

/// A group's BLAKE3 chaining value at its place in its version's tree; for a one-group file the root hash
/// itself (BLAKE3 has no non-root value for the whole input).
pub type GroupCv = [u8; 32];

/// [`verify_piece`], also appending to `cvs` the value ([`GroupCv`]) of every group of the piece, in order:
/// each group is hashed once, to verify it, and a cache that keeps these values to check its copy later
/// need not hash the bytes again. Nothing is appended to either unless the whole piece verifies.
pub fn verify_piece_cvs(
    version: &Version,
    range: Range<u64>,
    piece: &[u8],
    out: &mut Vec<u8>,
    cvs: &mut Vec<GroupCv>,
) -> Result<(), VerifyError> {
    let data = verify_piece_in_place(version, range, piece, cvs)?;
    out.extend_from_slice(&piece[data]);
    Ok(())
}

/// [`verify_piece_cvs`] without copying: verifies the piece where it lies and returns where its data is in
/// `piece` (after the parents, in one run), so that a caller that owns the piece's buffer hands the bytes on
/// as they are. Nothing is appended to `cvs` unless the whole piece verifies.
pub fn verify_piece_in_place(
    version: &Version,
    range: Range<u64>,
    piece: &[u8],
    cvs: &mut Vec<GroupCv>,
) -> Result<Range<usize>, VerifyError> {
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
            Ok(0..0)
        } else {
            Err(VerifyError::Length)
        };
    }
    if range.is_empty() {
        return if piece.is_empty() {
            Ok(0..0)
        } else {
            Err(VerifyError::Length)
        };
    }
    let cv_mark = cvs.len();
    let r = decode(version, range, piece, cvs);
    if r.is_err() {
        cvs.truncate(cv_mark);
    }
    r
}

/// Walks the piece in the tree's pre-order as bao's decoder does: every parent pair (read in turn from the
/// piece's front) must hash to the value its own parent gave (the root first), and each group's value is
/// the one its parent gave; the groups' data, the piece's last bytes in one run, is then hashed where it
/// lies, in blocks ([`verify_groups`]). Returns where the data is.
fn decode(
    version: &Version,
    range: Range<u64>,
    piece: &[u8],
    cvs: &mut Vec<GroupCv>,
) -> Result<Range<usize>, VerifyError> {
    use bao_tree::blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, Mode};
    let tree = tree_of(version.size);
    let data_len = (range.end - range.start) as usize;
    let data_at = piece
        .len()
        .checked_sub(data_len)
        .ok_or(VerifyError::Length)?;
    let (parents, data) = piece.split_at(data_at);
    let mut expected_values: Vec<GroupCv> = Vec::with_capacity(64);
    expected_values.push(version.root);
    let mut at = 0usize;
    let mut expected = range.start;
    let cvs_from = cvs.len();
    let mut one_group_file = false;
    for item in tree.ranges_pre_order_chunks_iter_ref(&chunks(&range), 0) {
        match item {
            BaoChunk::Parent {
                is_root,
                left,
                right,
                ..
            } => {
                let pair = parents.get(at..at + 64).ok_or(VerifyError::Length)?;
                at += 64;
                let l: GroupCv = pair[..32].try_into().expect("32 bytes");
                let r: GroupCv = pair[32..].try_into().expect("32 bytes");
                let value = if is_root {
                    *merge_subtrees_root(&l, &r, Mode::Hash).as_bytes()
                } else {
                    merge_subtrees_non_root(&l, &r, Mode::Hash)
                };
                if expected_values.pop() != Some(value) {
                    return Err(VerifyError::Mismatch);
                }
                if right {
                    expected_values.push(r);
                }
                if left {
                    expected_values.push(l);
                }
            }
            BaoChunk::Leaf {
                start_chunk,
                size,
                is_root,
                ..
            } => {
                if start_chunk.to_bytes() != expected {
                    return Err(VerifyError::Mismatch);
                }
                let value = expected_values.pop().ok_or(VerifyError::Mismatch)?;
                one_group_file |= is_root;
                cvs.push(value);
                expected += size as u64;
            }
        }
    }
    if expected != range.end || at != parents.len() {
        return Err(VerifyError::Length);
    }
    let values = &cvs[cvs_from..];
    if one_group_file {
        // The whole file is one group: its value is the root hash itself.
        return match *bao_tree::blake3::hash(data).as_bytes() == version.root {
            true => Ok(data_at..piece.len()),
            false => Err(VerifyError::Mismatch),
        };
    }
    verify_groups(range.start, data, values)?;
    Ok(data_at..piece.len())
}

/// Most groups hashed at once: a piece's whole data (BLAKE3 hashes 16 chunks side by side with AVX-512, and
/// one group is only 8).
const HASH_BLOCK_GROUPS: u64 = 128;

/// Checks that the groups of `data` (from `start`, group-aligned; a short group only at the end of the
/// file) have the values `values`, which the parents above them vouched for. The data is hashed in the
/// largest aligned power-of-two blocks of groups, each block as one BLAKE3 subtree, and compared with its
/// groups' values merged: BLAKE3's collision resistance makes a block's match worth its every group's.
fn verify_groups(start: u64, data: &[u8], values: &[GroupCv]) -> Result<(), VerifyError> {
    use bao_tree::blake3::hazmat::{merge_subtrees_non_root, HasherExt, Mode};
    let first = start / GROUP;
    let mut g = 0usize;
    while g < values.len() {
        let at = first + g as u64;
        let mut n = 1u64;
        while n < HASH_BLOCK_GROUPS
            && at.is_multiple_of(n * 2)
            && g as u64 + n * 2 <= values.len() as u64
        {
            n *= 2;
        }
        let n = n as usize;
        let from = g * GROUP as usize;
        let to = ((g + n) * GROUP as usize).min(data.len());
        let hashed = bao_tree::blake3::Hasher::new()
            .set_input_offset(at * GROUP)
            .update(data.get(from..to).ok_or(VerifyError::Length)?)
            .finalize_non_root();
        // The block's groups merged pairwise up to the block's own value.
        let mut level: Vec<GroupCv> = values[g..g + n].to_vec();
        while level.len() > 1 {
            level = level
                .chunks_exact(2)
                .map(|p| merge_subtrees_non_root(&p[0], &p[1], Mode::Hash))
                .collect();
        }
        if level[0] != hashed {
            return Err(VerifyError::Mismatch);
        }
        g += n;
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
            let again =
                Outboard::from_parts(ob.version(), ob.as_bytes().unwrap().to_vec()).unwrap();
            assert_eq!(again.version(), ob.version());
            assert!(
                Outboard::from_parts(ob.version(), vec![0; ob.as_bytes().unwrap().len() + 64])
                    .is_none()
            );
        }
    }

    #[test]
    fn a_piece_read_from_a_file_is_the_piece_read_from_memory() {
        let t = ferry_testkit::temp_dir("ferry-tree-");
        let path = t.path().join("data");
        // 9 MiB + a short last group: ranges of one group up to the whole file.
        let len = (9 << 20) + 5000;
        let d = data(len);
        std::fs::write(&path, &d).unwrap();
        let file = File::open(&path).unwrap();
        let ob = Outboard::compute(&d[..], len as u64).unwrap();
        let size = len as u64;
        for range in [
            0..GROUP,
            GROUP..5 * GROUP,
            0..1 << 20,
            (3 << 20) + GROUP..(4 << 20),
            (8 << 20)..size,
            0..size,
        ] {
            let want_len = piece_len(size, &range) as usize;
            let mut want = vec![0u8; want_len];
            let mut got = vec![0u8; want_len];
            assert_eq!(
                encode_piece_into(&d[..], &ob, range.clone(), &mut want).unwrap(),
                want_len
            );
            assert_eq!(
                encode_piece_from_file(&file, &ob, range.clone(), &mut got).unwrap(),
                want_len
            );
            assert!(want == got, "range {range:?}");
            let (mut bytes, mut cvs) = (Vec::new(), Vec::new());
            verify_piece_cvs(&ob.version(), range.clone(), &got, &mut bytes, &mut cvs).unwrap();
            assert_eq!(bytes, d[range.start as usize..range.end as usize]);
        }
        // A file cut shorter than its version fails the read instead of sending zeros.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(size - 100)
            .unwrap();
        let range = (8 << 20)..size;
        let mut got = vec![0u8; piece_len(size, &range) as usize];
        let e = encode_piece_from_file(&file, &ob, range, &mut got).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // A buffer too small for the piece is refused before anything is read.
        let mut small = vec![0u8; 100];
        assert!(encode_piece_from_file(&file, &ob, 0..GROUP, &mut small).is_err());
    }

    #[test]
    fn an_outboard_hashed_into_a_file_is_the_one_in_memory() {
        let t = ferry_testkit::temp_dir("ferry-tree-");
        // Enough groups that the parents are written in several sorted batches.
        for len in [
            0usize,
            5000,
            3 * GROUP as usize + 1,
            (3 * BATCH + 77) * GROUP as usize,
        ] {
            let d = data(len);
            let mem = Outboard::compute(&d[..], len as u64).unwrap();
            let file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(t.path().join("ob"))
                .unwrap();
            let version = Outboard::compute_into(&d[..], len as u64, &file, 10).unwrap();
            assert_eq!(version, mem.version());
            let mut stored = vec![0u8; outboard_len(len as u64) as usize];
            FileExt::read_exact_at(&file, &mut stored, 10).unwrap();
            assert_eq!(stored, mem.as_bytes().unwrap(), "len {len}");
            let from_file = Outboard::from_file(version, Arc::new(file), 10);
            let range = covering(len as u64, len as u64 / 2, 4096);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            encode_piece(&d[..], &mem, range.clone(), &mut a).unwrap();
            encode_piece(&d[..], &from_file, range.clone(), &mut b).unwrap();
            assert_eq!(a, b);
            assert_eq!(a.len() as u64, piece_len(len as u64, &range));
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
            let want = &d[range.start as usize..range.end as usize];
            assert_eq!(out, want);
            // The data is the piece's tail, in one run, and verifies where it lies.
            assert_eq!(&piece[piece.len() - want.len()..], want);
            let mut cvs = Vec::new();
            let at = verify_piece_in_place(&v, range.clone(), &piece, &mut cvs).unwrap();
            assert_eq!(at, piece.len() - want.len()..piece.len());
            assert_eq!(cvs.len() as u64, (range.end - range.start).div_ceil(GROUP));
        }
        let last = last_group(v.size);
        assert_eq!(last, 5 * GROUP..len as u64);
    }

    /// Each group's value computed on its own, as a cache hashing the group again would.
    fn group_value(size: u64, g: u64, bytes: &[u8]) -> GroupCv {
        use blake3::hazmat::HasherExt;
        if size <= GROUP {
            return *blake3::hash(bytes).as_bytes();
        }
        blake3::Hasher::new()
            .set_input_offset(g * GROUP)
            .update(bytes)
            .finalize_non_root()
    }

    #[test]
    fn a_verified_piece_gives_the_value_of_each_of_its_groups() {
        let g = GROUP as usize;
        // One group, a lone right-edge group (odd counts), a short last group, deeper trees.
        for len in [
            1,
            1024,
            g,
            g + 1,
            2 * g,
            3 * g,
            3 * g + 5,
            5 * g + 777,
            37 * g + 1,
        ] {
            let d = data(len);
            let ob = Outboard::compute(&d[..], len as u64).unwrap();
            let v = ob.version();
            let groups = v.size.div_ceil(GROUP);
            for (first, n) in [(0, groups), (0, 1), (groups - 1, 1), (groups / 2, 3)] {
                let range = covering(v.size, first * GROUP, n * GROUP);
                let mut piece = Vec::new();
                encode_piece(&d[..], &ob, range.clone(), &mut piece).unwrap();
                let (mut out, mut cvs) = (Vec::new(), vec![[7; 32]]);
                verify_piece_cvs(&v, range.clone(), &piece, &mut out, &mut cvs).unwrap();
                let want: Vec<GroupCv> = std::iter::once([7; 32])
                    .chain(
                        d[range.start as usize..range.end as usize]
                            .chunks(g)
                            .enumerate()
                            .map(|(i, b)| group_value(v.size, range.start / GROUP + i as u64, b)),
                    )
                    .collect();
                assert_eq!(cvs, want, "len {len} range {range:?}");
                assert_eq!(out, &d[range.start as usize..range.end as usize]);
            }
        }
    }

    #[test]
    fn a_bad_value_or_a_bad_byte_gives_no_values() {
        let len = 5 * GROUP as usize + 3;
        let d = data(len);
        let ob = Outboard::compute(&d[..], len as u64).unwrap();
        let v = ob.version();
        let range = covering(v.size, 0, v.size);
        let mut piece = Vec::new();
        encode_piece(&d[..], &ob, range.clone(), &mut piece).unwrap();
        let parents = piece.len() - len;
        // A group's value in its parent's pair (the last parent holds two groups' values), and a byte of
        // each group.
        let bad_spots = [parents - 64, parents - 1]
            .into_iter()
            .chain((0..6).map(|i| parents + i * GROUP as usize));
        for at in bad_spots {
            let mut bad = piece.clone();
            bad[at] ^= 0x10;
            let (mut out, mut cvs) = (vec![1], vec![[1; 32]]);
            assert_eq!(
                verify_piece_cvs(&v, range.clone(), &bad, &mut out, &mut cvs),
                Err(VerifyError::Mismatch),
                "byte {at}"
            );
            assert_eq!((out, cvs), (vec![1], vec![[1; 32]]), "nothing appended");
        }
    }

    #[test]
    fn a_bad_byte_in_any_group_of_a_large_piece_is_caught() {
        // Groups are hashed in blocks of up to HASH_BLOCK_GROUPS: a piece not aligned to a block, longer
        // than one, ending in a short group, with a byte flipped in each group in turn.
        let g = GROUP as usize;
        let len = 300 * g + 4321;
        let d = data(len);
        let ob = Outboard::compute(&d[..], len as u64).unwrap();
        let v = ob.version();
        let range = covering(v.size, 3 * GROUP, v.size);
        let mut piece = Vec::new();
        encode_piece(&d[..], &ob, range.clone(), &mut piece).unwrap();
        let (mut out, mut cvs) = (Vec::new(), Vec::new());
        verify_piece_cvs(&v, range.clone(), &piece, &mut out, &mut cvs).unwrap();
        assert_eq!(out, &d[range.start as usize..]);
        let data_at = piece.len() - out.len();
        let groups = out.len().div_ceil(g);
        for i in 0..groups {
            let mut bad = piece.clone();
            // The group's data sits among the parents in pre-order: find it by content.
            let group = &out[i * g..((i + 1) * g).min(out.len())];
            let at = (data_at.saturating_sub(groups * 64)..piece.len())
                .find(|&p| piece[p..].starts_with(group))
                .unwrap();
            bad[at + group.len() / 2] ^= 0x01;
            let (mut o, mut c) = (Vec::new(), Vec::new());
            assert_eq!(
                verify_piece_cvs(&v, range.clone(), &bad, &mut o, &mut c),
                Err(VerifyError::Mismatch),
                "group {i}"
            );
            assert!(o.is_empty() && c.is_empty());
        }
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
