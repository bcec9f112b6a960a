//! `ferry bench matrix`: layers × paths × sizes, on this host's loopback and on links emulated by the
//! link lab ([`ferry_lab`]).
//!
//! Rows, on every path:
//! - **raw TCP**: a plaintext memory-to-memory copy over one TCP connection (through `ferry relay` on a
//!   relay path, paired by ferry's relay client but carrying plain bytes): the practical ceiling.
//! - **send 1 file**: real `ferry send` / `ferry receive` processes moving one file of random data.
//! - **send small files**: the same with a tree of small files (4-8 KiB, 100 directories).
//!
//! The sender runs in the lab's server namespace and listens on its address there (or meets the
//! receiver at the relay, both with `--force-relay`); the receiver runs in the client namespace. The
//! clock starts when the receiver is started, after the sender has printed its code (so the sender's
//! walk is not timed, as when a person types the code), and stops when the receiver exits. Time to first
//! byte is from the same start to the receiver's first `progress` or `file-done` event (or, for raw
//! TCP, from `connect` to the first byte read); connected, to the receiver's `connected` event (the
//! peer reached, the channel and the code's authentication done; raw TCP: `connect` returned, on the
//! relay path once both sides are paired). Every received file is verified against its source
//! with BLAKE3.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_lab::{Lab, Netns, Path, PATHS};

use crate::report::{median, write_random_file};

mod lanes;
mod layers;
pub mod mount;
mod mount_lab;
pub mod mount_sshfs;
mod peers;
mod plot;
mod pull;
use crate::transfer::{size_name, write_small_tree};

/// What to run and how big.
#[derive(Clone, Debug)]
pub struct Options {
    /// Size of the single file (and of the raw TCP copy).
    pub file_bytes: u64,
    /// Number of small files.
    pub small_files: usize,
    /// Number of small files the peers (scp, rsync, croc) move: fewer, as scp and croc pay a round trip
    /// or more per file.
    pub peer_files: usize,
    /// Whether scp and croc move their small files on paths with an RTT above 1 ms too (off in a short
    /// run).
    pub peer_files_everywhere: bool,
    /// Samples per cell; medians are reported.
    pub runs: usize,
    /// The paths to measure, in order.
    pub paths: Vec<Path>,
    /// Where the data goes (a tmpfs).
    pub scratch: PathBuf,
    /// The rows to run, by layer name (`raw TCP ×4`, `ferry send`); empty: every row.
    pub rows: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            file_bytes: 1 << 30,
            small_files: 10_000,
            peer_files: 1_000,
            peer_files_everywhere: true,
            runs: 1,
            paths: PATHS.to_vec(),
            scratch: PathBuf::from("/dev/shm"),
            rows: Vec::new(),
        }
    }
}

impl Options {
    /// Whether the row of `layer` runs.
    pub fn wants(&self, layer: &str) -> bool {
        self.rows.is_empty() || self.rows.iter().any(|r| r == layer)
    }

    /// A short run (64 MiB, 1,000 files; the peers 100 files, scp's and croc's only on paths of 1 ms or
    /// less) for CI and smoke tests.
    pub fn quick() -> Self {
        Options {
            file_bytes: 64 << 20,
            small_files: 1_000,
            peer_files: 100,
            peer_files_everywhere: false,
            ..Options::default()
        }
    }
}

/// One measured cell of the matrix.
#[derive(Clone, Debug)]
pub struct Cell {
    /// The path's name (`wan`, ...).
    pub path: &'static str,
    /// The layer: `raw TCP`, `ferry send`.
    pub layer: &'static str,
    /// What moved: `1 GiB file`, `10000 files`.
    pub size: String,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Seconds from the start to the last byte (median).
    pub seconds: f64,
    /// The configured wire in bytes per second; `None` on loopback.
    pub wire: Option<f64>,
    /// Seconds to the receiving side's connection: authenticated channel, or TCP (median); `None` where
    /// it is not seen (the AEAD in memory, the peers).
    pub connected: Option<f64>,
    /// Seconds to the first byte of payload at the receiving side (median); `None` where it is not seen.
    pub first_byte: Option<f64>,
    /// Whether every received file matched its source (`None`: no files, as in raw TCP).
    pub verified: Option<bool>,
}

impl Cell {
    /// Payload bytes per second.
    pub fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds
    }

    /// The rate as a share of the wire.
    pub fn ratio(&self) -> Option<f64> {
        self.wire.map(|w| self.rate() / w)
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:.6}"));
        format!(
            "{{\"bench\":\"matrix\",\"path\":\"{}\",\"layer\":\"{}\",\"size\":\"{}\",\"bytes\":{},\"seconds\":{:.6},\"rate_mb_s\":{:.6},\"wire_mb_s\":{},\"ratio\":{},\"connected_ms\":{},\"first_byte_ms\":{},\"verified\":{}}}",
            self.path,
            self.layer,
            self.size,
            self.bytes,
            self.seconds,
            self.rate() / 1e6,
            opt(self.wire.map(|w| w / 1e6)),
            opt(self.ratio()),
            opt(self.connected.map(|v| v * 1e3)),
            opt(self.first_byte.map(|v| v * 1e3)),
            self.verified.map_or("null".to_string(), |v| v.to_string()),
        )
    }
}

/// Where the matrix's rows go as they are measured: a table or JSON lines on standard output.
pub struct Printer {
    json: bool,
}

impl Printer {
    /// A printer for a table (with its header) or JSON lines.
    pub fn new(json: bool) -> Printer {
        if !json {
            crate::report::out_line(format_args!(
                "{:<10} {:<18} {:<13} {:>9} {:>10} {:>9} {:>6} {:>9} {:>9} {:<8}",
                "path",
                "layer",
                "size",
                "seconds",
                "MB/s",
                "wire MB/s",
                "ratio",
                "connected",
                "1st byte",
                "verified"
            ));
        }
        Printer { json }
    }

    fn cell(&self, c: &Cell) {
        if self.json {
            crate::report::out_line(format_args!("{}", c.to_json()));
            return;
        }
        let opt = |v: Option<f64>, prec: usize| v.map_or(String::new(), |v| format!("{v:.prec$}"));
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}ms", v * 1e3));
        crate::report::out_line(format_args!(
            "{:<10} {:<18} {:<13} {:>9.3} {:>10.1} {:>9} {:>6} {:>9} {:>9} {:<8}",
            c.path,
            c.layer,
            c.size,
            c.seconds,
            c.rate() / 1e6,
            opt(c.wire.map(|w| w / 1e6), 1),
            opt(c.ratio(), 3),
            ms(c.connected),
            ms(c.first_byte),
            c.verified.map_or("-", |v| if v { "yes" } else { "NO" }),
        ));
    }

    fn note(&self, path: &str, what: &str) {
        if self.json {
            crate::report::out_line(format_args!(
                "{{\"bench\":\"matrix\",\"path\":\"{path}\",\"note\":{:?}}}",
                what
            ));
        } else {
            crate::report::out_line(format_args!("{path:<10} {what}"));
        }
    }
}

/// Everything one run of the matrix measured, and what it skipped.
#[derive(Debug, Default)]
pub struct Matrix {
    /// The measured cells, in order.
    pub cells: Vec<Cell>,
    /// Paths not measured, and why.
    pub skipped: Vec<(&'static str, String)>,
}

impl Matrix {
    /// Draws the PNG plots into `dir` (created if missing): `throughput.png`, payload rate per path as a
    /// share of the wire, and `waterfall.png`, what each layer keeps of the wire. The files written.
    pub fn plot(&self, dir: &FsPath) -> io::Result<Vec<PathBuf>> {
        plot::write(&self.cells, dir)
    }
}

pub use plot::redraw;

/// The paths that get the socket-buffer rows (issue 12, item 7).
const BUFFER_PATHS: [&str; 2] = ["wan", "high-bdp"];

/// Runs the matrix with `ferry` (normally the running binary), printing each cell as it is measured.
pub fn run(opts: &Options, ferry: &FsPath, out: &Printer) -> io::Result<Matrix> {
    let scratch = Scratch::new(&opts.scratch)?;
    let big = scratch.0.join("src/big.bin");
    // Not written in full when only the small files move (an A/B run of them).
    let big_bytes = if case_wanted(false) {
        opts.file_bytes
    } else {
        1
    };
    write_random_file(&big, big_bytes, 0x11ab)?;
    let tree = scratch.0.join("src/tree");
    let tree_bytes = write_small_tree(&tree, opts.small_files)?;
    // What each row of files moves: (size, payload bytes, the source, its digests).
    let cases = [
        Case::new(
            format!("{} file", size_name(opts.file_bytes)),
            opts.file_bytes,
            big.clone(),
        )?,
        Case::new(
            format!("{} files", opts.small_files),
            tree_bytes,
            tree.clone(),
        )?,
    ];
    // The peers' small files: a tree of its own, smaller (scp and croc pay a round trip or more per file).
    let peer_tree = scratch.0.join("peer-src/tree");
    let peer_tree_bytes = write_small_tree(&peer_tree, opts.peer_files)?;
    let peer_cases = [
        cases[0].clone(),
        Case::new(
            format!("{} files", opts.peer_files),
            peer_tree_bytes,
            peer_tree,
        )?,
    ];
    let runs = opts.runs.max(1);
    let mut m = Matrix::default();
    let push = |m: &mut Matrix, c: Cell| {
        out.cell(&c);
        m.cells.push(c);
    };
    let cell = |path, layer, size: String, bytes, wire, samples: &[Sample], verified| {
        let med = |f: fn(&Sample) -> f64| {
            let v = median(&mut samples.iter().map(f).collect::<Vec<_>>());
            Some(v).filter(|v| v.is_finite())
        };
        Cell {
            path,
            layer,
            size,
            bytes,
            seconds: med(|s| s.secs).unwrap_or(f64::NAN),
            wire,
            connected: med(|s| s.connected),
            first_byte: med(|s| s.first_byte),
            verified,
        }
    };

    // The AEAD in memory: the CPU ceiling, once per run.
    if opts.wants("AEAD") {
        let aead: Vec<Sample> = (0..runs)
            .map(|_| layers::aead_in_memory(opts.file_bytes))
            .collect();
        let c = cell(
            "memory",
            "AEAD",
            size_name(opts.file_bytes),
            opts.file_bytes,
            None,
            &aead,
            None,
        );
        push(&mut m, c);
    }

    // The pairing of the pull rows, on loopback before any path.
    let loopback = Ends::new(&PATHS[0], None, ferry)?;
    let paired = pull::Paired::new(&loopback, &scratch, &[&big, &tree])?;
    drop(loopback);
    let croc = peers::installed("croc");

    for path in &opts.paths {
        let lab = match path.link {
            None => None,
            Some(_) => match ferry_lab::missing_prerequisite() {
                Some(reason) => {
                    out.note(path.name, &format!("skipped: {reason}"));
                    m.skipped.push((path.name, reason));
                    continue;
                }
                None => Some(Lab::build(path).map_err(io::Error::other)?),
            },
        };
        if let (Some(lab), Some(n)) = (&lab, std::env::var_os("FERRY_BENCH_MATRIX_INITCWND")) {
            let n = n.to_string_lossy();
            set_initcwnd(lab, &n)?;
            out.note(path.name, &format!("every route of the lab's ends has initcwnd {n} (FERRY_BENCH_MATRIX_INITCWND): a what-if, not ferry's setting"));
        }
        let ends = Ends::new(path, lab.as_ref(), ferry)?;
        let wire = path.wire_bytes_per_sec();
        // A row of memory moved across the path (no files): raw TCP, the channel.
        let memory_rows = |m: &mut Matrix,
                           layer: &'static str,
                           bytes: u64,
                           size: String,
                           f: &mut dyn FnMut() -> io::Result<Sample>|
         -> io::Result<Option<Cell>> {
            if !opts.wants(layer) {
                return Ok(None);
            }
            let samples = (0..runs).map(|_| f()).collect::<io::Result<Vec<_>>>()?;
            let c = cell(path.name, layer, size, bytes, wire, &samples, None);
            push(m, c.clone());
            Ok(Some(c))
        };
        let memory_row = |m: &mut Matrix,
                          layer: &'static str,
                          f: &mut dyn FnMut() -> io::Result<Sample>|
         -> io::Result<()> {
            if !case_wanted(false) {
                return Ok(());
            }
            memory_rows(m, layer, opts.file_bytes, size_name(opts.file_bytes), f).map(drop)
        };
        memory_row(&mut m, "raw TCP", &mut || {
            ends.raw_copy(opts.file_bytes, layers::Tune::Default)
        })?;
        memory_row(&mut m, "channel", &mut || {
            ends.channel_copy(opts.file_bytes)
        })?;

        // A row of files: `copy` moves `src` into a fresh directory, whose copy of `src` is verified.
        let files_row = |m: &mut Matrix,
                         layer: &'static str,
                         cases: &[Case],
                         copy: &mut dyn FnMut(&FsPath, &FsPath) -> io::Result<Sample>|
         -> io::Result<()> {
            if !opts.wants(layer) {
                return Ok(());
            }
            for Case {
                size,
                bytes,
                src,
                digest,
            } in cases
            {
                if !case_wanted(src.is_dir()) {
                    continue;
                }
                let mut samples = Vec::new();
                let mut verified = true;
                for _ in 0..runs {
                    let received = scratch.fresh("out")?;
                    samples.push(copy(src, &received)?);
                    verified &=
                        digests(&received.join(src.file_name().expect("a name")))? == *digest;
                }
                let c = cell(
                    path.name,
                    layer,
                    size.clone(),
                    *bytes,
                    wire,
                    &samples,
                    Some(verified),
                );
                if let (Some(link), true) = (path.link, src == &tree && layer.starts_with("ferry "))
                {
                    out.note(path.name, &small_files_bound(&c, link.rtt));
                }
                push(m, c);
            }
            Ok(())
        };
        files_row(&mut m, "ferry send", &cases, &mut |src, dst| {
            ends.ferry_send(src, dst, &scratch)
        })?;
        if opts.wants("ferry pull") || opts.wants("ferry mount") || opts.wants("ferry mount cached")
        {
            let share = paired.share(&ends, &scratch.0.join("src"))?;
            if opts.wants("ferry pull") {
                files_row(&mut m, "ferry pull", &cases, &mut |src, dst| {
                    paired.pull(&ends, &share, src, dst)
                })?;
            }
            // The mount's reads of the file: uncached (a fresh cache), then cached.
            match mount::unavailable() {
                _ if !opts.wants("ferry mount") && !opts.wants("ferry mount cached") => {}
                Some(why) => out.note(path.name, &format!("ferry mount: no rows: {why}")),
                None => match mount_lab::reads(&ends, &paired, &share, &cases[0], runs, &scratch) {
                    Err(e) => out.note(path.name, &format!("ferry mount: failed: {e}")),
                    Ok(r) => {
                        for (layer, samples) in [
                            ("ferry mount", r.uncached),
                            ("ferry mount cached", r.cached),
                        ] {
                            let c = cell(
                                path.name,
                                layer,
                                cases[0].size.clone(),
                                cases[0].bytes,
                                wire,
                                &samples,
                                Some(r.verified),
                            );
                            push(&mut m, c);
                        }
                    }
                },
            }
            drop(share);
        }

        // The small files' bytes as one plaintext stream over one new TCP connection: what the path's TCP
        // does with those bytes from its first window, against which the files' bound is read.
        if case_wanted(true) {
            let size = format!("{:.1} MB", tree_bytes as f64 / 1e6);
            let raw = memory_rows(&mut m, "raw TCP", tree_bytes, size, &mut || {
                ends.raw_copy(tree_bytes, layers::Tune::Default)
            })?;
            if let (Some(link), Some(c)) = (path.link, raw) {
                out.note(path.name, &small_files_bound(&c, link.rtt));
            }
        }

        // scp and croc pay a round trip or more per file: in a short run, their small files only where
        // the RTT is at most 1 ms.
        let slow_path = path.link.is_some_and(|l| l.rtt > Duration::from_millis(1));
        let per_file_cases = if slow_path && !opts.peer_files_everywhere {
            out.note(
                path.name,
                "scp, croc: small files skipped in this short run (a round trip or more per file)",
            );
            &peer_cases[..1]
        } else {
            &peer_cases[..]
        };
        // A peer that fails gives a note and the matrix goes on (a row that did not verify still fails it).
        let failed = |peer: &str, r: io::Result<()>| {
            if let Err(e) = r {
                out.note(path.name, &format!("{peer}: failed: {e}"));
            }
        };
        let peers_wanted = ["scp", "rsync", "croc"].iter().any(|p| opts.wants(p));
        if !peers_wanted {
        } else if ends.relay_addrs().is_some() {
            out.note(
                path.name,
                "scp, rsync: no rows on a relay path (ssh has no relay)",
            );
        } else if peers::installed("scp").is_none() {
            out.note(
                path.name,
                "scp, rsync: not installed (apt-get install openssh-client)",
            );
        } else if !peers::is_root() {
            out.note(
                path.name,
                "scp, rsync: no rows without root (the bench's sshd needs it)",
            );
        } else {
            match peers::sshd(&ends, &scratch) {
                // Not installed, or it cannot run here: the reason says which.
                Err(e) => out.note(path.name, &format!("scp, rsync: no rows: {e}")),
                Ok(sshd) => {
                    let r = files_row(&mut m, "scp", per_file_cases, &mut |src, dst| {
                        peers::ssh_copy(&ends, &sshd, false, src, dst)
                    });
                    failed("scp", r);
                    if peers::installed("rsync").is_some() {
                        let r = files_row(&mut m, "rsync", &peer_cases, &mut |src, dst| {
                            peers::ssh_copy(&ends, &sshd, true, src, dst)
                        });
                        failed("rsync", r);
                    } else {
                        out.note(path.name, "rsync: not installed (apt-get install rsync)");
                    }
                }
            }
        }
        match (&croc, lab.as_ref().map_or(ferry_lab::missing_prerequisite(), |_| None)) {
            _ if !opts.wants("croc") => {}
            (None, _) => out.note(path.name, "croc: not installed (see .ci/run)"),
            (Some(_), Some(reason)) => out.note(
                path.name,
                &format!("croc: no rows here ({reason}; croc runs in a namespace of its own on loopback)"),
            ),
            (Some(exe), None) => {
                let r = peers::CrocLab::start(exe.clone(), &ends, &scratch).and_then(|mut lab| {
                    files_row(&mut m, "croc", per_file_cases, &mut |src, dst| lab.copy(src, dst))
                });
                failed("croc", r);
            }
        }

        for (layer, streams, cc) in lanes::raw_rows(path.name) {
            memory_row(&mut m, layer, &mut || {
                ends.raw_parallel(opts.file_bytes, streams, cc)
            })?;
        }
        for (layer, n) in lanes::SEND_ROWS {
            files_row(&mut m, layer, &cases, &mut |src, dst| {
                ends.ferry_send_lanes(src, dst, &scratch, n)
            })?;
        }

        if BUFFER_PATHS.contains(&path.name) {
            out.note(path.name, &layers::buffer_limits(&ends));
            for (tune, layer) in layers::Tune::ROWS {
                memory_row(&mut m, layer, &mut || ends.raw_copy(opts.file_bytes, tune))?;
            }
            layers::with_send_buffer(&ends, || {
                files_row(&mut m, "ferry send sndbuf", &cases[..1], &mut |src, dst| {
                    ends.ferry_send(src, dst, &scratch)
                })
            })??;
        }
        drop(ends);
        if let Some(lab) = &lab {
            let d = lab.links()[0].stats(0);
            let lost = d.lost.load(std::sync::atomic::Ordering::Relaxed);
            let overflowed = d.overflowed.load(std::sync::atomic::Ordering::Relaxed);
            if lost + overflowed > 0 {
                out.note(
                    path.name,
                    &format!("the link dropped {lost} packets at random and {overflowed} at its full queue"),
                );
            }
        }
    }
    Ok(m)
}

/// Gives every route of the lab's two ends the first window `n` (a what-if of the administrator's setting: TCP
/// starts from `n` segments instead of 10).
fn set_initcwnd(lab: &Lab, n: &str) -> io::Result<()> {
    for ns in [&lab.server, &lab.client] {
        let routes = ns
            .run("ip", &["-4", "route", "show"], "")
            .map_err(io::Error::other)?;
        let script: String = routes
            .lines()
            .filter(|r| !r.trim().is_empty())
            .map(|r| format!("route change {} initcwnd {n}\n", r.trim()))
            .collect();
        ns.ip(&script).map_err(io::Error::other)?;
    }
    Ok(())
}

/// Issue 12's bound on the small files: 1.2 × (bytes / wire rate) + 3 RTT (no round trip per file), and
/// whether `c` (a row of the small files on a path of round trip `rtt`) is within it.
fn small_files_bound(c: &Cell, rtt: Duration) -> String {
    let wire = c.wire.unwrap_or(f64::INFINITY);
    let bound = 1.2 * c.bytes as f64 / wire + 3.0 * rtt.as_secs_f64();
    format!(
        "{} {}: {:.3} s; bound 1.2 × {:.1} MB / {:.1} MB/s + 3 × {:.0} ms = {:.3} s: {} ({:.2} × the bound)",
        c.layer,
        c.size,
        c.seconds,
        c.bytes as f64 / 1e6,
        wire / 1e6,
        rtt.as_secs_f64() * 1e3,
        bound,
        if c.seconds <= bound { "met" } else { "not met" },
        c.seconds / bound,
    )
}

/// Whether the rows of files move this case: the small files (`small`) or the single file. Both, unless
/// `FERRY_BENCH_MATRIX_CASES` names one (`file` or `files`: A/B runs of one case, interleaved by a script).
fn case_wanted(small: bool) -> bool {
    match std::env::var("FERRY_BENCH_MATRIX_CASES").as_deref() {
        Ok("file") => !small,
        Ok("files") => small,
        _ => true,
    }
}

/// What one row of files moves.
#[derive(Clone)]
struct Case {
    /// Its size as the table says it.
    size: String,
    /// Payload bytes.
    bytes: u64,
    /// The file or directory moved.
    src: PathBuf,
    /// BLAKE3 of every file in it.
    digest: BTreeMap<PathBuf, [u8; 32]>,
}

impl Case {
    fn new(size: String, bytes: u64, src: PathBuf) -> io::Result<Case> {
        let digest = digests(&src)?;
        Ok(Case {
            size,
            bytes,
            src,
            digest,
        })
    }
}

/// One timed run.
struct Sample {
    secs: f64,
    connected: f64,
    first_byte: f64,
}

/// The port `ferry relay` listens on inside the relay namespace.
const RELAY_PORT: u16 = 7440;

/// How the two ends of one path are reached: namespaces, addresses, the relay.
struct Ends<'a> {
    lab: Option<&'a Lab>,
    ferry: &'a FsPath,
    /// Held, not read: the relay runs while the path is measured.
    _relay: Option<RelayChild>,
    nameplate: std::sync::atomic::AtomicU32,
}

impl<'a> Ends<'a> {
    fn new(path: &Path, lab: Option<&'a Lab>, ferry: &'a FsPath) -> io::Result<Ends<'a>> {
        let relay = match lab.and_then(|l| l.relay.as_ref()) {
            Some(ns) => Some(RelayChild::start(ns, ferry)?),
            None => None,
        };
        Ok(Ends {
            lab,
            ferry,
            _relay: relay,
            // Distinct per path, so that a lingering session of one path never meets the next.
            nameplate: std::sync::atomic::AtomicU32::new(
                100 + 100 * PATHS.iter().position(|p| p == path).unwrap_or(0) as u32,
            ),
        })
    }

    fn server(&self) -> Option<&Netns> {
        self.lab.map(|l| &l.server)
    }

    fn client(&self) -> Option<&Netns> {
        self.lab.map(|l| &l.client)
    }

    /// The sender's address: the server namespace's, or loopback.
    fn server_ip(&self) -> Ipv4Addr {
        self.lab.map_or(Ipv4Addr::LOCALHOST, |l| l.server_ip())
    }

    /// The relay as (the client sees it, the server sees it).
    fn relay_addrs(&self) -> Option<(SocketAddr, SocketAddr)> {
        let (c, s) = self.lab?.relay_ips()?;
        Some(((c, RELAY_PORT).into(), (s, RELAY_PORT).into()))
    }

    /// One TCP connection across the path, server side first (through `ferry relay` on a relay path,
    /// paired by its client), and the instant the client side started connecting.
    fn tcp_pair(&self) -> io::Result<(TcpStream, TcpStream, Instant)> {
        match self.relay_addrs() {
            Some((via_client, via_server)) => {
                let hash = [0x4d; 32];
                let wait = Duration::from_secs(30);
                // The clock starts on the thread inside the namespace: entering it is no part
                // of the path.
                let connect = |ns: Option<&Netns>, addr, role| {
                    in_ns(ns, || {
                        let t0 = Instant::now();
                        ferry_relay::connect(addr, role, hash, wait).map(|s| (s, t0))
                    })
                    .map_err(io::Error::other)
                };
                std::thread::scope(|s| {
                    let tx =
                        s.spawn(|| connect(self.server(), via_server, ferry_relay::Role::Sender));
                    let (rx, t0) = connect(self.client(), via_client, ferry_relay::Role::Receiver)?;
                    let (tx, _) = tx
                        .join()
                        .map_err(|_| io::Error::other("relay connect panicked"))??;
                    Ok::<_, io::Error>((tx, rx, t0))
                })
            }
            None => {
                let listener = in_ns(self.server(), || TcpListener::bind((self.server_ip(), 0)))?;
                let addr = listener.local_addr()?;
                let (rx, t0) = in_ns(self.client(), || {
                    let t0 = Instant::now();
                    TcpStream::connect(addr).map(|s| (s, t0))
                })?;
                Ok((listener.accept()?.0, rx, t0))
            }
        }
    }

    /// A plaintext copy of `bytes` from the server's side to the client's, its sockets tuned by `tune`.
    fn raw_copy(&self, bytes: u64, tune: layers::Tune) -> io::Result<Sample> {
        let (tx, rx, t0) = self.tcp_pair()?;
        tune.apply(&tx, &rx)?;
        let connected = t0.elapsed().as_secs_f64();
        let sender = std::thread::spawn(move || pump(tx, bytes));
        let (got, first) = drain(rx, t0)?;
        let secs = t0.elapsed().as_secs_f64();
        sender
            .join()
            .map_err(|_| io::Error::other("copy thread panicked"))??;
        if got != bytes {
            return Err(io::Error::other(format!(
                "raw copy: {got} of {bytes} bytes arrived"
            )));
        }
        Ok(Sample {
            secs,
            connected,
            first_byte: first,
        })
    }

    /// `ferry send src` in the server's namespace, `ferry receive` into `out` in the client's.
    fn ferry_send(&self, src: &FsPath, out: &FsPath, scratch: &Scratch) -> io::Result<Sample> {
        self.ferry_send_with(src, out, scratch, &[])
    }

    /// [`Ends::ferry_send`] with `extra` arguments for `ferry send`.
    fn ferry_send_with(
        &self,
        src: &FsPath,
        out: &FsPath,
        scratch: &Scratch,
        extra: &[&str],
    ) -> io::Result<Sample> {
        let n = self
            .nameplate
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let code = format!("{n}-apple-orbit-violin");
        let mut send = ferry_cmd(self.ferry, self.server(), &scratch.fresh("send-home")?);
        send.args(["send", "--json", "--code", &code]).args(extra);
        match self.relay_addrs() {
            Some((_, via_server)) => {
                send.args(["--force-relay", "--relay", &via_server.to_string()])
            }
            None => send.args(["--listen", &format!("{}:0", self.server_ip())]),
        };
        let mut sender = Spawned::new(send.arg(src))?;
        let listen = sender.wait_for_code()?;

        let mut recv = ferry_cmd(self.ferry, self.client(), &scratch.fresh("recv-home")?);
        recv.args(["receive", "--json", "--yes", "--out"]).arg(out);
        match (self.relay_addrs(), listen) {
            (Some((via_client, _)), _) => {
                recv.args(["--force-relay", "--relay", &via_client.to_string()])
            }
            (None, Some(listen)) => recv.args(["--peer", &listen]),
            (None, None) => {
                return Err(io::Error::other("ferry send reported no listening address"))
            }
        };
        let t0 = Instant::now();
        let mut receiver = Spawned::new(recv.arg(&code))?;
        let events = receiver.first_events();
        let recv_ok = receiver.child.wait()?.success();
        let secs = t0.elapsed().as_secs_f64();
        let send_ok = sender.child.wait()?.success();
        if !(recv_ok && send_ok) {
            return Err(io::Error::other(format!(
                "ferry send/receive failed in the matrix:\nsender: {}\nreceiver: {}",
                sender.stderr(),
                receiver.stderr()
            )));
        }
        event_times(events, t0, secs)
    }
}

/// A sample from a receiving `ferry`'s event times (see [`Spawned::first_events`]), started at `t0`.
fn event_times(
    events: std::thread::JoinHandle<(Option<Instant>, Option<Instant>)>,
    t0: Instant,
    secs: f64,
) -> io::Result<Sample> {
    let (connected, first) = events
        .join()
        .map_err(|_| io::Error::other("reader panicked"))?;
    let since = |t: Option<Instant>, what| {
        t.map(|t| t.duration_since(t0).as_secs_f64())
            .ok_or_else(|| io::Error::other(format!("the receiver reported no {what}")))
    };
    Ok(Sample {
        secs,
        connected: since(connected, "connection")?,
        first_byte: since(first, "data")?,
    })
}

/// Runs `f` inside `ns` (on a thread there), or here.
fn in_ns<T: Send>(ns: Option<&Netns>, f: impl FnOnce() -> T + Send) -> T {
    match ns {
        Some(ns) => ns.enter(f),
        None => f(),
    }
}

/// A `ferry` command with its own configuration, cache and runtime directories under `home`, no
/// relay or discovery from the environment, inside `ns` when there is one.
fn ferry_cmd(ferry: &FsPath, ns: Option<&Netns>, home: &FsPath) -> Command {
    let mut c = Command::new(ferry);
    for (var, sub) in [
        ("XDG_RUNTIME_DIR", "runtime"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_CONFIG_HOME", "config"),
    ] {
        c.env(var, home.join(sub));
    }
    c.env_remove("FERRY_RELAY")
        .env("FERRY_NO_DISCOVERY", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(ns) = ns {
        ns.inside(&mut c);
    }
    c
}

/// A child `ferry` whose JSON events are read line by line and whose standard error is kept.
struct Spawned {
    child: Child,
    lines: Option<BufReader<std::process::ChildStdout>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Spawned {
    fn new(cmd: &mut Command) -> io::Result<Spawned> {
        let mut child = cmd.spawn()?;
        let lines = child.stdout.take().map(BufReader::new);
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Ok(Spawned {
            child,
            lines,
            stderr: Some(stderr),
        })
    }

    /// Reads events until `code`; its `listen` address. The rest is drained on a thread.
    fn wait_for_code(&mut self) -> io::Result<Option<String>> {
        let v = self.wait_for_event("code")?;
        Ok(v["listen"].as_str().map(str::to_string))
    }

    /// Reads events until the first `event`, which it returns. The rest is drained on a thread.
    fn wait_for_event(&mut self, event: &str) -> io::Result<serde_json::Value> {
        let mut lines = self.lines.take().expect("stdout");
        let mut line = String::new();
        loop {
            line.clear();
            if lines.read_line(&mut line)? == 0 {
                return Err(io::Error::other(format!(
                    "ferry ended before its {event} event: {}",
                    self.stderr()
                )));
            }
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["event"] == event {
                std::thread::spawn(move || io::copy(&mut lines, &mut io::sink()));
                return Ok(v);
            }
        }
    }

    /// A thread that reads every event and returns when the `connected` event and the first `progress`
    /// or `file-done` event came. With `FERRY_BENCH_MATRIX_TRACE` set, it also prints to standard error
    /// when (in ms from its start) each event other than `file-done` came, and every 1,000th `file-done`:
    /// where a row's time goes.
    fn first_events(&mut self) -> std::thread::JoinHandle<(Option<Instant>, Option<Instant>)> {
        let lines = self.lines.take().expect("stdout");
        let trace = std::env::var_os("FERRY_BENCH_MATRIX_TRACE").is_some();
        let t0 = Instant::now();
        std::thread::spawn(move || {
            let (mut connected, mut first) = (None, None);
            let mut timeline = String::new();
            let mut files = 0u64;
            for line in lines.lines() {
                let Ok(line) = line else { break };
                if trace {
                    let ms = t0.elapsed().as_secs_f64() * 1e3;
                    let file_done = line.contains("\"event\":\"file-done\"");
                    files += u64::from(file_done);
                    if !file_done || files.is_multiple_of(1000) {
                        let event: serde_json::Value =
                            serde_json::from_str(&line).unwrap_or_default();
                        let name = event["event"].as_str().unwrap_or("?");
                        let bytes = event["bytes_done"]
                            .as_u64()
                            .map_or(String::new(), |b| format!(" {b} B"));
                        timeline += &format!(
                            " {name}{}{bytes} {ms:.1};",
                            if file_done {
                                format!(" {files}")
                            } else {
                                String::new()
                            }
                        );
                    }
                }
                if connected.is_none() && line.contains("\"event\":\"connected\"") {
                    connected = Some(Instant::now());
                }
                if first.is_none()
                    && (line.contains("\"event\":\"progress\"")
                        || line.contains("\"event\":\"file-done\""))
                {
                    first = Some(Instant::now());
                }
            }
            if trace {
                use std::io::Write;
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                let _ = writeln!(std::io::stderr(), "trace (ms):{timeline} exit {ms:.1}");
            }
            (connected, first)
        })
    }

    /// What the child wrote to standard error (waits for it to close).
    fn stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `ferry relay` inside the relay namespace, killed on drop.
struct RelayChild(Child);

impl RelayChild {
    fn start(ns: &Netns, ferry: &FsPath) -> io::Result<RelayChild> {
        let mut cmd = Command::new(ferry);
        ns.inside(&mut cmd)
            .args(["relay", "--listen", &format!("0.0.0.0:{RELAY_PORT}")])
            .args(["--stats-interval", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let relay = RelayChild(cmd.spawn()?);
        let deadline = Instant::now() + Duration::from_secs(10);
        while ns
            .enter(|| TcpStream::connect((Ipv4Addr::LOCALHOST, RELAY_PORT)))
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(io::Error::other("ferry relay did not start listening"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(relay)
    }
}

impl Drop for RelayChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes `bytes` of a fixed pattern from a 1 MiB buffer, then half-closes.
fn pump(mut s: TcpStream, bytes: u64) -> io::Result<()> {
    let buf = vec![0x5au8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..n])?;
        left -= n as u64;
    }
    s.shutdown(Shutdown::Write)
}

/// Reads to the end; the byte count and the seconds from `t0` to the first byte.
fn drain(mut s: TcpStream, t0: Instant) -> io::Result<(u64, f64)> {
    let mut buf = vec![0u8; 1 << 20];
    let (mut total, mut first) = (0u64, None);
    loop {
        match s.read(&mut buf)? {
            0 => return Ok((total, first.unwrap_or(f64::NAN))),
            n => {
                first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                total += n as u64;
            }
        }
    }
}

/// BLAKE3 of every file under `root` (or of `root` itself), by path relative to it.
fn digests(root: &FsPath) -> io::Result<BTreeMap<PathBuf, [u8; 32]>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        } else {
            let mut h = blake3::Hasher::new();
            h.update_reader(fs::File::open(&p)?)?;
            let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
            out.insert(rel, *h.finalize().as_bytes());
        }
    }
    Ok(out)
}

/// The matrix's scratch directory on tmpfs, removed on drop.
struct Scratch(PathBuf);

/// Set when a signal is ending the process (`mount::Leftovers`): from then on no scratch directory or
/// mount is made, so none is made after the clean-up.
static ENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn end() {
    ENDING.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether a signal is ending the process: a step that failed since failed because of it.
pub fn is_ending() -> bool {
    ENDING.load(std::sync::atomic::Ordering::SeqCst)
}

/// The error of a step begun while a signal ends the process.
fn refuse_if_ending() -> io::Result<()> {
    if is_ending() {
        return Err(io::Error::other("the bench is ending on a signal"));
    }
    Ok(())
}

impl Scratch {
    fn new(base: &FsPath) -> io::Result<Scratch> {
        let dir = Scratch::of_this_process(base);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("src"))?;
        Ok(Scratch(dir))
    }

    /// Where this process's scratch under `base` is.
    fn of_this_process(base: &FsPath) -> PathBuf {
        base.join(format!("ferry-bench-matrix-{}", std::process::id()))
    }

    /// An empty directory `name` (emptied if it was there).
    fn fresh(&self, name: &str) -> io::Result<PathBuf> {
        refuse_if_ending()?;
        let d = self.0.join(name);
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d)?;
        Ok(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
