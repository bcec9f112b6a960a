//! `ferry bench transfer`: the whole `ferry send` / `ferry receive` path against plaintext baselines.
//!
//! Data lives on tmpfs (`/dev/shm`) so the disk does not blur the figures.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::report::{
    fill_random, gbps, median, thread_cpu, timeval_secs, vm_hwm_kib, write_random_file, Report, Row,
};

const BENCH: &str = "transfer";

/// What to run and how big.
#[derive(Clone, Debug)]
pub struct Options {
    /// Samples per case (medians are reported).
    pub runs: usize,
    /// Size of the large file.
    pub file_bytes: u64,
    /// Number of small files (4-8 KiB, in 100 directories).
    pub small_files: usize,
    /// Size of the file for the memory case (a sparse file: it costs no memory to read).
    pub rss_file_bytes: u64,
    /// Number of files for the memory case.
    pub rss_files: usize,
    /// Where the data goes (a tmpfs).
    pub scratch: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            runs: 5,
            file_bytes: 1 << 30,
            small_files: 10_000,
            rss_file_bytes: 10 << 30,
            rss_files: 100_000,
            scratch: PathBuf::from("/dev/shm"),
        }
    }
}

impl Options {
    /// A short smoke run.
    pub fn quick() -> Self {
        Options {
            runs: 1,
            file_bytes: 64 << 20,
            small_files: 1_000,
            rss_file_bytes: 256 << 20,
            rss_files: 2_000,
            ..Options::default()
        }
    }
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(base: &Path, name: &str) -> std::io::Result<Scratch> {
        let dir = base.join(format!("ferry-bench-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for sub in ["runtime", "cache", "src", "out"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        Ok(Scratch(dir))
    }

    fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }

    fn clear_out(&self) -> std::io::Result<()> {
        let out = self.join("out");
        fs::remove_dir_all(&out)?;
        fs::create_dir_all(&out)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `count` files of 4-8 KiB spread over 100 directories under `root`.
pub(crate) fn write_small_tree(root: &Path, count: usize) -> std::io::Result<u64> {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut buf = vec![0u8; 8192];
    let mut total = 0;
    for i in 0..count {
        let dir = root.join(format!("d{:03}", i % 100));
        if i < 100 {
            fs::create_dir_all(&dir)?;
        }
        fill_random(&mut buf, &mut seed);
        let len = 4096 + (seed % 4097) as usize;
        fs::write(dir.join(format!("f{i:06}")), &buf[..len])?;
        total += len as u64;
    }
    Ok(total)
}

/// What one `ferry send` + `ferry receive` run took.
struct CliRun {
    /// Seconds from the sender's start to the receiver's exit.
    secs: f64,
    /// Peak RSS of each side, KiB.
    send_rss: u64,
    recv_rss: u64,
    /// CPU seconds (user + system, all threads) of each side.
    send_cpu: f64,
    recv_cpu: f64,
}

/// Waits for `child` with wait4(2): whether it exited with 0, and its CPU seconds (user + system).
fn wait_with_cpu(child: std::process::Child) -> std::io::Result<(bool, f64)> {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our unreaped child (the `Child` is consumed, so nobody else waits for it);
        // `status` and `ru` are writable.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, timeval_secs(ru.ru_utime) + timeval_secs(ru.ru_stime)))
}

/// When the clock starts in [`cli_run`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Both commands start together; the clock starts with the sender (its start-up and walk count).
    Together,
    /// The receiver starts once the sender has printed its code, as when a person types it: the
    /// clock starts with the receiver.
    AfterCode,
}

/// One `ferry send` + `ferry receive` run; `secs` runs from the [`Start`] to the receiver's exit.
fn cli_run(
    ferry: &Path,
    s: &Scratch,
    paths: &[PathBuf],
    nameplate: u32,
    when: Start,
) -> std::io::Result<CliRun> {
    let code = format!("{nameplate}-apple-orbit-violin");
    let cmd = |args: &[&str]| {
        let mut c = Command::new(ferry);
        c.args(args)
            .env("XDG_RUNTIME_DIR", s.join("runtime"))
            .env("XDG_CACHE_HOME", s.join("cache"))
            // No relay or other setting from the user's config file: loopback only.
            .env("XDG_CONFIG_HOME", s.join("config"))
            .env_remove("FERRY_RELAY")
            .env("FERRY_NO_DISCOVERY", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let mut start = Instant::now();
    let mut send = cmd(&["send", "--code", &code]);
    if when == Start::AfterCode {
        // Text mode, as a person runs it: the line telling what to run on the other side.
        send.stderr(Stdio::piped());
    }
    send.args(paths);
    let mut send = send.spawn()?;
    let send_hwm = watch_peak_rss(send.id());
    if let Some(err) = send.stderr.take() {
        let mut lines = std::io::BufReader::new(err);
        let mut line = String::new();
        while !line.contains("ferry receive") {
            line.clear();
            if std::io::BufRead::read_line(&mut lines, &mut line)? == 0 {
                return Err(std::io::Error::other("ferry send ended before its code"));
            }
        }
        // The rest is drained, so the sender never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
        start = Instant::now();
    }
    let out = s.join("out");
    let recv = cmd(&[
        "receive",
        &code,
        "--yes",
        "--out",
        out.to_str().expect("utf-8 scratch path"),
    ])
    .spawn()?;
    let recv_hwm = watch_peak_rss(recv.id());
    let (recv_ok, recv_cpu) = wait_with_cpu(recv)?;
    let secs = start.elapsed().as_secs_f64();
    let (send_ok, send_cpu) = wait_with_cpu(send)?;
    if !(recv_ok && send_ok) {
        return Err(std::io::Error::other(
            "ferry send/receive failed during the benchmark",
        ));
    }
    let (send_rss, recv_rss) = (send_hwm.join().unwrap_or(0), recv_hwm.join().unwrap_or(0));
    Ok(CliRun {
        secs,
        send_rss,
        recv_rss,
        send_cpu,
        recv_cpu,
    })
}

/// Follows a child's peak RSS (`VmHWM` in /proc/PID/status, KiB) until it exits.
///
/// Not wait4's `ru_maxrss`: a child started with vfork/posix_spawn inherits the parent's high-water
/// mark across exec, which would report this benchmark's own memory for both sides.
fn watch_peak_rss(pid: u32) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        loop {
            match vm_hwm_kib(pid) {
                Some(v) => peak = peak.max(v),
                // Gone, or a zombie (no memory lines any more): the peak is final.
                None => return peak,
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    })
}

/// The plaintext baseline: the same file copied file → TCP → file over loopback by two threads with 1 MiB
/// buffers and no encryption or hashing (what the fastest plaintext tools do). Returns seconds and the CPU
/// seconds of both threads.
fn plain_copy(src: &Path, dst: &Path) -> std::io::Result<(f64, f64)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let src = src.to_path_buf();
    let start = Instant::now();
    let sender = std::thread::spawn(move || -> std::io::Result<f64> {
        let cpu = thread_cpu();
        let mut sock = TcpStream::connect(addr)?;
        let mut f = fs::File::open(src)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(thread_cpu() - cpu);
            }
            sock.write_all(&buf[..n])?;
        }
    });
    let cpu = thread_cpu();
    let (mut sock, _) = listener.accept()?;
    let mut out = fs::File::create(dst)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = sock.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
    }
    let recv_cpu = thread_cpu() - cpu;
    let send_cpu = sender.join().expect("copy thread")?;
    Ok((start.elapsed().as_secs_f64(), send_cpu + recv_cpu))
}

pub(crate) fn size_name(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// Runs every transfer case; `ferry` is the binary to measure (normally the running one).
pub fn run(opts: &Options, ferry: &Path, report: &mut Report) -> std::io::Result<()> {
    large_file(opts, ferry, report)?;
    small_files(opts, ferry, report)?;
    // The receiver's file creation alone: unnamed vs renamed files, and (with `uring`) io_uring.
    crate::create::run(opts.small_files, opts.runs, &opts.scratch, report)?;
    pipeline(opts, report)?;
    memory(opts, ferry, report)?;
    Ok(())
}

fn large_file(opts: &Options, ferry: &Path, report: &mut Report) -> std::io::Result<()> {
    let s = Scratch::new(&opts.scratch, "large")?;
    let src = s.join("src/big.bin");
    write_random_file(&src, opts.file_bytes, 0x5eed)?;
    let (mut plain, mut cli) = (Vec::new(), Vec::new());
    let (mut plain_cpu, mut send_cpu, mut recv_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let gib = opts.file_bytes as f64 / (1u64 << 30) as f64;
    for i in 0..opts.runs {
        s.clear_out()?;
        let (t, cpu) = plain_copy(&src, &s.join("out/copy.bin"))?;
        plain.push(opts.file_bytes as f64 / t / 1e9);
        plain_cpu.push(cpu / gib);
        s.clear_out()?;
        let run = cli_run(
            ferry,
            &s,
            std::slice::from_ref(&src),
            100 + i as u32,
            Start::Together,
        )?;
        cli.push(opts.file_bytes as f64 / run.secs / 1e9);
        send_cpu.push(run.send_cpu / gib);
        recv_cpu.push(run.recv_cpu / gib);
    }
    let (plain, cli) = (median(&mut plain), median(&mut cli));
    let (send_cpu, recv_cpu) = (median(&mut send_cpu), median(&mut recv_cpu));
    report.push(
        Row::new(
            BENCH,
            format!(
                "{} file, ferry send+receive vs plaintext TCP copy",
                size_name(opts.file_bytes)
            ),
            cli,
            "GB/s",
        )
        .with_baseline(plain),
    );
    // Where the time goes: CPU seconds per GiB of each side, against the plaintext copy's two threads.
    // With every core busy, a machine moves at most (cores / CPU seconds per GB) GB/s.
    report.push(Row::new(
        BENCH,
        "ferry send, CPU seconds per GiB (user + system)",
        send_cpu,
        "s",
    ));
    report.push(Row::new(
        BENCH,
        "ferry receive, CPU seconds per GiB (user + system)",
        recv_cpu,
        "s",
    ));
    let plain_cpu = median(&mut plain_cpu);
    report.push(
        Row::new(
            BENCH,
            "both sides, CPU seconds per GiB: ferry vs plaintext copy",
            send_cpu + recv_cpu,
            "s",
        )
        .with_baseline(plain_cpu),
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    report.push(
        Row::new(
            BENCH,
            format!("ceiling with all {cores} cores busy: ferry vs plaintext copy"),
            cores * (1u64 << 30) as f64 / (send_cpu + recv_cpu) / 1e9,
            "GB/s",
        )
        .with_baseline(cores * (1u64 << 30) as f64 / plain_cpu / 1e9),
    );
    Ok(())
}

fn small_files(opts: &Options, ferry: &Path, report: &mut Report) -> std::io::Result<()> {
    let s = Scratch::new(&opts.scratch, "small")?;
    let root = s.join("src/tree");
    write_small_tree(&root, opts.small_files)?;
    let (mut cli, mut typed, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..opts.runs {
        // Interleaved: the two ways of starting share the machine's state.
        for when in [Start::Together, Start::AfterCode] {
            s.clear_out()?;
            let nameplate = 200 + 2 * i as u32 + (when == Start::AfterCode) as u32;
            let run = cli_run(ferry, &s, std::slice::from_ref(&root), nameplate, when)?;
            let rate = opts.small_files as f64 / run.secs;
            if when == Start::Together {
                cli.push(rate);
                cpu.push((run.send_cpu + run.recv_cpu) / opts.small_files as f64 * 1e6);
            } else {
                typed.push(rate);
            }
        }
    }
    report.push(Row::new(
        BENCH,
        format!(
            "{} files of 4-8 KiB, ferry send+receive started together",
            opts.small_files
        ),
        median(&mut cli),
        "files/s",
    ));
    report.push(Row::new(
        BENCH,
        format!(
            "{} files of 4-8 KiB, ferry receive after the sender's code",
            opts.small_files
        ),
        median(&mut typed),
        "files/s",
    ));
    report.push(Row::new(
        BENCH,
        "small files, CPU per file, both sides (user + system)",
        median(&mut cpu),
        "µs",
    ));
    Ok(())
}

/// One run of the transfer engine in this process, sender on a thread, receiver here, over loopback TCP:
/// through the secure channel (handshake included) or in plaintext, into `out` (resume state in `partial`).
/// Returns seconds, the sender's walk included.
pub(crate) fn engine_run(
    paths: &[PathBuf],
    out: &Path,
    partial: &Path,
    encrypted: bool,
) -> std::io::Result<f64> {
    use ferry_channel::blocking::{handshake, split_tcp};
    use ferry_channel::{Auth, Config, Handshake, Role};
    use ferry_transfer::plain::{PlainSink, PlainSource};
    use ferry_transfer::secure::{ChannelSink, ChannelSource};
    use ferry_transfer::{PacketSink, PacketSource, ReceiveOptions, SendOptions};

    fn err(e: impl std::fmt::Display) -> std::io::Error {
        std::io::Error::other(e.to_string())
    }
    fn halves(
        mut stream: TcpStream,
        role: Role,
        encrypted: bool,
    ) -> std::io::Result<(Box<dyn PacketSink + Send>, Box<dyn PacketSource + Send>)> {
        stream.set_nodelay(true)?;
        if !encrypted {
            let sink = PlainSink::new(stream.try_clone()?);
            return Ok((Box::new(sink), Box::new(PlainSource::new(stream))));
        }
        let hs = Handshake::new(role, Config::ferry(), Auth::Code(b"bench".to_vec()));
        let est = handshake(&mut stream, hs).map_err(err)?;
        let (r, w) = split_tcp(stream, est).map_err(err)?;
        Ok((Box::new(ChannelSink(w)), Box::new(ChannelSource(r))))
    }

    let start = Instant::now();
    let walked = ferry_transfer::walk(paths).map_err(err)?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let (conn, _) = listener.accept()?;
        let (mut sink, mut source) = halves(conn, Role::Responder, encrypted)?;
        ferry_transfer::send(
            &mut sink.as_mut(),
            &mut source.as_mut(),
            &walked.manifest,
            &SendOptions::default(),
            &mut (),
        )
        .map_err(err)?;
        Ok(())
    });
    let (mut sink, mut source) = halves(TcpStream::connect(addr)?, Role::Initiator, encrypted)?;
    let mut ropts = ReceiveOptions::new(out);
    ropts.partial_dir = Some(partial.to_path_buf());
    ferry_transfer::receive(
        &mut source.as_mut(),
        &mut sink.as_mut(),
        &ropts,
        &mut |_| true,
        &mut (),
    )
    .map_err(err)?;
    sender.join().expect("sender thread")?;
    Ok(start.elapsed().as_secs_f64())
}

/// The same engine through the secure channel and in plaintext, interleaved: what encryption costs.
fn pipeline(opts: &Options, report: &mut Report) -> std::io::Result<()> {
    let s = Scratch::new(&opts.scratch, "pipeline")?;
    let tree = s.join("src/tree");
    write_small_tree(&tree, opts.small_files)?;
    let big = s.join("src/big.bin");
    write_random_file(&big, opts.file_bytes, 0xb16)?;
    let cases: [(&Path, String, f64, &str); 2] = [
        (
            &tree,
            format!(
                "{} files, engine in-process: channel vs plaintext",
                opts.small_files
            ),
            opts.small_files as f64,
            "files/s",
        ),
        (
            &big,
            format!(
                "{} file, engine in-process: channel vs plaintext",
                size_name(opts.file_bytes)
            ),
            opts.file_bytes as f64 / 1e9,
            "GB/s",
        ),
    ];
    for (path, name, amount, unit) in cases {
        let (mut plain, mut secure) = (Vec::new(), Vec::new());
        for _ in 0..opts.runs {
            s.clear_out()?;
            let (out, partial) = (s.join("out"), s.join("cache"));
            plain.push(amount / engine_run(&[path.to_path_buf()], &out, &partial, false)?);
            s.clear_out()?;
            secure.push(amount / engine_run(&[path.to_path_buf()], &out, &partial, true)?);
        }
        report.push(
            Row::new(BENCH, name, median(&mut secure), unit).with_baseline(median(&mut plain)),
        );
    }
    Ok(())
}

/// Peak RSS rows of both sides (KiB in, MiB out).
fn push_rss(report: &mut Report, what: &str, send_kib: u64, recv_kib: u64) {
    for (side, kib) in [("sender", send_kib), ("receiver", recv_kib)] {
        report.push(Row::new(
            BENCH,
            format!("peak RSS, {side}, {what}"),
            kib as f64 / 1024.0,
            "MiB",
        ));
    }
}

fn memory(opts: &Options, ferry: &Path, report: &mut Report) -> std::io::Result<()> {
    {
        let s = Scratch::new(&opts.scratch, "rss-file")?;
        let src = s.join("src/sparse.bin");
        fs::File::create(&src)?.set_len(opts.rss_file_bytes)?;
        let CliRun {
            secs: t,
            send_rss,
            recv_rss,
            ..
        } = cli_run(ferry, &s, std::slice::from_ref(&src), 300, Start::Together)?;
        let name = size_name(opts.rss_file_bytes);
        push_rss(report, &format!("{name} file"), send_rss, recv_rss);
        report.push(Row::new(
            BENCH,
            format!("{name} file (sparse source), ferry send+receive"),
            gbps(opts.rss_file_bytes, std::time::Duration::from_secs_f64(t)),
            "GB/s",
        ));
    }
    let s = Scratch::new(&opts.scratch, "rss-files")?;
    let root = s.join("src/many");
    write_small_tree(&root, opts.rss_files)?;
    let CliRun {
        send_rss, recv_rss, ..
    } = cli_run(ferry, &s, std::slice::from_ref(&root), 301, Start::Together)?;
    push_rss(
        report,
        &format!("{} files", opts.rss_files),
        send_rss,
        recv_rss,
    );
    Ok(())
}
