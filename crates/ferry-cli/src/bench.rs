//! `ferry bench [LAYER...]`.

use anyhow::bail;
use clap::Args;
use ferry_bench::{channel, relay, share, transfer, Report};

/// Arguments of `ferry bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Layers to run: channel, transfer, relay, share (default: all).
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
}

/// Runs the selected layers.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let layers = if args.layers.is_empty() {
        ["channel", "transfer", "relay", "share"]
            .map(String::from)
            .to_vec()
    } else {
        args.layers
    };
    let mut report = Report::new(args.json);
    for layer in &layers {
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
                channel::run(&opts, &mut report);
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
                transfer::run(&opts, &ferry, &mut report)?;
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
                share::run(&opts, &std::env::current_exe()?, &mut report)?;
            }
            other => {
                bail!("unknown benchmark layer {other:?} (known: channel, transfer, relay, share)")
            }
        }
    }
    Ok(())
}
