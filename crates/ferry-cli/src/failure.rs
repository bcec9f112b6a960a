//! Every error the user can meet, as a stable JSON code and a documented exit status.

use ferry_channel::ChannelError;
use ferry_session::SessionError;
use ferry_transfer::TransferError;

/// A classified failure: what `--json` reports as `code` and the process exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// Stable short code for scripts.
    pub code: &'static str,
    /// Process exit status (see README, "Exit status").
    pub exit: u8,
}

/// Exit status of a failure that has no more specific class.
pub const EXIT_ERROR: u8 = 1;
/// Exit status when the user pressed Ctrl-C.
pub const EXIT_INTERRUPTED: u8 = 130;

/// A bad command line, found before anything else happens (exit 2, `usage`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Ctrl-C at the offer's question: the offer was declined, nothing was received.
#[derive(Debug, thiserror::Error)]
#[error("interrupted at the question; the offer was declined and nothing was received")]
pub struct InterruptedAtQuestion;

/// Ctrl-C at the code prompt: nothing was sought or received.
#[derive(Debug, thiserror::Error)]
#[error("interrupted at the code prompt; nothing was received")]
pub struct InterruptedAtPrompt;

/// The user interrupted the transfer.
#[derive(Debug, thiserror::Error)]
#[error("interrupted; partial data is kept, run the same command again to resume")]
pub struct Interrupted;

fn channel_failure(e: &ChannelError) -> Failure {
    let (code, exit) = match e {
        ChannelError::WrongCode => ("wrong-code", 3),
        ChannelError::Truncated | ChannelError::Closed => ("peer-gone", 4),
        ChannelError::NotFerry => ("not-ferry", 4),
        ChannelError::VersionMismatch { .. } | ChannelError::SuiteMismatch => {
            ("version-mismatch", 4)
        }
        ChannelError::Tampered | ChannelError::AuthProtocol(_) => ("tampered", 5),
        ChannelError::IdentityMismatch => ("identity-mismatch", 5),
        ChannelError::Oversized { .. } => ("protocol", 8),
        ChannelError::Io(io) => return io_failure(io),
    };
    Failure { code, exit }
}

fn io_failure(e: &std::io::Error) -> Failure {
    if let Some(ch) = ChannelError::from_io_ref(e) {
        return channel_failure(ch);
    }
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | ConnectionRefused => {
            Failure {
                code: "peer-gone",
                exit: 4,
            }
        }
        PermissionDenied => Failure {
            code: "permission",
            exit: EXIT_ERROR,
        },
        StorageFull => Failure {
            code: "disk-full",
            exit: 6,
        },
        _ => Failure {
            code: "io",
            exit: EXIT_ERROR,
        },
    }
}

/// A session error's class; `None` when the cause below it decides.
fn session_failure(e: &SessionError) -> Option<Failure> {
    let (code, exit) = match e {
        SessionError::PeerNotFound(_) => ("peer-not-found", 4),
        SessionError::NotARelay(_) | SessionError::Relay(_) => ("relay", 4),
        SessionError::Channel(e) => return Some(channel_failure(e)),
        SessionError::Io(e) => return Some(io_failure(e)),
        SessionError::Announce(_) | SessionError::WrongCode { .. } | SessionError::Discovery(_) => {
            return None
        }
        SessionError::NoRelay
        | SessionError::Listen { .. }
        | SessionError::Taken(_)
        | SessionError::Upgrade(_) => ("error", EXIT_ERROR),
    };
    Some(Failure { code, exit })
}

fn peers_failure(e: &ferry_peers::PeersError) -> Failure {
    use ferry_peers::PeersError::*;
    let (code, exit) = match e {
        BadName(_) | UnknownPeer(_) | NameTaken(_) => ("usage", 2),
        BadSignature | OwnKey => ("identity-mismatch", 5),
        Malformed(_) => ("protocol", 8),
        Io { source, .. } => return io_failure(source),
        Exposed { .. } | NotOwned { .. } | Damaged { .. } => ("error", EXIT_ERROR),
    };
    Failure { code, exit }
}

fn transfer_code_exit(code: &str) -> u8 {
    match code {
        "wrong-code" => 3,
        "peer-gone" | "not-ferry" => 4,
        "integrity" | "tampered" => 5,
        "disk-full" => 6,
        "partial" => 9,
        "conflict" | "declined" | "output-mismatch" => 7,
        "unsafe-path" | "too-many-entries" | "manifest-too-large" | "text-too-large"
        | "size-mismatch" | "protocol" => 8,
        _ => EXIT_ERROR,
    }
}

fn transfer_failure(e: &TransferError) -> Failure {
    match e {
        TransferError::Io(io) => io_failure(io),
        TransferError::UnexpectedEnd => Failure {
            code: "peer-gone",
            exit: 4,
        },
        TransferError::Remote { code, .. } => {
            // The peer's code is untrusted text: only known codes keep their class.
            let exit = transfer_code_exit(code);
            let code = KNOWN_CODES
                .iter()
                .find(|&&k| k == code)
                .copied()
                .unwrap_or("remote");
            Failure { code, exit }
        }
        other => {
            let code = other.code();
            Failure {
                code,
                exit: transfer_code_exit(code),
            }
        }
    }
}

const KNOWN_CODES: &[&str] = &[
    "disk-full",
    "permission",
    "io",
    "unsafe-path",
    "too-many-entries",
    "manifest-too-large",
    "text-too-large",
    "protocol",
    "size-mismatch",
    "integrity",
    "conflict",
    "declined",
    "output-mismatch",
    "source-changed",
    "partial",
];

/// Classifies an error by the most specific cause in its chain.
pub fn classify(err: &anyhow::Error) -> Failure {
    for cause in err.chain() {
        if cause.downcast_ref::<Usage>().is_some() {
            return Failure {
                code: "usage",
                exit: 2,
            };
        }
        if cause.downcast_ref::<Interrupted>().is_some()
            || cause.downcast_ref::<InterruptedAtQuestion>().is_some()
            || cause.downcast_ref::<InterruptedAtPrompt>().is_some()
        {
            return Failure {
                code: "interrupted",
                exit: EXIT_INTERRUPTED,
            };
        }
        if let Some(f) = cause
            .downcast_ref::<SessionError>()
            .and_then(session_failure)
        {
            return f;
        }
        if cause.downcast_ref::<ferry_relay::RelayError>().is_some() {
            return Failure {
                code: "relay",
                exit: 4,
            };
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
        if cause
            .downcast_ref::<ferry_rendezvous::CodeError>()
            .is_some()
        {
            return Failure {
                code: "bad-code",
                exit: 2,
            };
        }
        if let Some(e) = cause.downcast_ref::<std::io::Error>() {
            return io_failure(e);
        }
    }
    Failure {
        code: "error",
        exit: EXIT_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            of(Interrupted),
            Failure {
                code: "interrupted",
                exit: 130
            }
        );
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
}
