//! Progress reporting from the engine to the CLI (progress bar or `--json` events).

use crate::{Entry, Totals};

/// Where a transfer stands; passed to every [`Progress`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressState {
    /// What the offer contains.
    pub totals: Totals,
    /// File bytes done, including bytes a resume did not need to send again.
    pub bytes_done: u64,
    /// Of `bytes_done`, bytes kept from an earlier transfer instead of being sent.
    pub bytes_resumed: u64,
    /// Files kept whole from an earlier transfer (their bytes are in `bytes_resumed`): none of their data
    /// moved in this one.
    pub files_resumed: u64,
    /// The offer is a text message.
    pub text: bool,
    /// Files finished (verified and renamed, on the receiving side), skipped ones included.
    pub files_done: u64,
    /// Files the receiver already had, identical (same size and BLAKE3): left as they were, not
    /// sent.
    pub files_skipped: u64,
    /// Of `bytes_done`, the bytes of the `files_skipped`.
    pub bytes_skipped: u64,
    /// Files of the offer left out because the sender could not open them.
    pub skipped: u64,
}

/// Receives progress events. Every method has an empty default, and `()` ignores everything.
///
/// `progress` is called at most once per packet, so it may do a little work (an `indicatif` bar
/// update, a rate-limited JSON line); `file_done` is called once per file.
pub trait Progress {
    /// The offer is known (sender: before it is sent; receiver: after it was checked).
    fn offer(&mut self, _state: &ProgressState) {}
    /// The receiver accepted the offer: from here on bytes move (rates and times count from here,
    /// not from the offer, which may wait for a person's answer).
    fn accepted(&mut self, _state: &ProgressState) {}
    /// The receiver hashes `files` files (`bytes` bytes) it already has under their final names,
    /// to learn which are identical (receiver: after the acceptance; sender: once the receiver's
    /// hashes arrived).
    fn checking(&mut self, _state: &ProgressState, _files: u64, _bytes: u64) {}
    /// Bytes moved; `current` is the file being transferred.
    fn progress(&mut self, _state: &ProgressState, _current: &Entry) {}
    /// One file is complete (receiver: verified and under its final name).
    fn file_done(&mut self, _state: &ProgressState, _entry: &Entry) {}
    /// A file of the offer is not sent: the sender could not open it (`reason`).
    fn skipped(&mut self, _state: &ProgressState, _entry: &Entry, _reason: &str) {}
    /// The whole transfer is complete and acknowledged.
    fn done(&mut self, _state: &ProgressState) {}
}

impl Progress for () {}
