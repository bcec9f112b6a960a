//! `ferry bench share` until the CLI runs it: `cargo run --release -p ferry-bench --example share_bench
//! [--quick] [RUNS] [FILE_MIB] [READS]`.

use ferry_bench::{share, Report};

fn main() -> std::io::Result<()> {
    share::serve_if_child();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut opts = if quick {
        share::Options::quick()
    } else {
        share::Options::default()
    };
    let mut numbers = args.iter().filter_map(|a| a.parse::<u64>().ok());
    if let Some(runs) = numbers.next() {
        opts.runs = runs.max(1) as usize;
    }
    if let Some(mib) = numbers.next() {
        opts.file_bytes = mib << 20;
        opts.rss_file_bytes = mib << 20;
    }
    if let Some(reads) = numbers.next() {
        opts.reads = reads as usize;
    }
    let exe = std::env::current_exe()?;
    share::run(&opts, &exe, &mut Report::new(false))
}
