//! `ferry bench [LAYER...]`.

use anyhow::bail;
use clap::Args;
use ferry_bench::{channel, Report};

/// Arguments of `ferry bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Layers to run: channel (default: all).
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
        vec!["channel".to_string()]
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
            other => bail!("unknown benchmark layer {other:?} (known: channel)"),
        }
    }
    Ok(())
}
