//! Mounting and unmounting: a multithreaded FUSE session at the mount point, and an unmount that never
//! leaves a stale mount behind (a busy mount point is detached lazily: it goes as soon as the last user
//! leaves it).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use fuser::{Config, MountOption, Session, SessionACL};
use rustix::mount::{unmount as umount2, UnmountFlags};

use crate::fuse::ShareFs;
use crate::source::Source;

/// Kernel requests served at once (each worker has its own `/dev/fuse` clone).
pub const THREADS: usize = 8;
/// The mount's readahead (KiB), set on its BDI after mounting: the kernel offers only 128 KiB at init.
pub const READ_AHEAD_KIB: u32 = 8 * 1024;

/// How the unmount went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmounted {
    /// Unmounted at once.
    Clean,
    /// The mount point was busy: detached now, gone when its last user leaves.
    Lazily,
}

/// A mounted share, not yet serving.
pub struct Mounted<S: Source> {
    session: Session<ShareFs<S>>,
    mountpoint: PathBuf,
}

/// Mounts `fs` at `mountpoint` (read-only: writes are answered `EROFS` by the kernel), named
/// `fsname` in the mount table.
pub fn mount<S: Source>(fs: ShareFs<S>, mountpoint: &Path, fsname: &str) -> io::Result<Mounted<S>> {
    let changes = fs.changes();
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname.to_string()),
        MountOption::Subtype("ferry".into()),
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
    ];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    // The session needs the file system first; its notifier exists only afterwards.
    let session = Session::new(fs, mountpoint, &config)?;
    changes.set_notifier(session.notifier());
    Ok(Mounted {
        session,
        mountpoint: mountpoint.to_path_buf(),
    })
}

impl<S: Source> Mounted<S> {
    /// Raises the mount's readahead on its BDI (best effort: it needs root); returns what was set.
    pub fn raise_readahead(&self) -> Option<u32> {
        let st = rustix::fs::stat(&self.mountpoint).ok()?;
        let dev = st.st_dev;
        let bdi = format!(
            "/sys/class/bdi/{}:{}/read_ahead_kb",
            rustix::fs::major(dev),
            rustix::fs::minor(dev)
        );
        std::fs::write(bdi, READ_AHEAD_KIB.to_string()).ok()?;
        Some(READ_AHEAD_KIB)
    }

    /// Serves the kernel's requests until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

/// Unmounts `mountpoint`; a busy one is detached lazily. Without the privilege to unmount, `fusermount3`
/// (or `fusermount`) does it.
pub fn unmount(mountpoint: &Path) -> io::Result<Unmounted> {
    match umount2(mountpoint, UnmountFlags::empty()) {
        Ok(()) => Ok(Unmounted::Clean),
        Err(rustix::io::Errno::BUSY) => {
            umount2(mountpoint, UnmountFlags::DETACH)?;
            Ok(Unmounted::Lazily)
        }
        Err(rustix::io::Errno::PERM) => {
            if fusermount(mountpoint, false)? {
                return Ok(Unmounted::Clean);
            }
            if fusermount(mountpoint, true)? {
                return Ok(Unmounted::Lazily);
            }
            Err(io::Error::other(format!(
                "fusermount3 could not unmount {}",
                mountpoint.display()
            )))
        }
        Err(e) => Err(e.into()),
    }
}

fn fusermount(mountpoint: &Path, lazy: bool) -> io::Result<bool> {
    let mut last = None;
    for bin in ["fusermount3", "fusermount"] {
        let mut c = Command::new(bin);
        c.arg(if lazy { "-uz" } else { "-u" })
            .arg("--")
            .arg(mountpoint);
        match c.output() {
            Ok(out) => return Ok(out.status.success()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried"))
}

/// Whether `mountpoint` is a mount whose daemon is gone (`ENOTCONN`): such a mount is unmounted before
/// mounting there again.
pub fn is_stale(mountpoint: &Path) -> bool {
    matches!(
        std::fs::metadata(mountpoint),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN)
    )
}
