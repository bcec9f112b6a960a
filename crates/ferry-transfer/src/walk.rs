//! The sender's walk: `PATH` arguments into a [`Manifest`].

use crate::manifest::{Entry, EntryKind, Manifest, MODE_MASK};
use crate::path::{check_name, check_path, symlink_target_inside};
use crate::TransferError;
use std::collections::HashSet;
use std::fs::{self, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Something the walk skipped, to be shown to the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkWarning {
    /// A symlink whose target leaves the tree of its argument (or is absolute); not sent.
    SymlinkOutside {
        /// The link.
        path: PathBuf,
        /// Its target.
        target: PathBuf,
    },
    /// A device, fifo or socket; not sent.
    Special {
        /// The skipped file.
        path: PathBuf,
    },
    /// A name the receiver would refuse (path too long); not sent.
    BadName {
        /// The skipped entry.
        path: PathBuf,
        /// Why.
        problem: crate::path::PathProblem,
    },
}

impl std::fmt::Display for WalkWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalkWarning::SymlinkOutside { path, target } => write!(
                f,
                "skipping symlink {} -> {}: it points outside what is sent",
                path.display(),
                target.display()
            ),
            WalkWarning::Special { path } => {
                write!(
                    f,
                    "skipping {}: not a file, directory or symlink",
                    path.display()
                )
            }
            WalkWarning::BadName { path, problem } => {
                write!(f, "skipping {}: {problem}", path.display())
            }
        }
    }
}

/// The result of a walk: the manifest to offer and what was skipped.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Entries in sending order (a directory before its contents), with their local sources.
    pub manifest: Manifest,
    /// Skipped entries.
    pub warnings: Vec<WalkWarning>,
}

/// Walks files and directories (recursively) into a manifest.
///
/// Each argument becomes a top-level entry named by its basename; an argument that is itself a
/// symlink is followed (the user named it). Inside directories, symlinks are kept as symlinks only
/// when their target stays inside the argument's tree ([`symlink_target_inside`]); other symlinks,
/// devices, fifos and sockets are skipped with a warning. Empty directories are kept.
pub fn walk<P: AsRef<Path>>(paths: &[P]) -> Result<Walk, TransferError> {
    let mut out = Walk::default();
    let mut tops = HashSet::new();
    for arg in paths {
        let arg = arg.as_ref();
        let meta =
            fs::metadata(arg).map_err(|e| TransferError::file(arg.display().to_string(), e))?;
        let name = match arg.file_name() {
            Some(n) => n.to_owned(),
            None => fs::canonicalize(arg)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_owned()))
                .ok_or_else(|| {
                    TransferError::file(
                        arg.display().to_string(),
                        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no name"),
                    )
                })?,
        };
        let name = name.as_bytes().to_vec();
        check_name(&name).map_err(|problem| TransferError::UnsafePath {
            path: arg.display().to_string(),
            problem,
        })?;
        if !tops.insert(name.clone()) {
            return Err(TransferError::DuplicatePath {
                path: crate::error::lossy(&name),
            });
        }
        let mut rel = name;
        if meta.is_dir() {
            push(
                &mut out.manifest,
                &rel,
                EntryKind::Dir,
                &meta,
                Vec::new(),
                arg,
            );
            walk_dir(arg, &mut rel, &mut out)?;
        } else if meta.is_file() {
            push(
                &mut out.manifest,
                &rel,
                EntryKind::File,
                &meta,
                Vec::new(),
                arg,
            );
        } else {
            out.warnings.push(WalkWarning::Special {
                path: arg.to_owned(),
            });
        }
    }
    Ok(out)
}

fn push(
    m: &mut Manifest,
    rel: &[u8],
    kind: EntryKind,
    meta: &Metadata,
    target: Vec<u8>,
    src: &Path,
) {
    m.entries.push(Entry {
        path: rel.to_vec(),
        kind,
        size: if kind == EntryKind::File {
            meta.len()
        } else {
            0
        },
        mode: meta.mode() & MODE_MASK,
        mtime: meta.mtime(),
        mtime_nsec: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
        target,
    });
    m.sources.push(src.to_owned());
}

fn walk_dir(dir: &Path, rel: &mut Vec<u8>, out: &mut Walk) -> Result<(), TransferError> {
    let err = |e| TransferError::file(dir.display().to_string(), e);
    let mut children: Vec<_> = fs::read_dir(dir)
        .map_err(err)?
        .collect::<Result<_, _>>()
        .map_err(err)?;
    children.sort_by_key(|c| c.file_name());
    for child in children {
        let path = child.path();
        let name = child.file_name();
        let base = rel.len();
        rel.push(b'/');
        rel.extend_from_slice(name.as_bytes());
        if let Err(problem) = check_path(rel) {
            out.warnings.push(WalkWarning::BadName { path, problem });
            rel.truncate(base);
            continue;
        }
        // Relative to the open directory (no walk of the whole path); never follows a symlink.
        let meta = child
            .metadata()
            .map_err(|e| TransferError::file(path.display().to_string(), e))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            push(
                &mut out.manifest,
                rel,
                EntryKind::Dir,
                &meta,
                Vec::new(),
                &path,
            );
            walk_dir(&path, rel, out)?;
        } else if ft.is_file() {
            push(
                &mut out.manifest,
                rel,
                EntryKind::File,
                &meta,
                Vec::new(),
                &path,
            );
        } else if ft.is_symlink() {
            let target = fs::read_link(&path)
                .map_err(|e| TransferError::file(path.display().to_string(), e))?;
            let t = target.as_os_str().as_bytes();
            if symlink_target_inside(rel, t) {
                push(
                    &mut out.manifest,
                    rel,
                    EntryKind::Symlink,
                    &meta,
                    t.to_vec(),
                    &path,
                );
            } else {
                out.warnings
                    .push(WalkWarning::SymlinkOutside { path, target });
            }
        } else {
            // Devices, fifos and sockets.
            out.warnings.push(WalkWarning::Special { path });
        }
        rel.truncate(base);
    }
    Ok(())
}
