//! The share protocol: what `ferry pull`, `ferry ls` and `ferry mount` ask of a `ferry share`, over the channel.
//!
//! A client sends requests, each with an id it chose; the server answers each with one or more responses
//! carrying that id, in any order and interleaved with other requests' responses, so a large read never holds
//! back a small stat. [`wire`] holds every message's layout and checks. Content is verified: a read first
//! names the file version (its BLAKE3 root and size), and every data piece carries the proof that ties its
//! bytes to that root.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod bytes;
pub mod client;
pub mod fs;
pub mod io;
pub mod pull;
pub mod remote;
pub mod server;
pub mod subtree;
pub mod tree;
pub mod watch;
pub mod wire;
pub mod write;
