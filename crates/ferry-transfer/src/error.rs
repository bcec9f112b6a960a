//! The one error type of the transfer layer.

use ferry_tree::path::PathProblem;
use ferry_wire::ErrorCode;

/// Everything that can stop a send or a receive.
///
/// [`TransferError::code`] gives a stable short code for `--json` error events and for the error
/// message sent to the peer.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// An I/O error of the channel or of a local file that has no more specific variant.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// An I/O error on a named local file or directory.
    #[error("{path}: {source}")]
    File {
        /// The local path, as given or as received.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The destination file system is full (ENOSPC or EDQUOT); partial data is kept for a resume.
    #[error("disk full while writing {path}")]
    DiskFull {
        /// The file being written.
        path: String,
    },
    /// The offer does not fit in the free space of the destination's file system (checked
    /// before accepting; `receive --no-space-check` skips the check).
    #[error("not enough space: the offer needs {} more, {} free on {path} (receive --no-space-check tries anyway)", human_bytes(*.needed), human_bytes(*.free))]
    NoSpace {
        /// Bytes still to write (allocated bytes of the offer minus what a resume keeps).
        needed: u64,
        /// Bytes free for an unprivileged user.
        free: u64,
        /// The destination directory.
        path: String,
    },
    /// A received path breaks one of the name rules.
    #[error("unsafe path {path:?}: {problem}")]
    UnsafePath {
        /// The offending path (lossy UTF-8).
        path: String,
        /// Which rule it breaks.
        problem: PathProblem,
    },
    /// The same path appears twice in a manifest.
    #[error("duplicate path {path:?}")]
    DuplicatePath {
        /// The repeated path.
        path: String,
    },
    /// A path is both a file (or symlink) and a directory, or lies under something that is not a directory.
    #[error("{path:?} is both a file and a directory")]
    FileDirClash {
        /// The path that is used both ways.
        path: String,
    },
    /// An entry's parent directory is not part of the manifest.
    #[error("parent directory of {path:?} is not in the offer")]
    MissingParent {
        /// The orphan entry.
        path: String,
    },
    /// A received symlink points outside its tree (or is absolute).
    #[error("symlink {path:?} points outside the transfer: {target:?}")]
    SymlinkEscapes {
        /// The link.
        path: String,
        /// Its target.
        target: String,
    },
    /// The offer announces more entries than the receiver accepts.
    #[error("offer has {announced} entries, more than the limit of {limit}")]
    TooManyEntries {
        /// Entries announced by the sender.
        announced: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// The offer's manifest would take more memory than the receiver allows before accepting it.
    #[error("the offer's file list needs {needed} bytes of memory, more than the limit of {limit} (receive --max-manifest raises it)")]
    ManifestTooLarge {
        /// Memory the announced manifest is counted as ([`crate::manifest::manifest_cost`]).
        needed: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// A text offer is larger than the receiver takes ([`crate::wire::MAX_TEXT`]).
    #[error(
        "the text message has {} ({size} bytes), more than the limit of {} ({limit} bytes); send it as a file",
        mib(*size),
        mib(*limit)
    )]
    TextTooLarge {
        /// Bytes the offer announces.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The offer does not fit the receiver's output: a new name or a stream takes exactly one item
    /// (a stream, one regular file).
    #[error("{reason}")]
    OutputMismatch {
        /// What does not fit, in words.
        reason: String,
    },
    /// A message does not follow the wire format.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A file's data is shorter or longer than the size its manifest entry declares.
    #[error("size of {path:?} differs from the offer: declared {declared}, sent {sent}{}", if *.more { " or more" } else { "" })]
    SizeMismatch {
        /// The file.
        path: String,
        /// The size in the manifest.
        declared: u64,
        /// The bytes actually sent (at least, when `more` is set).
        sent: u64,
        /// The sender sent at least `sent` bytes (the receiver stopped counting there).
        more: bool,
    },
    /// A file or chunk hash does not match its data.
    #[error("integrity check failed for {path:?}")]
    Integrity {
        /// The file.
        path: String,
    },
    /// A destination path already exists and overwriting is not allowed.
    #[error("{path:?} already exists (not overwriting)")]
    Conflict {
        /// The first conflicting path, relative to the destination.
        path: String,
    },
    /// A source file changed while it was being sent.
    #[error("{path} changed while being sent")]
    SourceChanged {
        /// The local source path.
        path: String,
    },
    /// The receiver declined the offer.
    #[error("the offer was declined")]
    Declined,
    /// The peer reported an error and stopped.
    #[error("peer failed ({code}): {message}")]
    Remote {
        /// The peer's stable error code.
        code: String,
        /// The peer's one-line message.
        message: String,
    },
    /// Everything else arrived and verified, but some files were skipped: the sender could not
    /// read them (or could not send them at all: fifos, sockets, devices, symlinks pointing
    /// outside); each was named in a warning. Made by the command, from the reports' counts.
    #[error("{skipped} skipped (see the warnings); everything else arrived and verified")]
    Partial {
        /// Entries skipped.
        skipped: u64,
    },
    /// The peer closed the stream before the transfer finished.
    #[error("peer closed the connection before the transfer finished")]
    UnexpectedEnd,
}

impl TransferError {
    /// The stable code naming the kind of failure (for JSON events and the wire).
    pub fn code(&self) -> ErrorCode {
        match self {
            TransferError::Io(e) | TransferError::File { source: e, .. } => {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    ErrorCode::Permission
                } else {
                    ErrorCode::Io
                }
            }
            TransferError::DiskFull { .. } | TransferError::NoSpace { .. } => ErrorCode::DiskFull,
            TransferError::UnsafePath { .. }
            | TransferError::DuplicatePath { .. }
            | TransferError::FileDirClash { .. }
            | TransferError::MissingParent { .. }
            | TransferError::SymlinkEscapes { .. } => ErrorCode::UnsafePath,
            TransferError::TooManyEntries { .. } => ErrorCode::TooManyEntries,
            TransferError::ManifestTooLarge { .. } => ErrorCode::ManifestTooLarge,
            TransferError::TextTooLarge { .. } => ErrorCode::TextTooLarge,
            TransferError::OutputMismatch { .. } => ErrorCode::OutputMismatch,
            TransferError::Protocol(_) => ErrorCode::Protocol,
            TransferError::SizeMismatch { .. } => ErrorCode::SizeMismatch,
            TransferError::Integrity { .. } => ErrorCode::Integrity,
            TransferError::Conflict { .. } => ErrorCode::Conflict,
            TransferError::SourceChanged { .. } => ErrorCode::SourceChanged,
            TransferError::Partial { .. } => ErrorCode::Partial,
            TransferError::Declined => ErrorCode::Declined,
            TransferError::Remote { .. } => ErrorCode::Remote,
            TransferError::UnexpectedEnd => ErrorCode::PeerGone,
        }
    }

    /// The codes a peer's transfer sends in its error message ([`TransferError::code`] of a failure it can
    /// report): a peer's code keeps its class only when it is one of these.
    pub const PEER_CODES: &'static [ErrorCode] = &[
        ErrorCode::DiskFull,
        ErrorCode::Permission,
        ErrorCode::Io,
        ErrorCode::UnsafePath,
        ErrorCode::TooManyEntries,
        ErrorCode::ManifestTooLarge,
        ErrorCode::TextTooLarge,
        ErrorCode::Protocol,
        ErrorCode::SizeMismatch,
        ErrorCode::Integrity,
        ErrorCode::Conflict,
        ErrorCode::Declined,
        ErrorCode::OutputMismatch,
        ErrorCode::SourceChanged,
        ErrorCode::Partial,
    ];

    /// Shorthand for a [`TransferError::Protocol`] error.
    pub(crate) fn protocol(msg: impl Into<String>) -> Self {
        TransferError::Protocol(msg.into())
    }

    /// Wraps an I/O error on a local path, turning ENOSPC/EDQUOT into [`TransferError::DiskFull`].
    pub(crate) fn file(path: impl Into<String>, source: std::io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => TransferError::DiskFull { path },
            _ => TransferError::File { path, source },
        }
    }
}

/// Bytes in binary units with two decimals ("7.41 GiB"), for messages.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// Lossy display form of a wire path.
pub(crate) fn lossy(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

impl From<ferry_wire::WireError> for TransferError {
    /// A message that does not decode is the peer breaking the protocol.
    fn from(e: ferry_wire::WireError) -> Self {
        TransferError::Protocol(e.to_string())
    }
}

/// `bytes` in MiB with two decimals, as a text message's size and its limit are both shown (with their exact
/// bytes beside: a size just over the limit rounds to the limit).
fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}
