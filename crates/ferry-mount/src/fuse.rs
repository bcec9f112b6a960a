//! The only module that talks to the kernel: fuser's [`Filesystem`] over the inode table and the read path.
//!
//! Entries and attributes are cached by the kernel for [`TTL`] and dropped sooner by the share's change
//! notifications ([`Mounted::changes`] turns each changed path into `inval_inode` / `inval_entry`). Names
//! from listings are single components (the wire checks them, [`inodes::child`] again); a symlink's target
//! is shown as stored and never followed here.
//!
//! Writes (only when [`ShareFs::writable`]; otherwise every write answers `EROFS` and the mount is
//! read-only) go to a working copy per file ([`crate::writes`]), pushed to the sharer on flush (each
//! close), fsync, release, and after [`DEBOUNCE`] of quiet for a file kept open; a push the sharer refuses
//! is the close's error. Names (create, mkdir, rename, unlink, rmdir, symlink) and attributes (chmod,
//! utimens) go to the sharer at once. Offline, pushes wait and name changes are kept ([`crate::pending`]),
//! sent in order when the sharer is back, before the pushes. The kernel's own entries are kept right by its replies; what the sharer then
//! announces invalidates them as for any change (never from within a request: the kernel holds the
//! directory's lock there).
//!
//! A file whose content is complete in the store opens with FUSE passthrough: the kernel reads the cache
//! file itself, and the daemon sees no read at all. Without the privilege for it, files open classically
//! after a one-line notice.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_share::tree::Version;
use ferry_share::wire::{Entry, Kind, SharePath, Space, Time};
use ferry_tree::path::{MAX_NAME, MAX_PATH};
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use rustix::fs::FallocateFlags;

use crate::caller::Caller;
use crate::files::{Handle, Reader};
use crate::inodes::{child, listing_of, Inodes, Listing, ROOT};
use crate::pending::Op;
use crate::source::{Sink, Source, SourceError};
use crate::store::Store;
use crate::writes::{self, Pushed, Recovered, Writes, DEBOUNCE};

/// How long the kernel may trust an entry or attributes without asking (changes invalidate sooner).
pub const TTL: Duration = Duration::from_secs(1);
/// The largest read (and write) request: 1 MiB (`FUSE_MAX_PAGES` with 256 pages).
pub const MAX_REQUEST: u32 = 1 << 20;
/// Most bytes a file read with passthrough may grow by on the sharer and still be followed ([`Shared::follow`]:
/// the new bytes are held in memory once).
const FOLLOW_MAX: u64 = 64 << 20;

/// Times a working copy is loaded again when this mount pushed the file meanwhile, before the open fails
/// with ESTALE.
const COPY_ATTEMPTS: usize = 8;

/// Times an open for reading looks again when passthrough reads of its inode began or ended while it
/// opened, before it fails with EIO (said as a notice).
const OPEN_ATTEMPTS: usize = 16;

/// How long an open for writing waits for the releases of passthrough readers before it fails with ETXTBSY.
pub const PASSTHROUGH_RELEASE_WAIT: Duration = Duration::from_secs(2);
/// Background requests (readahead, async reads) the kernel may queue.
pub const MAX_BACKGROUND: u16 = 64;

/// `dir/name` for a request naming `name`: a name longer than a file name may be is `ENAMETOOLONG`, as is
/// a path longer than the share's paths may be; any other name the share cannot hold is `otherwise`.
fn child_of(dir: &SharePath, name: &OsStr, otherwise: Errno) -> Result<SharePath, Errno> {
    let name = name.as_bytes();
    if name.len() > MAX_NAME || dir.as_bytes().len() + 1 + name.len() > MAX_PATH {
        return Err(Errno::ENAMETOOLONG);
    }
    child(dir, name).ok_or(otherwise)
}

/// Messages for the user (a passthrough fallback, a failure seen by a request); printed by the binary.
pub type Notice = Arc<dyn Fn(&str) + Send + Sync>;

struct Open {
    /// The read path's handle; `None` while the file has a working copy (opened when first needed).
    handle: Option<Arc<Handle>>,
    /// Opened for writing: closing it pushes the working copy.
    writing: bool,
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
    /// Held by an open of a file read with passthrough while it picks its version and backing file, and
    /// while a grown file's backing file becomes the new version's ([`Shared::follow`]).
    following: Mutex<()>,
    /// Inodes a thread follows, and whether they changed again since it looked.
    follows: Mutex<HashMap<u64, bool>>,
    passthrough: AtomicBool,
    /// The kernel maps files opened with direct I/O (`FUSE_DIRECT_IO_ALLOW_MMAP`): every open that does
    /// not pass through is opened so, and a read's reply goes straight into the reader's buffer.
    direct_io: AtomicBool,
    notifier: OnceLock<Notifier>,
    /// The sharer's space figures, for `statfs`.
    space: Mutex<SpaceSeen>,
    /// Set when the mount writes: the working copies, and the store pushed versions are seeded into.
    writes: OnceLock<(Writes, Arc<dyn Store>)>,
    /// Pushed versions to put into the store, by one thread off the close's path.
    seeds: OnceLock<mpsc::Sender<(Version, writes::Shared)>>,
    uid: u32,
    gid: u32,
    notice: Notice,
    /// That changes are kept for the sharer's return was said (once until they are sent).
    keeping_said: AtomicBool,
}

/// The sharer's space figures as the mount last heard them.
#[derive(Default)]
struct SpaceSeen {
    /// The figures and when they came.
    last: Option<(Instant, Space)>,
    /// A thread is asking for new ones.
    asking: bool,
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
                following: Mutex::new(()),
                follows: Mutex::new(HashMap::new()),
                passthrough: AtomicBool::new(false),
                direct_io: AtomicBool::new(false),
                notifier: OnceLock::new(),
                space: Mutex::new(SpaceSeen::default()),
                writes: OnceLock::new(),
                seeds: OnceLock::new(),
                uid,
                gid,
                notice,
                keeping_said: AtomicBool::new(false),
            }),
            passthrough_wanted: true,
        }
    }

    /// Never opens with passthrough: every read reaches the daemon (for comparisons: `ferry bench mount`).
    pub fn without_passthrough(mut self) -> Self {
        self.passthrough_wanted = false;
        self
    }

    /// Takes writes (the sharer's share is writable): working copies under `dir`, pushed versions seeded
    /// into `store` (the read path's). A thread pushes files kept open once [`DEBOUNCE`] passed without
    /// a write, and retries pushes that failed.
    pub fn writable(self, dir: &Path, store: Arc<dyn Store>) -> std::io::Result<Self> {
        // The cache gives way to the working copies beside it when their disk is full.
        let giving = Arc::clone(&store);
        let writes =
            Writes::new(dir)?.with_room(writes::Room::new(move |bytes| giving.make_room(bytes)));
        let (tx, rx) = mpsc::channel::<(Version, writes::Shared)>();
        let seeding = Arc::clone(&store);
        std::thread::Builder::new()
            .name("ferry-mount-seed".into())
            .spawn(move || {
                for (version, copy) in rx {
                    seed(&*seeding, version, &copy);
                }
            })?;
        let _ = self.shared.seeds.set(tx);
        let _ = self.shared.writes.set((writes, store));
        let shared = Arc::downgrade(&self.shared);
        std::thread::Builder::new()
            .name("ferry-mount-push".into())
            .spawn(move || loop {
                std::thread::sleep(DEBOUNCE / 2);
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                shared.push_due();
            })?;
        Ok(self)
    }

    /// Whether the mount takes writes.
    pub fn is_writable(&self) -> bool {
        self.shared.writes.get().is_some()
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
            // A file read with passthrough that grew on the sharer is followed (off this thread: its new
            // bytes are fetched).
            let pinned = {
                let t = shared.inodes();
                t.ino(path).filter(|&ino| t.passing_through(ino).is_some())
            };
            if let Some(ino) = pinned {
                shared.follow_changed(ino);
            }
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
        let (unlinked, atime, subdirs) = {
            let t = self.inodes();
            // A file removed or renamed over in the mount, still open, has no name left (pjdfstest
            // unlink/14.t); the access time is the one set here, if any (the share carries none).
            let unlinked = ino != ROOT && t.current_path(ino).is_none();
            (unlinked, t.atime(ino), t.subdirs(ino))
        };
        let (kind, nlink) = match e.kind {
            Kind::File => (FileType::RegularFile, 1),
            // Its own name, its `.`, and each subdirectory's `..`, as far as its listing is known.
            Kind::Dir => (
                FileType::Directory,
                2 + subdirs.map_or(0, |n| n.min(u32::MAX as usize - 2) as u32),
            ),
            Kind::Symlink => (FileType::Symlink, 1),
        };
        FileAttr {
            ino: INodeNo(ino),
            size: match e.kind {
                Kind::Symlink => e.target.len() as u64,
                _ => e.size,
            },
            blocks: e.size.div_ceil(512),
            atime: atime.unwrap_or(time),
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm: (e.mode & 0o7777) as u16,
            nlink: if unlinked { 0 } else { nlink },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            // Programs size their reads by it (cat, cp): 1 MiB reads are one request each.
            blksize: MAX_REQUEST,
            flags: 0,
        }
    }

    /// The entry of `ino`: fresh from the table, else asked of the sharer, else (offline) as last seen.
    fn entry(&self, ino: u64, path: &SharePath) -> Result<Entry, Errno> {
        // A file with a working copy is what the copy shows (a new one is not on the sharer yet: asking
        // would say it does not exist).
        if let Some(e) = self.copy(ino).and_then(|_| self.inodes().entry(ino, false)) {
            return Ok(e);
        }
        // Removed or renamed over in the mount while open: its name no longer leads to it.
        let unlinked = {
            let t = self.inodes();
            (ino != ROOT && t.current_path(ino).is_none()).then(|| t.entry(ino, false))
        };
        if let Some(last) = unlinked {
            return last.ok_or(Errno::ENOENT);
        }
        self.known_or_asked(
            |inodes, fresh| inodes.entry(ino, fresh),
            || self.source.stat(path),
            |inodes, e| inodes.set_entry(ino, e),
        )
    }

    /// The listing of `ino`, found as [`ShareFs::entry`] finds an entry.
    fn listing(&self, ino: u64, path: &SharePath) -> Result<Listing, Errno> {
        self.known_or_asked(
            |inodes, fresh| inodes.listing(ino, fresh),
            || self.source.list(path).map(listing_of),
            |inodes, l| inodes.set_listing(ino, l),
        )
    }

    /// The listing of directory `ino` as the mount shows it: the sharer's, and the files written in the
    /// mount that the sharer does not have (a new file before its first push, or one whose pushes it
    /// refused), as a local disk lists a file being written.
    fn listing_shown(&self, ino: u64, path: &SharePath) -> Result<Listing, Errno> {
        let listing = self.listing(ino, path)?;
        let Ok(w) = self.writes() else {
            return Ok(listing);
        };
        let unlisted: Vec<(u64, Vec<u8>)> = w
            .inside(path)
            .into_iter()
            .filter(|(_, name)| {
                listing
                    .binary_search_by(|e| e.name.as_slice().cmp(name))
                    .is_err()
            })
            .collect();
        if unlisted.is_empty() {
            return Ok(listing);
        }
        let mut all = listing.to_vec();
        let t = self.inodes();
        for (copied, name) in unlisted {
            let mut e = t
                .entry(copied, false)
                .unwrap_or_else(|| new_entry(OsStr::from_bytes(&name), Kind::File, 0o644, &[]));
            e.name = name;
            all.push(e);
        }
        Ok(listing_of(all))
    }

    /// What the table knows while it is fresh, else the sharer's answer (kept in the table), else, when the
    /// sharer cannot be reached, what the table saw last.
    fn known_or_asked<T: Clone>(
        &self,
        known: impl Fn(&Inodes, bool) -> Option<T>,
        ask: impl FnOnce() -> Result<T, SourceError>,
        keep: impl FnOnce(&mut Inodes, T),
    ) -> Result<T, Errno> {
        let fresh = known(&self.inodes(), true);
        if let Some(t) = fresh {
            return Ok(t);
        }
        match self.unless_sending(ask) {
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

    /// The errno of `e`, met by `what` of `path`; an EIO other than the link's (said where the link is
    /// watched) is said with its reason, so no EIO goes unexplained.
    fn told(&self, what: &str, path: &SharePath, e: &SourceError) -> Errno {
        if let SourceError::Failed { errno, message } = e {
            if *errno == libc::EIO {
                (self.notice)(&format!("{what} of {} failed: {message}", shown(path)));
            }
        }
        errno_of(e)
    }

    /// `ask`, unless changes made offline still wait to be sent: until they are, the sharer would answer
    /// without them (a directory made offline would not exist), so what the mount knows stands in, as
    /// offline.
    fn unless_sending<T>(
        &self,
        ask: impl FnOnce() -> Result<T, SourceError>,
    ) -> Result<T, SourceError> {
        match self.writes().is_ok_and(|w| !w.pending().is_empty()) {
            true => Err(SourceError::Offline(
                "changes made while the sharer was away are still to be sent".into(),
            )),
            false => ask(),
        }
    }

    /// Whether name and attribute changes are kept to be sent later instead of sent now: the sharer is out
    /// of reach, or changes kept before still wait (they go first, in order). Pushes wait too.
    fn keeping(&self) -> bool {
        !self.source.reachable() || self.writes().is_ok_and(|w| !w.pending().is_empty())
    }

    /// Sends `op` to the sharer now, or keeps it to be sent when the sharer is back ([`Shared::keeping`], or
    /// the link lost under it): the mount shows the change at once either way.
    fn change(&self, op: Op) -> Result<(), Errno> {
        if !self.keeping() {
            match op.apply(&*self.source) {
                Err(SourceError::Offline(_)) => {}
                r => return r.map(drop).map_err(|e| errno_of(&e)),
            }
        }
        self.keep(op)
    }

    /// Keeps `op` for the sharer's return, journaled.
    fn keep(&self, op: Op) -> Result<(), Errno> {
        self.writes()?.pending().push(op).map_err(io_errno)?;
        self.say_keeping();
        Ok(())
    }

    /// Says once, until they are sent, that changes are kept for the sharer's return.
    fn say_keeping(&self) {
        if !self.keeping_said.swap(true, Ordering::Relaxed) {
            (self.notice)(
                "the sharer is out of reach: changes made in the mount are kept here and sent, in order, \
                 when it is back",
            );
        }
    }

    /// Sends the changes kept while the sharer was away, if it is back; whether none waits now.
    fn send_kept(&self) -> bool {
        let Ok(w) = self.writes() else {
            return true;
        };
        if w.pending().is_empty() {
            return true;
        }
        if !self.source.reachable() {
            return false;
        }
        let sent = w.pending().send(&*self.source);
        for (op, why) in &sent.refused {
            (self.notice)(&format!(
                "a change made while the sharer was away was refused by it and dropped ({}): {why}",
                op.describe()
            ));
        }
        let done = w.pending().is_empty();
        if done {
            self.keeping_said.store(false, Ordering::Relaxed);
            (self.notice)(&format!(
                "the sharer is back: {} change(s) made while it was away sent; written files follow",
                sent.applied + sent.refused.len()
            ));
        }
        done
    }

    fn failed(&self, why: String) -> Errno {
        (self.notice)(&format!("the sharer cannot be reached: {why}"));
        Errno::EIO
    }

    fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<(u64, Entry), Errno> {
        let dir = self.path(parent)?;
        let path = child_of(&dir, name, Errno::ENOENT)?;
        // A file with a working copy answers from the table (a new one is not on the sharer yet); so does
        // a fresh listing of the directory.
        let ino = self.inodes().ino(&path);
        let copied = ino.filter(|&i| self.copy(i).is_some());
        if let Some(e) = copied.and_then(|i| self.inodes().entry(i, false)) {
            let ino = self.inodes().looked_up(path, parent.0, e.clone());
            return Ok((ino, e));
        }
        let listed = self.inodes().listed_entry(parent.0, name.as_bytes(), true);
        let entry = match listed {
            Some(found) => found.ok_or(Errno::ENOENT)?,
            None => match self.unless_sending(|| self.source.stat(&path)) {
                Ok(e) => e,
                Err(SourceError::Offline(why)) => {
                    let t = self.inodes();
                    let listed = t.listed_entry(parent.0, name.as_bytes(), false);
                    let known = t.last_seen(&path).or_else(|| listed.clone().flatten());
                    drop(t);
                    match (known, listed) {
                        (Some(e), _) => e,
                        // Not in the directory as last listed: missing (so a file can be made offline).
                        (None, Some(_)) => return Err(Errno::ENOENT),
                        // Never seen, in a directory never listed: a writable mount treats it as missing,
                        // so that a file can be made offline (one the sharer has after all is kept beside
                        // it by the conflict rule when pushed); a read-only one cannot tell.
                        (None, None) if self.writes().is_ok() => return Err(Errno::ENOENT),
                        (None, None) => return Err(self.failed(why)),
                    }
                }
                Err(e) => {
                    if e.errno() == libc::ENOENT {
                        self.inodes().missing(&path);
                    }
                    return Err(Errno::from_i32(e.errno()));
                }
            },
        };
        let ino = self.inodes().looked_up(path, parent.0, entry.clone());
        Ok((ino, entry))
    }

    fn open(&self, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let writing = flags.acc_mode() != OpenAccMode::O_RDONLY;
        // A reader of a file with a working copy reads the copy (classically), unless passthrough readers
        // hold the inode: then it reads their version with them (the kernel takes nothing else).
        let passing = self.inodes().passing_through(ino.0).is_some();
        if writing || (self.copy(ino.0).is_some() && !passing) {
            return self.open_copy(ino, flags, writing, reply);
        }
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let known = self.inodes().version(ino.0);
        let mut attempts = 0;
        let (handle, backing) = loop {
            attempts += 1;
            // While handles of the inode read a backing file, the kernel takes only passthrough opens of
            // that same file: a new open reads their version, the new one once they are all closed (or
            // once that file holds a grown version: not while this open picks it).
            let following = self.following.lock().unwrap_or_else(|e| e.into_inner());
            let pinned = self.inodes().passing_through(ino.0);
            let _following = pinned.is_some().then_some(following);
            let opened = match pinned {
                Some(v) => self.reader.open_at(&path, v),
                None => self.reader.open(&path, known),
            };
            let handle = match opened {
                Ok(h) => h,
                Err(e) => return reply.error(self.told("an open", &path, &e)),
            };
            let file = handle.file();
            let version = file.version();
            let may_pass_through = pinned.is_some() || self.inodes().may_pass_through(ino.0);
            let candidate = match may_pass_through {
                true => self.backing_for(&file, &reply),
                false => None,
            };
            // The way it opens is chosen and counted in one step with the table locked, against what the
            // table says now, which must still be what this attempt started from. Another open may have
            // started passthrough reads of the inode since this one looked (the kernel would answer this
            // classic open EIO beside them). Or the passthrough handles this open was to join may all have
            // been released since, and classic opens begun, or passthrough reads of another version: the
            // kernel refuses a passthrough open beside either (with EIO, to whichever of the two opens it
            // takes second, in whatever order their openers wake). The kernel lets go of a handle before
            // the daemon hears its release, so the table never says less than the kernel holds.
            let mut t = self.inodes();
            let joined = t.passing_through(ino.0) == pinned;
            if !joined || (pinned.is_some() && candidate.is_none()) {
                if attempts < OPEN_ATTEMPTS {
                    continue;
                }
                drop(t);
                let e = SourceError::Failed {
                    errno: libc::EIO,
                    message: "its readers came and went too fast to pick how to open it".into(),
                };
                return reply.error(self.told("an open", &path, &e));
            }
            if pinned.is_none() {
                t.set_version(ino.0, version);
            }
            let backing = candidate.filter(|_| pinned.is_some() || t.may_pass_through(ino.0));
            match backing {
                Some(_) => t.passthrough_open(ino.0, Some(version)),
                None => t.classic_open(ino.0, true),
            }
            break (handle, backing);
        };
        let file = handle.file();
        let version = file.version();
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // The kernel takes no other flag with passthrough (it would answer the open EIO). Every other
        // open reads with direct I/O where the kernel maps such files (FUSE_DIRECT_IO_ALLOW_MMAP): each
        // reply is copied once, into the reader's buffer, instead of into the page cache and from there
        // again, and the daemon streams ahead of a sequential reader by itself, in place of the kernel's
        // readahead (BENCHMARKS.md, session 10). Above all, the page cache is the inode's, not the
        // handle's: handles of two versions of a file that changes (a log the sharer appends to) would
        // share it, and a reply cut at the end of the shorter version, while the kernel already knows the
        // longer size, leaves the page's rest as zeros that a reader of the longer version then reads.
        // Without direct I/O, the page cache is still good if it holds the same version.
        let flags = if backing.is_some() {
            FopenFlags::empty()
        } else if self.direct_io.load(Ordering::Relaxed) {
            FopenFlags::FOPEN_DIRECT_IO
        } else if known == Some(version) {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        let stats = self.reader.stats();
        match &backing {
            Some(_) => stats.passthrough_opens.fetch_add(1, Ordering::Relaxed),
            None => stats.classic_opens.fetch_add(1, Ordering::Relaxed),
        };
        if flags.contains(FopenFlags::FOPEN_DIRECT_IO) {
            stats.direct_io_opens.fetch_add(1, Ordering::Relaxed);
        }
        self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(
            fh,
            Open {
                handle: Some(Arc::new(handle)),
                writing: false,
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

/// The write side.
impl<S: Source + Sink> Shared<S> {
    fn writes(&self) -> Result<&Writes, Errno> {
        self.writes.get().map(|(w, _)| w).ok_or(Errno::EROFS)
    }

    /// The working copy of `ino`, if it has one.
    fn copy(&self, ino: u64) -> Option<writes::Shared> {
        self.writes.get()?.0.get(ino)
    }

    /// Registers `copy` as `ino`'s; the inode keeps its path while it has one (also if the kernel forgets
    /// it: the copy is pushed under that path).
    fn keep_copy(&self, ino: u64, copy: writes::WorkingCopy) -> Result<writes::Shared, Errno> {
        let c = self.writes()?.insert(ino, copy);
        self.inodes().hold(ino, true);
        Ok(c)
    }

    /// Lets go of `ino`'s working copy `copy` (conflicted, or its file removed).
    fn drop_copy(&self, ino: u64, copy: &writes::Shared) {
        self.release_copy(ino, copy, false);
    }

    /// Lets go of `ino`'s working copy `copy` if nothing is unpushed: its content is its base, the sharer's
    /// version, which the store takes from it (on the seeding thread: a close does not wait for it; a read
    /// meanwhile fetches what is not there yet). One written meanwhile stays.
    fn let_go(&self, ino: u64, copy: &writes::Shared) {
        if !self.release_copy(ino, copy, true) {
            return;
        }
        let (base, gone) = {
            let c = writes::lock(copy);
            (c.base(), c.is_gone())
        };
        if gone {
            return;
        }
        if let (Some(version), Some(tx)) = (base, self.seeds.get()) {
            let _ = tx.send((version, Arc::clone(copy)));
        }
    }

    /// Takes `copy` out of the copies and marks it released, with it locked (unless `clean_only` and it
    /// has unpushed writes): a writer that took it from the table before waits for the lock, sees it
    /// released, and starts a new copy ([`Shared::with_copy`]), so no write lands in a copy let go.
    fn release_copy(&self, ino: u64, copy: &writes::Shared, clean_only: bool) -> bool {
        let mut c = writes::lock(copy);
        if (clean_only && c.is_dirty()) || !self.writes().is_ok_and(|w| w.remove(ino, copy)) {
            return false;
        }
        c.release();
        drop(c);
        self.inodes().hold(ino, false);
        true
    }

    /// Runs `change` on `ino`'s working copy (made as needed; emptied first when `truncate`), locked and
    /// not released; returns the copy.
    fn with_copy(
        &self,
        ino: u64,
        truncate: bool,
        change: impl FnOnce(&mut writes::WorkingCopy) -> std::io::Result<()>,
    ) -> Result<writes::Shared, Errno> {
        for _ in 0..COPY_ATTEMPTS {
            let copy = self.working_copy(ino, truncate)?;
            let mut c = writes::lock(&copy);
            if c.is_released() {
                continue;
            }
            change(&mut c).map_err(io_errno)?;
            drop(c);
            return Ok(copy);
        }
        Err(Errno::ESTALE)
    }

    /// `entry` as shown: with the working copy's size, mode and time when there is one.
    fn shown(&self, ino: u64, mut entry: Entry) -> FileAttr {
        if let Some((w, _)) = self.writes.get() {
            w.overlay(ino, &mut entry);
        }
        self.attr(ino, &entry)
    }

    fn register(&self, ino: u64, writing: bool) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // Counted as a classic open: no passthrough for the inode while it is written.
        self.inodes().classic_open(ino, true);
        self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(
            fh,
            Open {
                handle: None,
                writing,
                ino,
                passthrough: false,
                _backing: None,
            },
        );
        fh
    }

    /// Opens a file through its working copy: one is made for a writer (from the file's content, or empty
    /// with O_TRUNC); a reader of a file that has one reads it.
    fn open_copy(&self, ino: INodeNo, flags: OpenFlags, writing: bool, reply: ReplyOpen) {
        if writing {
            if let Err(e) = self.no_passthrough_readers(ino.0) {
                return reply.error(e);
            }
            let truncate = flags.0 & libc::O_TRUNC != 0;
            if let Err(e) = self.working_copy(ino.0, truncate) {
                return reply.error(e);
            }
        }
        let fh = self.register(ino.0, writing);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    /// Waits until no handle of `ino` reads with passthrough; `ETXTBSY` (said once per file) if some still
    /// do after [`PASSTHROUGH_RELEASE_WAIT`]. While a handle reads the cache file through the kernel, the
    /// kernel takes only passthrough opens of that same file (and fails any other open with EIO): a writer
    /// there would write the verified cache file, so it is refused clearly instead. The wait covers
    /// readers that closed just now (the kernel sends their release after close(2) returns).
    fn no_passthrough_readers(&self, ino: u64) -> Result<(), Errno> {
        let until = std::time::Instant::now() + PASSTHROUGH_RELEASE_WAIT;
        while self.inodes().passing_through(ino).is_some() {
            if std::time::Instant::now() >= until {
                let path = self.path(INodeNo(ino))?;
                (self.notice)(&format!(
                    "{} is open for reading with passthrough: it cannot be opened for writing until those \
                     readers close it (ETXTBSY)",
                    shown(&path)
                ));
                return Err(Errno::ETXTBSY);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// The working copy of `ino`, made now if there is none: the current version's content (fetched through
    /// the read path as needed), or nothing when `truncate`.
    fn working_copy(&self, ino: u64, truncate: bool) -> Result<writes::Shared, Errno> {
        let w = self.writes()?;
        // A copy loaded from a version this mount then pushed past (another copy of the file, pushed and let
        // go meanwhile by its last writer) would push as a conflict with the mount's own write: loaded again.
        for attempt in 0..COPY_ATTEMPTS {
            if let Some(c) = w.get(ino) {
                let mut copy = writes::lock(&c);
                if copy.is_released() {
                    continue;
                }
                if truncate {
                    copy.set_len(0).map_err(io_errno)?;
                }
                drop(copy);
                return Ok(c);
            }
            // A file removed or renamed over in the mount has no copy to load: its path names another
            // file now, or none.
            let path = self.inodes().current_path(ino).ok_or(Errno::ESTALE)?;
            let known = self.inodes().version(ino);
            // Truncated, its content is not needed: the version it derives from is.
            let handle = match truncate {
                true => self.reader.open_version(&path, known),
                false => self.reader.open_whole(&path, known),
            };
            let handle = match handle {
                Ok(h) => h,
                // Offline, a file emptied whose version was never learned replaces what the sharer has: a
                // removal kept before its push (its content is not needed).
                Err(SourceError::Offline(_)) if truncate => {
                    let mode = self.inodes().entry(ino, false).map_or(0o644, |e| e.mode);
                    self.keep(Op::Unlink(path.clone(), None))?;
                    let copy = w.create(&path, None, mode & 0o7777).map_err(io_errno)?;
                    let c = w.insert(ino, copy);
                    self.inodes().hold(ino, true);
                    writes::lock(&c).set_len(0).map_err(io_errno)?;
                    return Ok(c);
                }
                Err(e) => return Err(errno_of(&e)),
            };
            let version = handle.file().version();
            let mode = self.inodes().entry(ino, false).map_or(0o644, |e| e.mode);
            let mut copy = w
                .create(&path, Some(version), mode & 0o7777)
                .map_err(io_errno)?;
            if truncate {
                copy.set_len(0).map_err(io_errno)?;
            } else {
                let mut at = 0;
                while at < version.size {
                    let bytes = match self.reader.read_version(&handle, at, MAX_REQUEST) {
                        Ok(bytes) => bytes,
                        Err(SourceError::Changed) => break,
                        Err(e) => return Err(errno_of(&e)),
                    };
                    if bytes.is_empty() {
                        break;
                    }
                    copy.load(at, &bytes).map_err(io_errno)?;
                    at += bytes.len() as u64;
                }
                if at < version.size {
                    // Changed on the sharer while it was copied (another peer writes it too): loaded again
                    // after a pause that grows with the attempts (2 ms to 0.26 s, 0.5 s in all), not failed
                    // at once with ESTALE.
                    std::thread::sleep(Duration::from_millis(2 << attempt));
                    continue;
                }
            }
            // A push sets the version it landed before its copy is let go: a version other than the one
            // known at the start means one may have landed after this copy's version was learned.
            let mut t = self.inodes();
            if t.version(ino) != known {
                continue;
            }
            t.set_version(ino, version);
            // One registered meanwhile wins (this one is dropped).
            let c = w.insert(ino, copy);
            t.hold(ino, true);
            return Ok(c);
        }
        Err(Errno::ESTALE)
    }

    /// Pushes `ino`'s working copy if it has changes; the errno of a failure (the close's error). `stop`
    /// (the caller is being killed) ends it with `EINTR`, the copy kept and pushed in the background.
    fn push(&self, ino: u64, copy: &writes::Shared, stop: &dyn Fn() -> bool) -> Result<(), Errno> {
        let mut c = writes::lock(copy);
        if !c.is_dirty() {
            return Ok(());
        }
        if self.keeping() {
            // Journaled here, pushed once the sharer is back and the changes made before it are sent: a
            // close or fsync offline completes at local speed.
            self.say_keeping();
            return Ok(());
        }
        let path = self.path(INodeNo(ino))?;
        let pushed = c.push(&*self.source, &path, stop);
        let failed_before = c.failed(pushed.is_err());
        if failed_before && pushed.is_ok() {
            (self.notice)(&format!("{} is on the sharer now", shown(&path)));
        }
        match pushed {
            Ok(Pushed::Clean) => Ok(()),
            Ok(Pushed::Written(version)) => {
                // The sharer's file is what the copy shows (its size, mode and time were pushed with it):
                // the table says so, fresh, without asking again.
                let mut t = self.inodes();
                if let Some(mut e) = t.entry(ino, false) {
                    c.overlay(&mut e);
                    t.wrote(ino, e);
                }
                t.set_version(ino, version);
                Ok(())
            }
            Ok(Pushed::Conflicted(name)) => {
                drop(c);
                // The sharer's version stays at the name: it is read from there again.
                self.drop_copy(ino, copy);
                self.inodes().changed(&path);
                let shown = shown(&path);
                let dir = match shown.rsplit_once('/') {
                    Some((dir, _)) => format!("{dir}/"),
                    None => String::new(),
                };
                (self.notice)(&format!(
                    "conflict: {shown} changed on the sharer too: its version stays, yours is kept as \
                     {dir}{}",
                    String::from_utf8_lossy(&name)
                ));
                Ok(())
            }
            Err(e) => {
                if !failed_before {
                    (self.notice)(&match &e {
                        SourceError::Offline(why) => format!(
                            "{} is not on the sharer yet (kept here, pushed once the sharer is back): \
                             {why}",
                            shown(&path)
                        ),
                        SourceError::Stopped => format!(
                            "{} is not on the sharer yet: the process that wrote it was killed during \
                             its push; kept here, pushed in the background",
                            shown(&path)
                        ),
                        refused => format!(
                            "{} is not on the sharer: it refused the push ({refused}); kept here, \
                             pushed again while the mount runs (after 1 s, then less often, at least \
                             every 30 s) and by the next mount",
                            shown(&path)
                        ),
                    });
                }
                match e {
                    // Kept and journaled: the content is safe here and goes when the sharer is back.
                    SourceError::Offline(_) => Ok(()),
                    e => Err(errno_of(&e)),
                }
            }
        }
    }

    /// Pushes `ino`'s working copy, if any, for `caller`.
    fn push_ino(&self, ino: u64, caller: &Caller) -> Result<(), Errno> {
        match self.copy(ino) {
            Some(c) => self.push(ino, &c, &|| caller.dying()),
            None => Ok(()),
        }
    }

    /// Whether a handle open for writing `ino` remains.
    fn has_writers(&self, ino: u64) -> bool {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.values().any(|o| o.ino == ino && o.writing)
    }

    /// Pushes what is due (written, then quiet for [`DEBOUNCE`]), and lets go of copies that are pushed and
    /// no longer open for writing.
    fn push_due(&self) {
        let Ok(w) = self.writes() else {
            return;
        };
        // Changes kept while the sharer was away go first: a copy may be pushed into a directory they make.
        if !self.send_kept() {
            return;
        }
        if w.left_behind() > 0 {
            for r in w.push_left_behind(&*self.source) {
                (self.notice)(&match r {
                    Recovered::Written(p) => format!(
                        "{} (written before the mount stopped) is on the sharer now",
                        shown(&p)
                    ),
                    Recovered::Conflicted(p, name) => format!(
                        "conflict: {} (written before the mount stopped) changed on the sharer too: its \
                         version stays, yours is kept beside it as {}",
                        shown(&p),
                        String::from_utf8_lossy(&name)
                    ),
                    Recovered::Kept(p, why, file) => format!(
                        "{} (written before the mount stopped) cannot be pushed ({why}): kept in {}, \
                         tried again by the next mount",
                        shown(&p),
                        file.display()
                    ),
                });
            }
        }
        for (ino, c) in w.all() {
            if writes::lock(&c).is_due(DEBOUNCE) {
                let _ = self.push(ino, &c, &|| false);
            }
            if !writes::lock(&c).is_dirty() && !self.has_writers(ino) {
                self.let_go(ino, &c);
            }
        }
    }

    /// The path of `name` in `parent`, for a write.
    fn child_path(&self, parent: INodeNo, name: &OsStr) -> Result<SharePath, Errno> {
        self.writes()?;
        let dir = self.path(parent)?;
        child_of(&dir, name, Errno::EINVAL)
    }

    fn space_seen(&self) -> MutexGuard<'_, SpaceSeen> {
        self.space.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the sharer for its space figures and keeps them (a failure keeps the last ones).
    fn ask_space(&self) -> Option<Space> {
        let asked = self.source.space();
        let mut seen = self.space_seen();
        seen.asking = false;
        let space = asked.ok()?;
        seen.last = Some((Instant::now(), space));
        Some(space)
    }

    /// The sharer's space figures for `statfs`, asked at most once per [`TTL`]. Only the first call waits
    /// for the sharer; later ones answer with the last figures at once while a thread asks for new ones,
    /// so that `df` never hangs on a sharer gone silent. Zeros while none were heard.
    fn space(self: &Arc<Self>) -> Space {
        let mut seen = self.space_seen();
        match seen.last {
            Some((at, space)) if at.elapsed() < TTL => space,
            Some((_, space)) => {
                if !seen.asking {
                    seen.asking = true;
                    let shared = Arc::clone(self);
                    let spawned = std::thread::Builder::new()
                        .name("ferry-space".into())
                        .spawn(move || shared.ask_space());
                    seen.asking = spawned.is_ok();
                }
                space
            }
            None => {
                drop(seen);
                self.ask_space().unwrap_or_default()
            }
        }
    }

    /// A new name made by this mount: the table learns it (and that its directory changed); its attributes.
    fn made(&self, parent: INodeNo, path: SharePath, entry: Entry) -> (u64, FileAttr) {
        let ino = self.inodes().made(path, parent.0, entry.clone());
        (ino, self.attr(ino, &entry))
    }

    fn create(&self, parent: INodeNo, name: &OsStr, mode: u32, reply: fuser::ReplyCreate) {
        let path = match self.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // The new file is the mount's alone until its first push (close, fsync, or the debounce): no round
        // trip here. A file made on the sharer meanwhile under the same name stays, and the push is kept
        // beside it (the conflict rule).
        let r = (|| {
            let w = self.writes()?;
            let mut copy = w.create(&path, None, mode).map_err(io_errno)?;
            copy.set_len(0).map_err(io_errno)?;
            Ok(copy)
        })();
        let copy = match r {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        let (ino, attr) = self.made(parent, path, new_entry(name, Kind::File, mode, b""));
        if let Err(e) = self.keep_copy(ino, copy) {
            return reply.error(e);
        }
        let fh = self.register(ino, true);
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        caller: &Caller,
    ) -> Result<FileAttr, Errno> {
        self.writes()?;
        if uid.is_some_and(|u| u != self.uid) || gid.is_some_and(|g| g != self.gid) {
            return Err(Errno::EPERM);
        }
        let path = self.path(ino)?;
        let known = self.inodes().entry(ino.0, false);
        let mut entry = match known {
            Some(e) => e,
            None => self.entry(ino.0, &path)?,
        };
        if let Some(size) = size {
            // Refused before the copy is loaded.
            writes::fits(size).map_err(io_errno)?;
            let copy = self.with_copy(ino.0, size == 0, |c| c.set_len(size))?;
            // What the sharer's version is streamed ahead for is not read through this inode any more.
            self.reader.changed(&path);
            // A truncate(2) of a file nobody writes lands at once.
            if !self.has_writers(ino.0) {
                self.push(ino.0, &copy, &|| caller.dying())?;
            }
        }
        let mtime = mtime.map(|t| {
            let t = match t {
                fuser::TimeOrNow::SpecificTime(t) => t,
                fuser::TimeOrNow::Now => SystemTime::now(),
            };
            match t.duration_since(UNIX_EPOCH) {
                Ok(d) => Time {
                    secs: d.as_secs() as i64,
                    nanos: d.subsec_nanos(),
                },
                Err(_) => Time { secs: 0, nanos: 0 },
            }
        });
        if let Some(t) = atime {
            let t = match t {
                fuser::TimeOrNow::SpecificTime(t) => t,
                fuser::TimeOrNow::Now => SystemTime::now(),
            };
            self.inodes().set_atime(ino.0, t);
        }
        let mode = mode.map(|m| m & 0o7777);
        if mode.is_some() || mtime.is_some() {
            // A file with unpushed writes takes them with its content (tar's fchmod and futimens before
            // close cost no round trip); otherwise they go to the sharer now.
            let copy = self.copy(ino.0);
            if !copy.as_ref().is_some_and(|c| writes::lock(c).is_dirty()) {
                self.change(Op::SetAttr(path.clone(), mode, mtime))?;
            }
            if let Some(c) = copy {
                // The next push carries them too (else it would set the sharer's time).
                let mut c = writes::lock(&c);
                if let Some(m) = mode {
                    c.set_mode(m).map_err(io_errno)?;
                }
                if let Some(t) = mtime {
                    c.set_mtime(t).map_err(io_errno)?;
                }
            }
            if let Some(m) = mode {
                entry.mode = (entry.mode & !0o7777) | m;
            }
            if let Some(t) = mtime {
                entry.mtime = t.secs;
                entry.mtime_nsec = t.nanos;
            }
            self.inodes().set_entry(ino.0, entry.clone());
        }
        Ok(self.shown(ino.0, entry))
    }

    /// `ino`, read with passthrough, changed on the sharer: followed by one thread per inode at a time
    /// (`changed` tells it to look again once it is done).
    fn follow_changed(self: &Arc<Self>, ino: u64) {
        let mut follows = self.follows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(again) = follows.get_mut(&ino) {
            *again = true;
            return;
        }
        follows.insert(ino, false);
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("ferry-follow".into())
            .spawn(move || loop {
                shared.follow(ino);
                let mut follows = shared.follows.lock().unwrap_or_else(|e| e.into_inner());
                match follows.get_mut(&ino) {
                    Some(again) if *again => *again = false,
                    _ => {
                        follows.remove(&ino);
                        return;
                    }
                }
            });
        if spawned.is_err() {
            follows.remove(&ino);
        }
    }

    /// If `ino`, read with passthrough, grew on the sharer by an append (a log, say) of at most
    /// [`FOLLOW_MAX`], the new bytes are fetched (verified) and the cache file the kernel reads becomes the
    /// new version's ([`Reader::extend`]): its open handles read on, like `tail -f` on a local file, and
    /// new opens read the new version. Otherwise they read their version until they are all closed.
    fn follow(&self, ino: u64) {
        let (Some(path), Some(old)) = ({
            let t = self.inodes();
            (t.path(ino), t.passing_through(ino))
        }) else {
            return;
        };
        let Ok(handle) = self.reader.open(&path, Some(old)) else {
            return;
        };
        let new = handle.file().version();
        let grown = new.size.saturating_sub(old.size);
        if grown == 0 || grown > FOLLOW_MAX {
            return;
        }
        let mut tail = Vec::with_capacity(grown as usize);
        while (tail.len() as u64) < grown {
            let at = old.size + tail.len() as u64;
            let want = (grown - tail.len() as u64).min(u64::from(MAX_REQUEST)) as u32;
            match self.reader.read(&handle, at, want) {
                Ok(bytes) if !bytes.is_empty() => tail.extend_from_slice(&bytes),
                _ => return,
            }
        }
        // Changed again meanwhile, or closed: the change's own notification looks again.
        let _opening = self.following.lock().unwrap_or_else(|e| e.into_inner());
        if handle.file().version() != new
            || self.inodes().passing_through(ino) != Some(old)
            || !matches!(self.reader.extend(old, new, &tail), Ok(true))
        {
            return;
        }
        // The same backing file, now holding `new`: new opens share it (the kernel takes no other).
        let mut backing = self.backing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = backing.get(&old.root).and_then(Weak::upgrade) {
            backing.insert(new.root, Arc::downgrade(&id));
        }
        drop(backing);
        self.inodes().passing_through_at(ino, new);
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        }
    }

    /// fallocate(2) of a file open for writing, on its working copy: the default mode grows it, a hole
    /// punched or a range zeroed reads as zeros (pushed as a change), `KEEP_SIZE` alone changes nothing
    /// the sharer would see. Shifting ranges (collapse, insert) and unsharing are not supported.
    fn allocate(&self, ino: INodeNo, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        self.writes()?;
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        writes::fits(end).map_err(io_errno)?;
        let flags = u32::try_from(mode)
            .ok()
            .and_then(FallocateFlags::from_bits)
            .ok_or(Errno::EOPNOTSUPP)?;
        // What the call does: grow the file to `end`, or zero the range (and grow unless it keeps the size).
        let (keep, rest) = (
            flags.contains(FallocateFlags::KEEP_SIZE),
            flags - FallocateFlags::KEEP_SIZE,
        );
        let zero = match rest {
            r if r.is_empty() && keep => return Ok(()),
            r if r.is_empty() => None,
            FallocateFlags::PUNCH_HOLE if keep => Some(true),
            FallocateFlags::ZERO_RANGE => Some(keep),
            _ => return Err(Errno::EOPNOTSUPP),
        };
        self.with_copy(ino.0, false, |c| match zero {
            None => c.grow(end),
            Some(keep_size) => c.zero(offset..end, keep_size),
        })
        .map(drop)
    }

    fn rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        caller: &Caller,
    ) -> Result<(), Errno> {
        if flags.contains(fuser::RenameFlags::RENAME_EXCHANGE)
            || flags.contains(fuser::RenameFlags::RENAME_WHITEOUT)
        {
            return Err(Errno::EINVAL);
        }
        let from = self.child_path(parent, name)?;
        let to = self.child_path(newparent, newname)?;
        // What is written there goes first: the rename moves the sharer's file.
        let moved = self.inodes().ino(&from);
        if let Some(ino) = moved {
            self.push_ino(ino, caller)?;
        }
        let replace = !flags.contains(fuser::RenameFlags::RENAME_NOREPLACE);
        // The table's guard goes before the copy is let go, which takes the table again (an `if let` on
        // it would hold it through the block: a rename over a file open for writing hung the mount).
        let replaced = self.inodes().ino(&to);
        // Whether each is a file the sharer does not have, looked at before `gone_with` locks the copy of
        // the replaced one.
        let fresh = (self.never_pushed(moved), self.never_pushed(replaced));
        // The version of the file replaced as the mount last saw it: the sharer keeps one changed since.
        let base = self.seen(replaced.filter(|_| !fresh.1));
        let rebase = if self.keeping() {
            if !replace && replaced.is_some() {
                return Err(Errno::EEXIST);
            }
            self.gone_with(replaced, || {
                self.keep_rename(fresh, &from, replaced, &to, replace, base)
            })?
        } else {
            let renamed = self.gone_if(replaced, || {
                match self.source.rename(&from, &to, replace, base) {
                    Err(SourceError::Offline(_)) => self
                        .keep_rename(fresh, &from, replaced, &to, replace, base)
                        .map(|r| (Ok(r), true)),
                    Ok(None) => Ok((Ok(None), true)),
                    // The file replaced changed on the sharer: it stays, the moved one went beside it.
                    Ok(Some(name)) => Ok((Err(name), false)),
                    Err(e) => Err(errno_of(&e)),
                }
            })?;
            match renamed {
                Ok(rebase) => rebase,
                Err(name) => return self.renamed_beside(&from, &to, &name),
            }
        };
        if let Some(copy) = rebase.and(moved.and_then(|i| self.copy(i))) {
            writes::lock(&copy).rebase(rebase).map_err(io_errno)?;
        }
        // Streaming ahead of readers of either name stops at once (not at the sharer's notification).
        self.reader.changed(&from);
        self.reader.changed(&to);
        if let Some(ino) = replaced {
            self.forget_copy(ino);
        }
        self.inodes().renamed(&from, &to);
        self.writes()?.renamed(&from, &to);
        Ok(())
    }

    /// The version of the file `ino` the mount last saw (opened, or pushed), `None` for anything else.
    fn seen(&self, ino: Option<u64>) -> Option<[u8; 32]> {
        let ino = ino?;
        let t = self.inodes();
        let file = t.entry(ino, false).is_some_and(|e| e.kind == Kind::File);
        t.version(ino).filter(|_| file).map(|v| v.root)
    }

    /// The sharer kept the file `to` (changed there since the mount saw it) and the file renamed from
    /// `from` beside it as `name`: the mount shows the same, and says so as a push's conflict is said.
    fn renamed_beside(&self, from: &SharePath, to: &SharePath, name: &[u8]) -> Result<(), Errno> {
        let (dir, _) = ferry_tree::path::split_parent(to.as_bytes());
        let dir = SharePath::new(dir).map_err(|_| Errno::EIO)?;
        let kept = crate::inodes::child(&dir, name).ok_or(Errno::EIO)?;
        self.reader.changed(from);
        self.reader.changed(to);
        self.inodes().renamed(from, &kept);
        self.writes()?.renamed(from, &kept);
        self.inodes().changed(to);
        (self.notice)(&format!(
            "conflict: {} changed on the sharer too: its version stays, yours is kept as {}",
            shown(to),
            shown(&kept)
        ));
        Ok(())
    }

    /// Whether `ino` is a file made in the mount and never pushed: the sharer does not have it (its copy
    /// has no base).
    fn never_pushed(&self, ino: Option<u64>) -> bool {
        ino.and_then(|i| self.copy(i))
            .is_some_and(|c| writes::lock(&c).base().is_none())
    }

    /// Keeps the rename of `from` (inode `moved`) to `to` (over `replaced`) for the sharer's return. A file
    /// the sharer does not have (made here, never pushed) only moves its copy; its push then replaces what
    /// it was renamed over if that is still the version the mount knew (else both are kept, the conflict
    /// rule), or, that version unknown, after a removal kept before it (an editor's save: a temporary file
    /// written, then renamed over the document).
    /// `fresh`: whether the moved and the replaced file are files the sharer does not have. Returns the
    /// base the moved file's copy takes (the replaced file's version), if it takes one.
    fn keep_rename(
        &self,
        fresh: (bool, bool),
        from: &SharePath,
        replaced: Option<u64>,
        to: &SharePath,
        replace: bool,
        base: Option<[u8; 32]>,
    ) -> Result<Option<Version>, Errno> {
        if !fresh.0 {
            return self
                .keep(Op::Rename(from.clone(), to.clone(), replace, base))
                .map(|()| None);
        }
        let Some(replaced) = replaced.filter(|_| !fresh.1) else {
            return Ok(None);
        };
        let (version, kind) = {
            let t = self.inodes();
            (
                t.version(replaced),
                t.entry(replaced, false).map(|e| e.kind),
            )
        };
        match (version, kind) {
            (_, Some(Kind::Dir)) => Err(Errno::EISDIR),
            (Some(v), _) => Ok(Some(v)),
            (None, _) => self.keep(Op::Unlink(to.clone(), None)).map(|()| None),
        }
    }

    /// Runs `change` (the sharer's rename over, or unlink of, the file of `ino`) with `ino`'s working copy
    /// locked, and orphans the copy if it succeeds: a push of the copy (a close, an fsync, the push
    /// thread) lands before the change or finds the copy orphaned, never after it as a conflict with the
    /// mount's own rename or unlink. No other copy is locked meanwhile.
    fn gone_with<T>(
        &self,
        ino: Option<u64>,
        change: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        self.gone_if(ino, || change().map(|done| (done, true)))
    }

    /// [`Shared::gone_with`] for a change that says whether the file of `ino` is gone by it (a rename the
    /// sharer kept beside a file that changed leaves it).
    fn gone_if<T>(
        &self,
        ino: Option<u64>,
        change: impl FnOnce() -> Result<(T, bool), Errno>,
    ) -> Result<T, Errno> {
        let copy = ino.and_then(|i| self.copy(i));
        let mut locked = copy.as_ref().map(writes::lock);
        let (done, gone) = change()?;
        if let Some(c) = locked.as_mut().filter(|_| gone) {
            c.orphan();
        }
        Ok(done)
    }

    /// The file of `ino` is gone (removed, renamed over): so is what was written to it, and what its
    /// handles still open for writing write (into the copy, which goes with the last of them; a write
    /// must not make a new copy from the path, which names another file now or none).
    fn forget_copy(&self, ino: u64) {
        if let Some(c) = self.copy(ino) {
            writes::lock(&c).orphan();
            if !self.has_writers(ino) {
                self.drop_copy(ino, &c);
            }
        }
    }

    /// Removes `name` (a file or symlink, or with `dir` an empty directory).
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let path = self.child_path(parent, name)?;
        let ino = self.inodes().ino(&path);
        // The version the mount last saw: the sharer keeps a file changed since (the conflict rule).
        let seen = self.seen(ino);
        match dir {
            // Not empty in the mount while a file beneath it is written here, even if the sharer has none
            // of it yet (its rmdir would succeed, and the file's push then fail for want of a directory).
            true if self.writes()?.any_beneath(&path) => return Err(Errno::ENOTEMPTY),
            // Offline, a directory is empty as the mount last saw it (with what it did since).
            true if self.keeping()
                && ino
                    .and_then(|i| self.inodes().listing(i, false))
                    .is_some_and(|l| !l.is_empty()) =>
            {
                return Err(Errno::ENOTEMPTY)
            }
            true => self.change(Op::Rmdir(path.clone()))?,
            // A file made here and never pushed is not on the sharer: nothing to tell it.
            false if self.keeping() => {
                let fresh = self.never_pushed(ino);
                self.gone_with(ino, || match fresh {
                    true => Ok(()),
                    false => self.keep(Op::Unlink(path.clone(), seen)),
                })?
            }
            false => self.gone_with(ino, || match self.source.unlink(&path, seen) {
                Ok(()) => Ok(()),
                // Not on the sharer, but written here: made in the mount and not pushed yet (a temporary
                // file unlinked while open), its pushes refused (a full disk), or removed on the sharer
                // meanwhile. Its working copy is all there is of it: it goes below, journal and all, so it
                // is never pushed later (by the push thread, or by the next mount as a write left behind).
                Err(SourceError::Failed { errno, .. })
                    if errno == libc::ENOENT && ino.is_some_and(|i| self.copy(i).is_some()) =>
                {
                    Ok(())
                }
                Err(SourceError::Offline(_)) => self.keep(Op::Unlink(path.clone(), seen)),
                // Changed on the sharer since the mount saw it: it stays (the conflict rule).
                Err(SourceError::Failed { errno, .. }) if errno == libc::ESTALE => {
                    self.inodes().changed(&path);
                    (self.notice)(&format!(
                        "conflict: {} changed on the sharer too: its version stays, not removed",
                        shown(&path)
                    ));
                    Err(Errno::ESTALE)
                }
                Err(e) => Err(errno_of(&e)),
            })?,
        }
        self.reader.changed(&path);
        if let Some(ino) = ino {
            self.forget_copy(ino);
        }
        self.inodes().removed(&path);
        Ok(())
    }
}

/// Where a read of an open handle goes.
enum Reading {
    /// The file's working copy.
    Copy(writes::Shared),
    /// The read path.
    Handle(Arc<Handle>),
}

impl<S: Source + Sink> Shared<S> {
    /// Where a read of `fh` (of `ino`) goes: the working copy while there is one, else the read path
    /// (a handle opened while there was a copy opens its read path now).
    fn reading(&self, ino: u64, fh: u64) -> Result<Reading, Errno> {
        if let Some(c) = self.copy(ino) {
            return Ok(Reading::Copy(c));
        }
        let handle = {
            let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            match open.get(&fh) {
                Some(o) => o.handle.clone(),
                None => return Err(Errno::EBADF),
            }
        };
        if let Some(h) = handle {
            return Ok(Reading::Handle(h));
        }
        let path = self.path(INodeNo(ino))?;
        let known = self.inodes().version(ino);
        let h = Arc::new(self.reader.open(&path, known).map_err(|e| errno_of(&e))?);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = open.get_mut(&fh) {
            o.handle = Some(Arc::clone(&h));
        }
        Ok(Reading::Handle(h))
    }
}

/// Hands the file of `copy` (let go of, its content the sharer's `version`) to `store` as that version,
/// so that it reads locally (and with passthrough) from now on without fetching it back: moved and hashed
/// once, never copied, and taken only if it makes the version's root (so not a copy whose unpushed writes
/// were discarded).
fn seed(store: &dyn Store, version: Version, copy: &writes::Shared) {
    let mut c = writes::lock(copy);
    if c.base() != Some(version) || !c.is_released() {
        return;
    }
    let Ok(chunks) = store.entry(version) else {
        return;
    };
    if !chunks.is_complete() {
        c.hand_over(|path| chunks.adopt(path).unwrap_or(false));
    }
}

/// A share path as the log shows it.
fn shown(path: &SharePath) -> String {
    String::from_utf8_lossy(path.as_bytes()).into_owned()
}

/// The entry of a name this mount just made (the sharer's own is learned once it is asked again).
fn new_entry(name: &OsStr, kind: Kind, mode: u32, target: &[u8]) -> Entry {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mode = mode & 0o7777;
    Entry {
        name: name.as_bytes().to_vec(),
        kind,
        size: 0,
        mode: match kind {
            Kind::Symlink => 0o777,
            _ => mode,
        },
        mtime: now.as_secs() as i64,
        mtime_nsec: now.subsec_nanos(),
        target: target.to_vec(),
    }
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
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

/// The mount's answer to the kernel's init, passthrough aside: requests of [`MAX_REQUEST`] (fuser asks
/// for `FUSE_MAX_PAGES` to match), [`MAX_BACKGROUND`] queued background requests, async reads, and the
/// other capabilities the mount takes where the kernel offers them.
pub fn negotiate(config: &mut KernelConfig) {
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
        // open(O_TRUNC) comes as one open, not a truncate (which would land an empty file) first.
        InitFlags::FUSE_ATOMIC_O_TRUNC,
    ] {
        if caps.contains(wanted) {
            let _ = config.add_capabilities(wanted);
        }
    }
}

impl<S: Source + Sink> Filesystem for ShareFs<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        negotiate(config);
        // mmap of a file opened with direct I/O goes through the page cache (kernel 6.6 and later); without
        // it, files are never opened with direct I/O (mmap must work).
        if caps.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_ok()
        {
            self.shared.direct_io.store(true, Ordering::Relaxed);
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
            Ok((ino, e)) => reply.entry(&TTL, &self.shared.shown(ino, e), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.inodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // An open handle answers with the version it reads (its size is what reads are cut at).
        if let (Some(fh), None) = (fh, self.shared.copy(ino.0)) {
            let open = self.shared.open.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(h) = open.get(&fh.0).and_then(|o| o.handle.clone()) {
                let size = h.file().version().size;
                drop(open);
                let known = self.shared.inodes().entry(ino.0, false);
                if let Some(mut e) = known {
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
            Ok(e) => reply.attr(&TTL, &self.shared.shown(ino.0, e)),
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
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let handle = match self.shared.reading(ino.0, fh.0) {
            Ok(Reading::Copy(c)) => {
                let read = writes::lock(&c).read_at(offset, size);
                return match read {
                    Ok(bytes) => reply.data(&bytes),
                    Err(e) => reply.error(io_errno(e)),
                };
            }
            Ok(Reading::Handle(h)) => h,
            Err(e) => return reply.error(e),
        };
        let read = self.shared.reader.read(&handle, offset, size);
        if let Some(said) = self.shared.reader.take_notice() {
            (self.shared.notice)(&said);
        }
        match read {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => {
                if let SourceError::Offline(why) = &e {
                    (self.shared.notice)(&format!("a read failed: {why}"));
                }
                reply.error(self.shared.told("a read", handle.path(), &e))
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
        // The last writer gone: what is still unpushed goes now (else the push thread retries it), and a
        // pushed copy is let go.
        if let Some(o) = gone.as_ref().filter(|o| o.writing) {
            if !self.shared.has_writers(o.ino) {
                if let Some(c) = self.shared.copy(o.ino) {
                    // Nobody waits for a release: pushed to the end.
                    let pushed = self.shared.push(o.ino, &c, &|| false);
                    if pushed.is_ok() && !writes::lock(&c).is_dirty() {
                        self.shared.let_go(o.ino, &c);
                    }
                }
            }
        }
        drop(gone);
        reply.ok();
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Each close: what it wrote is on the sharer when close(2) returns, or close fails.
        let writing = {
            let open = self.shared.open.lock().unwrap_or_else(|e| e.into_inner());
            open.get(&fh.0).is_some_and(|o| o.writing)
        };
        match writing {
            true => match self.shared.push_ino(ino.0, &Caller::new(req.pid())) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
            false => reply.ok(),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Pushed; or, the sharer away, kept on this disk until it is back.
        let r = self
            .shared
            .push_ino(ino.0, &Caller::new(req.pid()))
            .and_then(|()| match self.shared.copy(ino.0) {
                Some(c) if writes::lock(&c).is_dirty() => writes::lock(&c).sync().map_err(io_errno),
                _ => Ok(()),
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
            .and_then(|p| Ok((self.shared.listing_shown(ino.0, &p)?, p)));
        let (entries, dir) = match r {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        // Rows from `offset` until the reply is full (a large directory comes in many calls): `.` and
        // `..` (the kernel fills in `..` itself; the number given here is not used), then the listing;
        // a row's offset is its position + 1.
        let mut t = self.shared.inodes();
        for i in offset as usize..entries.len() + 2 {
            let (row_ino, kind, name) = match i {
                0 => (ino.0, FileType::Directory, &b"."[..]),
                1 => (ROOT, FileType::Directory, &b".."[..]),
                _ => {
                    let e = &entries[i - 2];
                    let Some(path) = child(&dir, &e.name) else {
                        continue;
                    };
                    (t.ino_for(path, ino.0), kind_of(e), &e.name[..])
                }
            };
            if reply.add(
                INodeNo(row_ino),
                i as u64 + 1,
                kind,
                OsStr::from_bytes(name),
            ) {
                break;
            }
        }
        drop(t);
        reply.ok();
    }

    /// The sharer's file system's figures, so that `df` and programs that check for room before they
    /// write see the space there is.
    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.shared.space();
        let block = s.block.max(512);
        reply.statfs(
            s.blocks,
            s.free,
            s.available,
            s.files,
            s.files_free,
            block,
            MAX_NAME as u32,
            block,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.contains(fuser::AccessFlags::W_OK) && self.shared.writes().is_err() {
            reply.error(Errno::EROFS)
        } else {
            reply.ok()
        }
    }

    // Writes (EROFS unless the mount is writable).

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let caller = Caller::new(req.pid());
        match self
            .shared
            .setattr(ino, mode, uid, gid, size, atime, mtime, &caller)
        {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
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
        // Regular files come through create; devices, fifos and sockets are not shared.
        match self.shared.writes() {
            Ok(_) => reply.error(Errno::EPERM),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mode = mode & !umask & 0o7777;
        let r = self.shared.child_path(parent, name).and_then(|path| {
            self.shared.change(Op::Mkdir(path.clone(), mode))?;
            Ok(path)
        });
        match r {
            Ok(path) => {
                let entry = new_entry(name, Kind::Dir, mode, b"");
                let (_, attr) = self.shared.made(parent, path, entry);
                reply.entry(&TTL, &attr, Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.shared.remove(parent, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.shared.remove(parent, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        let r = self.shared.child_path(parent, link_name).and_then(|path| {
            self.shared
                .change(Op::Symlink(path.clone(), target.to_vec()))?;
            Ok(path)
        });
        match r {
            Ok(path) => {
                let entry = new_entry(link_name, Kind::Symlink, 0o777, target);
                let (_, attr) = self.shared.made(parent, path, entry);
                reply.entry(&TTL, &attr, Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let caller = Caller::new(req.pid());
        match self
            .shared
            .rename(parent, name, newparent, newname, flags, &caller)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // No hard links on a share (git, for one, renames instead when a link fails).
        match self.shared.writes() {
            Ok(_) => reply.error(Errno::EPERM),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        // An append goes at the end of the copy, as it is under its lock: the kernel's offset is its own idea
        // of the size, which may be behind when several processes append to the file.
        let append = flags.0 & libc::O_APPEND != 0;
        let end = offset.saturating_add(data.len() as u64);
        if let Err(e) = writes::fits(end).map_err(io_errno) {
            return reply.error(e);
        }
        // A copy let go (pushed and closed by its last writer, or pushed as a conflict) is not written: the
        // write starts a new one on the sharer's version.
        let r = self.shared.with_copy(ino.0, false, |c| {
            let at = if append { c.size() } else { offset };
            c.write_at(at, data)
        });
        match r {
            Ok(_) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.shared.allocate(ino, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        self.shared
            .create(parent, name, mode & !umask & 0o7777, reply);
    }
}
