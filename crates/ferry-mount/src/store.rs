//! Where verified bytes of file versions are kept, as traits: the on-disk chunk cache (`ferry_cache`) in the
//! binary, memory in tests. A version's [`Chunks`] take only bytes the share client verified against that
//! version, and say which ranges are still missing.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use ferry_share::tree::{GroupCv, Version, GROUP};

/// A failure of the store (a full disk, a cache file altered behind its back).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cache: {0}")]
pub struct StoreError(pub String);

/// What became of bytes given to [`Chunks::insert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// They are stored.
    Stored,
    /// They are stored, in a store short of room (why, in words: a full disk), which keeps less than it
    /// was asked to: what it drops is fetched again when read again.
    Short(String),
    /// They are not, for want of room (why, in words): a full disk, or a cache full of files in use. The
    /// reads that wait for them are answered from memory; read again, they are fetched again.
    NoRoom(String),
}

/// The verified bytes of one file version; held while a file is open (an entry in use is not evicted).
pub trait Chunks: Send + Sync {
    /// The version.
    fn version(&self) -> Version;
    /// The parts of `range` not present, aligned outwards to the store's groups.
    fn missing(&self, range: Range<u64>) -> Vec<Range<u64>>;
    /// Copies present bytes at `offset` into `buf`; fails if any of them is missing (or no longer verifies).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, StoreError>;
    /// Stores verified bytes at `offset`, with the value of each of their groups from their verification
    /// (`cvs`, empty when not known: then the store hashes them); or says why it has no room for them.
    fn insert(&self, offset: u64, bytes: &[u8], cvs: &[GroupCv]) -> Result<Kept, StoreError>;
    /// Whether every byte is present.
    fn is_complete(&self) -> bool;
    /// A file holding exactly the version's bytes, when complete and verified (for FUSE passthrough).
    fn backing(&self) -> Option<File>;
    /// Takes the file at `path` (on the store's file system, no longer written) as the version's whole
    /// content, by moving it, not copying it; `Ok(false)`, with the file left where it is, when it is not
    /// the version or the store cannot take it.
    fn adopt(&self, path: &Path) -> Result<bool, StoreError>;
}

/// The chunk stores of all versions.
pub trait Store: Send + Sync + 'static {
    /// The entry of `version` (created empty if new).
    fn entry(&self, version: Version) -> Result<Arc<dyn Chunks>, StoreError>;
    /// `new` is `old` with `tail` appended: when `old` is complete and that is so, `new` takes `old`'s
    /// file as it is, `tail` written past its end (a descriptor open on it reads `new` from then on), and
    /// `old` is gone; `Ok(false)` otherwise, both as they were. A store that cannot says `Ok(false)`.
    fn extend(&self, old: Version, new: Version, tail: &[u8]) -> Result<bool, StoreError> {
        let _ = (old, new, tail);
        Ok(false)
    }
    /// Gives up at least `bytes` of what it keeps, or one version if fewer are asked for, where that makes
    /// room on its disk for working copies the disk refused; false when it has nothing to give up. A store
    /// off the disk says false.
    fn make_room(&self, bytes: u64) -> bool {
        let _ = bytes;
        false
    }
}

/// The chunks of a version the store could not make an entry for (a disk with no room for another
/// file, a cache directory gone read-only): nothing is kept, every read of it is fetched, and each insert
/// says why ([`Kept::NoRoom`]), so the mount says so once and reads go on.
#[derive(Debug)]
pub struct Unkept {
    version: Version,
    why: String,
}

impl Unkept {
    /// Keeps nothing of `version`, because of `why` (in words).
    pub fn new(version: Version, why: String) -> Unkept {
        Unkept { version, why }
    }
}

impl Chunks for Unkept {
    fn version(&self) -> Version {
        self.version
    }

    fn missing(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let end = range.end.min(self.version.size);
        if range.start >= end {
            return Vec::new();
        }
        let start = range.start / GROUP * GROUP;
        let end = end
            .div_ceil(GROUP)
            .saturating_mul(GROUP)
            .min(self.version.size);
        std::iter::once(start..end).collect()
    }

    fn read_at(&self, buf: &mut [u8], _offset: u64) -> Result<usize, StoreError> {
        if buf.is_empty() {
            return Ok(0);
        }
        Err(StoreError(format!("not kept: {}", self.why)))
    }

    fn insert(&self, _offset: u64, _bytes: &[u8], _cvs: &[GroupCv]) -> Result<Kept, StoreError> {
        Ok(Kept::NoRoom(self.why.clone()))
    }

    fn is_complete(&self) -> bool {
        self.version.size == 0
    }

    fn backing(&self) -> Option<File> {
        None
    }

    fn adopt(&self, _path: &Path) -> Result<bool, StoreError> {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_nothing_keeps_is_missing_in_whole_groups_and_never_read() {
        let version = Version {
            root: [7; 32],
            size: 3 * GROUP + 100,
        };
        let u = Unkept::new(version, "no room".into());
        assert_eq!(u.missing(10..20), vec![0..GROUP]);
        assert_eq!(
            u.missing(GROUP + 1..3 * GROUP + 5),
            vec![GROUP..3 * GROUP + 100]
        );
        assert_eq!(
            u.missing(3 * GROUP + 100..4 * GROUP),
            Vec::<Range<u64>>::new()
        );
        assert!(u.read_at(&mut [0; 4], 0).is_err());
        assert_eq!(u.read_at(&mut [], 0), Ok(0));
        assert_eq!(
            u.insert(0, &[0; 8192], &[]),
            Ok(Kept::NoRoom("no room".into()))
        );
        assert!(!u.is_complete() && u.backing().is_none());
        let empty = Unkept::new(
            Version {
                root: [0; 32],
                size: 0,
            },
            String::new(),
        );
        assert!(empty.is_complete());
        assert!(empty.missing(0..0).is_empty());
    }
}
