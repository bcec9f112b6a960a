//! The receiver's destination tree: conflicts, directories, temporary files, final names.
//!
//! Everything goes through [`DirCursor`], so no symlink in the destination is ever traversed.
//! Files are written as `.NAME.ferry-part-TOKEN` (or `.ferry-part-TOKEN-INDEX` when NAME is too
//! long) in their final directory and renamed only after verification; without `overwrite`, the
//! rename uses `RENAME_NOREPLACE`, so even a file created meanwhile is never replaced. TOKEN is a
//! random 64-bit number of this offer kept in the resume log and never sent: no offered name and
//! no file the user had can be a temporary name, so removing a stale temporary file of an earlier
//! run can never remove anything else.
//!
//! Modes: the receiver's umask applies (`mode & !umask`), as with cp, tar and scp, and only to
//! what this receiver creates: a directory that existed before is never chmodded or re-timed.
//!
//! A file of at most one chunk keeps no partial data for a resume, so it needs no temporary name
//! at all: it is written as an unnamed file (`O_TMPFILE`) in its final directory and linked
//! under its final name after verification (`linkat`, which never replaces). An interrupted run
//! leaves nothing behind, and the rename per file is saved (about 10 % of the receiver's file
//! work on tmpfs). File systems without `O_TMPFILE` get the temporary name.

use crate::error::lossy;
use crate::{Entry, EntryKind, TransferError};
use ferry_tree::fsys::{process_umask, set_file_times, Dir, DirCursor, FileKind};
use ferry_tree::hash::FileHasher;
use ferry_tree::path::{check_name, split_parent, MAX_NAME, MAX_PATH};
use std::collections::HashSet;
use std::fs::{File, Permissions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const TEMP_SUFFIX: &[u8] = b".ferry-part-";

/// Files of at least this size that are not sparse get their space reserved when they start.
pub(crate) const RESERVE_FROM: u64 = 8 << 20;

/// Reserves the space of the rest of `temp` (entry `e`, written from `offset`) when the file is at
/// least [`RESERVE_FROM`] bytes, so that a full disk shows at the file's start, not at its end.
pub(crate) fn reserve(e: &Entry, temp: &TempFile, offset: u64) -> Result<(), TransferError> {
    if e.size >= RESERVE_FROM && offset < e.size {
        ferry_tree::fsys::reserve(&temp.file, offset, e.size - offset)
            .map_err(|err| TransferError::file(e.path_lossy(), err))?;
    }
    Ok(())
}

/// Moves past a hole of `len` bytes of `temp` (entry `e`) without writing it, and extends the
/// file over it: a hole at the end is part of the file, and a cut transfer keeps the chunks of a
/// hole for a resume (which keeps only what the partial file's size covers).
pub(crate) fn skip_hole(e: &Entry, temp: &mut TempFile, len: u64) -> Result<(), TransferError> {
    let err = |err| TransferError::file(e.path_lossy(), err);
    let pos = io::Seek::seek(&mut temp.file, io::SeekFrom::Current(len as i64)).map_err(err)?;
    temp.file.set_len(pos).map_err(err)
}

/// The destination directory, opened once.
pub(crate) struct Destination {
    cursor: DirCursor,
    overwrite: bool,
    /// Existing top-level directories may be received into.
    merge: bool,
    temp: Vec<u8>,
    /// The random part of this offer's temporary names.
    token: u64,
    /// The process umask, read once: every mode this receiver sets is `mode & !umask`.
    umask: u32,
    /// Whether small files are still tried as unnamed files (cleared when the file system refuses).
    unnamed: bool,
    /// Existing directories without owner write permission that this user owns, made writable
    /// for an overwriting receive: their paths and the modes they get back.
    unlocked: Vec<(Vec<u8>, u32)>,
}

impl Drop for Destination {
    fn drop(&mut self) {
        let _ = self.relock();
    }
}

/// A file being written: under its temporary name, or unnamed.
pub(crate) struct TempFile {
    file: File,
    /// Created with `O_TMPFILE`: linked, not renamed, to its final name.
    unnamed: bool,
    /// Created with its final mode (no `fchmod` needed).
    mode_set: bool,
}

impl TempFile {
    pub(crate) fn file(&mut self) -> &mut File {
        &mut self.file
    }
}

/// Whether creating an unnamed file failed because the file system cannot (rather than a real
/// error such as a full disk).
fn unnamed_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
    )
}

/// EEXIST as a conflict with what is in the destination, any other error as a file error.
fn conflict_or(e: &Entry, x: io::Error) -> TransferError {
    if x.raw_os_error() == Some(libc::EEXIST) {
        TransferError::Conflict {
            path: e.path_lossy(),
        }
    } else {
        TransferError::file(e.path_lossy(), x)
    }
}

fn is_not_dir(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP))
}

impl Destination {
    /// Opens (creating it if needed) the destination directory. `merge`: existing top-level
    /// directories may be received into (`overwrite` implies it).
    pub(crate) fn open(
        out: &Path,
        overwrite: bool,
        merge: bool,
    ) -> Result<Destination, TransferError> {
        let err = |e| TransferError::file(out.display().to_string(), e);
        std::fs::create_dir_all(out).map_err(err)?;
        Ok(Destination {
            cursor: DirCursor::new(Dir::open(out).map_err(err)?),
            overwrite,
            merge: merge || overwrite,
            temp: Vec::new(),
            token: ferry_tree::fsys::random_u64(),
            umask: process_umask(),
            unnamed: true,
            unlocked: Vec::new(),
        })
    }

    /// Uses `token` (this offer's, from the resume log) in temporary names.
    pub(crate) fn set_token(&mut self, token: u64) {
        self.token = token;
    }

    /// The temporary name of entry `index` named `name`.
    fn temp_name(&mut self, name: &[u8], index: u32) -> &[u8] {
        self.temp.clear();
        let token = format!("{:016x}", self.token);
        if 1 + name.len() + TEMP_SUFFIX.len() + token.len() <= MAX_NAME {
            self.temp.push(b'.');
            self.temp.extend_from_slice(name);
            self.temp.extend_from_slice(TEMP_SUFFIX);
            self.temp.extend_from_slice(token.as_bytes());
        } else {
            self.temp.push(b'.');
            self.temp.extend_from_slice(TEMP_SUFFIX);
            self.temp.extend_from_slice(token.as_bytes());
            self.temp.push(b'-');
            self.temp.extend_from_slice(index.to_string().as_bytes());
        }
        &self.temp
    }

    /// The parent directory of a wire path, which must exist by now.
    fn parent(&mut self, path: &[u8]) -> Result<&Dir, TransferError> {
        let (parent, _) = split_parent(path);
        match self.cursor.enter(parent) {
            Ok(Some(d)) => Ok(d),
            Ok(None) => Err(TransferError::file(
                lossy(parent),
                io::Error::from_raw_os_error(libc::ENOENT),
            )),
            Err(e) if is_not_dir(&e) => Err(TransferError::Conflict {
                path: lossy(parent),
            }),
            Err(e) => Err(TransferError::file(lossy(parent), e)),
        }
    }

    /// Fails with the first path (in sorted order) that exists and may not be replaced or, for
    /// a top-level directory, merged into. `ours(i)` tells whether entry `i` is a file this
    /// offer already finished, or a directory it created, in an earlier run.
    ///
    /// A regular file of the offered size under a file's final name is no conflict yet: it is
    /// returned (in sorted order) to be hashed, and is a conflict only if it differs. An existing
    /// symlink with the offered target is identical and left alone. Without `merge`, an existing
    /// top-level directory is received into only when the offer adds nothing to it (every entry
    /// below it exists), so that receiving the same tree again finds it identical.
    pub(crate) fn check_conflicts(
        &mut self,
        entries: &[Entry],
        order: &[u32],
        ours: impl Fn(u32) -> bool,
    ) -> Result<Vec<u32>, TransferError> {
        let mut same_size = Vec::new();
        // Existing top-level directories that may only be found complete.
        let mut complete_only: HashSet<&[u8]> = HashSet::new();
        let adds_to = |path: &[u8], complete_only: &HashSet<&[u8]>| {
            let top = path.split(|&b| b == b'/').next().unwrap_or(path);
            match complete_only.get(top) {
                Some(top) => Err(TransferError::Conflict { path: lossy(top) }),
                None => Ok(()),
            }
        };
        // A directory found missing: nothing below it can exist either, so its entries (often
        // all of them, in a fresh destination) cost no system call.
        let mut missing: Option<&[u8]> = None;
        for &i in order {
            let e = &entries[i as usize];
            let (parent, name) = split_parent(&e.path);
            if missing.is_some_and(|m| ferry_tree::fsys::is_component_prefix(m, parent)) {
                continue;
            }
            let dir = match self.cursor.enter(parent) {
                Ok(Some(d)) => d,
                Ok(None) => {
                    adds_to(parent, &complete_only)?;
                    missing = Some(parent);
                    continue;
                }
                // Something that is not a directory where one must go: replaced later when
                // overwriting, a conflict otherwise (reported at the entry itself).
                Err(e) if is_not_dir(&e) && self.overwrite => continue,
                Err(e) if is_not_dir(&e) => {
                    return Err(TransferError::Conflict {
                        path: lossy(parent),
                    })
                }
                Err(err) => return Err(TransferError::file(e.path_lossy(), err)),
            };
            let err = |err| TransferError::file(e.path_lossy(), err);
            let existing = dir.kind_and_size(name).map_err(err)?;
            let conflict = match (e.kind, existing) {
                (_, None) => {
                    adds_to(&e.path, &complete_only)?;
                    false
                }
                // Below a top-level directory of the offer that is new, ours or merged into.
                (EntryKind::Dir, Some((FileKind::Dir, _))) if !parent.is_empty() => false,
                (EntryKind::Dir, Some((FileKind::Dir, _))) => {
                    if !(self.merge || ours(i)) {
                        complete_only.insert(&e.path);
                    }
                    false
                }
                (EntryKind::Dir, Some(_)) => !self.overwrite,
                (_, Some((FileKind::Dir, _))) => true,
                (EntryKind::File, Some((FileKind::File, size))) if size == e.size && !ours(i) => {
                    same_size.push(i);
                    false
                }
                (EntryKind::Symlink, Some((FileKind::Symlink, _)))
                    if dir.readlink(name).map_err(err)? == e.target =>
                {
                    false
                }
                (_, Some(_)) => !(self.overwrite || ours(i)),
            };
            if conflict {
                return Err(TransferError::Conflict {
                    path: e.path_lossy(),
                });
            }
        }
        Ok(same_size)
    }

    /// Creates directory `e` (parents first, in sorted order); returns whether it was created
    /// (`false`: it already existed and is merged into).
    pub(crate) fn create_dir(&mut self, e: &Entry) -> Result<bool, TransferError> {
        let overwrite = self.overwrite;
        let (_, name) = split_parent(&e.path);
        let dir = self.parent(&e.path)?;
        let err = |err| TransferError::file(e.path_lossy(), err);
        match dir.mkdir(name, 0o700) {
            Ok(()) => Ok(true),
            Err(x) if x.raw_os_error() == Some(libc::EEXIST) => {
                match dir.kind(name).map_err(err)? {
                    Some(FileKind::Dir) if overwrite => {
                        self.unlock(e)?;
                        Ok(false)
                    }
                    Some(FileKind::Dir) => Ok(false),
                    Some(_) if overwrite => {
                        dir.unlink(name).map_err(err)?;
                        dir.mkdir(name, 0o700).map_err(err)?;
                        Ok(true)
                    }
                    _ => Err(TransferError::Conflict {
                        path: e.path_lossy(),
                    }),
                }
            }
            Err(x) => Err(err(x)),
        }
    }

    /// Makes existing directory `e` writable for its owner if it is not and this (non-root) user
    /// owns it, so that `--overwrite` can replace what is inside; [`Destination::relock`] gives
    /// the mode back. Root needs no write permission, and another user's directory stays as it is
    /// (replacing inside it then fails with "permission denied", as it should).
    fn unlock(&mut self, e: &Entry) -> Result<(), TransferError> {
        let err = |err| TransferError::file(e.path_lossy(), err);
        let uid = ferry_tree::fsys::effective_uid();
        let dir = match self.cursor.enter(&e.path) {
            Ok(Some(d)) => d,
            Ok(None) => return Err(err(io::Error::from_raw_os_error(libc::ENOENT))),
            Err(x) => return Err(err(x)),
        };
        let (owner, mode) = dir.owner_and_mode().map_err(err)?;
        if uid != 0 && owner == uid && mode & 0o200 == 0 {
            dir.set_mode(mode | 0o200).map_err(err)?;
            self.unlocked.push((e.path.clone(), mode));
        }
        Ok(())
    }

    /// Gives the directories made writable by [`Destination::unlock`] their modes back (deepest
    /// first); also run when the receive fails, as far as it can.
    pub(crate) fn relock(&mut self) -> Result<(), TransferError> {
        let mut first_error = None;
        while let Some((path, mode)) = self.unlocked.pop() {
            let restored = match self.cursor.enter(&path) {
                Ok(Some(d)) => d.set_mode(mode),
                Ok(None) => Err(io::Error::from_raw_os_error(libc::ENOENT)),
                Err(x) => Err(x),
            };
            if let Err(x) = restored {
                first_error.get_or_insert(TransferError::file(lossy(&path), x));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether a new temporary file for `e` is created with its final mode, which the kernel
    /// masks with the umask as wanted (saves a `fchmod` per file). Not for a mode without owner
    /// read and write: a partial file must stay readable and writable for a resume.
    fn created_with_mode(&self, e: &Entry) -> bool {
        e.mode & 0o600 == 0o600
    }

    /// Opens the temporary file of entry `index`: a new one when `offset` is 0 (unnamed for a
    /// file of at most one chunk, unless overwriting), else the kept partial file cut back to
    /// `offset`.
    pub(crate) fn open_temp(
        &mut self,
        e: &Entry,
        index: u32,
        offset: u64,
    ) -> Result<TempFile, TransferError> {
        let mode_set = offset == 0 && self.created_with_mode(e);
        let mode = if mode_set { e.mode } else { 0o600 };
        let try_unnamed = self.unnamed && offset == 0 && !self.overwrite && e.size <= crate::CHUNK;
        let err = |err| TransferError::file(e.path_lossy(), err);
        if try_unnamed {
            match self.parent(&e.path)?.create_unnamed(mode) {
                Ok(file) => {
                    return Ok(TempFile {
                        file,
                        unnamed: true,
                        mode_set,
                    })
                }
                Err(x) if unnamed_unsupported(&x) => self.unnamed = false,
                Err(x) => return Err(err(x)),
            }
        }
        let (_, name) = split_parent(&e.path);
        let temp = self.temp_name(name, index).to_vec();
        let dir = self.parent(&e.path)?;
        if offset > 0 {
            let mut file = dir.open_file(&temp, true).map_err(err)?;
            file.set_len(offset).map_err(err)?;
            io::Seek::seek(&mut file, io::SeekFrom::Start(offset)).map_err(err)?;
            return Ok(TempFile {
                file,
                unnamed: false,
                mode_set,
            });
        }
        let file = match dir.create_new(&temp, mode) {
            Ok(f) => f,
            Err(x) if x.raw_os_error() == Some(libc::EEXIST) => {
                // A stale temporary file of an earlier run of this offer (only this receiver
                // knows the token in its name): start over.
                dir.unlink(&temp).map_err(err)?;
                dir.create_new(&temp, mode).map_err(err)?
            }
            Err(x) => return Err(err(x)),
        };
        Ok(TempFile {
            file,
            unnamed: false,
            mode_set,
        })
    }

    /// Discards the temporary file of entry `index` (after a failed verification).
    pub(crate) fn remove_temp(&mut self, e: &Entry, index: u32, temp: TempFile) {
        drop(temp.file);
        if temp.unnamed {
            return;
        }
        let (_, name) = split_parent(&e.path);
        let temp = self.temp_name(name, index).to_vec();
        if let Ok(dir) = self.parent(&e.path) {
            let _ = dir.unlink(&temp);
        }
    }

    /// Gives a verified temporary file its mode (unless created with it), times and final name.
    pub(crate) fn finish_file(
        &mut self,
        e: &Entry,
        index: u32,
        temp: TempFile,
        replace: bool,
    ) -> Result<(), TransferError> {
        let err = |err| TransferError::file(e.path_lossy(), err);
        let TempFile {
            file,
            unnamed,
            mode_set,
        } = temp;
        if !mode_set {
            file.set_permissions(Permissions::from_mode(e.mode & !self.umask))
                .map_err(err)?;
        }
        set_file_times(&file, e.mtime, e.mtime_nsec).map_err(err)?;
        let replace = replace || self.overwrite;
        let (_, name) = split_parent(&e.path);
        if unnamed && !replace {
            let dir = self.parent(&e.path)?;
            return dir.link_unnamed(&file, name).map_err(|x| conflict_or(e, x));
        }
        let temp = self.temp_name(name, index).to_vec();
        let dir = self.parent(&e.path)?;
        if unnamed {
            // Linking never replaces: an earlier run's file is replaced by linking under the
            // temporary name, then renaming over it.
            match dir.link_unnamed(&file, &temp) {
                Err(x) if x.raw_os_error() == Some(libc::EEXIST) => dir
                    .unlink(&temp)
                    .and_then(|()| dir.link_unnamed(&file, &temp))
                    .map_err(err)?,
                linked => linked.map_err(err)?,
            }
        }
        drop(file);
        dir.rename(&temp, name, replace).map_err(|x| {
            if x.raw_os_error() == Some(libc::EEXIST) {
                let _ = dir.unlink(&temp);
            }
            conflict_or(e, x)
        })
    }

    /// Creates symlink `e` (after every file and directory), replacing only when overwriting.
    pub(crate) fn create_symlink(&mut self, e: &Entry, index: u32) -> Result<(), TransferError> {
        let overwrite = self.overwrite;
        let (_, name) = split_parent(&e.path);
        let temp = self.temp_name(name, index).to_vec();
        let dir = self.parent(&e.path)?;
        let err = |err| TransferError::file(e.path_lossy(), err);
        if dir.readlink(name).is_ok_and(|t| t == e.target) {
            // The same symlink is there (received before): left as it is.
            return Ok(());
        }
        let made = if overwrite {
            let _ = dir.unlink(&temp);
            dir.symlink(&e.target, &temp)
                .and_then(|_| dir.rename(&temp, name, true))
        } else {
            dir.symlink(&e.target, name)
        };
        match made {
            Ok(()) => {}
            Err(x) if x.raw_os_error() == Some(libc::EEXIST) => {
                return Err(TransferError::Conflict {
                    path: e.path_lossy(),
                })
            }
            Err(x) => return Err(err(x)),
        }
        dir.set_times(name, e.mtime, e.mtime_nsec).map_err(err)
    }

    /// Applies the mode (masked by the umask) and times of a directory this receiver created
    /// (after everything inside it is done).
    pub(crate) fn finish_dir(&mut self, e: &Entry) -> Result<(), TransferError> {
        let err = |err| TransferError::file(e.path_lossy(), err);
        let mode = e.mode & !self.umask;
        match self.cursor.enter(&e.path) {
            Ok(Some(d)) => d
                .set_mode_and_times(mode, e.mtime, e.mtime_nsec)
                .map_err(err),
            Ok(None) => Err(err(io::Error::from_raw_os_error(libc::ENOENT))),
            Err(x) => Err(err(x)),
        }
    }

    /// Re-hashes what an earlier run left of a file: the finished file under its final name
    /// (`complete`), or the first `chunks` chunks of its temporary file. Returns the hasher after
    /// the verified part and how many chunks of it match `expected` (all of them for a complete
    /// file whose hash matches); `None` if nothing can be kept.
    pub(crate) fn rehash(
        &mut self,
        e: &Entry,
        index: u32,
        complete: bool,
        expected: &[[u8; 32]],
        scratch: &mut [u8],
    ) -> Option<FileHasher> {
        let (_, name) = split_parent(&e.path);
        let target = if complete {
            name.to_vec()
        } else {
            self.temp_name(name, index).to_vec()
        };
        let dir = self.parent(&e.path).ok()?;
        let mut file = dir.open_file(&target, false).ok()?;
        let len = file.metadata().ok()?.len();
        let mut hasher = FileHasher::default();
        hasher.start(e.size, &[]);
        if complete {
            if len != e.size {
                return None;
            }
            hasher.update_from(&mut file, e.size, scratch).ok()?;
            return Some(hasher);
        }
        let mut good = 0;
        for (k, cv) in expected.iter().enumerate() {
            let chunk = crate::CHUNK.min(e.size - k as u64 * crate::CHUNK);
            if hasher.position() + chunk > len
                || hasher.update_from(&mut file, chunk, scratch).is_err()
            {
                break;
            }
            if hasher.chunk_hashes()[k] != *cv {
                break;
            }
            good = k + 1;
        }
        if good == 0 {
            return None;
        }
        hasher.start(e.size, &expected[..good]);
        Some(hasher)
    }
}

/// The offer's one top-level entry, or a refusal naming how many there are.
fn only_top(entries: &[Entry], what: &str) -> Result<usize, TransferError> {
    let mut tops = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.path.contains(&b'/'))
        .map(|(i, _)| i);
    match (tops.next(), tops.next()) {
        (Some(i), None) => Ok(i),
        _ => Err(TransferError::OutputMismatch {
            reason: format!(
                "the offer has {} top-level items; {what} takes exactly one",
                entries.iter().filter(|e| !e.path.contains(&b'/')).count()
            ),
        }),
    }
}

/// Gives the offer's one top-level entry (and so everything under it) the name `name`, before
/// anything is checked against the destination. Symlink targets need no change: they never climb
/// above their top-level entry ([`ferry_tree::path::symlink_target_inside`]).
pub(crate) fn rename_top(entries: &mut [Entry], name: &[u8]) -> Result<(), TransferError> {
    check_name(name).map_err(|problem| TransferError::UnsafePath {
        path: lossy(name),
        problem,
    })?;
    if name.contains(&b'/') {
        return Err(TransferError::OutputMismatch {
            reason: format!("the new name {:?} is more than one name", lossy(name)),
        });
    }
    let top = entries[only_top(entries, "a new name")?].path.len();
    for e in entries.iter_mut() {
        let mut path = Vec::with_capacity(name.len() + e.path.len() - top);
        path.extend_from_slice(name);
        path.extend_from_slice(&e.path[top..]);
        if path.len() > MAX_PATH {
            return Err(TransferError::UnsafePath {
                path: lossy(&path),
                problem: ferry_tree::path::PathProblem::PathTooLong,
            });
        }
        e.path = path;
    }
    Ok(())
}

/// Refuses, before it is accepted, an offer that is not one regular file (what a stream takes).
pub(crate) fn check_one_file(entries: &[Entry]) -> Result<(), TransferError> {
    let e = &entries[only_top(entries, "a stream")?];
    if e.kind != EntryKind::File {
        return Err(TransferError::OutputMismatch {
            reason: format!(
                "the offer is {} {:?}, not a regular file; a stream takes exactly one file",
                if e.kind == EntryKind::Dir {
                    "a directory"
                } else {
                    "a symlink"
                },
                e.path_lossy()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn entry(path: &str, size: u64) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind: crate::EntryKind::File,
            size,
            mode: 0o640,
            mtime: 1_600_000_000,
            mtime_nsec: 123,
            target: Vec::new(),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A small file is unnamed until verified, then linked with its mode and times; a large one
    /// (resumable) is written under its temporary name; a clash is a conflict that leaves the
    /// existing file alone, and an earlier run's file is replaced when asked.
    #[test]
    fn small_files_stay_unnamed_until_finished() {
        // tmpfs (as in the benchmarks) where there is one; ext4 and overlayfs also have O_TMPFILE.
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let root = base.join(format!("ferry-dest-unnamed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut dest = Destination::open(&root, false, false).unwrap();

        let small = entry("a", 5);
        let mut t = dest.open_temp(&small, 0, 0).unwrap();
        assert!(t.unnamed, "tmpfs and ext4 support O_TMPFILE");
        t.file().write_all(b"hello").unwrap();
        assert!(
            names(&root).is_empty(),
            "nothing is visible before the finish"
        );
        dest.finish_file(&small, 0, t, false).unwrap();
        assert_eq!(names(&root), ["a"]);
        let md = std::fs::metadata(root.join("a")).unwrap();
        assert_eq!(std::fs::read(root.join("a")).unwrap(), b"hello");
        assert_eq!(md.mode() & 0o7777, 0o640);
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123));

        // A clash: refused, the existing file untouched, nothing left behind.
        let mut t = dest.open_temp(&small, 0, 0).unwrap();
        t.file().write_all(b"other").unwrap();
        let clash = dest.finish_file(&small, 0, t, false);
        assert!(
            matches!(clash, Err(TransferError::Conflict { .. })),
            "{clash:?}"
        );
        assert_eq!(std::fs::read(root.join("a")).unwrap(), b"hello");
        assert_eq!(names(&root), ["a"]);

        // Replacing an earlier run's file (with a stale temporary file of ours in the way, and
        // the user's own file named like the old temporary names, which stays).
        let ours = String::from_utf8(dest.temp_name(b"a", 0).to_vec()).unwrap();
        assert!(
            ours.starts_with(".a.ferry-part-") && ours.len() == 14 + 16,
            "{ours}"
        );
        std::fs::write(root.join(&ours), b"stale").unwrap();
        std::fs::write(root.join(".a.ferry-part"), b"the user's").unwrap();
        let mut t = dest.open_temp(&small, 0, 0).unwrap();
        t.file().write_all(b"newer").unwrap();
        dest.finish_file(&small, 0, t, true).unwrap();
        assert_eq!(std::fs::read(root.join("a")).unwrap(), b"newer");
        assert_eq!(names(&root), [".a.ferry-part", "a"]);
        std::fs::remove_file(root.join(".a.ferry-part")).unwrap();

        // A discarded unnamed file leaves nothing.
        let b = entry("b", 3);
        let mut t = dest.open_temp(&b, 1, 0).unwrap();
        t.file().write_all(b"bad").unwrap();
        dest.remove_temp(&b, 1, t);
        assert_eq!(names(&root), ["a"]);

        // Larger than one chunk: a named temporary file, kept for a resume.
        let big = entry("big", crate::CHUNK + 1);
        let mut t = dest.open_temp(&big, 2, 0).unwrap();
        assert!(!t.unnamed);
        t.file().write_all(b"partial").unwrap();
        drop(t);
        let listed = names(&root);
        assert_eq!(listed.len(), 2);
        assert!(listed[0].starts_with(".big.ferry-part-"), "{listed:?}");
        assert_eq!(listed[1], "a");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
