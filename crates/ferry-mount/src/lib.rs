//! `ferry mount`'s file system: a paired peer's share as a local directory (writable when its share is).
//!
//! Layers, top to bottom: [`fuse`] is the only module of the mount that talks to the kernel (fuser);
//! [`inodes`] maps share paths to inode numbers and keeps what was last seen of each; [`files`] is the read
//! path (open files pinned to a version, a verified chunk store, pipelined fetches, streaming ahead);
//! [`writes`] is the write path's core (working copies pushed to the sharer), [`pending`] the name changes
//! made offline, sent when the link is back; [`source`] and
//! [`store`] are the traits the read path stands on: the share client and the chunk cache in the binary,
//! in-memory fakes in tests. [`caller`] tells whether the process behind a request is being killed (a push
//! gives up for it). [`lifecycle`] mounts and unmounts (lazily when busy, so no stale mount stays).
//! [`floor`] is no part of the mount: the cheapest FUSE read path, mounted the same way, for the benchmarks.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod cache;
pub mod caller;
pub mod files;
pub mod floor;
pub mod fuse;
pub mod inodes;
pub mod lifecycle;
pub mod pending;
pub mod remote;
pub mod source;
pub mod store;
pub mod writes;

/// The parsers of the journals the mount reads back from its working-copy directory, for the fuzz targets in
/// `fuzz/` (a tampered directory is input too). Not part of the API: compiled only with the `fuzzing`
/// feature, so the shipped crate exposes nothing more.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use crate::pending::Op;

    /// The queued change on one line of the pending-changes journal, or `None` if it is not one.
    pub fn pending_op(line: &str) -> Option<Op> {
        Op::decode(line)
    }

    /// The journal line of a queued change.
    pub fn pending_line(op: &Op) -> String {
        op.encode()
    }

    /// A working copy's journal in `text` encoded again (its canonical text), or `None` if it is not one.
    pub fn journal(text: &str) -> Option<String> {
        crate::writes::journal_again(text)
    }
}
