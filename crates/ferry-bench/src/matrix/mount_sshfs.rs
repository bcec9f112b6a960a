//! sshfs as the reference of `ferry bench mount`, in the same run: the sharer's folder mounted with sshfs
//! over ssh to 127.0.0.1 (the private sshd of [`crate::sftp`], AES-128-GCM as ferry's channel), the same
//! file read the same ways, and `tar x` of small files into it.
//!
//! sshfs runs with `-o kernel_cache` (its best case for the cached rows: the kernel keeps the pages it read
//! across opens); every uncached read is through a fresh sshfs mount, which starts with no pages.

use std::fs;
use std::io;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use ferry_mount::lifecycle;

use crate::sftp::Sshd;

const SSHFS: &str = "/usr/bin/sshfs";

/// Why sshfs cannot be a reference here, if it cannot.
pub fn sshfs_unavailable() -> Option<String> {
    (!FsPath::new(SSHFS).exists())
        .then(|| format!("{SSHFS} is not installed (apt-get install sshfs)"))
}

/// An sshfs mount of `remote` (a directory of this machine, through the sshd) on `mnt`: unmounted by
/// [`SshfsMount::unmount`], or on drop when a row fails first.
pub struct SshfsMount {
    mnt: PathBuf,
    /// The mount's ID in the mount table: what is unmounted is this mount, never what covers it.
    id: u64,
    unmounted: bool,
}

impl SshfsMount {
    /// Mounts `remote` on `mnt` through `sshd`.
    pub fn new(sshd: &Sshd, remote: &FsPath, mnt: &FsPath) -> io::Result<SshfsMount> {
        let ssh = format!("ssh {}", sshd.client_options().join(" "));
        let mut sshfs = Command::new(SSHFS);
        sshfs
            .arg(format!("{}:{}", sshd.login()?, remote.display()))
            .arg(mnt)
            .args(["-p", &sshd.addr().port().to_string()])
            .args(["-o", &format!("ssh_command={ssh}")])
            .args(["-o", "kernel_cache"]);
        SshfsMount::by(sshfs, mnt)
    }

    /// Runs `mounter` (sshfs, or a stand-in in a test), which returns once it has mounted a file system on
    /// `mnt` (an absolute path), and takes that mount. A mount point in use is refused: a second mount
    /// would cover the first, which then stays behind.
    pub fn by(mut mounter: Command, mnt: &FsPath) -> io::Result<SshfsMount> {
        super::refuse_if_ending()?;
        let mnt = lifecycle::resolve(mnt)?;
        if let Some(there) = lifecycle::mounted_on(&mnt) {
            return Err(io::Error::other(format!(
                "{} has a mount already ({} {})",
                mnt.display(),
                there.fstype,
                there.source
            )));
        }
        let out = mounter.stdin(Stdio::null()).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "sshfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let Some(mounted) = lifecycle::mounted_on(&mnt) else {
            return Err(io::Error::other(format!(
                "sshfs succeeded but nothing is mounted on {}",
                mnt.display()
            )));
        };
        Ok(SshfsMount {
            mnt,
            id: mounted.id,
            unmounted: false,
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &FsPath {
        &self.mnt
    }

    /// Unmounts it (lazily if busy) and checks that it is gone from the mount table.
    pub fn unmount(mut self) -> io::Result<()> {
        self.take_down()
    }

    fn take_down(&mut self) -> io::Result<()> {
        if std::mem::replace(&mut self.unmounted, true) {
            return Ok(());
        }
        let ours = |m: &lifecycle::MountEntry| m.id == self.id;
        match lifecycle::mounted_on(&self.mnt) {
            Some(top) if ours(&top) => {}
            // Gone already (its sshfs died and someone unmounted it): nothing of it is left.
            None if !lifecycle::mount_table().iter().any(ours) => return Ok(()),
            _ => {
                return Err(io::Error::other(format!(
                    "the sshfs mount on {} is covered by another mount: not unmounted",
                    self.mnt.display()
                )))
            }
        }
        // umount(2) itself, as ferry's mount does: not a `fusermount3` that PATH may lack.
        lifecycle::unmount(&self.mnt).map_err(|e| {
            io::Error::other(format!(
                "cannot unmount sshfs on {}: {e}",
                self.mnt.display()
            ))
        })?;
        if lifecycle::mount_table().iter().any(ours) {
            return Err(io::Error::other(format!(
                "sshfs on {} is still mounted after its unmount",
                self.mnt.display()
            )));
        }
        Ok(())
    }
}

impl Drop for SshfsMount {
    fn drop(&mut self) {
        if let Err(e) = self.take_down() {
            eprintln!("ferry bench: {e}");
        }
    }
}

/// Writes `count` small files (100 B to 8 KiB, 100 to a directory) under `dir`/tree and archives them into
/// `dir`/small.tar; returns the archive.
pub fn small_files_tarball(dir: &FsPath, count: usize) -> io::Result<PathBuf> {
    let tree = dir.join("tree");
    small_files(&tree, count)?;
    let tar = dir.join("small.tar");
    let status = Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()?;
    if !status.success() {
        return Err(io::Error::other("tar c of the small files failed"));
    }
    fs::remove_dir_all(&tree)?;
    Ok(tar)
}

/// Writes `count` small files (100 B to 8 KiB, 100 to a directory, the same every time) under `tree`.
pub fn small_files(tree: &FsPath, count: usize) -> io::Result<()> {
    let mut seed = 0x7461_7278u64;
    for i in 0..count {
        let sub = tree.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            fs::create_dir_all(&sub)?;
        }
        let len = 100 + (crate::report::xorshift(&mut seed) % 8092) as usize;
        let mut bytes = vec![0u8; len];
        crate::report::fill_random(&mut bytes, &mut seed);
        fs::write(sub.join(format!("f{i:05}")), bytes)?;
    }
    Ok(())
}

/// `tar c --sort=name` of `dir`/`name` into a pipe, read whole (GNU tar reads nothing for an archive on
/// /dev/null):
/// seconds until tar exits, and the archive's BLAKE3.
pub fn tar_c(dir: &FsPath, name: &str) -> io::Result<(f64, blake3::Hash)> {
    let t0 = Instant::now();
    // In name order: the archive does not depend on the order a file system lists a directory in.
    let mut child = Command::new("tar")
        .args(["c", "--sort=name"])
        .arg("-C")
        .arg(dir)
        .arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut hasher = blake3::Hasher::new();
    io::copy(child.stdout.as_mut().expect("piped"), &mut hasher)?;
    let status = child.wait()?;
    let secs = t0.elapsed().as_secs_f64();
    if !status.success() {
        return Err(io::Error::other(format!(
            "tar c of {} failed",
            dir.join(name).display()
        )));
    }
    Ok((secs, hasher.finalize()))
}

/// `tar x` of `tar` into a fresh directory `into` (inside a mount); seconds until tar exits. The files
/// are counted afterwards: all `count` must be there.
pub fn tar_x_seconds(tar: &FsPath, into: &FsPath, count: usize) -> io::Result<f64> {
    fs::create_dir_all(into)?;
    let t0 = Instant::now();
    let out = Command::new("tar")
        .arg("xf")
        .arg(tar)
        .arg("-C")
        .arg(into)
        .stdin(Stdio::null())
        .output()?;
    let secs = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "tar x failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut found = 0;
    for d in fs::read_dir(into)? {
        found += fs::read_dir(d?.path())?.count();
    }
    if found != count {
        return Err(io::Error::other(format!(
            "tar x left {found} of {count} files"
        )));
    }
    Ok(secs)
}

/// sshfs's figures on the bench's reads.
pub struct SshfsFigures {
    /// Uncached sequential read, GB/s.
    pub uncached: f64,
    /// Cached sequential read (its page cache), GB/s.
    pub cached: f64,
    /// Random 4 KiB reads per second, cold and cached.
    pub random_cold: f64,
    /// Random 4 KiB reads per second after a whole read.
    pub random_cached: f64,
    /// `tar x` of small files into the mount, files per second.
    pub tar_x_files_per_s: f64,
    /// `tar c` of the shared small files out of a fresh mount, files per second.
    pub tar_c_cold: f64,
    /// The same again through the same mount.
    pub tar_c_warm: f64,
}

/// What a reader of the file at a path measures: seconds of a whole sequential read, or random reads per
/// second (the bench's own readers, so that both mounts are read the same way).
pub struct Readers<'a> {
    /// Seconds of a whole read of the file.
    pub whole: &'a dyn Fn(&FsPath) -> io::Result<f64>,
    /// Random reads per second of the file, with a seed.
    pub random: &'a dyn Fn(&FsPath, u64) -> io::Result<f64>,
    /// The file's BLAKE3 matches the source's.
    pub check: &'a dyn Fn(&FsPath) -> io::Result<()>,
    /// Files per second of a `tar c` of the shared small files out of a mount at a path (the archive
    /// checked against the source's).
    pub tar_c: &'a dyn Fn(&FsPath) -> io::Result<f64>,
}

/// sshfs's rows' figures: `src_dir`/`name` (`gb` GB) read through fresh sshfs mounts `runs` times, and
/// `tar_files` small files unpacked into one; scratch under `base`.
pub fn sshfs_figures(
    base: &FsPath,
    src_dir: &FsPath,
    name: &str,
    gb: f64,
    runs: usize,
    tar_files: usize,
    readers: &Readers<'_>,
) -> io::Result<SshfsFigures> {
    if let Some(why) = sshfs_unavailable() {
        return Err(io::Error::other(why));
    }
    let sshd = Sshd::start(base)?;
    let mnt = base.join("sshfs-mnt");
    let _ = fs::create_dir_all(&mnt);
    let (mut uncached, mut cached, mut cold, mut warm) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut tar_cold, mut tar_warm) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let m = SshfsMount::new(&sshd, src_dir, &mnt)?;
        let file = m.path().join(name);
        uncached.push(gb / (readers.whole)(&file)?);
        cached.push(gb / (readers.whole)(&file)?);
        (readers.check)(&file)?;
        m.unmount()?;
        let m = SshfsMount::new(&sshd, src_dir, &mnt)?;
        let file = m.path().join(name);
        cold.push((readers.random)(&file, run as u64)?);
        (readers.whole)(&file)?;
        warm.push((readers.random)(&file, run as u64 + 100)?);
        m.unmount()?;
        let m = SshfsMount::new(&sshd, src_dir, &mnt)?;
        tar_cold.push((readers.tar_c)(m.path())?);
        tar_warm.push((readers.tar_c)(m.path())?);
        m.unmount()?;
    }
    // Small files into the sharer's side through the mount: a scratch directory of its own.
    let tar_dir = base.join("sshfs-tar");
    let _ = fs::remove_dir_all(&tar_dir);
    fs::create_dir_all(&tar_dir)?;
    let tar = small_files_tarball(&tar_dir, tar_files)?;
    let target = tar_dir.join("target");
    fs::create_dir_all(&target)?;
    let m = SshfsMount::new(&sshd, &target, &mnt)?;
    let secs = tar_x_seconds(&tar, &m.path().join("x"), tar_files)?;
    m.unmount()?;
    let _ = fs::remove_dir_all(&tar_dir);
    let median = |v: &mut Vec<f64>| crate::report::median(v);
    Ok(SshfsFigures {
        uncached: median(&mut uncached),
        cached: median(&mut cached),
        random_cold: median(&mut cold),
        random_cached: median(&mut warm),
        tar_x_files_per_s: tar_files as f64 / secs,
        tar_c_cold: median(&mut tar_cold),
        tar_c_warm: median(&mut tar_warm),
    })
}
