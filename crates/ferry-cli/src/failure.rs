//! Every error the user can meet, as a stable JSON code and a documented exit status.

use ferry_channel::ChannelError;
use ferry_session::SessionError;
use ferry_transfer::TransferError;
use ferry_wire::ErrorCode;

/// A classified failure: what `--json` reports as `code` and the process exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// Stable short code for scripts.
    pub code: &'static str,
    /// Process exit status (see README, "Exit status").
    pub exit: u8,
}

impl From<ErrorCode> for Failure {
    fn from(code: ErrorCode) -> Self {
        Failure {
            code: code.as_str(),
            exit: code.exit_status(),
        }
    }
}

/// A bad command line, found before anything else happens (exit 2, `usage`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Ctrl-C at the offer's question: the offer was declined, nothing was received.
#[derive(Debug, thiserror::Error)]
#[error("interrupted at the question; the offer was declined and nothing was received")]
pub struct InterruptedAtQuestion;

/// The sender (or the relay between) closed the connection while the offer's question was asked.
#[derive(Debug, thiserror::Error)]
#[error("the sender is gone (it stopped, or the relay closed the connection) while the offer was asked; nothing was received")]
pub struct GoneAtQuestion;

/// Ctrl-C at the code prompt: nothing was sought or received.
#[derive(Debug, thiserror::Error)]
#[error("interrupted at the code prompt; nothing was received")]
pub struct InterruptedAtPrompt;

/// `mount --daemon`: the background mount ended before mounting, with its own error (its code when it
/// printed one) and exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message} (the background mount ended before mounting; its log: {log})")]
pub struct Background {
    pub code: Option<ErrorCode>,
    pub exit: u8,
    pub message: String,
    pub log: String,
}

/// The user interrupted the command (Ctrl-C, SIGTERM, SIGHUP); it holds what is left of it and how to go on,
/// which depends on the command ("" when nothing is left).
#[derive(Debug, thiserror::Error)]
#[error("interrupted{0}")]
pub struct Interrupted(pub &'static str);

fn channel_failure(e: &ChannelError) -> Failure {
    match e {
        ChannelError::WrongCode => ErrorCode::WrongCode,
        ChannelError::Truncated | ChannelError::Closed => ErrorCode::PeerGone,
        ChannelError::NotFerry => ErrorCode::NotFerry,
        ChannelError::VersionMismatch { .. } | ChannelError::SuiteMismatch => {
            ErrorCode::VersionMismatch
        }
        ChannelError::Tampered | ChannelError::AuthProtocol(_) => ErrorCode::Tampered,
        ChannelError::IdentityMismatch => ErrorCode::IdentityMismatch,
        ChannelError::NotAdmitted | ChannelError::Refused(_) => ErrorCode::NotAdmitted,
        ChannelError::Oversized { .. } => ErrorCode::Protocol,
        ChannelError::Io(io) => return io_failure(io),
    }
    .into()
}

fn io_failure(e: &std::io::Error) -> Failure {
    if let Some(ch) = ChannelError::from_io_ref(e) {
        return channel_failure(ch);
    }
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | ConnectionRefused => {
            ErrorCode::PeerGone
        }
        PermissionDenied => ErrorCode::Permission,
        StorageFull => ErrorCode::DiskFull,
        _ => ErrorCode::Io,
    }
    .into()
}

/// A session error's class; `None` when the cause below it decides.
fn session_failure(e: &SessionError) -> Option<Failure> {
    let code = match e {
        SessionError::PeerNotFound(_) => ErrorCode::PeerNotFound,
        SessionError::NotARelay(_) | SessionError::Relay(_) => ErrorCode::Relay,
        SessionError::Channel(e) => return Some(channel_failure(e)),
        SessionError::Io(e) => return Some(io_failure(e)),
        SessionError::Announce(_) | SessionError::WrongCode { .. } | SessionError::Discovery(_) => {
            return None
        }
        SessionError::NoRelay
        | SessionError::Listen { .. }
        | SessionError::Taken(_)
        | SessionError::Upgrade(_) => ErrorCode::Error,
    };
    Some(code.into())
}

fn peers_failure(e: &ferry_peers::PeersError) -> Failure {
    use ferry_peers::PeersError::*;
    match e {
        BadName(_) | UnknownPeer(_) | NameTaken(_) => ErrorCode::Usage,
        BadSignature | OwnKey => ErrorCode::IdentityMismatch,
        Malformed(_) => ErrorCode::Protocol,
        Io { source, .. } => return io_failure(source),
        Exposed { .. } | ExposedDir { .. } | NotOwned { .. } | Damaged { .. } | Sealed { .. } => {
            ErrorCode::Error
        }
    }
    .into()
}

fn transfer_failure(e: &TransferError) -> Failure {
    match e {
        TransferError::Io(io) => io_failure(io),
        TransferError::Remote { code, .. } => {
            // The peer's code is untrusted text: only the codes a peer's transfer reports keep their class.
            ErrorCode::parse(code)
                .filter(|c| TransferError::PEER_CODES.contains(c))
                .unwrap_or(ErrorCode::Remote)
                .into()
        }
        other => other.code().into(),
    }
}

/// A share session's error (`ls`, `pull`): the session's own classification, except where a cause has a more
/// specific one here (the channel's, a local file's, the transfer's).
fn share_failure(e: &ferry_share::io::SessionError) -> Failure {
    use ferry_share::io::SessionError as S;
    match e {
        S::Channel(e) => channel_failure(e),
        S::Io(e) => io_failure(e),
        S::Transfer(e) => transfer_failure(e),
        other => other.code().into(),
    }
}

/// A mount's link error (its first connection): the link's trouble as a peer gone, the sharer's refusal as
/// the remote's, data that did not verify as integrity.
fn remote_failure(e: &ferry_share::remote::RemoteError) -> Failure {
    use ferry_share::remote::RemoteError as R;
    match e {
        R::Disconnected(_) | R::Deadline | R::Closed => ErrorCode::PeerGone,
        R::Integrity => ErrorCode::Integrity,
        R::Remote(..) => ErrorCode::Remote,
        R::Local(_) => ErrorCode::Io,
        R::TooLarge(_) => ErrorCode::Protocol,
        R::Stopped => ErrorCode::Interrupted,
    }
    .into()
}

/// Classifies an error by the most specific cause in its chain.
pub fn classify(err: &anyhow::Error) -> Failure {
    for cause in err.chain() {
        if cause.downcast_ref::<Usage>().is_some() {
            return ErrorCode::Usage.into();
        }
        if let Some(b) = cause.downcast_ref::<Background>() {
            return Failure {
                code: b.code.map_or(ErrorCode::Error.as_str(), ErrorCode::as_str),
                exit: b.exit,
            };
        }
        if cause.downcast_ref::<GoneAtQuestion>().is_some() {
            return ErrorCode::PeerGone.into();
        }
        if cause.downcast_ref::<Interrupted>().is_some()
            || cause.downcast_ref::<InterruptedAtQuestion>().is_some()
            || cause.downcast_ref::<InterruptedAtPrompt>().is_some()
        {
            return ErrorCode::Interrupted.into();
        }
        if let Some(f) = cause
            .downcast_ref::<SessionError>()
            .and_then(session_failure)
        {
            return f;
        }
        if cause.downcast_ref::<ferry_relay::RelayError>().is_some() {
            return ErrorCode::Relay.into();
        }
        if let Some(e) = cause.downcast_ref::<ChannelError>() {
            return channel_failure(e);
        }
        if let Some(e) = cause.downcast_ref::<TransferError>() {
            return transfer_failure(e);
        }
        if let Some(e) = cause.downcast_ref::<ferry_peers::PeersError>() {
            return peers_failure(e);
        }
        if let Some(e) = cause.downcast_ref::<ferry_share::io::SessionError>() {
            return share_failure(e);
        }
        if let Some(e) = cause.downcast_ref::<ferry_share::remote::RemoteError>() {
            return remote_failure(e);
        }
        if cause
            .downcast_ref::<ferry_rendezvous::CodeError>()
            .is_some()
        {
            return ErrorCode::BadCode.into();
        }
        if let Some(e) = cause.downcast_ref::<std::io::Error>() {
            return io_failure(e);
        }
    }
    ErrorCode::Error.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXIT_ERROR: u8 = ErrorCode::Error.exit_status();

    fn of(e: impl Into<anyhow::Error>) -> Failure {
        classify(&e.into())
    }

    #[test]
    fn causes_map_to_documented_codes_and_statuses() {
        assert_eq!(
            of(ChannelError::WrongCode),
            Failure {
                code: "wrong-code",
                exit: 3
            }
        );
        assert_eq!(
            of(ChannelError::Truncated),
            Failure {
                code: "peer-gone",
                exit: 4
            }
        );
        assert_eq!(
            of(ChannelError::Tampered),
            Failure {
                code: "tampered",
                exit: 5
            }
        );
        assert_eq!(
            of(TransferError::DiskFull { path: "x".into() }),
            Failure {
                code: "disk-full",
                exit: 6
            }
        );
        assert_eq!(
            of(TransferError::Conflict { path: "x".into() }),
            Failure {
                code: "conflict",
                exit: 7
            }
        );
        // A channel error wrapped in io::Error inside a transfer error keeps its class.
        let wrapped = TransferError::Io(ChannelError::WrongCode.into_io());
        assert_eq!(
            of(wrapped),
            Failure {
                code: "wrong-code",
                exit: 3
            }
        );
        assert_eq!(
            of(TransferError::Partial { skipped: 2 }),
            Failure {
                code: "partial",
                exit: 9
            }
        );
        assert_eq!(
            of(Interrupted("")),
            Failure {
                code: "interrupted",
                exit: 130
            }
        );
    }

    /// README's "Exit status" table names every code, each in the row of its exit status.
    #[test]
    fn the_readme_lists_every_code_with_its_exit_status() {
        let readme = include_str!("../../../README.md");
        let table = readme
            .split("## Exit status")
            .nth(1)
            .expect("README has an Exit status section");
        let mut listed = Vec::new();
        for row in table.lines().take_while(|l| !l.starts_with("## ")) {
            let Some(status) = row
                .strip_prefix("| ")
                .and_then(|r| r.split(' ').next())
                .and_then(|s| s.parse::<u8>().ok())
            else {
                continue;
            };
            for quoted in row.split('`').skip(1).step_by(2) {
                if let Some(code) = ErrorCode::parse(quoted) {
                    assert_eq!(
                        code.exit_status(),
                        status,
                        "README lists `{code}` under {status}"
                    );
                    listed.push(code);
                }
            }
        }
        for code in ErrorCode::ALL {
            assert!(
                listed.contains(code),
                "README's Exit status table lacks `{code}`"
            );
        }
    }

    #[test]
    fn a_peers_error_code_is_untrusted_text() {
        let known = TransferError::Remote {
            code: "integrity".into(),
            message: String::new(),
        };
        assert_eq!(
            of(known),
            Failure {
                code: "integrity",
                exit: 5
            }
        );
        let unknown = TransferError::Remote {
            code: "\u{1b}[31mevil".into(),
            message: String::new(),
        };
        assert_eq!(
            of(unknown),
            Failure {
                code: "remote",
                exit: EXIT_ERROR
            }
        );
    }

    #[test]
    fn a_mounts_link_errors_map_as_the_sessions_do() {
        use ferry_share::remote::RemoteError;
        let down = anyhow::Error::new(RemoteError::Disconnected("closed".into()))
            .context("sharer closed the connection before its share's hello");
        assert_eq!(
            classify(&down),
            Failure {
                code: "peer-gone",
                exit: 4
            }
        );
        assert_eq!(
            of(RemoteError::Integrity),
            Failure {
                code: "integrity",
                exit: 5
            }
        );
    }
}
