//! What the first use of a cached entry in a process costs: its present groups are hashed again.
//!
//! `cargo run --release -p ferry-cache --example rehash -- DIR MIB` fills an entry of MIB MiB in a cache in
//! DIR (a new directory, removed at the end; put it on /dev/shm to measure hashing, not the disk), reopens
//! the cache and times the first `entry()` of it.

use std::time::Instant;

use ferry_cache::Cache;
use ferry_share::tree::Outboard;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(mib)) = (
        args.next(),
        args.next().and_then(|m| m.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: rehash DIR MIB");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    let data = ferry_testkit::pseudo_random(mib << 20, 7);
    let version = Outboard::compute(&data[..], data.len() as u64)
        .expect("hashed")
        .version();
    {
        let cache = Cache::open(&dir, u64::MAX).expect("cache");
        let entry = cache.entry(version).expect("entry");
        for (i, piece) in data.chunks(1 << 20).enumerate() {
            assert!(entry.insert((i << 20) as u64, piece).expect("insert"));
        }
        assert!(entry.is_complete());
    }
    drop(data);
    let cache = Cache::open(&dir, u64::MAX).expect("cache");
    let start = Instant::now();
    let entry = cache.entry(version).expect("entry");
    let took = start.elapsed();
    assert!(entry.is_complete());
    eprintln!(
        "first use of a {mib} MiB entry (every group hashed again): {:.1} ms, {:.0} MiB/s",
        took.as_secs_f64() * 1e3,
        mib as f64 / took.as_secs_f64()
    );
    drop((entry, cache));
    std::fs::remove_dir_all(&dir).expect("cleaned up");
}
