//! The matrix's rows for lanes (issue 12 items 6 and 7): one TCP stream against several in parallel, BBR
//! against CUBIC per socket, and `ferry send` on one lane against several.
//!
//! - `raw TCP ×N`: the raw copy's bytes split over N connections across the path, all pumped at once (on
//!   the relay path each paired through `ferry relay`); the clock from the first connect to the last byte.
//! - `raw TCP cubic`, `raw TCP ×4 cubic`: the same with TCP_CONGESTION `cubic` on the sending sockets (the
//!   host's default, bbr here, in the others).
//! - `ferry send 1 lane`, `2 lanes`, `4 lanes`: `ferry send --lanes 1/2/4` of the single file and of the
//!   small files (the `ferry send` row is the default, which chooses by itself).

use std::io;
use std::net::TcpStream;
use std::path::Path as FsPath;
use std::time::Instant;

use socket2::SockRef;

use super::{drain, pump, Ends, Sample, Scratch};

/// Paths with rows of several streams: where one stream is below the wire (the window on high-bdp, loss on
/// lossy-wan) and the wan they are compared with. Other paths get `raw TCP ×4` only.
pub(super) const LANE_PATHS: [&str; 3] = ["wan", "high-bdp", "lossy-wan"];
/// Paths with CUBIC rows. Not lossy-wan: there CUBIC carried less than 0.07 of the wire (one 1 GiB row
/// had not finished after 4 minutes), against BBR's 0.774 for one stream.
const CUBIC_PATHS: [&str; 2] = ["wan", "high-bdp"];

/// The raw rows of one path: layer names with their stream count and congestion control.
pub(super) fn raw_rows(path: &str) -> Vec<(&'static str, usize, Option<&'static str>)> {
    let mut rows = vec![("raw TCP ×4", 4, None)];
    if LANE_PATHS.contains(&path) {
        rows = vec![
            ("raw TCP ×2", 2, None),
            ("raw TCP ×4", 4, None),
            ("raw TCP ×8", 8, None),
        ];
    }
    if CUBIC_PATHS.contains(&path) {
        rows.extend([
            ("raw TCP cubic", 1, Some("cubic")),
            ("raw TCP ×4 cubic", 4, Some("cubic")),
        ]);
    }
    rows
}

/// The `ferry send` rows with `--lanes`: layer names and the option's value.
pub(super) const SEND_ROWS: [(&str, &str); 3] = [
    ("ferry send 1 lane", "1"),
    ("ferry send 2 lanes", "2"),
    ("ferry send 4 lanes", "4"),
];

impl Ends<'_> {
    /// `bytes` over `streams` parallel TCP connections from the server's side to the client's, the
    /// sending sockets with congestion control `cc` (the host's default when `None`).
    pub(super) fn raw_parallel(
        &self,
        bytes: u64,
        streams: usize,
        cc: Option<&str>,
    ) -> io::Result<Sample> {
        let mut pairs: Vec<(TcpStream, TcpStream)> = Vec::new();
        let mut t0 = None;
        for _ in 0..streams {
            let (tx, rx, t) = self.tcp_pair()?;
            t0.get_or_insert(t);
            if let Some(cc) = cc {
                SockRef::from(&tx).set_tcp_congestion(cc.as_bytes())?;
            }
            pairs.push((tx, rx));
        }
        let t0: Instant = t0.expect("at least one stream");
        let connected = t0.elapsed().as_secs_f64();
        let share = bytes / streams as u64;
        let (mut senders, mut drains) = (Vec::new(), Vec::new());
        for (i, (tx, rx)) in pairs.into_iter().enumerate() {
            let n = match i {
                0 => bytes - share * (streams as u64 - 1),
                _ => share,
            };
            senders.push(std::thread::spawn(move || pump(tx, n)));
            drains.push(std::thread::spawn(move || drain(rx, t0)));
        }
        let (mut got, mut first) = (0, f64::INFINITY);
        for d in drains {
            let (n, f) = d
                .join()
                .map_err(|_| io::Error::other("drain thread panicked"))??;
            got += n;
            first = first.min(f);
        }
        let secs = t0.elapsed().as_secs_f64();
        for s in senders {
            s.join()
                .map_err(|_| io::Error::other("copy thread panicked"))??;
        }
        if got != bytes {
            return Err(io::Error::other(format!(
                "parallel raw copy: {got} of {bytes} bytes arrived"
            )));
        }
        Ok(Sample {
            secs,
            connected,
            first_byte: first,
        })
    }

    /// `ferry send --lanes LANES src` and `ferry receive` into `out`, as the `ferry send` row.
    pub(super) fn ferry_send_lanes(
        &self,
        src: &FsPath,
        out: &FsPath,
        scratch: &Scratch,
        lanes: &str,
    ) -> io::Result<Sample> {
        self.ferry_send_with(src, out, scratch, &["--lanes", lanes])
    }
}
