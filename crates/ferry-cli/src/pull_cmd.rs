//! `ferry pull NAME:PATH [DEST]`: a file or subtree of a paired peer's share, by the transfer protocol (the
//! receiver's rules, progress, resume and exit codes as `ferry receive`), or one verified byte range of a file
//! (`--range OFFSET:LEN`).

use std::ffi::OsString;
use std::fs::File;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use ferry_share::io::{Session, SessionError};
use ferry_share::wire::SharePath;
use ferry_transfer::{Output, ReceiveOptions, TransferError};
use serde_json::json;

use crate::failure::Usage;
use crate::paired;
use crate::reach_args::{peer_options, CommonArgs, PeerArg, RelayArgs};
use crate::ui::{escape, escape_bytes, human_bytes, Ui};

/// `ferry pull`'s command line.
#[derive(Args, Debug)]
#[command(
    after_help = "Every byte is verified (BLAKE3) before a file gets its final name; a cut pull (Ctrl-C, kill, \
either side gone) resumes when run again, moving only what is missing. Exit statuses as `ferry receive`: \
1 not in the share or changed there during the pull (source-changed), 4 sharer not found or gone, \
5 integrity, 7 would overwrite (conflict), 8 leads out of the share (unsafe-path), 130 interrupted (partial data kept).",
    mut_arg("peer", |a| a.help(
        "Connect straight to the sharer at this address (its `ferry share --listen` address)"
    )),
    mut_arg("json", |a| a.help(
        "One JSON event per line on stdout (connected, offer, progress, file-done, done, range, warning, error)"
    )),
)]
pub struct PullArgs {
    /// The paired peer (`ferry peers`) and the path in its share: NAME:PATH (`NAME:` for the whole share, as a
    /// directory named as the shared one).
    #[arg(value_name = "NAME:PATH")]
    pub remote: OsString,
    /// Directory to pull into (created if missing).
    #[arg(default_value = ".")]
    pub dest: PathBuf,
    /// The share's name on that peer (`ferry share --name`).
    #[arg(long, default_value = "default", value_name = "SHARE")]
    pub share: String,
    /// Replace files in DEST that differ from the share's (identical ones are kept as they are); implies
    /// --merge.
    #[arg(long)]
    pub overwrite: bool,
    /// Pull a directory into one that already exists in DEST, adding what is new (a file that exists and
    /// differs is still a conflict without --overwrite).
    #[arg(long)]
    pub merge: bool,
    /// Only the bytes OFFSET to OFFSET+LEN of one file, each verified before it is written (no resume).
    #[arg(long, value_name = "OFFSET:LEN", value_parser = parse_range)]
    pub range: Option<(u64, u64)>,
    /// Write the pulled file (or range) under NAME in DEST; `-`: to standard output (not a terminal, not
    /// with --json; only with --range or a single file; no resume).
    #[arg(long, short = 'o', value_name = "NAME")]
    pub output: Option<OsString>,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub peer: PeerArg,
    #[command(flatten)]
    pub relay: RelayArgs,
    /// How long to look for the share (30s, 5m, or seconds; 0 tries once).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::transfer_cmd::parse_duration)]
    pub wait: std::time::Duration,
}

impl PullArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }

    /// The peer's name and the path in its share, checked by the name rules.
    pub fn target(&self) -> anyhow::Result<(&str, SharePath)> {
        let (name, path) = paired::split_target(&self.remote)?;
        let Some(path) = path else {
            return Err(Usage(format!(
                "\"{}\": give the peer and the path as NAME:PATH (NAME: for the whole share)",
                escape_bytes(self.remote.as_bytes())
            ))
            .into());
        };
        let end = path.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
        let path = SharePath::new(&path[..end])
            .map_err(|problem| Usage(format!("\"{}\": {problem}", escape_bytes(path))))?;
        Ok((name, path))
    }

    /// Rejects a bad command line before the peer is sought.
    pub fn check(&self) -> anyhow::Result<()> {
        let (_, path) = self.target()?;
        if self.range.is_some() && path.is_root() {
            return Err(Usage("--range reads a file: give NAME:PATH of one".into()).into());
        }
        if let Some(name) = self.output.as_deref() {
            if name == "-" {
                self.stdout()?;
            } else {
                crate::spool::check_file_name("-o", name)?;
            }
        }
        let to_stdout = self.output.as_deref() == Some(std::ffi::OsStr::new("-"));
        if !to_stdout && self.dest.exists() && !self.dest.is_dir() {
            return Err(Usage(format!(
                "{}: not a directory (DEST is the directory to pull into; -o NAME names the file)",
                escape_bytes(self.dest.as_os_str().as_bytes())
            ))
            .into());
        }
        Ok(())
    }

    /// Standard output, for `-o -`: not with `--json` (its events go there), not a terminal.
    fn stdout(&self) -> anyhow::Result<File> {
        if self.json() {
            return Err(Usage(
                "-o - writes the data to standard output, where --json writes its events; give one of them"
                    .into(),
            )
            .into());
        }
        if std::io::stdout().is_terminal() {
            return Err(Usage(
                "-o - does not write a peer's bytes to a terminal; pipe or redirect standard output, or give -o NAME"
                    .into(),
            )
            .into());
        }
        Ok(File::from(std::io::stdout().as_fd().try_clone_to_owned()?))
    }
}

/// `OFFSET:LEN`, in bytes.
fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (offset, len) = s
        .split_once(':')
        .ok_or_else(|| "give OFFSET:LEN in bytes".to_string())?;
    let offset: u64 = offset.parse().map_err(|_| format!("offset {offset:?}"))?;
    let len: u64 = len.parse().map_err(|_| format!("length {len:?}"))?;
    offset
        .checked_add(len)
        .ok_or_else(|| "the range ends past 2^64".to_string())?;
    Ok((offset, len))
}

/// A share failure as an error the exit-status mapping classifies: a transfer's as itself, a path that is not
/// in the share said in words.
fn classified(e: SessionError, args: &PullArgs) -> anyhow::Error {
    match e {
        SessionError::Transfer(t @ TransferError::Conflict { .. }) => anyhow::Error::new(t).context(
            "not writing into what exists (--merge adds to existing directories, --overwrite replaces files)",
        ),
        SessionError::Transfer(t) => t.into(),
        e @ SessionError::Remote(ferry_share::wire::ErrorCode::NotFound, _) => {
            anyhow::Error::new(e).context(format!(
                "\"{}\" is not in the share \"{}\" there",
                escape_bytes(args.remote.as_bytes()),
                escape(&args.share)
            ))
        }
        e => e.into(),
    }
}

/// Requests in flight for `--range` (a pull of a file or tree is its session's only request).
const RANGE_IN_FLIGHT: u32 = 64;

/// Runs `ferry pull`: finds the peer's share, then pulls.
pub fn run(args: PullArgs, ui: &mut Ui) -> anyhow::Result<()> {
    args.check()?;
    let (name, remote) = args.target()?;
    let opts = peer_options(&args.common, &args.relay)?;
    let reach = paired::Reach {
        opts: &opts,
        peer: args.peer.peer,
        wait: args.wait,
    };
    let in_flight = if args.range.is_some() {
        RANGE_IN_FLIGHT
    } else {
        1
    };
    let (mut session, _peer) = paired::open_share(name, &args.share, &reach, in_flight, ui)?;
    if let Some((offset, len)) = args.range {
        return range(&mut session, &remote, offset, len, &args, ui);
    }
    let mut opts = ReceiveOptions::new(&args.dest);
    opts.overwrite = args.overwrite;
    opts.merge = args.merge;
    opts.output = match args.output.as_deref() {
        None => Output::Offered,
        Some(name) if name == "-" => Output::Stream(Arc::new(args.stdout()?)),
        Some(name) => Output::Named(name.as_bytes().to_vec()),
    };
    let stream = matches!(opts.output, Output::Stream(_));
    if !stream {
        // A range keeps nothing (written under a temporary name, removed on failure), and neither does `-o -`.
        crate::interrupt::leaves("; what arrived is kept: run the same command again to resume");
    }
    let report = ferry_share::pull::pull_session(session, &remote, &opts, ui).map_err(|e| {
        // Refusals come before a byte is written; anything later may have left part of the file on stdout.
        let before_data = matches!(
            e,
            SessionError::Remote(..)
                | SessionError::Transfer(
                    TransferError::OutputMismatch { .. }
                        | TransferError::Declined
                        | TransferError::Conflict { .. }
                )
        );
        let e = classified(e, &args);
        if stream && !before_data {
            e.context("what was written to standard output is incomplete, not to be trusted")
        } else {
            e
        }
    })?;
    if report.skipped > 0 {
        return Err(TransferError::Partial {
            skipped: report.skipped,
        }
        .into());
    }
    Ok(())
}

/// `--range`: the verified bytes to standard output, or to a file in DEST (written under a temporary name and
/// renamed once every byte verified).
fn range(
    session: &mut Session<std::net::TcpStream, std::net::TcpStream>,
    remote: &SharePath,
    offset: u64,
    len: u64,
    args: &PullArgs,
    ui: &mut Ui,
) -> anyhow::Result<()> {
    let mut written_to = None;
    let version = if args.output.as_deref() == Some("-".as_ref()) {
        let mut out = Counted {
            inner: std::io::BufWriter::with_capacity(1 << 20, args.stdout()?),
            written: 0,
        };
        let v = ferry_share::pull::read_range(session, remote, offset, len, &mut out);
        v.map_err(|e| match classified(e, args) {
            e if out.written > 0 => e.context("what was written to standard output is incomplete"),
            e => e,
        })?
    } else {
        let name = match args.output.as_deref() {
            Some(name) => name.as_bytes().to_vec(),
            None => ferry_tree::path::split_parent(remote.as_bytes()).1.to_vec(),
        };
        let target = args.dest.join(std::ffi::OsStr::from_bytes(&name));
        if !args.overwrite && target.symlink_metadata().is_ok() {
            return Err(TransferError::Conflict {
                path: target.display().to_string(),
            }
            .into());
        }
        let temp = temp_name(&args.dest, &name);
        let written = (|| {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, File::create(&temp)?);
            let v = ferry_share::pull::read_range(session, remote, offset, len, &mut out)
                .map_err(|e| classified(e, args))?;
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&temp, &target)?;
            Ok::<_, anyhow::Error>(v)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written_to = Some(target);
        written?
    };
    let root: String = version.root.iter().map(|b| format!("{b:02x}")).collect();
    ui.event(
        "range",
        json!({ "path": String::from_utf8_lossy(remote.as_bytes()), "offset": offset, "len": len,
                "size": version.size, "root": root }),
    );
    // As a whole pull ends with its "done" line: what came, from where, to where.
    let to = written_to.map_or("standard output".to_string(), |t| {
        escape_bytes(t.as_os_str().as_bytes()).into_owned()
    });
    ui.info(&format!(
        "done: pulled {} at offset {offset} of {} ({}) into {to}, verified",
        human_bytes(len),
        escape_bytes(remote.as_bytes()),
        human_bytes(version.size),
    ));
    Ok(())
}

/// A writer that counts what went through it (so a failed range says whether standard output got anything).
struct Counted<W> {
    inner: W,
    written: u64,
}

impl<W: std::io::Write> std::io::Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A hidden temporary name beside `name` in `dir`.
fn temp_name(dir: &Path, name: &[u8]) -> PathBuf {
    let mut temp = b".".to_vec();
    temp.extend_from_slice(name);
    temp.extend_from_slice(format!(".ferry-range-{}", std::process::id()).as_bytes());
    dir.join(std::ffi::OsStr::from_bytes(&temp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PullArgs,
    }

    fn args(argv: &[&str]) -> PullArgs {
        Cli::try_parse_from(std::iter::once("pull").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn targets_and_ranges_are_checked_before_anything_happens() {
        let a = args(&["laptop:photos/2026/", "out", "--range", "4096:100"]);
        let (name, path) = a.target().unwrap();
        assert_eq!((name, path.as_bytes()), ("laptop", &b"photos/2026"[..]));
        assert_eq!(a.range, Some((4096, 100)));
        assert!(args(&["laptop:"]).target().unwrap().1.is_root());
        for bad in [
            "laptop",
            ":x",
            "laptop:../etc",
            "laptop:/etc",
            "laptop:a//b",
        ] {
            assert!(args(&[bad]).target().is_err(), "{bad}");
        }
        assert!(args(&["laptop:", "--range", "0:1"]).check().is_err());
        assert!(args(&["laptop:a", "-o", "x/y"]).check().is_err());
        // DEST is a directory: a file there is refused before the peer is sought, unless the data goes to
        // standard output.
        let file = std::env::temp_dir().join(format!("ferry-pull-dest-{}", std::process::id()));
        std::fs::write(&file, b"mine").unwrap();
        let dest = file.to_str().unwrap();
        let err = args(&["laptop:a", dest]).check().unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        assert!(
            args(&["laptop:a", dest, "-o", "-"]).check().is_ok() || std::io::stdout().is_terminal()
        );
        assert!(args(&["laptop:a", std::env::temp_dir().to_str().unwrap()])
            .check()
            .is_ok());
        std::fs::remove_file(&file).unwrap();
        for bad in ["1", "a:1", "1:b", "18446744073709551615:1"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }
}
