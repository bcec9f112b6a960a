//! Shared helpers for the end-to-end tests: a private environment per test and real `ferry` processes.

#![allow(dead_code)]

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test.
pub fn ferry() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferry"))
}

/// A private world for one test: its own rendezvous directory, cache and data directories.
pub struct World {
    pub dir: tempfile::TempDir,
}

impl World {
    pub fn new() -> World {
        // tmpfs when available: the ext4 disk here is slow and erratic.
        let dir = match tempfile::Builder::new()
            .prefix("ferry-test-")
            .tempdir_in("/dev/shm")
        {
            Ok(d) => d,
            Err(_) => tempfile::tempdir().expect("temp dir"),
        };
        for sub in ["runtime", "cache", "src", "out"] {
            fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        fs::set_permissions(
            dir.path().join("runtime"),
            fs::Permissions::from_mode(0o700),
        )
        .expect("chmod");
        World { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn src(&self) -> PathBuf {
        self.path("src")
    }

    pub fn out(&self) -> PathBuf {
        self.path("out")
    }

    /// A `ferry` command in this world (no multicast, fast JSON progress).
    pub fn cmd(&self) -> Command {
        self.cmd_via(&[])
    }

    /// [`World::cmd`] run through `wrapper` (a command and its arguments, such as `setpriv ...`).
    pub fn cmd_via(&self, wrapper: &[&str]) -> Command {
        let mut c = match wrapper {
            [] => Command::new(ferry()),
            [program, args @ ..] => {
                let mut c = Command::new(program);
                c.args(args).arg(ferry());
                c
            }
        };
        c.env("XDG_RUNTIME_DIR", self.path("runtime"))
            .env("XDG_CACHE_HOME", self.path("cache"))
            .env("XDG_CONFIG_HOME", self.path("config"))
            .env_remove("FERRY_RELAY")
            .env("FERRY_NO_DISCOVERY", "1")
            .env("FERRY_PROGRESS_MS", "1")
            .stdin(Stdio::null());
        c
    }

    /// Starts `ferry send --json --code CODE PATHS...`.
    pub fn spawn_send<P: AsRef<Path>>(&self, code: &str, paths: &[P]) -> Child {
        self.cmd()
            .arg("send")
            .arg("--json")
            .arg("--code")
            .arg(code)
            .args(paths.iter().map(|p| p.as_ref()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry send")
    }

    /// Starts `ferry receive --json --yes CODE --out OUT`.
    pub fn spawn_receive(&self, code: &str, out: &Path) -> Child {
        self.spawn_receive_with(&["--json", "--yes"], code, out)
    }

    /// Starts `ferry receive ARGS... CODE --out OUT` (stdin not a terminal).
    pub fn spawn_receive_with(&self, args: &[&str], code: &str, out: &Path) -> Child {
        self.cmd()
            .arg("receive")
            .args(args)
            .arg(code)
            .arg("--out")
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry receive")
    }

    /// Sends `paths` with `code` and receives into `out`; returns both outputs.
    pub fn transfer<P: AsRef<Path>>(
        &self,
        code: &str,
        paths: &[P],
        out: &Path,
    ) -> (Output, Output) {
        self.transfer_with(code, paths, out, &[])
    }

    /// As [`World::transfer`], with `extra` arguments for `ferry receive`.
    pub fn transfer_with<P: AsRef<Path>>(
        &self,
        code: &str,
        paths: &[P],
        out: &Path,
        extra: &[&str],
    ) -> (Output, Output) {
        let send = finish_in_background(self.spawn_send(code, paths));
        let args: Vec<&str> = ["--json", "--yes"].iter().chain(extra).copied().collect();
        let recv = finish(self.spawn_receive_with(&args, code, out));
        (send.join().expect("send output"), recv)
    }
}

/// Longest a test lets one `ferry` process run before killing it (a hang must fail, not stall CI).
pub const PROCESS_DEADLINE: Duration = Duration::from_secs(120);

/// Kills a process with SIGKILL once it runs past [`PROCESS_DEADLINE`], unless told it ended.
struct Watchdog {
    ended: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(pid: libc::pid_t) -> Watchdog {
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + PROCESS_DEADLINE;
            while Instant::now() < deadline {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if !flag.load(Ordering::SeqCst) {
                eprintln!("killing ferry process {pid}: it ran past the test deadline");
                // SAFETY: kill(2) with a pid we spawned; at worst the process already exited.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        Watchdog { ended }
    }

    fn ended(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }
}

/// Collects a child's output (reading stdout and stderr while it runs), killing it after
/// [`PROCESS_DEADLINE`].
pub fn finish(child: Child) -> Output {
    let watchdog = Watchdog::start(child.id() as libc::pid_t);
    let out = child.wait_with_output().expect("wait for ferry");
    watchdog.ended();
    out
}

/// [`finish`] on another thread, so two processes' outputs are read at the same time.
pub fn finish_in_background(child: Child) -> std::thread::JoinHandle<Output> {
    std::thread::spawn(move || finish(child))
}

/// Parses JSON event lines.
pub fn events(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// The first event named `name`.
pub fn event<'a>(events: &'a [Value], name: &str) -> Option<&'a Value> {
    events.iter().find(|e| e["event"] == name)
}

/// Panics with both sides' output unless `out` succeeded.
pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads JSON events from a running child's stdout until `stop` returns true for one; returns the reader.
pub fn wait_for_event(
    stdout: ChildStdout,
    mut stop: impl FnMut(&Value) -> bool,
) -> BufReader<ChildStdout> {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).expect("read events");
        assert!(n > 0, "process ended before the awaited event");
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            if stop(&v) {
                return reader;
            }
        }
    }
}

/// Asserts two trees are identical: names, kinds, contents, permission bits, mtimes, symlink targets.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let ma = fs::symlink_metadata(a).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
    let mb = fs::symlink_metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display()));
    assert_eq!(ma.file_type(), mb.file_type(), "kind of {}", b.display());
    if ma.file_type().is_symlink() {
        assert_eq!(
            fs::read_link(a).unwrap(),
            fs::read_link(b).unwrap(),
            "target of {}",
            b.display()
        );
        return;
    }
    assert_eq!(
        ma.mode() & 0o7777,
        mb.mode() & 0o7777,
        "mode of {}",
        b.display()
    );
    assert_eq!(
        (ma.mtime(), ma.mtime_nsec()),
        (mb.mtime(), mb.mtime_nsec()),
        "mtime of {}",
        b.display()
    );
    if ma.is_file() {
        assert_eq!(ma.len(), mb.len(), "size of {}", b.display());
        assert!(
            fs::read(a).unwrap() == fs::read(b).unwrap(),
            "contents of {}",
            b.display()
        );
    } else if ma.is_dir() {
        let names = |p: &Path| {
            let mut v: Vec<_> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "entries of {}", b.display());
        for n in na {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), fast enough for hundreds of MiB.
#[allow(unused_imports)]
pub use ferry_testkit::pseudo_random;

/// Sets a file's mtime to a fixed past moment with nanoseconds, so preservation is visible.
pub fn set_mtime(path: &Path, secs: i64, nsec: i64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: secs,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: secs,
            tv_nsec: nsec,
        },
    ];
    // SAFETY: `c` is a valid NUL-terminated path and `times` has the two entries utimensat reads.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

/// Names of everything under `dir`, recursively (for "nothing was written" checks).
pub fn list_all(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd {
            let p = e.unwrap().path();
            out.push(p.clone());
            if p.is_dir() && !p.is_symlink() {
                out.extend(list_all(&p));
            }
        }
    }
    out
}

impl World {
    /// The same-host rendezvous directory `ferry` uses in this world (`$XDG_RUNTIME_DIR/ferry/rendezvous`).
    pub fn registry(&self) -> ferry_rendezvous::local::LocalRegistry {
        ferry_rendezvous::local::LocalRegistry::open(self.path("runtime/ferry/rendezvous"))
            .expect("open the rendezvous directory")
    }

    /// Announces `addr` under `code`'s nameplate, exactly as `ferry send` does; withdrawn on drop.
    pub fn announce(
        &self,
        code: &ferry_rendezvous::Code,
        addr: std::net::SocketAddr,
    ) -> ferry_rendezvous::local::Announcement {
        self.registry()
            .announce(&code.nameplate_hash(), addr)
            .expect("announce")
    }
}

/// Asserts that `out` failed with exit status `exit` and that its first `error` event carries `code`.
pub fn assert_failure(what: &str, out: &Output, exit: i32, code: &str) {
    let ev = events(&out.stdout);
    let got = event(&ev, "error").map(|e| e["code"].clone());
    assert!(
        out.status.code() == Some(exit) && got.as_ref().and_then(Value::as_str) == Some(code),
        "{what}: expected exit status {exit} with error code {code:?}, got {:?} and {got:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that every regular file or symlink under `dir` is either named in `complete` (relative
/// paths of files that were received completely and verified) or a temporary `ferry-part` name.
pub fn assert_only_verified_finals(dir: &Path, complete: &[&str]) {
    for p in list_all(dir) {
        let meta = fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            continue;
        }
        let rel = p.strip_prefix(dir).unwrap();
        let name = rel.file_name().unwrap().to_string_lossy();
        assert!(
            name.contains("ferry-part") || complete.iter().any(|c| Path::new(c) == rel),
            "{} is under a final name but was not completely received",
            p.display()
        );
    }
}

/// Temporary (`ferry-part`) files under `dir`.
pub fn partial_files(dir: &Path) -> Vec<PathBuf> {
    list_all(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("ferry-part"))
        .collect()
}

/// A finished process with its resource use.
pub struct Measured {
    pub output: Output,
    /// From spawn (roughly: from this call) to exit.
    pub elapsed: Duration,
    /// Peak resident memory of the process, in KiB (`ru_maxrss` from wait4).
    pub max_rss_kib: u64,
}

/// Like [`finish`], and also measures the process's run time and peak memory.
pub fn finish_measured(mut child: Child) -> Measured {
    use std::os::unix::process::ExitStatusExt;

    let started = Instant::now();
    let pid = child.id() as libc::pid_t;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let watchdog = Watchdog::start(pid);
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child with valid pointers to a status word and a rusage.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        assert_eq!(err.kind(), std::io::ErrorKind::Interrupted, "wait4: {err}");
    }
    watchdog.ended();
    let elapsed = started.elapsed();
    // The child is reaped; `child` must not be waited for again (dropping it does not wait).
    drop(child);
    Measured {
        output: Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        },
        elapsed,
        max_rss_kib: usage.ru_maxrss as u64,
    }
}

/// A running `ferry` whose JSON events are read as they come; every stdout byte is kept.
pub struct Watched {
    child: Child,
    reader: BufReader<ChildStdout>,
    stdout: Vec<u8>,
    watchdog: Watchdog,
}

impl Watched {
    /// Watches `child` (spawned with piped stdout and stderr), killing it after [`PROCESS_DEADLINE`].
    pub fn new(mut child: Child) -> Watched {
        let reader = BufReader::new(child.stdout.take().expect("piped stdout"));
        let watchdog = Watchdog::start(child.id() as libc::pid_t);
        Watched {
            child,
            reader,
            stdout: Vec::new(),
            watchdog,
        }
    }

    /// Reads events until `stop` holds for one and returns it; panics if the process ends first.
    pub fn wait_for(&mut self, mut stop: impl FnMut(&Value) -> bool) -> Value {
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).expect("read events");
            self.stdout.extend_from_slice(line.as_bytes());
            assert!(
                n > 0,
                "process ended before the awaited event; stdout so far:\n{}",
                String::from_utf8_lossy(&self.stdout)
            );
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if stop(&v) {
                    return v;
                }
            }
        }
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, which has not been waited for yet.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Reads the rest of the output and waits for the exit; `stdout` holds every line, also those
    /// [`Watched::wait_for`] read.
    pub fn finish(mut self) -> Output {
        let mut rest = Vec::new();
        let _ = self.reader.read_to_end(&mut rest);
        self.stdout.extend_from_slice(&rest);
        let mut out = self.child.wait_with_output().expect("wait for ferry");
        self.watchdog.ended();
        out.stdout = self.stdout;
        out
    }
}

/// A `ferry relay` child, killed on drop.
pub struct RelayProcess {
    pub child: Child,
    pub addr: std::net::SocketAddr,
}

impl RelayProcess {
    /// Spawns `cmd` (a prepared `ferry relay ...` command), reads the address from its banner, and keeps
    /// draining its stderr so it never blocks.
    pub fn spawn(mut cmd: Command) -> RelayProcess {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ferry relay");
        let mut lines = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        lines.read_line(&mut line).expect("relay banner");
        let Some(addr) = line.trim().rsplit(' ').next().and_then(|a| a.parse().ok()) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("unexpected relay banner {line:?}");
        };
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = lines.read_to_string(&mut sink);
        });
        RelayProcess { child, addr }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tmpfs mounted for one test, unmounted on drop.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=`) on `dir`, or says why it cannot.
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not running as root".into());
        }
        fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Skips a test whose tool or privilege this run lacks, loudly; with `CI` set that is a failure.
// Not every test file that includes this module skips anything.
#[allow(unused_imports)]
pub use ferry_testkit::skip;

/// A command running on a pseudo-terminal (util-linux `script`), its output collected as it comes.
pub struct Pty {
    child: Child,
    stdin: ChildStdin,
    output: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Pty {
    pub fn spawn(w: &World, args: &[&str]) -> Pty {
        let quoted: Vec<String> = std::iter::once(ferry().display().to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect();
        // The world's environment (`cmd()`), given to `script` and so to `ferry`.
        let cmd = w.cmd();
        let mut script = Command::new("script");
        script.args(["-qefc", &quoted.join(" "), "/dev/null"]);
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => script.env(k, v),
                None => script.env_remove(k),
            };
        }
        let mut child = script
            .env("TERM", "xterm")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("util-linux script");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&output);
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty {
            child,
            stdin,
            output,
            reader: Some(reader),
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until the output contains `what` (the process watchdog bounds the wait).
    pub fn wait_for(&self, what: &str) {
        let deadline = Instant::now() + PROCESS_DEADLINE;
        while !self.text().contains(what) {
            assert!(
                Instant::now() < deadline,
                "never saw {what:?}; got:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn type_keys(&mut self, keys: &[u8]) {
        self.stdin.write_all(keys).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the end; returns the exit status (script -e passes the command's on) and all output.
    pub fn finish(mut self) -> (Option<i32>, String) {
        let status = finish_status(&mut self.child);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.text())
    }
}

pub fn finish_status(child: &mut Child) -> Option<i32> {
    let deadline = Instant::now() + PROCESS_DEADLINE;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
