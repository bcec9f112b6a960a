//! The verification values of groups: BLAKE3 chaining values at their place in the version's tree (the
//! share protocol's tree: BLAKE3's own, in groups of [`GROUP`] bytes), and their combination into the root.

use std::ops::Range;

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode,
};
use ferry_share::tree::{Version, GROUP};

use crate::groups::Cv;

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
