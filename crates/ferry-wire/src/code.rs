//! The stable error codes: what `--json` error events carry, what a peer's error message carries, and the exit
//! status of the `ferry` command for each.
//!
//! They live here, the lowest crate every protocol uses, because they cross the wire (the transfer's error
//! message names one, and so will the share protocol's error replies) and every layer above names its failures
//! with them: one list, so the wire, the JSON events, the exit statuses and README's table cannot disagree.

use std::fmt;

macro_rules! codes {
    ($($(#[$doc:meta])* $name:ident = $text:literal => $exit:literal,)*) => {
        /// A stable short code naming the kind of a failure.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $name,)*
        }

        impl ErrorCode {
            /// Every code, in the order of README's "Exit status" table.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            /// The code as scripts and peers see it, e.g. `wrong-code`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$name => $text,)*
                }
            }

            /// The exit status of the `ferry` command that fails with this code.
            pub const fn exit_status(self) -> u8 {
                match self {
                    $(ErrorCode::$name => $exit,)*
                }
            }
        }
    };
}

codes! {
    /// Anything without a more specific code.
    Error = "error" => 1,
    /// A local I/O error.
    Io = "io" => 1,
    /// A local file or directory that may not be read or written.
    Permission = "permission" => 1,
    /// A file changed on the sender while it was sent.
    SourceChanged = "source-changed" => 1,
    /// The peer failed with a code this side does not know.
    Remote = "remote" => 1,
    /// A bad command line.
    Usage = "usage" => 2,
    /// A malformed code.
    BadCode = "bad-code" => 2,
    /// The PAKE failed, or the code is spent.
    WrongCode = "wrong-code" => 3,
    /// No peer found in time.
    PeerNotFound = "peer-not-found" => 4,
    /// The peer went away.
    PeerGone = "peer-gone" => 4,
    /// The peer does not speak ferry.
    NotFerry = "not-ferry" => 4,
    /// The peer speaks another version of ferry, or no common cipher suite.
    VersionMismatch = "version-mismatch" => 4,
    /// The relay refused, failed, or is no ferry relay.
    Relay = "relay" => 4,
    /// Received data does not match its hash.
    Integrity = "integrity" => 5,
    /// The channel was tampered with.
    Tampered = "tampered" => 5,
    /// The peer's identity is not the pinned one.
    IdentityMismatch = "identity-mismatch" => 5,
    /// The peer does not admit this machine's identity key (not paired with it, or removed there).
    NotAdmitted = "not-admitted" => 5,
    /// The disk is full, or the offer does not fit.
    DiskFull = "disk-full" => 6,
    /// An offered name exists where it would arrive.
    Conflict = "conflict" => 7,
    /// The offer was declined.
    Declined = "declined" => 7,
    /// The offer does not fit `receive -o`.
    OutputMismatch = "output-mismatch" => 7,
    /// A path from the peer breaks the name rules.
    UnsafePath = "unsafe-path" => 8,
    /// An offer with more entries than allowed.
    TooManyEntries = "too-many-entries" => 8,
    /// An offer whose file list needs more memory than allowed.
    ManifestTooLarge = "manifest-too-large" => 8,
    /// A text message over its limit.
    TextTooLarge = "text-too-large" => 8,
    /// A file's data is not the size offered.
    SizeMismatch = "size-mismatch" => 8,
    /// The peer broke the protocol.
    Protocol = "protocol" => 8,
    /// Some files were skipped; everything else arrived and verified.
    Partial = "partial" => 9,
    /// Ctrl-C, SIGTERM or SIGHUP.
    Interrupted = "interrupted" => 130,
}

impl ErrorCode {
    /// The code named `text`, if it is one.
    pub fn parse(text: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == text)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn every_code_parses_back_and_names_are_unique() {
        for &c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
        }
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        assert_eq!(ErrorCode::parse("\u{1b}[31mevil"), None);
    }
}
