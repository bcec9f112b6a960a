//! ferry's file-system layer, below the transfer, share and mount protocols.
//!
//! - [`path`]: the rules every name from a peer must pass (no `..`, no `/` inside a component, no
//!   NUL, bounded lengths) and the symlink-target check.
//! - [`fsys`]: directory-relative file operations (`openat` and friends) that never follow a symlink,
//!   so a symlink planted anywhere below a root is never traversed. This crate holds the `unsafe`
//!   libc calls of the layers above it, each with a `// SAFETY:` comment; the protocol crates
//!   forbid `unsafe`.
//! - [`hash`]: streaming BLAKE3 over a file with one chaining value per 1 MiB [`hash::CHUNK`], so a
//!   resume verifies what it keeps.
//!
//! ```
//! use ferry_tree::path::{check_path, split_parent};
//!
//! assert!(check_path(b"photos/2024/a.jpg").is_ok());
//! assert!(check_path(b"../etc/passwd").is_err());
//! assert_eq!(split_parent(b"photos/a.jpg"), (&b"photos"[..], &b"a.jpg"[..]));
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod fsys;
pub mod hash;
pub mod path;
