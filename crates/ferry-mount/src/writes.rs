//! Writes through the mount: a working copy per written file, pushed to the sharer as a whole version.
//!
//! A file opened for writing gets a [`WorkingCopy`] under the mount's cache directory: its current content
//! (fetched through the read path) unless the open truncates it, and the version it started from (its
//! base). Writes, truncates and reads of that file go to the copy; attributes show it. A push sends the
//! copy with [`Sink::put`]: only the ranges changed since the base (the sharer copies the rest from its
//! file), verified there by the content's root and renamed over the file atomically. The sharer lands it
//! only if its file is still the base; otherwise it keeps its file and puts the copy beside it, visibly
//! (`NAME.conflict-PEER-DATE`): nothing is lost. After a push the pushed version is the base of the next.
//!
//! This module is the part without FUSE: [`WorkingCopy`] (content, changed ranges, push) and [`Writes`]
//! (the copies by inode number). `fuse` decides when to push (flush, fsync, release, a debounce).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_share::tree::Version;
use ferry_share::wire::{Entry, SharePath, Time};
use rustix::fs::FallocateFlags;

use crate::pending::Pending;
use crate::source::{PutContent, PutOutcome, Sink, SourceError};

/// A file kept open and written is pushed once it has not been written for this long.
pub const DEBOUNCE: Duration = Duration::from_secs(1);

/// The longest wait between two tries of a push the sharer refused (its disk full, a name it cannot
/// take): the waits double from [`DEBOUNCE`] up to this, so a large file it keeps refusing is not sent
/// again and again while the mount runs.
pub const MAX_REFUSED_WAIT: Duration = Duration::from_secs(30);

/// The largest file the mount writes: 16 TiB, ext4's limit (with 4 KiB blocks). A push hashes every byte of
/// a file, holes too (a BLAKE3 root covers the whole content), so a file grown to any size the kernel allows
/// (a petabyte by `truncate -s`) would cost hours of a core; beyond this a write, a truncate or an
/// fallocate fails at once with EFBIG, as on such a local disk.
pub const MAX_FILE: u64 = 1 << 44;

/// `Ok` if a file may reach `end` bytes; EFBIG if not ([`MAX_FILE`]).
pub fn fits(end: u64) -> io::Result<()> {
    match end <= MAX_FILE {
        true => Ok(()),
        false => Err(io::Error::from_raw_os_error(libc::EFBIG)),
    }
}

/// How a push ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// Nothing to push: the sharer has this content already.
    Clean,
    /// The sharer's file is this version now (the base of the next push).
    Written(Version),
    /// The sharer's file had changed: it stays, and the copy's content is beside it under this name.
    Conflicted(Vec<u8>),
}

/// What the copies ask of the store beside them on their disk (the chunk cache) when the disk refuses
/// them for want of space or of inodes: to give up at least so many bytes, or one file; whether it gave
/// up anything. Then the refused operation is tried once more: a cache never takes the room of a write.
#[derive(Clone)]
pub struct Room(Arc<dyn Fn(u64) -> bool + Send + Sync>);

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Room")
    }
}

impl Room {
    /// Room made by `give_up(bytes)`.
    pub fn new(give_up: impl Fn(u64) -> bool + Send + Sync + 'static) -> Room {
        Room(Arc::new(give_up))
    }

    /// `op`, and once more if the disk refused it for want of room and `room` gave up `bytes` or more.
    fn retry<T>(
        room: Option<&Room>,
        bytes: u64,
        mut op: impl FnMut() -> io::Result<T>,
    ) -> io::Result<T> {
        match op() {
            Err(e) if ferry_cache::is_disk_full(&e) && room.is_some_and(|r| (r.0)(bytes)) => op(),
            r => r,
        }
    }
}

/// The local content of one written file, and what the sharer has of it.
#[derive(Debug)]
pub struct WorkingCopy {
    file: File,
    /// What makes room on the disk when it refuses the copy.
    room: Option<Room>,
    path: PathBuf,
    /// Where the copy goes on the sharer (kept in its journal while dirty), whether its file is gone, and
    /// the size, mode and time it shows: read without the copy's lock, which a push holds for its whole
    /// round trip.
    place: Arc<Mutex<Place>>,
    /// The sharer's version the copy started from, or was last pushed as (`None`: no file there).
    base: Option<Version>,
    /// Ranges that may differ from the base (sorted, disjoint, not touching).
    changed: Vec<Range<u64>>,
    /// Something (content, mode, time) is not on the sharer yet.
    dirty: bool,
    /// The modification time set (utimens); `None`: the time of the last write, the sharer's at push.
    mtime: Option<Time>,
    last_write: Instant,
    /// The last push failed (the link was lost): retried, and said once it lands.
    failed: bool,
    /// Pushes the sharer refused in a row, and when the next may be tried ([`MAX_REFUSED_WAIT`]).
    refused: (u32, Option<Instant>),
    /// Its last writer let go of it and it left the mount's copies: nothing writes it any more.
    released: bool,
    /// Its file was handed over (to the cache): not removed with the copy.
    handed_over: bool,
}

impl Drop for WorkingCopy {
    /// A copy with nothing unpushed goes with its file; a dirty one (the mount stops while the sharer is
    /// away) stays with its journal, for the next mount of the share to push.
    fn drop(&mut self) {
        if !self.dirty && !self.handed_over {
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_file(journal_of(&self.path));
        }
    }
}

/// The journal beside a copy's file: where it goes and what it started from, written when the copy
/// becomes dirty and removed once it is pushed, so that a copy a crashed mount left behind is pushed by the
/// next one ([`Writes::push_left_behind`]).
fn journal_of(copy: &Path) -> PathBuf {
    let mut name = copy.as_os_str().to_owned();
    name.push(JOURNAL_SUFFIX);
    PathBuf::from(name)
}

/// The journal's name is the copy's and this.
const JOURNAL_SUFFIX: &str = ".journal";
const JOURNAL_MAGIC: &str = "ferry-working-copy 1";

/// What a journal records: the sharer's path, the base, the mode and the time set.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Journal {
    path: SharePath,
    base: Option<Version>,
    mode: u32,
    mtime: Option<Time>,
}

/// Bytes as lowercase hex, for the journals (names may hold any byte but `/` and NUL).
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of [`hex`]'s text, or `None` if it is not such text.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Journal {
    fn encode(&self) -> String {
        let base = match self.base {
            Some(v) => format!("{} {}", hex(&v.root), v.size),
            None => "none".into(),
        };
        let mtime = match self.mtime {
            Some(t) => format!("{} {}", t.secs, t.nanos),
            None => "none".into(),
        };
        format!(
            "{JOURNAL_MAGIC}\npath {}\nbase {base}\nmode {:o}\nmtime {mtime}\n",
            hex(self.path.as_bytes()),
            self.mode
        )
    }

    /// The journal in `text`, or `None` if it is not one (cut short by a crash, say).
    fn decode(text: &str) -> Option<Journal> {
        let mut lines = text.lines();
        if lines.next()? != JOURNAL_MAGIC {
            return None;
        }
        let mut field = |name: &str| lines.next()?.strip_prefix(name)?.strip_prefix(' ');
        let path = SharePath::new(&unhex(field("path")?)?).ok()?;
        let base = match field("base")? {
            "none" => None,
            b => {
                let (root, size) = b.split_once(' ')?;
                Some(Version {
                    root: unhex(root)?.try_into().ok()?,
                    size: size.parse().ok()?,
                })
            }
        };
        let mode = u32::from_str_radix(field("mode")?, 8).ok()? & 0o7777;
        let mtime = match field("mtime")? {
            "none" => None,
            t => {
                let (secs, nanos) = t.split_once(' ')?;
                Some(Time {
                    secs: secs.parse().ok()?,
                    nanos: nanos.parse().ok().filter(|n| *n < 1_000_000_000)?,
                })
            }
        };
        Some(Journal {
            path,
            base,
            mode,
            mtime,
        })
    }
}

/// A working copy's journal in `text` encoded again (its canonical text), or `None` if it is not one: the
/// fuzz targets' way in ([`crate::fuzzing`]).
#[cfg(feature = "fuzzing")]
pub(crate) fn journal_again(text: &str) -> Option<String> {
    Journal::decode(text).map(|j| j.encode())
}

impl WorkingCopy {
    /// An empty copy at `path` (a new file there) of the sharer's `base`; [`WorkingCopy::load`] fills in the
    /// base's content, else the copy counts as truncated.
    pub fn create(
        path: PathBuf,
        share_path: SharePath,
        base: Option<Version>,
        mode: u32,
        room: Option<Room>,
    ) -> io::Result<WorkingCopy> {
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
        };
        let make = || match open() {
            // The copies' directory was removed under the mount (a user clearing `~/.cache`): made again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                use std::os::unix::fs::DirBuilderExt;
                if let Some(dir) = path.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(dir)?;
                }
                open()
            }
            r => r,
        };
        let file = Room::retry(room.as_ref(), 0, make)?;
        let size = base.map_or(0, |v| v.size);
        file.set_len(size)?;
        Ok(WorkingCopy {
            file,
            room,
            path,
            place: Arc::new(Mutex::new(Place {
                path: share_path,
                gone: false,
                size,
                mode,
                modified: SystemTime::now(),
            })),
            base,
            changed: Vec::new(),
            dirty: false,
            mtime: None,
            last_write: Instant::now(),
            failed: false,
            refused: (0, None),
            released: false,
            handed_over: false,
        })
    }

    /// Puts the base's bytes at `offset` (not a change).
    pub fn load(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.put(offset, bytes)
    }

    /// `bytes` at `offset` of the file, room made for them if the disk refuses them.
    fn put(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        Room::retry(self.room.as_ref(), bytes.len() as u64, || {
            self.file.write_all_at(bytes, offset)
        })
    }

    /// Writes `bytes` at `offset` (growing the file as needed; a hole reads as zeros).
    pub fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let end = offset
            .checked_add(bytes.len() as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        fits(end)?;
        self.put(offset, bytes)?;
        // Bytes between the old end and the write are zeros now, whatever the base had there; past the
        // base's end the sharer's copy of the base reads as zeros already.
        let old = {
            let mut p = self.place();
            let old = p.size;
            p.size = p.size.max(end);
            old
        };
        if old < offset {
            self.mark(old..offset.min(self.zeros_from().max(old)))?;
        }
        self.mark(offset..end)
    }

    /// Where the sharer's copy of the base reads as zeros (it is cut or zero-extended to the pushed size,
    /// so a grown end of zeros need not be sent): the base's end, or 0 without a base (sent whole anyway).
    fn zeros_from(&self) -> u64 {
        self.base.map_or(0, |b| b.size)
    }

    /// Cuts or extends the file to `size`.
    pub fn set_len(&mut self, size: u64) -> io::Result<()> {
        fits(size)?;
        self.file.set_len(size)?;
        let old = std::mem::replace(&mut self.place().size, size);
        for r in &mut self.changed {
            r.end = r.end.min(size);
        }
        self.changed.retain(|r| !r.is_empty());
        // A grown end is a hole here and zeros on the sharer (its base zero-extended): only what was the
        // base's below it is a change. A size change is pushed however little it marks.
        let from = old.min(size);
        self.mark(from..size.min(self.zeros_from().max(from)))
    }

    /// Grows the file to `end` if it is shorter (fallocate's default mode: the new bytes read as zeros).
    /// No space is reserved on the sharer: its file is written whole or in ranges at the push.
    pub fn grow(&mut self, end: u64) -> io::Result<()> {
        match end > self.size() {
            true => self.set_len(end),
            false => Ok(()),
        }
    }

    /// Makes `range` read as zeros (a hole punched, or a range zeroed), growing the file to its end
    /// unless `keep_size` (then the part past the end is left alone).
    pub fn zero(&mut self, range: Range<u64>, keep_size: bool) -> io::Result<()> {
        if !keep_size {
            self.grow(range.end)?;
        }
        let range = range.start..range.end.min(self.size());
        if range.is_empty() {
            return Ok(());
        }
        let hole = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, hole, range.start, range.end - range.start) {
            Ok(()) => {}
            // A cache on a file system without holes: the zeros written.
            Err(rustix::io::Errno::OPNOTSUPP) => {
                let zeros = vec![0; (range.end - range.start).min(1 << 20) as usize];
                let mut at = range.start;
                while at < range.end {
                    let n = (range.end - at).min(zeros.len() as u64) as usize;
                    self.file.write_all_at(&zeros[..n], at)?;
                    at += n as u64;
                }
            }
            Err(e) => return Err(e.into()),
        }
        self.mark(range)
    }

    /// Reads up to `len` bytes at `offset`, cut at the end.
    pub fn read_at(&self, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(u64::from(len)).min(self.size());
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0; (end - offset) as usize];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// Sets the permission bits (pushed with the content).
    pub fn set_mode(&mut self, mode: u32) -> io::Result<()> {
        self.place().mode = mode & 0o7777;
        match self.dirty {
            true => self.journal(),
            false => Ok(()),
        }
    }

    /// Sets the modification time (pushed with the content).
    pub fn set_mtime(&mut self, mtime: Time) -> io::Result<()> {
        self.mtime = Some(mtime);
        self.place().modified = match u64::try_from(mtime.secs) {
            Ok(s) => UNIX_EPOCH + Duration::new(s, mtime.nanos),
            Err(_) => UNIX_EPOCH,
        };
        match self.dirty {
            true => self.journal(),
            false => Ok(()),
        }
    }

    /// Records the copy in its journal.
    fn journal(&self) -> io::Result<()> {
        let j = {
            let p = self.place();
            Journal {
                path: p.path.clone(),
                base: self.base,
                mode: p.mode,
                mtime: self.mtime,
            }
        };
        let text = j.encode();
        Room::retry(self.room.as_ref(), text.len() as u64, || {
            std::fs::write(journal_of(&self.path), &text)
        })
    }

    /// The copy now derives from `base` (a file the sharer does not have, renamed offline over one it
    /// has): its push replaces that version, or is kept beside a file changed since. Every byte counts as
    /// changed, since none of them came from the base.
    pub fn rebase(&mut self, base: Option<Version>) -> io::Result<()> {
        self.base = base;
        let size = self.size();
        self.changed.clear();
        if size > 0 {
            self.changed.push(0..size);
        }
        match self.dirty {
            true => self.journal(),
            false => Ok(()),
        }
    }

    /// Writes the copy's content to its disk (an fsync while it cannot be pushed).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// The copy now goes to `path` on the sharer (a rename in the mount).
    pub fn move_to(&mut self, path: SharePath) -> io::Result<()> {
        self.place().path = path;
        match self.dirty {
            true => self.journal(),
            false => Ok(()),
        }
    }

    /// Forgets what is unpushed (the file was removed in the mount): the copy and its journal go when it
    /// is dropped.
    pub fn discard(&mut self) {
        self.dirty = false;
        let _ = std::fs::remove_file(journal_of(&self.path));
    }

    /// The copy's file was removed or renamed over in the mount: what is unpushed is forgotten (its journal
    /// goes), and so is what the handles still open on it write from now on. Their writes land in the copy
    /// and read back through them, as those of a removed local file do, but never reach the sharer: the
    /// copy is never dirty again.
    pub fn orphan(&mut self) {
        self.discard();
        self.place().gone = true;
    }

    /// Whether its file was removed or renamed over ([`WorkingCopy::orphan`]).
    pub fn is_gone(&self) -> bool {
        self.place().gone
    }

    fn place(&self) -> MutexGuard<'_, Place> {
        lock_place(&self.place)
    }

    fn mark(&mut self, range: Range<u64>) -> io::Result<()> {
        if self.is_gone() {
            return Ok(());
        }
        if !self.dirty {
            // Dirty from now on: recorded first, so that a crash leaves what the next mount needs.
            self.journal()?;
        }
        self.dirty = true;
        self.touched();
        if range.is_empty() {
            return Ok(());
        }
        self.changed.push(range);
        self.changed.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(self.changed.len());
        for r in self.changed.drain(..) {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        self.changed = merged;
        Ok(())
    }

    fn touched(&mut self) {
        self.mtime = None;
        self.place().modified = SystemTime::now();
        self.last_write = Instant::now();
    }

    /// The size now.
    pub fn size(&self) -> u64 {
        self.place().size
    }

    /// The ranges changed since the base.
    pub fn changed(&self) -> &[Range<u64>] {
        &self.changed
    }

    /// Whether something is not on the sharer yet.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether the copy is dirty, was last written at least `quiet` ago, and is not waiting to try again a
    /// push the sharer refused.
    pub fn is_due(&self, quiet: Duration) -> bool {
        let waiting = self.refused.1.is_some_and(|at| Instant::now() < at);
        self.dirty && self.last_write.elapsed() >= quiet && !waiting
    }

    /// The base version.
    pub fn base(&self) -> Option<Version> {
        self.base
    }

    /// `entry` (the sharer's, or last seen) as the copy shows it: its size, mode and time.
    pub fn overlay(&self, entry: &mut Entry) {
        self.place().overlay(entry);
    }

    /// Marks the copy let go of: its last writer closed it and the mount dropped it from its copies.
    pub fn release(&mut self) {
        self.released = true;
    }

    /// Whether its last writer let go of it.
    pub fn is_released(&self) -> bool {
        self.released
    }

    /// Gives the copy's file to `take` (which moves it, as the cache does when it adopts a pushed file)
    /// if the copy is pushed and let go of; true once `take` took it. The copy then no longer removes
    /// the file when it goes.
    pub fn hand_over(&mut self, take: impl FnOnce(&Path) -> bool) -> bool {
        if self.dirty || !self.released || self.handed_over {
            return false;
        }
        self.handed_over = take(&self.path);
        self.handed_over
    }

    /// Whether the last push failed; `failed` is the new state.
    pub fn failed(&mut self, failed: bool) -> bool {
        std::mem::replace(&mut self.failed, failed)
    }

    /// Sends the copy to `sink` as `path` if it is dirty: only the changed ranges when there is a base.
    pub fn push(
        &mut self,
        sink: &dyn Sink,
        path: &SharePath,
        stop: &dyn Fn() -> bool,
    ) -> Result<Pushed, SourceError> {
        if !self.dirty {
            return Ok(Pushed::Clean);
        }
        let ranges = self.base.is_some().then_some(&self.changed[..]);
        let base = self.base.map(|v| v.root);
        // The time the mount shows goes with the content, so that the sharer's file shows it too (and the
        // mount need not ask for it again).
        let (mode, modified) = {
            let p = self.place();
            (p.mode, p.modified)
        };
        let mtime = self.mtime.unwrap_or_else(|| time_of(modified));
        let content = PutContent::new(&self.file, ranges, mode, Some(mtime)).stopped_by(stop);
        let outcome = sink.put(path, base, content);
        self.refused = match &outcome {
            // The link: tried again at once when it is back (failing fast meanwhile); a stopped push is
            // tried again as soon as it is due.
            Ok(_) | Err(SourceError::Offline(_) | SourceError::Stopped) => (0, None),
            Err(_) => {
                let n = self.refused.0.saturating_add(1);
                let wait = DEBOUNCE.saturating_mul(1 << (n - 1).min(16));
                (n, Some(Instant::now() + wait.min(MAX_REFUSED_WAIT)))
            }
        };
        match outcome? {
            PutOutcome::Written { version } => {
                self.base = Some(version);
                self.changed.clear();
                self.discard();
                Ok(Pushed::Written(version))
            }
            PutOutcome::Conflicted { name } => {
                // The sharer holds this content beside its own now: nothing of it is pending.
                self.discard();
                Ok(Pushed::Conflicted(name))
            }
        }
    }
}

/// `t` as the wire's time (the epoch for a time before it).
fn time_of(t: SystemTime) -> Time {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    Time {
        secs: d.as_secs() as i64,
        nanos: d.subsec_nanos(),
    }
}

/// The working copies of a mount, by inode number, in one directory.
#[derive(Debug)]
pub struct Writes {
    dir: PathBuf,
    /// What makes room for the copies on their disk.
    room: Option<Room>,
    /// Each copy with its place, which is read without the copy's lock.
    copies: Mutex<HashMap<u64, Registered>>,
    next: AtomicU64,
    /// Dirty copies an earlier mount of the share left (a crash, or the sharer away when it stopped):
    /// their files and journals, pushed by [`Writes::push_left_behind`].
    left_behind: Mutex<Vec<LeftBehind>>,
    /// The name and attribute changes made while the sharer was out of reach, sent before any push.
    pending: Pending,
}

/// The pending changes' journal in the copies' directory (not a copy).
const PENDING: &str = "pending-changes";

/// A dirty copy an earlier mount left: its file, its journal's record, and whether its failure was said.
#[derive(Debug)]
struct LeftBehind {
    file: PathBuf,
    journal: Journal,
    said: bool,
}

/// What became of a copy an earlier mount left, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// On the sharer now.
    Written(SharePath),
    /// The sharer's file had changed: it stays, the copy is beside it under this name.
    Conflicted(SharePath, Vec<u8>),
    /// Cannot be pushed (why): kept at this local path, tried again by the next mount.
    Kept(SharePath, String, PathBuf),
}

/// A working copy shared by the requests that use it.
pub type Shared = Arc<Mutex<WorkingCopy>>;

/// Where a copy goes on the sharer, and whether its file was removed or renamed over in the mount
/// ([`WorkingCopy::orphan`]).
#[derive(Debug)]
struct Place {
    path: SharePath,
    gone: bool,
    /// The size, permission bits and modification time the copy shows ([`WorkingCopy::overlay`]).
    size: u64,
    mode: u32,
    modified: SystemTime,
}

/// A copy in the table, with its place (read without the copy's lock).
type Registered = (Shared, Arc<Mutex<Place>>);

impl Place {
    fn overlay(&self, entry: &mut Entry) {
        entry.size = self.size;
        entry.mode = (entry.mode & !0o7777) | self.mode;
        if let Ok(d) = self.modified.duration_since(UNIX_EPOCH) {
            entry.mtime = d.as_secs() as i64;
            entry.mtime_nsec = d.subsec_nanos();
        }
    }
}

fn lock_place(place: &Mutex<Place>) -> MutexGuard<'_, Place> {
    place.lock().unwrap_or_else(|e| e.into_inner())
}

/// Locks a working copy (a panicked holder left it usable: its file is the truth).
pub fn lock(copy: &Shared) -> MutexGuard<'_, WorkingCopy> {
    copy.lock().unwrap_or_else(|e| e.into_inner())
}

impl Writes {
    /// Copies kept in `dir` (created if needed, private to the user), which only this mount uses (the
    /// cache's lock). Copies an earlier mount left there: clean ones are removed, dirty ones (with a
    /// journal) are kept to be pushed ([`Writes::left_behind`]); a copy whose journal cannot be read stays
    /// where it is, said by [`Writes::push_left_behind`].
    pub fn new(dir: &Path) -> io::Result<Writes> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut left = Vec::new();
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        names.sort();
        for file in names {
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with(PENDING) {
                continue;
            }
            if name.ends_with(JOURNAL_SUFFIX) {
                let copy = file.with_file_name(name.trim_end_matches(JOURNAL_SUFFIX));
                if !copy.exists() {
                    let _ = std::fs::remove_file(&file);
                }
                continue;
            }
            match std::fs::read_to_string(journal_of(&file)) {
                Ok(text) => {
                    // Unreadable: left where it is (never removed unread), tried again next time.
                    if let Some(journal) = Journal::decode(&text) {
                        left.push(LeftBehind {
                            file,
                            journal,
                            said: false,
                        });
                    }
                }
                // No journal: pushed before the mount stopped.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let _ = std::fs::remove_file(&file);
                }
                Err(_) => {}
            }
        }
        Ok(Writes {
            pending: Pending::open(&dir.join(PENDING))?,
            dir: dir.to_path_buf(),
            room: None,
            copies: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            left_behind: Mutex::new(left),
        })
    }

    /// The name and attribute changes waiting for the sharer.
    pub fn pending(&self) -> &Pending {
        &self.pending
    }

    /// The same, asking `room` for room on the copies' disk when it refuses them.
    pub fn with_room(mut self, room: Room) -> Writes {
        self.room = Some(room);
        self
    }

    /// How many copies an earlier mount left that are still to be pushed.
    pub fn left_behind(&self) -> usize {
        self.left_behind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Pushes the copies an earlier mount left (whole, from the base their journal names: a file changed
    /// on the sharer since keeps both by the conflict rule). Those that land or conflict are removed;
    /// those the sharer cannot take now stay for the next try. Returns what to say: each outcome once.
    pub fn push_left_behind(&self, sink: &dyn Sink) -> Vec<Recovered> {
        let mut said = Vec::new();
        let mut left = self.left_behind.lock().unwrap_or_else(|e| e.into_inner());
        left.retain_mut(|l| {
            // Refused by the sharer (not lost on the way): tried again by the next mount, not every round,
            // which would send the whole file again each time.
            if l.said {
                return true;
            }
            let j = &l.journal;
            let failed = |e: io::Error| SourceError::Failed {
                errno: e.raw_os_error().unwrap_or(libc::EIO),
                message: e.to_string(),
            };
            // A copy grown past the limit by an earlier version of the mount is kept, never hashed whole.
            let pushed = File::open(&l.file)
                .and_then(|f| fits(f.metadata()?.len()).map(|()| f))
                .map_err(failed)
                .and_then(|f| {
                    let content = PutContent::new(&f, None, j.mode, j.mtime);
                    sink.put(&j.path, j.base.map(|v| v.root), content)
                });
            let done = match pushed {
                Ok(PutOutcome::Written { .. }) => Recovered::Written(j.path.clone()),
                Ok(PutOutcome::Conflicted { name }) => Recovered::Conflicted(j.path.clone(), name),
                // Tried again on the next round.
                Err(SourceError::Offline(_)) => return true,
                Err(e) => {
                    if !l.said {
                        l.said = true;
                        said.push(Recovered::Kept(
                            j.path.clone(),
                            e.to_string(),
                            l.file.clone(),
                        ));
                    }
                    return true;
                }
            };
            let _ = std::fs::remove_file(journal_of(&l.file));
            let _ = std::fs::remove_file(&l.file);
            said.push(done);
            false
        });
        said
    }

    /// `from` was renamed to `to` in the mount: copies at or beneath it go to the new paths.
    pub fn renamed(&self, from: &SharePath, to: &SharePath) {
        let prefix = from.as_bytes();
        // Each copy at or beneath `from` locked with the table let go: a copy's lock is held across a push,
        // which takes other locks (the mount's inode table) that are held while the table is looked at.
        let at = |place: &Place| place.path == *from || beneath(from, &place.path);
        for (c, place) in self.registered() {
            if !at(&lock_place(&place)) {
                continue;
            }
            let mut c = lock(&c);
            // Looked at again under the copy's lock (moved meanwhile by another rename).
            let p = lock_place(&place);
            if !at(&p) {
                continue;
            }
            let mut moved = to.as_bytes().to_vec();
            moved.extend_from_slice(&p.path.as_bytes()[prefix.len()..]);
            drop(p);
            if let Ok(path) = SharePath::new(&moved) {
                let _ = c.move_to(path);
            }
        }
    }

    /// The table of copies: never held while another lock is taken.
    fn copies(&self) -> MutexGuard<'_, HashMap<u64, Registered>> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every copy with its place.
    fn registered(&self) -> Vec<Registered> {
        self.copies().values().cloned().collect()
    }

    /// Every copy's place, by inode.
    fn places(&self) -> Vec<(u64, Arc<Mutex<Place>>)> {
        self.copies()
            .iter()
            .map(|(ino, (_, place))| (*ino, Arc::clone(place)))
            .collect()
    }

    /// A new copy of `base` (empty, to be loaded) for `mode`, going to `path` on the sharer, not yet
    /// registered.
    pub fn create(
        &self,
        path: &SharePath,
        base: Option<Version>,
        mode: u32,
    ) -> io::Result<WorkingCopy> {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let name = format!("{}-{n}", std::process::id());
            // A name an earlier mount (of the same process id) left is not taken over.
            let room = self.room.clone();
            match WorkingCopy::create(self.dir.join(name), path.clone(), base, mode, room) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                r => return r,
            }
        }
    }

    /// The copy of `ino`.
    pub fn get(&self, ino: u64) -> Option<Shared> {
        self.copies().get(&ino).map(|(c, _)| Arc::clone(c))
    }

    /// Registers `copy` for `ino`; one registered meanwhile wins (and is returned).
    pub fn insert(&self, ino: u64, copy: WorkingCopy) -> Shared {
        let place = Arc::clone(&copy.place);
        let (c, _) = self
            .copies()
            .entry(ino)
            .or_insert_with(|| (Arc::new(Mutex::new(copy)), place))
            .clone();
        c
    }

    /// Forgets the copy of `ino` if it is still `copy`; whether it was.
    pub fn remove(&self, ino: u64, copy: &Shared) -> bool {
        let mut copies = self.copies();
        let is = copies.get(&ino).is_some_and(|(c, _)| Arc::ptr_eq(c, copy));
        if is {
            copies.remove(&ino);
        }
        is
    }

    /// The files directly inside `dir` that have a copy their file was not removed or renamed over:
    /// each one's inode and name. A new file is not on the sharer before its first push (nor one whose
    /// pushes were refused), but the mount shows it, as a local disk shows a file being written.
    pub fn inside(&self, dir: &SharePath) -> Vec<(u64, Vec<u8>)> {
        self.places()
            .into_iter()
            .filter_map(|(ino, place)| {
                let p = lock_place(&place);
                let name = name_in(dir, &p.path).filter(|_| !p.gone)?;
                Some((ino, name.to_vec()))
            })
            .collect()
    }

    /// Whether a file at or beneath `dir` has a copy its file was not removed or renamed over: the
    /// directory is not empty in the mount, whatever the sharer's listing says.
    pub fn any_beneath(&self, dir: &SharePath) -> bool {
        self.places().into_iter().any(|(_, place)| {
            let p = lock_place(&place);
            !p.gone && beneath(dir, &p.path)
        })
    }

    /// `entry` as the copy of `ino` shows it (its size, mode and time), if `ino` has one; read without the
    /// copy's lock, so that a stat does not wait for the copy's push.
    pub fn overlay(&self, ino: u64, entry: &mut Entry) -> bool {
        let Some(place) = self.copies().get(&ino).map(|(_, p)| Arc::clone(p)) else {
            return false;
        };
        lock_place(&place).overlay(entry);
        true
    }

    /// Every copy, by inode.
    pub fn all(&self) -> Vec<(u64, Shared)> {
        self.copies()
            .iter()
            .map(|(i, (c, _))| (*i, Arc::clone(c)))
            .collect()
    }
}

/// Whether `path` lies beneath `dir` (not `dir` itself).
fn beneath(dir: &SharePath, path: &SharePath) -> bool {
    let (d, p) = (dir.as_bytes(), path.as_bytes());
    match dir.is_root() {
        true => !path.is_root(),
        false => p.starts_with(d) && p.get(d.len()) == Some(&b'/'),
    }
}

/// `path`'s name when it lies directly inside `dir`.
fn name_in<'a>(dir: &SharePath, path: &'a SharePath) -> Option<&'a [u8]> {
    if !beneath(dir, path) {
        return None;
    }
    let p = path.as_bytes();
    let rest = match dir.is_root() {
        true => p,
        false => &p[dir.as_bytes().len() + 1..],
    };
    (!rest.contains(&b'/')).then_some(rest)
}

#[cfg(test)]
mod tests;
