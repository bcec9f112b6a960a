//! Strangers who know only the port of a waiting side: sockets that say nothing, that trickle a byte at a
//! time, or that stall right after the key exchange, from many source addresses, each reopened as soon as
//! it is closed. A paired client must still get through within its `--wait`.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_channel::{Auth, Config, Handshake, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// What one attacking socket does once connected.
#[derive(Clone, Copy)]
enum Stranger {
    /// Sends nothing.
    Silent,
    /// Sends one byte every 300 ms.
    Trickling,
    /// Sends a real key share and the terminator that follows it, then nothing: its first flight is
    /// complete, so only its age can free its slot.
    Stalling,
}

/// Connects from `source` to `target`.
async fn dial(source: Ipv4Addr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(target).await
}

/// Waits until the other side closes `s` (or 20 s), reading and dropping what it sends.
async fn until_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// One stranger's socket, opened again and again until `stop`; counts every connection in `opened`.
async fn harass(
    source: Ipv4Addr,
    target: SocketAddr,
    kind: Stranger,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = dial(source, target).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        match kind {
            Stranger::Silent => until_closed(&mut s).await,
            Stranger::Trickling => {
                let mut tick = tokio::time::interval(Duration::from_millis(300));
                let mut buf = [0u8; 4096];
                loop {
                    tokio::select! {
                        _ = tick.tick() => if s.write_all(&[0x5a]).await.is_err() { break },
                        r = s.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) { break },
                    }
                }
            }
            Stranger::Stalling => {
                let mut hs = Handshake::new(
                    Role::Initiator,
                    Config::ferry(),
                    Auth::Code(b"no code at all".to_vec()),
                );
                let mut buf = [0u8; 4096];
                if s.write_all(&hs.take_output()).await.is_ok() {
                    while hs.session_id().is_none() {
                        match s.read(&mut buf).await {
                            Ok(n) if n > 0 => {
                                let _ = hs.feed(&buf[..n]);
                            }
                            _ => break,
                        }
                    }
                    // The terminator is the first 16 bytes of what follows the key exchange.
                    let next = hs.take_output();
                    if next.len() >= 16 && s.write_all(&next[..16]).await.is_ok() {
                        until_closed(&mut s).await;
                    }
                }
            }
        }
        drop(s);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A flood running on its own thread until dropped.
struct Flood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// From each of 127.0.0.2 ..= 127.0.0.40: two silent sockets and one trickling; from every fourth of
    /// them also one that stalls after its first flight.
    fn start(target: SocketAddr) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let (stop2, opened2) = (Arc::clone(&stop), Arc::clone(&opened));
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                for last in 2..=40u8 {
                    let source = Ipv4Addr::new(127, 0, 0, last);
                    let mut kinds = vec![Stranger::Silent, Stranger::Silent, Stranger::Trickling];
                    if last % 4 == 0 {
                        kinds.push(Stranger::Stalling);
                    }
                    for kind in kinds {
                        let (stop, opened) = (Arc::clone(&stop2), Arc::clone(&opened2));
                        tokio::spawn(harass(source, target, kind, stop, opened));
                    }
                }
                while !stop2.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            // Dropping the runtime closes every stranger's socket.
        });
        Flood {
            stop,
            opened,
            thread: Some(thread),
        }
    }

    fn sockets() -> usize {
        39 * 3 + (2..=40).filter(|l| l % 4 == 0).count()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_flood_of_strangers_sockets_does_not_keep_a_paired_client_out() {
    let w = World::new();
    w.pair("a", "b");
    std::fs::write(w.src().join("hello.txt"), b"hello").unwrap();
    let (sharer, ready) = w.share("a", &[]);
    let target: SocketAddr = ready["listen"].as_str().unwrap().parse().unwrap();
    let flood = Flood::start(target);
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
    let opened = flood.opened.load(Ordering::Relaxed);
    drop(flood);
    eprintln!(
        "{} strangers' sockets at once, {opened} connections opened in all; ls took {took:?}",
        Flood::sockets()
    );
    assert!(
        took.iter().all(|t| *t < Duration::from_secs(20)),
        "{took:?}"
    );
    stop_share(sharer);
}
