//! The sharer's file-system layer: every path resolved beneath the shared directory by the kernel, and each
//! file version's outboard cached by identity.
//!
//! Paths are opened with `openat2(2)` and `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` from a descriptor of
//! the shared directory: `..`, absolute symlinks and symlinks that lead out are refused by the kernel during
//! the one resolution that also opens the file, so a symlink swapped in between two requests (or during
//! one) cannot lead out either. Symlinks inside the share are listed as symlinks and followed only while
//! they stay inside. Devices, FIFOs and sockets are neither listed nor opened (a FIFO is opened
//! non-blocking and refused by its type). Hard links are files like any other: with the kernel's
//! `protected_hardlinks` (the default), a user can only link files it may already read.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::tree::{Outboard, Version};
use crate::wire::{Entry, ErrorCode, Kind, SharePath, END};

/// A failed file-system request: its code for the client and a message.
pub type FsError = (ErrorCode, String);

/// The shared directory.
#[derive(Debug)]
pub struct ShareRoot {
    root: OwnedFd,
    path: PathBuf,
}

fn resolve() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

fn fs_error(e: Errno, path: &SharePath) -> FsError {
    let shown = String::from_utf8_lossy(path.as_bytes()).into_owned();
    let code = match e {
        Errno::NOENT => ErrorCode::NotFound,
        // EXDEV: resolution left the share; ELOOP: a symlink where none may be.
        Errno::XDEV | Errno::LOOP => ErrorCode::UnsafePath,
        Errno::ACCESS | Errno::PERM => ErrorCode::Permission,
        Errno::NOTDIR | Errno::ISDIR => ErrorCode::WrongKind,
        _ => ErrorCode::Io,
    };
    let why = match code {
        ErrorCode::UnsafePath => "leads outside the share".to_string(),
        _ => io::Error::from(e).to_string(),
    };
    (code, format!("{shown}: {why}"))
}

fn entry_of(name: &[u8], st: &Stat, target: Vec<u8>) -> Option<Entry> {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => return None,
    };
    Some(Entry {
        name: name.to_vec(),
        kind,
        size: if kind == Kind::File {
            st.st_size as u64
        } else {
            0
        },
        mode: st.st_mode & 0o777,
        mtime: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec as u32,
        target,
    })
}

impl ShareRoot {
    /// Opens the directory to share.
    pub fn open(dir: &Path) -> io::Result<ShareRoot> {
        let root = rustix::fs::open(
            dir,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(ShareRoot {
            root,
            path: dir.to_path_buf(),
        })
    }

    /// The shared directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_at(&self, path: &SharePath, flags: OFlags) -> Result<OwnedFd, FsError> {
        let rel: &[u8] = if path.is_root() {
            b"."
        } else {
            path.as_bytes()
        };
        rustix::fs::openat2(
            &self.root,
            std::ffi::OsStr::from_bytes(rel),
            flags | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
            resolve(),
        )
        .map_err(|e| fs_error(e, path))
    }

    /// The attributes of `path`; a symlink is described, not followed.
    pub fn stat(&self, path: &SharePath) -> Result<Entry, FsError> {
        let (parent, name) = ferry_tree::path::split_parent(path.as_bytes());
        let (st, target) = if path.is_root() {
            (
                rustix::fs::fstat(&self.root).map_err(|e| fs_error(e, path))?,
                Vec::new(),
            )
        } else {
            let parent_path = SharePath::new(parent).expect("a checked path's parent is checked");
            let dir = self.open_at(&parent_path, OFlags::DIRECTORY | OFlags::RDONLY)?;
            let st = rustix::fs::statat(
                &dir,
                std::ffi::OsStr::from_bytes(name),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| fs_error(e, path))?;
            let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                rustix::fs::readlinkat(&dir, std::ffi::OsStr::from_bytes(name), Vec::new())
                    .map_err(|e| fs_error(e, path))?
                    .into_bytes()
            } else {
                Vec::new()
            };
            (st, target)
        };
        entry_of(name, &st, target).ok_or_else(|| {
            (
                ErrorCode::UnsafePath,
                format!(
                    "{}: not a file, directory or symlink",
                    String::from_utf8_lossy(path.as_bytes())
                ),
            )
        })
    }

    /// One page of the directory `path`, in name order: up to `max` entries from position `cursor`, and the
    /// next page's cursor ([`END`] after the last). Devices, FIFOs and sockets are left out.
    pub fn list(
        &self,
        path: &SharePath,
        cursor: u64,
        max: u32,
    ) -> Result<(Vec<Entry>, u64), FsError> {
        let dir = self.open_at(path, OFlags::DIRECTORY | OFlags::RDONLY)?;
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut reader = rustix::fs::Dir::read_from(&dir).map_err(|e| fs_error(e, path))?;
        while let Some(item) = reader.read() {
            let item = item.map_err(|e| fs_error(e, path))?;
            let name = item.file_name().to_bytes();
            if name != b"." && name != b".." && name.len() <= ferry_tree::path::MAX_NAME {
                names.push(name.to_vec());
            }
        }
        names.sort_unstable();
        let mut entries = Vec::new();
        let mut i = cursor as usize;
        while i < names.len() && entries.len() < max as usize {
            let name = &names[i];
            i += 1;
            let os = std::ffi::OsStr::from_bytes(name);
            let Ok(st) = rustix::fs::statat(&dir, os, AtFlags::SYMLINK_NOFOLLOW) else {
                continue; // gone meanwhile
            };
            let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                match rustix::fs::readlinkat(&dir, os, Vec::new()) {
                    Ok(t) if !t.as_bytes().is_empty() => t.into_bytes(),
                    _ => continue,
                }
            } else {
                Vec::new()
            };
            entries.extend(entry_of(name, &st, target));
        }
        let next = if i >= names.len() { END } else { i as u64 };
        Ok((entries, next))
    }

    /// Opens the regular file at `path` for reading (following symlinks only while they stay inside).
    pub fn open_file(&self, path: &SharePath) -> Result<File, FsError> {
        let fd = self.open_at(path, OFlags::RDONLY | OFlags::NONBLOCK)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| fs_error(e, path))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok(File::from(fd)),
            FileType::Directory => Err((
                ErrorCode::WrongKind,
                format!(
                    "{}: is a directory",
                    String::from_utf8_lossy(path.as_bytes())
                ),
            )),
            _ => Err((
                ErrorCode::UnsafePath,
                format!(
                    "{}: not a regular file",
                    String::from_utf8_lossy(path.as_bytes())
                ),
            )),
        }
    }
}

/// What identifies a file version without reading it: device, inode, size, and both times to the
/// nanosecond. ctime changes with every write, also one that keeps the size and resets the mtime.
fn identity(st: &Stat) -> [u8; 56] {
    let mut key = [0u8; 56];
    for (i, v) in [
        st.st_dev,
        st.st_ino,
        st.st_size as u64,
        st.st_mtime as u64,
        st.st_mtime_nsec,
        st.st_ctime as u64,
        st.st_ctime_nsec,
    ]
    .into_iter()
    .enumerate()
    {
        key[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    key
}

const CACHE_MAGIC: &[u8; 16] = b"ferry outboard 1";

/// Outboards of file versions already hashed, in `$XDG_CACHE_HOME/ferry/share/`, keyed by the file's
/// identity, so a restarted share does not hash again what did not change.
#[derive(Debug, Clone)]
pub struct OutboardCache {
    dir: PathBuf,
}

impl OutboardCache {
    /// A cache in `dir` (created when first written).
    pub fn new(dir: PathBuf) -> Self {
        OutboardCache { dir }
    }

    fn entry_path(&self, st: &Stat) -> PathBuf {
        let key = blake3::derive_key("ferry 2026 share outboard cache v1", &identity(st));
        self.dir
            .join(key.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    /// The outboard of `file` as it is now: from the cache when its identity is known, else hashed (and
    /// stored when the file did not change while it was hashed). Returns whether it was hashed now.
    pub fn outboard(&self, file: &File) -> io::Result<(Outboard, bool)> {
        let before = rustix::fs::fstat(file.as_fd())?;
        let path = self.entry_path(&before);
        if let Some(ob) = Self::load(&path, before.st_size as u64) {
            return Ok((ob, false));
        }
        let size = before.st_size as u64;
        let reader = std::io::BufReader::with_capacity(1 << 20, ReadFrom { file, pos: 0 });
        let ob = Outboard::compute(reader, size)?;
        let after = rustix::fs::fstat(file.as_fd())?;
        if identity(&after) == identity(&before) {
            // Best effort: a cache that cannot be written only costs a rehash next time.
            let _ = self.store(&path, &ob);
        }
        Ok((ob, true))
    }

    fn load(path: &Path, size: u64) -> Option<Outboard> {
        let bytes = std::fs::read(path).ok()?;
        let body = bytes.strip_prefix(CACHE_MAGIC)?;
        let (head, rest) = body.split_at_checked(40)?;
        let stored = u64::from_le_bytes(head[..8].try_into().ok()?);
        let root: [u8; 32] = head[8..].try_into().ok()?;
        if stored != size {
            return None;
        }
        Outboard::from_parts(Version { size, root }, rest.to_vec())
    }

    fn store(&self, path: &Path, ob: &Outboard) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let temp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = File::create(&temp)?;
        let v = ob.version();
        f.write_all(CACHE_MAGIC)?;
        f.write_all(&v.size.to_le_bytes())?;
        f.write_all(&v.root)?;
        f.write_all(ob.as_bytes())?;
        std::fs::rename(&temp, path)
    }
}

/// Reads a shared `&File` from a position of its own (pread), leaving the file's offset alone.
struct ReadFrom<'a> {
    file: &'a File,
    pos: u64,
}

impl io::Read for ReadFrom<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn share() -> (ferry_testkit::TempDir, ShareRoot) {
        let t = ferry_testkit::temp_dir("ferry-share-");
        let d = t.path().join("share");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a.txt"), b"alpha").unwrap();
        std::fs::write(d.join("sub/b.txt"), b"beta").unwrap();
        std::fs::write(t.path().join("secret"), b"outside").unwrap();
        symlink("sub/b.txt", d.join("inside")).unwrap();
        symlink("../secret", d.join("out")).unwrap();
        symlink("/etc", d.join("abs")).unwrap();
        symlink("..", d.join("sub/up")).unwrap();
        symlink("../..", d.join("sub/up2")).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, d.join("fifo"), Mode::RUSR | Mode::WUSR).unwrap();
        let root = ShareRoot::open(&d).unwrap();
        (t, root)
    }

    fn p(s: &str) -> SharePath {
        SharePath::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn reads_stay_inside_the_share() {
        let (_t, root) = share();
        let mut s = String::new();
        io::Read::read_to_string(&mut root.open_file(&p("a.txt")).unwrap(), &mut s).unwrap();
        assert_eq!(s, "alpha");
        // A symlink that stays inside is followed.
        assert!(root.open_file(&p("inside")).is_ok());
        // `..` through a symlink that stays inside is inside.
        assert!(root.open_file(&p("sub/up/a.txt")).is_ok());
        // Out of the share: a relative symlink out, an absolute one, `..` past the share through a symlink.
        for escape in ["out", "abs/passwd", "sub/up2/secret"] {
            let got = root.open_file(&p(escape)).map(|_| ());
            assert_eq!(got.map_err(|e| e.0), Err(ErrorCode::UnsafePath), "{escape}");
        }
        // `..` itself never even parses.
        assert!(SharePath::new(b"sub/../../secret").is_err());
        // A FIFO is refused without hanging; a directory is the wrong kind.
        assert_eq!(
            root.open_file(&p("fifo")).unwrap_err().0,
            ErrorCode::UnsafePath
        );
        assert_eq!(
            root.open_file(&p("sub")).unwrap_err().0,
            ErrorCode::WrongKind
        );
        assert_eq!(
            root.open_file(&p("nope")).unwrap_err().0,
            ErrorCode::NotFound
        );
    }

    #[test]
    fn a_symlink_swapped_in_for_a_directory_leads_nowhere() {
        let (t, root) = share();
        let d = t.path().join("share");
        assert!(root.open_file(&p("sub/b.txt")).is_ok());
        std::fs::remove_dir_all(d.join("sub")).unwrap();
        symlink(t.path(), d.join("sub")).unwrap();
        std::fs::write(t.path().join("b.txt"), b"outside").unwrap();
        assert_eq!(
            root.open_file(&p("sub/b.txt")).unwrap_err().0,
            ErrorCode::UnsafePath
        );
        assert_eq!(
            root.list(&p("sub"), 0, 10).unwrap_err().0,
            ErrorCode::UnsafePath
        );
    }

    #[test]
    fn listings_are_paged_in_name_order_without_special_files() {
        let (_t, root) = share();
        let (first, next) = root.list(&SharePath::root(), 0, 3).unwrap();
        let names: Vec<_> = first
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        assert_eq!(names, ["a.txt", "abs", "inside"]);
        let (rest, end) = root.list(&SharePath::root(), next, 10).unwrap();
        let names: Vec<_> = rest
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        assert_eq!(names, ["out", "sub"], "the FIFO is left out");
        assert_eq!(end, END);
        let out = &rest[0];
        assert_eq!(
            (out.kind, out.target.as_slice()),
            (Kind::Symlink, &b"../secret"[..])
        );
        assert_eq!(root.stat(&p("a.txt")).unwrap().size, 5);
        assert_eq!(
            root.stat(&p("out")).unwrap().kind,
            Kind::Symlink,
            "described, not followed"
        );
        assert_eq!(root.stat(&SharePath::root()).unwrap().kind, Kind::Dir);
        assert_eq!(root.stat(&p("fifo")).unwrap_err().0, ErrorCode::UnsafePath);
    }

    #[test]
    fn outboards_are_cached_by_identity_and_a_change_rehashes() {
        let (t, root) = share();
        let cache = OutboardCache::new(t.path().join("cache"));
        let f = root.open_file(&p("a.txt")).unwrap();
        let (ob, hashed) = cache.outboard(&f).unwrap();
        assert!(hashed);
        assert_eq!(ob.version().root, *blake3::hash(b"alpha").as_bytes());
        let (again, hashed) = cache
            .outboard(&root.open_file(&p("a.txt")).unwrap())
            .unwrap();
        assert!(!hashed, "from the cache");
        assert_eq!(again.version(), ob.version());
        // Same size, new content: ctime moves, the cache entry no longer matches.
        std::fs::write(t.path().join("share/a.txt"), b"ALPHA").unwrap();
        let (changed, hashed) = cache
            .outboard(&root.open_file(&p("a.txt")).unwrap())
            .unwrap();
        assert!(hashed);
        assert_eq!(changed.version().root, *blake3::hash(b"ALPHA").as_bytes());
    }
}
