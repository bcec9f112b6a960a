//! Same-host rendezvous: a sender announces its port under the nameplate hash in a private directory, and a
//! receiver on the same host finds it there, with no multicast and no relay.
//!
//! The directory is `$XDG_RUNTIME_DIR/ferry/rendezvous`, or `/tmp/ferry-UID/rendezvous`, created mode 0700 and
//! refused if another user owns it. An entry only proposes an address; the PAKE still decides who the peer is.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::NameplateHash;

/// Largest entry we read.
const MAX_ENTRY: u64 = 256;

/// The same-host rendezvous directory.
#[derive(Clone, Debug)]
pub struct LocalRegistry {
    dir: PathBuf,
}

/// A live announcement; the entry is removed when this is dropped.
#[derive(Debug)]
pub struct Announcement {
    path: PathBuf,
}

impl Drop for Announcement {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
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
    pub fn open(dir: PathBuf) -> io::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        for d in [dir.parent(), Some(dir.as_path())].into_iter().flatten() {
            let meta = fs::symlink_metadata(d)?;
            if d == dir && (meta.file_type().is_symlink() || meta.uid() != uid()) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{} is not a private directory of this user", d.display()),
                ));
            }
        }
        Ok(LocalRegistry { dir })
    }

    fn entry(&self, hash: &NameplateHash) -> PathBuf {
        self.dir.join(hash.to_hex())
    }

    /// Announces `addr` under `hash`. Fails with `AlreadyExists` while another live sender holds the nameplate.
    pub fn announce(&self, hash: &NameplateHash, addr: SocketAddr) -> io::Result<Announcement> {
        let path = self.entry(hash);
        // The entry is written whole under a private name, then linked into place: a reader never
        // sees half an entry (which another sender would take for a stale one), and the link fails
        // if the nameplate is taken, as an exclusive create would.
        let pid = std::process::id();
        let staged = self.dir.join(format!(".{}.{pid}", hash.to_hex()));
        let _ = fs::remove_file(&staged);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&staged)?;
        let written = f.write_all(format!("{addr}\n{pid}\n").as_bytes());
        drop(f);
        let result = written.and_then(|()| self.publish(&staged, &path));
        let _ = fs::remove_file(&staged);
        result.map(|()| Announcement { path })
    }

    /// Links `staged` to `path`, taking over a stale entry once.
    fn publish(&self, staged: &Path, path: &Path) -> io::Result<()> {
        for _ in 0..2 {
            match fs::hard_link(staged, path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if self.read_entry(path)?.is_some() {
                        return Err(e);
                    }
                    // A stale entry from a sender that died: take it over.
                    let _ = fs::remove_file(path);
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
        self.read_entry(&self.entry(hash))
    }

    fn read_entry(&self, path: &Path) -> io::Result<Option<SocketAddr>> {
        let meta = match fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if !meta.is_file() || meta.len() > MAX_ENTRY {
            return Ok(None);
        }
        let text = fs::read_to_string(path)?;
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
        let names: Vec<_> = fs::read_dir(&reg.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![h.to_hex()]);
        assert_eq!(
            fs::read_to_string(reg.entry(&h)).unwrap(),
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
        fs::write(reg.entry(&h), "127.0.0.1:1\n4294967295\n").unwrap();
        assert_eq!(reg.lookup(&h).unwrap(), None);
        let addr: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        let _ann = reg.announce(&h, addr).unwrap();
        assert_eq!(reg.lookup(&h).unwrap(), Some(addr));
    }
}
