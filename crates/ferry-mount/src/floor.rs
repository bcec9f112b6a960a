//! The FUSE floor: the cheapest read path a FUSE mount can have here, to measure what moving bytes
//! through FUSE costs on its own (issue 13).
//!
//! One read-only regular file of a chosen size whose reads are answered from one buffer allocated once
//! (a fixed pattern of period [`PERIOD`]): no source, no cache, no verification, no per-read allocation or
//! copy beyond fuser's reply. It mounts exactly as `ferry mount` does for reads: the same session
//! ([`lifecycle::session_config`]: [`lifecycle::THREADS`] workers on cloned descriptors), the same answer
//! to the kernel's init ([`crate::fuse::negotiate`]: 1 MiB requests, async reads, the background queue) and the
//! same readahead on the BDI ([`lifecycle::raise_readahead`]). What ferry's mount spends beyond this floor
//! is ferry's; what the floor spends, any FUSE mount on this machine spends.
//!
//! ```no_run
//! use ferry_mount::floor::{Floor, Mode};
//! let floor = Floor::mount(std::path::Path::new("/mnt/floor"), 1 << 30, Mode::PageCache)?;
//! let bytes = std::fs::read(floor.file())?;
//! assert!(ferry_mount::floor::is_pattern(0, &bytes));
//! # Ok::<(), std::io::Error>(())
//! ```

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use fuser::{
    BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyEntry,
    ReplyOpen, Request, Session,
};

use crate::fuse::{negotiate, MAX_REQUEST, TTL};
use crate::lifecycle;

/// The pattern's period; the buffer holds two, so that any read of up to [`MAX_REQUEST`] bytes is one
/// slice of it wherever it starts.
pub const PERIOD: usize = MAX_REQUEST as usize;
/// The file's name in the mount's root.
pub const NAME: &str = "floor.bin";
const FILE: INodeNo = INodeNo(2);

/// How the file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// As `ferry mount` opens a file not yet in its cache: through the kernel's page cache, with its
    /// readahead.
    PageCache,
    /// `FOPEN_DIRECT_IO`: every read goes to the daemon, straight into the reader's buffer.
    DirectIo,
}

/// The byte at `offset` of the floor's file.
pub fn byte_at(offset: u64) -> u8 {
    let i = offset % PERIOD as u64;
    // Not a multiple of anything a page or a request is: a misplaced slice shows.
    (i ^ (i >> 8) ^ (i >> 17)).wrapping_mul(31) as u8
}

/// Two periods of the pattern: the file's `n ≤ PERIOD` bytes at `offset` are the `n` bytes of it from
/// `offset % PERIOD` on.
pub fn pattern() -> Vec<u8> {
    (0..2 * PERIOD as u64).map(byte_at).collect()
}

/// Whether `bytes` are the file's bytes from `offset` on.
pub fn is_pattern(offset: u64, bytes: &[u8]) -> bool {
    bytes.iter().zip(offset..).all(|(&b, at)| b == byte_at(at))
}

/// The file system: the file's size, how it opens, and the buffer every read is a slice of.
struct FloorFs {
    size: u64,
    mode: Mode,
    pattern: Vec<u8>,
    uid: u32,
    gid: u32,
}

impl FloorFs {
    fn new(size: u64, mode: Mode) -> FloorFs {
        FloorFs {
            size,
            mode,
            pattern: pattern(),
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
        }
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, nlink, size) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o555, 2, 0),
            FILE => (FileType::RegularFile, 0o444, 1, self.size),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            // As the mount's files: 1 MiB reads are one request each.
            blksize: MAX_REQUEST,
            flags: 0,
        })
    }

    /// The reply to a read of `size` bytes at `offset`: a slice of the pattern, cut at the end of the
    /// file and at [`MAX_REQUEST`] (the kernel asks no more; a larger ask gets a short read).
    fn slice(&self, offset: u64, size: u32) -> &[u8] {
        let len = (size.min(MAX_REQUEST) as u64).min(self.size.saturating_sub(offset)) as usize;
        let start = (offset % PERIOD as u64) as usize;
        &self.pattern[start..start + len]
    }

    fn open_flags(&self) -> FopenFlags {
        match self.mode {
            // A fresh mount's uncached file opens with no flag (its page cache is not kept: nothing in it).
            Mode::PageCache => FopenFlags::empty(),
            Mode::DirectIo => FopenFlags::FOPEN_DIRECT_IO,
        }
    }
}

impl Filesystem for FloorFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        negotiate(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, name == NAME) {
            (INodeNo::ROOT, true) => match self.attr(FILE) {
                Some(a) => reply.entry(&TTL, &a, Generation(0)),
                None => reply.error(Errno::ENOENT),
            },
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), self.open_flags());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match ino {
            FILE => reply.data(self.slice(offset, size)),
            _ => reply.error(Errno::EISDIR),
        }
    }
}

/// A mounted floor, served by its session's threads in this process; unmounted on drop.
pub struct Floor {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    readahead: Option<u32>,
}

impl Floor {
    /// Mounts a floor of one `size`-byte file opened in `mode` at `mountpoint` (an existing directory;
    /// needs the privilege to mount) and serves it.
    pub fn mount(mountpoint: &Path, size: u64, mode: Mode) -> io::Result<Floor> {
        let mountpoint = lifecycle::resolve(mountpoint)?;
        let config = lifecycle::session_config("ferry-floor", false);
        let session = Session::new(FloorFs::new(size, mode), &mountpoint, &config)?;
        let readahead = lifecycle::raise_readahead(&mountpoint);
        Ok(Floor {
            session: Some(session.spawn()?),
            mountpoint,
            readahead,
        })
    }

    /// The file's path.
    pub fn file(&self) -> PathBuf {
        self.mountpoint.join(NAME)
    }

    /// The readahead set on the mount's BDI (KiB), as `ferry mount` sets it; `None` when it could not be.
    pub fn readahead_kib(&self) -> Option<u32> {
        self.readahead
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        // Unmounted first (lazily when busy): the session's threads end when the kernel lets them go.
        let _ = lifecycle::unmount(&self.mountpoint);
        if let Some(s) = self.session.take() {
            let _ = s.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_read_is_the_pattern_at_its_offset_cut_at_the_end() {
        let size = 4 * PERIOD as u64 + 5000;
        let fs = FloorFs::new(size, Mode::PageCache);
        for (offset, ask, want) in [
            (0, 4096, 4096),
            (PERIOD as u64 - 100, MAX_REQUEST, PERIOD),
            (2 * PERIOD as u64 + 12345, MAX_REQUEST, PERIOD),
            (size - 10, 4096, 10),
            (size, 4096, 0),
            (size + 4096, 4096, 0),
            (0, u32::MAX, PERIOD),
        ] {
            let got = fs.slice(offset, ask);
            assert_eq!(got.len(), want, "read of {ask} at {offset}");
            assert!(is_pattern(offset, got), "read of {ask} at {offset}");
        }
    }

    #[test]
    fn the_pattern_is_not_periodic_in_pages() {
        assert!(!is_pattern(
            4096,
            &FloorFs::new(1 << 20, Mode::PageCache).pattern[..8192]
        ));
        assert!(!is_pattern(1, &[byte_at(0), byte_at(1)]));
    }

    #[test]
    fn the_file_opens_read_only_as_its_mode_says() {
        assert_eq!(
            FloorFs::new(1, Mode::PageCache).open_flags(),
            FopenFlags::empty()
        );
        assert_eq!(
            FloorFs::new(1, Mode::DirectIo).open_flags(),
            FopenFlags::FOPEN_DIRECT_IO
        );
        let fs = FloorFs::new(7, Mode::PageCache);
        assert_eq!(fs.attr(FILE).map(|a| (a.size, a.perm)), Some((7, 0o444)));
        assert_eq!(
            fs.attr(INodeNo::ROOT).map(|a| a.kind),
            Some(FileType::Directory)
        );
        assert!(fs.attr(INodeNo(3)).is_none());
    }

    /// A real mount of each mode: the file reads whole as the pattern, in 1 MiB reads and at odd offsets,
    /// and the mount is gone once the floor is dropped.
    #[test]
    fn a_mounted_floor_reads_as_its_pattern_in_both_modes() {
        let test = "a_mounted_floor_reads_as_its_pattern_in_both_modes";
        if !Path::new("/dev/fuse").exists() {
            return ferry_testkit::skip(test, "no /dev/fuse");
        }
        if !rustix::process::geteuid().is_root() {
            return ferry_testkit::skip(test, "not root (the floor mounts with mount(2))");
        }
        use std::io::Read;
        use std::os::unix::fs::FileExt;
        let size = 8 * PERIOD as u64 + 777;
        for mode in [Mode::PageCache, Mode::DirectIo] {
            let dir = ferry_testkit::temp_dir("ferry-floor-");
            let floor = Floor::mount(dir.path(), size, mode).unwrap();
            let point = floor.mountpoint.clone();
            assert!(lifecycle::is_mounted(&point), "{mode:?}");
            let mut f = std::fs::File::open(floor.file()).unwrap();
            assert_eq!(f.metadata().unwrap().len(), size);
            let (mut buf, mut at) = (vec![0u8; PERIOD], 0u64);
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                assert!(is_pattern(at, &buf[..n]), "{mode:?}: the read at {at}");
                at += n as u64;
            }
            assert_eq!(at, size, "{mode:?}");
            for offset in [1, PERIOD as u64 - 3, 5 * PERIOD as u64 + 4097, size - 5] {
                let n = f.read_at(&mut buf[..70_000], offset).unwrap();
                assert_eq!(n as u64, 70_000.min(size - offset), "{mode:?} at {offset}");
                assert!(is_pattern(offset, &buf[..n]), "{mode:?} at {offset}");
            }
            assert!(std::fs::OpenOptions::new()
                .write(true)
                .open(floor.file())
                .is_err());
            drop(f);
            drop(floor);
            assert!(!lifecycle::is_mounted(&point), "{mode:?}");
        }
    }
}
