//! Where verified bytes of file versions are kept, as traits: the on-disk chunk cache (`ferry_cache`) in the
//! binary, memory in tests. A version's [`Chunks`] take only bytes the share client verified against that
//! version, and say which ranges are still missing.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use ferry_share::tree::{GroupCv, Version};

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
}
