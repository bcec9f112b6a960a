//! Mounting and unmounting: a multithreaded FUSE session at the mount point, and an unmount that never
//! leaves a stale mount behind (a busy mount point is detached lazily: it goes as soon as the last user
//! leaves it).

use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use fuser::{Config, MountOption, Session, SessionACL};
use rustix::mount::{unmount as umount2, UnmountFlags};

use crate::fuse::ShareFs;
use crate::source::{Sink, Source};

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
pub struct Mounted<S: Source + Sink> {
    session: Session<ShareFs<S>>,
    mountpoint: PathBuf,
}

/// Mounts `fs` at `mountpoint` (read-only unless [`ShareFs::is_writable`]: then the kernel answers
/// writes `EROFS` itself), named `fsname` in the mount table.
pub fn mount<S: Source + Sink>(
    fs: ShareFs<S>,
    mountpoint: &Path,
    fsname: &str,
) -> io::Result<Mounted<S>> {
    let changes = fs.changes();
    let config = session_config(fsname, fs.is_writable());
    // The session needs the file system first; its notifier exists only afterwards.
    let session = Session::new(fs, mountpoint, &config)?;
    changes.set_notifier(session.notifier());
    Ok(Mounted {
        session,
        mountpoint: mountpoint.to_path_buf(),
    })
}

/// The session's settings: [`THREADS`] workers, each on its own `/dev/fuse` clone, only the owner let
/// in, named `fsname` in the mount table, read-only unless `writable`.
pub fn session_config(fsname: &str, writable: bool) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname.to_string()),
        MountOption::Subtype("ferry".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
    ];
    if !writable {
        config.mount_options.push(MountOption::RO);
    }
    config.acl = SessionACL::Owner;
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    config
}

/// Raises the readahead of the mount on `mountpoint` (absolute, as [`resolve`] gives it) on its BDI to
/// [`READ_AHEAD_KIB`] (best effort: it needs root); returns what was set. (The device comes from the
/// mount table: a stat of the mount point would wait for the daemon, which may serve nothing yet.)
pub fn raise_readahead(mountpoint: &Path) -> Option<u32> {
    let device = mounted_device(mountpoint)?;
    let bdi = format!("/sys/class/bdi/{device}/read_ahead_kb");
    std::fs::write(bdi, READ_AHEAD_KIB.to_string()).ok()?;
    Some(READ_AHEAD_KIB)
}

impl<S: Source + Sink> Mounted<S> {
    /// Raises the mount's readahead on its BDI (best effort: it needs root); returns what was set.
    pub fn raise_readahead(&self) -> Option<u32> {
        raise_readahead(&self.mountpoint)
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

/// Detaches `mountpoint` at once, busy or not (the last resort of a second Ctrl-C).
pub fn unmount_lazily(mountpoint: &Path) -> io::Result<()> {
    match umount2(mountpoint, UnmountFlags::DETACH) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::PERM) => fusermount(mountpoint, true).map(|_| ()),
        Err(e) => Err(e.into()),
    }
}

/// `mountpoint` as the mount table names it: absolute, its parent's symbolic links resolved (the last
/// component is not touched: a stat of a mount that is not served would wait).
pub fn resolve(mountpoint: &Path) -> io::Result<PathBuf> {
    let path = std::path::absolute(mountpoint)?;
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if name != ".." => Ok(parent.canonicalize()?.join(name)),
        _ => path.canonicalize(),
    }
}

/// Whether something is mounted on `mountpoint` (an absolute path), per `/proc/self/mountinfo`.
pub fn is_mounted(mountpoint: &Path) -> bool {
    mounted_on(mountpoint).is_some()
}

/// One mount of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Its mount ID: no other mount present has it (a device does not tell a bind mount from its source).
    pub id: u64,
    /// Where it is mounted.
    pub point: PathBuf,
    /// Its device, `MAJOR:MINOR`.
    pub device: String,
    /// Its file system type (`tmpfs`, `fuse`, `fuse.ferry`).
    pub fstype: String,
    /// Its source (a ferry mount's is `ferry:PEER:SHARE`).
    pub source: String,
    /// The user a FUSE mount is for (its `user_id` option).
    pub user_id: Option<u32>,
}

impl MountEntry {
    /// Whether [`mount`] made it: FUSE, named `ferry:PEER:SHARE`. (Its type is `fuse` when mounted with
    /// mount(2), which has no subtype, and `fuse.ferry` when fusermount3 mounted it.)
    pub fn is_ferry(&self) -> bool {
        matches!(self.fstype.as_str(), "fuse" | "fuse.ferry") && self.source.starts_with("ferry:")
    }
}

/// The mounts of `/proc/self/mountinfo`, in its order (a later mount on one point covers an earlier).
pub fn mount_table() -> Vec<MountEntry> {
    let Ok(table) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    table
        .split(|&b| b == b'\n')
        .filter_map(parse_mountinfo_line)
        .collect()
}

/// `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS`.
fn parse_mountinfo_line(line: &[u8]) -> Option<MountEntry> {
    let text = |b: &[u8]| String::from_utf8_lossy(&unescape(b)).into_owned();
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let dash = 6 + fields.get(6..)?.iter().position(|f| *f == b"-")?;
    let super_options = text(fields.get(dash + 3)?);
    let user_id = super_options
        .split(',')
        .find_map(|o| o.strip_prefix("user_id=")?.parse().ok());
    Some(MountEntry {
        id: text(fields.first()?).parse().ok()?,
        point: PathBuf::from(std::ffi::OsString::from_vec(unescape(fields.get(4)?))),
        device: text(fields.get(2)?),
        fstype: text(fields.get(dash + 1)?),
        source: text(fields.get(dash + 2)?),
        user_id,
    })
}

/// The last mount on `mountpoint` (absolute, not canonicalized: that would stat a mount not served yet):
/// the one an unmount there would unmount.
pub fn mounted_on(mountpoint: &Path) -> Option<MountEntry> {
    mount_table().into_iter().rfind(|m| m.point == mountpoint)
}

/// The device (`MAJOR:MINOR`) of the last mount on `mountpoint`.
fn mounted_device(mountpoint: &Path) -> Option<String> {
    mounted_on(mountpoint).map(|m| m.device)
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(super::unescape(b"/mnt/a\\040b\\134c"), b"/mnt/a b\\c");
        assert_eq!(super::unescape(b"/x\\0"), b"/x\\0");
    }

    #[test]
    fn a_mountinfo_line_gives_its_point_type_source_and_user() {
        let line = b"41 30 0:52 / /mnt/my\\040share rw,nosuid,nodev - fuse ferry:desk:default rw,user_id=1000,group_id=1000";
        let m = super::parse_mountinfo_line(line).unwrap();
        assert_eq!(m.id, 41);
        assert_eq!(m.point, std::path::Path::new("/mnt/my share"));
        assert_eq!((m.device.as_str(), m.fstype.as_str()), ("0:52", "fuse"));
        assert_eq!(
            (m.source.as_str(), m.user_id),
            ("ferry:desk:default", Some(1000))
        );
        assert!(m.is_ferry());
        // Optional fields before the separator; a tmpfs, even one named like a ferry mount, is not one.
        let tmpfs = b"50 30 0:60 / /t rw,relatime shared:7 master:1 - tmpfs ferry:x rw,size=1024k";
        let m = super::parse_mountinfo_line(tmpfs).unwrap();
        assert_eq!((m.fstype.as_str(), m.user_id), ("tmpfs", None));
        assert!(!m.is_ferry());
        let sshfs = b"51 30 0:61 / /s rw - fuse.sshfs me@host:/x rw,user_id=0,group_id=0";
        assert!(!super::parse_mountinfo_line(sshfs).unwrap().is_ferry());
        assert_eq!(super::parse_mountinfo_line(b""), None);
    }

    #[test]
    fn the_root_is_mounted_and_a_plain_directory_is_not() {
        assert!(super::is_mounted(std::path::Path::new("/")));
        let dir = std::env::temp_dir().join(format!("ferry-mount-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!super::is_mounted(&dir));
        std::fs::remove_dir(&dir).unwrap();
    }
}
