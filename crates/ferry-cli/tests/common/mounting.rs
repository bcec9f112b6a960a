//! Helpers for the tests that mount with `ferry mount` (mount.rs, mount_writes.rs): whether FUSE is usable
//! here, a mount that always unmounts, a sharer started for it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Watched, World};

/// Whether FUSE mounts can be made here; prints why not (and fails in CI) otherwise.
pub fn fuse_usable(test: &str) -> bool {
    if !Path::new("/dev/fuse").exists() {
        ferry_testkit::skip(test, "no /dev/fuse");
        return false;
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        ferry_testkit::skip(test, "not root (the tests mount with mount(2))");
        return false;
    }
    true
}

/// Whether `program` runs here; prints why not (and fails in CI) otherwise.
pub fn have(test: &str, program: &str) -> bool {
    let ok = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        ferry_testkit::skip(test, &format!("{program} is not installed"));
    }
    ok
}

/// A running `ferry mount` of `a`'s share at `b`; dropping it unmounts (SIGTERM, then lazily if needed).
pub struct Mounted {
    pub process: Option<Watched>,
    pub dir: PathBuf,
    /// The mount's cache directory, as its `mounted` event names it.
    pub cache: PathBuf,
}

impl Mounted {
    pub fn start(w: &World, extra: &[&str]) -> Mounted {
        Mounted::start_as(w, "b", "mnt", extra)
    }

    /// `who`'s mount of `a`'s share at the world's `dir`.
    pub fn start_as(w: &World, who: &str, dir: &str, extra: &[&str]) -> Mounted {
        let dir = w.path(dir);
        fs::create_dir_all(&dir).unwrap();
        let child = w
            .as_(who)
            .args(["mount", "--json", "a"])
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ferry mount");
        let mut process = Watched::new(child);
        let mounted = process.wait_for(|e| e["event"] == "mounted");
        Mounted {
            process: Some(process),
            dir,
            cache: PathBuf::from(mounted["cache"].as_str().unwrap_or_default()),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// The mount's stats line (SIGUSR1), as counters by name.
    pub fn stats(&mut self) -> std::collections::HashMap<String, u64> {
        let p = self.process.as_mut().unwrap();
        p.signal(libc::SIGUSR1);
        let e = p.wait_for(|e| e["event"] == "stats");
        let line = e["line"].as_str().unwrap().to_string();
        let words: Vec<&str> = line.split_whitespace().collect();
        words
            .chunks(2)
            .map(|kv| (kv[0].to_string(), kv[1].parse().unwrap()))
            .collect()
    }

    /// Waits for an event of the mount (a link lost or back).
    pub fn wait_for(&mut self, stop: impl FnMut(&Value) -> bool) -> Value {
        self.process.as_mut().unwrap().wait_for(stop)
    }

    /// An event the mount gave since it started (also one an earlier wait read past), or the next one.
    pub fn seen_or_wait_for(&mut self, stop: impl FnMut(&Value) -> bool) -> Value {
        self.process.as_mut().unwrap().seen_or_wait_for(stop)
    }

    /// Unmounts with SIGTERM and returns the process's output.
    pub fn stop(mut self) -> std::process::Output {
        let p = self.process.take().unwrap();
        p.signal(libc::SIGTERM);
        p.finish()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(p) = self.process.take() {
            p.signal(libc::SIGTERM);
            // A mount that cannot stop (a request it never answers: the syscall holds a kernel lock that
            // one of its threads waits for, which no signal frees) is aborted, so a test that found a hang
            // fails instead of hanging.
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (flag, dir, pid) = (done.clone(), self.dir.clone(), p.pid());
            std::thread::spawn(move || {
                let until = Instant::now() + STOP_DEADLINE;
                while Instant::now() < until {
                    if flag.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                eprintln!("the mount at {} did not stop: aborting it", dir.display());
                abort_connection(&dir);
                // SAFETY: kill(2) of our child, which `finish` has not reaped: it is still running.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            });
            let out = p.finish();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            // A test that failed shows what its mount said (why a request failed, the link's state).
            if std::thread::panicking() {
                eprintln!(
                    "the mount at {} said:\n{}",
                    self.dir.display(),
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
        // Whatever happened, no mount stays behind.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
    }
}

/// How long a mount may take to stop when a test ends before it is aborted.
const STOP_DEADLINE: Duration = Duration::from_secs(20);

/// Aborts the FUSE connection of the mount at `dir` through fusectl (mounted first if it is not): its
/// requests fail with ENOTCONN, which frees whatever waited for them. Reads only /proc and /sys: a `stat`
/// of a hung mount would hang too.
pub fn abort_connection(dir: &Path) {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let conns = Path::new("/sys/fs/fuse/connections");
    for line in info.lines() {
        // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ...
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 || Path::new(f[4]) != dir {
            continue;
        }
        let Some((major, minor)) = f[2].split_once(':') else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>()) else {
            continue;
        };
        if fs::read_dir(conns).map_or(true, |mut d| d.next().is_none()) {
            let _ = Command::new("mount")
                .args(["-t", "fusectl", "fusectl"])
                .arg(conns)
                .status();
        }
        // The connection is named by the kernel's device number of the mount.
        let conn = conns.join(((major << 20) | minor).to_string());
        let _ = fs::write(conn.join("abort"), "1");
    }
}

/// Pairs `a` and `b`, and starts `a`'s share of the world's source.
pub fn sharing(w: &World) -> Watched {
    sharing_with(w, &[])
}

/// Pairs `a` and `b`, and starts `a`'s share of the world's source with `extra` arguments (`--writable`).
pub fn sharing_with(w: &World, extra: &[&str]) -> Watched {
    w.pair("a", "b");
    w.share("a", extra).0
}

/// Waits until `check` holds (the mount sees a change made on the sharer); fails after 20 s.
pub fn eventually(what: &str, check: impl FnMut() -> bool) {
    eventually_within(what, 20, check);
}

/// [`eventually`] with a bound of `secs` seconds.
pub fn eventually_within(what: &str, secs: u64, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < until, "{what}: not seen within {secs} s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `statvfs(2)` of `path`: (fragment size, blocks, free blocks, available blocks, files), or its errno.
pub fn statvfs(path: &Path) -> Result<(u64, u64, u64, u64, u64), i32> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` is writable, both live for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok((
        st.f_frsize as u64,
        st.f_blocks as u64,
        st.f_bfree as u64,
        st.f_bavail as u64,
        st.f_files as u64,
    ))
}

/// A directory to give as PATH: a symbolic link to each program of this PATH but `without`, as on a machine
/// where those are not installed.
pub fn path_without(without: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("ferry-path-")
        .tempdir()
        .unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    for from in std::env::split_paths(&path) {
        let Ok(entries) = fs::read_dir(&from) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let link = dir.path().join(&name);
            // The first of a name on PATH wins, as it does for a shell.
            if without.iter().any(|w| name == *w) || link.symlink_metadata().is_ok() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), link);
        }
    }
    dir
}
