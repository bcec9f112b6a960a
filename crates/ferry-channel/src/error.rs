//! The channel's typed errors.

use thiserror::Error;

/// Everything that can end a secure channel.
///
/// Each variant names one cause, so the CLI can map it to a clear message and a stable exit code.
#[derive(Debug, Error)]
pub enum ChannelError {
    /// The short code did not match: the PAKE key confirmation failed.
    #[error("wrong code")]
    WrongCode,
    /// A tag, signature or confirmation did not verify: the bytes were altered in transit.
    #[error("authentication failed: data was tampered with")]
    Tampered,
    /// The peer's identity key is not the pinned one.
    #[error("peer identity does not match the pinned key")]
    IdentityMismatch,
    /// The peer (the responder) does not admit our identity key: it is not paired with us, or no longer.
    #[error("the peer does not admit this machine's key (not paired with it, or removed there)")]
    NotAdmitted,
    /// We (the responder) refused the peer's identity key; the host's reason. The peer was told nothing else.
    #[error("refused the peer's key: {0}")]
    Refused(String),
    /// The stream ended without the authenticated end-of-stream packet.
    #[error("connection truncated: stream ended without an authenticated close")]
    Truncated,
    /// A packet announced more contents than the configured maximum.
    #[error("packet of {len} bytes exceeds the maximum of {max}")]
    Oversized {
        /// Announced contents length.
        len: usize,
        /// Configured maximum contents length.
        max: usize,
    },
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: ours {ours}, peer's {theirs}")]
    VersionMismatch {
        /// Our protocol version.
        ours: u8,
        /// The peer's protocol version (0 when its version packet was unreadable).
        theirs: u8,
    },
    /// The two sides share no cipher suite.
    #[error("no common cipher suite")]
    SuiteMismatch,
    /// The peer's first bytes are not a ferry handshake (no garbage terminator where one must be).
    #[error("peer does not speak ferry")]
    NotFerry,
    /// The authentication exchange broke its own rules (unexpected or malformed message).
    #[error("authentication protocol violation: {0}")]
    AuthProtocol(&'static str),
    /// The channel was used after it failed or closed.
    #[error("channel already closed")]
    Closed,
    /// The underlying transport failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl ChannelError {
    /// Converts into an `io::Error` that keeps this error inside, for layers that speak `io::Result`.
    pub fn into_io(self) -> std::io::Error {
        match self {
            ChannelError::Io(e) => e,
            other => std::io::Error::other(other),
        }
    }

    /// Finds a `ChannelError` wrapped by [`ChannelError::into_io`].
    pub fn from_io_ref(e: &std::io::Error) -> Option<&ChannelError> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<ChannelError>())
    }
}
