//! A sharer served over real encrypted channels on loopback TCP, both sides authenticated by pinned
//! identity keys: `io::serve` on a thread per client, as `ferry share` runs it.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_channel::blocking::{handshake_until, split_tcp, SecureReader, SecureWriter};
use ferry_channel::{Auth, ChannelError, Config, Handshake, IdentityKey, PeerKey, Role};
use ferry_share::fs::{OutboardCache, ShareRoot};
use ferry_share::io::{serve, Changes};
use ferry_share::server::ServerConfig;

pub fn handshake(
    stream: TcpStream,
    role: Role,
    key: IdentityKey,
    pinned: [u8; 32],
) -> Result<ferry_channel::Established, ChannelError> {
    let hs = Handshake::new(
        role,
        Config::ferry(),
        Auth::Identity {
            key,
            peer: PeerKey::Pinned(pinned),
        },
    );
    let mut s = stream;
    handshake_until(&mut s, hs, Instant::now() + Duration::from_secs(10))
}

/// Something done to one connection's sharer side once it has written `at` bytes: `Err` cuts the
/// connection there (the sharer's write fails, as when its process is killed), `Ok` lets it go on.
pub struct Tap {
    pub at: u64,
    pub action: Box<dyn FnOnce() -> io::Result<()> + Send>,
}

/// The sharer's socket, with a [`Tap`] on what it writes.
struct Tapped {
    inner: TcpStream,
    written: u64,
    tap: Option<Tap>,
}

impl Write for Tapped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.tap.as_ref().is_some_and(|t| self.written >= t.at) {
            let tap = self.tap.take().expect("checked");
            if let Err(e) = (tap.action)() {
                let _ = self.inner.shutdown(std::net::Shutdown::Both);
                return Err(e);
            }
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

pub struct Sharer {
    pub log: Arc<Mutex<Vec<String>>>,
    pub addr: SocketAddr,
    pub key: [u8; 32],
    /// Taps for the next connections, one each, in order.
    pub taps: Arc<Mutex<VecDeque<Tap>>>,
    /// The share every session serves.
    pub root: Arc<ShareRoot>,
}

/// Shares `share` with one paired client (`client`), caching outboards in `cache`; clients one after another
/// or at once, each on a thread of its own.
pub fn start_sharer(share: &Path, cache: &Path, client: [u8; 32], changes: Changes) -> Sharer {
    start_sharer_with(share, cache, client, changes, ServerConfig::default())
}

/// [`start_sharer`] with the sessions' settings (a writable share, ...).
pub fn start_sharer_with(
    share: &Path,
    cache: &Path,
    client: [u8; 32],
    changes: Changes,
    config: ServerConfig,
) -> Sharer {
    let root = ShareRoot::open(share).unwrap();
    start_sharer_of(root, cache, client, changes, config)
}

/// [`start_sharer_with`] of a share opened by the caller (with its own `--min-free`, ...).
pub fn start_sharer_of(
    root: ShareRoot,
    cache: &Path,
    client: [u8; 32],
    changes: Changes,
    config: ServerConfig,
) -> Sharer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let key = IdentityKey::generate();
    let public = key.public();
    let seed = *key.seed();
    let log = Arc::new(Mutex::new(Vec::new()));
    let taps: Arc<Mutex<VecDeque<Tap>>> = Arc::default();
    let (log2, taps2) = (Arc::clone(&log), Arc::clone(&taps));
    let root = Arc::new(root);
    let served = Arc::clone(&root);
    let cache = OutboardCache::new(cache.to_path_buf());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let stream = stream.unwrap();
            let tap = taps2.lock().unwrap().pop_front();
            let (log2, root, cache, changes, config) = (
                Arc::clone(&log2),
                Arc::clone(&served),
                cache.clone(),
                changes.clone(),
                config.clone(),
            );
            std::thread::spawn(move || {
                let est = match handshake(
                    stream.try_clone().unwrap(),
                    Role::Responder,
                    IdentityKey::from_seed(seed),
                    client,
                ) {
                    Ok(e) => e,
                    Err(e) => {
                        log2.lock().unwrap().push(format!("handshake: {e}"));
                        return;
                    }
                };
                let reader = SecureReader::new(stream.try_clone().unwrap(), est.opener);
                let tapped = Tapped {
                    inner: stream,
                    written: 0,
                    tap,
                };
                let writer = SecureWriter::new(tapped, est.sealer);
                let mut log = |m: &str| log2.lock().unwrap().push(m.to_string());
                let _ = serve(reader, writer, &root, &cache, &changes, config, &mut log);
            });
        }
    });
    Sharer {
        log,
        addr,
        key: public,
        taps,
        root,
    }
}

/// A channel to the sharer, as the paired client `key`.
pub fn channel(
    s: &Sharer,
    key: IdentityKey,
) -> Result<(SecureReader<TcpStream>, SecureWriter<TcpStream>), ChannelError> {
    let stream = TcpStream::connect(s.addr).unwrap();
    // No test waits forever: a read that gets nothing for 10 s fails.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let est = handshake(stream.try_clone().unwrap(), Role::Initiator, key, s.key)?;
    split_tcp(stream, est)
}
