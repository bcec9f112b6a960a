//! The share client ([`Remote`]) as the mount's [`Source`]: its failures sorted into what the read path
//! treats differently (a changed file, a lost link, anything else).

use ferry_share::remote::{ReadHandle, ReadPiece, Remote, RemoteError};
use ferry_share::wire::{Entry, ErrorCode, SharePath};

use crate::source::{Piece, Pieces, Source, SourceError};

fn sorted(e: RemoteError) -> SourceError {
    match e {
        RemoteError::Remote(ErrorCode::Changed, _) => SourceError::Changed,
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
