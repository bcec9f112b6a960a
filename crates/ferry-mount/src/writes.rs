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

use crate::source::{PutOutcome, Sink, SourceError};

/// A file kept open and written is pushed once it has not been written for this long.
pub const DEBOUNCE: Duration = Duration::from_secs(1);

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

/// The local content of one written file, and what the sharer has of it.
#[derive(Debug)]
pub struct WorkingCopy {
    file: File,
    path: PathBuf,
    /// The sharer's version the copy started from, or was last pushed as (`None`: no file there).
    base: Option<Version>,
    size: u64,
    /// Ranges that may differ from the base (sorted, disjoint, not touching).
    changed: Vec<Range<u64>>,
    /// Something (content, mode, time) is not on the sharer yet.
    dirty: bool,
    mode: u32,
    /// The modification time set (utimens); `None`: the time of the last write, the sharer's at push.
    mtime: Option<Time>,
    modified: SystemTime,
    last_write: Instant,
    /// The last push failed (the link was lost): retried, and said once it lands.
    failed: bool,
}

impl Drop for WorkingCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl WorkingCopy {
    /// An empty copy at `path` (a new file there) of the sharer's `base`; [`WorkingCopy::load`] fills in the
    /// base's content, else the copy counts as truncated.
    pub fn create(path: PathBuf, base: Option<Version>, mode: u32) -> io::Result<WorkingCopy> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let size = base.map_or(0, |v| v.size);
        file.set_len(size)?;
        Ok(WorkingCopy {
            file,
            path,
            base,
            size,
            changed: Vec::new(),
            dirty: false,
            mode,
            mtime: None,
            modified: SystemTime::now(),
            last_write: Instant::now(),
            failed: false,
        })
    }

    /// Puts the base's bytes at `offset` (not a change).
    pub fn load(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)
    }

    /// Writes `bytes` at `offset` (growing the file as needed; a hole reads as zeros).
    pub fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)?;
        let end = offset + bytes.len() as u64;
        // Bytes between the old end and the write are zeros now, whatever the base had there.
        let from = offset.min(self.size);
        self.size = self.size.max(end);
        self.mark(from..end);
        Ok(())
    }

    /// Cuts or extends the file to `size`.
    pub fn set_len(&mut self, size: u64) -> io::Result<()> {
        self.file.set_len(size)?;
        let old = self.size;
        self.size = size;
        for r in &mut self.changed {
            r.end = r.end.min(size);
        }
        self.changed.retain(|r| !r.is_empty());
        self.mark(old.min(size)..size);
        self.dirty = true;
        self.touched();
        Ok(())
    }

    /// Reads up to `len` bytes at `offset`, cut at the end.
    pub fn read_at(&self, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(u64::from(len)).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0; (end - offset) as usize];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// Sets the permission bits (pushed with the content).
    pub fn set_mode(&mut self, mode: u32) {
        self.mode = mode & 0o7777;
    }

    /// Sets the modification time (pushed with the content).
    pub fn set_mtime(&mut self, mtime: Time) {
        self.mtime = Some(mtime);
        self.modified = match u64::try_from(mtime.secs) {
            Ok(s) => UNIX_EPOCH + Duration::new(s, mtime.nanos),
            Err(_) => UNIX_EPOCH,
        };
    }

    fn mark(&mut self, range: Range<u64>) {
        self.dirty = true;
        self.touched();
        if range.is_empty() {
            return;
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
    }

    fn touched(&mut self) {
        self.mtime = None;
        self.modified = SystemTime::now();
        self.last_write = Instant::now();
    }

    /// The size now.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The ranges changed since the base.
    pub fn changed(&self) -> &[Range<u64>] {
        &self.changed
    }

    /// Whether something is not on the sharer yet.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether the copy is dirty and was last written at least `quiet` ago.
    pub fn is_due(&self, quiet: Duration) -> bool {
        self.dirty && self.last_write.elapsed() >= quiet
    }

    /// The base version.
    pub fn base(&self) -> Option<Version> {
        self.base
    }

    /// `entry` (the sharer's, or last seen) as the copy shows it: its size, mode and time.
    pub fn overlay(&self, entry: &mut Entry) {
        entry.size = self.size;
        entry.mode = (entry.mode & !0o7777) | self.mode;
        if let Ok(d) = self.modified.duration_since(UNIX_EPOCH) {
            entry.mtime = d.as_secs() as i64;
            entry.mtime_nsec = d.subsec_nanos();
        }
    }

    /// The file holding the content (for seeding the cache after a push).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the last push failed; `failed` is the new state.
    pub fn failed(&mut self, failed: bool) -> bool {
        std::mem::replace(&mut self.failed, failed)
    }

    /// Sends the copy to `sink` as `path` if it is dirty: only the changed ranges when there is a base.
    pub fn push(&mut self, sink: &dyn Sink, path: &SharePath) -> Result<Pushed, SourceError> {
        if !self.dirty {
            return Ok(Pushed::Clean);
        }
        let ranges = self.base.is_some().then_some(&self.changed[..]);
        let base = self.base.map(|v| v.root);
        match sink.put(path, base, &self.file, ranges, self.mode, self.mtime)? {
            PutOutcome::Written { version } => {
                self.base = Some(version);
                self.changed.clear();
                self.dirty = false;
                Ok(Pushed::Written(version))
            }
            PutOutcome::Conflicted { name } => {
                // The sharer holds this content beside its own now: nothing of it is pending.
                self.dirty = false;
                Ok(Pushed::Conflicted(name))
            }
        }
    }
}

/// The working copies of a mount, by inode number, in one directory.
#[derive(Debug)]
pub struct Writes {
    dir: PathBuf,
    copies: Mutex<HashMap<u64, Arc<Mutex<WorkingCopy>>>>,
    next: AtomicU64,
}

/// A working copy shared by the requests that use it.
pub type Shared = Arc<Mutex<WorkingCopy>>;

/// Locks a working copy (a panicked holder left it usable: its file is the truth).
pub fn lock(copy: &Shared) -> MutexGuard<'_, WorkingCopy> {
    copy.lock().unwrap_or_else(|e| e.into_inner())
}

impl Writes {
    /// Copies kept in `dir` (created if needed, private to the user). Copies a crashed mount left there are
    /// kept, not read.
    pub fn new(dir: &Path) -> io::Result<Writes> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(Writes {
            dir: dir.to_path_buf(),
            copies: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    fn copies(&self) -> MutexGuard<'_, HashMap<u64, Shared>> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new copy of `base` (empty, to be loaded) for `mode`, not yet registered.
    pub fn create(&self, base: Option<Version>, mode: u32) -> io::Result<WorkingCopy> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{n}", std::process::id());
        WorkingCopy::create(self.dir.join(name), base, mode)
    }

    /// The copy of `ino`.
    pub fn get(&self, ino: u64) -> Option<Shared> {
        self.copies().get(&ino).cloned()
    }

    /// Registers `copy` for `ino`; one registered meanwhile wins (and is returned).
    pub fn insert(&self, ino: u64, copy: WorkingCopy) -> Shared {
        Arc::clone(
            self.copies()
                .entry(ino)
                .or_insert_with(|| Arc::new(Mutex::new(copy))),
        )
    }

    /// Forgets the copy of `ino` if it is still `copy`; whether it was.
    pub fn remove(&self, ino: u64, copy: &Shared) -> bool {
        let mut copies = self.copies();
        let is = copies.get(&ino).is_some_and(|c| Arc::ptr_eq(c, copy));
        if is {
            copies.remove(&ino);
        }
        is
    }

    /// Every copy, by inode.
    pub fn all(&self) -> Vec<(u64, Shared)> {
        self.copies()
            .iter()
            .map(|(i, c)| (*i, Arc::clone(c)))
            .collect()
    }
}

#[cfg(test)]
mod tests;
