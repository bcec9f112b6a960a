//! Anonymous network namespaces, held only by open files.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::LabError;

/// An anonymous network namespace, alive while this handle (or a process inside it) is.
///
/// It is created by `unshare(CLONE_NEWNET)` on a short-lived thread and named in no directory
/// (`/run/netns` stays untouched): when the last holder goes, even by a crash, the kernel removes
/// it with its interfaces.
#[derive(Debug)]
pub struct Netns {
    name: &'static str,
    file: File,
}

impl Netns {
    /// A new namespace with only `lo` (brought up). `name` is for messages.
    pub fn create(name: &'static str) -> Result<Netns, LabError> {
        let file = std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: unshare(2) moves only this short-lived thread into a new network namespace.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                File::open("/proc/thread-self/ns/net")
            })
            .join()
            .expect("namespace thread")
        })
        .map_err(|e| LabError::Namespace(name, e))?;
        let ns = Netns { name, file };
        ns.ip("link set lo up\n")?;
        Ok(ns)
    }

    /// The name given at creation.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A path that names this namespace for `ip link set DEV netns PATH`.
    pub fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.file.as_raw_fd())
    }

    /// Makes `cmd` run inside this namespace.
    pub fn inside<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        let fd = self.file.as_raw_fd();
        // SAFETY: between fork and exec the hook only makes the setns(2) system call, which is
        // async-signal-safe, on a descriptor that stays open in the parent while it spawns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            })
        }
    }

    /// Runs `f` on a thread inside this namespace: sockets (and tun devices) it creates stay in the
    /// namespace, and `/proc/sys/net` is the namespace's.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.file.as_raw_fd();
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: setns(2) moves only this short-lived thread; `fd` is an open namespace file.
                let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
                f()
            })
            .join()
            .expect("thread inside the namespace")
        })
    }

    /// Runs `program args` inside the namespace with `stdin`; its standard output.
    pub fn run(&self, program: &str, args: &[&str], stdin: &str) -> Result<String, LabError> {
        let what = format!("{program} {} in {}", args.join(" "), self.name);
        let fail = |e: io::Error| LabError::Command(what.clone(), e.to_string());
        let mut cmd = Command::new(program);
        self.inside(&mut cmd)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(fail)?;
        let mut input = child.stdin.take().expect("piped stdin");
        input.write_all(stdin.as_bytes()).map_err(fail)?;
        drop(input);
        let out = child.wait_with_output().map_err(fail)?;
        if !out.status.success() {
            return Err(LabError::Command(
                what,
                format!(
                    "{:?}: {} (input: {stdin:?})",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `ip` commands, one a line, inside the namespace.
    pub fn ip(&self, script: &str) -> Result<(), LabError> {
        self.run("ip", &["-batch", "-"], script).map(drop)
    }
}
