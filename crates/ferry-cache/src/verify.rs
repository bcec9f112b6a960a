//! The verification values of groups: BLAKE3 chaining values at their place in the version's tree (the
//! share protocol's tree: BLAKE3's own, in groups of [`GROUP`] bytes), and their combination into the root.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode,
};
use ferry_share::tree::{Version, GROUP};

use crate::disk::read_full;
use crate::groups::{Cv, Groups};

/// Groups in a version of `size` bytes.
pub(crate) fn group_count(size: u64) -> u64 {
    size.div_ceil(GROUP)
}

/// Bytes of groups `range` in a version of `size` bytes (the last group may be short).
pub(crate) fn span(size: u64, range: Range<u64>) -> u64 {
    range
        .end
        .saturating_mul(GROUP)
        .min(size)
        .saturating_sub(range.start.saturating_mul(GROUP))
}

/// The value of group `g` holding `bytes`, in a version of `size` bytes: its chaining value, or the root
/// hash itself when the file is one group (BLAKE3 has no non-root value for the whole input).
pub(crate) fn group_cv(size: u64, g: u64, bytes: &[u8]) -> Cv {
    if size <= GROUP {
        return *blake3::hash(bytes).as_bytes();
    }
    blake3::Hasher::new()
        .set_input_offset(g * GROUP)
        .update(bytes)
        .finalize_non_root()
}

/// Bytes of the groups present.
pub(crate) fn present_bytes(version: &Version, groups: &Groups) -> u64 {
    groups
        .runs()
        .map(|(first, cvs)| span(version.size, first..first + cvs.len() as u64))
        .sum()
}

/// Groups read and hashed at once when checking present data again (1 MiB).
const BATCH: u64 = 64;
/// Present bytes below which one thread checks them all.
const PARALLEL_FROM: u64 = 8 << 20;

/// The present groups of `groups` whose bytes in `file` (a version of `size` bytes) no longer hash to their
/// values, in order; groups the file is too short for count as such. Large entries are hashed on every
/// core (scoped threads, each reading its own 1 MiB batches).
pub(crate) fn hash_again(file: &File, size: u64, groups: &Groups) -> io::Result<Vec<u64>> {
    let mut batches: Vec<(u64, &[Cv])> = Vec::new();
    for (first, cvs) in groups.runs() {
        for (i, part) in cvs.chunks(BATCH as usize).enumerate() {
            batches.push((first + i as u64 * BATCH, part));
        }
    }
    let threads = if groups.count() * GROUP < PARALLEL_FROM {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
    };
    let next = AtomicUsize::new(0);
    let bad = Mutex::new(Vec::new());
    let work = || -> io::Result<()> {
        let mut buf = vec![0u8; (BATCH * GROUP) as usize];
        let mut mine = Vec::new();
        while let Some((g, cvs)) = batches.get(next.fetch_add(1, Ordering::Relaxed)) {
            let n = cvs.len() as u64;
            let got = read_full(file, &mut buf[..span(size, *g..g + n) as usize], g * GROUP)?;
            for (i, cv) in (0..n).zip(cvs.iter()) {
                let at = (i * GROUP) as usize;
                let len = span(size, g + i..g + i + 1) as usize;
                if at + len > got || group_cv(size, g + i, &buf[at..at + len]) != *cv {
                    mine.push(g + i);
                }
            }
        }
        bad.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
        Ok(())
    };
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut result = work();
        for h in helpers {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("hashing thread panicked")));
            result = result.and(r);
        }
        result
    })?;
    let mut bad = bad.into_inner().unwrap_or_else(|e| e.into_inner());
    bad.sort_unstable();
    Ok(bad)
}

/// The values of every group of `file`'s first `size` bytes, in order (one thread, 1 MiB reads); `None`
/// when the file is shorter.
pub(crate) fn hash_groups(file: &File, size: u64) -> io::Result<Option<Vec<Cv>>> {
    let n = group_count(size);
    let mut cvs = Vec::with_capacity(n as usize);
    let mut buf = vec![0u8; (BATCH * GROUP) as usize];
    let mut g = 0;
    while g < n {
        let batch = BATCH.min(n - g);
        let want = span(size, g..g + batch) as usize;
        if read_full(file, &mut buf[..want], g * GROUP)? < want {
            return Ok(None);
        }
        for i in 0..batch {
            let at = (i * GROUP) as usize;
            let len = span(size, g + i..g + i + 1) as usize;
            cvs.push(group_cv(size, g + i, &buf[at..at + len]));
        }
        g += batch;
    }
    Ok(Some(cvs))
}

/// Whether the values of every group of `version`, in order, combine to its root.
pub(crate) fn combines_to_root(version: &Version, cvs: &[Cv]) -> bool {
    if version.size == 0 {
        return cvs.is_empty() && version.root == *blake3::hash(&[]).as_bytes();
    }
    if cvs.len() as u64 != group_count(version.size) {
        return false;
    }
    if cvs.len() == 1 {
        return cvs[0] == version.root;
    }
    let (left, right) = split(cvs, version.size);
    let root = merge_subtrees_root(
        &subtree(left.0, left.1),
        &subtree(right.0, right.1),
        Mode::Hash,
    );
    *root.as_bytes() == version.root
}

type Part<'a> = (&'a [Cv], u64);

/// Splits the groups of a subtree of `len` bytes (more than one group) as BLAKE3 does: the left part is the
/// largest power of two of chunks below `len`, a whole number of groups since groups are 16 chunks.
fn split(cvs: &[Cv], len: u64) -> (Part<'_>, Part<'_>) {
    let left = left_subtree_len(len);
    let (l, r) = cvs.split_at((left / GROUP) as usize);
    ((l, left), (r, len - left))
}

fn subtree(cvs: &[Cv], len: u64) -> Cv {
    if cvs.len() == 1 {
        return cvs[0];
    }
    let (left, right) = split(cvs, len);
    merge_subtrees_non_root(
        &subtree(left.0, left.1),
        &subtree(right.0, right.1),
        Mode::Hash,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_share::tree::Outboard;

    fn cvs_of(data: &[u8]) -> Vec<Cv> {
        let size = data.len() as u64;
        (0..group_count(size))
            .map(|g| {
                let r = (g * GROUP) as usize..((g + 1) * GROUP).min(size) as usize;
                group_cv(size, g, &data[r])
            })
            .collect()
    }

    #[test]
    fn group_values_combine_to_the_share_protocols_root() {
        let g = GROUP as usize;
        // Every shape of tree up to 40 groups: whole groups, one byte more, one byte less.
        let lens = (0..=40).flat_map(|n| [n * g, n * g + 1, (n * g).saturating_sub(1)]);
        for len in lens.chain([1024]) {
            let data = ferry_testkit::pseudo_random(len, len as u64);
            let version = Outboard::compute(&data[..], len as u64).unwrap().version();
            let mut cvs = cvs_of(&data);
            assert!(combines_to_root(&version, &cvs), "len {len}");
            if let Some(c) = cvs.last_mut() {
                c[0] ^= 1;
                assert!(!combines_to_root(&version, &cvs), "len {len}");
            }
        }
    }

    #[test]
    fn spans_count_the_short_last_group() {
        assert_eq!(span(GROUP * 3 + 5, 0..4), GROUP * 3 + 5);
        assert_eq!(span(GROUP * 3 + 5, 3..4), 5);
        assert_eq!(span(GROUP * 3 + 5, 1..2), GROUP);
        assert_eq!(group_count(GROUP * 3 + 5), 4);
        assert_eq!(group_count(0), 0);
    }
}
