//! The read path against an in-memory sharer and store: both sides in memory, no FUSE.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_share::tree::{GroupCv, Version, GROUP};
use ferry_share::wire::{Entry, SharePath};

use super::{ReadConfig, Reader, Stats};
use crate::source::{Piece, Pieces, Source, SourceError};
use crate::store::{Chunks, Kept, Store, StoreError};

/// Files by path, each with a generation standing in for its root hash.
#[derive(Default)]
struct FakeSharer {
    files: Mutex<HashMap<SharePath, (Vec<u8>, u8)>>,
    offline: AtomicBool,
    reads: AtomicU64,
    bytes: AtomicU64,
    /// Milliseconds each read request takes to be sent (a slow sharer).
    delay_ms: AtomicU64,
    /// Set: every file read changes right after it is answered (to `data(its size, its generation)`), as a
    /// log another peer appends to all the time.
    churn: AtomicBool,
    /// Reads that name no version cut with `Changed` after their first piece, as the sharer cuts an
    /// answer when the file changes while it is sent (counted down).
    cut: AtomicU64,
    /// Set: told of each change churn makes once the answer before it has been read to its end, as the
    /// mount hears the sharer's change notices, after the answers they follow.
    announce: std::sync::OnceLock<std::sync::Weak<Reader<FakeSharer>>>,
}

impl FakeSharer {
    fn put(&self, path: &str, content: Vec<u8>) {
        let mut files = self.files.lock().unwrap();
        let generation = files.get(&p(path)).map_or(0, |f| f.1 + 1);
        files.insert(p(path), (content, generation));
    }
}

/// An answer's pieces, and who hears of the change that followed it once they are all read.
struct FakePieces(
    std::vec::IntoIter<Result<Piece, SourceError>>,
    Option<(std::sync::Weak<Reader<FakeSharer>>, SharePath)>,
);

impl Pieces for FakePieces {
    fn next_piece(&mut self) -> Result<Option<Piece>, SourceError> {
        let next = self.0.next().transpose();
        if matches!(next, Ok(None)) {
            if let Some((reader, path)) = self.1.take() {
                if let Some(r) = reader.upgrade() {
                    r.changed(&path);
                }
            }
        }
        next
    }
}

impl Source for FakeSharer {
    fn stat(&self, _: &SharePath) -> Result<Entry, SourceError> {
        unimplemented!("not used by the read path")
    }
    fn list(&self, _: &SharePath) -> Result<Vec<Entry>, SourceError> {
        unimplemented!("not used by the read path")
    }
    fn read(
        &self,
        path: &SharePath,
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    ) -> Result<Box<dyn Pieces>, SourceError> {
        if self.offline.load(Ordering::Relaxed) {
            return Err(SourceError::Offline("link lost".into()));
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(
            self.delay_ms.load(Ordering::Relaxed),
        ));
        let mut files = self.files.lock().unwrap();
        let (content, generation) = files.get(path).ok_or(SourceError::Failed {
            errno: libc::ENOENT,
            message: "no such file".into(),
        })?;
        let v = Version {
            size: content.len() as u64,
            root: [*generation; 32],
        };
        let mut out = vec![Ok(Piece::Version(v))];
        let cut = version.is_none()
            && len > 0
            && self
                .cut
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
        if version.is_some_and(|r| r != v.root) {
            out.push(Err(SourceError::Changed));
        } else if cut {
            let end = (offset + 64 * 1024).min(v.size);
            out.push(Ok(Piece::Data {
                offset,
                bytes: content[offset as usize..end as usize].to_vec().into(),
                cvs: Vec::new(),
            }));
            out.push(Err(SourceError::Changed));
        } else {
            let end = (offset + len).min(v.size);
            let mut at = offset;
            while at < end {
                let n = (end - at).min(64 * 1024);
                self.bytes.fetch_add(n, Ordering::Relaxed);
                out.push(Ok(Piece::Data {
                    offset: at,
                    bytes: content[at as usize..(at + n) as usize].to_vec().into(),
                    cvs: Vec::new(),
                }));
                at += n;
            }
        }
        let mut announce = None;
        if self.churn.load(Ordering::Relaxed) {
            let (size, next) = (content.len(), generation.wrapping_add(1));
            files.insert(path.clone(), (data(size, next), next));
            announce = self.announce.get().map(|r| (r.clone(), path.clone()));
        }
        Ok(Box::new(FakePieces(out.into_iter(), announce)))
    }
}

struct MemChunks {
    version: Version,
    bytes: Mutex<(Vec<u8>, Vec<bool>)>,
    /// Reads copied out of the store, all entries together.
    reads: Arc<AtomicU64>,
    /// Set: the store has no room (as on a full disk), nothing more is stored.
    full: Arc<AtomicBool>,
}

impl Chunks for MemChunks {
    fn version(&self) -> Version {
        self.version
    }
    fn missing(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let present = &self.bytes.lock().unwrap().1;
        let mut out: Vec<Range<u64>> = Vec::new();
        for g in range.start / GROUP..range.end.div_ceil(GROUP) {
            if !present[g as usize] {
                let r = g * GROUP..((g + 1) * GROUP).min(self.version.size);
                match out.last_mut() {
                    Some(last) if last.end == r.start => last.end = r.end,
                    _ => out.push(r),
                }
            }
        }
        out
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, StoreError> {
        if !self.missing(offset..offset + buf.len() as u64).is_empty() {
            return Err(StoreError("missing".into()));
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let b = self.bytes.lock().unwrap();
        buf.copy_from_slice(&b.0[offset as usize..offset as usize + buf.len()]);
        Ok(buf.len())
    }
    fn insert(&self, offset: u64, bytes: &[u8], _: &[GroupCv]) -> Result<Kept, StoreError> {
        if self.full.load(Ordering::Relaxed) {
            return Ok(Kept::NoRoom("the disk is full".into()));
        }
        // Whole groups only, as the on-disk cache takes them (a short one only at the end of the file).
        let end = offset + bytes.len() as u64;
        if !offset.is_multiple_of(GROUP) || (!end.is_multiple_of(GROUP) && end != self.version.size)
        {
            return Err(StoreError(
                "the bytes are not whole groups inside the file".into(),
            ));
        }
        let mut b = self.bytes.lock().unwrap();
        b.0[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        for g in offset / GROUP..end.div_ceil(GROUP) {
            if end >= ((g + 1) * GROUP).min(self.version.size) {
                b.1[g as usize] = true;
            }
        }
        Ok(Kept::Stored)
    }
    fn is_complete(&self) -> bool {
        self.bytes.lock().unwrap().1.iter().all(|&p| p)
    }
    fn backing(&self) -> Option<File> {
        None
    }
    fn adopt(&self, path: &Path) -> Result<bool, StoreError> {
        let bytes = std::fs::read(path).map_err(|e| StoreError(e.to_string()))?;
        let made = ferry_share::tree::Outboard::compute(&bytes[..], bytes.len() as u64)
            .map_err(|e| StoreError(e.to_string()))?;
        if made.version() != self.version {
            return Ok(false);
        }
        *self.bytes.lock().unwrap() = (
            bytes,
            vec![true; self.version.size.div_ceil(GROUP) as usize],
        );
        std::fs::remove_file(path).map_err(|e| StoreError(e.to_string()))?;
        Ok(true)
    }
}

/// The entries; the count of reads copied out of them; whether the store has no room.
#[derive(Default)]
struct MemStore(
    Mutex<HashMap<[u8; 32], Arc<MemChunks>>>,
    Arc<AtomicU64>,
    Arc<AtomicBool>,
);

impl Store for MemStore {
    fn entry(&self, version: Version) -> Result<Arc<dyn Chunks>, StoreError> {
        let mut m = self.0.lock().unwrap();
        let e = m.entry(version.root).or_insert_with(|| {
            Arc::new(MemChunks {
                version,
                bytes: Mutex::new((
                    vec![0; version.size as usize],
                    vec![false; version.size.div_ceil(GROUP) as usize],
                )),
                reads: Arc::clone(&self.1),
                full: Arc::clone(&self.2),
            })
        });
        Ok(Arc::clone(e) as Arc<dyn Chunks>)
    }
}

fn p(s: &str) -> SharePath {
    SharePath::new(s.as_bytes()).unwrap()
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

fn setup() -> (Arc<FakeSharer>, Arc<Reader<FakeSharer>>) {
    let (sharer, reader, _) = setup_with(ReadConfig::default());
    (sharer, reader)
}

/// Also the count of reads copied out of the store.
fn setup_with(config: ReadConfig) -> (Arc<FakeSharer>, Arc<Reader<FakeSharer>>, Arc<AtomicU64>) {
    let (sharer, reader, reads, _) = setup_full(config);
    (sharer, reader, reads)
}

/// Also the switch that leaves the store with no room.
fn setup_full(
    config: ReadConfig,
) -> (
    Arc<FakeSharer>,
    Arc<Reader<FakeSharer>>,
    Arc<AtomicU64>,
    Arc<AtomicBool>,
) {
    let sharer = Arc::new(FakeSharer::default());
    let store = MemStore::default();
    let full = Arc::clone(&store.2);
    let store_reads = Arc::clone(&store.1);
    let reader = Reader::new(
        Arc::clone(&sharer),
        Arc::new(store),
        config,
        Arc::new(Stats::default()),
    );
    (sharer, reader, store_reads, full)
}

/// Reads `len` bytes of `h` sequentially in 128 KiB reads, checking after each that the pieces held stay
/// within the budget.
fn read_sequentially(reader: &Arc<Reader<FakeSharer>>, h: &super::Handle, len: u64) -> Vec<u8> {
    let mut got = Vec::new();
    while (got.len() as u64) < len {
        let piece = reader.read(h, got.len() as u64, 128 * 1024).unwrap();
        assert!(!piece.is_empty());
        got.extend_from_slice(&piece);
        let held = reader.held.used.load(Ordering::Relaxed);
        assert!(held <= reader.config.hold, "{held} bytes held");
    }
    got
}

/// `n` reads of `h` at random offsets (from `seed`), of up to 400,000 bytes, each equal to `content`,
/// with the pieces held within the budget (and one piece more) after each.
fn reads_anywhere_equal(
    reader: &Arc<Reader<FakeSharer>>,
    h: &super::Handle,
    content: &[u8],
    seed: u64,
    n: usize,
) {
    let mut rng = seed;
    for _ in 0..n {
        let x = ferry_testkit::xorshift(&mut rng);
        let off = x % content.len() as u64;
        let len = (x >> 32) % 400_000;
        let got = reader.read(h, off, len as u32).unwrap();
        let e = (off + len).min(content.len() as u64) as usize;
        assert_eq!(got, &content[off as usize..e], "at {off} len {len}");
        let held = reader.held.used.load(Ordering::Relaxed);
        assert!(held <= reader.config.hold + (1 << 20), "{held} bytes held");
    }
}

#[test]
fn a_streamed_read_is_answered_from_the_fetched_pieces_not_read_back_from_the_store() {
    let (sharer, reader, store_reads) = setup_with(ReadConfig::default());
    let content = data(8 << 20, 7);
    sharer.put("f", content.clone());
    let h = reader.open(&p("f"), None).unwrap();
    assert!(read_sequentially(&reader, &h, content.len() as u64) == content);
    assert_eq!(store_reads.load(Ordering::Relaxed), 0);
    // Read to their ends, the pieces are let go; what is read again comes from the store.
    assert_eq!(reader.held.used.load(Ordering::Relaxed), 0);
    assert_eq!(reader.read(&h, 4096, 10).unwrap(), &content[4096..4106]);
    assert_eq!(store_reads.load(Ordering::Relaxed), 1);
}

#[test]
fn pieces_held_stay_within_their_budget_and_are_let_go_with_their_file() {
    let config = ReadConfig {
        hold: 1 << 20,
        ..ReadConfig::default()
    };
    let (sharer, reader, _) = setup_with(config);
    let content = data(6 << 20, 8);
    sharer.put("f", content.clone());
    let h = reader.open(&p("f"), None).unwrap();
    // Beyond the budget, reads come from the store: the bytes are the same.
    assert!(read_sequentially(&reader, &h, content.len() as u64) == content);
    // Pieces no reader reached the end of are held until their file goes.
    let h2 = reader.open(&p("f"), None).unwrap();
    // Twice: the fake's roots are generations, and the first one of "g" would be "f"'s.
    sharer.put("g", Vec::new());
    sharer.put("g", data(1 << 20, 9));
    let g = reader.open(&p("g"), None).unwrap();
    assert_eq!(reader.read(&g, 0, 10).unwrap(), &data(1 << 20, 9)[..10]);
    assert!(reader.held.used.load(Ordering::Relaxed) > 0);
    drop((h, h2, g));
    // A streaming thread keeps its file until its last piece is in: the file goes when it ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while reader.held.used.load(Ordering::Relaxed) != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(reader.held.used.load(Ordering::Relaxed), 0);
}

#[test]
fn a_store_with_no_room_is_said_once_and_every_read_is_answered_from_memory() {
    // A hold budget smaller than a stream's window: pieces are neither stored nor all held.
    let config = ReadConfig {
        hold: 2 << 20,
        ..ReadConfig::default()
    };
    let (sharer, reader, store_reads, full) = setup_full(config);
    full.store(true, Ordering::Relaxed);
    let content = data(12 << 20, 11);
    sharer.put("f", content.clone());
    let h = reader.open(&p("f"), None).unwrap();
    assert!(read_sequentially(&reader, &h, content.len() as u64) == content);
    let said = reader.take_notice().expect("the full store is said");
    assert!(said.contains("the disk is full"), "{said}");
    // Reads across pieces held, fetched again with other bounds: every one equals the source.
    reads_anywhere_equal(&reader, &h, &content, 3, 300);
    assert_eq!(store_reads.load(Ordering::Relaxed), 0);
    assert!(reader.stats.not_stored.load(Ordering::Relaxed) >= content.len() as u64);
    assert_eq!(reader.take_notice(), None, "said once");
}

/// A store that cannot make any entry, as a cache whose disk has no room for another file.
struct NoEntries;

impl Store for NoEntries {
    fn entry(&self, _version: Version) -> Result<Arc<dyn Chunks>, StoreError> {
        Err(StoreError("No space left on device (os error 28)".into()))
    }
}

#[test]
fn a_store_that_cannot_make_an_entry_is_said_once_and_every_read_is_answered() {
    let sharer = Arc::new(FakeSharer::default());
    let config = ReadConfig {
        hold: 2 << 20,
        ..ReadConfig::default()
    };
    let reader = Reader::new(
        Arc::clone(&sharer),
        Arc::new(NoEntries),
        config,
        Arc::new(Stats::default()),
    );
    let content = data(6 << 20, 13);
    sharer.put("f", content.clone());
    // Before: the open failed (EIO) with the store's error.
    let h = reader.open(&p("f"), None).unwrap();
    assert!(read_sequentially(&reader, &h, content.len() as u64) == content);
    let said = reader.take_notice().expect("the store's failure is said");
    assert!(
        said.contains("the cache cannot keep files") && said.contains("No space left"),
        "{said}"
    );
    reads_anywhere_equal(&reader, &h, &content, 5, 100);
    assert!(reader.stats.not_stored.load(Ordering::Relaxed) >= content.len() as u64);
    // An empty file is whole with nothing kept.
    sharer.put("e", Vec::new());
    let e = reader.open(&p("e"), None).unwrap();
    assert!(reader.read(&e, 0, 10).unwrap().is_empty());
    assert_eq!(reader.take_notice(), None, "said once");
}

#[test]
fn pieces_held_that_overlap_answer_a_read_across_them() {
    let budget = Arc::new(super::Budget {
        used: AtomicU64::new(0),
        limit: 1 << 20,
    });
    let held = super::Held {
        pieces: Mutex::new(Default::default()),
        budget,
        longest: AtomicU64::new(0),
    };
    let content = data(64 << 10, 12);
    let piece = |r: Range<usize>| Arc::new(ferry_share::bytes::Bytes::from(content[r].to_vec()));
    // A large piece, a small one inside it (fetched again after the store dropped it), and the next one.
    assert!(held.keep(0, piece(0..32 << 10), 0));
    assert!(held.keep(8 << 10, piece(8 << 10..16 << 10), 0));
    assert!(held.keep(32 << 10, piece(32 << 10..64 << 10), 0));
    assert!(held.covers(&(20_000..40_000)));
    let got = held.take(&(20_000..40_000)).expect("held");
    assert_eq!(&*got, &content[20_000..40_000]);
    // The pieces the read reached the end of went; the last one holds the rest.
    assert!(!held.covers(&(9_000..17_000)));
    assert!(held.covers(&(40_000..64 << 10)));
}

#[test]
fn random_reads_equal_the_source_and_are_clamped_at_the_end() {
    let (sharer, reader) = setup();
    let content = data(3_000_017, 1);
    sharer.put("f", content.clone());
    let h = reader.open(&p("f"), None).unwrap();
    let mut rng = 7u64;
    for _ in 0..300 {
        let x = ferry_testkit::xorshift(&mut rng);
        let off = x % (content.len() as u64 + 10);
        let len = (x >> 32) % 300_000;
        let got = reader.read(&h, off, len as u32).unwrap();
        let s = (off as usize).min(content.len());
        let e = (off + len).min(content.len() as u64) as usize;
        assert_eq!(got, &content[s..e], "at {off} len {len}");
    }
}

#[test]
fn a_sequential_read_is_streamed_in_large_requests_and_fetched_once() {
    let (sharer, reader) = setup();
    let content = data(32 << 20, 2);
    sharer.put("big", content.clone());
    let h = reader.open(&p("big"), None).unwrap();
    let mut got = Vec::new();
    let mut off = 0;
    while off < content.len() as u64 {
        let piece = reader.read(&h, off, 128 * 1024).unwrap();
        off += piece.len() as u64;
        got.extend_from_slice(&piece);
    }
    assert!(got == content, "sequential read differs");
    let reads = sharer.reads.load(Ordering::Relaxed);
    // 256 FUSE reads of 128 KiB; the sharer sees about one request per MiB (plus the open). On a loaded
    // machine (the parallel tests) a read now and then finds part of its piece claimed by the stream and
    // fetches the rest itself, in smaller requests (74 seen once in CI); a request per read would be 256.
    assert!(reads <= 128, "{reads} requests for 32 MiB");
    assert_eq!(sharer.bytes.load(Ordering::Relaxed), content.len() as u64);
    // Read again: all from the store.
    let before = sharer.bytes.load(Ordering::Relaxed);
    assert_eq!(
        reader.read(&h, 5 << 20, 1 << 20).unwrap(),
        &content[5 << 20..6 << 20]
    );
    assert_eq!(sharer.bytes.load(Ordering::Relaxed), before);
}

#[test]
fn concurrent_readers_of_one_file_share_its_fetches() {
    // Opens learn the version only: four first opens at once would each bring the first bytes.
    let (sharer, reader, _) = setup_with(ReadConfig {
        first: 0,
        ..ReadConfig::default()
    });
    let content = Arc::new(data(8 << 20, 3));
    sharer.put("f", content.to_vec());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let reader = Arc::clone(&reader);
            let content = Arc::clone(&content);
            std::thread::spawn(move || {
                let h = reader.open(&p("f"), None).unwrap();
                let mut off = 0u64;
                while off < content.len() as u64 {
                    let got = reader.read(&h, off, 256 * 1024).unwrap();
                    assert!(got[..] == content[off as usize..off as usize + got.len()]);
                    off += got.len() as u64;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(sharer.bytes.load(Ordering::Relaxed), content.len() as u64);
}

#[test]
fn a_file_changed_on_the_sharer_is_read_whole_from_its_new_version() {
    let (sharer, reader) = setup();
    let old = data(1 << 20, 4);
    sharer.put("f", old.clone());
    let h = reader.open(&p("f"), None).unwrap();
    assert_eq!(reader.read(&h, 0, 1000).unwrap(), &old[..1000]);
    let new = data(300_000, 5);
    sharer.put("f", new.clone());
    // Not yet notified: the cached range still reads from the version opened...
    assert_eq!(reader.read(&h, 0, 1000).unwrap(), &old[..1000]);
    // ...but a range that needs the sharer finds the change and reads the new version, cut at its end.
    assert_eq!(reader.read(&h, 200_000, 500_000).unwrap(), &new[200_000..]);
    assert_eq!(reader.read(&h, 0, 1000).unwrap(), &new[..1000]);
    // A notification makes the next read learn the version, even of cached ranges.
    sharer.put("f", data(10, 6));
    reader.changed(&p("f"));
    assert_eq!(reader.read(&h, 0, 1000).unwrap(), &data(10, 6)[..]);
}

#[test]
fn a_file_opened_whole_is_read_from_its_one_version_or_says_it_changed() {
    let (sharer, reader, _) = setup_with(ReadConfig::default());
    let small = data(10_000, 21);
    let big = data(1 << 20, 22);
    sharer.put("log", small.clone());
    sharer.put("big", Vec::new());
    sharer.put("big", big.clone());
    // A small file comes whole with its version, even where a version is known: a change after that
    // one answer leaves its reads whole and of that version.
    let known = reader.open(&p("log"), None).unwrap().file().version();
    let h = reader.open_whole(&p("log"), Some(known)).unwrap();
    sharer.put("log", data(10_001, 23));
    assert_eq!(reader.read_version(&h, 0, 1 << 20).unwrap(), &small[..]);
    // A larger file that changes before its rest is read says so, and is not read from the new version.
    let g = reader.open_whole(&p("big"), None).unwrap();
    assert_eq!(
        reader.read_version(&g, 0, 64 << 10).unwrap(),
        &big[..64 << 10]
    );
    sharer.put("big", data(1 << 20, 24));
    assert!(matches!(
        reader.read_version(&g, 64 << 10, 64 << 10),
        Err(SourceError::Changed)
    ));
    assert_eq!(g.file().version().size, big.len() as u64);
    // Where `read` moves on to the new version by itself.
    assert_eq!(
        reader.read(&g, 64 << 10, 100).unwrap(),
        &data(1 << 20, 24)[64 << 10..(64 << 10) + 100]
    );
}

/// Reads of a file that changes after every answer (told of each change after the answer when `announced`):
/// each read asks for its own bytes with the new version and returns them, all from that version.
fn reads_of_a_file_changing_with_every_request(announced: bool) {
    let (sharer, reader) = setup();
    sharer.put("log", data(1 << 20, 0));
    if announced {
        let _ = sharer.announce.set(Arc::downgrade(&reader));
    }
    let h = reader.open(&p("log"), None).unwrap();
    sharer.churn.store(true, Ordering::Relaxed);
    for at in [500_000u64, 0, 900_000, 70_000] {
        let got = reader.read(&h, at, 8192).unwrap();
        let seed = h.file().version().root[0];
        let range = at as usize..at as usize + 8192;
        assert_eq!(got, &data(1 << 20, seed)[range], "at {at}");
    }
}

#[test]
fn a_file_that_changes_with_every_request_is_read_whole_from_one_version() {
    // Every fetch finds the file changed: the read asks for its own bytes with the new version.
    reads_of_a_file_changing_with_every_request(false);
}

#[test]
fn a_file_that_changes_with_every_request_is_read_whole_from_one_version_though_each_change_is_announced(
) {
    // Each answer is followed by the notice of the change after it: the version a read learned with its own
    // bytes is stale before the read gets to them, and is read all the same (a newer one would have changed
    // again by the time it was fetched).
    reads_of_a_file_changing_with_every_request(true);
}

#[test]
fn a_read_whose_answers_are_cut_by_changes_again_and_again_goes_on_within_its_time() {
    // A log appended every few milliseconds on a busy machine: even the answers that learn the new
    // version with the read's bytes are cut by the next change, ten times in a row. The read goes on and
    // is answered from one version (before: EIO, "the file kept changing", after four).
    let (sharer, reader) = setup();
    sharer.put("log", data(1 << 20, 0));
    let h = reader.open(&p("log"), None).unwrap();
    sharer.put("log", data(1 << 20, 1));
    sharer.churn.store(true, Ordering::Relaxed);
    sharer.cut.store(10, Ordering::Relaxed);
    let got = reader.read(&h, 300_000, 200_000).unwrap();
    let seed = h.file().version().root[0];
    assert_eq!(got, &data(1 << 20, seed)[300_000..500_000]);
    assert_eq!(sharer.cut.load(Ordering::Relaxed), 0, "every cut was met");
}

#[test]
fn a_first_open_brings_the_start_of_the_file_with_its_version() {
    let (sharer, reader, store_reads) = setup_with(ReadConfig::default());
    let small = data(10_000, 11);
    let big = data(1 << 20, 12);
    sharer.put("small", small.clone());
    // Twice: the fake's roots are generations, and the first one of "big" would be "small"'s.
    sharer.put("big", Vec::new());
    sharer.put("big", big.clone());
    // One request: the version and the whole small file; its reads wait for nothing.
    let h = reader.open(&p("small"), None).unwrap();
    assert_eq!(sharer.reads.load(Ordering::Relaxed), 1);
    assert_eq!(reader.read(&h, 0, 4096).unwrap(), &small[..4096]);
    assert_eq!(reader.read(&h, 4096, 1 << 20).unwrap(), &small[4096..]);
    assert_eq!(sharer.reads.load(Ordering::Relaxed), 1);
    assert_eq!(sharer.bytes.load(Ordering::Relaxed), small.len() as u64);
    assert_eq!(
        store_reads.load(Ordering::Relaxed),
        0,
        "answered from the held piece"
    );
    // A larger file: its first 64 KiB; the rest is read as any miss.
    let g = reader.open(&p("big"), None).unwrap();
    assert_eq!(
        sharer.bytes.load(Ordering::Relaxed),
        small.len() as u64 + (64 << 10)
    );
    assert_eq!(reader.read(&g, 1000, 100).unwrap(), &big[1000..1100]);
    assert_eq!(sharer.reads.load(Ordering::Relaxed), 2);
    assert_eq!(
        reader.read(&g, 500_000, 100).unwrap(),
        &big[500_000..500_100]
    );
    assert_eq!(sharer.reads.load(Ordering::Relaxed), 3);
    // Opened again where a version is known: the version only.
    let before = sharer.bytes.load(Ordering::Relaxed);
    let v = h.file().version();
    drop(h);
    let h = reader.open(&p("small"), Some(v)).unwrap();
    assert_eq!(sharer.bytes.load(Ordering::Relaxed), before);
    assert_eq!(reader.read(&h, 0, 1 << 20).unwrap(), &small[..]);
    // A caller that needs the version only (a file about to be truncated) gets nothing more.
    let before = sharer.bytes.load(Ordering::Relaxed);
    let t = reader.open_version(&p("big"), None).unwrap();
    assert_eq!(t.file().version().size, big.len() as u64);
    assert_eq!(sharer.bytes.load(Ordering::Relaxed), before);
    // The start of a file that changed since it was known comes with its new version all the same
    // when it is opened the first time (twice: a generation of its own).
    sharer.put("small", data(5, 13));
    sharer.put("small", data(5, 13));
    let h2 = reader.open(&p("small"), None).unwrap();
    assert_eq!(reader.read(&h2, 0, 100).unwrap(), &data(5, 13)[..]);
}

#[test]
fn streaming_ahead_stops_when_the_file_changes() {
    // One request of 1 MiB at a time, each taking 20 ms: streaming the 64 MiB ahead takes over a second.
    let config = ReadConfig {
        window: 1,
        ahead: 64 << 20,
        ..ReadConfig::default()
    };
    let (sharer, reader, _) = setup_with(config);
    let content = data(64 << 20, 10);
    sharer.put("f", content.clone());
    sharer.delay_ms.store(20, Ordering::Relaxed);
    let h = reader.open(&p("f"), None).unwrap();
    // Two reads in a row: sequential, the stream starts.
    assert_eq!(reader.read(&h, 0, 4096).unwrap(), &content[..4096]);
    assert_eq!(reader.read(&h, 4096, 4096).unwrap(), &content[4096..8192]);
    let file = h.file();
    assert!(file.state().streaming, "streaming ahead");
    // Renamed, removed or truncated (the mount's own operations, or the sharer's notification).
    reader.changed(&p("f"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while file.state().streaming && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!file.state().streaming, "the streamer stopped");
    let fetched = sharer.bytes.load(Ordering::Relaxed);
    assert!(
        fetched < content.len() as u64 / 2,
        "{fetched} bytes fetched"
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        sharer.bytes.load(Ordering::Relaxed),
        fetched,
        "nothing more"
    );
}

#[test]
fn offline_cached_ranges_read_and_missing_ones_fail_with_eio() {
    let (sharer, reader) = setup();
    let content = data(1 << 20, 7);
    sharer.put("f", content.clone());
    let h = reader.open(&p("f"), None).unwrap();
    let known = h.file().version();
    assert_eq!(reader.read(&h, 0, 100_000).unwrap(), &content[..100_000]);
    sharer.offline.store(true, Ordering::Relaxed);
    let h2 = reader.open(&p("f"), Some(known)).unwrap();
    assert_eq!(reader.read(&h2, 0, 100_000).unwrap(), &content[..100_000]);
    let e = reader.read(&h2, 500_000, 100_000).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(reader.open(&p("f"), None).is_err());
    sharer.offline.store(false, Ordering::Relaxed);
    assert_eq!(
        reader.read(&h2, 500_000, 100_000).unwrap(),
        &content[500_000..600_000]
    );
}
