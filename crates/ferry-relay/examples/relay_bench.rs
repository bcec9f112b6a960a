//! Runs the relay benchmark and prints one line per row: `cargo run --release -p ferry-relay
//! --example relay_bench [BYTES_MIB] [RUNS] [BUFFER_KIB]`.

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut opts = ferry_relay::bench::BenchOptions::default();
    if let Some(mib) = args.next() {
        opts.bytes = mib.parse::<u64>().expect("BYTES_MIB") << 20;
    }
    if let Some(runs) = args.next() {
        opts.runs = runs.parse().expect("RUNS");
    }
    if let Some(kib) = args.next() {
        opts.buffer_size = kib.parse::<usize>().expect("BUFFER_KIB") << 10;
    }
    for r in ferry_relay::bench::run(&opts)? {
        let extra = match (r.baseline, r.ratio) {
            (Some(b), Some(x)) => format!("  (baseline {b:.3}, ratio {x:.3})"),
            _ => String::new(),
        };
        println!("{:<64} {:>12.4} {}{}", r.case, r.value, r.unit, extra);
    }
    Ok(())
}
