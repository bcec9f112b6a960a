//! Strangers who know only the port of a waiting side: sockets that say nothing, that trickle a byte at a
//! time, or that stall right after the key exchange, from many source addresses, each reopened as soon as
//! it is closed. A paired client must still get through within its `--wait`.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::strangers::{Flood, Stranger};
use common::*;

/// From each of 127.0.0.2 ..= 127.0.0.40: two silent sockets and one trickling; from every fourth of
/// them also one that stalls after its first flight.
fn plan() -> Vec<(Ipv4Addr, Stranger)> {
    let mut plan = Vec::new();
    for last in 2..=40u8 {
        let source = Ipv4Addr::new(127, 0, 0, last);
        let mut kinds = vec![Stranger::Silent, Stranger::Silent, Stranger::Trickling];
        if last % 4 == 0 {
            kinds.push(Stranger::Stalling);
        }
        plan.extend(kinds.into_iter().map(|k| (source, k)));
    }
    plan
}

#[test]
fn a_flood_of_strangers_sockets_does_not_keep_a_paired_client_out() {
    let w = World::new();
    w.pair("a", "b");
    std::fs::write(w.src().join("hello.txt"), b"hello").unwrap();
    let (sharer, ready) = w.share("a", &[]);
    let target: SocketAddr = ready["listen"].as_str().unwrap().parse().unwrap();
    let flood = Flood::start(target, plan());
    // Time for the strangers to take every slot (the old sharer then closed each new connection at once).
    std::thread::sleep(Duration::from_secs(2));
    let mut took = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let out = w.ls("b", "a", &["--wait", "20s"]);
        took.push(started.elapsed());
        assert_success("ls during the flood", &out);
        assert!(entries(&out).contains_key("hello.txt"));
    }
    let opened = flood.opened();
    drop(flood);
    eprintln!(
        "{} strangers' sockets at once, {opened} connections opened in all; ls took {took:?}",
        plan().len()
    );
    assert!(
        took.iter().all(|t| *t < Duration::from_secs(20)),
        "{took:?}"
    );
    stop_share(sharer);
}
