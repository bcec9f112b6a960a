//! One version's entry: its sparse cache file, its present groups, their checks, its record.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use ferry_share::tree::{Version, GROUP};

use crate::disk::{base_name, create_in, open_data, read_full, remove_if_present, Stamp};
use crate::groups::{Cv, Groups};
use crate::verify::{
    combines_to_root, group_count, group_cv, hash_again, hash_groups, present_bytes, span,
};
use crate::{
    is_disk_full, lock, read, record, write, CacheError, Shared, FLUSH_AFTER, FLUSH_BYTES,
};

/// Bytes an entry larger than the cache drops of itself at once to make room ([`Entry::shed`]).
const SHED_BATCH: u64 = 64 << 20;

/// The state of one loaded version, shared by its handles.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) version: Version,
    pub(crate) id: u64,
    pub(crate) data_path: PathBuf,
    pub(crate) record_path: PathBuf,
    pub(crate) state: RwLock<State>,
    /// Held while a record is written or the entry is discarded (before `state`).
    pub(crate) writing_record: Mutex<()>,
    pub(crate) last_use: AtomicU64,
    /// Handles alive; changed only with the index locked (up) or by a handle's drop (down).
    pub(crate) pins: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct State {
    /// Open while pinned.
    pub(crate) file: Option<File>,
    pub(crate) groups: Groups,
    /// The cache file's identity when this process last verified or wrote it.
    pub(crate) seen: Option<Stamp>,
    /// Every group present and their values combine to the root.
    pub(crate) complete: bool,
    /// Evicted or removed: the handles left see an empty entry and store nothing.
    pub(crate) removed: bool,
    /// Present bytes changed since the record was written.
    pub(crate) dirty: u64,
    /// Anything (also drops) not yet in the record.
    pub(crate) changed: bool,
    pub(crate) recorded_use: u64,
    pub(crate) last_record: Instant,
}

impl Inner {
    /// The state of `version` in cache directory `dir`, with the groups its record lists (not checked yet).
    pub(crate) fn new(
        version: Version,
        id: u64,
        dir: &Path,
        groups: Groups,
        last_use: u64,
    ) -> Inner {
        let base = dir.join(base_name(&version));
        Inner {
            version,
            id,
            data_path: base.with_extension("data"),
            record_path: base.with_extension("record"),
            state: RwLock::new(State {
                file: None,
                groups,
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
        }
    }

    /// Hashes the present groups again if the cache file is not the one this process last saw; returns the
    /// bytes dropped.
    pub(crate) fn check(&self) -> Result<u64, CacheError> {
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
        let bad = hash_again(file, size, &st.groups)?;
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
    pub(crate) fn write_record(&self) -> Result<(), CacheError> {
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
            let mut f = create_in(
                &tmp,
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW),
            )?;
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

/// Frees the blocks of `groups` of a cache file of a version of `size` bytes (its length stays).
fn punch(file: &File, size: u64, groups: Range<u64>) -> io::Result<()> {
    rustix::fs::fallocate(
        file,
        rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
        groups.start * GROUP,
        span(size, groups),
    )
    .map_err(io::Error::from)
}

/// What one insert changed.
struct Stored {
    /// Bytes newly present.
    added: u64,
    /// Bytes no longer present: found altered on disk, or all of them when the entry did not make its root.
    dropped: u64,
    /// The inserted bytes completed the entry and it did not make its root.
    mismatch: bool,
}

/// One version's part of the cache: a handle that pins it while alive (`Arc<Entry>`, shared by threads).
#[derive(Debug)]
pub struct Entry {
    pub(crate) shared: Arc<Shared>,
    pub(crate) inner: Arc<Inner>,
}

impl Entry {
    /// The version it caches.
    pub fn version(&self) -> Version {
        self.inner.version
    }

    pub(crate) fn touch(&self) {
        let now = self.shared.clock.fetch_add(1, Ordering::Relaxed);
        self.inner.last_use.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn check(&self) -> Result<(), CacheError> {
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
        // The file is checked before and after the copy: a change on disk while copying is seen after it
        // (ctime), and the bytes are then refused and the entry checked again.
        for _ in 0..2 {
            self.check()?;
            let st = read(&self.inner.state);
            let file = match &st.file {
                Some(f) if st.groups.contains(groups.clone()) => f,
                _ => return Err(CacheError::Missing),
            };
            match file.read_exact_at(&mut buf[..len as usize], offset) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
                Err(e) => return Err(e.into()),
            }
            if Stamp::of(&file.metadata()?) == st.seen {
                drop(st);
                self.touch();
                return Ok(len as usize);
            }
            drop(st);
            write(&self.inner.state).seen = None;
        }
        Err(CacheError::Missing)
    }

    /// Stores verified bytes: `offset` group-aligned, `bytes` whole groups (a short one only at the end of
    /// the file). Evicts least recently used unpinned entries as needed; when every other entry is pinned,
    /// drops groups of this one outside the bytes (lowest first: a file larger than the cache is read
    /// through it). Returns false if they were not stored because even that left no room, the disk being full
    /// ([`disk_full`](Entry::disk_full) says so) or the entry removed: the caller serves them from memory. `Err(Mismatch)` when they complete the entry and the whole does not make the root: then
    /// nothing of the entry is kept.
    pub fn insert(&self, offset: u64, bytes: &[u8]) -> Result<bool, CacheError> {
        self.insert_groups(offset, bytes, None)
    }

    /// [`insert`](Entry::insert) of bytes whose group values the caller has from verifying them (the share
    /// client's [`verify_piece_cvs`](ferry_share::tree::verify_piece_cvs): one value per group of `bytes`,
    /// in order), so they are not hashed again. Like [`insert`](Entry::insert) it trusts its caller per
    /// group; a value that does not belong to its bytes makes that group fail its next check (a restart,
    /// a change on disk) and the entry fail its root when complete. `Err(Range)` when there is not one
    /// value per group.
    pub fn insert_verified(
        &self,
        offset: u64,
        bytes: &[u8],
        cvs: &[[u8; 32]],
    ) -> Result<bool, CacheError> {
        if cvs.len() as u64 != (bytes.len() as u64).div_ceil(GROUP) {
            return Err(CacheError::Range);
        }
        self.insert_groups(offset, bytes, Some(cvs))
    }

    fn insert_groups(
        &self,
        offset: u64,
        bytes: &[u8],
        verified: Option<&[Cv]>,
    ) -> Result<bool, CacheError> {
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
        let hashed: Vec<Cv>;
        let cvs = match verified {
            Some(cvs) => cvs,
            None => {
                hashed = bytes
                    .chunks(GROUP as usize)
                    .zip(groups.clone())
                    .map(|(b, g)| group_cv(size, g, b))
                    .collect();
                &hashed
            }
        };
        // A disk that fills up bounds the cache to what it holds ([`Shared::full`]); the bytes are tried
        // once more within that bound (the room made evicting or shedding is freed on the disk too).
        let mut tried_full = false;
        let stored = loop {
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
            if !self.shared.reserve(&self.inner, need)
                && (need > self.shared.bound()
                    || self.shed(need, groups.clone())? == 0
                    || !self.shared.reserve(&self.inner, need))
            {
                return Ok(false);
            }
            let stored = self.store(groups.clone(), offset, bytes, cvs);
            let (added, dropped) = match &stored {
                Ok(Some(s)) => (s.added, s.dropped),
                Ok(None) | Err(_) => (0, 0),
            };
            // Groups dropped by a check of another thread since `need` was counted can make `added` larger.
            self.shared.account(&self.inner, added, need + dropped);
            match stored {
                Err(CacheError::Io(e)) if is_disk_full(&e) => {
                    self.shared.full(&e);
                    if tried_full {
                        return Ok(false);
                    }
                    tried_full = true;
                }
                stored => break stored,
            }
        };
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
            Some(Stored { mismatch: true, .. }) => {
                self.record_unless_full()?;
                Err(CacheError::Mismatch)
            }
            Some(_) => {
                if complete || dirty >= FLUSH_BYTES.max(present / 4) || since >= FLUSH_AFTER {
                    self.record_unless_full()?;
                }
                Ok(true)
            }
        }
    }

    /// Writes the entry's record; a disk too full for it bounds the cache ([`Shared::full`]) and leaves
    /// the record to a later write (the bytes are stored: only a restart before then forgets them).
    fn record_unless_full(&self) -> Result<(), CacheError> {
        match self.inner.write_record() {
            Err(CacheError::Io(e)) if is_disk_full(&e) => {
                self.shared.full(&e);
                Ok(())
            }
            r => r,
        }
    }

    /// Why the cache cannot hold more now: the disk refused a write for want of space within the last
    /// [`ROOM_RETRY`](crate::ROOM_RETRY) ([`Cache::disk_full`](crate::Cache::disk_full)).
    pub fn disk_full(&self) -> Option<String> {
        self.shared.disk_full()
    }

    /// Makes room in this entry itself when every other entry is pinned (a file larger than the cache, read
    /// through): drops at least `need` bytes ([`SHED_BATCH`] at once, so a sequential reader sheds
    /// rarely) of its present groups outside `keep`, lowest first — behind a reader going forward — and
    /// frees their blocks. Returns the bytes dropped.
    fn shed(&self, need: u64, keep: Range<u64>) -> Result<u64, CacheError> {
        let size = self.inner.version.size;
        // A bound cut by a full disk may be smaller than a batch: a quarter of it then, not all of it.
        let want = need.max(SHED_BATCH.min(self.shared.bound() / 4));
        let mut st = write(&self.inner.state);
        if st.removed {
            return Ok(0);
        }
        // A change on disk since the last check is found before this change hides it.
        let mut dropped = 0;
        if st.seen.is_none() || st.seen != Stamp::at(&self.inner.data_path) {
            dropped = self.inner.revalidate(&mut st)?;
        }
        let mut cut: Vec<Range<u64>> = Vec::new();
        let mut freed = 0;
        for (first, cvs) in st.groups.runs() {
            let end = first + cvs.len() as u64;
            for part in [first..end.min(keep.start), first.max(keep.end)..end] {
                let mut g = part.start;
                while g < part.end && freed < want {
                    freed += span(size, g..g + 1);
                    g += 1;
                }
                if g > part.start {
                    cut.push(part.start..g);
                }
            }
            if freed >= want {
                break;
            }
        }
        if freed == 0 {
            drop(st);
            self.shared.release(&self.inner, dropped);
            return Ok(dropped);
        }
        st.groups.retain(|g, _| !cut.iter().any(|r| r.contains(&g)));
        if let Some(file) = &st.file {
            for r in &cut {
                punch(file, size, r.clone())?;
            }
        }
        st.complete = false;
        st.changed = true;
        st.dirty += freed;
        // The holes are this process's own change: not a reason to hash the rest again.
        st.seen = Stamp::at(&self.inner.data_path);
        drop(st);
        self.shared.release(&self.inner, freed + dropped);
        Ok(freed + dropped)
    }

    /// Writes the groups of `groups` not present yet (`None` when the entry was removed).
    fn store(
        &self,
        groups: Range<u64>,
        offset: u64,
        bytes: &[u8],
        cvs: &[Cv],
    ) -> Result<Option<Stored>, CacheError> {
        let inner = &self.inner;
        let size = inner.version.size;
        let mut st = write(&inner.state);
        if st.removed {
            return Ok(None);
        }
        // A change on disk since the caller's check is found before this write's own change hides it.
        let mut dropped = 0;
        if st.seen.is_none() || st.seen != Stamp::at(&inner.data_path) {
            dropped = inner.revalidate(&mut st)?;
        }
        let file = st.file.as_ref().ok_or(CacheError::Missing)?;
        let gaps = st.groups.gaps(groups.clone());
        for gap in &gaps {
            let from = (gap.start * GROUP - offset) as usize;
            let to = (span(size, 0..gap.end) - offset) as usize;
            if let Err(e) = file.write_all_at(&bytes[from..to], gap.start * GROUP) {
                // What was written of the gaps is recorded nowhere: its blocks are given back (a full
                // disk gets them back), and the holes, this process's own change, are no reason to hash
                // the rest again.
                for gap in &gaps {
                    let _ = punch(file, size, gap.clone());
                }
                st.seen = Stamp::at(&inner.data_path);
                return Err(e.into());
            }
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
                dropped += present_bytes(&inner.version, &st.groups);
                inner.clear(&mut st)?;
                st.seen = Stamp::at(&inner.data_path);
                return Ok(Some(Stored {
                    added,
                    dropped,
                    mismatch: true,
                }));
            }
        }
        Ok(Some(Stored {
            added,
            dropped,
            mismatch: false,
        }))
    }

    /// Takes the file at `from` as the version's whole content without copying it (a file written
    /// elsewhere, such as a mount's working copy once pushed): hashed group by group, then renamed into the
    /// cache only if it makes the root. `from` must be on the cache's file system and no longer written.
    /// `Ok(false)`, with `from` left where it is, when it is not the version, when the entry is complete
    /// already or was removed, when the cache has no room for it, or when it is on another file system.
    pub fn adopt(&self, from: &Path) -> Result<bool, CacheError> {
        let inner = &self.inner;
        let size = inner.version.size;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(from)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() != size {
            return Ok(false);
        }
        let Some(cvs) = hash_groups(&file, size)? else {
            return Ok(false);
        };
        if !combines_to_root(&inner.version, &cvs) {
            return Ok(false);
        }
        self.take(from, &meta, &cvs, false)
    }

    /// `next` is this version with `tail` appended (a file grown on the sharer). When this entry is complete
    /// and its bytes followed by `tail` make `next`'s root, its cache file, with `tail` written past its end,
    /// becomes `next`'s: the same file, so a descriptor open on it (FUSE passthrough's backing file) reads
    /// `next` from then on. This entry is removed then. Only `tail` and this version's last group are
    /// hashed: the whole groups before them have the same values in both versions. `Ok(false)`, both
    /// entries as they were, otherwise (not an append, no room).
    pub fn extend(&self, next: &Entry, tail: &[u8]) -> Result<bool, CacheError> {
        let (old, new) = (self.inner.version, next.inner.version);
        if tail.is_empty() || new.size != old.size + tail.len() as u64 {
            return Ok(false);
        }
        self.check()?;
        let (file, cvs) = {
            let st = read(&self.inner.state);
            let (Some(file), Some(all), false) = (
                &st.file,
                st.groups.whole(group_count(old.size)),
                st.removed || !st.complete,
            ) else {
                return Ok(false);
            };
            // A version of one group has its root as that group's value, not a chaining value.
            let kept = if old.size > GROUP {
                old.size / GROUP
            } else {
                0
            };
            let mut cvs = all[..kept as usize].to_vec();
            let mut bytes = vec![0; (old.size - kept * GROUP) as usize];
            if read_full(file, &mut bytes, kept * GROUP)? < bytes.len() {
                return Ok(false);
            }
            bytes.extend_from_slice(tail);
            for (i, group) in bytes.chunks(GROUP as usize).enumerate() {
                cvs.push(group_cv(new.size, kept + i as u64, group));
            }
            (file.try_clone()?, cvs)
        };
        if !combines_to_root(&new, &cvs) {
            return Ok(false);
        }
        // Readers of the file see this version, then this version and part of the verified tail: `next`.
        file.write_all_at(tail, old.size)?;
        // A small file's tail may have made `next` whole already: its file is replaced (same bytes).
        let taken = next.take(&self.inner.data_path, &file.metadata()?, &cvs, true);
        if !matches!(taken, Ok(true)) {
            // Back to this version (hashed again at its next use: the file changed since it was seen).
            let _ = file.set_len(old.size);
            return taken;
        }
        let sh = &self.shared;
        let mut idx = lock(&sh.index);
        if idx.slots.get(&old).map(|s| s.id) == Some(self.inner.id) {
            sh.evict(&mut idx, &old);
        }
        Ok(true)
    }

    /// Takes the file at `from` (`meta` its metadata when hashed), whose groups have the values `cvs`
    /// making this version's root, as the version's whole content: renamed into the cache, also over a
    /// complete entry's file when `replace`.
    fn take(
        &self,
        from: &Path,
        meta: &fs::Metadata,
        cvs: &[Cv],
        replace: bool,
    ) -> Result<bool, CacheError> {
        let inner = &self.inner;
        let size = inner.version.size;
        let need = {
            let st = read(&inner.state);
            if st.removed || (st.complete && !replace) {
                return Ok(false);
            }
            size - present_bytes(&inner.version, &st.groups)
        };
        self.touch();
        if !self.shared.reserve(inner, need) {
            return Ok(false);
        }
        let mut st = write(&inner.state);
        let present = present_bytes(&inner.version, &st.groups);
        let moved = match (
            st.removed || (st.complete && !replace),
            fs::rename(from, &inner.data_path),
        ) {
            (true, _) => Ok(false),
            (false, Ok(())) => Ok(true),
            (false, Err(e)) if e.raw_os_error() == Some(libc::EXDEV) => Ok(false),
            (false, Err(e)) => Err(e),
        };
        if !matches!(moved, Ok(true)) {
            drop(st);
            self.shared.release(inner, need);
            return moved.map_err(CacheError::from);
        }
        // From here the file at the data path is the adopted one, whatever else happens.
        let _ = fs::set_permissions(&inner.data_path, fs::Permissions::from_mode(0o600));
        st.file = None;
        st.groups.clear();
        st.groups.insert(0, cvs);
        st.complete = true;
        st.changed = true;
        st.dirty += size - present;
        let opened = open_data(&inner.data_path, size);
        let same = |f: &File| {
            f.metadata()
                .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
        };
        // A file other than the one hashed at the path (swapped meanwhile) is checked before any use.
        st.seen = match &opened {
            Ok(f) if same(f) => Stamp::at(&inner.data_path),
            _ => None,
        };
        st.file = opened.ok();
        drop(st);
        // `need` was reserved when fewer or more groups were present than now: the count made exact.
        let added = size - present;
        self.shared.account(
            inner,
            added.saturating_sub(need),
            need.saturating_sub(added),
        );
        let _ = inner.write_record();
        Ok(true)
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
