//! The only module that talks to the kernel: fuser's [`Filesystem`] over the inode table and the read path.
//!
//! Entries and attributes are cached by the kernel for [`TTL`] and dropped sooner by the share's change
//! notifications ([`Mounted::changes`] turns each changed path into `inval_inode` / `inval_entry`). Names
//! from listings are single components (the wire checks them, [`inodes::child`] again); a symlink's target
//! is shown as stored and never followed here. Every write answers `EROFS`: this mount reads.
//!
//! A file whose content is complete in the store opens with FUSE passthrough: the kernel reads the cache
//! file itself, and the daemon sees no read at all. Without the privilege for it, files open classically
//! after a one-line notice.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_share::wire::{Entry, Kind, SharePath};
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};

use crate::files::{Handle, Reader};
use crate::inodes::{child, Inodes, ROOT};
use crate::source::{PutOutcome, Sink, Source, SourceError};

/// How long the kernel may trust an entry or attributes without asking (changes invalidate sooner).
pub const TTL: Duration = Duration::from_secs(1);
/// The largest read (and write) request: 1 MiB (`FUSE_MAX_PAGES` with 256 pages).
pub const MAX_REQUEST: u32 = 1 << 20;
/// Background requests (readahead, async reads) the kernel may queue.
pub const MAX_BACKGROUND: u16 = 64;

/// Messages for the user (a passthrough fallback, a failure seen by a request); printed by the binary.
pub type Notice = Arc<dyn Fn(&str) + Send + Sync>;

struct Open {
    handle: Arc<Handle>,
    /// The inode, and whether its handle reads with passthrough (counted in the inode table until release).
    ino: u64,
    passthrough: bool,
    /// Held until release: the kernel reads the backing file through it.
    _backing: Option<Arc<BackingId>>,
}

/// The state shared by the kernel's requests and the change notifications.
struct Shared<S: Source + Sink> {
    source: Arc<S>,
    reader: Arc<Reader<S>>,
    inodes: Mutex<Inodes>,
    open: Mutex<HashMap<u64, Open>>,
    next_fh: AtomicU64,
    /// Backing files registered with the kernel, by version root, while some handle holds them.
    backing: Mutex<HashMap<[u8; 32], Weak<BackingId>>>,
    passthrough: AtomicBool,
    notifier: OnceLock<Notifier>,
    uid: u32,
    gid: u32,
    notice: Notice,
}

/// A paired peer's share as a file system.
pub struct ShareFs<S: Source + Sink> {
    shared: Arc<Shared<S>>,
    /// Passthrough asked of the kernel at init (unless [`ShareFs::without_passthrough`]).
    passthrough_wanted: bool,
}

/// Applies the sharer's change notifications to a mounted [`ShareFs`].
pub struct Changes<S: Source + Sink> {
    shared: Weak<Shared<S>>,
}

impl<S: Source + Sink> Clone for Changes<S> {
    fn clone(&self) -> Self {
        Changes {
            shared: Weak::clone(&self.shared),
        }
    }
}

impl<S: Source + Sink> ShareFs<S> {
    /// The share read through `reader` (from `source`), its files owned by whoever mounts it.
    pub fn new(source: Arc<S>, reader: Arc<Reader<S>>, notice: Notice) -> Self {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        ShareFs {
            shared: Arc::new(Shared {
                source,
                reader,
                inodes: Mutex::new(Inodes::new(TTL)),
                open: Mutex::new(HashMap::new()),
                next_fh: AtomicU64::new(1),
                backing: Mutex::new(HashMap::new()),
                passthrough: AtomicBool::new(false),
                notifier: OnceLock::new(),
                uid,
                gid,
                notice,
            }),
            passthrough_wanted: true,
        }
    }

    /// Never opens with passthrough: every read reaches the daemon (for comparisons: `ferry bench mount`).
    pub fn without_passthrough(mut self) -> Self {
        self.passthrough_wanted = false;
        self
    }

    /// Where change notifications go once mounted.
    pub fn changes(&self) -> Changes<S> {
        Changes {
            shared: Arc::downgrade(&self.shared),
        }
    }
}

impl<S: Source + Sink> Changes<S> {
    /// The session's notifier, for invalidations (set once, after mounting).
    pub(crate) fn set_notifier(&self, notifier: Notifier) {
        if let Some(shared) = self.shared.upgrade() {
            let _ = shared.notifier.set(notifier);
        }
    }

    /// `paths` changed on the sharer (the root: anything may have): the kernel forgets what it cached of
    /// them, open files learn their version again, streaming of them stops.
    pub fn apply(&self, paths: &[SharePath]) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        for path in paths {
            shared.reader.changed(path);
            let inv = shared.inodes().changed(path);
            let Some(n) = shared.notifier.get() else {
                continue;
            };
            // Errors mean the kernel no longer holds that inode or name: nothing to drop.
            for ino in inv.inodes {
                let _ = n.inval_inode(INodeNo(ino), 0, 0);
            }
            for (parent, name) in inv.entries {
                let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(&name));
            }
        }
    }
}

impl<S: Source + Sink> Shared<S> {
    fn inodes(&self) -> MutexGuard<'_, Inodes> {
        self.inodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, ino: INodeNo) -> Result<SharePath, Errno> {
        self.inodes().path(ino.0).ok_or(Errno::ENOENT)
    }

    fn attr(&self, ino: u64, e: &Entry) -> FileAttr {
        let time = if e.mtime >= 0 {
            UNIX_EPOCH + Duration::new(e.mtime as u64, e.mtime_nsec)
        } else {
            UNIX_EPOCH
        };
        let (kind, nlink) = match e.kind {
            Kind::File => (FileType::RegularFile, 1),
            Kind::Dir => (FileType::Directory, 2),
            Kind::Symlink => (FileType::Symlink, 1),
        };
        FileAttr {
            ino: INodeNo(ino),
            size: match e.kind {
                Kind::Symlink => e.target.len() as u64,
                _ => e.size,
            },
            blocks: e.size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm: (e.mode & 0o7777) as u16,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The entry of `ino`: fresh from the table, else asked of the sharer, else (offline) as last seen.
    fn entry(&self, ino: u64, path: &SharePath) -> Result<Entry, Errno> {
        self.known_or_asked(
            |inodes, fresh| inodes.entry(ino, fresh),
            || self.source.stat(path),
            |inodes, e| inodes.set_entry(ino, e),
        )
    }

    /// The listing of `ino`, found as [`ShareFs::entry`] finds an entry.
    fn listing(&self, ino: u64, path: &SharePath) -> Result<Vec<Entry>, Errno> {
        self.known_or_asked(
            |inodes, fresh| inodes.listing(ino, fresh),
            || self.source.list(path),
            |inodes, l| inodes.set_listing(ino, l),
        )
    }

    /// What the table knows while it is fresh, else the sharer's answer (kept in the table), else, when the
    /// sharer cannot be reached, what the table saw last.
    fn known_or_asked<T: Clone>(
        &self,
        known: impl Fn(&Inodes, bool) -> Option<T>,
        ask: impl FnOnce() -> Result<T, SourceError>,
        keep: impl FnOnce(&mut Inodes, T),
    ) -> Result<T, Errno> {
        if let Some(t) = known(&self.inodes(), true) {
            return Ok(t);
        }
        match ask() {
            Ok(t) => {
                keep(&mut self.inodes(), t.clone());
                Ok(t)
            }
            Err(SourceError::Offline(why)) => {
                let last = known(&self.inodes(), false);
                last.ok_or_else(|| self.failed(why))
            }
            Err(e) => Err(Errno::from_i32(e.errno())),
        }
    }

    fn failed(&self, why: String) -> Errno {
        (self.notice)(&format!("the sharer cannot be reached: {why}"));
        Errno::EIO
    }

    fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<(u64, Entry), Errno> {
        let dir = self.path(parent)?;
        let path = child(&dir, name.as_bytes()).ok_or(Errno::ENOENT)?;
        // A fresh listing of the directory answers without asking.
        let listed = self.inodes().listing(parent.0, true);
        let entry = match listed {
            Some(l) => l
                .into_iter()
                .find(|e| e.name == name.as_bytes())
                .ok_or(Errno::ENOENT)?,
            None => match self.source.stat(&path) {
                Ok(e) => e,
                Err(SourceError::Offline(why)) => {
                    let known = {
                        let t = self.inodes();
                        t.last_seen(&path).or_else(|| {
                            t.listing(parent.0, false)?
                                .into_iter()
                                .find(|e| e.name == name.as_bytes())
                        })
                    };
                    known.ok_or_else(|| self.failed(why))?
                }
                Err(e) => return Err(Errno::from_i32(e.errno())),
            },
        };
        let ino = self.inodes().looked_up(path, parent.0, entry.clone());
        Ok((ino, entry))
    }

    fn open(&self, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let known = self.inodes().version(ino.0);
        // While handles of the inode read a backing file, the kernel takes only passthrough opens of that
        // same file: a new open reads their version, the new one once they are all closed.
        let pinned = self.inodes().passing_through(ino.0);
        let opened = match pinned {
            Some(v) => self.reader.open_at(&path, v),
            None => self.reader.open(&path, known),
        };
        let handle = match opened {
            Ok(h) => h,
            Err(e) => return reply.error(Errno::from_i32(e.errno())),
        };
        let file = handle.file();
        let version = file.version();
        if pinned.is_none() {
            self.inodes().set_version(ino.0, version);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let backing = match pinned.is_some() || self.inodes().may_pass_through(ino.0) {
            true => self.backing_for(&file, &reply),
            false => None,
        };
        match backing {
            Some(_) => self.inodes().passthrough_open(ino.0, Some(version)),
            None => self.inodes().classic_open(ino.0, true),
        }
        // The kernel's page cache of this inode is still good if it holds the same version (the kernel
        // takes no other flag with passthrough: it would answer the open EIO).
        let flags = if known == Some(version) && backing.is_none() {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        let stats = self.reader.stats();
        match &backing {
            Some(_) => stats.passthrough_opens.fetch_add(1, Ordering::Relaxed),
            None => stats.classic_opens.fetch_add(1, Ordering::Relaxed),
        };
        self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(
            fh,
            Open {
                handle: Arc::new(handle),
                ino: ino.0,
                passthrough: backing.is_some(),
                _backing: backing.clone(),
            },
        );
        match backing {
            Some(id) => reply.opened_passthrough(FileHandle(fh), flags, &id),
            None => reply.opened(FileHandle(fh), flags),
        }
    }

    /// The backing id of a complete, verified version, registered with the kernel once and shared by the
    /// handles open on it; `None` for classic reads.
    fn backing_for(
        &self,
        file: &crate::files::OpenFile,
        reply: &ReplyOpen,
    ) -> Option<Arc<BackingId>> {
        if !self.passthrough.load(Ordering::Relaxed) || !file.chunks().is_complete() {
            return None;
        }
        let root = file.version().root;
        let mut backing = self.backing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = backing.get(&root).and_then(Weak::upgrade) {
            return Some(id);
        }
        let cache_file = file.chunks().backing()?;
        match reply.open_backing(&cache_file) {
            Ok(id) => {
                let id = Arc::new(id);
                backing.retain(|_, w| w.strong_count() > 0);
                backing.insert(root, Arc::downgrade(&id));
                Some(id)
            }
            Err(e) => {
                if self.passthrough.swap(false, Ordering::Relaxed) {
                    (self.notice)(&format!(
                        "passthrough is not available ({e}; it needs CAP_SYS_ADMIN): cached files are \
                         read through the daemon"
                    ));
                }
                None
            }
        }
    }
}

fn errno_of(e: &SourceError) -> Errno {
    Errno::from_i32(e.errno())
}

fn kind_of(e: &Entry) -> FileType {
    match e.kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

impl<S: Source + Sink> Filesystem for ShareFs<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        let _ = config.set_max_write(MAX_REQUEST);
        // The kernel offers its current readahead and takes no more; the binary raises it on the BDI.
        let _ = config.set_max_readahead(MAX_REQUEST);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        for wanted in [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            if caps.contains(wanted) {
                let _ = config.add_capabilities(wanted);
            }
        }
        if !self.passthrough_wanted {
            (self.shared.notice)("passthrough is off: cached files are read through the daemon");
        } else if caps.contains(InitFlags::FUSE_PASSTHROUGH)
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(2).is_ok()
        {
            self.shared.passthrough.store(true, Ordering::Relaxed);
        } else {
            (self.shared.notice)(
                "the kernel offers no FUSE passthrough: cached files are read through the daemon",
            );
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.shared.lookup(parent, name) {
            Ok((ino, e)) => reply.entry(&TTL, &self.shared.attr(ino, &e), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.inodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // An open handle answers with the version it reads (its size is what reads are cut at).
        if let Some(fh) = fh {
            let open = self.shared.open.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(o) = open.get(&fh.0) {
                let size = o.handle.file().version().size;
                drop(open);
                if let Some(mut e) = self.shared.inodes().entry(ino.0, false) {
                    e.size = size;
                    return reply.attr(&TTL, &self.shared.attr(ino.0, &e));
                }
            }
        }
        let r = self
            .shared
            .path(ino)
            .and_then(|p| self.shared.entry(ino.0, &p));
        match r {
            Ok(e) => reply.attr(&TTL, &self.shared.attr(ino.0, &e)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self
            .shared
            .path(ino)
            .and_then(|p| self.shared.entry(ino.0, &p));
        match r {
            Ok(e) if e.kind == Kind::Symlink => reply.data(&e.target),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.shared.open(ino, flags, reply);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let handle = {
            let open = self.shared.open.lock().unwrap_or_else(|e| e.into_inner());
            match open.get(&fh.0) {
                Some(o) => Arc::clone(&o.handle),
                None => return reply.error(Errno::EBADF),
            }
        };
        match self.shared.reader.read(&handle, offset, size) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => {
                if let SourceError::Offline(why) = &e {
                    (self.shared.notice)(&format!("a read failed: {why}"));
                }
                reply.error(errno_of(&e))
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let gone = self
            .shared
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        match &gone {
            Some(o) if o.passthrough => self.shared.inodes().passthrough_open(o.ino, None),
            Some(o) => self.shared.inodes().classic_open(o.ino, false),
            None => {}
        }
        drop(gone);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self
            .shared
            .path(ino)
            .and_then(|p| Ok((self.shared.listing(ino.0, &p)?, p)));
        let (entries, dir) = match r {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        // The kernel fills in `..` itself; the number given here is not used.
        let mut rows: Vec<(u64, FileType, Vec<u8>)> = vec![
            (ino.0, FileType::Directory, b".".to_vec()),
            (ROOT, FileType::Directory, b"..".to_vec()),
        ];
        {
            let mut t = self.shared.inodes();
            for e in &entries {
                if let Some(path) = child(&dir, &e.name) {
                    rows.push((t.ino_for(path, ino.0), kind_of(e), e.name.clone()));
                }
            }
        }
        for (i, (ino, kind, name)) in rows.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.contains(fuser::AccessFlags::W_OK) {
            reply.error(Errno::EROFS)
        } else {
            reply.ok()
        }
    }

    // Writes: none yet (the mount is also mounted read-only, so the kernel answers most of them itself).

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }
}
