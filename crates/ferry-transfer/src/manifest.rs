//! The manifest: what an offer contains, its encoding, and the receiver's checks on it.
//!
//! An entry's plain encoding ([`Entry::encode`]): kind u8 (0 file, 1 dir, 2 symlink), mode u32
//! (permission bits), size u64, mtime seconds i64, mtime nanoseconds u32, path length u16, path
//! bytes, and for a symlink only: target length u16, target bytes. The offer id is the BLAKE3 of
//! all entries' plain encodings, in order, and the offer announces their length (what a received
//! manifest is counted as, [`manifest_cost`]).
//!
//! The manifest pages carry the compact encoding ([`Entry::encode_compact`]), each entry relative
//! to the one before it (across pages; the first relative to nothing: an empty path, mode 0, mtime
//! 0), with unsigned LEB128 varints: head u8 (bits 0-1 the kind; bit 2: a mode follows, else the
//! previous entry's; bit 3: an mtime follows, else the previous entry's seconds; other bits
//! refused), shared varint (bytes of the previous path this path starts with), suffix length
//! varint, suffix bytes, then mode varint (if bit 2), size varint (files only), mtime delta varint
//! (if bit 3; zigzag of the seconds minus the previous entry's), nanoseconds varint, and for a
//! symlink: target length varint, target bytes. 10,000 files `d/f00001.bin` of 4-8 KiB take
//! ~13 bytes each instead of ~40.

use crate::error::lossy;
use crate::wire::{Put, Reader, MAX_PAGE, MSG_MANIFEST};
use crate::TransferError;
use ferry_tree::path::{check_path, split_parent, symlink_target_inside, MAX_PATH, MAX_TARGET};
use std::path::PathBuf;

/// Permission bits kept from a file's mode (no setuid, setgid or sticky bits).
pub const MODE_MASK: u32 = 0o777;

/// Bytes of memory a received entry is counted as beyond its encoding: the [`Entry`] itself (80
/// bytes), the allocator's overhead of its path and target, and its place in the sorted order.
pub const ENTRY_OVERHEAD: u64 = 128;

/// The memory a received manifest of `entries` entries whose encodings total `bytes` is counted
/// as before it is accepted: at least what holding and checking it takes (see [`ENTRY_OVERHEAD`]).
pub fn manifest_cost(entries: u64, bytes: u64) -> u64 {
    entries.saturating_mul(ENTRY_OVERHEAD).saturating_add(bytes)
}

/// What a manifest entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link whose target stays inside its tree.
    Symlink,
}

/// One file, directory or symlink of an offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative `/`-separated path; its first component is the basename of a `PATH` argument.
    pub path: Vec<u8>,
    /// File, directory or symlink.
    pub kind: EntryKind,
    /// Size in bytes (0 for directories and symlinks).
    pub size: u64,
    /// Permission bits ([`MODE_MASK`]).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Modification time, nanoseconds part.
    pub mtime_nsec: u32,
    /// Symlink target (empty for other kinds).
    pub target: Vec<u8>,
}

impl Entry {
    /// The path as lossy UTF-8, for messages and progress.
    pub fn path_lossy(&self) -> String {
        lossy(&self.path)
    }

    /// Bytes of this entry's encoding.
    pub fn encoded_len(&self) -> usize {
        let target = if self.kind == EntryKind::Symlink {
            2 + self.target.len()
        } else {
            0
        };
        1 + 4 + 8 + 8 + 4 + 2 + self.path.len() + target
    }

    /// Appends this entry's encoding.
    pub fn encode(&self, out: &mut impl Put) {
        out.put_u8(match self.kind {
            EntryKind::File => 0,
            EntryKind::Dir => 1,
            EntryKind::Symlink => 2,
        });
        out.put_u32(self.mode);
        out.put_u64(self.size);
        out.put_i64(self.mtime);
        out.put_u32(self.mtime_nsec);
        out.put_u16(self.path.len() as u16);
        out.put(&self.path);
        if self.kind == EntryKind::Symlink {
            out.put_u16(self.target.len() as u16);
            out.put(&self.target);
        }
    }

    /// Bytes of this entry's compact encoding after `prev` (see the module's documentation).
    pub fn compact_len(&self, prev: Option<&Entry>) -> usize {
        let c = Context::of(prev);
        let shared = c.shared(&self.path);
        let suffix = self.path.len() - shared;
        let mut n = 1 + varint_len(shared as u64) + varint_len(suffix as u64) + suffix;
        if self.mode != c.mode {
            n += varint_len(u64::from(self.mode));
        }
        if self.kind == EntryKind::File {
            n += varint_len(self.size);
        }
        if self.mtime != c.mtime {
            n += varint_len(zigzag(self.mtime.wrapping_sub(c.mtime)));
        }
        n += varint_len(u64::from(self.mtime_nsec));
        if self.kind == EntryKind::Symlink {
            n += varint_len(self.target.len() as u64) + self.target.len();
        }
        n
    }

    /// Appends this entry's compact encoding after `prev` (the entry before it in the manifest).
    pub fn encode_compact(&self, prev: Option<&Entry>, out: &mut impl Put) {
        let c = Context::of(prev);
        let shared = c.shared(&self.path);
        let mut head = match self.kind {
            EntryKind::File => 0,
            EntryKind::Dir => 1,
            EntryKind::Symlink => 2,
        };
        if self.mode != c.mode {
            head |= HEAD_MODE;
        }
        if self.mtime != c.mtime {
            head |= HEAD_MTIME;
        }
        out.put_u8(head);
        put_varint(out, shared as u64);
        put_varint(out, (self.path.len() - shared) as u64);
        out.put(&self.path[shared..]);
        if self.mode != c.mode {
            put_varint(out, u64::from(self.mode));
        }
        if self.kind == EntryKind::File {
            put_varint(out, self.size);
        }
        if self.mtime != c.mtime {
            put_varint(out, zigzag(self.mtime.wrapping_sub(c.mtime)));
        }
        put_varint(out, u64::from(self.mtime_nsec));
        if self.kind == EntryKind::Symlink {
            put_varint(out, self.target.len() as u64);
            out.put(&self.target);
        }
    }

    /// Decodes one entry in the compact encoding after `prev`, checking its path, bounds and fields
    /// before allocating.
    pub fn decode_compact(
        prev: Option<&Entry>,
        r: &mut Reader<'_>,
    ) -> Result<Entry, TransferError> {
        let c = Context::of(prev);
        let head = r.u8()?;
        if head & !(HEAD_KIND | HEAD_MODE | HEAD_MTIME) != 0 {
            return Err(TransferError::protocol(format!(
                "unknown entry head bits {head:#04x}"
            )));
        }
        let kind = match head & HEAD_KIND {
            0 => EntryKind::File,
            1 => EntryKind::Dir,
            2 => EntryKind::Symlink,
            k => return Err(TransferError::protocol(format!("unknown entry kind {k}"))),
        };
        let shared = get_varint(r)?;
        let suffix = get_varint(r)?;
        if shared > c.path.len() as u64 || shared + suffix > MAX_PATH as u64 {
            return Err(TransferError::protocol("path length out of range"));
        }
        let suffix = r.bytes(suffix as usize)?;
        let mut path = Vec::with_capacity(shared as usize + suffix.len());
        path.extend_from_slice(&c.path[..shared as usize]);
        path.extend_from_slice(suffix);
        check_path(&path).map_err(|problem| TransferError::UnsafePath {
            path: lossy(&path),
            problem,
        })?;
        let mode = match head & HEAD_MODE {
            0 => c.mode,
            _ => u32::try_from(get_varint(r)?)
                .ok()
                .filter(|m| m & !MODE_MASK == 0)
                .ok_or_else(|| TransferError::protocol("mode beyond the permission bits"))?,
        };
        let size = match kind {
            EntryKind::File => get_varint(r)?,
            _ => 0,
        };
        let mtime = match head & HEAD_MTIME {
            0 => c.mtime,
            _ => c.mtime.wrapping_add(unzigzag(get_varint(r)?)),
        };
        let mtime_nsec = u32::try_from(get_varint(r)?)
            .ok()
            .filter(|&n| n < 1_000_000_000)
            .ok_or_else(|| TransferError::protocol("mtime nanoseconds out of range"))?;
        let target = if kind == EntryKind::Symlink {
            let n = get_varint(r)?;
            if n > MAX_TARGET as u64 {
                return Err(TransferError::protocol("symlink target over 4096 bytes"));
            }
            r.bytes(n as usize)?.to_vec()
        } else {
            Vec::new()
        };
        Ok(Entry {
            path,
            kind,
            size,
            mode,
            mtime,
            mtime_nsec,
            target,
        })
    }

    /// Decodes one entry, checking its path, bounds and fields before allocating.
    pub fn decode(r: &mut Reader<'_>) -> Result<Entry, TransferError> {
        let kind = match r.u8()? {
            0 => EntryKind::File,
            1 => EntryKind::Dir,
            2 => EntryKind::Symlink,
            k => return Err(TransferError::protocol(format!("unknown entry kind {k}"))),
        };
        let mode = r.u32()? & MODE_MASK;
        let size = r.u64()?;
        let mtime = r.i64()?;
        let mtime_nsec = r.u32()?;
        let path_len = r.u16()? as usize;
        if path_len > MAX_PATH {
            return Err(TransferError::protocol("path length over 4096"));
        }
        let path = r.bytes(path_len)?;
        check_path(path).map_err(|problem| TransferError::UnsafePath {
            path: lossy(path),
            problem,
        })?;
        if mtime_nsec >= 1_000_000_000 {
            return Err(TransferError::protocol("mtime nanoseconds out of range"));
        }
        if kind != EntryKind::File && size != 0 {
            return Err(TransferError::protocol("non-file entry with a size"));
        }
        let target = if kind == EntryKind::Symlink {
            let n = r.u16()? as usize;
            if n > MAX_TARGET {
                return Err(TransferError::protocol("symlink target over 4096 bytes"));
            }
            r.bytes(n)?.to_vec()
        } else {
            Vec::new()
        };
        Ok(Entry {
            path: path.to_vec(),
            kind,
            size,
            mode,
            mtime,
            mtime_nsec,
            target,
        })
    }
}

/// Compact encoding, head byte: the kind.
const HEAD_KIND: u8 = 0b11;
/// Compact encoding, head byte: a mode follows.
const HEAD_MODE: u8 = 0b100;
/// Compact encoding, head byte: an mtime follows.
const HEAD_MTIME: u8 = 0b1000;

/// What the compact encoding of an entry is relative to: the entry before it.
struct Context<'a> {
    path: &'a [u8],
    mode: u32,
    mtime: i64,
}

impl<'a> Context<'a> {
    fn of(prev: Option<&'a Entry>) -> Self {
        match prev {
            Some(p) => Context {
                path: &p.path,
                mode: p.mode,
                mtime: p.mtime,
            },
            None => Context {
                path: &[],
                mode: 0,
                mtime: 0,
            },
        }
    }

    /// How many leading bytes `path` shares with the previous path.
    fn shared(&self, path: &[u8]) -> usize {
        self.path
            .iter()
            .zip(path)
            .take_while(|(a, b)| a == b)
            .count()
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut impl Put, mut v: u64) {
    while v >= 0x80 {
        out.put_u8(v as u8 | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// An unsigned LEB128 varint of at most 10 bytes that fits in 64 bits.
fn get_varint(r: &mut Reader<'_>) -> Result<u64, TransferError> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = r.u8()?;
        if i == 9 && b > 1 {
            break;
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(TransferError::protocol("varint out of range"))
}

/// Counts and total size of an offer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Sum of file sizes.
    pub bytes: u64,
}

impl Totals {
    /// Counts `entries`; `None` if the byte total overflows.
    pub fn of(entries: &[Entry]) -> Option<Totals> {
        let mut t = Totals::default();
        for e in entries {
            match e.kind {
                EntryKind::File => {
                    t.files += 1;
                    t.bytes = t.bytes.checked_add(e.size)?;
                }
                EntryKind::Dir => t.dirs += 1,
                EntryKind::Symlink => t.symlinks += 1,
            }
        }
        Some(t)
    }
}

/// An offer's entries (and, on the sending side, where each file's data comes from).
#[derive(Debug, Clone, Default)]
pub struct Manifest {
    /// The entries, in sending order (a directory before its contents).
    pub entries: Vec<Entry>,
    /// For each entry, its local source (sending side only; empty when received).
    pub sources: Vec<Source>,
    /// For each entry, the bytes of its data on the sender's disk when the walk saw it, at most
    /// its size (less for a sparse file; sending side only, may be empty: then nothing is sparse).
    pub allocated: Vec<u64>,
}

/// Where an entry comes from on the sending side, and what the walk saw of it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The local path.
    pub path: PathBuf,
    /// Inode number at the walk.
    pub ino: u64,
    /// Status-change time at the walk, seconds.
    pub ctime: i64,
    /// Status-change time at the walk, nanoseconds.
    pub ctime_nsec: i64,
    /// The contents, read at the walk: files whose stat reports size 0 (procfs, sysfs, some FUSE
    /// file systems report 0 and have content; an empty file is read once too). These are sent
    /// from here, not read again.
    pub held: Option<Box<[u8]>>,
}

impl Source {
    /// The source of `entry` at `path`, as the walk's `meta` describes it.
    pub fn new(path: PathBuf, meta: &std::fs::Metadata) -> Source {
        use std::os::unix::fs::MetadataExt;
        Source {
            path,
            ino: meta.ino(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
            held: None,
        }
    }

    /// Whether `now` (a stat of the open file) still shows the file the walk saw as `entry`: the
    /// same inode, size, modification and status-change times. Any write, truncation or change
    /// of mode sets the status-change time; since Linux 6.13 (multigrain timestamps on ext4,
    /// xfs, btrfs and tmpfs) a write right after the walk's stat gets a distinct one, before
    /// that a write within the same clock tick (a few milliseconds) can go unseen.
    pub fn unchanged(&self, entry: &Entry, now: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        now.is_file()
            && now.ino() == self.ino
            && now.len() == entry.size
            && now.mtime() == entry.mtime
            && now.mtime_nsec() == i64::from(entry.mtime_nsec)
            && now.ctime() == self.ctime
            && now.ctime_nsec() == self.ctime_nsec
    }
}

impl Manifest {
    /// Counts and total size.
    pub fn totals(&self) -> Totals {
        Totals::of(&self.entries).unwrap_or_default()
    }

    /// Whether entry `index` is a sparse file (its data takes less room than its size).
    pub fn is_sparse(&self, index: usize) -> bool {
        self.allocated
            .get(index)
            .is_some_and(|&a| a < self.entries[index].size)
    }

    /// Bytes the files' data takes on the sender's disk (see [`Manifest::allocated`]).
    pub fn bytes_allocated(&self) -> u64 {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EntryKind::File)
            .map(|(i, e)| self.allocated.get(i).map_or(e.size, |&a| a.min(e.size)))
            .sum()
    }

    /// Bytes of all entries' plain encodings (what an offer announces as its manifest's size).
    pub fn encoded_len(&self) -> u64 {
        self.entries.iter().map(|e| e.encoded_len() as u64).sum()
    }

    /// Bytes of all entries' compact encodings (what the manifest pages carry, without their
    /// headers).
    pub fn compact_len(&self) -> u64 {
        let prev = std::iter::once(None).chain(self.entries.iter().map(Some));
        self.entries
            .iter()
            .zip(prev)
            .map(|(e, p)| e.compact_len(p) as u64)
            .sum()
    }

    /// The memory a receiver counts this manifest as ([`manifest_cost`]).
    pub fn received_cost(&self) -> u64 {
        manifest_cost(self.entries.len() as u64, self.encoded_len())
    }

    /// The offer id: BLAKE3 of all entry encodings in order.
    pub fn offer_id(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        let mut buf = Vec::with_capacity(64 * 1024);
        for e in &self.entries {
            e.encode(&mut buf);
            if buf.len() >= 60 * 1024 {
                hasher.update(&buf);
                buf.clear();
            }
        }
        hasher.update(&buf);
        *hasher.finalize().as_bytes()
    }

    /// Encodes the entries from `*next` on into one manifest page of at most `max` bytes (at
    /// most [`MAX_PAGE`]) in the compact encoding, advancing `*next`; `out` is cleared first.
    pub fn encode_page(&self, next: &mut usize, max: usize, out: &mut Vec<u8>) {
        let max = max.min(MAX_PAGE);
        out.clear();
        out.put_u8(MSG_MANIFEST);
        out.put_u32(0);
        let mut count = 0u32;
        while let Some(e) = self.entries.get(*next) {
            let prev = next.checked_sub(1).map(|p| &self.entries[p]);
            if out.len() + e.compact_len(prev) > max {
                break;
            }
            e.encode_compact(prev, out);
            count += 1;
            *next += 1;
        }
        out[1..5].copy_from_slice(&count.to_le_bytes());
    }
}

/// Checks a complete received manifest as a whole: no duplicate path, every parent a declared
/// directory, no path both a file and a directory, every symlink staying inside its tree.
///
/// Returns the entry indices sorted by path, in which order every directory comes before its
/// contents (a prefix sorts first).
pub fn check_tree(entries: &[Entry]) -> Result<Vec<u32>, TransferError> {
    let mut order: Vec<u32> = (0..entries.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| entries[a as usize].path.cmp(&entries[b as usize].path));
    for pair in order.windows(2) {
        let (a, b) = (&entries[pair[0] as usize], &entries[pair[1] as usize]);
        if a.path == b.path {
            let path = a.path_lossy();
            return Err(
                if (a.kind == EntryKind::Dir) != (b.kind == EntryKind::Dir) {
                    TransferError::FileDirClash { path }
                } else {
                    TransferError::DuplicatePath { path }
                },
            );
        }
    }
    for e in entries {
        let (parent, _) = split_parent(&e.path);
        if !parent.is_empty() {
            let found = order
                .binary_search_by(|&i| entries[i as usize].path.as_slice().cmp(parent))
                .map(|pos| entries[order[pos] as usize].kind);
            match found {
                Ok(EntryKind::Dir) => {}
                Ok(_) => {
                    return Err(TransferError::FileDirClash {
                        path: lossy(parent),
                    })
                }
                Err(_) => {
                    return Err(TransferError::MissingParent {
                        path: e.path_lossy(),
                    })
                }
            }
        }
        if e.kind == EntryKind::Symlink && !symlink_target_inside(&e.path, &e.target) {
            return Err(TransferError::SymlinkEscapes {
                path: e.path_lossy(),
                target: lossy(&e.target),
            });
        }
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind,
            size: 0,
            mode: 0o644,
            mtime: 1,
            mtime_nsec: 2,
            target: if kind == EntryKind::Symlink {
                b"x".to_vec()
            } else {
                Vec::new()
            },
        }
    }

    #[test]
    fn encode_decode_and_pages() {
        let m = Manifest {
            entries: vec![
                entry("d", EntryKind::Dir),
                entry("d/f", EntryKind::File),
                entry("d/l", EntryKind::Symlink),
            ],
            ..Default::default()
        };
        let mut next = 0;
        let mut page = Vec::new();
        m.encode_page(&mut next, MAX_PAGE, &mut page);
        assert_eq!(next, 3);
        assert_eq!(page.len() as u64 - 5, m.compact_len());
        let mut r = Reader::new(&page[5..]);
        let mut decoded: Vec<Entry> = Vec::new();
        for _ in 0..3 {
            decoded.push(Entry::decode_compact(decoded.last(), &mut r).unwrap());
        }
        assert!(r.is_empty());
        assert_eq!(decoded, m.entries);
        assert_eq!(check_tree(&decoded).unwrap(), vec![0, 1, 2]);
        let mut plain = Vec::new();
        m.entries[2].encode(&mut plain);
        assert_eq!(
            Entry::decode(&mut Reader::new(&plain)).unwrap(),
            m.entries[2]
        );
    }

    #[test]
    fn compact_entries_round_trip_across_pages_and_extremes() {
        let mut entries = vec![entry("top", EntryKind::Dir)];
        for i in 0..300u64 {
            let mut e = entry(&format!("top/f{i:05}.bin"), EntryKind::File);
            e.size = 4096 + i * 13;
            e.mtime = 1_700_000_000 + (i as i64 % 3) - 1;
            e.mtime_nsec = (i * 7_654_321 % 1_000_000_000) as u32;
            e.mode = if i % 5 == 0 { 0o755 } else { 0o644 };
            entries.push(e);
        }
        let mut odd = entry("top/l", EntryKind::Symlink);
        odd.mtime = i64::MIN;
        entries.push(odd);
        let mut big = entry("top/z", EntryKind::File);
        (big.size, big.mtime, big.mtime_nsec) = (u64::MAX, i64::MAX, 999_999_999);
        entries.push(big);
        let m = Manifest {
            entries,
            ..Default::default()
        };
        // Small pages: the context carries from one page to the next.
        let (mut next, mut page, mut decoded) = (0, Vec::new(), Vec::<Entry>::new());
        let mut wire = 0;
        while next < m.entries.len() {
            m.encode_page(&mut next, 1000, &mut page);
            wire += page.len() - 5;
            let count = u32::from_le_bytes(page[1..5].try_into().unwrap());
            let mut r = Reader::new(&page[5..]);
            for _ in 0..count {
                decoded.push(Entry::decode_compact(decoded.last(), &mut r).unwrap());
            }
            assert!(r.is_empty());
        }
        assert_eq!(decoded, m.entries);
        assert_eq!(wire as u64, m.compact_len());
        // Far smaller than the plain encoding for names in one directory.
        assert!(m.compact_len() * 2 < m.encoded_len(), "{}", m.compact_len());
    }

    #[test]
    fn compact_decoding_refuses_what_no_sender_encodes() {
        let prev = entry("ab", EntryKind::File);
        let refuse = |bytes: &[u8]| Entry::decode_compact(Some(&prev), &mut Reader::new(bytes));
        // shared 3 > the previous path's 2 bytes.
        assert!(refuse(&[0, 3, 1, b'x', 0, 0]).is_err());
        // An unknown head bit, kind 3.
        assert!(refuse(&[0x10, 0, 1, b'x', 0, 0]).is_err());
        assert!(refuse(&[3, 0, 1, b'x', 0]).is_err());
        // A mode beyond the permission bits; nanoseconds out of range; an overlong varint.
        assert!(refuse(&[4, 0, 1, b'x', 0x80, 0x20, 0, 0]).is_err());
        assert!(refuse(&[0, 0, 1, b'x', 0, 0x80, 0x94, 0xeb, 0xdc, 0x03]).is_err());
        assert!(refuse(&[
            0, 0, 1, b'x', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0
        ])
        .is_err());
        // A path over 4096 bytes from a shared prefix and a suffix; an unsafe path.
        assert!(refuse(&[0, 2, 0xff, 0x1f]).is_err());
        assert!(matches!(
            refuse(&[0, 0, 2, b'.', b'.', 0, 0]),
            Err(TransferError::UnsafePath { .. })
        ));
        // And the same shape that is right: "abc", size 0, nanoseconds 0.
        let ok = refuse(&[0, 2, 1, b'c', 0, 0]).unwrap();
        assert_eq!(ok.path, b"abc");
        assert_eq!((ok.mode, ok.mtime), (prev.mode, prev.mtime));
    }

    #[test]
    fn entry_overhead_covers_what_a_received_entry_holds() {
        // The struct, two allocations of at most 31 bytes of slack each (glibc's smallest chunk is
        // 32 bytes) and a u32 in the sorted order, against what the limit counts beyond the names:
        // the overhead and the fixed part of the encoding.
        let held = std::mem::size_of::<Entry>() as u64 + 2 * 31 + 4;
        let fixed = 1 + 4 + 8 + 8 + 4 + 2;
        assert!(held <= ENTRY_OVERHEAD + fixed, "{held}");
        let m = Manifest {
            entries: vec![entry("d", EntryKind::Dir), entry("d/l", EntryKind::Symlink)],
            ..Default::default()
        };
        assert_eq!(m.encoded_len(), 28 + 33);
        assert_eq!(m.received_cost(), 2 * ENTRY_OVERHEAD + 61);
    }

    #[test]
    fn tree_rules() {
        let dup = [entry("a", EntryKind::File), entry("a", EntryKind::File)];
        assert!(matches!(
            check_tree(&dup),
            Err(TransferError::DuplicatePath { .. })
        ));
        let clash = [entry("a", EntryKind::File), entry("a", EntryKind::Dir)];
        assert!(matches!(
            check_tree(&clash),
            Err(TransferError::FileDirClash { .. })
        ));
        let under_file = [entry("a", EntryKind::File), entry("a/b", EntryKind::File)];
        assert!(matches!(
            check_tree(&under_file),
            Err(TransferError::FileDirClash { .. })
        ));
        let orphan = [entry("a/b", EntryKind::File)];
        assert!(matches!(
            check_tree(&orphan),
            Err(TransferError::MissingParent { .. })
        ));
    }
}
