//! Times `ferry_transfer::walk` (the sender's scan of its paths) on its own.
//!
//! `cargo run --release -p ferry-transfer --example walktime -- DIR` walks DIR 31 times and prints
//! the median and the fastest time.

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: walktime DIR");
        std::process::exit(2);
    };
    let paths = [std::path::PathBuf::from(dir)];
    let mut ms = Vec::new();
    for _ in 0..31 {
        let start = std::time::Instant::now();
        let walked = match ferry_transfer::walk(&paths) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("walktime: {e}");
                std::process::exit(1);
            }
        };
        ms.push(start.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(walked);
    }
    ms.sort_by(f64::total_cmp);
    println!("walk: median {:.2} ms, fastest {:.2} ms", ms[15], ms[0]);
}
