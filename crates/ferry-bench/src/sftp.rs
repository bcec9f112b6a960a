//! The sftp baseline of `ferry bench share`: openssh's sftp-server behind a private sshd on 127.0.0.1, and a
//! small pipelined SFTP v3 client driving it through `ssh -s sftp`.
//!
//! The sshd has its own config, host key and authorized key in a temporary directory, listens on 127.0.0.1
//! only, and admits the current user with that key only. It is stopped (and the directory removed) on drop.

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_lab::Netns;

use crate::share::other;

const SSHD: &str = "/usr/sbin/sshd";
const SFTP_SERVER: &str = "/usr/lib/openssh/sftp-server";
/// The cipher both ends use: AES-128-GCM, as ferry's channel.
pub const CIPHER: &str = "aes128-gcm@openssh.com";

/// A private sshd on 127.0.0.1.
pub struct Sshd {
    dir: PathBuf,
    addr: SocketAddr,
    child: Child,
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(other(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Sshd {
    /// Starts one on 127.0.0.1 in `base` (a fresh directory is made there); fails with the reason when it
    /// cannot.
    pub fn start(base: &Path) -> io::Result<Sshd> {
        Sshd::start_in(base, None, Ipv4Addr::LOCALHOST)
    }

    /// Starts one listening on `ip` (port 2222 inside `ns`, a free port here), in `base`.
    pub fn start_in(base: &Path, ns: Option<&Netns>, ip: Ipv4Addr) -> io::Result<Sshd> {
        for exe in [SSHD, SFTP_SERVER] {
            if !Path::new(exe).exists() {
                return Err(other(format!(
                    "{exe} is not installed (apt-get install openssh-server)"
                )));
            }
        }
        let dir = base.join(format!("ferry-bench-sshd-{}-{ip}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        // sshd's privilege separation needs this directory.
        fs::create_dir_all("/run/sshd")?;
        for key in ["host", "id"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key)))?;
        }
        fs::copy(dir.join("id.pub"), dir.join("authorized_keys"))?;
        // A free port: bound, read, released (a race with another process is unlikely and only fails the row);
        // a namespace of the lab has nothing else listening.
        let port = match ns {
            Some(_) => 2222,
            None => TcpListener::bind((ip, 0))?.local_addr()?.port(),
        };
        let addr = SocketAddr::from((ip, port));
        let user = command_output(Command::new("id").arg("-un"))?;
        let config = format!(
            "ListenAddress {addr}\n\
             HostKey {dir}/host\n\
             PidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {dir}/authorized_keys\n\
             AllowUsers {user}\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             StrictModes no\n\
             Ciphers {CIPHER}\n\
             Subsystem sftp {SFTP_SERVER}\n",
            dir = dir.display()
        );
        fs::write(dir.join("sshd_config"), config)?;
        let mut cmd = Command::new(SSHD);
        if let Some(ns) = ns {
            ns.inside(&mut cmd);
        }
        let child = cmd
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("sshd.log"))?)
            .spawn()?;
        let mut sshd = Sshd { dir, addr, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        let connect = || match ns {
            Some(ns) => ns.enter(|| TcpStream::connect(addr)),
            None => TcpStream::connect(addr),
        };
        while connect().is_err() {
            if let Some(status) = sshd.child.try_wait()? {
                let log = fs::read_to_string(sshd.dir.join("sshd.log")).unwrap_or_default();
                return Err(other(format!("sshd exited ({status}): {}", log.trim())));
            }
            if Instant::now() > deadline {
                return Err(other("sshd did not listen within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(sshd)
    }

    /// The options of an ssh client of this server (no config, the cipher, its key, no host-key checks);
    /// the port goes separately (`-p` for ssh, `-P` for scp).
    pub fn client_options(&self) -> Vec<String> {
        let mut o: Vec<String> = ["-F", "/dev/null", "-q", "-c", CIPHER]
            .into_iter()
            .chain(["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"])
            .chain(["-o", "StrictHostKeyChecking=no"])
            .chain(["-o", "UserKnownHostsFile=/dev/null", "-i"])
            .map(str::to_string)
            .collect();
        o.push(self.dir.join("id").display().to_string());
        o
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `user@ip` of the current user at this server.
    pub fn login(&self) -> io::Result<String> {
        let user = command_output(Command::new("id").arg("-un"))?;
        Ok(format!("{user}@{}", self.addr.ip()))
    }

    /// An SFTP session through `ssh -c aes128-gcm@openssh.com ... -s sftp`.
    pub fn sftp(&self) -> io::Result<Sftp> {
        let mut child = Command::new("ssh")
            .args(self.client_options())
            .args(["-p", &self.addr.port().to_string()])
            .arg(self.login()?)
            .args(["-s", "sftp"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let input = BufWriter::with_capacity(
            64 << 10,
            child.stdin.take().ok_or_else(|| other("no stdin"))?,
        );
        let output = BufReader::with_capacity(
            256 << 10,
            child.stdout.take().ok_or_else(|| other("no stdout"))?,
        );
        let mut s = Sftp {
            child,
            input,
            output,
            next_id: 0,
            packet: Vec::new(),
        };
        s.init()?;
        Ok(s)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn command_output(cmd: &mut Command) -> io::Result<String> {
    let out = cmd.stdin(Stdio::null()).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

const INIT: u8 = 1;
const VERSION: u8 = 2;
const OPEN: u8 = 3;
const CLOSE: u8 = 4;
const READ: u8 = 5;
const STATUS: u8 = 101;
const HANDLE: u8 = 102;
const DATA: u8 = 103;
/// Packets larger than this from the server are refused (a READ of 4 KiB answers far less).
const MAX_PACKET: usize = 256 << 10;

/// A pipelined SFTP v3 client over an `ssh -s sftp` child.
pub struct Sftp {
    child: Child,
    input: BufWriter<ChildStdin>,
    output: BufReader<ChildStdout>,
    next_id: u32,
    packet: Vec<u8>,
}

/// A read's answer.
enum Answer {
    Data(usize),
    Status(u32),
}

impl Sftp {
    fn send(&mut self, kind: u8, body: &[u8]) -> io::Result<()> {
        self.input
            .write_all(&(body.len() as u32 + 1).to_be_bytes())?;
        self.input.write_all(&[kind])?;
        self.input.write_all(body)
    }

    /// The next packet: its type and body (in `self.packet`).
    fn recv(&mut self) -> io::Result<u8> {
        let mut len = [0u8; 4];
        self.output.read_exact(&mut len)?;
        let len = u32::from_be_bytes(len) as usize;
        if len == 0 || len > MAX_PACKET {
            return Err(other(format!("sftp packet of {len} bytes")));
        }
        self.packet.resize(len, 0);
        self.output.read_exact(&mut self.packet)?;
        Ok(self.packet[0])
    }

    fn body(&self) -> &[u8] {
        &self.packet[1..]
    }

    fn id(&mut self) -> u32 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    fn init(&mut self) -> io::Result<()> {
        self.send(INIT, &3u32.to_be_bytes())?;
        self.input.flush()?;
        if self.recv()? != VERSION || u32_at(self.body(), 0)? != 3 {
            return Err(other("the sftp server does not speak version 3"));
        }
        Ok(())
    }

    /// Opens `path` for reading; returns its handle.
    pub fn open(&mut self, path: &str) -> io::Result<Vec<u8>> {
        let id = self.id();
        let mut body = id.to_be_bytes().to_vec();
        put_string(&mut body, path.as_bytes());
        body.extend_from_slice(&1u32.to_be_bytes()); // SSH_FXF_READ
        body.extend_from_slice(&0u32.to_be_bytes()); // no attributes
        self.send(OPEN, &body)?;
        self.input.flush()?;
        match self.recv()? {
            HANDLE if u32_at(self.body(), 0)? == id => Ok(string_at(self.body(), 4)?.to_vec()),
            STATUS => Err(other(format!(
                "sftp open of {path}: status {}",
                u32_at(self.body(), 4)?
            ))),
            t => Err(other(format!("sftp open: unexpected packet {t}"))),
        }
    }

    /// Closes `handle`.
    pub fn close(&mut self, handle: &[u8]) -> io::Result<()> {
        let id = self.id();
        let mut body = id.to_be_bytes().to_vec();
        put_string(&mut body, handle);
        self.send(CLOSE, &body)?;
        self.input.flush()?;
        match self.recv()? {
            STATUS if u32_at(self.body(), 4)? == 0 => Ok(()),
            t => Err(other(format!("sftp close: packet {t}"))),
        }
    }

    fn read_request(&mut self, handle: &[u8], offset: u64, len: u32) -> io::Result<u32> {
        let id = self.id();
        let mut body = Vec::with_capacity(20 + handle.len());
        body.extend_from_slice(&id.to_be_bytes());
        put_string(&mut body, handle);
        body.extend_from_slice(&offset.to_be_bytes());
        body.extend_from_slice(&len.to_be_bytes());
        self.send(READ, &body)?;
        Ok(id)
    }

    fn answer(&mut self) -> io::Result<(u32, Answer)> {
        let kind = self.recv()?;
        let id = u32_at(self.body(), 0)?;
        match kind {
            DATA => Ok((id, Answer::Data(string_at(self.body(), 4)?.len()))),
            STATUS => Ok((id, Answer::Status(u32_at(self.body(), 4)?))),
            t => Err(other(format!("sftp read: unexpected packet {t}"))),
        }
    }

    /// Runs `count` random 4 KiB reads of `handle` (a file of `size` bytes) with up to `depth` in flight,
    /// refilled when half completed (as the share case); returns each read's time, in order of completion.
    pub fn random_reads(
        &mut self,
        handle: &[u8],
        size: u64,
        count: usize,
        depth: usize,
        seed: &mut u64,
    ) -> io::Result<Vec<Duration>> {
        let mut started = HashMap::new();
        let mut times = Vec::with_capacity(count);
        let mut issued = 0;
        while times.len() < count {
            if started.len() <= depth / 2 && issued < count {
                while issued < count && started.len() < depth {
                    let offset = (crate::report::xorshift(seed) % (size / 4096)) * 4096;
                    let id = self.read_request(handle, offset, 4096)?;
                    started.insert(id, Instant::now());
                    issued += 1;
                }
                self.input.flush()?;
            }
            let (id, answer) = self.answer()?;
            let t = started
                .remove(&id)
                .ok_or_else(|| other("sftp: an answer to no request"))?;
            match answer {
                Answer::Data(4096) => times.push(t.elapsed()),
                Answer::Data(n) => return Err(other(format!("sftp: short read of {n} bytes"))),
                Answer::Status(code) => return Err(other(format!("sftp read: status {code}"))),
            }
        }
        Ok(times)
    }
}

impl Drop for Sftp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

fn u32_at(b: &[u8], at: usize) -> io::Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes(s.try_into().expect("4 bytes")))
        .ok_or_else(|| other("sftp packet too short"))
}

fn string_at(b: &[u8], at: usize) -> io::Result<&[u8]> {
    let len = u32_at(b, at)? as usize;
    b.get(at + 4..at + 4 + len)
        .ok_or_else(|| other("sftp string past its packet"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_past_their_packet_are_errors_not_panics() {
        let mut p = Vec::new();
        put_string(&mut p, b"handle");
        assert_eq!(string_at(&p, 0).unwrap(), b"handle");
        assert_eq!(u32_at(&p, 0).unwrap(), 6);
        assert!(string_at(&p[..p.len() - 1], 0).is_err());
        assert!(u32_at(&p, p.len() - 3).is_err());
        // A length that points far past the packet.
        assert!(string_at(&[0xff, 0xff, 0xff, 0xff, 1], 0).is_err());
    }
}
