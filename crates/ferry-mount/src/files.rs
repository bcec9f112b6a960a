//! The read path: open files pinned to one version, reads served from the chunk store, misses fetched from
//! the sharer with several reads in flight, sequential access streamed ahead, one fetch per range however
//! many readers wait for it.
//!
//! An open learns the file's current version (a zero-length read: one round trip) and pins that version's
//! [`Chunks`]; every read then copies from the store once its range is present. A missing range is claimed
//! in the file's in-flight list by the first reader that needs it and fetched by that reader, split into
//! [`ReadConfig::piece`]-sized reads of which [`ReadConfig::window`] are in flight at once; other readers of
//! that range wait, each woken by the pieces of its own range.
//!
//! A read that follows the previous one moves the file's stream on to [`ReadConfig::ahead`] bytes past it;
//! one streamer thread per file keeps the requests of the stream in flight by itself, whatever the
//! reader's pace (a reader of a file opened with direct I/O has one read in flight and no kernel readahead):
//! an answer is held in memory and its readers woken at once, the next request goes out, and a thread of its
//! own writes the cache file and settles the claim. Readers are answered from the held
//! pieces before the store is asked (its lock is taken by the cache write).
//!
//! A file that changed on the sharer fails its fetch with [`SourceError::Changed`]: the handle opens the
//! new version and the read starts over there, so no read mixes versions. A change notification marks open
//! files stale (the next read learns the version again) and stops their streaming.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, Weak};

use ferry_share::bytes::Bytes;
use ferry_share::tree::{GroupCv, Version, GROUP};
use ferry_share::wire::SharePath;

use crate::source::{Piece, Pieces, Source, SourceError};
use crate::store::{Chunks, Kept, Store, StoreError, Unkept};

/// The open files by path and version root (weak: they live as long as their handles).
type OpenFiles = HashMap<(SharePath, [u8; 32]), Weak<OpenFile>>;

/// How reads go to the sharer.
#[derive(Debug, Clone, Copy)]
pub struct ReadConfig {
    /// Bytes per read request.
    pub piece: u64,
    /// Read requests one fetch (or a file's streamer) keeps in flight.
    pub window: usize,
    /// How far past a sequential reader the stream runs.
    pub ahead: u64,
    /// Read requests all fetches together keep in flight (below the share client's limit, so that stats
    /// and listings always find room).
    pub max_in_flight: u32,
    /// Bytes of fetched pieces all files together keep in memory after storing them, so that the reads
    /// that wait for them are answered without reading the cache file back.
    pub hold: u64,
    /// Bytes from the start of a file asked for with its version when a path is opened the first time
    /// (the round trip that learns the version brings a small file whole, so its first read waits for
    /// nothing); 0: the version only.
    pub first: u64,
}

impl Default for ReadConfig {
    /// A sequential reader's stream keeps 16 requests of 1 MiB in flight up to 32 MiB past it. With 8 up
    /// to 16 MiB, several of the requests in flight were answers already in the sockets' buffers, and the
    /// sharer's one serving thread waited for the next request about 400 times per GiB read: the mount's
    /// path kept 1.71-1.75 cores busy to pull's 1.81-1.89, and read 2.5-9.5 % slower (BENCHMARKS.md, session
    /// 30).
    fn default() -> Self {
        ReadConfig {
            piece: 1 << 20,
            window: 16,
            ahead: 32 << 20,
            max_in_flight: 192,
            hold: 24 << 20,
            first: 64 << 10,
        }
    }
}

/// Counters for the stats line.
#[derive(Debug, Default)]
pub struct Stats {
    /// Read requests that reached the daemon.
    pub reads: AtomicU64,
    /// Bytes answered from the store without waiting for the sharer.
    pub from_cache: AtomicU64,
    /// Bytes fetched from the sharer.
    pub from_peer: AtomicU64,
    /// Opens handed to the kernel with passthrough.
    pub passthrough_opens: AtomicU64,
    /// Opens answered classically (reads come to the daemon).
    pub classic_opens: AtomicU64,
    /// Of those, opens of files not whole in the cache answered with direct I/O.
    pub direct_io_opens: AtomicU64,
    /// Bytes fetched that the store had no room for (answered from memory only).
    pub not_stored: AtomicU64,
}

impl Stats {
    /// The stats as one line.
    pub fn line(&self) -> String {
        format!(
            "reads {} from-cache {} from-peer {} not-stored {} passthrough-opens {} classic-opens {} \
             direct-io-opens {}",
            self.reads.load(Ordering::Relaxed),
            self.from_cache.load(Ordering::Relaxed),
            self.from_peer.load(Ordering::Relaxed),
            self.not_stored.load(Ordering::Relaxed),
            self.passthrough_opens.load(Ordering::Relaxed),
            self.classic_opens.load(Ordering::Relaxed),
            self.direct_io_opens.load(Ordering::Relaxed),
        )
    }
}

/// A failed read: the errno for the kernel and what happened.
pub type ReadError = SourceError;

/// The bytes a read answers: part of a fetched piece still held in memory (not copied), or a buffer of
/// their own.
#[derive(Debug, Clone)]
pub struct ReadBytes {
    buf: Arc<Bytes>,
    range: Range<usize>,
}

impl ReadBytes {
    fn own(buf: Vec<u8>) -> ReadBytes {
        let range = 0..buf.len();
        ReadBytes {
            buf: Arc::new(buf.into()),
            range,
        }
    }
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }
}

impl PartialEq<&[u8]> for ReadBytes {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

/// Verified pieces of one file version kept in memory after they were stored (by offset), within a byte
/// budget shared by all files.
#[derive(Debug)]
struct Held {
    pieces: Mutex<BTreeMap<u64, Arc<Bytes>>>,
    budget: Arc<Budget>,
    /// The longest piece ever held: how far before a byte the piece holding it may start.
    longest: AtomicU64,
}

#[derive(Debug)]
struct Budget {
    used: AtomicU64,
    limit: u64,
}

impl Held {
    fn pieces(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Bytes>>> {
        self.pieces.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Of `pieces` (this file's, locked), the one that holds byte `at` and reaches furthest. Pieces may
    /// overlap: a range fetched again after the store dropped it may be cut otherwise than before.
    fn holding<'a>(
        &self,
        pieces: &'a BTreeMap<u64, Arc<Bytes>>,
        at: u64,
    ) -> Option<(u64, &'a Arc<Bytes>)> {
        let longest = self.longest.load(Ordering::Relaxed);
        pieces
            .range(at.saturating_sub(longest)..=at)
            .filter(|(o, p)| **o + p.len() as u64 > at)
            .max_by_key(|(o, p)| **o + p.len() as u64)
            .map(|(o, p)| (*o, p))
    }

    /// Keeps `bytes` (at `offset`) if the budget has room, after dropping the pieces that end at or before
    /// `behind` (a sequential reader is past them); returns whether it was kept.
    fn keep(&self, offset: u64, bytes: Arc<Bytes>, behind: u64) -> bool {
        let n = bytes.len() as u64;
        let mut pieces = self.pieces();
        let b = &self.budget;
        if b.used.load(Ordering::Relaxed) + n > b.limit {
            while let Some(e) = pieces.first_entry() {
                if *e.key() + e.get().len() as u64 > behind {
                    break;
                }
                b.used.fetch_sub(e.remove().len() as u64, Ordering::Relaxed);
            }
            if b.used.load(Ordering::Relaxed) + n > b.limit {
                return false;
            }
        }
        b.used.fetch_add(n, Ordering::Relaxed);
        self.longest.fetch_max(n, Ordering::Relaxed);
        if let Some(old) = pieces.insert(offset, bytes) {
            b.used.fetch_sub(old.len() as u64, Ordering::Relaxed);
        }
        true
    }

    /// Whether the pieces held hold all of `want`.
    fn covers(&self, want: &Range<u64>) -> bool {
        let pieces = self.pieces();
        let mut at = want.start;
        let Some((first, _)) = self.holding(&pieces, at) else {
            return false;
        };
        for (&o, p) in pieces.range(first..want.end) {
            if o > at {
                return false;
            }
            at = at.max(o + p.len() as u64);
            if at >= want.end {
                return true;
            }
        }
        false
    }

    /// `want` from the pieces held, if they hold all of it: a part of one piece, or a copy of the
    /// neighbouring pieces it spans. A piece whose end the read reaches is dropped (read to its end).
    fn take(&self, want: &Range<u64>) -> Option<ReadBytes> {
        let mut pieces = self.pieces();
        let (first, piece) = self.holding(&pieces, want.start)?;
        let out = if want.end <= first + piece.len() as u64 {
            ReadBytes {
                buf: Arc::clone(piece),
                range: (want.start - first) as usize..(want.end - first) as usize,
            }
        } else {
            let mut buf = Vec::with_capacity((want.end - want.start) as usize);
            let mut at = want.start;
            for (&o, p) in pieces.range(first..want.end) {
                // Pieces may overlap (fetched again, cut otherwise, after the store dropped them): one
                // that ends where the copy is already is passed over.
                if o + p.len() as u64 <= at {
                    continue;
                }
                if o > at {
                    return None;
                }
                let to = want.end.min(o + p.len() as u64);
                buf.extend_from_slice(&p[(at - o) as usize..(to - o) as usize]);
                at = to;
            }
            if at != want.end {
                return None;
            }
            ReadBytes::own(buf)
        };
        let read_to_end: Vec<u64> = pieces
            .range(first..want.end)
            .filter(|(o, p)| **o + p.len() as u64 <= want.end)
            .map(|(o, _)| *o)
            .collect();
        for o in read_to_end {
            if let Some(p) = pieces.remove(&o) {
                self.budget
                    .used
                    .fetch_sub(p.len() as u64, Ordering::Relaxed);
            }
        }
        Some(out)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let n: u64 = self.pieces().values().map(|p| p.len() as u64).sum();
        self.budget.used.fetch_sub(n, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct FileState {
    /// Ranges claimed by a fetch.
    in_flight: Vec<Range<u64>>,
    /// Fetches that failed so far, and the last failure: a waiter whose range failed hears of it.
    failures: u64,
    last_failure: Option<SourceError>,
    /// Where the last read ended: a read starting there is sequential.
    next_sequential: u64,
    /// How far a sequential reader wants the file streamed.
    ahead_until: u64,
    /// Where the streamer asks next.
    stream_next: u64,
    /// A streamer runs for this file.
    streaming: bool,
    /// Readers waiting for a range, each woken only by a piece inside its range (or by a fetch that
    /// ended): a piece wakes one reader, not every reader of the file.
    waiting: Vec<(Range<u64>, Arc<Condvar>)>,
}

/// One version of one file, shared by all handles open on it.
pub struct OpenFile {
    path: SharePath,
    chunks: Arc<dyn Chunks>,
    state: Mutex<FileState>,
    /// The path changed on the sharer: streaming stops and the next read learns the version again.
    stale: AtomicBool,
    held: Held,
    /// The streamer waits here for the reader to move the stream on.
    more: Condvar,
}

impl OpenFile {
    /// The version this file is pinned to.
    pub fn version(&self) -> Version {
        self.chunks.version()
    }

    /// The stored bytes.
    pub fn chunks(&self) -> &Arc<dyn Chunks> {
        &self.chunks
    }

    fn state(&self) -> MutexGuard<'_, FileState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fetch of the claimed `mine` ended with `result`: the claim goes, a failure is recorded for the
    /// readers that waited for it, and they wake.
    fn settle(&self, mine: &[Range<u64>], result: Result<(), SourceError>) {
        let mut st = self.state();
        for m in mine {
            if let Some(i) = st.in_flight.iter().position(|r| r == m) {
                st.in_flight.swap_remove(i);
            }
        }
        if let Err(e) = result {
            st.failures += 1;
            st.last_failure = Some(e);
        }
        for (_, cv) in &st.waiting {
            cv.notify_one();
        }
    }

    /// Bytes `range` arrived: the readers waiting for any of them check again.
    fn arrived(&self, range: Range<u64>) {
        let st = self.state();
        for (r, cv) in &st.waiting {
            if r.start < range.end && range.start < r.end {
                cv.notify_one();
            }
        }
    }
}

/// An open file handle: the version it reads, switched when the file changes.
pub struct Handle {
    path: SharePath,
    file: Mutex<Arc<OpenFile>>,
}

impl Handle {
    fn new(path: &SharePath, file: Arc<OpenFile>) -> Handle {
        Handle {
            path: path.clone(),
            file: Mutex::new(file),
        }
    }

    /// The path it was opened at.
    pub fn path(&self) -> &SharePath {
        &self.path
    }

    /// The file version this handle reads now.
    pub fn file(&self) -> Arc<OpenFile> {
        Arc::clone(&self.file.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn switch(&self, file: Arc<OpenFile>) {
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = file;
    }
}

/// Opens and reads files of one share.
pub struct Reader<S: Source> {
    source: Arc<S>,
    store: Arc<dyn Store>,
    config: ReadConfig,
    stats: Arc<Stats>,
    open: Mutex<OpenFiles>,
    /// Read requests in flight, all fetches together.
    slots: Slots,
    /// Bytes of pieces held by all files.
    held: Arc<Budget>,
    /// Why the store was first short of room for fetched bytes.
    no_room: std::sync::OnceLock<String>,
    /// `no_room` is set and the mount has not said it yet (read on every read).
    no_room_untold: AtomicBool,
}

/// A streamer's requests in flight, oldest first: the slot each holds, its pieces, the range it claimed.
type InFlight<'a> = VecDeque<(Slot<'a>, Box<dyn Pieces>, Range<u64>)>;

/// The pieces of one answered request of a stream on their way to the store, and the claim they settle
/// once stored.
type Written = (Range<u64>, Vec<(u64, Arc<Bytes>, Vec<GroupCv>)>);

/// Stream pieces (of up to 1 MiB) waiting to be written to the store before the streamer waits for the
/// writer: what falls behind is bounded in memory.
const WRITE_QUEUE: usize = 8;

/// How long a streamer with nothing to fetch waits for its reader to move on before it ends.
const LINGER: std::time::Duration = std::time::Duration::from_millis(500);
/// Chances a read has at a file that changed under it ([`Reader::read`]), however long they take.
const CHANCES: u32 = 4;
/// More chances are taken while the read is younger than this,
const PERSIST: std::time::Duration = std::time::Duration::from_secs(2);
/// up to this many.
const MOST_CHANCES: u32 = 64;

/// A counting semaphore for read requests in flight. A fetch that holds requests and finds no free slot
/// drains what it holds instead of waiting, so fetches never wait for each other in a circle.
struct Slots {
    free: Mutex<u32>,
    freed: Condvar,
}

impl Slots {
    fn take(&self, wait: bool) -> bool {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            if !wait {
                return false;
            }
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        true
    }

    fn give(&self) {
        *self.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.freed.notify_one();
    }
}

/// A taken slot, given back when dropped.
struct Slot<'a>(&'a Slots);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.give();
    }
}

impl<S: Source> Reader<S> {
    /// Reads from `source` through `store`.
    pub fn new(
        source: Arc<S>,
        store: Arc<dyn Store>,
        config: ReadConfig,
        stats: Arc<Stats>,
    ) -> Arc<Reader<S>> {
        Arc::new(Reader {
            source,
            store,
            config,
            stats,
            open: Mutex::new(HashMap::new()),
            slots: Slots {
                free: Mutex::new(config.max_in_flight.max(1)),
                freed: Condvar::new(),
            },
            held: Arc::new(Budget {
                used: AtomicU64::new(0),
                limit: config.hold,
            }),
            no_room: std::sync::OnceLock::new(),
            no_room_untold: AtomicBool::new(false),
        })
    }

    /// What the mount should say once, if anything: the store was short of room for fetched bytes (a full
    /// disk), so it keeps less than asked, or none of them (reads go on from memory), and what is read
    /// again is fetched again.
    pub fn take_notice(&self) -> Option<String> {
        if !self.no_room_untold.swap(false, Ordering::Relaxed) {
            return None;
        }
        let why = self.no_room.get()?;
        Some(format!(
            "{why}: reads go on; what the cache cannot keep is fetched again when read again"
        ))
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Opens `path` at its current version; offline, at `known` (the version last opened there) if given.
    pub fn open(&self, path: &SharePath, known: Option<Version>) -> Result<Handle, ReadError> {
        Ok(Handle::new(path, self.current(path, known)?))
    }

    /// [`Reader::open`] for a caller that needs the version only (a file about to be truncated): none of
    /// its content is asked for with it.
    pub fn open_version(
        &self,
        path: &SharePath,
        known: Option<Version>,
    ) -> Result<Handle, ReadError> {
        Ok(Handle::new(path, self.current_with(path, known, 0..0)?))
    }

    /// [`Reader::open`] for a caller about to read the file whole from one version (a working copy loading
    /// it): its first [`ReadConfig::first`] bytes come with the version, known or not, so a small file that
    /// another peer changes all the time still loads from the one answer that names its version.
    pub fn open_whole(
        &self,
        path: &SharePath,
        known: Option<Version>,
    ) -> Result<Handle, ReadError> {
        let first = 0..self.config.first;
        Ok(Handle::new(path, self.current_with(path, known, first)?))
    }

    /// Opens `path` at `version` (the version the kernel's other handles of it read).
    pub fn open_at(&self, path: &SharePath, version: Version) -> Result<Handle, ReadError> {
        Ok(Handle::new(path, self.file_of(path, version)))
    }

    /// The open file of `path` at its current version (learned with a zero-length read), or at `known`
    /// when the sharer cannot be reached.
    ///
    /// A path opened the first time (no `known` version) asks for its first [`ReadConfig::first`] bytes with
    /// the version, and stores them: the first read of a small file then finds it whole.
    fn current(
        &self,
        path: &SharePath,
        known: Option<Version>,
    ) -> Result<Arc<OpenFile>, ReadError> {
        let first = if known.is_none() {
            self.config.first
        } else {
            0
        };
        self.current_with(path, known, 0..first)
    }

    /// [`Reader::current`] asking for the bytes of `range` with the version, in the one answer.
    fn current_with(
        &self,
        path: &SharePath,
        known: Option<Version>,
        range: Range<u64>,
    ) -> Result<Arc<OpenFile>, ReadError> {
        let (version, rest) = match self.learn_version(path, range) {
            Ok(v) => v,
            Err(SourceError::Offline(why)) => (known.ok_or(SourceError::Offline(why))?, None),
            Err(e) => return Err(e),
        };
        let file = self.file_of(path, version);
        if let Some(mut rest) = rest {
            // The open's own bytes: stored if they arrive; if not, the reads fetch them as any miss.
            while let Ok(Some(Piece::Data { offset, bytes, cvs })) = rest.next_piece() {
                if self.store_piece(&file, offset, bytes, &cvs, None).is_err() {
                    break;
                }
            }
        }
        Ok(file)
    }

    /// The current version of `path`, and the rest of the read that learned it when the bytes of `range`
    /// were asked for too.
    fn learn_version(
        &self,
        path: &SharePath,
        range: Range<u64>,
    ) -> Result<(Version, Option<Box<dyn Pieces>>), SourceError> {
        let len = range.end.saturating_sub(range.start);
        let mut pieces = self.source.read(path, None, range.start, len)?;
        match pieces.next_piece()? {
            Some(Piece::Version(v)) => Ok((v, (len > 0 && range.start < v.size).then_some(pieces))),
            _ => Err(SourceError::Failed {
                errno: libc::EIO,
                message: "the sharer answered a read without its version".into(),
            }),
        }
    }

    fn file_of(&self, path: &SharePath, version: Version) -> Arc<OpenFile> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let key = (path.clone(), version.root);
        if let Some(f) = open.get(&key).and_then(Weak::upgrade) {
            f.stale.store(false, Ordering::Relaxed);
            return f;
        }
        // A store that cannot make the version an entry (no room for another file on its disk, a cache
        // directory gone read-only) does not fail the read: the version is read keeping nothing, said once
        // as a full disk is.
        let chunks = self.store.entry(version).unwrap_or_else(|e| {
            Arc::new(Unkept::new(
                version,
                format!("the cache cannot keep files ({e})"),
            ))
        });
        let f = Arc::new(OpenFile {
            path: path.clone(),
            chunks,
            state: Mutex::new(FileState::default()),
            stale: AtomicBool::new(false),
            held: Held {
                pieces: Mutex::new(BTreeMap::new()),
                budget: Arc::clone(&self.held),
                longest: AtomicU64::new(0),
            },
            more: Condvar::new(),
        });
        open.retain(|_, w| w.strong_count() > 0);
        open.insert(key, Arc::downgrade(&f));
        f
    }

    /// `path`, open at `old`, is now `new`: `old`'s bytes and then `tail` (read through this reader, so
    /// verified). When they make `new`, its store entry takes `old`'s file (see [`Store::extend`]).
    pub fn extend(&self, old: Version, new: Version, tail: &[u8]) -> Result<bool, StoreError> {
        self.store.extend(old, new, tail)
    }

    /// `path` (or something under it) changed on the sharer: its open files go stale, streaming stops.
    pub fn changed(&self, path: &SharePath) {
        let prefix = path.as_bytes();
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for ((p, _), f) in open.iter() {
            let p = p.as_bytes();
            let inside = path.is_root()
                || p == prefix
                || (p.starts_with(prefix) && p.get(prefix.len()) == Some(&b'/'));
            if let Some(f) = inside.then(|| f.upgrade()).flatten() {
                f.stale.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Reads up to `size` bytes at `offset` through `handle`: all from one version, cut at its end.
    pub fn read(
        self: &Arc<Self>,
        handle: &Handle,
        offset: u64,
        size: u32,
    ) -> Result<ReadBytes, ReadError> {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        // A file that changed again and again is given chances ([`CHANCES`], more while the read is younger
        // than [`PERSIST`]: an answer can be cut by a change too, and on a busy machine a log appended every
        // few milliseconds cuts several in a row), then the read fails. Each chance asks
        // for the read's own bytes with the new version: a file that changes all the time is read from the
        // one answer that names its version. Only a handle stale when the read begins moves on to the
        // current version first: a version learned for a chance is read even if the sharer announces a
        // newer one meanwhile (its bytes came with it).
        let mut file = handle.file();
        if file.stale.load(Ordering::Relaxed) {
            file = self.current(&handle.path, Some(file.version()))?;
            handle.switch(Arc::clone(&file));
        }
        let began = std::time::Instant::now();
        let mut chances = 0;
        loop {
            match self.read_file(&file, offset, size) {
                Err(SourceError::Changed)
                    if chances < MOST_CHANCES
                        && (chances < CHANCES || began.elapsed() < PERSIST) =>
                {
                    chances += 1;
                    // In whole groups, as the store takes them (the sharer cuts the last at the file's
                    // end): bytes cut anywhere else would be refused by the store, then fetched again with
                    // the new version, which has changed again by then.
                    let start = offset / GROUP * GROUP;
                    let end = offset
                        .saturating_add(u64::from(size))
                        .div_ceil(GROUP)
                        .saturating_mul(GROUP);
                    file = self.current_with(&handle.path, None, start..end)?;
                    handle.switch(Arc::clone(&file));
                }
                Err(SourceError::Changed) => {
                    return Err(SourceError::Failed {
                        errno: libc::EIO,
                        message: "the file kept changing on the sharer while it was read".into(),
                    })
                }
                r => return r,
            }
        }
    }

    /// Reads up to `size` bytes at `offset` of the version `handle` is open at, and of no other:
    /// [`SourceError::Changed`] when the sharer no longer has it (its caller opens the file again, where
    /// [`Reader::read`] moves on by itself).
    pub fn read_version(
        self: &Arc<Self>,
        handle: &Handle,
        offset: u64,
        size: u32,
    ) -> Result<ReadBytes, ReadError> {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.read_file(&handle.file(), offset, size)
    }

    fn read_file(
        self: &Arc<Self>,
        file: &Arc<OpenFile>,
        offset: u64,
        size: u32,
    ) -> Result<ReadBytes, ReadError> {
        let len = file.version().size;
        let end = offset.saturating_add(u64::from(size)).min(len);
        if offset >= end {
            return Ok(ReadBytes::own(Vec::new()));
        }
        let want = offset..end;
        self.stream_if_sequential(file, &want);
        // Answered from the pieces fetched for it while they are held, before the store is asked: the
        // store's lock is taken by the cache write of the piece the reader waits for, and the reply need not
        // wait for that write (the piece is verified: it is held from the moment it is).
        if let Some(bytes) = file.held.take(&want) {
            self.stats
                .from_cache
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            return Ok(bytes);
        }
        let mut kept = Mine::new();
        let mut fetched = false;
        let mut buf = Vec::new();
        // A store that loses bytes between the check and the copy (evicted, or found altered) is
        // filled again once.
        for attempt in 0..2 {
            fetched |= self.ensure(file, want.clone(), &mut kept)?;
            // Answered from the pieces fetched for it while they are held: the cache file is not read
            // back. `ensure` returns once they are held, and the streamer's store thread writes them
            // after that: the store may not have them yet.
            if let Some(bytes) = file.held.take(&want) {
                if !fetched {
                    self.stats
                        .from_cache
                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                return Ok(bytes);
            }
            buf.resize((end - offset) as usize, 0);
            match fill(&file.chunks, &kept, &mut buf, offset) {
                Ok(n) if n == buf.len() => break,
                Ok(_) | Err(_) if attempt == 0 => continue,
                Ok(n) => {
                    return Err(SourceError::Failed {
                        errno: libc::EIO,
                        message: format!("cache returned {n} of {} bytes", buf.len()),
                    })
                }
                Err(e) => {
                    return Err(SourceError::Failed {
                        errno: libc::EIO,
                        message: e.to_string(),
                    })
                }
            }
        }
        if !fetched {
            self.stats
                .from_cache
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
        }
        Ok(ReadBytes::own(buf))
    }

    /// A read starting where the last one ended moves the file's stream on to [`ReadConfig::ahead`] past
    /// it, starting the file's streamer if none runs.
    fn stream_if_sequential(self: &Arc<Self>, file: &Arc<OpenFile>, want: &Range<u64>) {
        let size = file.version().size;
        {
            let mut st = file.state();
            let sequential = want.start == st.next_sequential && want.start > 0;
            st.next_sequential = want.end;
            if !sequential || file.stale.load(Ordering::Relaxed) {
                return;
            }
            // Whole pieces: the sharer gets fewer, larger requests.
            let target = want
                .end
                .saturating_add(self.config.ahead)
                .div_ceil(self.config.piece)
                .saturating_mul(self.config.piece)
                .min(size);
            if target <= st.ahead_until {
                return;
            }
            st.ahead_until = target;
            // A reader that jumped ahead is streamed from where it reads, not from where it was.
            st.stream_next = st.stream_next.max(want.end);
            if st.streaming {
                file.more.notify_one();
                return;
            }
            st.streaming = true;
        }
        let reader = Arc::clone(self);
        let stream_file = Arc::clone(file);
        let spawned = std::thread::Builder::new()
            .name("ferry-ahead".into())
            .spawn(move || reader.stream(&stream_file));
        if spawned.is_err() {
            // The reader fetches what it reads itself.
            file.state().streaming = false;
        }
    }

    /// The file's streamer: keeps up to [`ReadConfig::window`] requests in flight, as far as the reader
    /// wants ([`FileState::ahead_until`]), and sends the next request as soon as one is answered, before
    /// its bytes are stored, so the sharer always has one to serve whatever the reader's pace. Ends when
    /// the file goes stale, a request fails (its readers hear of it), or the reader stops moving on.
    fn stream(&self, file: &Arc<OpenFile>) {
        let failed = Mutex::new(None);
        let failed = &failed;
        std::thread::scope(|scope| {
            // The cache file is written by a thread of its own, off the path of the readers that wait
            // (they are answered from the held piece): the streamer only takes the answers, holds them,
            // wakes the readers and asks for more.
            let (tx, rx) = mpsc::sync_channel::<Written>(WRITE_QUEUE);
            let writer = std::thread::Builder::new()
                .name("ferry-store".into())
                .spawn_scoped(scope, move || {
                    for (claim, pieces) in rx {
                        let stored = pieces
                            .iter()
                            .try_for_each(|(o, b, c)| self.write_piece(file, *o, b, c).map(drop));
                        if let Err(e) = &stored {
                            failed
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_or_insert(e.clone());
                        }
                        file.settle(std::slice::from_ref(&claim), stored);
                    }
                });
            // Without a thread, the streamer writes itself.
            let tx = writer.is_ok().then_some(tx);
            let mut in_flight = VecDeque::new();
            let result = self.stream_loop(file, &mut in_flight, tx.as_ref(), failed);
            drop(tx);
            // Requests still in flight are cancelled (dropped); their readers look again, or hear the
            // failure.
            let claims: Vec<Range<u64>> = in_flight.drain(..).map(|(_, _, r)| r).collect();
            if result.is_err() {
                file.state().streaming = false;
            }
            file.settle(&claims, result);
        });
    }

    /// The streamer's loop; `Ok` once it let go of the file's stream (`streaming` cleared, under the lock
    /// a reader moving the stream on takes), `Err` when a request failed.
    fn stream_loop<'a>(
        &'a self,
        file: &Arc<OpenFile>,
        in_flight: &mut InFlight<'a>,
        writer: Option<&mpsc::SyncSender<Written>>,
        failed: &Mutex<Option<SourceError>>,
    ) -> Result<(), SourceError> {
        let version = file.version();
        loop {
            let failure = failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(e) = failure {
                return Err(e);
            }
            self.refill(file, in_flight)?;
            if in_flight.is_empty() {
                // Nothing to fetch: wait a while for the reader to move on.
                let mut st = file.state();
                let until = std::time::Instant::now() + LINGER;
                loop {
                    let now = std::time::Instant::now();
                    if file.stale.load(Ordering::Relaxed)
                        || now >= until
                        || Arc::strong_count(file) == 1
                    {
                        st.streaming = false;
                        return Ok(());
                    }
                    if st.stream_next < st.ahead_until {
                        break;
                    }
                    let wait = (until - now).min(std::time::Duration::from_millis(50));
                    st = file
                        .more
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                continue;
            }
            if file.stale.load(Ordering::Relaxed) {
                file.state().streaming = false;
                return Ok(());
            }
            let (slot, mut pieces, range) = in_flight.pop_front().expect("not empty");
            let mut got = Vec::new();
            let answered = (|| {
                while let Some(piece) = pieces.next_piece()? {
                    match piece {
                        Piece::Version(v) if v != version => return Err(SourceError::Changed),
                        Piece::Version(_) => {}
                        Piece::Data { offset, bytes, cvs } => got.push((offset, bytes, cvs)),
                    }
                }
                Ok(())
            })();
            drop((slot, pieces));
            let claim = std::slice::from_ref(&range);
            if let Err(e) = answered {
                file.settle(claim, Err(e.clone()));
                return Err(e);
            }
            // Held at once (the readers waiting for them are answered from memory), then the next
            // requests go out, then the bytes are stored: the sharer serves the requests meanwhile.
            let held: Vec<(u64, Arc<Bytes>, Vec<GroupCv>)> = got
                .into_iter()
                .map(|(offset, bytes, cvs)| (offset, self.hold_piece(file, offset, bytes), cvs))
                .collect();
            let refilled = self.refill(file, in_flight);
            match writer {
                // The claim stays until the bytes are stored; a writer gone has recorded why.
                Some(w) => {
                    let _ = w.send((range.clone(), held));
                }
                None => {
                    let stored = held
                        .iter()
                        .try_for_each(|(o, b, c)| self.write_piece(file, *o, b, c).map(drop));
                    file.settle(claim, stored.clone());
                    stored?;
                }
            }
            refilled?;
        }
    }

    /// Sends requests for the next pieces of the file's stream until [`ReadConfig::window`] are in flight
    /// or the stream reaches what the reader wants; each range is claimed before it is asked for.
    fn refill<'a>(
        &'a self,
        file: &OpenFile,
        in_flight: &mut InFlight<'a>,
    ) -> Result<(), SourceError> {
        let version = file.version();
        let piece = self.config.piece.max(1);
        while in_flight.len() < self.config.window.max(1) && !file.stale.load(Ordering::Relaxed) {
            let mine = {
                let mut st = file.state();
                if st.stream_next >= st.ahead_until {
                    return Ok(());
                }
                let start = st.stream_next;
                let end = ((start / piece).saturating_add(1))
                    .saturating_mul(piece)
                    .min(st.ahead_until);
                st.stream_next = end;
                let mine = unclaimed(&file.chunks.missing(start..end), &st.in_flight);
                st.in_flight.extend(mine.iter().cloned());
                mine
            };
            for (i, r) in mine.iter().enumerate() {
                if !self.slots.take(in_flight.is_empty()) {
                    // All slots taken by other fetches: what is not asked for yet is given back, and
                    // the stream goes on from there later.
                    let mut st = file.state();
                    st.stream_next = st.stream_next.min(r.start);
                    drop(st);
                    file.settle(&mine[i..], Ok(()));
                    return Ok(());
                }
                // Taken before the request: an error drops it, giving it back.
                let slot = Slot(&self.slots);
                match self
                    .source
                    .read(&file.path, Some(version.root), r.start, r.end - r.start)
                {
                    Ok(pieces) => in_flight.push_back((slot, pieces, r.clone())),
                    Err(e) => {
                        file.settle(&mine[i..], Err(e.clone()));
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// A verified piece of the file fetched: counted, held for the readers that wait for it (who are
    /// answered from memory while it is written to the cache file), then stored.
    /// A piece the store had no room for goes to `mine`, the fetching reader's own, if given.
    fn store_piece(
        &self,
        file: &OpenFile,
        offset: u64,
        bytes: Bytes,
        cvs: &[GroupCv],
        mine: Option<&mut Mine>,
    ) -> Result<(), SourceError> {
        let bytes = self.hold_piece(file, offset, bytes);
        if !self.write_piece(file, offset, &bytes, cvs)? {
            // Not stored: the reader that fetched it is answered from it (held, it may be let go before
            // that reader takes it, which would then fetch it again and again).
            if let Some(mine) = mine {
                mine.push((offset, bytes));
            }
        }
        Ok(())
    }

    /// A verified piece counted, then held (if the budget has room) and its waiting readers woken: a
    /// reader that finds it held or stored finds it counted.
    fn hold_piece(&self, file: &OpenFile, offset: u64, bytes: Bytes) -> Arc<Bytes> {
        let bytes = Arc::new(bytes);
        self.stats
            .from_peer
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let behind = file.state().next_sequential;
        if file.held.keep(offset, Arc::clone(&bytes), behind) {
            file.arrived(offset..offset + bytes.len() as u64);
        }
        bytes
    }

    /// A held piece written to the store; the readers that wait for it from there are woken. `Ok(false)`
    /// when the store had no room for it; a store short of room is said once ([`Reader::take_notice`]).
    fn write_piece(
        &self,
        file: &OpenFile,
        offset: u64,
        bytes: &[u8],
        cvs: &[GroupCv],
    ) -> Result<bool, SourceError> {
        let kept = file
            .chunks
            .insert(offset, bytes, cvs)
            .map_err(|e| SourceError::Failed {
                errno: libc::EIO,
                message: e.to_string(),
            })?;
        let (stored, short) = match kept {
            Kept::Stored => (true, None),
            Kept::Short(why) => (true, Some(why)),
            Kept::NoRoom(why) => (false, Some(why)),
        };
        if !stored {
            self.stats
                .not_stored
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        if let Some(why) = short {
            if self.no_room.set(why).is_ok() {
                self.no_room_untold.store(true, Ordering::Relaxed);
            }
        }
        file.arrived(offset..offset + bytes.len() as u64);
        Ok(stored)
    }

    /// Makes `range` present in the file's store or in the pieces it holds: fetches what nobody fetches
    /// yet, waits for the rest; returns whether this call had to wait for the sharer.
    /// Pieces the store had no room for, which this call fetched, go to `kept`.
    fn ensure(
        &self,
        file: &OpenFile,
        range: Range<u64>,
        kept: &mut Mine,
    ) -> Result<bool, ReadError> {
        let mut st = file.state();
        let failures_before = st.failures;
        let mut waited = false;
        loop {
            if waited && file.held.covers(&range) {
                return Ok(waited);
            }
            let missing = unclaimed(&file.chunks.missing(range.clone()), &spans(kept));
            if missing.is_empty() {
                return Ok(waited);
            }
            waited = true;
            let mine = unclaimed(&missing, &st.in_flight);
            if !mine.is_empty() {
                st.in_flight.extend(mine.iter().cloned());
                drop(st);
                let r = self.fetch(file, &mine, kept);
                file.settle(&mine, r.clone());
                r?;
                st = file.state();
                continue;
            }
            if st.failures > failures_before {
                return Err(st.last_failure.clone().expect("set with failures"));
            }
            let me = Arc::new(Condvar::new());
            st.waiting.push((range.clone(), Arc::clone(&me)));
            st = me.wait(st).unwrap_or_else(|e| e.into_inner());
            st.waiting.retain(|(_, cv)| !Arc::ptr_eq(cv, &me));
        }
    }

    /// Fetches `ranges` of the file's version with up to [`ReadConfig::window`] reads in flight, storing
    /// each verified piece as it comes and waking the readers that wait.
    fn fetch(
        &self,
        file: &OpenFile,
        ranges: &[Range<u64>],
        mine: &mut Mine,
    ) -> Result<(), ReadError> {
        let version = file.version();
        let mut todo = ranges
            .iter()
            .flat_map(|r| split(r.clone(), self.config.piece));
        let mut in_flight: VecDeque<(Slot<'_>, Box<dyn Pieces>)> = VecDeque::new();
        let mut next = todo.next();
        loop {
            while let Some(r) = next.clone() {
                if in_flight.len() >= self.config.window.max(1)
                    || !self.slots.take(in_flight.is_empty())
                {
                    break;
                }
                // Taken before the request: an error drops it, giving it back.
                let slot = Slot(&self.slots);
                let pieces =
                    self.source
                        .read(&file.path, Some(version.root), r.start, r.end - r.start)?;
                in_flight.push_back((slot, pieces));
                next = todo.next();
            }
            let Some(mut front) = in_flight.pop_front() else {
                return Ok(());
            };
            let pieces = &mut front.1;
            while let Some(piece) = pieces.next_piece()? {
                match piece {
                    Piece::Version(v) if v != version => return Err(SourceError::Changed),
                    Piece::Version(_) => {}
                    Piece::Data { offset, bytes, cvs } => {
                        self.store_piece(file, offset, bytes, &cvs, Some(&mut *mine))?
                    }
                }
            }
        }
    }
}

/// Pieces a reader fetched for itself that the store had no room for: (offset, bytes).
type Mine = Vec<(u64, Arc<Bytes>)>;

/// The ranges `mine` spans.
fn spans(mine: &Mine) -> Vec<Range<u64>> {
    mine.iter().map(|(o, b)| *o..*o + b.len() as u64).collect()
}

/// Fills `buf` with the bytes at `offset`: from `mine` where a piece has them, else from `chunks`.
/// Returns the bytes filled: all of them, or it fails.
fn fill(
    chunks: &Arc<dyn Chunks>,
    mine: &Mine,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize, StoreError> {
    if mine.is_empty() {
        return chunks.read_at(buf, offset);
    }
    let end = offset + buf.len() as u64;
    let mut at = offset;
    while at < end {
        let to = match mine
            .iter()
            .filter(|(o, b)| *o <= at && at < *o + b.len() as u64)
            .max_by_key(|(o, b)| *o + b.len() as u64)
        {
            Some((o, b)) => {
                let to = end.min(o + b.len() as u64);
                buf[(at - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&b[(at - o) as usize..(to - o) as usize]);
                to
            }
            None => {
                // Up to the next piece of `mine`, from the store.
                let to = mine
                    .iter()
                    .map(|(o, _)| *o)
                    .filter(|&o| o > at)
                    .min()
                    .unwrap_or(end)
                    .min(end);
                let part = &mut buf[(at - offset) as usize..(to - offset) as usize];
                let n = chunks.read_at(part, at)?;
                if n < part.len() {
                    return Ok((at - offset) as usize + n);
                }
                to
            }
        };
        at = to;
    }
    Ok(buf.len())
}

/// The parts of `missing` that no range of `claimed` covers.
fn unclaimed(missing: &[Range<u64>], claimed: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for m in missing {
        let mut parts = vec![m.clone()];
        for c in claimed {
            parts = parts
                .into_iter()
                .flat_map(|p| {
                    let mut left = Vec::new();
                    if p.start < c.start {
                        left.push(p.start..p.end.min(c.start));
                    }
                    if p.end > c.end {
                        left.push(p.start.max(c.end)..p.end);
                    }
                    left.into_iter().filter(|r| !r.is_empty())
                })
                .collect();
        }
        out.extend(parts);
    }
    out
}

/// `range` cut into pieces of at most `piece` bytes.
fn split(range: Range<u64>, piece: u64) -> impl Iterator<Item = Range<u64>> {
    let piece = piece.max(1);
    (range.start..range.end)
        .step_by(piece as usize)
        .map(move |s| s..(s + piece).min(range.end))
}

#[cfg(test)]
mod tests;
