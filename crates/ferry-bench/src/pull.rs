//! `ferry bench share`'s pull rows: `pull` of a file or tree against `send` + `receive` of the same, both
//! over the real encrypted channel on loopback TCP, in this process, A/B interleaved.
//!
//! A: a sharer ([`ferry_share::io::serve`] on a thread) and [`ferry_share::pull::pull`] into a fresh
//! directory, timed from the connection to the client's end (the sharer's walk included). B: the transfer
//! engine's send on a thread and receive here (the engine case of `ferry bench transfer`, its walk
//! included). The ratio is pull / send+receive in throughput: 1 is as fast, above 1 faster.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferry_share::wire::SharePath;
use ferry_transfer::ReceiveOptions;

use crate::report::{median, rusage_cpu, write_random_file, Report, Row};
use crate::share::{channel, other, start_sharer, Options};
use crate::transfer::{engine_run, write_small_tree};

const BENCH: &str = "share";

/// One pull of `path` from the sharer at `addr` into `out`; seconds.
fn pull_run(
    addr: std::net::SocketAddr,
    path: &SharePath,
    out: &Path,
    partial: &Path,
) -> io::Result<f64> {
    let start = Instant::now();
    let (reader, writer) = channel(addr)?;
    let mut opts = ReceiveOptions::new(out);
    opts.partial_dir = Some(partial.to_path_buf());
    ferry_share::pull::pull(reader, writer, path, &opts, &mut ()).map_err(other)?;
    Ok(start.elapsed().as_secs_f64())
}

fn fresh(dir: &Path) -> io::Result<()> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)
}

/// The pull rows, with data under `scratch` (its `share` directory is shared).
pub fn run(opts: &Options, scratch: &Path, report: &mut Report) -> io::Result<()> {
    let share = scratch.join("pull-share");
    fresh(&share)?;
    write_random_file(&share.join("file.bin"), opts.file_bytes, 0x5eed)?;
    write_small_tree(&share.join("tree"), opts.small_files)?;
    let addr = start_sharer(&share, &scratch.join("pull-cache"))?;
    let (out, partial) = (scratch.join("pull-out"), scratch.join("pull-partial"));
    let size = crate::channel::size_name(opts.file_bytes as usize);
    // (name, case, amount, unit, CPU unit, CPU per amount in that unit)
    let cases: [(&str, String, f64, &str, &str, f64); 2] = [
        (
            "file.bin",
            format!("pull of a {size} file vs send+receive"),
            opts.file_bytes as f64 / 1e9,
            "GB/s",
            "s/GB",
            1.0,
        ),
        (
            "tree",
            format!(
                "pull of {} files of 4-8 KiB vs send+receive",
                opts.small_files
            ),
            opts.small_files as f64,
            "files/s",
            "µs/file",
            1e6,
        ),
    ];
    for (name, case, amount, unit, cpu_unit, cpu_scale) in cases {
        let path = SharePath::new(name.as_bytes()).map_err(other)?;
        let source: PathBuf = share.join(name);
        let (mut pulled, mut sent) = (Vec::new(), Vec::new());
        let (mut pulled_cpu, mut sent_cpu) = (Vec::new(), Vec::new());
        for _ in 0..opts.runs {
            fresh(&out)?;
            fresh(&partial)?;
            let cpu = rusage_cpu(libc::RUSAGE_SELF);
            sent.push(amount / engine_run(std::slice::from_ref(&source), &out, &partial, true)?);
            sent_cpu.push((rusage_cpu(libc::RUSAGE_SELF) - cpu) * cpu_scale / amount);
            fresh(&out)?;
            fresh(&partial)?;
            let cpu = rusage_cpu(libc::RUSAGE_SELF);
            pulled.push(amount / pull_run(addr, &path, &out, &partial)?);
            pulled_cpu.push((rusage_cpu(libc::RUSAGE_SELF) - cpu) * cpu_scale / amount);
        }
        report.push(
            Row::new(BENCH, case, median(&mut pulled), unit).with_baseline(median(&mut sent)),
        );
        // Both ends run in this process: its CPU time is the work of both, which the machine's
        // other tenants do not change as much as they change the rate (lower is better here).
        report.push(
            Row::new(
                BENCH,
                "  CPU of both ends (lower is better)",
                median(&mut pulled_cpu),
                cpu_unit,
            )
            .with_baseline(median(&mut sent_cpu)),
        );
    }
    for dir in [&share, &out, &partial, &scratch.join("pull-cache")] {
        let _ = fs::remove_dir_all(dir);
    }
    Ok(())
}
