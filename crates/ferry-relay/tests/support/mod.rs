//! What the relay's test binaries share: a relay on a thread, test hashes, sources on distinct
//! loopback addresses, and waiting for the counters.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ferry_relay::{Relay, RelayConfig, RelayHandle, Stats};

pub const T: Duration = Duration::from_secs(20);

pub struct Running {
    pub addr: SocketAddr,
    pub handle: RelayHandle,
    thread: Option<JoinHandle<std::io::Result<Stats>>>,
}

impl Running {
    pub fn stop(mut self) -> Stats {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

pub fn quiet() -> RelayConfig {
    RelayConfig {
        print_stats: false,
        worker_threads: 2,
        shutdown_grace: Duration::from_secs(1),
        ..RelayConfig::default()
    }
}

pub fn start(config: RelayConfig) -> Running {
    let relay = Relay::bind("127.0.0.1:0", config).unwrap();
    let addr = relay.local_addr();
    let handle = relay.shutdown_handle();
    let thread = Some(thread::spawn(move || relay.run_blocking()));
    Running {
        addr,
        handle,
        thread,
    }
}

pub fn hash(n: u64) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&n.to_le_bytes());
    h[8] = 0xfe;
    h
}

/// Connects from `src` (a loopback address) to `to`.
pub fn connect_from(src: [u8; 4], to: SocketAddr) -> TcpStream {
    static RT: std::sync::LazyLock<tokio::runtime::Runtime> = std::sync::LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    });
    let s = RT
        .block_on(async {
            let sock = tokio::net::TcpSocket::new_v4()?;
            sock.bind(SocketAddr::from((src, 0)))?;
            sock.connect(to).await
        })
        .unwrap_or_else(|e| panic!("connect from {src:?}: {e}"));
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Waits until `done` holds for the relay's stats.
pub fn wait_stats(relay: &Running, what: &str, done: impl Fn(&Stats) -> bool) {
    let deadline = Instant::now() + T;
    loop {
        let st = relay.handle.stats();
        if done(&st) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {st}");
        thread::sleep(Duration::from_millis(10));
    }
}
