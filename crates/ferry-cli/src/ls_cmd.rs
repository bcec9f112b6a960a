//! `ferry ls NAME[:PATH]`: lists a directory of a paired peer's share (or shows one file's entry).

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_share::wire::{Entry, Kind, SharePath};
use serde_json::json;

use crate::failure::Usage;
use crate::paired;
use crate::reach_args::{peer_options, CommonArgs, PeerArg, RelayArgs};
use crate::ui::{escape, print_event, stdout_line, Ui};

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
    target: String,
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
}

impl LsArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// `NAME[:PATH]` split, the path checked by the share's name rules (`/` separated, relative, no `..`);
/// leading and trailing slashes are dropped.
pub fn parse_target(target: &str) -> Result<(&str, SharePath), Usage> {
    let (name, path) = target.split_once(':').unwrap_or((target, ""));
    if name.is_empty() {
        return Err(Usage(format!(
            "{:?}: give the paired peer's name first, as NAME or NAME:PATH",
            target
        )));
    }
    let path = path.trim_matches('/');
    let path = SharePath::new(path.as_bytes())
        .map_err(|e| Usage(format!("{}: not a path inside a share: {e}", escape(path))))?;
    Ok((name, path))
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
    let (mut session, peer) = paired::open_share(name, &args.share, &reach, IN_FLIGHT, ui)?;
    let shown = String::from_utf8_lossy(path.as_bytes()).into_owned();
    let entry = session
        .stat(path.clone())
        .with_context(|| format!("{}:{}", peer.name, escape(&shown)))?;
    let entries = match entry.kind {
        Kind::Dir => session
            .list_all(path)
            .with_context(|| format!("{}:{}", peer.name, escape(&shown)))?,
        _ => vec![entry],
    };
    for e in &entries {
        show(e, ui.is_json());
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

/// One entry: a JSON `entry` event, or a line `KIND MODE SIZE MTIME NAME[ -> TARGET]`.
fn show(e: &Entry, json: bool) {
    let name = String::from_utf8_lossy(&e.name);
    let target = String::from_utf8_lossy(&e.target);
    if json {
        let mut fields = json!({
            "name": name, "kind": kind_str(e.kind), "size": e.size, "mode": e.mode,
            "mtime": e.mtime, "mtime_nsec": e.mtime_nsec,
        });
        if e.kind == Kind::Symlink {
            fields["target"] = json!(target);
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
        Kind::Symlink => format!(" -> {}", escape(&target)),
        _ => String::new(),
    };
    let suffix = if e.kind == Kind::Dir { "/" } else { "" };
    stdout_line(&format!(
        "{kind} {:04o} {:>14} {} {}{suffix}{link}",
        e.mode & 0o7777,
        e.size,
        utc(e.mtime),
        escape(&name)
    ));
}

/// `secs` since the epoch as `YYYY-MM-DD HH:MM` (UTC).
fn utc(secs: i64) -> String {
    let [year, month, day, hour, minute, _] = ferry_share::write::utc_parts(secs);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}")
}

#[cfg(test)]
mod tests {
    use super::{parse_target, utc};

    #[test]
    fn targets_split_at_the_first_colon_and_paths_are_checked() {
        let (name, path) = parse_target("laptop").unwrap();
        assert_eq!((name, path.as_bytes()), ("laptop", &b""[..]));
        let (name, path) = parse_target("laptop:/photos/2026/").unwrap();
        assert_eq!((name, path.as_bytes()), ("laptop", &b"photos/2026"[..]));
        let (_, path) = parse_target("laptop:a:b").unwrap();
        assert_eq!(path.as_bytes(), b"a:b");
        assert!(parse_target("laptop:../etc").is_err());
        assert!(parse_target("laptop:a/../../b").is_err());
        assert!(parse_target(":x").is_err());
    }

    #[test]
    fn times_are_shown_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06");
        assert_eq!(utc(-60), "1969-12-31 23:59");
    }
}
