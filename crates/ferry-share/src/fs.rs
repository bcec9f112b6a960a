//! The sharer's file-system layer: every path resolved beneath the shared directory by the kernel, and each
//! file version's outboard cached by identity.
//!
//! Paths are opened with `openat2(2)` and `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` from a descriptor of
//! the shared directory: `..`, absolute symlinks and symlinks that lead out are refused by the kernel during
//! the one resolution that also opens the file, so a symlink swapped in between two requests (or during
//! one) cannot lead out either. Symlinks inside the share are listed as symlinks and followed only while
//! they stay inside. Devices, FIFOs and sockets are neither listed nor opened (a FIFO is opened
//! non-blocking and refused by its type). Hard links are files like any other: with the kernel's
//! `protected_hardlinks` (the default), a user can only link files it may already read.
//!
//! Writes ([`crate::write`]) resolve more strictly: no symlink at all on the way to the directory written in.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::tree::{outboard_len, Outboard, Version};
use crate::wire::{Entry, ErrorCode, Kind, SharePath, Space, END};

/// A failed file-system request: its code for the client and a message.
pub type FsError = (ErrorCode, String);

/// The shared directory.
#[derive(Debug)]
pub struct ShareRoot {
    root: OwnedFd,
    path: PathBuf,
    /// Bytes promised to the puts in progress, shared by every session's puts.
    pub(crate) promises: Arc<crate::write::Promises>,
    /// The least free space a put may leave (`--min-free`; 5 % of the file system when larger).
    pub(crate) min_free: u64,
}

fn resolve() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// A put's temp file is not there for reads (it is no entry until it lands under its name).
fn hide_temp(path: &SharePath) -> Result<(), FsError> {
    match crate::write::is_temp(ferry_tree::path::split_parent(path.as_bytes()).1) {
        true => Err(fs_error(Errno::NOENT, path)),
        false => Ok(()),
    }
}

pub(crate) fn fs_error(e: Errno, path: &SharePath) -> FsError {
    let shown = String::from_utf8_lossy(path.as_bytes()).into_owned();
    let code = match e {
        Errno::NOENT => ErrorCode::NotFound,
        // EXDEV: resolution left the share; ELOOP: a symlink where none may be.
        Errno::XDEV | Errno::LOOP => ErrorCode::UnsafePath,
        Errno::ACCESS | Errno::PERM => ErrorCode::Permission,
        Errno::NOTDIR | Errno::ISDIR => ErrorCode::WrongKind,
        _ => ErrorCode::Io,
    };
    let why = match code {
        ErrorCode::UnsafePath => "leads outside the share".to_string(),
        _ => io::Error::from(e).to_string(),
    };
    (code, format!("{shown}: {why}"))
}

fn entry_of(name: &[u8], st: &Stat, target: Vec<u8>) -> Option<Entry> {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => return None,
    };
    Some(Entry {
        name: name.to_vec(),
        kind,
        size: if kind == Kind::File {
            st.st_size as u64
        } else {
            0
        },
        mode: st.st_mode & 0o777,
        mtime: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec as u32,
        target,
    })
}

impl ShareRoot {
    /// Opens the directory to share.
    pub fn open(dir: &Path) -> io::Result<ShareRoot> {
        let root = rustix::fs::open(
            dir,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(ShareRoot {
            root,
            path: dir.to_path_buf(),
            promises: Arc::default(),
            min_free: 0,
        })
    }

    /// Puts keep at least `bytes` free on the share's file system (or 5 % of it, when that is more).
    pub fn with_min_free(mut self, bytes: u64) -> ShareRoot {
        self.min_free = bytes;
        self
    }

    /// The shared directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The shared directory's descriptor, everything is opened beneath.
    pub(crate) fn dir_fd(&self) -> &OwnedFd {
        &self.root
    }

    /// Opens `path` beneath the share (symlinks followed only while they stay inside).
    pub(crate) fn open_at(&self, path: &SharePath, flags: OFlags) -> Result<OwnedFd, FsError> {
        hide_temp(path)?;
        let rel: &[u8] = if path.is_root() {
            b"."
        } else {
            path.as_bytes()
        };
        rustix::fs::openat2(
            &self.root,
            std::ffi::OsStr::from_bytes(rel),
            // openat2 takes no flag but these with O_PATH (EINVAL).
            match flags.contains(OFlags::PATH) {
                true => flags | OFlags::CLOEXEC,
                false => flags | OFlags::CLOEXEC | OFlags::NOCTTY,
            },
            Mode::empty(),
            resolve(),
        )
        .map_err(|e| fs_error(e, path))
    }

    /// The size and free space of the file system the share is on (`fstatvfs` of its root).
    pub fn space(&self) -> Result<Space, FsError> {
        let st = rustix::fs::fstatvfs(&self.root).map_err(|e| fs_error(e, &SharePath::root()))?;
        let unit = if st.f_frsize == 0 {
            st.f_bsize
        } else {
            st.f_frsize
        };
        Ok(space_of(
            unit,
            [st.f_blocks, st.f_bfree, st.f_bavail],
            [st.f_files, st.f_ffree],
        ))
    }

    /// The attributes of `path`; a symlink is described, not followed.
    pub fn stat(&self, path: &SharePath) -> Result<Entry, FsError> {
        hide_temp(path)?;
        let (parent, name) = ferry_tree::path::split_parent(path.as_bytes());
        let (st, target) = if path.is_root() {
            (
                rustix::fs::fstat(&self.root).map_err(|e| fs_error(e, path))?,
                Vec::new(),
            )
        } else {
            let parent_path = SharePath::new(parent).expect("a checked path's parent is checked");
            let dir = self.open_at(&parent_path, OFlags::DIRECTORY | OFlags::RDONLY)?;
            let st = rustix::fs::statat(
                &dir,
                std::ffi::OsStr::from_bytes(name),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| fs_error(e, path))?;
            let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                rustix::fs::readlinkat(&dir, std::ffi::OsStr::from_bytes(name), Vec::new())
                    .map_err(|e| fs_error(e, path))?
                    .into_bytes()
            } else {
                Vec::new()
            };
            (st, target)
        };
        entry_of(name, &st, target).ok_or_else(|| {
            (
                ErrorCode::UnsafePath,
                format!(
                    "{}: not a file, directory or symlink",
                    String::from_utf8_lossy(path.as_bytes())
                ),
            )
        })
    }

    /// One page of the directory `path`, in name order: up to `max` entries from position `cursor`, and the
    /// next page's cursor ([`END`] after the last). Devices, FIFOs and sockets are left out.
    pub fn list(
        &self,
        path: &SharePath,
        cursor: u64,
        max: u32,
    ) -> Result<(Vec<Entry>, u64), FsError> {
        let dir = self.open_at(path, OFlags::DIRECTORY | OFlags::RDONLY)?;
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut reader = rustix::fs::Dir::read_from(&dir).map_err(|e| fs_error(e, path))?;
        while let Some(item) = reader.read() {
            let item = item.map_err(|e| fs_error(e, path))?;
            let name = item.file_name().to_bytes();
            // A put's temp file is no entry until it lands under its name.
            if name != b"."
                && name != b".."
                && name.len() <= ferry_tree::path::MAX_NAME
                && !crate::write::is_temp(name)
            {
                names.push(name.to_vec());
            }
        }
        names.sort_unstable();
        let mut entries = Vec::new();
        let mut i = cursor as usize;
        while i < names.len() && entries.len() < max as usize {
            let name = &names[i];
            i += 1;
            let os = std::ffi::OsStr::from_bytes(name);
            let Ok(st) = rustix::fs::statat(&dir, os, AtFlags::SYMLINK_NOFOLLOW) else {
                continue; // gone meanwhile
            };
            let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                match rustix::fs::readlinkat(&dir, os, Vec::new()) {
                    Ok(t) if !t.as_bytes().is_empty() => t.into_bytes(),
                    _ => continue,
                }
            } else {
                Vec::new()
            };
            entries.extend(entry_of(name, &st, target));
        }
        let next = if i >= names.len() { END } else { i as u64 };
        Ok((entries, next))
    }

    /// Opens the regular file at `path` for reading (following symlinks only while they stay inside).
    pub fn open_file(&self, path: &SharePath) -> Result<File, FsError> {
        let at = self.open_at(path, OFlags::PATH)?;
        let (fd, st) = reopen_readable(&at).map_err(|e| fs_error(e, path))?;
        match (fd, FileType::from_raw_mode(st.st_mode)) {
            (Some(fd), FileType::RegularFile) => Ok(File::from(fd)),
            (_, FileType::Directory) => Err((
                ErrorCode::WrongKind,
                format!(
                    "{}: is a directory",
                    String::from_utf8_lossy(path.as_bytes())
                ),
            )),
            _ => Err((
                ErrorCode::UnsafePath,
                format!(
                    "{}: not a regular file",
                    String::from_utf8_lossy(path.as_bytes())
                ),
            )),
        }
    }
}

/// Opens for reading what the `O_PATH` descriptor `at` names if it is a regular file or a directory, and
/// returns its attributes: its type is looked at before any open a FIFO or a device would notice (a FIFO's
/// writer would see a reader appear, a device's driver an open). `None` for anything else.
pub(crate) fn reopen_readable(at: &OwnedFd) -> Result<(Option<OwnedFd>, Stat), Errno> {
    let st = rustix::fs::fstat(at)?;
    let flags = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => OFlags::RDONLY,
        FileType::Directory => OFlags::RDONLY | OFlags::DIRECTORY,
        _ => return Ok((None, st)),
    };
    // The descriptor's own inode again, whatever its name leads to now.
    let proc = format!("/proc/self/fd/{}", at.as_raw_fd());
    let fd = rustix::fs::open(
        proc.as_str(),
        flags | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    Ok((Some(fd), st))
}

/// What identifies a file version without reading it: device, inode, size, and both times to the
/// nanosecond. ctime changes with every write, also one that keeps the size and resets the mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId([u8; 56]);

impl FileId {
    /// The identity of `file` as it is now.
    pub fn of(file: &File) -> io::Result<FileId> {
        Ok(FileId::from_stat(&rustix::fs::fstat(file.as_fd())?))
    }

    fn from_stat(st: &Stat) -> FileId {
        let mut key = [0u8; 56];
        for (i, v) in [
            st.st_dev,
            st.st_ino,
            st.st_size as u64,
            st.st_mtime as u64,
            st.st_mtime_nsec,
            st.st_ctime as u64,
            st.st_ctime_nsec,
        ]
        .into_iter()
        .enumerate()
        {
            key[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        FileId(key)
    }

    fn field(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.0[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }

    fn size(&self) -> u64 {
        self.field(2)
    }
}

/// The cache file's first bytes.
const CACHE_MAGIC: &[u8; 16] = b"ferry outboard 3";
/// Magic, identity, size, root, checksum; the outboard follows.
const HEADER: u64 = 16 + 56 + 8 + 32 + 32;

/// Limits of an [`OutboardCache`].
#[derive(Debug, Clone, Copy)]
pub struct CacheLimits {
    /// Most bytes of cache files on disk; the least recently used go first.
    pub disk: u64,
    /// Most bytes of outboards held in memory (the rest are read from their cache files node by node).
    pub memory: u64,
    /// Most outboards known at once (each keeps its cache file open).
    pub entries: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            disk: 1 << 30,
            memory: 32 << 20,
            entries: 1024,
        }
    }
}

/// The outboard of a file as it was opened.
#[derive(Debug, Clone)]
pub struct Cached {
    /// Its outboard.
    pub outboard: Outboard,
    /// The identity it belongs to: a file whose identity changed since is another version.
    pub id: FileId,
    /// Whether it was hashed for this call (neither in memory nor in a cache file).
    pub hashed: bool,
}

/// Outboards of file versions already hashed, shared by every session of a share (clone it: clones share
/// one cache), persisted in a directory (`$XDG_CACHE_HOME/ferry/share/` for the CLI) so a restarted share
/// does not hash again what did not change.
///
/// One cache file per inode, `DEV-INODE` in hex, replaced (temp file + rename, 0600, directory 0700) when
/// the file changes: a header (magic, the file's identity, size, root hash, and a BLAKE3 checksum of the
/// header's fields and the outboard), then the outboard. A file is used only when its length, magic and
/// identity match and its checksum holds (checked once per load, reading 1/256 of the file's size); anything
/// else is rebuilt. Small outboards are held in memory within [`CacheLimits::memory`]; the others are read
/// from their cache file as pieces need them. Two sessions that open the same cold file hash it once (the
/// second waits); two processes may both hash it, and the last rename wins.
#[derive(Debug, Clone)]
pub struct OutboardCache {
    inner: Arc<CacheInner>,
}

#[derive(Debug)]
struct CacheInner {
    dir: PathBuf,
    limits: CacheLimits,
    state: Mutex<CacheState>,
    built: Condvar,
}

#[derive(Debug, Default)]
struct CacheState {
    loaded: HashMap<FileId, Loaded>,
    building: HashSet<FileId>,
    /// Bytes of memory of the loaded outboards, and reserved for ones being loaded.
    memory: u64,
    tick: u64,
    /// Bytes of cache files on disk as of the last scan plus those stored since (`None`: not scanned
    /// yet), and how many were stored since that scan.
    disk: Option<(u64, u32)>,
}

/// Cache files stored between two scans of the directory at most (the count corrects what other processes
/// did to it); between scans the bytes on disk are counted, not listed.
const STORES_PER_SCAN: u32 = 1024;

#[derive(Debug)]
struct Loaded {
    outboard: Outboard,
    used: u64,
}

impl OutboardCache {
    /// A cache in `dir` (created when first written) with the default limits.
    pub fn new(dir: PathBuf) -> Self {
        Self::with_limits(dir, CacheLimits::default())
    }

    /// A cache in `dir` with `limits`.
    pub fn with_limits(dir: PathBuf, limits: CacheLimits) -> Self {
        OutboardCache {
            inner: Arc::new(CacheInner {
                dir,
                limits,
                state: Mutex::new(CacheState::default()),
                built: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of outboards held in memory now.
    pub fn memory(&self) -> u64 {
        self.lock().memory
    }

    /// The outboard of `file` as it is now: known, from its cache file, or hashed (and stored when the file
    /// did not change while it was hashed).
    pub fn outboard(&self, file: &File) -> io::Result<Cached> {
        let id = FileId::of(file)?;
        let mut state = self.lock();
        loop {
            state.tick += 1;
            let tick = state.tick;
            if let Some(l) = state.loaded.get_mut(&id) {
                l.used = tick;
                let outboard = l.outboard.clone();
                return Ok(Cached {
                    outboard,
                    id,
                    hashed: false,
                });
            }
            if !state.building.contains(&id) {
                break;
            }
            state = self
                .inner
                .built
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        state.building.insert(id);
        let want = outboard_len(id.size());
        let in_memory = want <= self.inner.limits.memory / 4 && self.reserve(&mut state, want);
        drop(state);
        let got = self.load_or_build(file, id, in_memory);
        let mut state = self.lock();
        state.building.remove(&id);
        let kept = got.as_ref().is_ok_and(|c| c.id == id);
        if in_memory && !(kept && got.as_ref().is_ok_and(|c| c.outboard.memory() == want)) {
            state.memory -= want;
        }
        if let Ok(c) = &got {
            if kept {
                state.tick += 1;
                let used = state.tick;
                state.loaded.insert(
                    id,
                    Loaded {
                        outboard: c.outboard.clone(),
                        used,
                    },
                );
                let limit = self.inner.limits.entries;
                Self::evict(&mut state, |s| s.loaded.len() <= limit);
            }
        }
        drop(state);
        self.inner.built.notify_all();
        got
    }

    /// Makes room for `bytes` of memory (dropping unused outboards, least recently used first) and reserves
    /// it; false when it does not fit.
    fn reserve(&self, state: &mut CacheState, bytes: u64) -> bool {
        let max = self.inner.limits.memory;
        Self::evict(state, |s| s.memory + bytes <= max);
        let fits = state.memory + bytes <= max;
        if fits {
            state.memory += bytes;
        }
        fits
    }

    /// Drops unused outboards, least recently used first, until `enough`.
    fn evict(state: &mut CacheState, enough: impl Fn(&CacheState) -> bool) {
        while !enough(state) {
            let victim = state
                .loaded
                .iter()
                .filter(|(_, l)| !l.outboard.is_shared())
                .min_by_key(|(_, l)| l.used)
                .map(|(id, _)| *id);
            let Some(victim) = victim else { return };
            if let Some(l) = state.loaded.remove(&victim) {
                state.memory -= l.outboard.memory();
            }
        }
    }

    fn entry_path(&self, id: &FileId) -> PathBuf {
        self.inner
            .dir
            .join(format!("{:x}-{:x}", id.field(0), id.field(1)))
    }

    fn load_or_build(&self, file: &File, id: FileId, in_memory: bool) -> io::Result<Cached> {
        let path = self.entry_path(&id);
        if let Some(outboard) = load(&path, &id, in_memory) {
            return Ok(Cached {
                outboard,
                id,
                hashed: false,
            });
        }
        let size = id.size();
        let reader = || std::io::BufReader::with_capacity(1 << 20, ReadFrom { file, pos: 0 });
        let (temp, temp_path) = match self.create_temp() {
            Ok(t) => t,
            // No cache directory: hash into memory, as nothing else can hold it.
            Err(_) => {
                let outboard = Outboard::compute(reader(), size)?;
                let id = FileId::of(file)?;
                return Ok(Cached {
                    outboard,
                    id,
                    hashed: true,
                });
            }
        };
        let built = (|| {
            temp.set_len(HEADER + outboard_len(size))?;
            let version = Outboard::compute_into(reader(), size, &temp, HEADER)?;
            let mut header = header(&id, &version);
            let sum = checksum(&temp, &header, outboard_len(size))?;
            header.extend_from_slice(&sum);
            temp.write_all_at(&header, 0)?;
            Ok::<_, io::Error>(version)
        })();
        let version = match built {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_file(&temp_path);
                return Err(e);
            }
        };
        let after = FileId::of(file)?;
        if after == id {
            std::fs::rename(&temp_path, &path)?;
            self.stored(HEADER + outboard_len(size));
        } else {
            // Changed while hashed: serve what was hashed (pieces of new bytes fail the client's check)
            // but keep nothing.
            let _ = std::fs::remove_file(&temp_path);
        }
        let outboard = hold(version, temp, in_memory)?;
        Ok(Cached {
            outboard,
            id: after,
            hashed: true,
        })
    }

    fn create_temp(&self) -> io::Result<(File, PathBuf)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.inner.dir)?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = self
            .inner
            .dir
            .join(format!(".tmp-{}-{n}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok((file, path))
    }

    /// A cache file of `bytes` was stored: the directory is scanned and trimmed ([`OutboardCache::trim_disk`])
    /// only when the count says it may be over its limit, or after [`STORES_PER_SCAN`] stores, so that
    /// storing is not a walk of every cache file (it was, per store: a share taking thousands of new files
    /// spent most of its time there).
    fn stored(&self, bytes: u64) {
        let scan = {
            let mut state = self.lock();
            match &mut state.disk {
                Some((total, stores)) => {
                    *total += bytes;
                    *stores += 1;
                    *total > self.inner.limits.disk || *stores >= STORES_PER_SCAN
                }
                None => true,
            }
        };
        if scan {
            let total = self.trim_disk();
            self.lock().disk = Some((total, 0));
        }
    }

    /// Keeps the cache files within [`CacheLimits::disk`]: the least recently used (by mtime, which every
    /// load refreshes) are removed first; temp files left by a crash are removed after an hour. Returns the
    /// bytes left.
    fn trim_disk(&self) -> u64 {
        let Ok(read) = std::fs::read_dir(&self.inner.dir) else {
            return 0;
        };
        let now = std::time::SystemTime::now();
        let mut files = Vec::new();
        let mut total = 0;
        for entry in read.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            let mtime = meta.modified().unwrap_or(now);
            if entry.file_name().as_bytes().starts_with(b".tmp-") {
                if now.duration_since(mtime).unwrap_or_default().as_secs() > 3600 {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            total += meta.len();
            files.push((mtime, meta.len(), entry.path()));
        }
        files.sort_unstable();
        for (_, len, path) in files {
            if total <= self.inner.limits.disk {
                break;
            }
            // A file in use stays readable through its open descriptor.
            if std::fs::remove_file(path).is_ok() {
                total -= len;
            }
        }
        total
    }
}

/// The header of a cache file, without its checksum.
fn header(id: &FileId, version: &Version) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER as usize);
    h.extend_from_slice(CACHE_MAGIC);
    h.extend_from_slice(&id.0);
    h.extend_from_slice(&version.size.to_le_bytes());
    h.extend_from_slice(&version.root);
    h
}

/// BLAKE3 of `header` and the `len` outboard bytes after the header in `file`.
fn checksum(file: &File, header: &[u8], len: u64) -> io::Result<[u8; 32]> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(header);
    let mut buf = vec![0u8; (len.min(1 << 20)) as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], HEADER + at)?;
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(*hasher.finalize().as_bytes())
}

/// The outboard of the cache file at `path`, if it is whole and belongs to `id`.
fn load(path: &Path, id: &FileId, in_memory: bool) -> Option<Outboard> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .ok()?;
    let len = outboard_len(id.size());
    if file.metadata().ok()?.len() != HEADER + len {
        return None;
    }
    let mut head = [0u8; HEADER as usize];
    file.read_exact_at(&mut head, 0).ok()?;
    let (fields, sum) = head.split_at(HEADER as usize - 32);
    if !fields.starts_with(CACHE_MAGIC) || fields[16..72] != id.0 {
        return None;
    }
    let version = Version {
        size: u64::from_le_bytes(fields[72..80].try_into().ok()?),
        root: fields[80..112].try_into().ok()?,
    };
    if version.size != id.size() || checksum(&file, fields, len).ok()? != sum {
        return None;
    }
    // Recently used: the disk limit removes the others first.
    let _ = file.set_modified(std::time::SystemTime::now());
    hold(version, file, in_memory).ok()
}

/// The outboard in `file` after its header: read into memory, or read from the file as needed.
fn hold(version: Version, file: File, in_memory: bool) -> io::Result<Outboard> {
    if in_memory {
        let mut bytes = vec![0u8; outboard_len(version.size) as usize];
        file.read_exact_at(&mut bytes, HEADER)?;
        return Ok(Outboard::from_parts(version, bytes).expect("sized for its version"));
    }
    Ok(Outboard::from_file(version, Arc::new(file), HEADER))
}

/// Reads a shared `&File` from a position of its own (pread), leaving the file's offset alone.
struct ReadFrom<'a> {
    file: &'a File,
    pos: u64,
}

impl io::Read for ReadFrom<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Space figures from `statvfs`'s: `blocks` (all, free, available) counted in units of `unit` bytes, `files`
/// (all, free). A unit the wire cannot carry (not a power of two from 512 bytes to 16 MiB) is converted to
/// 4 KiB blocks, rounding down; each count is cut to the one it is part of.
fn space_of(unit: u64, blocks: [u64; 3], files: [u64; 2]) -> Space {
    let (block, scale) = match u32::try_from(unit) {
        Ok(b) if b.is_power_of_two() && (512..=16 << 20).contains(&b) => (b, None),
        _ => (4096, Some(unit)),
    };
    let count = |n: u64| match scale {
        None => n,
        Some(unit) => (u128::from(n) * u128::from(unit) / 4096).min(u128::from(u64::MAX)) as u64,
    };
    let total = count(blocks[0]);
    let free = count(blocks[1]).min(total);
    Space {
        block,
        blocks: total,
        free,
        available: count(blocks[2]).min(free),
        files: files[0],
        files_free: files[1].min(files[0]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_figures_fit_the_wire_whatever_the_file_system_reports() {
        let plain = space_of(4096, [100, 50, 40], [10, 5]);
        assert_eq!(
            (plain.block, plain.blocks, plain.free, plain.available),
            (4096, 100, 50, 40)
        );
        // A unit the wire cannot carry becomes 4 KiB blocks, rounded down.
        let odd = space_of(1000, [8192, 4096, 4096], [0, 0]);
        assert_eq!(
            (odd.block, odd.blocks, odd.free, odd.available),
            (4096, 2000, 1000, 1000)
        );
        let zero = space_of(0, [10, 10, 10], [1, 1]);
        assert_eq!((zero.block, zero.blocks), (4096, 0));
        // Counts larger than what they are part of are cut; huge units do not overflow.
        let cut = space_of(4096, [10, 20, 30], [5, 9]);
        assert_eq!((cut.free, cut.available, cut.files_free), (10, 10, 5));
        let huge = space_of(u64::MAX, [u64::MAX, 1, 1], [0, 0]);
        assert_eq!(huge.blocks, u64::MAX);
        // Every result decodes on the other side.
        for space in [plain, odd, zero, cut, huge] {
            let mut buf = Vec::new();
            crate::wire::Response::Space { id: 1, space }.encode(&mut buf);
            assert!(crate::wire::Response::decode(&buf).is_ok(), "{space:?}");
        }
    }
    use std::os::unix::fs::symlink;

    fn share() -> (ferry_testkit::TempDir, ShareRoot) {
        let t = ferry_testkit::temp_dir("ferry-share-");
        let d = t.path().join("share");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a.txt"), b"alpha").unwrap();
        std::fs::write(d.join("sub/b.txt"), b"beta").unwrap();
        std::fs::write(t.path().join("secret"), b"outside").unwrap();
        symlink("sub/b.txt", d.join("inside")).unwrap();
        symlink("../secret", d.join("out")).unwrap();
        symlink("/etc", d.join("abs")).unwrap();
        symlink("..", d.join("sub/up")).unwrap();
        symlink("../..", d.join("sub/up2")).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, d.join("fifo"), Mode::RUSR | Mode::WUSR).unwrap();
        let root = ShareRoot::open(&d).unwrap();
        (t, root)
    }

    fn p(s: &str) -> SharePath {
        SharePath::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn reads_stay_inside_the_share() {
        let (_t, root) = share();
        let mut s = String::new();
        io::Read::read_to_string(&mut root.open_file(&p("a.txt")).unwrap(), &mut s).unwrap();
        assert_eq!(s, "alpha");
        // A symlink that stays inside is followed.
        assert!(root.open_file(&p("inside")).is_ok());
        // `..` through a symlink that stays inside is inside.
        assert!(root.open_file(&p("sub/up/a.txt")).is_ok());
        // Out of the share: a relative symlink out, an absolute one, `..` past the share through a symlink.
        for escape in ["out", "abs/passwd", "sub/up2/secret"] {
            let got = root.open_file(&p(escape)).map(|_| ());
            assert_eq!(got.map_err(|e| e.0), Err(ErrorCode::UnsafePath), "{escape}");
        }
        // `..` itself never even parses.
        assert!(SharePath::new(b"sub/../../secret").is_err());
        // A FIFO is refused without hanging and without being opened: a writer opening it without
        // blocking meanwhile never finds a reader (ENXIO); a directory is the wrong kind.
        let fifo = root.path().join("fifo");
        let stop = std::sync::atomic::AtomicBool::new(false);
        let readers = std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let mut readers = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let flags = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
                    match rustix::fs::open(&fifo, flags, Mode::empty()) {
                        Ok(_) => readers += 1,
                        Err(e) => assert_eq!(e, Errno::NXIO),
                    }
                }
                readers
            });
            for _ in 0..20_000 {
                assert_eq!(
                    root.open_file(&p("fifo")).unwrap_err().0,
                    ErrorCode::UnsafePath
                );
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            writer.join().unwrap()
        });
        assert_eq!(readers, 0, "the FIFO was opened for reading");
        assert_eq!(
            root.open_file(&p("sub")).unwrap_err().0,
            ErrorCode::WrongKind
        );
        assert_eq!(
            root.open_file(&p("nope")).unwrap_err().0,
            ErrorCode::NotFound
        );
    }

    #[test]
    fn a_symlink_swapped_in_for_a_directory_leads_nowhere() {
        let (t, root) = share();
        let d = t.path().join("share");
        assert!(root.open_file(&p("sub/b.txt")).is_ok());
        std::fs::remove_dir_all(d.join("sub")).unwrap();
        symlink(t.path(), d.join("sub")).unwrap();
        std::fs::write(t.path().join("b.txt"), b"outside").unwrap();
        assert_eq!(
            root.open_file(&p("sub/b.txt")).unwrap_err().0,
            ErrorCode::UnsafePath
        );
        assert_eq!(
            root.list(&p("sub"), 0, 10).unwrap_err().0,
            ErrorCode::UnsafePath
        );
    }

    #[test]
    fn listings_are_paged_in_name_order_without_special_files() {
        let (_t, root) = share();
        let (first, next) = root.list(&SharePath::root(), 0, 3).unwrap();
        let names: Vec<_> = first
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        assert_eq!(names, ["a.txt", "abs", "inside"]);
        let (rest, end) = root.list(&SharePath::root(), next, 10).unwrap();
        let names: Vec<_> = rest
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        assert_eq!(names, ["out", "sub"], "the FIFO is left out");
        assert_eq!(end, END);
        let out = &rest[0];
        assert_eq!(
            (out.kind, out.target.as_slice()),
            (Kind::Symlink, &b"../secret"[..])
        );
        assert_eq!(root.stat(&p("a.txt")).unwrap().size, 5);
        assert_eq!(
            root.stat(&p("out")).unwrap().kind,
            Kind::Symlink,
            "described, not followed"
        );
        assert_eq!(root.stat(&SharePath::root()).unwrap().kind, Kind::Dir);
        assert_eq!(root.stat(&p("fifo")).unwrap_err().0, ErrorCode::UnsafePath);
    }

    #[test]
    fn outboards_are_cached_by_identity_and_a_change_rehashes() {
        let (t, root) = share();
        let cache = OutboardCache::new(t.path().join("cache"));
        let open = || root.open_file(&p("a.txt")).unwrap();
        let first = cache.outboard(&open()).unwrap();
        assert!(first.hashed);
        assert_eq!(
            first.outboard.version().root,
            *blake3::hash(b"alpha").as_bytes()
        );
        let again = cache.outboard(&open()).unwrap();
        assert!(!again.hashed, "from the cache");
        assert_eq!(again.outboard.version(), first.outboard.version());
        // Same size, new content: ctime moves, the cache entry no longer matches.
        std::fs::write(t.path().join("share/a.txt"), b"ALPHA").unwrap();
        let changed = cache.outboard(&open()).unwrap();
        assert!(changed.hashed);
        assert_ne!(changed.id, first.id);
        assert_eq!(
            changed.outboard.version().root,
            *blake3::hash(b"ALPHA").as_bytes()
        );
    }

    /// A file of `groups` groups and a bit, in the share.
    fn big(t: &ferry_testkit::TempDir, name: &str, groups: u64) -> (PathBuf, Vec<u8>) {
        let data = ferry_testkit::pseudo_random((groups * crate::tree::GROUP + 99) as usize, 7);
        let path = t.path().join("share").join(name);
        std::fs::write(&path, &data).unwrap();
        (path, data)
    }

    /// The one cache file in `dir`.
    fn cache_file(dir: &Path) -> PathBuf {
        let files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files.into_iter().next().unwrap()
    }

    /// Whether every piece of `cached` verifies against the file's true hash.
    fn serves_verified(cached: &Cached, file: &File, data: &[u8]) -> bool {
        let v = cached.outboard.version();
        assert_eq!(v.root, *blake3::hash(data).as_bytes());
        let range = crate::tree::covering(v.size, 0, u64::MAX);
        let mut piece = Vec::new();
        crate::tree::encode_piece(file, &cached.outboard, range.clone(), &mut piece).unwrap();
        let mut out = Vec::new();
        crate::tree::verify_piece(&v, range, &piece, &mut out).is_ok() && out == data
    }

    #[test]
    fn a_restarted_share_reads_outboards_from_disk_and_rebuilds_damaged_ones() {
        let (t, root) = share();
        let (_, data) = big(&t, "big", 200);
        let dir = t.path().join("cache");
        let open = || root.open_file(&p("big")).unwrap();
        assert!(
            OutboardCache::new(dir.clone())
                .outboard(&open())
                .unwrap()
                .hashed
        );
        // The cache directory is private, and so is the file.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        let file = cache_file(&dir);
        assert_eq!(mode(&file), 0o600);
        // A new process (a new cache) finds it on disk, held in memory or read from the file.
        for memory in [0, 1 << 20] {
            let limits = CacheLimits {
                memory,
                ..CacheLimits::default()
            };
            let cached = OutboardCache::with_limits(dir.clone(), limits)
                .outboard(&open())
                .unwrap();
            assert!(!cached.hashed, "read back, not hashed");
            assert_eq!(cached.outboard.memory() > 0, memory > 0);
            assert!(serves_verified(&cached, &open(), &data));
        }
        // Damage: a flipped bit in the outboard, one in the header's root, a cut, garbage. Each is found by
        // the checks, rebuilt, and the rebuilt file is whole again.
        let good = std::fs::read(&file).unwrap();
        let mut flipped = good.clone();
        flipped[HEADER as usize + 100] ^= 1;
        let mut root_flipped = good.clone();
        root_flipped[90] ^= 1;
        for damaged in [
            flipped,
            root_flipped,
            good[..good.len() - 1].to_vec(),
            vec![0x55; good.len()],
        ] {
            std::fs::write(&file, &damaged).unwrap();
            let cached = OutboardCache::new(dir.clone()).outboard(&open()).unwrap();
            assert!(cached.hashed, "damage found, rebuilt");
            assert!(serves_verified(&cached, &open(), &data));
            assert_eq!(std::fs::read(&file).unwrap(), good);
        }
    }

    #[test]
    fn a_changed_file_replaces_its_cache_entry() {
        let (t, root) = share();
        let (path, _) = big(&t, "big", 3);
        let dir = t.path().join("cache");
        let cache = OutboardCache::new(dir.clone());
        cache.outboard(&root.open_file(&p("big")).unwrap()).unwrap();
        let before = std::fs::read(cache_file(&dir)).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(b"new", 5)
            .unwrap();
        let cached = cache.outboard(&root.open_file(&p("big")).unwrap()).unwrap();
        assert!(cached.hashed);
        let after = std::fs::read(cache_file(&dir)).unwrap();
        assert_ne!(before, after, "one entry per file, replaced");
    }

    #[test]
    fn concurrent_opens_of_a_cold_file_hash_it_once() {
        let (t, root) = share();
        let (_, data) = big(&t, "big", 2000);
        let cache = OutboardCache::new(t.path().join("cache"));
        let root = Arc::new(root);
        let results: Vec<Cached> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let (cache, root) = (cache.clone(), Arc::clone(&root));
                    s.spawn(move || cache.outboard(&root.open_file(&p("big")).unwrap()).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|c| c.hashed).count(), 1);
        for c in &results {
            assert!(serves_verified(
                c,
                &root.open_file(&p("big")).unwrap(),
                &data
            ));
        }
        cache_file(&t.path().join("cache"));
    }

    #[test]
    fn limits_hold_on_disk_and_in_memory() {
        let (t, root) = share();
        let dir = t.path().join("cache");
        // Each file's outboard is 64 bytes per group: 40 groups make 2.5 KiB, with its header.
        let limits = CacheLimits {
            disk: 6_000,
            memory: 20_000,
            entries: 2,
        };
        let cache = OutboardCache::with_limits(dir.clone(), limits);
        let mut held = Vec::new();
        for i in 0..10 {
            big(&t, &format!("f{i}"), 40);
            let c = cache
                .outboard(&root.open_file(&p(&format!("f{i}"))).unwrap())
                .unwrap();
            assert!(cache.memory() <= limits.memory);
            held.push(c);
            let on_disk: u64 = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum();
            assert!(on_disk <= limits.disk, "{on_disk}");
        }
        // Outboards in use stay whole, whatever was evicted; the memory bound made the later ones file-read.
        assert!(held.iter().any(|c| c.outboard.memory() == 0));
        drop(held);
        big(&t, "last", 40);
        cache
            .outboard(&root.open_file(&p("last")).unwrap())
            .unwrap();
        assert!(cache.memory() <= limits.memory);
    }
}
