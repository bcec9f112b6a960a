//! Helpers shared by the integration tests: temp dirs, loopback connections, a full run.
#![allow(dead_code)]

use ferry_transfer::plain::{PlainSink, PlainSource};
use ferry_transfer::{
    receive, send, walk, ReceiveOptions, ReceiveReport, SendOptions, SendReport, TransferError,
    Walk,
};
use std::io::{self, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("ferry-test-{}-{}-{}", tag, std::process::id(), n));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

fn make_writable(p: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(p) {
        if meta.is_dir() {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    make_writable(&e.path());
                }
            }
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        make_writable(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A connected pair of loopback TCP streams (127.0.0.1 only).
pub fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    (a, b)
}

/// A writer that dies after `limit` bytes (simulates a cut connection).
pub struct CutWriter {
    pub inner: TcpStream,
    pub left: usize,
}

impl Write for CutWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.left == 0 {
            let _ = self.inner.shutdown(Shutdown::Both);
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "cut"));
        }
        let n = buf.len().min(self.left);
        let n = self.inner.write(&buf[..n])?;
        self.left -= n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Receive options into `out` with the partial log under `cache`.
pub fn opts(out: &Path, cache: &Path) -> ReceiveOptions {
    let mut o = ReceiveOptions::new(out);
    o.partial_dir = Some(cache.to_owned());
    o
}

/// Sends `paths` to a receiver with `ropts`; the sender's connection is cut after `cut` bytes.
pub fn run_cut(
    paths: &[&Path],
    ropts: &ReceiveOptions,
    cut: Option<usize>,
) -> (
    Result<SendReport, TransferError>,
    Result<ReceiveReport, TransferError>,
) {
    run_walked(walk(paths).unwrap(), ropts, cut)
}

/// Sends what `walked` lists (walked earlier: the files may have changed since) to a receiver with
/// `ropts`; the sender's connection is cut after `cut` bytes.
pub fn run_walked(
    walked: Walk,
    ropts: &ReceiveOptions,
    cut: Option<usize>,
) -> (
    Result<SendReport, TransferError>,
    Result<ReceiveReport, TransferError>,
) {
    let (a, b) = tcp_pair();
    let sender = std::thread::spawn(move || {
        let mut source = PlainSource::new(a.try_clone().unwrap());
        // Without a cut the writer never runs out (no transfer here comes near usize::MAX bytes).
        let mut sink = PlainSink::new(CutWriter {
            inner: a.try_clone().unwrap(),
            left: cut.unwrap_or(usize::MAX),
        });
        let r = send(
            &mut sink,
            &mut source,
            &walked.manifest,
            &SendOptions::default(),
            &mut (),
        );
        let _ = a.shutdown(Shutdown::Both);
        r
    });
    let mut source = PlainSource::new(b.try_clone().unwrap());
    let mut sink = PlainSink::new(b.try_clone().unwrap());
    let received = receive(&mut source, &mut sink, ropts, &mut |_| true, &mut ());
    let _ = b.shutdown(Shutdown::Both);
    (sender.join().unwrap(), received)
}

/// Sends `paths` to a receiver with `ropts` over a healthy connection.
pub fn run(
    paths: &[&Path],
    ropts: &ReceiveOptions,
) -> (
    Result<SendReport, TransferError>,
    Result<ReceiveReport, TransferError>,
) {
    run_cut(paths, ropts, None)
}

/// Deterministic pseudo-random bytes.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    ferry_testkit::pseudo_random(len, seed)
}

/// Every path under `dir`, relative, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    fn go(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                go(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        go(dir, dir, &mut out);
    }
    out.sort();
    out
}
