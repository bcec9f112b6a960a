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
//! until their last handle drops. A disk that fills up first bounds it too: a write the file system refuses
//! for want of space (or quota) bounds the cache to what it holds then, evicting as for its own bound, and the
//! insert is tried once more; the bound is lifted again after [`ROOM_RETRY`] (space may have been freed),
//! and [`Cache::disk_full`] says why meanwhile.
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

mod disk;
mod entry;
mod groups;
mod record;
mod verify;

pub use entry::Entry;

/// The parsers of what the cache reads from its directory, for the fuzz targets in `fuzz/` (a tampered cache
/// directory is input too). Not part of the API: compiled only with the `fuzzing` feature, so the shipped
/// crate exposes nothing more.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use ferry_share::tree::Version;

    /// The record of `version` in `bytes` encoded again (its canonical bytes), or `None` when damaged.
    pub fn record(version: &Version, bytes: &[u8]) -> Option<Vec<u8>> {
        let r = crate::record::decode(version, bytes)?;
        Some(crate::record::encode(version, &r.groups, r.last_use))
    }

    /// The version and kind a file name in the cache directory names, or `None` when the cache does not
    /// own the name.
    pub fn name(name: &str) -> Option<(Version, &str)> {
        crate::disk::parse_name(name)
    }

    /// The stem of a version's file names.
    pub fn base_name(version: &Version) -> String {
        crate::disk::base_name(version)
    }
}

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use ferry_share::tree::Version;

use crate::disk::{base_name, parse_name, read_record, remove_if_present};
use crate::entry::Inner;
use crate::verify::present_bytes;

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
    /// Another process (or another `Cache` in this one) has the directory open.
    #[error("the cache directory is in use by another mount")]
    Busy,
    /// The cache's files could not be read or written.
    #[error("cache: {0}")]
    Io(#[from] io::Error),
}

/// Record bytes changed before a record is written again (at least; also a quarter of what is present,
/// so rewriting a large record stays linear in the data).
pub(crate) const FLUSH_BYTES: u64 = 64 << 20;
/// Age of unwritten changes after which the next insert writes the record.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_secs(5);

/// How long a full disk bounds the cache to what it held then ([`Cache::disk_full`]); after that the disk
/// is tried again.
pub const ROOM_RETRY: Duration = Duration::from_secs(30);

/// Whether `e` is the file system refusing a write for want of space (or of the user's quota).
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// The cache of one (peer, share): shared by the mount's threads (`Arc<Cache>`).
#[derive(Debug)]
pub struct Cache {
    shared: Arc<Shared>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    dir: PathBuf,
    /// The directory, locked (`flock`) for as long as the cache or one of its entries lives.
    _lock: fs::File,
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
    /// The disk was full when the cache held this much: a bound below `limit` until [`ROOM_RETRY`] passed.
    room: Option<Room>,
}

#[derive(Debug)]
struct Room {
    bytes: u64,
    since: Instant,
    why: String,
}

impl Index {
    /// The full disk's bound, while it holds.
    fn room(&self) -> Option<&Room> {
        self.room
            .as_ref()
            .filter(|r| r.since.elapsed() < ROOM_RETRY)
    }

    /// The bound on `used` now: the cache's own, or the full disk's.
    fn bound(&self, limit: u64) -> u64 {
        self.room().map_or(limit, |r| r.bytes.min(limit))
    }
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

impl Cache {
    /// Whether another process (or another `Cache` in this one) has the cache in `dir` open: what
    /// [`Cache::open`] would refuse with [`CacheError::Busy`], asked without opening it (a missing
    /// directory is not in use).
    pub fn in_use(dir: &Path) -> io::Result<bool> {
        let dir_lock = match fs::File::open(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            opened => opened?,
        };
        // Taken and let go at once (with the file): only whether it could be taken matters.
        match rustix::fs::flock(
            &dir_lock,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => Ok(false),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens (creating 0700 directories) the cache in `dir`, bounded to `limit` bytes of present data;
    /// [`CacheError::Busy`] while another process uses it.
    /// Entries left by an earlier process are found with their present ranges (checked on first use);
    /// damaged records and stray files of the cache's own naming are deleted.
    pub fn open(dir: &Path, limit: u64) -> Result<Cache, CacheError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let dir_lock = fs::File::open(dir)?;
        match rustix::fs::flock(
            &dir_lock,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(CacheError::Busy),
            Err(e) => return Err(io::Error::from(e).into()),
        }
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
                .and_then(|_| read_record(dir, &version));
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
            _lock: dir_lock,
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
                let rec = found
                    .and_then(|_| read_record(&sh.dir, &version))
                    .unwrap_or_default();
                let accounted = present_bytes(&version, &rec.groups);
                let inner = Arc::new(Inner::new(version, id, &sh.dir, rec.groups, last_use));
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
                // On failure the handle's drop unpins it. A disk with no room for another file (out of
                // inodes, or of space for the directory's growth) has the least recently used entries
                // not in use make way, one at a time, as a full cache does for bytes.
                st.file = Some(loop {
                    match disk::open_data(&handle.inner.data_path, version.size) {
                        Err(e) if is_disk_full(&e) && sh.evict_one(&mut idx, handle.inner.id) => {}
                        opened => break opened?,
                    }
                });
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

    /// Why the cache is bounded below [`limit`](Cache::limit) now: the disk refused a write for want of
    /// space within the last [`ROOM_RETRY`].
    pub fn disk_full(&self) -> Option<String> {
        self.shared.disk_full()
    }

    /// Forgets one version: its files are deleted; handles still held see an empty entry that stores
    /// nothing.
    pub fn remove(&self, version: Version) -> Result<(), CacheError> {
        let mut idx = lock(&self.shared.index);
        self.shared.evict(&mut idx, &version);
        Ok(())
    }

    /// Makes `bytes` of room on the cache's disk for something else (a mount's working copies, refused for
    /// want of space or of inodes): evicts least recently used entries not in use, at least one, until
    /// their present bytes reach `bytes`. False when there was none to evict.
    pub fn make_room(&self, bytes: u64) -> bool {
        let mut idx = lock(&self.shared.index);
        let before = idx.used;
        let mut evicted = false;
        while !evicted || before - idx.used < bytes {
            if !self.shared.evict_one(&mut idx, u64::MAX) {
                break;
            }
            evicted = true;
        }
        evicted
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

impl Shared {
    /// Makes room for `need` more bytes of `inner`, evicting least recently used unpinned entries; false
    /// when pinned entries fill the cache (or `inner` was removed).
    pub(crate) fn reserve(&self, inner: &Inner, need: u64) -> bool {
        let mut idx = lock(&self.index);
        if idx.slots.get(&inner.version).map(|s| s.id) != Some(inner.id) {
            return false;
        }
        while idx.used + need > idx.bound(self.limit) {
            if !self.evict_one(&mut idx, inner.id) {
                return false;
            }
        }
        idx.used += need;
        idx.slots.get_mut(&inner.version).expect("checked").bytes += need;
        true
    }

    /// The bound on present bytes now ([`Cache::limit`], or less while the disk is full).
    pub(crate) fn bound(&self) -> u64 {
        lock(&self.index).bound(self.limit)
    }

    /// The disk refused a write for want of space (`why`): the cache is bounded to what it holds now.
    pub(crate) fn full(&self, why: &io::Error) {
        let mut idx = lock(&self.index);
        idx.room = Some(Room {
            bytes: idx.used,
            since: Instant::now(),
            why: why.to_string(),
        });
    }

    pub(crate) fn disk_full(&self) -> Option<String> {
        lock(&self.index).room().map(|r| r.why.clone())
    }

    /// Gives back `bytes` of `inner`'s accounting (dropped, or reserved and not used).
    pub(crate) fn release(&self, inner: &Inner, bytes: u64) {
        self.account(inner, 0, bytes);
    }

    /// Counts `add` more and `sub` fewer present bytes of `inner` (nothing if it was removed meanwhile).
    pub(crate) fn account(&self, inner: &Inner, add: u64, sub: u64) {
        if add == sub {
            return;
        }
        let mut idx = lock(&self.index);
        let Some(slot) = idx.slots.get_mut(&inner.version) else {
            return;
        };
        if slot.id != inner.id {
            return;
        }
        let old = slot.bytes;
        let new = (old + add).saturating_sub(sub);
        slot.bytes = new;
        idx.used = idx.used + new - old;
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
