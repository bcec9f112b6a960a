//! The share client ([`Remote`]) as the mount's [`Source`]: its failures sorted into what the read path
//! treats differently (a changed file, a lost link, anything else).

use ferry_share::remote::{PutContent, PutOutcome, ReadHandle, ReadPiece, Remote, RemoteError};
use ferry_share::wire::{Entry, ErrorCode, SharePath, Space, Time};

use crate::source::{Piece, Pieces, Sink, Source, SourceError};

fn sorted(e: RemoteError) -> SourceError {
    match e {
        RemoteError::Remote(ErrorCode::Changed, _) => SourceError::Changed,
        RemoteError::Stopped => SourceError::Stopped,
        RemoteError::Deadline | RemoteError::Disconnected(_) | RemoteError::Closed => {
            SourceError::Offline(e.to_string())
        }
        other => SourceError::Failed {
            errno: other.errno(),
            message: other.to_string(),
        },
    }
}

impl Pieces for ReadHandle {
    fn next_piece(&mut self) -> Result<Option<Piece>, SourceError> {
        Ok(self.next().map_err(sorted)?.map(|p| match p {
            ReadPiece::Version(v) => Piece::Version(v),
            ReadPiece::Data { offset, bytes, cvs } => Piece::Data { offset, bytes, cvs },
        }))
    }
}

impl Source for Remote {
    fn stat(&self, path: &SharePath) -> Result<Entry, SourceError> {
        Remote::stat(self, path).map_err(sorted)
    }

    fn list(&self, path: &SharePath) -> Result<Vec<Entry>, SourceError> {
        Remote::list(self, path).map_err(sorted)
    }

    fn read(
        &self,
        path: &SharePath,
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    ) -> Result<Box<dyn Pieces>, SourceError> {
        let handle = Remote::read(self, path, version, offset, len).map_err(sorted)?;
        Ok(Box::new(handle))
    }

    /// Asked only while the link is up: offline, `df` of the mount answers at once (from what it knew).
    fn space(&self) -> Result<Space, SourceError> {
        if !self.is_up() {
            return Err(SourceError::Offline("the sharer is not reachable".into()));
        }
        Remote::space(self).map_err(sorted)
    }
}

impl Sink for Remote {
    /// Asks for a change of nothing at the share's root: a read-only share refuses it as a write
    /// (`ReadOnly`), a writable one as a request no share takes (the root itself cannot be written).
    fn writable(&self) -> Result<bool, SourceError> {
        match Remote::set_attr(self, &SharePath::root(), None, None) {
            Err(RemoteError::Remote(ErrorCode::ReadOnly, _)) => Ok(false),
            Ok(()) | Err(RemoteError::Remote(_, _)) => Ok(true),
            Err(e) => Err(sorted(e)),
        }
    }

    fn reachable(&self) -> bool {
        self.is_up()
    }

    fn put(
        &self,
        path: &SharePath,
        base: Option<[u8; 32]>,
        content: PutContent<'_>,
    ) -> Result<PutOutcome, SourceError> {
        Remote::put(self, path, base, content).map_err(sorted)
    }

    fn mkdir(&self, path: &SharePath, mode: u32) -> Result<(), SourceError> {
        Remote::mkdir(self, path, mode).map_err(sorted)
    }

    fn rmdir(&self, path: &SharePath) -> Result<(), SourceError> {
        Remote::rmdir(self, path).map_err(sorted)
    }

    fn unlink(&self, path: &SharePath, base: Option<[u8; 32]>) -> Result<(), SourceError> {
        Remote::unlink(self, path, base).map_err(sorted)
    }

    fn rename(
        &self,
        from: &SharePath,
        to: &SharePath,
        replace: bool,
        base: Option<[u8; 32]>,
    ) -> Result<Option<Vec<u8>>, SourceError> {
        Remote::rename(self, from, to, replace, base).map_err(sorted)
    }

    fn set_attr(
        &self,
        path: &SharePath,
        mode: Option<u32>,
        mtime: Option<Time>,
    ) -> Result<(), SourceError> {
        Remote::set_attr(self, path, mode, mtime).map_err(sorted)
    }

    fn symlink(&self, path: &SharePath, target: &[u8]) -> Result<(), SourceError> {
        Remote::symlink(self, path, target).map_err(sorted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_sorted_for_the_read_path() {
        assert_eq!(
            sorted(RemoteError::Remote(ErrorCode::Changed, "x".into())),
            SourceError::Changed
        );
        assert!(matches!(
            sorted(RemoteError::Deadline),
            SourceError::Offline(_)
        ));
        assert!(matches!(
            sorted(RemoteError::Disconnected("gone".into())),
            SourceError::Offline(_)
        ));
        let e = sorted(RemoteError::Remote(ErrorCode::NotFound, "no".into()));
        assert_eq!(e.errno(), libc::ENOENT);
        assert_eq!(sorted(RemoteError::Integrity).errno(), libc::EIO);
    }
}
