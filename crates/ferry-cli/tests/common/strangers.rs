//! Strangers who know only a port: sockets from many loopback sources that say nothing, trickle, or
//! stall after the key exchange, each reopened as soon as it is closed, on a thread of their own.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_channel::{Auth, Config, Handshake, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// What one attacking socket does once connected.
#[derive(Clone, Copy)]
pub enum Stranger {
    /// Sends nothing.
    Silent,
    /// Sends one byte every 300 ms.
    Trickling,
    /// Sends a real key share and the terminator that follows it, then nothing: its first flight is
    /// complete, so only its age can free its slot.
    Stalling,
}

/// Connects from `source` (any 127.0.0.0/8 address: Linux routes all of it on lo) to `target`.
pub async fn dial(source: Ipv4Addr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(target).await
}

/// Waits until the other side closes `s` (or 20 s), reading and dropping what it sends.
pub async fn until_closed(s: &mut TcpStream) {
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
pub struct Flood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// One socket of each `(source, kind)` in `plan`, against `target`.
    pub fn start(target: SocketAddr, plan: Vec<(Ipv4Addr, Stranger)>) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let (stop2, opened2) = (Arc::clone(&stop), Arc::clone(&opened));
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                for (source, kind) in plan {
                    let (stop, opened) = (Arc::clone(&stop2), Arc::clone(&opened2));
                    tokio::spawn(harass(source, target, kind, stop, opened));
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

    /// Connections opened so far, reopened ones included.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
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
