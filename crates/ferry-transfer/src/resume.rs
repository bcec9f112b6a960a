//! The receiver's record of partial transfers, so that running the same transfer again sends only
//! what is missing.
//!
//! Partial file data stays in the destination under its temporary name
//! (`.NAME.ferry-part-TOKEN`, next to where the file will go, so the final rename never crosses
//! file systems). What the receiver verified about it lives in a small append-only log,
//! `$XDG_CACHE_HOME/ferry/partial/<offer-id-hex>/state` (`~/.cache/...` without `XDG_CACHE_HOME`,
//! or [`crate::ReceiveOptions::partial_dir`]):
//!
//! - a header: `ferry-partial-2\n`, then the canonical destination path (u32 length + bytes), then
//!   the temporary-name token (u64): a random number drawn by the first run of this offer into
//!   this destination and never sent to the peer, so a temporary name cannot be one the sender
//!   offers or one the user already has, and a resumed run finds its own. A log for another
//!   destination is ignored and replaced;
//! - records: `1` START index u32, kept chunks u32 (data of the file from that chunk on is being
//!   rewritten); `2` CHUNK index u32, chunk u32, chaining value \[32\] (chunk verified and written);
//!   `3` DONE index u32, hash \[32\] (file verified and renamed to its final name); `4` DIR index
//!   u32 (this receiver created that directory, so a resumed run may enter it without `--merge`
//!   and give it the sender's mode and times).
//!
//! The log is written once per received packet at most. On the next run the receiver re-hashes
//! the chunks it kept (and files it finished) and claims only what still matches the log; the
//! sender checks those claims against its own data. The directory is removed after success.

use crate::wire::Reader;
use crate::{Entry, EntryKind};
use blake3::hazmat::ChainingValue;
use ferry_tree::hash::chunk_count;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"ferry-partial-2\n";
const REC_START: u8 = 1;
const REC_CHUNK: u8 = 2;
const REC_DONE: u8 = 3;
const REC_DIR: u8 = 4;

/// What an earlier run left of one file, according to the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileRecord {
    /// Chaining values of the chunks written and verified, from chunk 0.
    pub chunks: Vec<ChainingValue>,
    /// The file's hash if it was finished and renamed.
    pub done: Option<[u8; 32]>,
}

/// The partial-transfer log of one offer into one destination.
pub struct PartialState {
    dir: PathBuf,
    header: Vec<u8>,
    file: Option<File>,
    pending: Vec<u8>,
    /// What the log said at the start of this run, by entry index.
    pub files: HashMap<u32, FileRecord>,
    /// Directories (entry indices) that an earlier run of this offer created, per the log.
    pub dirs: HashSet<u32>,
    /// The token in this offer's temporary names (from the log, or new).
    token: u64,
}

/// `$XDG_CACHE_HOME/ferry/partial`, or `$HOME/.cache/ferry/partial`.
pub fn default_root() -> Option<PathBuf> {
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(c) if !c.is_empty() => PathBuf::from(c),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(cache.join("ferry").join("partial"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl PartialState {
    /// Opens the log for `offer_id` under `root` for destination `out` (canonical), loading what
    /// it says about `entries`. An unreadable, foreign or damaged log is ignored (its damaged
    /// tail dropped); nothing is written until [`PartialState::flush`].
    pub fn open(root: &Path, offer_id: &[u8; 32], out: &Path, entries: &[Entry]) -> PartialState {
        let dir = root.join(hex(offer_id));
        let mut header = MAGIC.to_vec();
        let out_bytes = out.as_os_str().as_bytes();
        header.extend_from_slice(&(out_bytes.len() as u32).to_le_bytes());
        header.extend_from_slice(out_bytes);
        let mut state = PartialState {
            dir,
            header,
            file: None,
            pending: Vec::new(),
            files: HashMap::new(),
            dirs: HashSet::new(),
            token: 0,
        };
        let mut token = None;
        if let Ok(bytes) = fs::read(state.dir.join("state")) {
            let logged = bytes
                .strip_prefix(state.header.as_slice())
                .and_then(|rest| Some((rest.get(..8)?, &rest[8..])));
            if let Some((t, body)) = logged {
                token = Some(u64::from_le_bytes(t.try_into().expect("8 bytes")));
                state.load(body, entries);
                if let Ok(f) = OpenOptions::new()
                    .append(true)
                    .open(state.dir.join("state"))
                {
                    state.file = Some(f);
                }
            }
        }
        state.token = token.unwrap_or_else(ferry_tree::fsys::random_u64);
        let token = state.token.to_le_bytes();
        state.header.extend_from_slice(&token);
        state
    }

    /// The token in this offer's temporary names: the same in every run of the offer into the
    /// same destination, unknown to the sender.
    pub fn token(&self) -> u64 {
        self.token
    }

    fn load(&mut self, body: &[u8], entries: &[Entry]) {
        let mut r = Reader::new(body);
        let file_entry = |i: u32| {
            entries
                .get(i as usize)
                .filter(|e| e.kind == EntryKind::File)
        };
        // A torn last record (the process was killed mid-write) just ends the log.
        while !r.is_empty() {
            let Ok(tag) = r.u8() else { break };
            let rec: Result<(), crate::TransferError> = (|| {
                let index = r.u32()?;
                if tag == REC_DIR {
                    return match entries.get(index as usize) {
                        Some(e) if e.kind == EntryKind::Dir => {
                            self.dirs.insert(index);
                            Ok(())
                        }
                        _ => Err(crate::TransferError::protocol("bad index")),
                    };
                }
                let Some(entry) = file_entry(index) else {
                    return Err(crate::TransferError::protocol("bad index"));
                };
                match tag {
                    REC_START => {
                        let kept = r.u32()? as usize;
                        let f = self.files.entry(index).or_default();
                        f.chunks.truncate(kept);
                        f.done = None;
                    }
                    REC_CHUNK => {
                        let chunk = r.u32()? as u64;
                        let cv = r.array::<32>()?;
                        let f = self.files.entry(index).or_default();
                        if chunk == f.chunks.len() as u64 && chunk < chunk_count(entry.size) {
                            f.chunks.push(cv);
                        }
                    }
                    REC_DONE => {
                        let hash = r.array::<32>()?;
                        self.files.entry(index).or_default().done = Some(hash);
                    }
                    _ => return Err(crate::TransferError::protocol("bad record")),
                }
                Ok(())
            })();
            if rec.is_err() {
                break;
            }
        }
    }

    /// Notes that file `index` is being (re)written from chunk `kept` on.
    pub fn log_start(&mut self, index: u32, kept: u32) {
        self.pending.push(REC_START);
        self.pending.extend_from_slice(&index.to_le_bytes());
        self.pending.extend_from_slice(&kept.to_le_bytes());
    }

    /// Notes that chunk `chunk` of file `index` is written and verified.
    pub fn log_chunk(&mut self, index: u32, chunk: u32, cv: &ChainingValue) {
        self.pending.push(REC_CHUNK);
        self.pending.extend_from_slice(&index.to_le_bytes());
        self.pending.extend_from_slice(&chunk.to_le_bytes());
        self.pending.extend_from_slice(cv);
    }

    /// Notes that file `index` is verified and under its final name.
    pub fn log_done(&mut self, index: u32, hash: &[u8; 32]) {
        self.pending.push(REC_DONE);
        self.pending.extend_from_slice(&index.to_le_bytes());
        self.pending.extend_from_slice(hash);
    }

    /// Notes that this receiver created directory `index`.
    pub fn log_dir(&mut self, index: u32) {
        self.pending.push(REC_DIR);
        self.pending.extend_from_slice(&index.to_le_bytes());
    }

    /// Writes the log's header now if it has none yet, so that the token is on record before any
    /// temporary name made from it exists.
    pub fn create(&mut self) -> io::Result<()> {
        if self.file.is_none() {
            self.write_header()?;
        }
        Ok(())
    }

    fn write_header(&mut self) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let mut f = File::create(self.dir.join("state"))?;
        f.write_all(&self.header)?;
        self.file = Some(f);
        Ok(())
    }

    /// Writes the records noted since the last flush (creating the log on first use).
    pub fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            self.write_header()?;
        }
        let f = self.file.as_mut().expect("opened above");
        f.write_all(&self.pending)?;
        self.pending.clear();
        Ok(())
    }

    /// Deletes the log after a complete transfer.
    pub fn remove(&mut self) -> io::Result<()> {
        self.pending.clear();
        self.file = None;
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The directory holding this offer's log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trip_and_torn_tail() {
        let root = std::env::temp_dir().join(format!("ferry-resume-test-{}", std::process::id()));
        let entries = vec![
            Entry {
                path: b"f".to_vec(),
                kind: EntryKind::File,
                size: 3 * crate::CHUNK,
                mode: 0o644,
                mtime: 0,
                mtime_nsec: 0,
                target: Vec::new(),
            },
            Entry {
                path: b"g".to_vec(),
                kind: EntryKind::Dir,
                size: 0,
                mode: 0o755,
                mtime: 0,
                mtime_nsec: 0,
                target: Vec::new(),
            },
        ];
        let out = Path::new("/out");
        let mut s = PartialState::open(&root, &[1; 32], out, &entries);
        assert!(s.files.is_empty());
        s.log_dir(1);
        s.log_start(0, 0);
        s.log_chunk(0, 0, &[5; 32]);
        s.log_chunk(0, 1, &[6; 32]);
        s.log_chunk(0, 5, &[7; 32]);
        s.flush().unwrap();
        s.log_done(0, &[9; 32]);
        s.pending.truncate(10);
        s.flush().unwrap();
        let again = PartialState::open(&root, &[1; 32], out, &entries);
        assert_eq!(again.token(), s.token(), "the token is kept");
        assert_eq!(
            again.dirs,
            HashSet::from([1]),
            "directories created are kept"
        );
        assert_eq!(again.files[&0].chunks, vec![[5; 32], [6; 32]]);
        assert_eq!(again.files[&0].done, None);
        let other = PartialState::open(&root, &[1; 32], Path::new("/elsewhere"), &entries);
        assert!(other.files.is_empty());
        assert_ne!(other.token(), s.token(), "a new log draws a new token");
        s.remove().unwrap();
        assert!(!s.dir().exists());
        let _ = fs::remove_dir_all(&root);
    }
}
