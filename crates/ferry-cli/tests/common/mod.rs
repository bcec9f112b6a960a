//! Shared helpers for the end-to-end tests: a private environment per test and real `ferry` processes.

#![allow(dead_code)]

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod mounting;
pub mod strangers;

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

    /// A `ferry` command of installation `who` (e.g. "a", "b"): its own config and cache directories
    /// (`config-WHO`, `cache-WHO`), this world's rendezvous directory.
    pub fn as_(&self, who: &str) -> Command {
        let mut c = self.cmd();
        c.env("XDG_CONFIG_HOME", self.path(&format!("config-{who}")))
            .env("XDG_CACHE_HOME", self.path(&format!("cache-{who}")));
        c
    }

    /// Starts `ferry pair --json extra...` at installation `who` and returns it with the code it printed.
    pub fn start_pairing(&self, who: &str, extra: &[&str]) -> (Watched, String) {
        let child = self
            .as_(who)
            .args(["pair", "--json"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry pair");
        let mut first = Watched::new(child);
        let code = first.wait_for(|e| e["event"] == "code")["code"]
            .as_str()
            .expect("a code")
            .to_string();
        (first, code)
    }

    /// Pairs installations `a` and `b` with real `ferry pair` processes: `a` names the other `b`, and `b`
    /// names the other `a`.
    pub fn pair(&self, a: &str, b: &str) {
        let (first, code) = self.start_pairing(a, &["--name", b]);
        let second = self
            .as_(b)
            .args(["pair", &code, "--json", "--name", a])
            .output()
            .expect("run ferry pair");
        assert_success(&format!("pairing at {b}"), &second);
        assert_success(&format!("pairing at {a}"), &first.finish());
    }

    /// Installation `who`'s identity as `ferry id --json` prints it: its fingerprint and its key in hex.
    pub fn identity(&self, who: &str) -> (String, String) {
        let out = self
            .as_(who)
            .args(["id", "--json"])
            .output()
            .expect("run ferry id");
        let v: Value = serde_json::from_slice(&out.stdout).expect("ferry id --json");
        (
            v["fingerprint"].as_str().expect("fingerprint").to_string(),
            v["key"].as_str().expect("key").to_string(),
        )
    }

    /// Installation `who`'s config directory (`config-WHO/ferry`), created private (0700) if missing.
    pub fn config_dir(&self, who: &str) -> PathBuf {
        let dir = self.path(&format!("config-{who}/ferry"));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .expect("mkdir config");
        dir
    }

    /// Gives `to` `from`'s peers (their keys and the secrets `from` shares with them, in the clear, as an
    /// unsealed `peers.toml` from before ferry sealed them): what a thief holds who learned the pair secrets
    /// but not `from`'s identity key.
    pub fn steal_peer_list(&self, from: &str, to: &str) {
        let store =
            ferry_peers::PeerStore::load(&self.config_dir(from)).expect("open from's peers");
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let mut text = String::new();
        for p in store.peers() {
            text += &format!(
                "[[peer]]\nname = \"{}\"\nkey = \"{}\"\nsecret = \"{}\"\npaired_at = {}\n",
                p.name,
                hex(&p.key),
                hex(&p.secret.0),
                p.paired_at
            );
        }
        let list = self.config_dir(to).join("peers.toml");
        fs::write(&list, text).expect("write peers.toml");
        fs::set_permissions(&list, fs::Permissions::from_mode(0o600)).expect("chmod peers.toml");
    }

    /// Copies `from`'s `peers.toml` as it is into `to`'s config (a backup, a dotfiles repository).
    pub fn copy_peer_list(&self, from: &str, to: &str) {
        let list = self.config_dir(from).join("peers.toml");
        fs::copy(list, self.config_dir(to).join("peers.toml")).expect("copy peers.toml");
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

/// Asserts two trees are identical (names, kinds, contents, permission bits, mtimes, symlink targets).
#[allow(unused_imports)]
pub use ferry_testkit::assert_same_tree;

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

/// A running `ferry` whose JSON events are read as they come; every stdout byte is kept. Dropped
/// before [`Watched::finish`] (a test that ends with a share still serving, or one that panics), the
/// process is killed, so no test leaves a `ferry` running after it.
pub struct Watched {
    /// `None` once finished.
    child: Option<Child>,
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
            child: Some(child),
            reader,
            stdout: Vec::new(),
            watchdog,
        }
    }

    /// The first event read so far (by an earlier wait) for which `stop` holds, else [`Watched::wait_for`].
    pub fn seen_or_wait_for(&mut self, mut stop: impl FnMut(&Value) -> bool) -> Value {
        match events(&self.stdout).into_iter().find(|v| stop(v)) {
            Some(v) => v,
            None => self.wait_for(stop),
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

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("not finished").id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = self.child.as_ref().expect("not finished").id();
        // SAFETY: kill(2) on our own child, which has not been waited for yet.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Reads the rest of the output and waits for the exit; `stdout` holds every line, also those
    /// [`Watched::wait_for`] read.
    pub fn finish(mut self) -> Output {
        let mut rest = Vec::new();
        let _ = self.reader.read_to_end(&mut rest);
        self.stdout.extend_from_slice(&rest);
        let child = self.child.take().expect("finished once");
        let mut out = child.wait_with_output().expect("wait for ferry");
        self.watchdog.ended();
        out.stdout = std::mem::take(&mut self.stdout);
        out
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.watchdog.ended();
        }
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

    /// Gives it another size (as `mount -o remount,size=`).
    pub fn resize(&self, size: &str) {
        self.remount(&format!("size={size}"));
    }

    /// Mounts it again with `options` (as `mount -o remount,OPTIONS`: `nr_inodes=N` bounds its files).
    pub fn remount(&self, options: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "remount the tmpfs at {} with {options}",
            self.dir.display()
        );
    }

    /// Inodes in use on it (files and directories).
    pub fn inodes_used(&self) -> u64 {
        let out = Command::new("stat")
            .args(["-f", "-c", "%c %d"])
            .arg(&self.dir)
            .output()
            .expect("stat -f");
        let text = String::from_utf8_lossy(&out.stdout);
        let n: Vec<u64> = text
            .split_whitespace()
            .map(|n| n.parse().expect("a count"))
            .collect();
        n[0] - n[1]
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
            .map(|a| shell_quote(&a))
            .collect();
        Pty::spawn_line(w, &quoted.join(" "))
    }

    /// Runs the shell command line `line` (`ferry`'s path: [`ferry`], quoted with [`shell_quote`]) at a
    /// pseudo-terminal.
    pub fn spawn_line(w: &World, line: &str) -> Pty {
        // The world's environment (`cmd()`), given to `script` and so to `ferry`.
        let cmd = w.cmd();
        let mut script = Command::new("script");
        script.args(["-qefc", line, "/dev/null"]);
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

/// `s` quoted for `sh`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
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

/// A TCP forwarder on 127.0.0.1 to `upstream` whose downstream direction (upstream to client) stops after
/// `limit` bytes in all until [`Valve::open`]: a link a test holds still mid-transfer. Held bytes stay in the
/// upstream socket, so the sending process blocks (real backpressure) and nothing is lost. Counts the bytes
/// forwarded downstream. Each connection is closed both ways when either side ends.
pub struct Valve {
    pub addr: std::net::SocketAddr,
    state: Arc<(Mutex<(u64, u64)>, std::sync::Condvar)>,
}

impl Valve {
    /// Forwards every connection to `upstream`, at most `limit` bytes downstream until opened.
    pub fn new(upstream: std::net::SocketAddr, limit: u64) -> Valve {
        use std::net::{Shutdown, TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the valve");
        let addr = listener.local_addr().unwrap();
        // (limit, forwarded), and a wake-up for a pump held at the limit.
        let state = Arc::new((Mutex::new((limit, 0u64)), std::sync::Condvar::new()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let close = |a: &TcpStream, b: &TcpStream| {
                    let _ = a.shutdown(Shutdown::Both);
                    let _ = b.shutdown(Shutdown::Both);
                };
                let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    close(&from, &to);
                });
                let shared = shared.clone();
                let (mut from, mut to) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let room = {
                            let (lock, wake) = &*shared;
                            let held = wake
                                .wait_while(lock.lock().unwrap(), |(limit, done)| done >= limit)
                                .unwrap();
                            (held.0 - held.1).min(buf.len() as u64) as usize
                        };
                        let n = match from.read(&mut buf[..room]) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        shared.0.lock().unwrap().1 += n as u64;
                    }
                    close(&from, &to);
                });
            }
        });
        Valve { addr, state }
    }

    /// Lets everything through from now on.
    pub fn open(&self) {
        self.state.0.lock().unwrap().0 = u64::MAX;
        self.state.1.notify_all();
    }

    /// Bytes forwarded downstream so far, over every connection.
    pub fn forwarded(&self) -> u64 {
        self.state.0.lock().unwrap().1
    }
}

impl Drop for Valve {
    fn drop(&mut self) {
        // A pump held at the limit reads on, finds its connection closed, and ends.
        self.open();
    }
}

impl World {
    /// `who` runs `ferry share --json SRC extra...`; returns it once ready, with its ready event.
    pub fn share(&self, who: &str, extra: &[&str]) -> (Watched, Value) {
        let child = self
            .as_(who)
            .args(["share", "--json"])
            .arg(self.src())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry share");
        let mut sharer = Watched::new(child);
        let ready = sharer.wait_for(|e| e["event"] == "ready");
        (sharer, ready)
    }

    /// `who` runs `ferry ls --json target extra...`.
    pub fn ls(&self, who: &str, target: &str, extra: &[&str]) -> Output {
        self.as_(who)
            .args(["ls", "--json", target])
            .args(extra)
            .output()
            .expect("run ferry ls")
    }
}

/// The `entry` events of a listing, by name.
pub fn entries(out: &Output) -> std::collections::BTreeMap<String, Value> {
    events(&out.stdout)
        .into_iter()
        .filter(|e| e["event"] == "entry")
        .map(|e| (e["name"].as_str().unwrap().to_string(), e))
        .collect()
}

/// The path (`direct`, `relay`) of each client a sharer's log says it served, in order.
pub fn connected_paths(log: &[Value]) -> Vec<Value> {
    log.iter()
        .filter(|e| e["event"] == "client-connected")
        .map(|e| e["path"].clone())
        .collect()
}

/// Stops a sharer with SIGTERM and returns its output (it exits 0).
pub fn stop_share(sharer: Watched) -> Output {
    sharer.signal(libc::SIGTERM);
    let out = sharer.finish();
    assert_success("the sharer stopped by SIGTERM", &out);
    out
}
