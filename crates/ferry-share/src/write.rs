//! The sharer's side of writes: every path resolved beneath the share with no symlink in it, file content
//! landed through a temp file and an atomic rename, and the conflict rule.
//!
//! A put writes into `.ferry-put-<random>` in the target's directory (copying the base's content with
//! `copy_file_range` when the client sends only changed ranges), hashes the result and compares it with the
//! root the client names at the put's end: a mismatch changes nothing. Right before the rename, the conflict check: the path's
//! current version (its root, by the outboard cache; none when absent) must still be the put's base. Then the
//! temp file is renamed over the path (`RENAME_NOREPLACE` when the base is none), so a reader on the sharer
//! sees the old content or the new, never a mix. Otherwise the sharer's file stays as it is and the client's
//! content is renamed to a visible sibling, `NAME.conflict-PEER-YYYYMMDD-HHMMSS` (UTC, `-2`, `-3`, ... when
//! taken): nothing is lost. A temp file is removed when its put fails or its connection drops
//! ([`Upload`]'s drop), and [`ShareRoot::sweep_temps`] removes those a crash left behind.
//!
//! Space: a put promises its size before its temp file is made and is refused with
//! [`ErrorCode::DiskFull`] when the free space less the promises of the puts in progress (every session's)
//! and less a margin ([`MARGIN_PERCENT`] of the file system, or `--min-free` when larger) cannot hold it;
//! the promise goes with its [`Upload`], however that ends.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags, Timespec, Timestamps,
};
use rustix::io::Errno;

use crate::fs::{FsError, OutboardCache, ShareRoot};
use crate::server::{PutOutcome, WriteOp};
use crate::wire::{ErrorCode, PutHeader, SharePath, Time};

/// Names of put temp files start with this; listings leave them out and writes may not name them.
pub const TEMP_PREFIX: &[u8] = b".ferry-put-";

/// Puts leave at least this share (in percent) of the file system free, or `--min-free` when larger: a
/// writer cannot fill the sharer's disk.
pub const MARGIN_PERCENT: u64 = 5;

/// The bytes promised to the puts in progress on a share (all its sessions'): each put's size, less what its
/// temp file has taken of it since it started, so that free space is not counted twice.
#[derive(Debug, Default)]
pub(crate) struct Promises {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Promise>>,
}

impl Promises {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Promise>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug)]
struct Promise {
    /// The file system it is on.
    dev: u64,
    size: u64,
    /// The temp file, once made: its blocks beyond `start` are taken already.
    file: Option<Arc<File>>,
    start: u64,
}

impl Promise {
    fn outstanding(&self) -> u64 {
        let taken = self
            .file
            .as_deref()
            .map_or(0, |f| allocated(f).saturating_sub(self.start));
        self.size.saturating_sub(taken)
    }
}

/// The bytes `file` takes on its disk.
fn allocated(file: &File) -> u64 {
    rustix::fs::fstat(file).map_or(0, |st| (st.st_blocks as u64).saturating_mul(512))
}

/// A put's promise; dropping it (the put landed, failed, was cancelled, its connection went) releases it.
#[derive(Debug)]
struct Reservation {
    promises: Arc<Promises>,
    id: u64,
}

impl Reservation {
    /// From now on the promise shrinks by what `file` takes beyond `start` bytes.
    fn track(&self, file: &Arc<File>, start: u64) {
        if let Some(p) = self.promises.lock().get_mut(&self.id) {
            p.file = Some(file.clone());
            p.start = start;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.promises.lock().remove(&self.id);
    }
}

/// Whether `name` is a put's temp file.
pub fn is_temp(name: &[u8]) -> bool {
    name.starts_with(TEMP_PREFIX)
}

fn shown(path: &SharePath) -> String {
    String::from_utf8_lossy(path.as_bytes()).into_owned()
}

/// The code and message of a failed write.
fn write_error(e: Errno, path: &SharePath) -> FsError {
    let code = match e {
        Errno::EXIST => ErrorCode::Exists,
        Errno::NOTEMPTY => ErrorCode::NotEmpty,
        Errno::NOSPC | Errno::DQUOT | Errno::FBIG => ErrorCode::DiskFull,
        Errno::ROFS => ErrorCode::ReadOnly,
        Errno::INVAL => ErrorCode::BadRequest,
        _ => return crate::fs::fs_error(e, path),
    };
    (code, format!("{}: {}", shown(path), io::Error::from(e)))
}

fn io_error(e: io::Error, path: &SharePath) -> FsError {
    match e.raw_os_error() {
        Some(n) => write_error(Errno::from_raw_os_error(n), path),
        None => (ErrorCode::Io, format!("{}: {e}", shown(path))),
    }
}

fn os(name: &[u8]) -> &std::ffi::OsStr {
    std::ffi::OsStr::from_bytes(name)
}

/// What is at a name now, for the conflict check: a file's root, something that is no file, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Current {
    Absent,
    File([u8; 32]),
    Other,
}

impl Current {
    fn matches(self, base: Option<[u8; 32]>) -> bool {
        match (self, base) {
            (Current::Absent, None) => true,
            (Current::File(root), Some(base)) => root == base,
            _ => false,
        }
    }
}

impl ShareRoot {
    /// The directory `path` lies in (opened beneath the share, no symlink on the way) and its name. The
    /// share itself and put temp files cannot be written.
    fn parent_of(&self, path: &SharePath) -> Result<(OwnedFd, Vec<u8>), FsError> {
        if path.is_root() {
            return Err((
                ErrorCode::BadRequest,
                "the share itself cannot be written".into(),
            ));
        }
        let (parent, name) = ferry_tree::path::split_parent(path.as_bytes());
        if is_temp(name) {
            return Err((
                ErrorCode::UnsafePath,
                format!(
                    "{}: a name reserved for the sharer's temp files",
                    shown(path)
                ),
            ));
        }
        let rel: &[u8] = if parent.is_empty() { b"." } else { parent };
        let dir = rustix::fs::openat2(
            self.dir_fd(),
            os(rel),
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| crate::fs::fs_error(e, path))?;
        Ok((dir, name.to_vec()))
    }

    /// The file at `name` in `dir`, not following a symlink: `None` when absent or no regular file.
    fn open_current(dir: &OwnedFd, name: &[u8]) -> Result<Option<File>, Errno> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let at = rustix::fs::openat(dir, os(name), flags, Mode::empty())?;
        // The type first: a FIFO or a device there is never opened.
        match crate::fs::reopen_readable(&at)? {
            (Some(fd), st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                Ok(Some(File::from(fd)))
            }
            _ => Ok(None),
        }
    }

    fn current(
        dir: &OwnedFd,
        name: &[u8],
        cache: &OutboardCache,
        path: &SharePath,
    ) -> Result<Current, FsError> {
        match Self::open_current(dir, name) {
            Ok(Some(file)) => {
                let cached = cache.outboard(&file).map_err(|e| io_error(e, path))?;
                Ok(Current::File(cached.outboard.version().root))
            }
            Ok(None) | Err(Errno::LOOP) => Ok(Current::Other),
            Err(Errno::NOENT) => Ok(Current::Absent),
            // A directory opens read-only too; anything else that will not open is something there.
            Err(Errno::ACCESS | Errno::PERM | Errno::NXIO) => Ok(Current::Other),
            Err(e) => Err(write_error(e, path)),
        }
    }

    /// Starts a put: its temp file beside the target, holding the base's content when it starts from it.
    pub fn begin_put(&self, cache: &OutboardCache, put: PutHeader) -> Result<Upload, FsError> {
        let path = &put.path.clone();
        let (dir, name) = self.parent_of(path)?;
        let base_file = match (put.from_base, put.base) {
            (true, Some(base)) => {
                let file = Self::open_current(&dir, &name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| changed(path))?;
                let root = cache
                    .outboard(&file)
                    .map_err(|e| io_error(e, path))?
                    .outboard
                    .version()
                    .root;
                if root != base {
                    return Err(changed(path));
                }
                Some(file)
            }
            _ => None,
        };
        // Promised before the temp file exists: nothing is written for a put that does not fit.
        let reserved = self.reserve(&dir, path, put.size)?;
        let (file, temp) = create_temp(&dir).map_err(|e| write_error(e, path))?;
        // A put from no base usually arrives in order from its start: hashed as it comes.
        let hashed = (!put.from_base).then(RunningRoot::new);
        let upload = Upload {
            dir,
            name,
            temp,
            file: Arc::new(file),
            put,
            hashed,
            landed: false,
            reserved,
        };
        if let Some(base) = base_file {
            let len = base.metadata().map_err(|e| io_error(e, path))?.len();
            copy_range(&base, &upload.file, len.min(upload.put.size))
                .map_err(|e| io_error(e, path))?;
        }
        upload
            .file
            .set_len(upload.put.size)
            .map_err(|e| io_error(e, &upload.put.path))?;
        // A new temp file starts empty; a copied base's blocks were taken already (counted again, to be
        // safe: on a file system sharing extents, rewriting them takes new blocks the file's count misses).
        let start = match upload.put.from_base {
            true => allocated(&upload.file),
            false => 0,
        };
        upload.reserved.track(&upload.file, start);
        Ok(upload)
    }

    /// How many puts hold a promise of space, and the bytes they may still take.
    pub fn promised(&self) -> (usize, u64) {
        let open = self.promises.lock();
        (open.len(), open.values().map(Promise::outstanding).sum())
    }

    /// Promises `size` bytes to a put in `dir`, or refuses it with [`ErrorCode::DiskFull`] when the free
    /// space, less what puts in progress may still take and less the margin, has no room for it.
    fn reserve(&self, dir: &OwnedFd, path: &SharePath, size: u64) -> Result<Reservation, FsError> {
        // Looked at and promised under one lock: two puts never both count the same free bytes.
        let mut open = self.promises.lock();
        let vfs = rustix::fs::fstatvfs(dir).map_err(|e| write_error(e, path))?;
        // Keyed by device: a file system mounted inside the share has space of its own.
        let dev = rustix::fs::fstat(dir)
            .map_err(|e| write_error(e, path))?
            .st_dev;
        let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
        let total = vfs.f_blocks.saturating_mul(vfs.f_frsize);
        let margin = (total / 100 * MARGIN_PERCENT).max(self.min_free);
        let promised: u64 = open
            .values()
            .filter(|p| p.dev == dev)
            .map(Promise::outstanding)
            .sum();
        if size > free.saturating_sub(promised).saturating_sub(margin) {
            return Err((
                ErrorCode::DiskFull,
                format!(
                    "{}: {size} bytes do not fit ({free} bytes free, {promised} promised to writes in \
                     progress, {margin} kept free: {MARGIN_PERCENT} % of the file system or the sharer's \
                     --min-free, the larger)",
                    shown(path)
                ),
            ));
        }
        let id = self.promises.next.fetch_add(1, Ordering::Relaxed);
        open.insert(
            id,
            Promise {
                dev,
                size,
                file: None,
                start: 0,
            },
        );
        Ok(Reservation {
            promises: self.promises.clone(),
            id,
        })
    }

    /// Runs a write other than a put (`peer` names a rename's conflict copy). A removal, or a rename over
    /// a file, that names the version it meant is checked against the file and done under the landing lock
    /// puts take: a file changed since stays (the removal fails with [`ErrorCode::Conflict`], the renamed
    /// file goes beside it, [`PutOutcome::Conflicted`]).
    pub fn write(
        &self,
        cache: &OutboardCache,
        peer: &str,
        op: &WriteOp,
    ) -> Result<PutOutcome, FsError> {
        match op {
            WriteOp::Mkdir { path, mode } => {
                let (dir, name) = self.parent_of(path)?;
                rustix::fs::mkdirat(&dir, os(&name), Mode::from_bits_truncate(mode & 0o777))
                    .map_err(|e| write_error(e, path))
            }
            WriteOp::Rmdir { path } => {
                let (dir, name) = self.parent_of(path)?;
                rustix::fs::unlinkat(&dir, os(&name), AtFlags::REMOVEDIR)
                    .map_err(|e| write_error(e, path))
            }
            WriteOp::Unlink { path, base } => {
                let (dir, name) = self.parent_of(path)?;
                let _landing = landing_lock(path);
                if let Some(base) = base {
                    // Gone already is gone: only another file there now is a conflict.
                    let now = Self::current(&dir, &name, cache, path)?;
                    if !matches!(now, Current::Absent) && !now.matches(Some(*base)) {
                        return Err((
                            ErrorCode::Conflict,
                            format!(
                                "{}: changed on the sharer since that version; it stays",
                                shown(path)
                            ),
                        ));
                    }
                }
                rustix::fs::unlinkat(&dir, os(&name), AtFlags::empty())
                    .map_err(|e| write_error(e, path))
            }
            WriteOp::Rename {
                from,
                to,
                replace,
                base,
            } => return self.rename(cache, peer, from, to, *replace, *base),
            WriteOp::SetAttr { path, mode, mtime } => self.set_attr(path, *mode, *mtime),
            WriteOp::Symlink { path, target } => {
                if !crate::wire::link_target_inside_share(path.as_bytes(), target) {
                    return Err((
                        ErrorCode::UnsafePath,
                        format!("{}: the target leads outside the share", shown(path)),
                    ));
                }
                let (dir, name) = self.parent_of(path)?;
                rustix::fs::symlinkat(os(target), &dir, os(&name)).map_err(|e| write_error(e, path))
            }
        }
        .map(|()| PutOutcome::Written)
    }

    /// Renames `from` to `to`; with `base`, a file at `to` that is no longer that version stays and
    /// `from` lands beside it under a conflict name, as a put's content would.
    fn rename(
        &self,
        cache: &OutboardCache,
        peer: &str,
        from: &SharePath,
        to: &SharePath,
        replace: bool,
        base: Option<[u8; 32]>,
    ) -> Result<PutOutcome, FsError> {
        let (from_dir, from_name) = self.parent_of(from)?;
        let (to_dir, to_name) = self.parent_of(to)?;
        let flags = match replace {
            true => RenameFlags::empty(),
            false => RenameFlags::NOREPLACE,
        };
        links_stay_inside(&from_dir, &from_name, from, to)?;
        // The check and the rename are one step against puts of `to` (they land under the same lock).
        let _landing = landing_lock(to);
        if let Some(base) = base.filter(|_| replace) {
            let now = Self::current(&to_dir, &to_name, cache, to)?;
            if !matches!(now, Current::Absent) && !now.matches(Some(base)) {
                let name = keep_beside(&from_dir, &from_name, &to_dir, &to_name, peer, to)?;
                return Ok(PutOutcome::Conflicted(name));
            }
        }
        rustix::fs::renameat_with(&from_dir, os(&from_name), &to_dir, os(&to_name), flags)
            .map_err(|e| write_error(e, from))?;
        Ok(PutOutcome::Written)
    }

    fn set_attr(
        &self,
        path: &SharePath,
        mode: Option<u32>,
        mtime: Option<Time>,
    ) -> Result<(), FsError> {
        let (dir, name) = self.parent_of(path)?;
        // Held by an O_PATH descriptor: what is checked is what is changed, even if the name is swapped.
        let fd = rustix::fs::openat(
            &dir,
            os(&name),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| write_error(e, path))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| write_error(e, path))?;
        match FileType::from_raw_mode(st.st_mode) {
            // The same inode is reached from outside the share too: its mode is not the share's to change.
            FileType::RegularFile if mode.is_some() && st.st_nlink > 1 => {
                return Err((
                    ErrorCode::HardLinked,
                    format!(
                        "{}: has other hard links (it may be outside the share): its mode stays",
                        shown(path)
                    ),
                ))
            }
            FileType::RegularFile | FileType::Directory => {}
            FileType::Symlink if mode.is_none() => {}
            FileType::Symlink => {
                return Err((
                    ErrorCode::WrongKind,
                    format!("{}: a symlink has no permission bits", shown(path)),
                ))
            }
            _ => {
                return Err((
                    ErrorCode::UnsafePath,
                    format!("{}: not a file, directory or symlink", shown(path)),
                ))
            }
        }
        // The descriptor's inode through /proc: chmod and utimens of exactly what was checked.
        let proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Some(mode) = mode {
            rustix::fs::chmodat(
                rustix::fs::CWD,
                proc.as_str(),
                Mode::from_bits_truncate(mode & 0o777),
                AtFlags::empty(),
            )
            .map_err(|e| write_error(e, path))?;
        }
        if let Some(t) = mtime {
            if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                // utimensat does not follow the last name with this flag: the symlink itself.
                rustix::fs::utimensat(&dir, os(&name), &times(t), AtFlags::SYMLINK_NOFOLLOW)
            } else {
                rustix::fs::utimensat(rustix::fs::CWD, proc.as_str(), &times(t), AtFlags::empty())
            }
            .map_err(|e| write_error(e, path))?;
        }
        Ok(())
    }

    /// Removes put temp files that a crash left in the share (those last written before `before`), walking
    /// the whole share without following symlinks. Returns how many it removed.
    pub fn sweep_temps(&self, before: SystemTime) -> usize {
        let mut removed = 0;
        let mut dirs: Vec<Vec<u8>> = vec![b".".to_vec()];
        while let Some(rel) = dirs.pop() {
            let Ok(dir) = rustix::fs::openat2(
                self.dir_fd(),
                os(&rel),
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            ) else {
                continue;
            };
            let Ok(mut reader) = rustix::fs::Dir::read_from(&dir) else {
                continue;
            };
            while let Some(Ok(item)) = reader.read() {
                let name = item.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let Ok(st) = rustix::fs::statat(&dir, os(name), AtFlags::SYMLINK_NOFOLLOW) else {
                    continue;
                };
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory => {
                        let mut sub = if rel == b"." { Vec::new() } else { rel.clone() };
                        if !sub.is_empty() {
                            sub.push(b'/');
                        }
                        sub.extend_from_slice(name);
                        dirs.push(sub);
                    }
                    FileType::RegularFile if is_temp(name) => {
                        let mtime = std::time::UNIX_EPOCH
                            + std::time::Duration::new(
                                st.st_mtime.max(0) as u64,
                                st.st_mtime_nsec as u32,
                            );
                        if mtime < before
                            && rustix::fs::unlinkat(&dir, os(name), AtFlags::empty()).is_ok()
                        {
                            removed += 1;
                        }
                    }
                    _ => {}
                }
            }
        }
        removed
    }
}

fn changed(path: &SharePath) -> FsError {
    (
        ErrorCode::Changed,
        format!(
            "{}: no longer the base version; send the whole content",
            shown(path)
        ),
    )
}

fn times(t: Time) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: t.secs,
            tv_nsec: t.nanos.into(),
        },
    }
}

/// Creates a new temp file in `dir` (0600, exclusive).
fn create_temp(dir: &OwnedFd) -> Result<(File, Vec<u8>), Errno> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let seed = format!("{}-{n}-{nanos}", std::process::id());
        let hash = blake3::hash(seed.as_bytes());
        let mut name = TEMP_PREFIX.to_vec();
        name.extend_from_slice(hash.to_hex()[..16].as_bytes());
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, os(&name), flags, Mode::from_bits_truncate(0o600)) {
            Ok(fd) => return Ok((File::from(fd), name)),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Copies the first `len` bytes of `from` to `to` (in the kernel, sharing extents where the file system can).
fn copy_range(from: &File, to: &File, len: u64) -> io::Result<()> {
    let (mut src, mut dst) = (0u64, 0u64);
    while src < len {
        let want = (len - src).min(1 << 30) as usize;
        let n = rustix::fs::copy_file_range(from, Some(&mut src), to, Some(&mut dst), want)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// BLAKE3 of the first `len` bytes of `file`: the root reads verify against.
pub(crate) fn hash(file: &File, len: u64) -> io::Result<[u8; 32]> {
    hash_rest(file, blake3::Hasher::new(), 0, len)
}

/// Feeds bytes `from..len` of `file` to `hasher` and gives the root.
fn hash_rest(file: &File, hasher: blake3::Hasher, from: u64, len: u64) -> io::Result<[u8; 32]> {
    hash_rest_unless(file, hasher, from, len, &mut || false)
        .map(|root| root.expect("never stopped"))
}

/// [`hash_rest`], looking at `stop` every 64 MiB: `None` once it says to stop. Holes are hashed as the zeros
/// they read as, without being read (`SEEK_DATA`/`SEEK_HOLE`): a file grown by a truncate costs its hash,
/// not its reads too.
fn hash_rest_unless(
    file: &File,
    mut hasher: blake3::Hasher,
    from: u64,
    len: u64,
    stop: &mut dyn FnMut() -> bool,
) -> io::Result<Option<[u8; 32]>> {
    const LOOK_EVERY: u64 = 64 << 20;
    let mut buf = vec![0u8; (len - from.min(len)).min(1 << 20) as usize];
    let zeros = vec![0u8; buf.len()];
    let mut at = from;
    let mut look_at = from + LOOK_EVERY;
    while at < len {
        let (end, hole) = match ferry_tree::fsys::region_at(file, at)? {
            ferry_tree::fsys::Region::Data(end) => (end.min(len), false),
            ferry_tree::fsys::Region::Hole(end) => (end.min(len), true),
        };
        // A region that ends where it starts (the file changing under the hash) is read as data, so the
        // loop always moves on.
        let (end, hole) = match end > at {
            true => (end, hole),
            false => ((at + buf.len() as u64).min(len), false),
        };
        while at < end {
            if at >= look_at {
                if stop() {
                    return Ok(None);
                }
                look_at = at + LOOK_EVERY;
            }
            let n = (end - at).min(buf.len() as u64) as usize;
            match hole {
                true => {
                    hasher.update(&zeros[..n]);
                }
                false => {
                    file.read_exact_at(&mut buf[..n], at)?;
                    hasher.update(&buf[..n]);
                }
            }
            at += n as u64;
        }
    }
    Ok(Some(*hasher.finalize().as_bytes()))
}

/// The root of a put's content, hashed as its bytes go by: on the client as they are sent, on the sharer as
/// they are written. The bytes that come one after the other from the start (a new file, a file written
/// whole) are hashed as they come, so the file is not read again to be hashed; whatever did not come so (the
/// ranges of a file changed in place, holes) is read from the file at the end, and bytes written over ones
/// already hashed make the whole file read at the end.
#[derive(Debug, Clone)]
pub struct RunningRoot {
    /// The hash of the file's bytes `0..len` as they are now, while that holds.
    hashed: Option<(blake3::Hasher, u64)>,
}

impl Default for RunningRoot {
    fn default() -> Self {
        RunningRoot {
            hashed: Some((blake3::Hasher::new(), 0)),
        }
    }
}

impl RunningRoot {
    /// Nothing hashed yet.
    pub fn new() -> RunningRoot {
        RunningRoot::default()
    }

    /// `bytes` are the file's bytes at `offset` now (sent from it, or written into it).
    pub fn update(&mut self, offset: u64, bytes: &[u8]) {
        match &mut self.hashed {
            Some((hasher, len)) if *len == offset => {
                hasher.update(bytes);
                *len += bytes.len() as u64;
            }
            // Over bytes already hashed: the end reads the whole file.
            Some((_, len)) if offset < *len && !bytes.is_empty() => self.hashed = None,
            // Past them (a hole, a range ahead): read from the file at the end.
            _ => {}
        }
    }

    /// How many bytes from the start are hashed.
    pub fn hashed(&self) -> u64 {
        self.hashed.as_ref().map_or(0, |(_, len)| *len)
    }

    /// The root of `file`'s first `size` bytes: what was hashed, then the rest read from the file.
    pub fn root(&self, file: &File, size: u64) -> io::Result<[u8; 32]> {
        self.root_unless(file, size, &mut || false)
            .map(|root| root.expect("never stopped"))
    }

    /// [`RunningRoot::root`], looking at `stop` every 64 MiB of what is read back: `None` once it says to
    /// stop (a put the sharer refused at its start is not hashed to its end, which for a file grown to
    /// terabytes of holes would take hours).
    pub fn root_unless(
        &self,
        file: &File,
        size: u64,
        stop: &mut dyn FnMut() -> bool,
    ) -> io::Result<Option<[u8; 32]>> {
        match &self.hashed {
            Some((hasher, len)) if *len <= size => {
                hash_rest_unless(file, hasher.clone(), *len, size, stop)
            }
            _ => hash_rest_unless(file, blake3::Hasher::new(), 0, size, stop),
        }
    }
}

/// A put being received: its temp file in the target's directory, removed on drop unless it landed.
#[derive(Debug)]
pub struct Upload {
    dir: OwnedFd,
    name: Vec<u8>,
    temp: Vec<u8>,
    file: Arc<File>,
    put: PutHeader,
    /// The content hashed as it arrived (`None` for a put from a base, whose content is read at the end).
    hashed: Option<RunningRoot>,
    landed: bool,
    /// Its promise of space, kept until it lands or goes (dropped with it, whatever the way).
    reserved: Reservation,
}

impl Upload {
    /// The temp file's name (in the target's directory).
    pub fn temp_name(&self) -> &[u8] {
        &self.temp
    }

    /// The file the put writes.
    pub fn path(&self) -> &SharePath {
        &self.put.path
    }

    /// Writes `bytes` at `offset` of the new content (the server checked the range).
    pub fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<(), FsError> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| io_error(e, &self.put.path))?;
        if let Some(running) = &mut self.hashed {
            running.update(offset, bytes);
        }
        Ok(())
    }

    /// Verifies the content against `want`, the root the client named at the put's end, then lands it by the
    /// conflict rule (see the module).
    pub fn finish(
        mut self,
        cache: &OutboardCache,
        peer: &str,
        want: [u8; 32],
    ) -> Result<PutOutcome, FsError> {
        let path = self.put.path.clone();
        self.file.sync_data().map_err(|e| io_error(e, &path))?;
        // Holes after the last range are read back (zeros).
        let root = match &self.hashed {
            Some(running) => running.root(&self.file, self.put.size),
            None => hash(&self.file, self.put.size),
        }
        .map_err(|e| io_error(e, &path))?;
        if root != want {
            return Err((
                ErrorCode::Integrity,
                format!(
                    "{}: the content does not match its hash; nothing changed",
                    shown(&path)
                ),
            ));
        }
        rustix::fs::fchmod(&self.file, Mode::from_bits_truncate(self.put.mode & 0o777))
            .map_err(|e| write_error(e, &path))?;
        // The check and the rename are one step for puts of the same path: two peers' puts from one base
        // (two mounts appending to one log) both passed the check, and the second rename replaced the first
        // one's file, which its peer had been told was written.
        let _landing = landing_lock(&path);
        let now = ShareRoot::current(&self.dir, &self.name, cache, &path)?;
        let landed = if now.matches(self.put.base) {
            let flags = match self.put.base {
                None => RenameFlags::NOREPLACE,
                Some(_) => RenameFlags::empty(),
            };
            match rustix::fs::renameat_with(
                &self.dir,
                os(&self.temp),
                &self.dir,
                os(&self.name),
                flags,
            ) {
                Ok(()) => Ok(PutOutcome::Written),
                // Created meanwhile: a conflict like any other.
                Err(Errno::EXIST) => Err(()),
                Err(e) => return Err(write_error(e, &path)),
            }
        } else {
            Err(())
        };
        let outcome = match landed {
            Ok(o) => o,
            Err(()) => PutOutcome::Conflicted(keep_beside(
                &self.dir, &self.temp, &self.dir, &self.name, peer, &path,
            )?),
        };
        self.landed = true;
        if let Some(t) = self.put.mtime {
            // On the descriptor, after the rename: the landed file, and a stale-temp sweep never mistakes a
            // temp for an old one.
            let _ = rustix::fs::futimens(&self.file, &times(t));
        }
        Ok(outcome)
    }
}

/// Most entries looked at beneath a directory moved closer to the share's root (see [`links_stay_inside`]).
pub const MAX_MOVED_ENTRIES: usize = 10_000;

/// The depth of `path`'s directory below the share (0: at its root).
fn depth(path: &[u8]) -> usize {
    path.iter().filter(|&&b| b == b'/').count()
}

/// Refuses the move of `from` to `to` if it would make a symlink lead outside the share that stayed inside
/// it where it was: the link itself, or one beneath a directory moved closer to the share's root (only
/// those can climb out; at most [`MAX_MOVED_ENTRIES`] entries are looked at, and a larger tree is refused).
fn links_stay_inside(
    dir: &OwnedFd,
    name: &[u8],
    from: &SharePath,
    to: &SharePath,
) -> Result<(), FsError> {
    let escapes = |rel: &[u8], target: &[u8]| {
        let at = |top: &SharePath| [top.as_bytes(), rel].concat();
        crate::wire::link_target_inside_share(&at(from), target)
            && !crate::wire::link_target_inside_share(&at(to), target)
    };
    let refused = |why: &str| Err((ErrorCode::UnsafePath, format!("{}: {why}", shown(from))));
    let st = rustix::fs::statat(dir, os(name), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| write_error(e, from))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Symlink => {
            let target = rustix::fs::readlinkat(dir, os(name), Vec::new())
                .map_err(|e| write_error(e, from))?;
            match escapes(b"", target.as_bytes()) {
                true => refused("its target would lead outside the share from there"),
                false => Ok(()),
            }
        }
        FileType::Directory if depth(to.as_bytes()) < depth(from.as_bytes()) => {
            let top = rustix::fs::openat(
                dir,
                os(name),
                OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| write_error(e, from))?;
            let mut seen = 0usize;
            // Paths below `top` (each with a leading `/`), opened one at a time: few descriptors held.
            let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
            while let Some(rel) = dirs.pop() {
                let fd = match rel.is_empty() {
                    true => rustix::io::dup(&top),
                    false => rustix::fs::openat2(
                        &top,
                        os(&rel[1..]),
                        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                        Mode::empty(),
                        ResolveFlags::BENEATH
                            | ResolveFlags::NO_SYMLINKS
                            | ResolveFlags::NO_MAGICLINKS,
                    ),
                }
                .map_err(|e| write_error(e, from))?;
                let mut reader =
                    rustix::fs::Dir::read_from(&fd).map_err(|e| write_error(e, from))?;
                while let Some(item) = reader.read() {
                    let item = item.map_err(|e| write_error(e, from))?;
                    let entry = item.file_name().to_bytes();
                    if entry == b"." || entry == b".." {
                        continue;
                    }
                    seen += 1;
                    if seen > MAX_MOVED_ENTRIES {
                        return refused(&format!(
                            "more than {MAX_MOVED_ENTRIES} entries beneath it to check for symlinks \
                             leading out from there"
                        ));
                    }
                    let path = [&rel[..], b"/", entry].concat();
                    let Ok(st) = rustix::fs::statat(&fd, os(entry), AtFlags::SYMLINK_NOFOLLOW)
                    else {
                        continue;
                    };
                    match FileType::from_raw_mode(st.st_mode) {
                        FileType::Symlink => {
                            let target = rustix::fs::readlinkat(&fd, os(entry), Vec::new())
                                .map_err(|e| write_error(e, from))?;
                            if escapes(&path, target.as_bytes()) {
                                return refused(&format!(
                                    "the symlink {} beneath it would lead outside the share from there",
                                    String::from_utf8_lossy(&path[1..])
                                ));
                            }
                        }
                        FileType::Directory => dirs.push(path),
                        _ => {}
                    }
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Renames `name` in `dir` (a put's temp file, a renamed file) to a free `TARGET.conflict-PEER-DATE[-N]`
/// beside `target` in `target_dir`, and returns that name (with the landing lock of `path`, the target,
/// held: two conflicting writes never pick the same free name).
fn keep_beside(
    dir: &OwnedFd,
    name: &[u8],
    target_dir: &OwnedFd,
    target: &[u8],
    peer: &str,
    path: &SharePath,
) -> Result<Vec<u8>, FsError> {
    let stamp = utc_stamp(SystemTime::now());
    for n in 1..=1000u32 {
        let kept = conflict_name(target, peer, &stamp, n);
        match rustix::fs::renameat_with(
            dir,
            os(name),
            target_dir,
            os(&kept),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => return Ok(kept),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(write_error(e, path)),
        }
    }
    Err((
        ErrorCode::Io,
        format!("{}: no free conflict name", shown(path)),
    ))
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.landed {
            let _ = rustix::fs::unlinkat(&self.dir, os(&self.temp), AtFlags::empty());
        }
    }
}

impl AsFd for Upload {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Locks held while a put checks its base and lands, one of them by the path's hash: puts of one path
/// land one at a time in this process, those of others mostly side by side.
static LANDING: [std::sync::Mutex<()>; 64] = [const { std::sync::Mutex::new(()) }; 64];

/// The landing lock of `path`.
fn landing_lock(path: &SharePath) -> std::sync::MutexGuard<'static, ()> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.as_bytes().hash(&mut h);
    LANDING[(h.finish() % LANDING.len() as u64) as usize]
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The path of `name` in `path`'s directory (a conflict copy beside it).
pub(crate) fn sibling(path: &SharePath, name: &[u8]) -> Option<SharePath> {
    let (parent, _) = ferry_tree::path::split_parent(path.as_bytes());
    let mut sibling = parent.to_vec();
    if !sibling.is_empty() {
        sibling.push(b'/');
    }
    sibling.extend_from_slice(name);
    SharePath::new(&sibling).ok()
}

/// `NAME.conflict-PEER-STAMP` (then `-N` from 2 on), cut to a name's length limit at the front part.
pub fn conflict_name(name: &[u8], peer: &str, stamp: &str, n: u32) -> Vec<u8> {
    let peer: String = peer
        .chars()
        .take(64)
        .map(
            |c| match c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                true => c,
                false => '_',
            },
        )
        .collect();
    let mut tail = format!(".conflict-{peer}-{stamp}");
    if n > 1 {
        tail.push_str(&format!("-{n}"));
    }
    let keep = name.len().min(ferry_tree::path::MAX_NAME - tail.len());
    let mut out = name[..keep].to_vec();
    out.extend_from_slice(tail.as_bytes());
    out
}

/// `YYYYMMDD-HHMMSS` in UTC.
pub fn utc_stamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let [year, month, day, hour, minute, second] = utc_parts(secs);
    format!("{year:04}{month:02}{day:02}-{hour:02}{minute:02}{second:02}")
}

/// `secs` since the epoch in UTC: year, month, day, hour, minute, second.
pub fn utc_parts(secs: i64) -> [i64; 6] {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    [year, month, day, rest / 3600, rest % 3600 / 60, rest % 60]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_names_are_valid_names_with_the_peer_and_the_time() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        let stamp = utc_stamp(t);
        assert_eq!(stamp, "20261118-110640");
        assert_eq!(
            conflict_name(b"a.txt", "bob", &stamp, 1),
            b"a.txt.conflict-bob-20261118-110640"
        );
        assert_eq!(
            conflict_name(b"a.txt", "b/o b", &stamp, 3),
            b"a.txt.conflict-b_o_b-20261118-110640-3"
        );
        let long = conflict_name(&[b'x'; 255], &"p".repeat(200), &stamp, 12);
        assert_eq!(long.len(), 255);
        ferry_tree::path::check_name(&long).unwrap();
    }

    /// Holes are hashed as zeros without being read, data between them read: the root is BLAKE3's of the
    /// whole content, and a stop asked for ends the hash.
    #[test]
    fn a_sparse_file_hashes_as_its_content_and_a_stop_ends_the_hash() {
        let dir = ferry_testkit::temp_dir("sparse-root");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        let len = 300u64 << 20;
        file.set_len(len).unwrap();
        file.write_all_at(b"data in the middle", 100 << 20).unwrap();
        file.write_all_at(b"and at the end", len - 14).unwrap();
        let mut content = vec![0u8; len as usize];
        file.read_exact_at(&mut content, 0).unwrap();
        let want = *blake3::hash(&content).as_bytes();
        assert_eq!(RunningRoot::new().root(&file, len).unwrap(), want);
        let mut looked = 0;
        let stopped = RunningRoot::new()
            .root_unless(&file, len, &mut || {
                looked += 1;
                true
            })
            .unwrap();
        assert_eq!(
            (stopped, looked),
            (None, 1),
            "stopped at the first look, after 64 MiB"
        );
    }

    /// On the sharer a client may write a range again with other bytes: what was hashed of the old ones
    /// no longer counts.
    #[test]
    fn bytes_written_over_hashed_ones_make_the_root_read_from_the_file() {
        let dir = ferry_testkit::temp_dir("running-root-over");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        let mut running = RunningRoot::new();
        for (at, bytes) in [(0u64, &b"first bytes"[..]), (6, b"BYTES, then more")] {
            file.write_all_at(bytes, at).unwrap();
            running.update(at, bytes);
        }
        let size = file.metadata().unwrap().len();
        assert_eq!(running.hashed(), 0);
        assert_eq!(
            running.root(&file, size).unwrap(),
            hash(&file, size).unwrap()
        );
    }

    /// Bytes of a file sent in order, out of order, twice, or not at all: the root is always the file's,
    /// and a file sent whole from its start is hashed without being read again.
    #[test]
    fn a_running_root_is_the_root_of_the_file_whatever_was_sent() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let dir = ferry_testkit::temp_dir("running-root");
        for round in 0..200 {
            let size = next(300_000);
            let content = ferry_testkit::pseudo_random(size as usize, round);
            let path = dir.path().join(format!("f{round}"));
            std::fs::write(&path, &content).unwrap();
            let file = File::open(&path).unwrap();
            let mut running = RunningRoot::new();
            let whole = next(3) == 0;
            let mut at = 0u64;
            while at < size {
                let n = (1 + next(40_000)).min(size - at);
                // Sent whole, or with jumps back (a range again) and ahead (a range left out).
                let from = match (whole, next(4)) {
                    (true, _) | (false, 0 | 1) => at,
                    (false, 2) => at.saturating_sub(next(10_000)),
                    (false, _) => (at + next(10_000)).min(size - n),
                };
                running.update(from, &content[from as usize..(from + n) as usize]);
                at = at.max(from + n);
            }
            assert_eq!(
                running.root(&file, size).unwrap(),
                hash(&file, size).unwrap(),
                "round {round}"
            );
            assert_eq!(
                *blake3::hash(&content).as_bytes(),
                hash(&file, size).unwrap()
            );
            if whole {
                assert_eq!(running.hashed(), size, "round {round}: sent whole");
            }
        }
    }
}
