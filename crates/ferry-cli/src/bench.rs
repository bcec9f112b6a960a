//! `ferry bench [LAYER...]`.

use anyhow::bail;
use clap::Args;
use ferry_bench::{channel, matrix, relay, share, transfer, Report};

/// Arguments of `ferry bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Layers to run: channel, transfer, relay, share (default: all), or matrix (only when named:
    /// layers × emulated paths, needs root), or mount (only when named: a FUSE mount on loopback, needs
    /// root and /dev/fuse).
    layers: Vec<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// A short smoke run with small sizes (figures are not comparable to full runs).
    #[arg(long)]
    quick: bool,
    /// Samples per case; medians are reported.
    #[arg(long)]
    runs: Option<usize>,
    /// matrix: draw PNG plots into this directory.
    #[arg(long, value_name = "DIR")]
    plots: Option<std::path::PathBuf>,
    /// matrix: the paths to measure, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "PATH,...")]
    paths: Vec<String>,
    /// mount: also read a sparse file of this size through a mount with a 1 GiB cache, for the daemon's
    /// peak RSS (e.g. 10G).
    #[arg(long, value_name = "SIZE", value_parser = crate::transfer_cmd::parse_size)]
    rss_size: Option<u64>,
    /// matrix: only these rows, by layer name, comma-separated (e.g. `raw TCP,raw TCP ×4,ferry send`;
    /// default: all).
    #[arg(long, value_delimiter = ',', value_name = "LAYER,...")]
    rows: Vec<String>,
    /// matrix: measure nothing, draw the plots (into --plots) again from saved rows: `matrix.jsonl`
    /// files written by earlier `--plots` runs, or `--json` output; a later file's row replaces the same
    /// row of an earlier one.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "FILE,...",
        requires = "plots"
    )]
    replot: Vec<std::path::PathBuf>,
}

/// Runs the selected layers.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let layers = if args.layers.is_empty() {
        ["channel", "transfer", "relay", "share"]
            .map(String::from)
            .to_vec()
    } else {
        args.layers.clone()
    };
    // The matrix has its own table; the other layers share one, with its header printed once.
    let mut report = None;
    for layer in &layers {
        if layer == "matrix" {
            run_matrix(&args)?;
            continue;
        }
        let report = report.get_or_insert_with(|| Report::new(args.json));
        match layer.as_str() {
            "channel" => {
                let mut opts = if args.quick {
                    channel::Options::quick()
                } else {
                    channel::Options::default()
                };
                if let Some(r) = args.runs {
                    opts.runs = r.max(1);
                }
                channel::run(&opts, report);
            }
            "transfer" => {
                let mut opts = if args.quick {
                    transfer::Options::quick()
                } else {
                    transfer::Options::default()
                };
                if let Some(r) = args.runs {
                    opts.runs = r.max(1);
                }
                let ferry = std::env::current_exe()?;
                transfer::run(&opts, &ferry, report)?;
            }
            "relay" => {
                let mut opts = relay::BenchOptions::default();
                if args.quick {
                    opts.bytes = 64 << 20;
                    opts.runs = 1;
                    opts.sessions = 100;
                }
                if let Some(r) = args.runs {
                    opts.runs = r.max(1);
                }
                for row in relay::run(&opts)? {
                    report.push(row);
                }
            }
            "share" => {
                let mut opts = if args.quick {
                    share::Options::quick()
                } else {
                    share::Options::default()
                };
                if let Some(r) = args.runs {
                    opts.runs = r.max(1);
                }
                share::run(&opts, &std::env::current_exe()?, report)?;
            }
            "mount" => {
                if let Some(why) = matrix::mount::unavailable() {
                    bail!("ferry bench mount cannot run here: {why}")
                }
                let mut opts = if args.quick {
                    matrix::mount::Options::quick()
                } else {
                    matrix::mount::Options::default()
                };
                if let Some(r) = args.runs {
                    opts.runs = r.max(1);
                }
                opts.rss_bytes = args.rss_size;
                let base = std::path::Path::new("/dev/shm");
                // Ended by a signal, the bench leaves no mount (sshfs's outlive it) and no scratch.
                let leftovers = matrix::mount::Leftovers::of(base);
                let _kept = crate::interrupt::keep_until_exit(leftovers);
                let ran = matrix::mount::run(&opts, &std::env::current_exe()?, base, report);
                if ran.is_err() && matrix::is_ending() {
                    // The signal's handler took the run's files away and is ending the process with its
                    // own message: the error that caused is not one to print.
                    loop {
                        std::thread::park();
                    }
                }
                ran?;
            }
            other => {
                bail!("unknown benchmark layer {other:?} (known: channel, transfer, relay, share, matrix, mount)")
            }
        }
    }
    Ok(())
}

/// `ferry bench matrix`: every path the lab can build here (loopback only without root).
fn run_matrix(args: &BenchArgs) -> anyhow::Result<()> {
    let mut opts = if args.quick {
        matrix::Options::quick()
    } else {
        matrix::Options::default()
    };
    if let Some(r) = args.runs {
        opts.runs = r.max(1);
    }
    if !args.paths.is_empty() {
        opts.paths = args
            .paths
            .iter()
            .map(|name| {
                ferry_lab::Path::by_name(name).ok_or_else(|| {
                    let known: Vec<_> = ferry_lab::PATHS.iter().map(|p| p.name).collect();
                    anyhow::anyhow!("unknown path {name:?} (known: {})", known.join(", "))
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    opts.rows = args.rows.clone();
    if !args.replot.is_empty() {
        let dir = args.plots.as_deref().expect("clap requires --plots");
        for file in matrix::redraw(&args.replot, dir)? {
            crate::ui::stderr_line(&format!("wrote {}", file.display()));
        }
        return Ok(());
    }
    let printer = matrix::Printer::new(args.json);
    let m = matrix::run(&opts, &std::env::current_exe()?, &printer)?;
    if let Some(dir) = &args.plots {
        for png in m.plot(dir)? {
            crate::ui::stderr_line(&format!("wrote {}", png.display()));
        }
    }
    if m.cells.iter().any(|c| c.verified == Some(false)) {
        bail!("a received file did not match its source");
    }
    Ok(())
}
