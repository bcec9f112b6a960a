//! The matrix's `ferry mount` rows: the sharer's file read through a `ferry mount` in the client's
//! namespace, across the path, with the bench's own sequential reader (1 MiB `read`s) — uncached (a fresh
//! chunk cache and mount each run), then cached (the same mount, the file whole in its cache: FUSE
//! passthrough). The clock starts at the `open` and stops at the last byte; the first byte is the first
//! `read` that returned. Every read is checked against the source's BLAKE3 afterwards, through the mount.

use std::fs::File;
use std::io::{self, Read};
use std::time::Instant;

use super::mount::{forget_cache, Mount};
use super::pull::{Paired, Sharer};
use super::{digests, Case, Ends, Sample, Scratch};

/// The samples of one path.
pub(super) struct Reads {
    /// Reads through a fresh mount with an empty cache.
    pub(super) uncached: Vec<Sample>,
    /// Reads of the same file right after, cached.
    pub(super) cached: Vec<Sample>,
    /// Whether every read equalled the source.
    pub(super) verified: bool,
}

/// `runs` uncached and cached reads of `case`'s file through `ferry mount` across `ends`.
pub(super) fn reads(
    ends: &Ends<'_>,
    paired: &Paired,
    share: &Sharer,
    case: &Case,
    runs: usize,
    scratch: &Scratch,
) -> io::Result<Reads> {
    let name = case.src.file_name().expect("a file name");
    let mnt = scratch.fresh("mount-lab")?;
    let relay = ends
        .relay_addrs()
        .map(|(via_client, _)| via_client.to_string());
    let reach: Vec<&str> = match (&relay, share.listen()) {
        (Some(relay), _) => vec!["--force-relay", "--relay", relay],
        (None, Some(listen)) => vec!["--peer", listen],
        (None, None) => return Err(io::Error::other("ferry share reported no address")),
    };
    let mut out = Reads {
        uncached: Vec::new(),
        cached: Vec::new(),
        verified: true,
    };
    for _ in 0..runs {
        forget_cache(paired)?;
        let m = Mount::start(paired, ends.client(), &reach, &mnt, ends.ferry, &[])?;
        let file = mnt.join(name);
        out.uncached.push(read_timed(&file)?);
        // Passthrough is taken from the first open of a whole file on.
        out.cached.push(read_timed(&file)?);
        out.verified &= digests(&file)? == case.digest;
        m.unmount()?;
    }
    forget_cache(paired)?;
    Ok(out)
}

/// Reads `path` whole in 1 MiB reads: seconds to the last byte and to the first.
fn read_timed(path: &std::path::Path) -> io::Result<Sample> {
    let t0 = Instant::now();
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut first_byte = f64::NAN;
    loop {
        let n = f.read(&mut buf)?;
        if first_byte.is_nan() {
            first_byte = t0.elapsed().as_secs_f64();
        }
        if n == 0 {
            break;
        }
    }
    Ok(Sample {
        secs: t0.elapsed().as_secs_f64(),
        connected: f64::NAN,
        first_byte,
    })
}
