//! What a pull sends: a file or directory resolved beneath the share, walked and opened by descriptor
//! relative to it, never leaving it.
//!
//! The pulled path is resolved once, with `openat2(2)` and `RESOLVE_BENEATH` from the share's descriptor
//! (symlinks are followed only while they stay inside the share), and the file or directory found is kept
//! open. Everything below it is reached relative to that descriptor with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`: directories while walking, files while sending. A directory swapped for a symlink
//! after the walk saw it (to anywhere, inside the share or out) makes the open fail with `ELOOP`, which the
//! transfer engine reports as `source-changed`; nothing outside is ever listed or read. Symlinks inside the
//! subtree are sent as symlinks when their target stays inside what is sent (the receiver's rule), and
//! skipped otherwise, as `ferry send` skips them; devices, FIFOs and sockets are skipped.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use ferry_transfer::manifest::{Source, MODE_MASK};
use ferry_transfer::{Entry, EntryKind, OpenSource, Walk, WalkWarning};
use ferry_tree::path::{check_name, check_path, symlink_target_inside};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};

use crate::fs::{FsError, ShareRoot};
use crate::wire::{ErrorCode, SharePath};

/// A pulled file or directory, open, and its walk.
#[derive(Debug)]
pub struct Subtree {
    /// The file or directory, opened beneath the share.
    top: File,
    /// Where it is in the share (for messages).
    path: SharePath,
    /// The manifest to offer and what was skipped.
    walk: Walk,
}

/// How a walk's descriptors are opened below the pulled directory: inside it, through no symlink at all.
fn below() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

fn shown(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(bytes))
}

impl Subtree {
    /// Resolves `path` beneath `root` (the share itself when empty) and walks it. A regular file or a
    /// directory; anything else is refused with [`ErrorCode::UnsafePath`].
    pub fn resolve(root: &ShareRoot, path: &SharePath) -> Result<Subtree, FsError> {
        let at = root.open_at(path, OFlags::PATH)?;
        let (fd, st) = crate::fs::reopen_readable(&at).map_err(|e| crate::fs::fs_error(e, path))?;
        let shown_path = String::from_utf8_lossy(path.as_bytes()).into_owned();
        let Some(fd) = fd else {
            return Err((
                ErrorCode::UnsafePath,
                format!("{shown_path}: not a file or directory"),
            ));
        };
        let name = match ferry_tree::path::split_parent(path.as_bytes()) {
            (_, name) if !name.is_empty() => name.to_vec(),
            // The share itself: named as the shared directory is.
            _ => root
                .path()
                .file_name()
                .map(|n| n.as_bytes().to_vec())
                .filter(|n| check_name(n).is_ok())
                .unwrap_or_else(|| b"share".to_vec()),
        };
        let mut walk = Walk::default();
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {
                push(
                    &mut walk,
                    &name,
                    EntryKind::File,
                    &st,
                    Vec::new(),
                    PathBuf::new(),
                );
            }
            FileType::Directory => {
                let mut rel = name;
                walk_dir(&fd, &st, &mut rel, &mut Vec::new(), path, &mut walk)
                    .map_err(|e| (ErrorCode::Io, format!("{shown_path}: {e}")))?;
            }
            _ => {
                return Err((
                    ErrorCode::UnsafePath,
                    format!("{shown_path}: not a file or directory"),
                ))
            }
        }
        Ok(Subtree {
            top: File::from(fd),
            path: path.clone(),
            walk,
        })
    }

    /// The manifest to offer, with what the walk skipped.
    pub fn walk(&self) -> &Walk {
        &self.walk
    }

    /// Where the pulled path is in the share.
    pub fn path(&self) -> &SharePath {
        &self.path
    }
}

impl OpenSource for Subtree {
    fn open(&self, _entry: &Entry, source: &Source) -> io::Result<File> {
        let inner = source.path.as_os_str();
        if inner.is_empty() {
            // The pulled file itself: its descriptor again, read from the start.
            let mut f = self.top.try_clone()?;
            f.seek(SeekFrom::Start(0))?;
            return Ok(f);
        }
        let at = rustix::fs::openat2(
            &self.top,
            inner,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            below(),
        )
        .map_err(|e| match e {
            // Resolution met a symlink, or would leave: not what the walk saw.
            rustix::io::Errno::XDEV => io::Error::from(rustix::io::Errno::LOOP),
            e => io::Error::from(e),
        })?;
        match crate::fs::reopen_readable(&at)? {
            (Some(fd), st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                Ok(File::from(fd))
            }
            // A symlink (O_PATH opened the link itself), a FIFO, a device: not what the walk saw.
            _ => Err(io::Error::from(rustix::io::Errno::LOOP)),
        }
    }
}

/// Adds one entry; `inner` is its path below the pulled directory (empty for the pulled file itself).
fn push(walk: &mut Walk, rel: &[u8], kind: EntryKind, st: &Stat, target: Vec<u8>, inner: PathBuf) {
    let size = if kind == EntryKind::File {
        st.st_size as u64
    } else {
        0
    };
    walk.manifest.entries.push(Entry {
        path: rel.to_vec(),
        kind,
        size,
        mode: st.st_mode & MODE_MASK,
        mtime: st.st_mtime,
        mtime_nsec: (st.st_mtime_nsec as u32).min(999_999_999),
        target,
    });
    walk.manifest.sources.push(Source {
        path: inner,
        ino: st.st_ino,
        ctime: st.st_ctime,
        ctime_nsec: st.st_ctime_nsec as i64,
        held: None,
    });
    let allocated = match kind {
        EntryKind::File => (st.st_blocks as u64).saturating_mul(512).min(size),
        _ => 0,
    };
    walk.manifest.allocated.push(allocated);
}

/// Walks the open directory `dir` (named `rel` in the manifest, `inner` below the pulled directory), in
/// name order, a directory before its contents, as [`ferry_transfer::walk`] does.
fn walk_dir(
    dir: &OwnedFd,
    st: &Stat,
    rel: &mut Vec<u8>,
    inner: &mut Vec<u8>,
    top: &SharePath,
    out: &mut Walk,
) -> rustix::io::Result<()> {
    push(out, rel, EntryKind::Dir, st, Vec::new(), shown(inner));
    let mut names = Vec::new();
    for item in rustix::fs::Dir::read_from(dir)? {
        let name = item?.file_name().to_bytes().to_vec();
        // A put's temp file is no entry until it lands under its name.
        if name != b"." && name != b".." && !crate::write::is_temp(&name) {
            names.push(name);
        }
    }
    names.sort_unstable();
    let in_share = |inner: &[u8]| {
        let mut p = top.as_bytes().to_vec();
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(inner);
        shown(&p)
    };
    for name in names {
        let (rel_len, inner_len) = (rel.len(), inner.len());
        rel.push(b'/');
        rel.extend_from_slice(&name);
        if !inner.is_empty() {
            inner.push(b'/');
        }
        inner.extend_from_slice(&name);
        let os = OsStr::from_bytes(&name);
        let unreadable = |inner: &[u8], e: rustix::io::Errno| WalkWarning::Unreadable {
            path: in_share(inner),
            reason: io::Error::from(e).to_string(),
        };
        if let Err(problem) = check_path(rel) {
            out.warnings.push(WalkWarning::BadName {
                path: in_share(inner),
                problem,
            });
        } else {
            match rustix::fs::statat(dir, os, AtFlags::SYMLINK_NOFOLLOW) {
                // Gone meanwhile, or not ours to see.
                Err(e) => out.warnings.push(unreadable(inner, e)),
                Ok(child) => match FileType::from_raw_mode(child.st_mode) {
                    FileType::Directory => {
                        let opened = rustix::fs::openat2(
                            dir,
                            os,
                            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                            below(),
                        )
                        .and_then(|fd| rustix::fs::fstat(&fd).map(|st| (fd, st)));
                        match opened {
                            Ok((fd, st)) => walk_dir(&fd, &st, rel, inner, top, out)?,
                            Err(e) => out.warnings.push(unreadable(inner, e)),
                        }
                    }
                    FileType::RegularFile => {
                        push(out, rel, EntryKind::File, &child, Vec::new(), shown(inner));
                    }
                    FileType::Symlink => match rustix::fs::readlinkat(dir, os, Vec::new()) {
                        Err(e) => out.warnings.push(unreadable(inner, e)),
                        Ok(target) => {
                            let target = target.into_bytes();
                            if !target.is_empty() && symlink_target_inside(rel, &target) {
                                push(out, rel, EntryKind::Symlink, &child, target, shown(inner));
                            } else {
                                out.warnings.push(WalkWarning::SymlinkOutside {
                                    path: in_share(inner),
                                    target: shown(&target),
                                });
                            }
                        }
                    },
                    _ => out.warnings.push(WalkWarning::Special {
                        path: in_share(inner),
                    }),
                },
            }
        }
        rel.truncate(rel_len);
        inner.truncate(inner_len);
    }
    Ok(())
}
