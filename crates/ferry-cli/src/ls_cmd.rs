//! `ferry ls NAME[:PATH]`: lists a directory of a paired peer's share (or shows one file's entry).

use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_share::wire::{Entry, Kind, SharePath};
use serde_json::json;

use crate::failure::Usage;
use crate::paired;
use crate::reach_args::{peer_options, CommonArgs, PeerArg, RelayArgs};
use crate::ui::{escape_bytes, human_bytes, print_event, stdout_line, Ui};

/// Requests in flight at once: `ls` asks one thing at a time.
const IN_FLIGHT: u32 = 4;

/// Arguments of `ferry ls`.
#[derive(Args, Debug)]
#[command(
    mut_arg("peer", |a| a.help(
        "Connect straight to the sharer at this address (its `ferry share --listen` address)"
    )),
    mut_arg("json", |a| a.help(
        "One JSON event per line on stdout: `connected`, then an `entry` per entry (name, kind, size, mode, mtime, \
         mtime_nsec, target)"
    )),
)]
pub struct LsArgs {
    /// The paired peer (`ferry peers`) and, after a colon, the path inside its share (default: the top).
    target: OsString,
    /// The share's name on that peer (`ferry share --name`).
    #[arg(long, default_value = "default", value_name = "SHARE")]
    share: String,
    /// How long to look for the share (30s, 5m, or seconds; 0 tries once).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::transfer_cmd::parse_duration)]
    wait: Duration,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    peer: PeerArg,
    #[command(flatten)]
    relay: RelayArgs,
    /// Sizes in bytes, exactly (the default where standard output is not a terminal, and with --json).
    #[arg(long)]
    bytes: bool,
    /// Refuse a listing that needs more memory than SIZE (each entry counts its fixed size plus its name
    /// and link target; suffixes K, M, G, KiB, MiB, GiB): a sharer cannot make `ls` hold more.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = crate::transfer_cmd::parse_size)]
    max_listing: u64,
    /// Also say how the sharer was reached (on stderr).
    #[arg(long, short = 'v')]
    verbose: bool,
}

impl LsArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// `NAME[:PATH]` split at the first colon ([`paired::split_target`]), the path checked by the share's name
/// rules (`/` separated, relative, no `..`); leading and trailing slashes are dropped.
pub fn parse_target(target: &OsStr) -> Result<(&str, SharePath), Usage> {
    let (name, path) = paired::split_target(target)?;
    let path = trim_slashes(path.unwrap_or_default());
    let path = SharePath::new(path).map_err(|e| {
        Usage(format!(
            "{}: not a path inside a share: {e}",
            escape_bytes(path)
        ))
    })?;
    Ok((name, path))
}

/// `path` without its leading and trailing slashes.
fn trim_slashes(path: &[u8]) -> &[u8] {
    let start = path.iter().position(|&b| b != b'/').unwrap_or(path.len());
    let end = path
        .iter()
        .rposition(|&b| b != b'/')
        .map_or(start, |i| i + 1);
    &path[start..end]
}

/// Runs `ferry ls`.
pub fn run(args: LsArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let (name, path) = parse_target(&args.target)?;
    let opts = peer_options(&args.common, &args.relay)?;
    let reach = paired::Reach {
        opts: &opts,
        peer: args.peer.peer,
        wait: args.wait,
    };
    ui.show_path = args.verbose;
    let (mut session, peer) = paired::open_share(name, &args.share, &reach, IN_FLIGHT, ui)?;
    let shown = escape_bytes(path.as_bytes()).into_owned();
    let entry = session
        .stat(path.clone())
        .with_context(|| format!("{}:{shown}", peer.name))?;
    let entries = match entry.kind {
        Kind::Dir => session
            .list_within(path, args.max_listing)
            .with_context(|| format!("{}:{shown}", peer.name))?,
        _ => vec![entry],
    };
    // A person reads sizes in KiB, MiB, GiB; a script reading a pipe gets exact bytes, as with --json.
    let human = !args.bytes && std::io::stdout().is_terminal();
    for e in &entries {
        show(e, ui.is_json(), human);
    }
    Ok(())
}

fn kind_str(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "file",
        Kind::Dir => "dir",
        Kind::Symlink => "symlink",
    }
}

/// One entry: a JSON `entry` event, or a line `KIND MODE SIZE MTIME NAME[ -> TARGET]` (the size in bytes, or
/// in binary units when `human`).
fn show(e: &Entry, json: bool, human: bool) {
    if json {
        let mut fields = json!({
            "name": String::from_utf8_lossy(&e.name), "kind": kind_str(e.kind), "size": e.size, "mode": e.mode,
            "mtime": e.mtime, "mtime_nsec": e.mtime_nsec,
        });
        if e.kind == Kind::Symlink {
            fields["target"] = json!(String::from_utf8_lossy(&e.target));
        }
        print_event("entry", fields);
        return;
    }
    let kind = match e.kind {
        Kind::File => '-',
        Kind::Dir => 'd',
        Kind::Symlink => 'l',
    };
    let link = match e.kind {
        Kind::Symlink => format!(" -> {}", escape_bytes(&e.target)),
        _ => String::new(),
    };
    let suffix = if e.kind == Kind::Dir { "/" } else { "" };
    let size = match human {
        true => format!("{:>10}", human_bytes(e.size)),
        false => format!("{:>14}", e.size),
    };
    stdout_line(&format!(
        "{kind} {:04o} {size} {} {}{suffix}{link}",
        e.mode & 0o7777,
        utc(e.mtime),
        escape_bytes(&e.name)
    ));
}

/// `secs` since the epoch as `YYYY-MM-DD HH:MM` (UTC).
fn utc(secs: i64) -> String {
    let [year, month, day, hour, minute, _] = ferry_share::write::utc_parts(secs);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}")
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use super::{parse_target, utc};

    fn parsed(target: &[u8]) -> Result<(String, Vec<u8>), String> {
        parse_target(OsStr::from_bytes(target))
            .map(|(name, path)| (name.to_string(), path.as_bytes().to_vec()))
            .map_err(|e| e.0)
    }

    #[test]
    fn targets_split_at_the_first_colon_and_paths_are_checked() {
        assert_eq!(parsed(b"laptop"), Ok(("laptop".into(), b"".to_vec())));
        assert_eq!(parsed(b"laptop:"), Ok(("laptop".into(), b"".to_vec())));
        assert_eq!(parsed(b"laptop:/"), Ok(("laptop".into(), b"".to_vec())));
        assert_eq!(
            parsed(b"laptop://photos/2026//"),
            Ok(("laptop".into(), b"photos/2026".to_vec()))
        );
        assert_eq!(parsed(b"laptop:a:b").unwrap().1, b"a:b");
        // File names are bytes; a peer's name is text.
        assert_eq!(
            parsed(b"laptop:bad\xffname"),
            Ok(("laptop".into(), b"bad\xffname".to_vec()))
        );
        assert!(parsed(b"lap\xfftop:x").unwrap_err().contains("lap\\xfftop"));
        assert!(parsed(b"laptop:../etc").is_err());
        assert!(parsed(b"laptop:a/../../b").is_err());
        assert!(parsed(b":x").is_err());
    }

    #[test]
    fn times_are_shown_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06");
        assert_eq!(utc(-60), "1969-12-31 23:59");
    }
}
