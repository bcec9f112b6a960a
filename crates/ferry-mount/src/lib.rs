//! `ferry mount`'s file system: a paired peer's share as a local directory (writable when its share is).
//!
//! Layers, top to bottom: [`fuse`] is the only module of the mount that talks to the kernel (fuser);
//! [`inodes`] maps share paths to inode numbers and keeps what was last seen of each; [`files`] is the read
//! path (open files pinned to a version, a verified chunk store, pipelined fetches, streaming ahead);
//! [`writes`] is the write path's core (working copies pushed to the sharer), [`pending`] the name changes
//! made offline, sent when the link is back; [`source`] and
//! [`store`] are the traits the read path stands on: the share client and the chunk cache in the binary,
//! in-memory fakes in tests. [`lifecycle`] mounts and unmounts (lazily when busy, so no stale mount stays).
//! [`floor`] is no part of the mount: the cheapest FUSE read path, mounted the same way, for the benchmarks.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod cache;
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
