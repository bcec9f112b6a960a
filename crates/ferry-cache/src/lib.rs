//! The mount's chunk cache on disk: one directory per (peer, share), holding per file version one sparse
//! cache file and one record of the groups present in it, each with its verification value.
//!
//! Bytes enter the cache already verified by the share client against their version's root; the cache keeps
//! them verified on disk. For every present group the record holds BLAKE3's chaining value of that group at
//! its place in the version's tree (the share protocol's tree), so:
//! - on the first use of an entry in a process, and whenever the cache file's identity or ctime differs from
//!   what this process last saw, the present groups are hashed again and those that do not match are
//!   dropped (they are fetched again) — a byte altered on disk is never returned;
//! - once every group is present their values combine to the version's root, which is checked once: only
//!   then is the entry complete and its file handed out for FUSE passthrough ([`Entry::backing`]).
//!
//! The cache is bounded by a number of present bytes, evicting least recently used entries (their last use
//! is kept in the record, so the order survives a restart); entries handed out ([`Cache::entry`]) are pinned
//! until their last handle drops.
//!
//! Records are written atomically (temporary file, rename) and in batches, never fsynced: a crash can lose
//! the groups inserted since the last write of a record (the bytes are fetched again), or leave a record that
//! names groups whose data never reached the disk — the first use in the next process hashes them again and
//! drops them. A damaged record is an empty entry. Nothing on disk is trusted before it is checked.
//!
//! ```no_run
//! # fn main() -> Result<(), ferry_cache::CacheError> {
//! # let version = ferry_share::tree::Version { size: 5, root: [0; 32] };
//! let cache = ferry_cache::Cache::open(std::path::Path::new("/tmp/cache"), 1 << 30)?;
//! let entry = cache.entry(version)?;
//! for range in entry.missing(0..5) {
//!     // fetch `range` through the share client (verified), then:
//!     # let verified = vec![0u8; 5];
//!     entry.insert(range.start, &verified)?;
//! }
//! let mut buf = [0u8; 5];
//! entry.read_at(&mut buf, 0)?;
//! # Ok(()) }
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod groups;
mod record;
mod verify;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use ferry_share::tree::{Version, GROUP};

use crate::groups::{Cv, Groups};
use crate::verify::{combines_to_root, group_count, group_cv, span};

/// A cache operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Some byte of the range is not in the cache (or was dropped because it no longer verified).
    #[error("not in the cache")]
    Missing,
    /// Inserted bytes are not whole groups at a group offset inside the file.
    #[error("the bytes are not whole groups inside the file")]
    Range,
    /// The values of a complete entry do not combine to its version's root: everything of it was dropped.
    #[error("the cached file does not match its version's hash")]
    Mismatch,
    /// The cache's files could not be read or written.
    #[error("cache: {0}")]
    Io(#[from] io::Error),
}

/// Record bytes changed before a record is written again (at least; also a quarter of what is present,
/// so rewriting a large record stays linear in the data).
const FLUSH_BYTES: u64 = 64 << 20;
/// Age of unwritten changes after which the next insert writes the record.
const FLUSH_AFTER: Duration = Duration::from_secs(5);
/// Groups read at once when hashing present data again (1 MiB).
const REHASH_GROUPS: u64 = 64;

/// The cache of one (peer, share): shared by the mount's threads (`Arc<Cache>`).
#[derive(Debug)]
pub struct Cache {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    limit: u64,
    index: Mutex<Index>,
    /// Logical clock of uses: higher is more recent.
    clock: AtomicU64,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct Index {
    slots: HashMap<Version, Slot>,
    used: u64,
}

/// One version known to the cache: on disk only, or loaded in this process.
#[derive(Debug)]
struct Slot {
    id: u64,
    /// Present bytes, as accounted in `used`.
    bytes: u64,
    /// Last use when not loaded (loaded entries keep theirs in `Inner::last_use`).
    last_use: u64,
    inner: Option<Arc<Inner>>,
}

impl Slot {
    fn last_use(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(self.last_use, |i| i.last_use.load(Ordering::Relaxed))
    }

    fn pinned(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.pins.load(Ordering::Acquire) > 0)
    }
}

/// The state of one loaded version, shared by its handles.
#[derive(Debug)]
struct Inner {
    version: Version,
    id: u64,
    data_path: PathBuf,
    record_path: PathBuf,
    state: RwLock<State>,
    /// Held while a record is written or the entry is discarded (before `state`).
    writing_record: Mutex<()>,
    last_use: AtomicU64,
    /// Handles alive; changed only with the index locked (up) or by a handle's drop (down).
    pins: AtomicU64,
}

#[derive(Debug)]
struct State {
    /// Open while pinned.
    file: Option<File>,
    groups: Groups,
    /// The cache file's identity when this process last verified or wrote it.
    seen: Option<Stamp>,
    /// Every group present and their values combine to the root.
    complete: bool,
    /// Evicted or removed: the handles left see an empty entry and store nothing.
    removed: bool,
    /// Present bytes changed since the record was written.
    dirty: u64,
    /// Anything (also drops) not yet in the record.
    changed: bool,
    recorded_use: u64,
    last_record: Instant,
}

/// What identifies the content of a cache file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Option<Stamp> {
        m.is_file().then(|| Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            ctime: (m.ctime(), m.ctime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }

    fn at(path: &Path) -> Option<Stamp> {
        fs::symlink_metadata(path).ok().as_ref().and_then(Stamp::of)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// File names of a version: derived from its root and size only, never from a peer's path.
fn base_name(version: &Version) -> String {
    let mut s = String::with_capacity(64 + 21);
    for b in version.root {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('-');
    s.push_str(&version.size.to_string());
    s
}

/// The kind of file a name in the cache directory is, and its version.
fn parse_name(name: &str) -> Option<(Version, &str)> {
    let (stem, kind) = name.split_once('.')?;
    let (hex, size) = stem.split_once('-')?;
    if hex.len() != 64 || size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut root = [0u8; 32];
    for (i, b) in root.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    let version = Version {
        size: size.parse().ok()?,
        root,
    };
    // Only names this cache writes (lower-case hex, no leading zeros) are its own.
    (base_name(&version) == stem).then_some((version, kind))
}

fn remove_if_present(path: &Path) {
    // Best effort: a file left behind is found again by the next open and dealt with there.
    let _ = fs::remove_file(path);
}

fn open_data(path: &Path, size: u64) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if file.metadata()?.len() != size {
        file.set_len(size)?;
    }
    Ok(file)
}

/// Reads into `buf` at `offset` until it is full or the file ends; returns the bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl Cache {
    /// Opens (creating 0700 directories) the cache in `dir`, bounded to `limit` bytes of present data.
    /// Entries left by an earlier process are found with their present ranges (checked on first use);
    /// damaged records and stray files of the cache's own naming are deleted.
    pub fn open(dir: &Path, limit: u64) -> Result<Cache, CacheError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut records = Vec::new();
        let mut data = HashMap::new();
        for item in fs::read_dir(dir)? {
            let item = item?;
            let name = item.file_name();
            let Some((version, kind)) = name.to_str().and_then(parse_name) else {
                continue;
            };
            match kind {
                "record" => records.push(version),
                "data" => {
                    data.insert(version, item.path());
                }
                "record.tmp" => remove_if_present(&item.path()),
                _ => {}
            }
        }
        let mut index = Index::default();
        let mut clock = 0;
        for version in records {
            let base = dir.join(base_name(&version));
            let record_path = base.with_extension("record");
            let loaded = data
                .remove(&version)
                .and_then(|_| read_record(&record_path, &version));
            let Some(rec) = loaded else {
                remove_if_present(&record_path);
                remove_if_present(&base.with_extension("data"));
                continue;
            };
            let bytes = present_bytes(&version, &rec.groups);
            clock = clock.max(rec.last_use + 1);
            index.used += bytes;
            index.slots.insert(
                version,
                Slot {
                    id: 0,
                    bytes,
                    last_use: rec.last_use,
                    inner: None,
                },
            );
        }
        // Data without a record holds nothing the cache knows of.
        for path in data.into_values() {
            remove_if_present(&path);
        }
        let shared = Shared {
            dir: dir.to_path_buf(),
            limit,
            index: Mutex::new(index),
            clock: AtomicU64::new(clock),
            next_id: AtomicU64::new(1),
        };
        {
            let mut idx = lock(&shared.index);
            for slot in idx.slots.values_mut() {
                slot.id = shared.next_id.fetch_add(1, Ordering::Relaxed);
            }
            // A smaller limit than last time evicts at once.
            while idx.used > limit {
                if !shared.evict_one(&mut idx, 0) {
                    break;
                }
            }
        }
        Ok(Cache {
            shared: Arc::new(shared),
        })
    }

    /// The entry of one version, created empty if new. Entries handed out are pinned (never evicted) until
    /// every handle is dropped. The first use of an entry in this process hashes its present groups again.
    pub fn entry(&self, version: Version) -> Result<Arc<Entry>, CacheError> {
        let sh = &self.shared;
        let mut idx = lock(&sh.index);
        let inner = match idx.slots.get(&version) {
            Some(Slot {
                inner: Some(inner), ..
            }) => inner.clone(),
            found => {
                let (id, last_use) = match found {
                    Some(slot) => (slot.id, slot.last_use),
                    None => (sh.next_id.fetch_add(1, Ordering::Relaxed), 0),
                };
                let base = sh.dir.join(base_name(&version));
                let record_path = base.with_extension("record");
                let rec = found
                    .and_then(|_| read_record(&record_path, &version))
                    .unwrap_or_default();
                let accounted = present_bytes(&version, &rec.groups);
                let inner = Arc::new(Inner {
                    version,
                    id,
                    data_path: base.with_extension("data"),
                    record_path,
                    state: RwLock::new(State {
                        file: None,
                        groups: rec.groups,
                        seen: None,
                        complete: false,
                        removed: false,
                        dirty: 0,
                        changed: false,
                        recorded_use: last_use,
                        last_record: Instant::now(),
                    }),
                    writing_record: Mutex::new(()),
                    last_use: AtomicU64::new(last_use),
                    pins: AtomicU64::new(0),
                });
                let old = idx.slots.insert(
                    version,
                    Slot {
                        id,
                        bytes: accounted,
                        last_use,
                        inner: Some(inner.clone()),
                    },
                );
                // The record read now may differ from the one counted at open (damaged since: empty).
                idx.used = idx.used - old.map_or(0, |s| s.bytes) + accounted;
                inner
            }
        };
        inner.pins.fetch_add(1, Ordering::AcqRel);
        let handle = Arc::new(Entry {
            shared: self.shared.clone(),
            inner,
        });
        handle.touch();
        {
            let mut st = write(&handle.inner.state);
            if st.file.is_none() && !st.removed {
                // On failure the handle's drop unpins it.
                st.file = Some(open_data(&handle.inner.data_path, version.size)?);
            }
        }
        drop(idx);
        handle.check()?;
        Ok(handle)
    }

    /// Bytes of present data now (sum over entries).
    pub fn used(&self) -> u64 {
        lock(&self.shared.index).used
    }

    /// The bound on [`used`](Cache::used).
    pub fn limit(&self) -> u64 {
        self.shared.limit
    }

    /// Forgets one version: its files are deleted; handles still held see an empty entry that stores
    /// nothing.
    pub fn remove(&self, version: Version) -> Result<(), CacheError> {
        let mut idx = lock(&self.shared.index);
        self.shared.evict(&mut idx, &version);
        Ok(())
    }

    /// Writes the record of every entry loaded in this process that changed since its last write.
    pub fn flush(&self) -> Result<(), CacheError> {
        let loaded: Vec<Arc<Inner>> = lock(&self.shared.index)
            .slots
            .values()
            .filter_map(|s| s.inner.clone())
            .collect();
        for inner in loaded {
            inner.write_record()?;
        }
        Ok(())
    }
}

fn read_record(path: &Path, version: &Version) -> Option<record::Record> {
    let file = File::open(path).ok()?;
    let max = record::max_len(version);
    if file.metadata().ok()?.len() > max {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).ok()?;
    record::decode(version, &bytes)
}

fn present_bytes(version: &Version, groups: &Groups) -> u64 {
    groups
        .runs()
        .map(|(first, cvs)| span(version.size, first..first + cvs.len() as u64))
        .sum()
}

impl Shared {
    /// Makes room for `need` more bytes of `inner`, evicting least recently used unpinned entries; false
    /// when pinned entries fill the cache (or `inner` was removed).
    fn reserve(&self, inner: &Inner, need: u64) -> bool {
        let mut idx = lock(&self.index);
        if idx.slots.get(&inner.version).map(|s| s.id) != Some(inner.id) {
            return false;
        }
        while idx.used + need > self.limit {
            if !self.evict_one(&mut idx, inner.id) {
                return false;
            }
        }
        idx.used += need;
        idx.slots.get_mut(&inner.version).expect("checked").bytes += need;
        true
    }

    /// Gives back `bytes` of `inner`'s accounting (dropped, or reserved and not used).
    fn release(&self, inner: &Inner, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut idx = lock(&self.index);
        let Some(slot) = idx.slots.get_mut(&inner.version) else {
            return;
        };
        if slot.id != inner.id {
            return;
        }
        let bytes = bytes.min(slot.bytes);
        slot.bytes -= bytes;
        idx.used -= bytes;
    }

    /// Evicts the least recently used unpinned entry other than `keep`; false when there is none.
    fn evict_one(&self, idx: &mut Index, keep: u64) -> bool {
        let victim = idx
            .slots
            .iter()
            .filter(|(_, s)| s.id != keep && !s.pinned())
            .min_by_key(|(_, s)| s.last_use())
            .map(|(v, _)| *v);
        match victim {
            Some(v) => {
                self.evict(idx, &v);
                true
            }
            None => false,
        }
    }

    fn evict(&self, idx: &mut Index, version: &Version) {
        let Some(slot) = idx.slots.remove(version) else {
            return;
        };
        idx.used -= slot.bytes;
        if let Some(inner) = &slot.inner {
            let _writing = lock(&inner.writing_record);
            let mut st = write(&inner.state);
            st.removed = true;
            st.file = None;
            st.groups.clear();
            st.complete = false;
        }
        let base = self.dir.join(base_name(version));
        remove_if_present(&base.with_extension("record"));
        remove_if_present(&base.with_extension("data"));
    }
}

impl Inner {
    /// Hashes the present groups again if the cache file is not the one this process last saw; returns the
    /// bytes dropped.
    fn check(&self) -> Result<u64, CacheError> {
        {
            let st = read(&self.state);
            if st.removed || (st.seen.is_some() && st.seen == Stamp::at(&self.data_path)) {
                return Ok(0);
            }
        }
        let mut st = write(&self.state);
        if st.removed || (st.seen.is_some() && st.seen == Stamp::at(&self.data_path)) {
            return Ok(0);
        }
        self.revalidate(&mut st)
    }

    fn revalidate(&self, st: &mut State) -> Result<u64, CacheError> {
        let size = self.version.size;
        let now = fs::symlink_metadata(&self.data_path).ok();
        let ours = match (&st.file, &now) {
            (Some(f), Some(m)) if m.is_file() => {
                let f = f.metadata()?;
                f.dev() == m.dev() && f.ino() == m.ino()
            }
            _ => false,
        };
        if !ours {
            // Replaced, deleted or never opened: whatever is at the path now is what gets checked.
            st.file = None;
            if now.as_ref().is_some_and(|m| !m.is_file()) {
                remove_if_present(&self.data_path);
            }
            st.file = Some(open_data(&self.data_path, size)?);
        }
        let file = st.file.as_ref().expect("opened");
        if file.metadata()?.len() != size {
            file.set_len(size)?;
        }
        let mut bad = Vec::new();
        let mut buf = vec![0u8; (REHASH_GROUPS * GROUP) as usize];
        for (first, cvs) in st.groups.runs() {
            let end = first + cvs.len() as u64;
            let mut g = first;
            while g < end {
                let batch = (end - g).min(REHASH_GROUPS);
                let len = span(size, g..g + batch) as usize;
                let got = read_full(file, &mut buf[..len], g * GROUP)?;
                for i in 0..batch {
                    let at = (i * GROUP) as usize;
                    let glen = span(size, g + i..g + i + 1) as usize;
                    let ok = at + glen <= got
                        && group_cv(size, g + i, &buf[at..at + glen])
                            == cvs[(g + i - first) as usize];
                    if !ok {
                        bad.push(g + i);
                    }
                }
                g += batch;
            }
        }
        let mut dropped = 0;
        if !bad.is_empty() {
            let mut next = bad.iter().peekable();
            st.groups.retain(|g, _| {
                if next.peek() == Some(&&g) {
                    next.next();
                    false
                } else {
                    true
                }
            });
            dropped = bad.iter().map(|g| span(size, *g..*g + 1)).sum();
            st.changed = true;
        }
        st.complete = st
            .groups
            .whole(group_count(size))
            .is_some_and(|cvs| combines_to_root(&self.version, cvs))
            || (size == 0 && combines_to_root(&self.version, &[]));
        if !st.complete && st.groups.count() == group_count(size) && size > 0 {
            // Every group hashes to its value, yet they do not make the root: no group can be trusted.
            dropped += present_bytes(&self.version, &st.groups);
            self.clear(st)?;
        }
        st.seen = Stamp::at(&self.data_path);
        Ok(dropped)
    }

    /// Drops every group and frees the file's blocks.
    fn clear(&self, st: &mut State) -> io::Result<()> {
        st.groups.clear();
        st.complete = false;
        st.changed = true;
        if let Some(f) = &st.file {
            f.set_len(0)?;
            f.set_len(self.version.size)?;
        }
        Ok(())
    }

    /// Writes the record now if anything changed since the last write.
    fn write_record(&self) -> Result<(), CacheError> {
        let _writing = lock(&self.writing_record);
        let bytes = {
            let mut st = write(&self.state);
            let last_use = self.last_use.load(Ordering::Relaxed);
            if st.removed || (!st.changed && st.recorded_use == last_use) {
                return Ok(());
            }
            st.changed = false;
            st.dirty = 0;
            st.recorded_use = last_use;
            st.last_record = Instant::now();
            record::encode(&self.version, &st.groups, last_use)
        };
        let tmp = self.record_path.with_extension("record.tmp");
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            fs::rename(&tmp, &self.record_path)
        })();
        if let Err(e) = written {
            remove_if_present(&tmp);
            write(&self.state).changed = true;
            return Err(e.into());
        }
        Ok(())
    }
}

/// One version's part of the cache: a handle that pins it while alive (`Arc<Entry>`, shared by threads).
#[derive(Debug)]
pub struct Entry {
    shared: Arc<Shared>,
    inner: Arc<Inner>,
}

impl Entry {
    /// The version it caches.
    pub fn version(&self) -> Version {
        self.inner.version
    }

    fn touch(&self) {
        let now = self.shared.clock.fetch_add(1, Ordering::Relaxed);
        self.inner.last_use.fetch_max(now, Ordering::Relaxed);
    }

    fn check(&self) -> Result<(), CacheError> {
        let dropped = self.inner.check()?;
        self.shared.release(&self.inner, dropped);
        Ok(())
    }

    /// Group-aligned sub-ranges of `range` (clamped to the size) that are not present, in order, merged.
    pub fn missing(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let size = self.inner.version.size;
        let range = range.start.min(size)..range.end.min(size);
        if range.is_empty() {
            return Vec::new();
        }
        let groups = range.start / GROUP..range.end.div_ceil(GROUP);
        if self.check().is_err() {
            // The file cannot be checked: nothing of it is served.
            let whole = groups.start * GROUP..span(size, 0..groups.end);
            return vec![whole];
        }
        read(&self.inner.state)
            .groups
            .gaps(groups)
            .into_iter()
            .map(|g| g.start * GROUP..span(size, 0..g.end))
            .collect()
    }

    /// Copies present bytes at `offset` into `buf` (clamped to the size); `Err(Missing)` if any byte of the
    /// range is absent. Never returns bytes that are not verified.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, CacheError> {
        let size = self.inner.version.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = (buf.len() as u64).min(size - offset);
        let groups = offset / GROUP..(offset + len).div_ceil(GROUP);
        self.check()?;
        let st = read(&self.inner.state);
        let file = match &st.file {
            Some(f) if st.groups.contains(groups) => f,
            _ => return Err(CacheError::Missing),
        };
        match file.read_exact_at(&mut buf[..len as usize], offset) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(CacheError::Missing),
            Err(e) => return Err(e.into()),
        }
        drop(st);
        self.touch();
        Ok(len as usize)
    }

    /// Stores verified bytes: `offset` group-aligned, `bytes` whole groups (a short one only at the end of
    /// the file). Returns false if they were not stored because the cache is full of pinned entries (or the
    /// entry was removed): the caller serves them from memory. Evicts least recently used unpinned entries
    /// as needed. `Err(Mismatch)` when they complete the entry and the whole does not make the root: then
    /// nothing of the entry is kept.
    pub fn insert(&self, offset: u64, bytes: &[u8]) -> Result<bool, CacheError> {
        let size = self.inner.version.size;
        let end = offset
            .checked_add(bytes.len() as u64)
            .ok_or(CacheError::Range)?;
        if !offset.is_multiple_of(GROUP)
            || end > size
            || !(end.is_multiple_of(GROUP) || end == size)
        {
            return Err(CacheError::Range);
        }
        if bytes.is_empty() {
            return Ok(true);
        }
        self.check()?;
        let groups = offset / GROUP..end.div_ceil(GROUP);
        let need: u64 = {
            let st = read(&self.inner.state);
            if st.removed {
                return Ok(false);
            }
            st.groups
                .gaps(groups.clone())
                .into_iter()
                .map(|g| span(size, g))
                .sum()
        };
        self.touch();
        if need == 0 {
            return Ok(true);
        }
        let cvs: Vec<Cv> = bytes
            .chunks(GROUP as usize)
            .zip(groups.clone())
            .map(|(b, g)| group_cv(size, g, b))
            .collect();
        if !self.shared.reserve(&self.inner, need) {
            return Ok(false);
        }
        let stored = self.store(groups, offset, bytes, &cvs);
        let (added, dropped) = match &stored {
            Ok(Some((added, dropped))) => (*added, *dropped),
            Ok(None) | Err(_) => (0, 0),
        };
        self.shared.release(&self.inner, need - added + dropped);
        let (complete, dirty, present, since) = {
            let st = read(&self.inner.state);
            (
                st.complete,
                st.dirty,
                st.groups.count() * GROUP,
                st.last_record.elapsed(),
            )
        };
        match stored? {
            None => Ok(false),
            Some((_, dropped)) if dropped > 0 => {
                self.inner.write_record()?;
                Err(CacheError::Mismatch)
            }
            Some(_) => {
                if complete || dirty >= FLUSH_BYTES.max(present / 4) || since >= FLUSH_AFTER {
                    self.inner.write_record()?;
                }
                Ok(true)
            }
        }
    }

    /// Writes the groups of `groups` not present yet; returns the bytes added and, when they completed an
    /// entry that does not make the root, the bytes dropped (`None` when the entry was removed).
    fn store(
        &self,
        groups: Range<u64>,
        offset: u64,
        bytes: &[u8],
        cvs: &[Cv],
    ) -> Result<Option<(u64, u64)>, CacheError> {
        let inner = &self.inner;
        let size = inner.version.size;
        let mut st = write(&inner.state);
        if st.removed {
            return Ok(None);
        }
        let file = st.file.as_ref().ok_or(CacheError::Missing)?;
        let gaps = st.groups.gaps(groups.clone());
        for gap in &gaps {
            let from = (gap.start * GROUP - offset) as usize;
            let to = (span(size, 0..gap.end) - offset) as usize;
            file.write_all_at(&bytes[from..to], gap.start * GROUP)?;
        }
        let mut added = 0;
        for gap in gaps {
            let at = (gap.start - groups.start) as usize;
            st.groups
                .insert(gap.start, &cvs[at..at + (gap.end - gap.start) as usize]);
            added += span(size, gap);
        }
        st.dirty += added;
        st.changed = true;
        st.seen = Stamp::at(&inner.data_path);
        let n = group_count(size);
        if st.groups.count() == n {
            if combines_to_root(&inner.version, st.groups.whole(n).expect("all present")) {
                st.complete = true;
            } else {
                let dropped = present_bytes(&inner.version, &st.groups);
                inner.clear(&mut st)?;
                st.seen = Stamp::at(&inner.data_path);
                return Ok(Some((added, dropped)));
            }
        }
        Ok(Some((added, 0)))
    }

    /// Whether every byte is present and the whole makes the version's root.
    pub fn is_complete(&self) -> bool {
        let st = read(&self.inner.state);
        st.complete && !st.removed
    }

    /// A read-only descriptor of the cache file when the entry is complete and its content verified (hashed
    /// again first if the file changed since this process last saw it) — for FUSE passthrough.
    pub fn backing(&self) -> Result<Option<File>, CacheError> {
        self.check()?;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.inner.data_path);
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        // The descriptor handed out must be the file just checked, unchanged since.
        let stamp = Stamp::of(&file.metadata()?);
        let st = read(&self.inner.state);
        if !st.complete || st.removed || stamp.is_none() || stamp != st.seen {
            return Ok(None);
        }
        drop(st);
        self.touch();
        Ok(Some(file))
    }

    /// Writes the record now (also done by itself: in batches, when the entry completes, and when the last
    /// handle of the entry drops).
    pub fn flush(&self) -> Result<(), CacheError> {
        self.inner.write_record()
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.inner.pins.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // Errors cannot be reported from a drop: the record stays as last written (data fetched again).
        let _ = self.inner.write_record();
        let mut st = write(&self.inner.state);
        if self.inner.pins.load(Ordering::Acquire) == 0 {
            st.file = None;
        }
    }
}
