//! The matrix's peers: scp and rsync over ssh (AES-128-GCM) from an sshd the bench starts in the server's
//! namespace on the lab's address (a throw-away host key and authorized key), and croc with its relay run in
//! the lab (the server's namespace, or the relay's on a relay path). Each is only ever pointed at addresses
//! inside the lab, or on loopback: croc's loopback rows run in a namespace of their own with only `lo`, so
//! that nothing it might look up outside can be reached. A peer that is not installed gives a note, not a
//! row.

use std::io::{self, BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use ferry_lab::Netns;

use super::{Ends, Sample, Scratch};
use crate::sftp::Sshd;

/// The port of croc's relay (it also opens the next four for transfers).
const CROC_PORT: u16 = 9009;

/// Runs `cmd`, timed from its start to its exit; an error with its standard error if it failed.
fn timed_run(what: &str, cmd: &mut Command) -> io::Result<Sample> {
    let t0 = Instant::now();
    let out = cmd.stdin(Stdio::null()).stdout(Stdio::null()).output()?;
    let secs = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what} failed in the matrix ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(Sample {
        secs,
        connected: f64::NAN,
        first_byte: f64::NAN,
    })
}

/// Where `program` is installed: on PATH, or (croc) where `go install` puts it ($GOPATH/bin, ~/go/bin).
pub(super) fn installed(program: &str) -> Option<PathBuf> {
    let split = |var| {
        std::env::var_os(var)
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let mut dirs = split("PATH");
    dirs.extend(split("GOPATH").into_iter().map(|d| d.join("bin")));
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join("go/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Whether this process runs as root (`/proc/self` belongs to the effective user).
pub(super) fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// An sshd in the server's namespace, on its address.
pub(super) fn sshd(ends: &Ends<'_>, scratch: &Scratch) -> io::Result<Sshd> {
    Sshd::start_in(&scratch.0, ends.server(), ends.server_ip())
}

/// `scp -r` (or `rsync -a` over ssh when `rsync`) of `src` from the sshd into `out`, in the client's
/// namespace.
pub(super) fn ssh_copy(
    ends: &Ends<'_>,
    sshd: &Sshd,
    rsync: bool,
    src: &FsPath,
    out: &FsPath,
) -> io::Result<Sample> {
    let remote = format!("{}:{}", sshd.login()?, src.display());
    let port = sshd.addr().port().to_string();
    let mut cmd;
    if rsync {
        cmd = Command::new("rsync");
        let ssh = format!("ssh {} -p {port}", sshd.client_options().join(" "));
        cmd.args(["-a", "-e", &ssh]);
    } else {
        cmd = Command::new("scp");
        cmd.args(sshd.client_options()).args(["-r", "-P", &port]);
    }
    cmd.arg(remote).arg(out);
    if let Some(ns) = ends.client() {
        ns.inside(&mut cmd);
    }
    timed_run(if rsync { "rsync" } else { "scp" }, &mut cmd)
}

/// Where croc's three parts run on one path, and the relay's address as each side sees it.
pub(super) struct CrocLab<'a> {
    croc: PathBuf,
    /// The namespace of its own on loopback (`lo` only).
    own: Option<Netns>,
    ends: &'a Ends<'a>,
    relay: Option<Child>,
    home: PathBuf,
    runs: u32,
}

/// A child killed on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl<'a> CrocLab<'a> {
    /// Starts croc's relay for `ends`' path.
    pub(super) fn start(croc: PathBuf, ends: &'a Ends<'a>, scratch: &Scratch) -> io::Result<Self> {
        let own = match ends.lab {
            Some(_) => None,
            None => {
                let ns = Netns::create("croc").map_err(io::Error::other)?;
                ns.ip("link set lo up\n").map_err(io::Error::other)?;
                Some(ns)
            }
        };
        let mut lab = CrocLab {
            croc,
            own,
            ends,
            relay: None,
            home: scratch.fresh("croc-home")?,
            runs: 0,
        };
        let (_, at_server) = lab.relay_addrs();
        let mut cmd = lab.command(lab.relay_ns(), "relay");
        cmd.args(["relay", "--port", &CROC_PORT.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        lab.relay = Some(Child(cmd.spawn()?));
        // Ready when it takes a connection (from where the sender will connect).
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let ns = lab.server_ns();
        while super::in_ns(ns, || std::net::TcpStream::connect(at_server)).is_err() {
            if Instant::now() > deadline {
                return Err(io::Error::other("croc relay did not start listening"));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(lab)
    }

    fn relay_ns(&self) -> Option<&Netns> {
        self.own
            .as_ref()
            .or_else(|| self.ends.lab.and_then(|l| l.relay.as_ref()))
            .or(self.ends.server())
    }

    fn server_ns(&self) -> Option<&Netns> {
        self.own.as_ref().or(self.ends.server())
    }

    fn client_ns(&self) -> Option<&Netns> {
        self.own.as_ref().or(self.ends.client())
    }

    /// The relay as (the client sees it, the server sees it).
    fn relay_addrs(&self) -> (SocketAddr, SocketAddr) {
        match self.ends.relay_addrs() {
            Some((c, s)) => ((c.ip(), CROC_PORT).into(), (s.ip(), CROC_PORT).into()),
            None => {
                let ip = self.ends.server_ip();
                ((ip, CROC_PORT).into(), (ip, CROC_PORT).into())
            }
        }
    }

    /// croc in `ns` with a home of its own (`who`) under the lab's.
    fn command(&self, ns: Option<&Netns>, who: &str) -> Command {
        let mut cmd = Command::new(&self.croc);
        cmd.env("HOME", self.home.join(who))
            .env_remove("CROC_RELAY")
            .env_remove("CROC_RELAY6")
            .stdin(Stdio::null());
        if let Some(ns) = ns {
            ns.inside(&mut cmd);
        }
        cmd
    }

    /// `croc send src` in the server's namespace, then `croc` receiving into `out` in the client's, timed
    /// from the receiver's start (after the sender printed its code) to its exit.
    pub(super) fn copy(&mut self, src: &FsPath, out: &FsPath) -> io::Result<Sample> {
        self.runs += 1;
        let code = format!("{}-matrix-croc", self.runs);
        let (at_client, at_server) = self.relay_addrs();
        let mut send = self.command(self.server_ns(), "send");
        send.env("CROC_SECRET", &code)
            .args(["--yes", "--relay", &at_server.to_string()])
            .args(["send", "--no-local"])
            .arg(src)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut sender = Child(send.spawn()?);
        let mut err = BufReader::new(sender.0.stderr.take().expect("piped"));
        let mut line = String::new();
        loop {
            line.clear();
            if err.read_line(&mut line)? == 0 {
                return Err(io::Error::other("croc send ended before its code"));
            }
            if line.contains("Code is") {
                break;
            }
        }
        let log = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = io::Read::read_to_string(&mut err, &mut rest);
            rest
        });
        let mut recv = self.command(self.client_ns(), "receive");
        recv.env("CROC_SECRET", &code)
            .args([
                "--yes",
                "--overwrite",
                "--relay",
                &at_client.to_string(),
                "--out",
            ])
            .arg(out);
        let sample = timed_run("croc (receiving)", &mut recv)?;
        let status = sender.0.wait()?;
        if !status.success() {
            let rest = log.join().unwrap_or_default();
            let tail: String = rest
                .chars()
                .rev()
                .take(400)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(io::Error::other(format!(
                "croc send failed ({status}): {tail}"
            )));
        }
        Ok(sample)
    }
}
