//! `ferry bench share`: the share protocol's verified reads over the real encrypted channel on loopback.
//!
//! Cases:
//! - **random 4 KiB reads**: one client, [`Options::depth`] reads in flight, each a random 4 KiB range of a
//!   [`Options::file_bytes`] file whose hash tree is cached; every byte verified by the client. Reads/s,
//!   against openssh's sftp-server doing the same reads of the same file ([`crate::sftp`]: a private sshd on
//!   127.0.0.1, `ssh -c aes128-gcm@openssh.com -s sftp`, a pipelined SFTP v3 client), interleaved; when
//!   sshd cannot run, a row says why. Then the CPU per read (both sides, and the client's part) beside a
//!   floor: the same work's pieces each timed alone (`pread` of the group, AES-GCM both ends, BLAKE3,
//!   loopback TCP), and the sharer's per-read open and identity checks apart.
//! - **latency**: the same reads one at a time; the median round trip in µs (sftp's beside it).
//! - **first verified byte**: a 4 KiB read at the start of a [`Options::first_file_bytes`] file (10 GiB of
//!   data, written for the case and removed after; its own file unless the size is the read case's) through
//!   a new share: hash tree never built (the whole file is hashed first), on disk (a restarted share: the
//!   cache file is checked and loaded), and in memory (the same share again). Milliseconds.
//!
//! Knobs (environment): [`CASES_ENV`] picks cases, [`FILE_SIZE_ENV`] and [`FIRST_SIZE_ENV`] set the sizes.
//! - **sharer's peak RSS**: [`Options::rss_clients`] clients each reading its own
//!   [`Options::rss_file_bytes`] file whole, at once, from a sharer in a child process (so the clients'
//!   memory is not counted): its `VmHWM`. The child is the current executable, which must call
//!   [`serve_if_child`] first thing in `main` (`ferry` does).
//!
//! - **pull vs send+receive** ([`crate::pull`]): a whole file and many small files by `pull`, against the
//!   transfer engine's send and receive of the same data, interleaved.
//!
//! The others run the sharer on a thread of this process. Data lives on tmpfs (`/dev/shm`).

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_channel::blocking::{handshake_until, split_tcp, SecureReader, SecureWriter};
use ferry_channel::{Auth, Config, Handshake, Role};
use ferry_share::client::Event;
use ferry_share::fs::{OutboardCache, ShareRoot};
use ferry_share::io::{serve, Changes, Session};
use ferry_share::server::ServerConfig;
use ferry_share::tree::GROUP;
use ferry_share::wire::SharePath;

use crate::report::{
    median, rusage_cpu, thread_cpu, vm_hwm_kib, write_random_file, xorshift, Report, Row,
};

const BENCH: &str = "share";

/// The environment variable that makes [`serve_if_child`] serve: `SHARE_DIR:CACHE_DIR`.
pub const SERVE_ENV: &str = "FERRY_BENCH_SHARE_SERVE";

/// The cases to run, comma-separated: `reads` (with the sftp baseline), `first`, `pull`, `rss` (default: all).
pub const CASES_ENV: &str = "FERRY_BENCH_SHARE_CASES";
/// Overrides [`Options::file_bytes`]: bytes, or with a `K`, `M` or `G` suffix (powers of 1024).
pub const FILE_SIZE_ENV: &str = "FERRY_BENCH_SHARE_FILE_SIZE";

/// Overrides [`Options::first_file_bytes`] (as [`FILE_SIZE_ENV`]).
pub const FIRST_SIZE_ENV: &str = "FERRY_BENCH_SHARE_FIRST_SIZE";

/// `1G`, `64M`, `4096`: bytes, with an optional binary suffix.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 10),
        (i, 'M' | 'm') => (&s[..i], 20),
        (i, 'G' | 'g') => (&s[..i], 30),
        _ => (s, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// What to run and how big.
#[derive(Clone, Debug)]
pub struct Options {
    /// Samples per case (medians are reported).
    pub runs: usize,
    /// Size of the file read at random and for the first byte (the 10 GiB is a parameter).
    pub file_bytes: u64,
    /// Size of the file of the first-verified-byte case (filled with data: hashing it reads every byte).
    pub first_file_bytes: u64,
    /// Reads per random-read sample.
    pub reads: usize,
    /// Reads in flight.
    pub depth: usize,
    /// Reads per latency sample.
    pub latency_reads: usize,
    /// Clients reading at once for the RSS case.
    pub rss_clients: usize,
    /// Size of each file of the RSS case (sparse: it costs no memory to hold).
    pub rss_file_bytes: u64,
    /// Files of 4-8 KiB of the pull-vs-send+receive case of many files.
    pub small_files: usize,
    /// Where the data goes (a tmpfs).
    pub scratch: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            runs: 5,
            file_bytes: 1 << 30,
            first_file_bytes: 10 << 30,
            reads: 200_000,
            depth: 64,
            latency_reads: 5_000,
            rss_clients: 16,
            rss_file_bytes: 1 << 30,
            small_files: 10_000,
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
            first_file_bytes: 64 << 20,
            reads: 20_000,
            latency_reads: 500,
            rss_file_bytes: 64 << 20,
            small_files: 1_000,
            ..Options::default()
        }
    }
}

impl Options {
    /// These options with [`FILE_SIZE_ENV`] applied.
    fn with_env(mut self) -> io::Result<Self> {
        for (env, field) in [
            (FILE_SIZE_ENV, &mut self.file_bytes),
            (FIRST_SIZE_ENV, &mut self.first_file_bytes),
        ] {
            if let Ok(v) = std::env::var(env) {
                *field = parse_size(&v)
                    .filter(|n| *n >= 4096)
                    .ok_or_else(|| other(format!("{env}={v:?} is not a size of 4K or more")))?;
            }
        }
        Ok(self)
    }
}

/// A directory on the scratch file system, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    /// `base/ferry-bench-share-TAG-PID` (distinct tags for scratch directories alive at once).
    fn new(base: &Path, tag: &str) -> io::Result<Scratch> {
        let dir = base.join(format!("ferry-bench-share-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("share"))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A sharer of `share` accepting clients on 127.0.0.1 until the process ends, each on a thread of its own,
/// all with one outboard cache in `cache`.
pub(crate) fn start_sharer(share: &Path, cache: &Path) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let root = Arc::new(ShareRoot::open(share)?);
    let cache = OutboardCache::new(cache.to_path_buf());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (root, cache) = (Arc::clone(&root), cache.clone());
            std::thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let hs = Handshake::new(Role::Responder, Config::ferry(), Auth::Unauthenticated);
                let mut s = stream.try_clone()?;
                let est = handshake_until(&mut s, hs, Instant::now() + Duration::from_secs(10))
                    .map_err(other)?;
                let (reader, writer) = split_tcp(stream, est).map_err(other)?;
                let changes = Changes::default();
                let config = ServerConfig::default();
                serve(reader, writer, &root, &cache, &changes, config, &mut |_| {}).map_err(other)
            });
        }
    });
    Ok(addr)
}

type Client = Session<TcpStream, TcpStream>;

/// The two halves of a channel to the sharer at `addr`.
pub(crate) fn channel(
    addr: SocketAddr,
) -> io::Result<(SecureReader<TcpStream>, SecureWriter<TcpStream>)> {
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let hs = Handshake::new(Role::Initiator, Config::ferry(), Auth::Unauthenticated);
    let mut s = stream.try_clone()?;
    let est =
        handshake_until(&mut s, hs, Instant::now() + Duration::from_secs(10)).map_err(other)?;
    split_tcp(stream, est).map_err(other)
}

fn connect(addr: SocketAddr, depth: usize) -> io::Result<Client> {
    let (reader, writer) = channel(addr)?;
    Session::open(reader, writer, depth as u32).map_err(other)
}

/// Runs `count` random 4 KiB reads of `path` with up to `depth` in flight (refilled when half have
/// completed); returns each read's time from request to its end, in order of completion.
fn random_reads(
    session: &mut Client,
    path: &SharePath,
    size: u64,
    count: usize,
    depth: usize,
    seed: &mut u64,
) -> io::Result<Vec<Duration>> {
    let mut started = std::collections::HashMap::new();
    let mut times = Vec::with_capacity(count);
    let (mut issued, mut bytes) = (0, 0u64);
    while times.len() < count {
        // Refill in batches, half the window at a time: one write carries many requests.
        let refill = started.len() <= depth / 2;
        while refill && issued < count && started.len() < depth {
            let offset = (xorshift(seed) % (size / 4096)) * 4096;
            let id = session
                .client()
                .read(path.clone(), None, offset, 4096)
                .map_err(other)?;
            started.insert(id, Instant::now());
            issued += 1;
        }
        match session.next_event().map_err(other)? {
            Event::Data { bytes: b, .. } => bytes += b.len() as u64,
            Event::Done { id } => {
                let t = started.remove(&id).ok_or_else(|| other("unknown read"))?;
                times.push(t.elapsed());
            }
            Event::Failed { failure, .. } => return Err(other(format!("{failure:?}"))),
            _ => {}
        }
    }
    if bytes != 4096 * count as u64 {
        return Err(other("short reads"));
    }
    Ok(times)
}

/// Runs every share case and reports it; `server_exe` is the executable started as the sharer of the RSS
/// case (it must call [`serve_if_child`]).
pub fn run(opts: &Options, server_exe: &Path, report: &mut Report) -> io::Result<()> {
    let opts = &opts.clone().with_env()?;
    let cases = std::env::var(CASES_ENV).unwrap_or_default();
    let wanted = |case: &str| cases.is_empty() || cases.split(',').any(|c| c.trim() == case);
    let s = Scratch::new(&opts.scratch, "main")?;
    let share = s.0.join("share");
    write_random_file(&share.join("big"), opts.file_bytes, 0x9e37_79b9_7f4a_7c15)?;
    let path = SharePath::new(b"big").map_err(other)?;
    if wanted("reads") {
        reads(opts, &s, &path, report)?;
    }
    if wanted("first") && opts.first_file_bytes == opts.file_bytes {
        first_byte(opts, &s, &path, opts.file_bytes, report)?;
    } else if wanted("first") {
        // Its own file, written before and removed after (10 GiB of tmpfs is memory).
        let first = share.join("first");
        write_random_file(&first, opts.first_file_bytes, 0x2545_f491_4f6c_dd1d)?;
        let path = SharePath::new(b"first").map_err(other)?;
        let r = first_byte(opts, &s, &path, opts.first_file_bytes, report);
        fs::remove_file(&first)?;
        r?;
    }
    if wanted("pull") {
        crate::pull::run(opts, &s.0, report)?;
    }
    if wanted("rss") {
        peak_rss(opts, server_exe, report)?;
    }
    Ok(())
}

fn reads(opts: &Options, s: &Scratch, path: &SharePath, report: &mut Report) -> io::Result<()> {
    let addr = start_sharer(&s.0.join("share"), &s.0.join("cache-reads"))?;
    let mut session = connect(addr, opts.depth)?;
    let mut seed = 0x1234_5678u64;
    // Warm: the hash tree is built and held.
    random_reads(&mut session, path, opts.file_bytes, 100, 1, &mut seed)?;
    // The baseline on the same file, or why there is none.
    let mut sftp = crate::sftp::Sshd::start(&opts.scratch).and_then(|sshd| {
        let mut client = sshd.sftp()?;
        let file = s.0.join("share").join("big");
        let handle = client.open(&file.to_string_lossy())?;
        client.random_reads(&handle, opts.file_bytes, 100, 1, &mut seed)?;
        Ok((sshd, client, handle))
    });
    let (mut rates, mut lat, mut cpu, mut client_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut sftp_rates, mut sftp_lat) = (Vec::new(), Vec::new());
    for _ in 0..opts.runs {
        let count = opts.reads;
        let (cpu0, client0) = (rusage_cpu(libc::RUSAGE_SELF), thread_cpu());
        let start = Instant::now();
        random_reads(
            &mut session,
            path,
            opts.file_bytes,
            count,
            opts.depth,
            &mut seed,
        )?;
        rates.push(count as f64 / start.elapsed().as_secs_f64());
        // This process holds both sides: the client on this thread, the sharer on others.
        cpu.push((rusage_cpu(libc::RUSAGE_SELF) - cpu0) / count as f64 * 1e6);
        client_cpu.push((thread_cpu() - client0) / count as f64 * 1e6);
        let times = random_reads(
            &mut session,
            path,
            opts.file_bytes,
            opts.latency_reads,
            1,
            &mut seed,
        )?;
        lat.push(median_us(&times));
        if let Ok((_, client, handle)) = &mut sftp {
            let start = Instant::now();
            client.random_reads(handle, opts.file_bytes, count, opts.depth, &mut seed)?;
            sftp_rates.push(count as f64 / start.elapsed().as_secs_f64());
            let times =
                client.random_reads(handle, opts.file_bytes, opts.latency_reads, 1, &mut seed)?;
            sftp_lat.push(median_us(&times));
        }
    }
    let size = crate::channel::size_name(opts.file_bytes as usize);
    let depth = opts.depth;
    let rate = Row::new(
        BENCH,
        format!("random 4 KiB verified reads, {depth} in flight ({size})"),
        median(&mut rates),
        "reads/s",
    );
    let one = Row::new(
        BENCH,
        format!("random 4 KiB verified read, one at a time ({size})"),
        median(&mut lat),
        "µs",
    );
    match &mut sftp {
        Ok((_, client, handle)) => {
            client.close(handle)?;
            report.push(rate.with_baseline(median(&mut sftp_rates)));
            report.push(one.with_baseline(median(&mut sftp_lat)));
        }
        Err(e) => {
            report.push(rate);
            report.push(one);
            report.push(Row::new(
                BENCH,
                format!("  no sftp baseline: {e}"),
                f64::NAN,
                "",
            ));
        }
    }
    let (total, client) = (median(&mut cpu), median(&mut client_cpu));
    report.push(Row::new(
        BENCH,
        format!("  CPU per read, {depth} in flight, both sides"),
        total,
        "µs",
    ));
    report.push(Row::new(
        BENCH,
        "  of which the client (the rest is the sharer)",
        client,
        "µs",
    ));
    let f = floor(&s.0.join("share"), path, opts.file_bytes)?;
    let now = f.pread_group + f.aead_group + f.blake3_group + f.tcp_group;
    let (g, p) = (GROUP >> 10, (GROUP >> 10) + 1);
    for (what, us) in [
        (format!("  floor per read: pread {g} KiB + AES-GCM {p} KiB both ends + BLAKE3 {g} KiB + TCP {p} KiB"), now),
        (format!("    pread of a random {g} KiB group"), f.pread_group),
        ("    pread of a random 4 KiB".to_string(), f.pread_4k),
        (format!("    AES-256-GCM seal + open of {p} KiB (the group and its proof)"), f.aead_group),
        (format!("    BLAKE3 of {g} KiB (the client's check of the group)"), f.blake3_group),
        (format!("    loopback TCP write + read of {p} KiB"), f.tcp_group),
        ("  not in the floor: the sharer's open, identity checks, close".to_string(), f.open_close),
    ] {
        report.push(Row::new(BENCH, what, us, "µs"));
    }
    if sftp.is_ok() {
        report.push(Row::new(
            BENCH,
            format!(
                "  baselines: openssh sftp-server, ssh -c {} on 127.0.0.1",
                crate::sftp::CIPHER
            ),
            f64::NAN,
            "",
        ));
    }
    Ok(())
}

fn path_str(path: &SharePath) -> String {
    String::from_utf8_lossy(path.as_bytes()).into_owned()
}

fn median_us(times: &[Duration]) -> f64 {
    let mut us: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e6).collect();
    median(&mut us)
}

/// Milliseconds from a 4 KiB read's request to its verified data.
fn time_to_first_byte(session: &mut Client, path: &SharePath) -> io::Result<f64> {
    let start = Instant::now();
    let id = session
        .client()
        .read(path.clone(), None, 0, 4096)
        .map_err(other)?;
    loop {
        match session.next_event().map_err(other)? {
            Event::Data { id: i, .. } if i == id => break,
            Event::Failed { failure, .. } => return Err(other(format!("{failure:?}"))),
            _ => {}
        }
    }
    let ms = start.elapsed().as_secs_f64() * 1e3;
    while !matches!(session.next_event().map_err(other)?, Event::Done { id: i } if i == id) {}
    Ok(ms)
}

fn first_byte(
    opts: &Options,
    s: &Scratch,
    path: &SharePath,
    file_bytes: u64,
    report: &mut Report,
) -> io::Result<()> {
    let (mut cold, mut disk, mut memory) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..opts.runs {
        let cache = s.0.join(format!("cache-first-{run}"));
        let addr = start_sharer(&s.0.join("share"), &cache)?;
        let mut session = connect(addr, 1)?;
        cold.push(time_to_first_byte(&mut session, path)?);
        memory.push(time_to_first_byte(&mut session, path)?);
        // A restarted share: a new cache over the same directory.
        let addr = start_sharer(&s.0.join("share"), &cache)?;
        disk.push(time_to_first_byte(&mut connect(addr, 1)?, path)?);
        fs::remove_dir_all(&cache)?;
    }
    let size = crate::channel::size_name(file_bytes as usize);
    for (what, mut samples) in [
        ("hash tree never built", cold),
        ("hash tree on disk (restarted share)", disk),
        ("hash tree in memory", memory),
    ] {
        report.push(Row::new(
            BENCH,
            format!("first verified byte of {size}, {what}"),
            median(&mut samples),
            "ms",
        ));
    }
    Ok(())
}

fn peak_rss(opts: &Options, server_exe: &Path, report: &mut Report) -> io::Result<()> {
    let s = Scratch::new(&opts.scratch, "rss")?;
    let share = s.0.join("share");
    for i in 0..opts.rss_clients {
        fs::File::create(share.join(format!("f{i}")))?.set_len(opts.rss_file_bytes)?;
    }
    let mut child = Command::new(server_exe)
        .env(
            SERVE_ENV,
            format!("{}:{}", share.display(), s.0.join("cache").display()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or_else(|| other("no stdout"))?).read_line(&mut line)?;
    let addr: SocketAddr = line.trim().parse().map_err(|_| {
        other(format!(
            "{} did not start a sharer (does it call serve_if_child?)",
            server_exe.display()
        ))
    })?;
    let start = Instant::now();
    let results: Vec<io::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..opts.rss_clients)
            .map(|i| {
                scope.spawn(move || {
                    let mut session = connect(addr, 64)?;
                    let path = SharePath::new(format!("f{i}").as_bytes()).map_err(other)?;
                    let mut sink = fs::OpenOptions::new().write(true).open("/dev/null")?;
                    session
                        .read_into(path, 0, u64::MAX, &mut sink)
                        .map_err(other)?;
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(other("client panicked"))))
            .collect()
    });
    let elapsed = start.elapsed();
    let hwm = vm_hwm_kib(child.id()).unwrap_or(0);
    drop(child.stdin.take());
    let _ = child.wait();
    results.into_iter().collect::<io::Result<Vec<()>>>()?;
    let size = crate::channel::size_name(opts.rss_file_bytes as usize);
    report.push(Row::new(
        BENCH,
        format!(
            "sharer peak RSS, {} clients reading a {size} file each",
            opts.rss_clients
        ),
        hwm as f64 / 1024.0,
        "MiB",
    ));
    let total = opts.rss_clients as u64 * opts.rss_file_bytes;
    report.push(Row::new(
        BENCH,
        "  their total rate (cold hash trees included)",
        crate::report::gbps(total, elapsed),
        "GB/s",
    ));
    Ok(())
}

/// When [`SERVE_ENV`] is set: serves the share it names on 127.0.0.1, prints the address on stdout, and
/// exits when stdin closes. Otherwise returns at once. Call it first thing in `main` of the executable
/// given to [`run`].
pub fn serve_if_child() {
    let Ok(spec) = std::env::var(SERVE_ENV) else {
        return;
    };
    let (share, cache) = spec
        .split_once(':')
        .unwrap_or((&spec, "/dev/shm/ferry-bench-cache"));
    match start_sharer(Path::new(share), Path::new(cache)) {
        Ok(addr) => {
            println!("{addr}");
            let _ = io::stdout().flush();
            let _ = io::copy(&mut io::stdin(), &mut io::sink());
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("share bench sharer: {e}");
            std::process::exit(1);
        }
    }
}

/// CPU µs per operation of what one random 4 KiB read must do at least, each alone on this thread, on the
/// file of the read case: a floor to hold the measured CPU per read against.
struct Floor {
    /// `pread` of a group at a random place of the file (cold in the CPU's caches).
    pread_group: f64,
    /// `pread` of 4 KiB at a random place.
    pread_4k: f64,
    /// AES-256-GCM seal and open of a piece of a group + 1 KiB of proof (the channel's sealing, both ends).
    aead_group: f64,
    /// BLAKE3 of a group (the client's check).
    blake3_group: f64,
    /// Writing a group + 1 KiB into a loopback TCP socket and reading it back (kernel copies and the TCP
    /// stack, no wake-up).
    tcp_group: f64,
    /// What the sharer does per read besides the piece (not in the floor): the path resolved and opened,
    /// its identity checked against the cached outboard, checked again before the piece, closed.
    open_close: f64,
}

fn cpu_per_op(count: usize, mut op: impl FnMut(usize)) -> f64 {
    let start = thread_cpu();
    for i in 0..count {
        op(i);
    }
    (thread_cpu() - start) / count as f64 * 1e6
}

fn floor(share: &Path, path: &SharePath, size: u64) -> io::Result<Floor> {
    let file = &share.join(path_str(path));
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    use std::os::unix::fs::FileExt;
    const N: usize = 50_000;
    let f = fs::File::open(file)?;
    let mut seed = 0x5eed_u64;
    let group = GROUP as usize;
    let mut buf = vec![0u8; group + 1024];
    let mut pread = |len: usize| {
        cpu_per_op(N, |_| {
            let at = (xorshift(&mut seed) % (size / GROUP)) * GROUP;
            let _ = f.read_exact_at(&mut buf[..len], at);
        })
    };
    let (pread_group, pread_4k) = (pread(group), pread(4 << 10));
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7u8; 32]).map_err(other)?);
    let aead = |len: usize| {
        let mut data = vec![0u8; len];
        cpu_per_op(N, |i| {
            let nonce = || {
                let mut n = [0u8; 12];
                n[..8].copy_from_slice(&(i as u64).to_le_bytes());
                Nonce::assume_unique_for_key(n)
            };
            let tag = key
                .seal_in_place_separate_tag(nonce(), Aad::empty(), &mut data)
                .expect("seal");
            let mut sealed = std::mem::take(&mut data);
            sealed.extend_from_slice(tag.as_ref());
            let n = key
                .open_in_place(nonce(), Aad::empty(), &mut sealed)
                .expect("open")
                .len();
            sealed.truncate(n);
            data = sealed;
        })
    };
    let aead_group = aead(group + 1024);
    let group_bytes = vec![7u8; group];
    let blake3_group = cpu_per_op(N, |_| {
        std::hint::black_box(blake3::hash(std::hint::black_box(&group_bytes)));
    });
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut tx = TcpStream::connect(listener.local_addr()?)?;
    let (mut rx, _) = listener.accept()?;
    tx.set_nodelay(true)?;
    let mut tcp = |len: usize| -> io::Result<f64> {
        let data = vec![1u8; len];
        let mut back = vec![0u8; len];
        let mut r = Ok(());
        let us = cpu_per_op(N, |_| {
            if r.is_ok() {
                r = tx.write_all(&data).and_then(|()| rx.read_exact(&mut back));
            }
        });
        r.map(|()| us)
    };
    let tcp_group = tcp(group + 1024)?;
    let root = ShareRoot::open(share)?;
    let cache = OutboardCache::new(share.with_file_name("cache-floor"));
    // Hashed once before: the read case's tree is held too.
    cache.outboard(&root.open_file(path).map_err(|(_, e)| other(e))?)?;
    let mut r = Ok(());
    let open_close = cpu_per_op(N / 5, |_| {
        if r.is_ok() {
            r = (|| {
                let f = root.open_file(path).map_err(|(_, e)| other(e))?;
                let cached = cache.outboard(&f)?;
                (ferry_share::fs::FileId::of(&f)? == cached.id)
                    .then_some(())
                    .ok_or_else(|| other("the file changed"))
            })();
        }
    });
    r?;
    Ok(Floor {
        open_close,
        pread_group,
        pread_4k,
        aead_group,
        blake3_group,
        tcp_group,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("10G"), Some(10 << 30));
        assert_eq!(parse_size("1k"), Some(1024));
        for bad in ["", "G", "1.5G", "-1", "99999999999999999999G", "1T"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }
}
