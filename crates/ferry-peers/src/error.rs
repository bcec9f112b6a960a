//! What can go wrong with identities, the peer list and pairing.

use std::path::PathBuf;

/// An error of this crate; every message names the file or the peer concerned.
#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holding secrets may be read or changed by other users.
    #[error("{path} is accessible to other users (mode {mode:04o}); run: chmod 600 {path}")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The directory of the files holding secrets may be written by other users, who could remove or
    /// replace them.
    #[error("{path} may be written by other users (mode {mode:04o}); run: chmod go-w {path}")]
    ExposedDir {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A file holding secrets belongs to another user.
    #[error("{path} belongs to another user (uid {owner})")]
    NotOwned {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
    },
    /// A file is not in the expected format.
    #[error("{path} is damaged: {problem}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A pair secret in the peer list does not open with this machine's identity key: the file came from
    /// another machine, or it (or the identity file) was changed.
    #[error("{path}: the secret of peer {peer} does not open with this machine's identity key: the file was copied from another machine, or it or the identity file changed; run `ferry peers remove {peer}` and pair again")]
    Sealed {
        /// The peer list.
        path: PathBuf,
        /// The peer's name.
        peer: String,
    },
    /// Not a usable peer name.
    #[error("{0:?} is not a usable peer name: use 1 to 32 letters, digits, '.', '_' or '-', starting with a letter or digit")]
    BadName(String),
    /// No peer of that name.
    #[error("no paired peer is named {0:?} (see `ferry peers`)")]
    UnknownPeer(String),
    /// The name is taken by another key.
    #[error("a different peer is already named {0:?}: choose another name with --name, or `ferry peers remove {0}` first")]
    NameTaken(String),
    /// The peer's pairing message was malformed.
    #[error("malformed pairing message: {0}")]
    Malformed(&'static str),
    /// The peer's identity signature did not verify: it does not hold the key it claims.
    #[error("the peer's identity signature does not verify")]
    BadSignature,
    /// The peer presented this installation's own key.
    #[error("the peer presented this machine's own identity key")]
    OwnKey,
}

impl PeersError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PeersError::Io {
            path: path.into(),
            source,
        }
    }
}
