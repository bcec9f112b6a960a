//! Directory-relative file operations that never follow a symlink (`openat` and friends).
//!
//! The receiver opens the destination once and reaches everything below it one component at a
//! time with `O_NOFOLLOW | O_DIRECTORY`, so a symlink planted anywhere in the destination tree is
//! never traversed. This is the only module with `unsafe`: thin calls into libc.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What a name in a directory is, without following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else: a FIFO, a socket, a device.
    Other,
}

/// An open directory.
pub struct Dir {
    fd: OwnedFd,
}

/// Runs `f` with `name` as a NUL-terminated string on the stack (names are checked to hold no NUL).
fn with_cstr<T>(name: &[u8], f: impl FnOnce(&CStr) -> io::Result<T>) -> io::Result<T> {
    let mut buf = [0u8; 512];
    if name.len() >= buf.len() || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf[..name.len()].copy_from_slice(name);
    let c =
        CStr::from_bytes_until_nul(&buf).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    f(c)
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn timespec(sec: i64, nsec: u32) -> libc::timespec {
    libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec as libc::c_long,
    }
}

/// What lies at an offset of a file, as the file system reports it (`SEEK_DATA`/`SEEK_HOLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Data from the offset up to this end (the next hole, or the end of the file).
    Data(u64),
    /// A hole from the offset up to this end (the next data, or the end of the file).
    Hole(u64),
}

/// The region of `file` starting at `pos` (below its size). Leaves the file offset at `pos`.
/// A file system without `SEEK_DATA` reports everything as data.
pub fn region_at(file: &File, pos: u64) -> io::Result<Region> {
    let fd = file.as_raw_fd();
    let seek = |whence| {
        // SAFETY: lseek on a descriptor owned by `file`; no memory is passed.
        let ret = unsafe { libc::lseek(fd, pos as libc::off_t, whence) };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(ret as u64)
        }
    };
    let region = match seek(libc::SEEK_DATA) {
        Ok(data) if data > pos => Region::Hole(data),
        Ok(_) => Region::Data(seek(libc::SEEK_HOLE)?),
        // No data after `pos`: a hole up to the end (or the file shrank, which the caller sees).
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Region::Hole(u64::MAX),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Region::Data(u64::MAX),
        Err(e) => return Err(e),
    };
    seek(libc::SEEK_SET)?;
    Ok(region)
}

/// `statfs` magic of tmpfs (and of shmem-backed mounts such as /dev/shm).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Reserves `len` bytes of `file` from `offset` without changing its size (`fallocate` with
/// `FALLOC_FL_KEEP_SIZE`), so that a full disk shows now rather than after the data. Returns
/// `Ok(false)` when the file system cannot reserve (the write then finds out as before); only a
/// full disk or quota is an error.
///
/// On tmpfs a reservation is not metadata: it allocates and zeroes every page before the data
/// overwrites them (0.3 s of system time per GiB here, during which nothing is received). There
/// the free space is compared instead (one `fstatvfs`), which finds the same full disk as early.
pub fn reserve(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is owned by `file`; `fs` is writable.
    if unsafe { libc::fstatfs(fd, &mut fs) } == 0 && fs.f_type as i64 == TMPFS_MAGIC {
        // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        check(unsafe { libc::fstatvfs(fd, &mut st) })?;
        let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
        return match len > free {
            true => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            false => Ok(true),
        };
    }
    // SAFETY: fallocate on a descriptor owned by `file`; no memory is passed.
    let ret = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if ret == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Err(e),
        _ => Ok(false),
    }
}

/// Bytes an unprivileged user may still write on the file system of `dir` (`statvfs`:
/// available blocks times the fragment size).
pub fn free_space(dir: &Path) -> io::Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is writable.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The effective user, group and supplementary groups of this process: with a file's owner and
/// mode they tell, without a system call per file, whether it can be read.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The effective user id.
    pub uid: u32,
    /// The effective group id.
    pub gid: u32,
    /// The supplementary group ids.
    pub groups: Vec<u32>,
}

/// This process's effective ids ([`Credentials`]).
pub fn credentials() -> Credentials {
    // SAFETY: geteuid and getegid cannot fail and touch no memory of ours.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: with a count of 0, getgroups writes nothing and returns how many groups there are.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0; n.max(0) as usize];
    // SAFETY: `groups` has room for `groups.len()` gids.
    let got = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(got.max(0) as usize);
    Credentials { uid, gid, groups }
}

/// Whether this process may access `path` in `mode` (`libc::R_OK`, `X_OK`...) with its effective
/// ids, ACLs included; never follows a symlink at the end of `path` when `no_follow`.
pub fn may_access(path: &Path, mode: libc::c_int, no_follow: bool) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let flags = libc::AT_EACCESS
        | if no_follow {
            libc::AT_SYMLINK_NOFOLLOW
        } else {
            0
        };
    // SAFETY: `c` is a valid NUL-terminated path.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), mode, flags) == 0 }
}

/// Sets a file's access and modification times through its descriptor.
pub fn set_file_times(file: &File, sec: i64, nsec: u32) -> io::Result<()> {
    let times = [timespec(sec, nsec), timespec(sec, nsec)];
    // SAFETY: the fd is open for the lifetime of `file`; `times` points to two valid timespecs.
    check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) })?;
    Ok(())
}

/// A random number from the OS CSPRNG (getrandom(2)), for temporary names that nobody else can
/// choose.
pub fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: writes at most `buf.len() - got` bytes into the rest of `buf`, which we own.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "getrandom: {e}");
            continue;
        }
        got += n as usize;
    }
    u64::from_le_bytes(buf)
}

/// The process umask: from `/proc/self/status` (reading it there changes nothing, so no other
/// thread can be affected); without `/proc`, by setting 077 and putting the old mask back, so a
/// file another thread creates in between gets a stricter mode, never a looser one.
pub fn process_umask() -> u32 {
    let from_proc = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
            u32::from_str_radix(line.trim(), 8).ok()
        });
    from_proc.unwrap_or_else(|| {
        // SAFETY: umask(2) cannot fail; the old mask is restored at once.
        let old = unsafe { libc::umask(0o077) };
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        old as u32
    }) & 0o777
}

/// The effective user id of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

impl Dir {
    /// Opens the destination directory itself (following symlinks: the user chose it).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let mut bytes = path.as_os_str().as_bytes().to_vec();
        bytes.push(0);
        let c = CStr::from_bytes_with_nul(&bytes)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c` is a valid NUL-terminated string; the returned fd is checked and owned.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(Dir {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    fn openat(&self, name: &[u8], flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
        with_cstr(name, |c| {
            // SAFETY: valid dir fd and NUL-terminated name; the returned fd is checked and owned.
            let fd = check(unsafe {
                libc::openat(
                    self.raw(),
                    c.as_ptr(),
                    flags | libc::O_CLOEXEC,
                    mode as libc::c_uint,
                )
            })?;
            // SAFETY: `fd` was just opened and is owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
    }

    /// Opens a subdirectory; fails (ELOOP/ENOTDIR) if `name` is a symlink or not a directory.
    pub fn open_child(&self, name: &[u8]) -> io::Result<Dir> {
        let fd = self.openat(
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        Ok(Dir { fd })
    }

    /// Creates a subdirectory.
    pub fn mkdir(&self, name: &[u8], mode: u32) -> io::Result<()> {
        with_cstr(name, |c| {
            // SAFETY: valid dir fd and NUL-terminated name.
            check(unsafe { libc::mkdirat(self.raw(), c.as_ptr(), mode as libc::mode_t) })?;
            Ok(())
        })
    }

    /// What `name` is, without following a symlink; `None` if it does not exist.
    pub fn kind(&self, name: &[u8]) -> io::Result<Option<FileKind>> {
        Ok(self.kind_and_size(name)?.map(|(kind, _)| kind))
    }

    /// What `name` is and its size, without following a symlink; `None` if it does not exist.
    pub fn kind_and_size(&self, name: &[u8]) -> io::Result<Option<(FileKind, u64)>> {
        with_cstr(name, |c| {
            // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid dir fd, NUL-terminated name, and `st` is writable.
            let ret = unsafe {
                libc::fstatat(self.raw(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
            };
            if ret < 0 {
                let e = io::Error::last_os_error();
                return if e.raw_os_error() == Some(libc::ENOENT) {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
            let kind = match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => FileKind::File,
                libc::S_IFDIR => FileKind::Dir,
                libc::S_IFLNK => FileKind::Symlink,
                _ => FileKind::Other,
            };
            Ok(Some((kind, st.st_size as u64)))
        })
    }

    /// The target of symlink `name` (fails with EINVAL if `name` is not a symlink).
    pub fn readlink(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        // Offered targets are at most PATH_MAX bytes: a longer one differs anyway.
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        with_cstr(name, |c| {
            // SAFETY: valid dir fd, NUL-terminated name, `buf` is writable for its length.
            let n = unsafe {
                libc::readlinkat(self.raw(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            buf.truncate(n as usize);
            Ok(())
        })?;
        Ok(buf)
    }

    /// This directory's owner and permission bits.
    pub fn owner_and_mode(&self) -> io::Result<(u32, u32)> {
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd, and `st` is writable.
        check(unsafe { libc::fstat(self.raw(), &mut st) })?;
        Ok((st.st_uid, st.st_mode & 0o7777))
    }

    /// Sets this directory's own permission bits.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd.
        check(unsafe { libc::fchmod(self.raw(), mode as libc::mode_t) })?;
        Ok(())
    }

    /// Creates a new file for writing; fails if `name` exists (even as a dangling symlink).
    pub fn create_new(&self, name: &[u8], mode: u32) -> io::Result<File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        Ok(File::from(self.openat(
            name,
            flags,
            mode as libc::mode_t,
        )?))
    }

    /// Creates an unnamed regular file in this directory (`O_TMPFILE`), for writing; it gets a
    /// name only through [`Dir::link_unnamed`], so until then no crash can leave it behind.
    pub fn create_unnamed(&self, mode: u32) -> io::Result<File> {
        Ok(File::from(self.openat(
            b".",
            libc::O_WRONLY | libc::O_TMPFILE,
            mode as libc::mode_t,
        )?))
    }

    /// Gives the unnamed file `file` (from [`Dir::create_unnamed`]) the name `name` in this
    /// directory; fails with EEXIST rather than replace anything. Where the kernel refuses
    /// `AT_EMPTY_PATH` to this process (before Linux 6.10 without CAP_DAC_READ_SEARCH: ENOENT),
    /// links through `/proc/self/fd`, as open(2) documents for `O_TMPFILE`.
    pub fn link_unnamed(&self, file: &File, name: &[u8]) -> io::Result<()> {
        with_cstr(name, |c| {
            // SAFETY: valid fds, an empty and a NUL-terminated name.
            let ret = unsafe {
                libc::linkat(
                    file.as_raw_fd(),
                    c"".as_ptr(),
                    self.raw(),
                    c.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            };
            if ret == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EPERM)) {
                return Err(e);
            }
            let proc_path = format!("/proc/self/fd/{}\0", file.as_raw_fd());
            // SAFETY: NUL-terminated paths and a valid dir fd.
            check(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr().cast(),
                    self.raw(),
                    c.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })?;
            Ok(())
        })
    }

    /// Opens a file to send, non-blocking (a FIFO fails instead of hanging); when `no_follow`,
    /// never through a symlink.
    pub fn open_source(&self, name: &[u8], no_follow: bool) -> io::Result<File> {
        let follow = if no_follow { libc::O_NOFOLLOW } else { 0 };
        Ok(File::from(self.openat(
            name,
            libc::O_RDONLY | libc::O_NONBLOCK | follow,
            0,
        )?))
    }

    /// Opens an existing regular file (never through a symlink) for reading, or reading and writing.
    pub fn open_file(&self, name: &[u8], write: bool) -> io::Result<File> {
        let access = if write { libc::O_RDWR } else { libc::O_RDONLY };
        let file =
            File::from(self.openat(name, access | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0)?);
        if !file.metadata()?.is_file() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(file)
    }

    /// Renames `from` to `to` in this directory; without `replace`, fails with EEXIST rather
    /// than replace an existing `to`.
    pub fn rename(&self, from: &[u8], to: &[u8], replace: bool) -> io::Result<()> {
        with_cstr(from, |f| {
            with_cstr(to, |t| {
                let (d, fp, tp) = (self.raw(), f.as_ptr(), t.as_ptr());
                if replace {
                    // SAFETY: valid dir fd and NUL-terminated names.
                    check(unsafe { libc::renameat(d, fp, d, tp) })?;
                    return Ok(());
                }
                // SAFETY: valid dir fd and NUL-terminated names.
                let ret = unsafe { libc::renameat2(d, fp, d, tp, libc::RENAME_NOREPLACE) };
                if ret == 0 {
                    return Ok(());
                }
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
                // The file system has no RENAME_NOREPLACE: check, then rename (racy, best effort).
                if self.kind(to)?.is_some() {
                    return Err(io::Error::from_raw_os_error(libc::EEXIST));
                }
                // SAFETY: valid dir fd and NUL-terminated names.
                check(unsafe { libc::renameat(d, fp, d, tp) })?;
                Ok(())
            })
        })
    }

    /// Removes a non-directory entry (a symlink itself, never its target).
    pub fn unlink(&self, name: &[u8]) -> io::Result<()> {
        with_cstr(name, |c| {
            // SAFETY: valid dir fd and NUL-terminated name.
            check(unsafe { libc::unlinkat(self.raw(), c.as_ptr(), 0) })?;
            Ok(())
        })
    }

    /// Creates a symlink `name` pointing to `target`.
    pub fn symlink(&self, target: &[u8], name: &[u8]) -> io::Result<()> {
        let mut t = target.to_vec();
        t.push(0);
        let tc = CStr::from_bytes_with_nul(&t)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        with_cstr(name, |c| {
            // SAFETY: NUL-terminated target and name, valid dir fd.
            check(unsafe { libc::symlinkat(tc.as_ptr(), self.raw(), c.as_ptr()) })?;
            Ok(())
        })
    }

    /// Sets the times of `name` itself (a symlink is not followed).
    pub fn set_times(&self, name: &[u8], sec: i64, nsec: u32) -> io::Result<()> {
        let times = [timespec(sec, nsec), timespec(sec, nsec)];
        with_cstr(name, |c| {
            // SAFETY: valid dir fd, NUL-terminated name, two valid timespecs.
            check(unsafe {
                libc::utimensat(
                    self.raw(),
                    c.as_ptr(),
                    times.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
            Ok(())
        })
    }

    /// Sets this directory's own permission bits and times.
    pub fn set_mode_and_times(&self, mode: u32, sec: i64, nsec: u32) -> io::Result<()> {
        // SAFETY: valid fd.
        check(unsafe { libc::fchmod(self.raw(), mode as libc::mode_t) })?;
        let times = [timespec(sec, nsec), timespec(sec, nsec)];
        // SAFETY: valid fd, two valid timespecs.
        check(unsafe { libc::futimens(self.raw(), times.as_ptr()) })?;
        Ok(())
    }
}

/// The destination root plus the chain of open directories down to the last one entered, so that
/// consecutive entries of one directory cost no extra `openat`.
pub struct DirCursor {
    root: Dir,
    path: Vec<u8>,
    stack: Vec<(usize, Dir)>,
}

impl DirCursor {
    /// A cursor at `root`, with nothing entered yet.
    pub fn new(root: Dir) -> Self {
        DirCursor {
            root,
            path: Vec::new(),
            stack: Vec::new(),
        }
    }

    /// Opens `parent` (a checked wire path; empty for the root) one component at a time without
    /// following symlinks. `Ok(None)` if some component does not exist.
    pub fn enter(&mut self, parent: &[u8]) -> io::Result<Option<&Dir>> {
        while !self.stack.is_empty() && !is_component_prefix(&self.path, parent) {
            self.stack.pop();
            let end = self.stack.last().map_or(0, |(end, _)| *end);
            self.path.truncate(end);
        }
        if self.stack.is_empty() {
            self.path.clear();
        }
        let rest = &parent[self.path.len()..];
        let rest = rest.strip_prefix(b"/").unwrap_or(rest);
        if !rest.is_empty() {
            for comp in rest.split(|&b| b == b'/') {
                let top = self.stack.last().map_or(&self.root, |(_, d)| d);
                let dir = match top.open_child(comp) {
                    Ok(d) => d,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
                    Err(e) => return Err(e),
                };
                if !self.path.is_empty() {
                    self.path.push(b'/');
                }
                self.path.extend_from_slice(comp);
                self.stack.push((self.path.len(), dir));
            }
        }
        Ok(Some(self.stack.last().map_or(&self.root, |(_, d)| d)))
    }
}

/// Whether `prefix` is `path` or a chain of whole leading components of it.
pub fn is_component_prefix(prefix: &[u8], path: &[u8]) -> bool {
    path.starts_with(prefix) && (path.len() == prefix.len() || path[prefix.len()] == b'/')
}
