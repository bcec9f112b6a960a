//! What the mount asks of the sharer, as a trait: the share client (`ferry_share::remote::Remote`) in the
//! binary, an in-memory fake in tests. Everything it returns came from the peer and is treated as hostile by
//! the callers: names are single components (the wire checks them), sizes are clamped by the version.

use ferry_share::bytes::Bytes;
pub use ferry_share::remote::{PutContent, PutOutcome};
use ferry_share::tree::{GroupCv, Version};
use ferry_share::wire::{Entry, SharePath, Space, Time};

/// Why a request to the sharer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The file is no longer the version the read named: open it again.
    #[error("the file changed on the sharer")]
    Changed,
    /// The sharer cannot be reached (link lost, deadline passed): cached data may stand in.
    #[error("{0}")]
    Offline(String),
    /// The caller stopped it (its process was interrupted): nothing changed on the sharer.
    #[error("stopped: the calling process was interrupted")]
    Stopped,
    /// Any other failure, with the errno the file system answers.
    #[error("{message}")]
    Failed {
        /// The errno for the kernel (`ENOENT`, `EIO`, ...).
        errno: i32,
        /// What happened, for the log.
        message: String,
    },
}

impl SourceError {
    /// The errno a file system request that met this failure answers.
    pub fn errno(&self) -> i32 {
        match self {
            SourceError::Changed => libc::ESTALE,
            SourceError::Offline(_) => libc::EIO,
            SourceError::Stopped => libc::EINTR,
            SourceError::Failed { errno, .. } => *errno,
        }
    }
}

/// One piece of a read, in order: the version first, then the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// The version the read is served from.
    Version(Version),
    /// Verified bytes from `offset`.
    Data {
        /// Offset of the first byte.
        offset: u64,
        /// The bytes (in the buffer their packet came in, when it brought the whole read).
        bytes: Bytes,
        /// The value of each group of the bytes as their verification computed it, in order; empty when
        /// not known (the store hashes the groups itself).
        cvs: Vec<GroupCv>,
    },
}

/// A read in progress; dropping it cancels the rest.
pub trait Pieces: Send {
    /// The next piece, `None` after the last.
    fn next_piece(&mut self) -> Result<Option<Piece>, SourceError>;
}

/// A paired peer's share, as the mount reads it ([`Sink`]: as it writes it).
pub trait Source: Send + Sync + 'static {
    /// The attributes of `path`.
    fn stat(&self, path: &SharePath) -> Result<Entry, SourceError>;
    /// The entries of the directory `path`.
    fn list(&self, path: &SharePath) -> Result<Vec<Entry>, SourceError>;
    /// Starts a read of `len` bytes at `offset` of `path` (of `version`, when given: another version fails
    /// with [`SourceError::Changed`] after announcing itself). The request is on its way when this returns,
    /// so several reads started one after the other are in flight together.
    fn read(
        &self,
        path: &SharePath,
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    ) -> Result<Box<dyn Pieces>, SourceError>;
    /// The size and free space of the file system the share is on (what `df` shows of the mount). A source
    /// that cannot tell fails, as this default does; the mount then shows zeros.
    fn space(&self) -> Result<Space, SourceError> {
        Err(SourceError::Failed {
            errno: libc::ENOSYS,
            message: "the source has no space figures".into(),
        })
    }
}

/// A read-only source's answer to every write.
fn read_only() -> SourceError {
    SourceError::Failed {
        errno: libc::EROFS,
        message: "the share is read-only".into(),
    }
}

/// The writes a share may take (its sharer shares `--writable`); a source that takes none answers each
/// with `EROFS`, as these defaults do.
pub trait Sink: Send + Sync + 'static {
    /// Whether writes reach the sharer at all (a probe that changes nothing).
    fn writable(&self) -> Result<bool, SourceError> {
        Ok(false)
    }
    /// Whether the sharer is reachable now: while it is not, the mount keeps its changes to send them later
    /// instead of waiting for the link in each call.
    fn reachable(&self) -> bool {
        true
    }
    /// Lands `content.file` at `path` if the sharer's file is still `base` (`None`: absent), sending only
    /// `content.ranges` (with the base's other bytes copied on the sharer) when given; a changed file is kept
    /// and the content goes beside it ([`PutOutcome::Conflicted`]). `content.stop` ends it early with
    /// [`SourceError::Stopped`].
    fn put(
        &self,
        _path: &SharePath,
        _base: Option<[u8; 32]>,
        _content: PutContent<'_>,
    ) -> Result<PutOutcome, SourceError> {
        Err(read_only())
    }
    /// Creates the directory `path`.
    fn mkdir(&self, _path: &SharePath, _mode: u32) -> Result<(), SourceError> {
        Err(read_only())
    }
    /// Removes the empty directory `path`.
    fn rmdir(&self, _path: &SharePath) -> Result<(), SourceError> {
        Err(read_only())
    }
    /// Removes the file or symlink `path`; a file that is no longer `base` (the version last seen, when
    /// known) stays, and this fails with `ESTALE` (the conflict rule).
    fn unlink(&self, _path: &SharePath, _base: Option<[u8; 32]>) -> Result<(), SourceError> {
        Err(read_only())
    }
    /// Renames `from` to `to` (replacing `to` when `replace`); a file at `to` that is no longer `base` (the
    /// version last seen, when known) stays, and `from` is kept beside it: `Some` of that name.
    fn rename(
        &self,
        _from: &SharePath,
        _to: &SharePath,
        _replace: bool,
        _base: Option<[u8; 32]>,
    ) -> Result<Option<Vec<u8>>, SourceError> {
        Err(read_only())
    }
    /// Sets the permission bits and/or the modification time of `path`.
    fn set_attr(
        &self,
        _path: &SharePath,
        _mode: Option<u32>,
        _mtime: Option<Time>,
    ) -> Result<(), SourceError> {
        Err(read_only())
    }
    /// Creates the symlink `path` to `target`.
    fn symlink(&self, _path: &SharePath, _target: &[u8]) -> Result<(), SourceError> {
        Err(read_only())
    }
}
