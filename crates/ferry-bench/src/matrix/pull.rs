//! The matrix's `ferry pull` rows: a real `ferry share` of the sources in the server's namespace and `ferry
//! pull` in the client's, the two machines paired once (on loopback, before any path) so that each has the
//! other in its `peers.toml`.
//!
//! The share runs for the whole path and keeps its hash cache across paths (one `XDG_CACHE_HOME`); one
//! untimed pull of each source on loopback right after the pairing fills that cache, so no row times the
//! sharer's first hashing. The clock starts when `ferry pull` is started and stops when it exits.

use std::io;
use std::path::{Path as FsPath, PathBuf};
use std::time::Instant;

use super::{ferry_cmd, Ends, Sample, Scratch, Spawned};

/// The name each side gives the other when they pair.
pub(super) const SHARER: &str = "sharer";

/// Two `ferry` homes that paired with each other: the sharer's and the puller's.
pub(super) struct Paired {
    share_home: PathBuf,
    pull_home: PathBuf,
}

impl Paired {
    /// Pairs two fresh homes on loopback (`ferry pair --listen 127.0.0.1:0` and `ferry pair CODE --peer`),
    /// then pulls each of `sources` once, untimed, so the sharer's hash cache is warm.
    pub(super) fn new(
        ends: &Ends<'_>,
        scratch: &Scratch,
        sources: &[&FsPath],
    ) -> io::Result<Paired> {
        let p = Paired {
            share_home: scratch.fresh("share-home")?,
            pull_home: scratch.fresh("pull-home")?,
        };
        let mut first = ferry_cmd(ends.ferry, None, &p.share_home);
        first.args([
            "pair",
            "--json",
            "--name",
            "puller",
            "--listen",
            "127.0.0.1:0",
        ]);
        let mut first = Spawned::new(&mut first)?;
        let code = first.wait_for_event("code")?;
        let (Some(code), Some(listen)) = (code["code"].as_str(), code["listen"].as_str()) else {
            return Err(io::Error::other(format!("ferry pair printed {code}")));
        };
        let mut second = ferry_cmd(ends.ferry, None, &p.pull_home);
        second.args([
            "pair", "--json", "--name", SHARER, "--wait", "10s", "--peer", listen, code,
        ]);
        let mut second = Spawned::new(&mut second)?;
        let ok = second.child.wait()?.success() && first.child.wait()?.success();
        if !ok {
            return Err(io::Error::other(format!(
                "ferry pair failed in the matrix:\nfirst: {}\nsecond: {}",
                first.stderr(),
                second.stderr()
            )));
        }
        let share = p.share(ends, sources[0].parent().expect("a parent"))?;
        for src in sources {
            let out = scratch.fresh("warm-up")?;
            p.pull(ends, &share, src, &out)?;
        }
        Ok(p)
    }

    /// The puller's home (its `XDG_*` directories).
    pub(super) fn pull_home(&self) -> &FsPath {
        &self.pull_home
    }

    /// `ferry share DIR` in the server's namespace (on its address, or registered at the relay), ready.
    pub(super) fn share(&self, ends: &Ends<'_>, dir: &FsPath) -> io::Result<Sharer> {
        self.share_with(ends, dir, &[])
    }

    /// [`Paired::share`] with `extra` arguments (`--writable`).
    pub(super) fn share_with(
        &self,
        ends: &Ends<'_>,
        dir: &FsPath,
        extra: &[&str],
    ) -> io::Result<Sharer> {
        let mut cmd = ferry_cmd(ends.ferry, ends.server(), &self.share_home);
        cmd.args(["share", "--json"]).args(extra);
        match ends.relay_addrs() {
            Some((_, via_server)) => {
                cmd.args(["--force-relay", "--relay", &via_server.to_string()])
            }
            None => cmd.args(["--listen", &format!("{}:0", ends.server_ip())]),
        };
        let mut child = Spawned::new(cmd.arg(dir))?;
        let ready = child.wait_for_event("ready")?;
        let listen = ready["listen"].as_str().map(str::to_string);
        Ok(Sharer {
            _child: child,
            listen,
        })
    }

    /// `ferry pull sharer:NAME OUT` in the client's namespace, NAME being `src`'s file name, timed.
    pub(super) fn pull(
        &self,
        ends: &Ends<'_>,
        share: &Sharer,
        src: &FsPath,
        out: &FsPath,
    ) -> io::Result<Sample> {
        let name = src.file_name().and_then(|n| n.to_str()).expect("a name");
        let mut cmd = ferry_cmd(ends.ferry, ends.client(), &self.pull_home);
        cmd.args(["pull", "--json", "--wait", "30s"]);
        match (ends.relay_addrs(), &share.listen) {
            (Some((via_client, _)), _) => {
                cmd.args(["--force-relay", "--relay", &via_client.to_string()])
            }
            (None, Some(listen)) => cmd.args(["--peer", listen]),
            (None, None) => return Err(io::Error::other("ferry share reported no address")),
        };
        cmd.arg(format!("{SHARER}:{name}")).arg(out);
        let t0 = Instant::now();
        let mut puller = Spawned::new(&mut cmd)?;
        let events = puller.first_events();
        let ok = puller.child.wait()?.success();
        let secs = t0.elapsed().as_secs_f64();
        if !ok {
            return Err(io::Error::other(format!(
                "ferry pull failed in the matrix: {}",
                puller.stderr()
            )));
        }
        super::event_times(events, t0, secs)
    }
}

/// A running `ferry share` (killed on drop) and the address it listens on, if direct.
pub(super) struct Sharer {
    /// Held, not read: the share runs while the path is measured.
    _child: Spawned,
    listen: Option<String>,
}

impl Sharer {
    /// The address it listens on, if direct.
    pub(super) fn listen(&self) -> Option<&str> {
        self.listen.as_deref()
    }

    /// Its process id.
    pub(super) fn pid(&self) -> u32 {
        self._child.child.id()
    }
}
