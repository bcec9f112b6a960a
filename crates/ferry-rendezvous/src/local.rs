//! Same-host rendezvous: a sender announces its port under the nameplate hash in a private directory, and a
//! receiver on the same host finds it there, with no multicast and no relay.
//!
//! The directory is `$XDG_RUNTIME_DIR/ferry/rendezvous`, or `/tmp/ferry-UID/rendezvous`, created mode 0700 and
//! refused if another user owns it. An entry only proposes an address; the PAKE still decides who the peer is.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::NameplateHash;

/// Largest entry we read.
const MAX_ENTRY: u64 = 256;

/// The same-host rendezvous directory, held open: every entry is created, read, linked and removed relative to
/// this descriptor, so once opened and checked the directory cannot be swapped for another one under us.
#[derive(Clone, Debug)]
pub struct LocalRegistry {
    dir: Arc<OwnedFd>,
    path: PathBuf,
}

/// A live announcement; the entry is removed when this is dropped.
#[derive(Debug)]
pub struct Announcement {
    dir: Arc<OwnedFd>,
    name: CString,
}

impl Drop for Announcement {
    fn drop(&mut self) {
        let _ = unlink_at(&self.dir, &self.name);
    }
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn not_private(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is not a private directory of this user ({why}); remove it or set XDG_RUNTIME_DIR",
            path.display()
        ),
    )
}

/// Checks a directory's own metadata: a real directory (no symlink), ours, and writable by nobody else; with
/// `private`, not readable or searchable by anybody else either.
fn check_dir(path: &Path, meta: &fs::Metadata, private: bool) -> io::Result<()> {
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(not_private(path, "not a directory"));
    }
    if meta.uid() != uid() {
        return Err(not_private(path, "owned by another user"));
    }
    let others = if private { 0o077 } else { 0o022 };
    if meta.mode() & others != 0 {
        return Err(not_private(
            path,
            &format!("mode {:03o}", meta.mode() & 0o777),
        ));
    }
    Ok(())
}

fn c_name(name: &str) -> CString {
    CString::new(name).expect("entry names are hex and digits")
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Opens `name` in `dir` (never through a symlink) with `flags`.
fn open_at(
    dir: &OwnedFd,
    name: &CString,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<File> {
    // SAFETY: `dir` is an open directory and `name` a NUL-terminated string; the new descriptor is owned by
    // the returned File.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn unlink_at(dir: &OwnedFd, name: &CString) -> io::Result<()> {
    // SAFETY: `dir` is an open directory and `name` a NUL-terminated string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
}

fn link_at(dir: &OwnedFd, from: &CString, to: &CString) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated and relative to the same open directory; flags 0 never follows.
    cvt(unsafe {
        libc::linkat(
            dir.as_raw_fd(),
            from.as_ptr(),
            dir.as_raw_fd(),
            to.as_ptr(),
            0,
        )
    })
    .map(drop)
}

impl LocalRegistry {
    /// The registry in its default place for this user.
    pub fn open_default() -> io::Result<Self> {
        let base = match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d).join("ferry"),
            _ => std::env::temp_dir().join(format!("ferry-{}", uid())),
        };
        Self::open(base.join("rendezvous"))
    }

    /// The registry in `dir`, created private if missing.
    ///
    /// `dir` must be a real directory of this user with no access for others, and its parent (which ferry may
    /// have created too, as `/tmp/ferry-UID`) one of this user's that nobody else can write; another user who
    /// pre-created either is refused. The directory is then opened once (`O_NOFOLLOW`) and checked again through
    /// the descriptor, and everything after works relative to that descriptor.
    pub fn open(dir: PathBuf) -> io::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            check_dir(parent, &fs::symlink_metadata(parent)?, false)?;
        }
        let c_path = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the registry path"))?;
        // SAFETY: `c_path` is NUL-terminated; the descriptor is owned by the OwnedFd below.
        let fd = cvt(unsafe {
            libc::open(
                c_path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let meta = File::from(fd.try_clone()?).metadata()?;
        check_dir(&dir, &meta, true)?;
        Ok(LocalRegistry {
            dir: Arc::new(fd),
            path: dir,
        })
    }

    /// Where the registry lives (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn entry(hash: &NameplateHash) -> CString {
        c_name(&hash.to_hex())
    }

    /// Announces `addr` under `hash`. Fails with `AlreadyExists` while another live sender holds the nameplate.
    pub fn announce(&self, hash: &NameplateHash, addr: SocketAddr) -> io::Result<Announcement> {
        let name = Self::entry(hash);
        // The entry is written whole under a private name, then linked into place: a reader never
        // sees half an entry (which another sender would take for a stale one), and the link fails
        // if the nameplate is taken, as an exclusive create would.
        let pid = std::process::id();
        let staged = c_name(&format!(".{}.{pid}", hash.to_hex()));
        let _ = unlink_at(&self.dir, &staged);
        let mut f = open_at(
            &self.dir,
            &staged,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )?;
        let written = f.write_all(format!("{addr}\n{pid}\n").as_bytes());
        drop(f);
        let result = written.and_then(|()| self.publish(&staged, &name));
        let _ = unlink_at(&self.dir, &staged);
        result.map(|()| Announcement {
            dir: Arc::clone(&self.dir),
            name,
        })
    }

    /// Links `staged` to `name`, taking over a stale entry once.
    fn publish(&self, staged: &CString, name: &CString) -> io::Result<()> {
        for _ in 0..2 {
            match link_at(&self.dir, staged, name) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if self.read_entry(name)?.is_some() {
                        return Err(e);
                    }
                    // A stale entry from a sender that died: take it over.
                    let _ = unlink_at(&self.dir, name);
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "nameplate in use",
        ))
    }

    /// True when a live sender on this host holds `hash`.
    pub fn is_taken(&self, hash: &NameplateHash) -> bool {
        matches!(self.lookup(hash), Ok(Some(_)))
    }

    /// The address a live sender announced under `hash`.
    pub fn lookup(&self, hash: &NameplateHash) -> io::Result<Option<SocketAddr>> {
        self.read_entry(&Self::entry(hash))
    }

    fn read_entry(&self, name: &CString) -> io::Result<Option<SocketAddr>> {
        // Non-blocking: a FIFO planted under the name must not hang the reader.
        let f = match open_at(&self.dir, name, libc::O_RDONLY | libc::O_NONBLOCK, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            // A symlink (ELOOP with O_NOFOLLOW) or anything else odd is no entry.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = f.metadata()?;
        if !meta.is_file() || meta.len() > MAX_ENTRY || meta.uid() != uid() {
            return Ok(None);
        }
        let mut text = String::new();
        if f.take(MAX_ENTRY).read_to_string(&mut text).is_err() {
            return Ok(None);
        }
        let mut lines = text.lines();
        let addr = lines.next().and_then(|l| l.parse::<SocketAddr>().ok());
        let pid = lines.next().and_then(|l| l.parse::<u32>().ok());
        Ok(match (addr, pid) {
            (Some(addr), Some(pid)) if process_alive(pid) => Some(addr),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn announce_lookup_and_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = LocalRegistry::open(tmp.path().join("r")).unwrap();
        let code: Code = "7-abandon-ability-able".parse().unwrap();
        let h = code.nameplate_hash();
        assert_eq!(reg.lookup(&h).unwrap(), None);
        let addr: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let ann = reg.announce(&h, addr).unwrap();
        assert_eq!(reg.lookup(&h).unwrap(), Some(addr));
        assert_eq!(
            reg.announce(&h, addr).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        // Only the entry itself is left: the staging file of each attempt is gone.
        let names: Vec<_> = fs::read_dir(reg.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![h.to_hex()]);
        assert_eq!(
            fs::read_to_string(reg.path().join(h.to_hex())).unwrap(),
            format!("{addr}\n{}\n", std::process::id())
        );
        drop(ann);
        assert_eq!(reg.lookup(&h).unwrap(), None);
    }

    #[test]
    fn stale_entries_are_ignored_and_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = LocalRegistry::open(tmp.path().join("r")).unwrap();
        let h = "9-abandon-ability-able"
            .parse::<Code>()
            .unwrap()
            .nameplate_hash();
        // A pid far above pid_max never exists.
        fs::write(reg.path().join(h.to_hex()), "127.0.0.1:1\n4294967295\n").unwrap();
        assert_eq!(reg.lookup(&h).unwrap(), None);
        let addr: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        let _ann = reg.announce(&h, addr).unwrap();
        assert_eq!(reg.lookup(&h).unwrap(), Some(addr));
    }

    #[test]
    fn a_directory_swapped_after_opening_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("r");
        let reg = LocalRegistry::open(path.clone()).unwrap();
        let code: Code = "12-abandon-ability-able".parse().unwrap();
        let h = code.nameplate_hash();
        // Another party moves our directory away and puts its own in its place, with an entry that points
        // the receiver at its address (its pid is alive: ours).
        fs::rename(&path, tmp.path().join("moved")).unwrap();
        fs::create_dir(&path).unwrap();
        fs::write(
            path.join(h.to_hex()),
            format!("127.0.0.1:6666\n{}\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(
            reg.lookup(&h).unwrap(),
            None,
            "the planted entry in the swapped-in directory is not read"
        );
        let addr: SocketAddr = "127.0.0.1:7777".parse().unwrap();
        let ann = reg.announce(&h, addr).unwrap();
        assert!(
            tmp.path().join("moved").join(h.to_hex()).exists(),
            "the announcement lands in the directory we opened"
        );
        assert_eq!(reg.lookup(&h).unwrap(), Some(addr));
        drop(ann);
        assert!(!tmp.path().join("moved").join(h.to_hex()).exists());
    }

    #[test]
    fn a_parent_others_can_write_or_a_shared_registry_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("ferry-0");
        fs::create_dir(&parent).unwrap();
        fs::set_permissions(&parent, fs::Permissions::from_mode(0o777)).unwrap();
        let err = LocalRegistry::open(parent.join("rendezvous")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");

        let dir = tmp.path().join("open-to-all");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let err = LocalRegistry::open(dir).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");

        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("link")).unwrap();
        assert!(LocalRegistry::open(tmp.path().join("link")).is_err());
    }

    #[test]
    fn a_parent_made_by_another_user_is_refused() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!(
                "SKIPPED local::a_parent_made_by_another_user_is_refused: needs root to chown"
            );
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("ferry-0");
        fs::create_dir(&parent).unwrap();
        std::os::unix::fs::chown(&parent, Some(4242), Some(4242)).unwrap();
        let err = LocalRegistry::open(parent.join("rendezvous")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("another user"), "{err}");
    }

    #[test]
    fn symlinked_or_special_entries_are_no_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = LocalRegistry::open(tmp.path().join("r")).unwrap();
        let a = "13-abandon-ability-able"
            .parse::<Code>()
            .unwrap()
            .nameplate_hash();
        let b = "14-abandon-ability-able"
            .parse::<Code>()
            .unwrap()
            .nameplate_hash();
        let target = tmp.path().join("elsewhere");
        fs::write(&target, format!("127.0.0.1:1\n{}\n", std::process::id())).unwrap();
        std::os::unix::fs::symlink(&target, reg.path().join(a.to_hex())).unwrap();
        assert_eq!(reg.lookup(&a).unwrap(), None);
        let fifo = CString::new(reg.path().join(b.to_hex()).as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(
            reg.lookup(&b).unwrap(),
            None,
            "a FIFO neither hangs nor counts"
        );
    }
}
