//! `ferry mount NAME[:SHARE] MOUNTPOINT`: a paired peer's share as a local directory (writable when the
//! sharer shares `--writable` and not `--read-only`), until unmounted (`ferry unmount`, Ctrl-C, SIGTERM);
//! `ferry unmount MOUNTPOINT`.
//!
//! The mount reaches the share like `ls` and `pull` do, then keeps the link with [`Remote`] (redialled
//! through [`paired::reach_share`] when lost). Files read are kept, verified, in the chunk cache under
//! `$XDG_CACHE_HOME/ferry/mounts/PEER/SHARE/`, bounded by `--cache-size`; see `ferry_mount` for the layers.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use ferry_channel::blocking::split_tcp;
use ferry_mount::files::{ReadConfig, Reader, Stats};
use ferry_mount::fuse::{Changes, ShareFs};
use ferry_mount::lifecycle::{self, Unmounted};
use ferry_mount::source::Sink;
use ferry_mount::store::Store;
use ferry_session::Connected;
use ferry_share::remote::{
    Dial, LinkState, Remote, RemoteConfig, RemoteError, CLOSED_BEFORE_HELLO,
};
use serde_json::json;

use crate::failure::{Background, Usage};
use crate::paired::{self, Me};
use crate::reach_args::{peer_options, CommonArgs, PeerArg, RelayArgs};
use crate::settings::cache_dir;
use crate::share_cmd::Log;
use crate::ui::{escape, Ui};
use ferry_wire::ErrorCode;

/// Arguments of `ferry mount`.
#[derive(Args, Debug)]
#[command(
    mut_arg("peer", |a| a.help(
        "Connect straight to the sharer at this address (its `ferry share --listen` address)"
    )),
    mut_arg("json", |a| a.help(
        "One JSON event per line on stdout: `connected`, `mounted`, `link` (lost, back), `notice`, `stats`, \
         `unmounted`"
    )),
)]
pub struct MountArgs {
    /// The paired peer (`ferry peers`) and, after a colon, its share's name (default: `default`).
    target: String,
    /// An existing, empty directory to mount the share on.
    mountpoint: PathBuf,
    /// Mount read-only (writes fail with EROFS; so they do when the sharer does not share `--writable`).
    #[arg(long)]
    read_only: bool,
    /// Most bytes the chunk cache keeps on disk (K, M, G), least recently used files evicted first.
    #[arg(long, value_name = "SIZE", default_value = "10G", value_parser = crate::transfer_cmd::parse_size)]
    cache_size: u64,
    /// How long a request may go unanswered before it fails (EIO) and the link counts as lost.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::transfer_cmd::parse_duration)]
    deadline: Duration,
    /// Serve every read in the daemon, also of fully cached files (no FUSE passthrough; for comparisons).
    #[arg(long, hide = true)]
    no_passthrough: bool,
    /// Detach: return once mounted, leaving the mount served in the background.
    #[arg(long)]
    daemon: bool,
    /// How long to look for the share at first (30s, 5m, or seconds; 0 tries once).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::transfer_cmd::parse_duration)]
    wait: Duration,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    peer: PeerArg,
    #[command(flatten)]
    relay: RelayArgs,
}

impl MountArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// Arguments of `ferry unmount`.
#[derive(Args, Debug)]
pub struct UnmountArgs {
    /// The directory a `ferry mount` serves.
    mountpoint: PathBuf,
    /// One JSON event on stdout: `unmounted` (with `lazy`).
    #[arg(long)]
    json: bool,
}

impl UnmountArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.json
    }
}

/// An existing, empty directory that nothing is mounted on: a mount over files would hide them, and a
/// second mount over a live one would hide it.
fn check_mountpoint(mountpoint: &Path) -> anyhow::Result<()> {
    let shown = mountpoint.display();
    if !mountpoint.is_dir() {
        let why = match mountpoint.try_exists() {
            Ok(false) => "no such directory",
            _ => "not a directory",
        };
        return Err(Usage(format!("{shown}: {why}")).into());
    }
    if let Some(there) = lifecycle::mounted_on(mountpoint) {
        // `ferry unmount` takes only ferry's own mounts: another one is named, not offered to it.
        let how = if there.is_ferry() {
            format!("`ferry unmount {shown}` first")
        } else {
            format!("{} from {}", there.fstype, escape(&there.source))
        };
        return Err(Usage(format!(
            "{shown}: something is mounted there already ({how})"
        ))
        .into());
    }
    let mut entries =
        std::fs::read_dir(mountpoint).with_context(|| format!("{shown}: cannot list it"))?;
    if entries.next().is_some() {
        return Err(Usage(format!(
            "{shown}: not empty (a mount would hide its files): give an empty directory"
        ))
        .into());
    }
    Ok(())
}

/// The refusal of a second mount of the share named `fsname` (`ferry:PEER:SHARE`), whose cache `dir` another
/// mount has open: where that mount is, when this user's mount table shows it.
fn share_in_use(fsname: &str, dir: &Path) -> Usage {
    let shown = fsname.strip_prefix("ferry:").unwrap_or(fsname);
    let me = rustix::process::geteuid().as_raw();
    let elsewhere: Vec<String> = lifecycle::mount_table()
        .into_iter()
        .filter(|m| m.is_ferry() && m.source == fsname && m.user_id.is_none_or(|u| u == me))
        .map(|m| escape(&m.point.to_string_lossy()).into_owned())
        .collect();
    Usage(match elsewhere.last() {
        Some(point) => format!(
            "{shown} is mounted already on {point}, and a share mounts once at a time (its cache is one \
             mount's): use that mount, or `ferry unmount {point}` first"
        ),
        None => format!(
            "another `ferry mount` of {shown} is running (its cache {} is in use), and a share mounts once \
             at a time: stop that one first",
            escape(&dir.to_string_lossy())
        ),
    })
}

/// Set in the environment of the process `--daemon` starts: it serves the mount, its parent returns.
const DAEMON_CHILD: &str = "FERRY_MOUNT_DAEMON_CHILD";

/// Runs `ferry mount`.
pub fn run(args: MountArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let (name, share) = args
        .target
        .split_once(':')
        .unwrap_or((&args.target, "default"));
    if name.is_empty() {
        return Err(Usage(format!(
            "{:?}: give the paired peer's name first, as NAME or NAME:SHARE",
            args.target
        ))
        .into());
    }
    crate::share_cmd::check_share_name(share)?;
    let mountpoint = lifecycle::resolve(&args.mountpoint)
        .with_context(|| format!("{}: no such directory", args.mountpoint.display()))?;
    let stale_ferry_mount = lifecycle::is_stale(&mountpoint)
        && lifecycle::mounted_on(&mountpoint).is_some_and(|m| m.is_ferry());
    if stale_ferry_mount {
        // The mount of a ferry process that died: gone before mounting again (another program's stale
        // mount is refused below, as any mount there is).
        lifecycle::unmount(&mountpoint)
            .with_context(|| format!("{}: a stale mount is in the way", mountpoint.display()))?;
        ui.warn(&format!(
            "{}: unmounted a stale mount",
            mountpoint.display()
        ));
    }
    check_mountpoint(&mountpoint)?;
    if args.deadline.is_zero() {
        return Err(Usage("--deadline 0: a request needs some time to be answered".into()).into());
    }
    let opts = peer_options(&args.common, &args.relay)?;
    let me = Arc::new(Me::load()?);
    let peer = me.peer(name)?;
    let dir = cache_dir()
        .context("no cache directory: set HOME or XDG_CACHE_HOME")?
        .join("mounts")
        .join(peer.name.as_str())
        .join(share);
    let fsname = format!("ferry:{}:{share}", peer.name);
    // One mount of a share at a time (its cache and working copies are one process's): a second is
    // refused here, before the peer is reached and before `--daemon` starts anything in the background.
    if args.daemon && std::env::var_os(DAEMON_CHILD).is_none() {
        if ferry_cache::Cache::in_use(&dir).unwrap_or(false) {
            return Err(share_in_use(&fsname, &dir).into());
        }
        return daemonize(&mountpoint, ui);
    }
    let cache: Arc<dyn Store> = match ferry_cache::Cache::open(&dir, args.cache_size) {
        Ok(cache) => Arc::new(cache),
        Err(ferry_cache::CacheError::Busy) => return Err(share_in_use(&fsname, &dir).into()),
        Err(e) => {
            return Err(
                anyhow::Error::new(e).context(format!("cannot open the cache {}", dir.display()))
            )
        }
    };
    let log = Log {
        json: args.common.json,
    };

    // The first connection, with the usual progress and errors; redials print nothing.
    let reach = paired::Reach {
        opts: &opts,
        peer: args.peer.peer,
        wait: args.wait,
    };
    let first = paired::reach_share(&me, &peer, share, &reach, ui);
    ui.waited();
    let first = first?;
    crate::transfer_cmd::report_path(ui, &first);
    let dial = dialler(first, Arc::clone(&me), peer.clone(), share, &opts, &args);

    let changes: Arc<OnceLock<Changes<Remote>>> = Arc::new(OnceLock::new());
    let on_change = {
        let changes = Arc::clone(&changes);
        Box::new(move |paths: Vec<ferry_share::wire::SharePath>| {
            if let Some(c) = changes.get() {
                c.apply(&paths);
            }
        })
    };
    let peer_name = peer.name.to_string();
    let on_link = Box::new(move |state: LinkState| {
        match state {
        LinkState::Up => {}
        LinkState::Lost(why) => log.event(
            "link",
            json!({ "state": "lost", "message": why }),
            || format!("the link to {peer_name} is lost ({why}): cached files stay readable, reconnecting"),
        ),
        LinkState::Back => log.event("link", json!({ "state": "back" }), || {
            format!("the link to {peer_name} is back")
        }),
    }
    });
    let config = RemoteConfig {
        max_in_flight: 256,
        deadline: args.deadline,
        ..RemoteConfig::default()
    };
    let remote = Remote::connect(dial, config, on_change, on_link).map_err(|e| {
        let context = match &e {
            RemoteError::Disconnected(why) if why == CLOSED_BEFORE_HELLO => {
                paired::refused_before_hello(&peer)
            }
            _ => format!("cannot open the share {share:?} of {}", peer.name),
        };
        anyhow::Error::new(e).context(context)
    })?;
    paired::check_share(&peer, share, &remote.share())?;

    let stats = Arc::new(Stats::default());
    let source = Arc::new(remote);
    let reader = Reader::new(
        Arc::clone(&source),
        Arc::clone(&cache),
        ReadConfig::default(),
        Arc::clone(&stats),
    );
    // Asked once: whether the sharer takes writes (a share that is not --writable mounts read-only).
    let writable = !args.read_only
        && source
            .writable()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("cannot ask the sharer whether it takes writes")?;
    let notice = Arc::new(move |line: &str| {
        log.event("notice", json!({ "message": line }), || line.to_string())
    });
    let mut fs = ShareFs::new(source, reader, notice);
    if args.no_passthrough {
        fs = fs.without_passthrough();
    }
    if writable {
        // Working copies of files being written, beside the cache's files (which it does not touch).
        let writes = dir.join("writes");
        fs = fs
            .writable(&writes, cache)
            .with_context(|| format!("cannot keep working copies in {}", writes.display()))?;
    }
    let _ = changes.set(fs.changes());
    let mounted = lifecycle::mount(fs, &mountpoint, &fsname)
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    mounted.raise_readahead();

    let reported = Arc::clone(&stats);
    // This mount in the mount table: a signal unmounts it, never what was mounted over it since.
    let own = lifecycle::mounted_on(&mountpoint).map(|m| m.id);
    let stopping = mountpoint.clone();
    let stops = Mutex::new(0u32);
    crate::interrupt::on_signals(
        move || {
            let line = reported.line();
            log.event("stats", json!({ "line": line }), || {
                format!("stats: {line}")
            })
        },
        move || {
            let mut n = stops.lock().unwrap_or_else(|e| e.into_inner());
            *n += 1;
            if *n > 1 {
                // A second signal while the first one's unmount waits: leave now, detached.
                if covering(&stopping, own).is_none() {
                    let _ = lifecycle::unmount_lazily(&stopping);
                }
                std::process::exit(130);
            }
            stop(&stopping, own, log);
        },
    )?;
    log.event(
        "mounted",
        json!({ "mountpoint": mountpoint.to_string_lossy(), "peer": peer.name.as_str(), "share": share,
                "cache": dir.to_string_lossy(), "writable": writable }),
        || {
            format!(
                "mounted {}:{share} on {}{} (Ctrl-C or `ferry unmount` unmounts)",
                peer.name,
                escape(&mountpoint.to_string_lossy()),
                if writable { "" } else { ", read-only" }
            )
        },
    );
    let served = mounted.run();
    unmounted(&mountpoint, log);
    served.with_context(|| format!("serving {}", mountpoint.display()))
}

/// What was mounted over this mount (ID `own`) on `mountpoint`: an unmount there would take that instead.
fn covering(mountpoint: &Path, own: Option<u64>) -> Option<lifecycle::MountEntry> {
    let top = lifecycle::mounted_on(mountpoint)?;
    own.is_some_and(|id| id != top.id).then_some(top)
}

/// Unmounts on a signal: at once, or lazily (with a message) when something still uses the mount. A
/// lazily detached mount would be served until its last user leaves: the process ends now instead (what
/// is still open there fails with ENOTCONN). A mount covered by another cannot be unmounted without
/// taking that one: the process ends and leaves it, stale, under the other.
fn stop(mountpoint: &Path, own: Option<u64>, log: Log) {
    if let Some(over) = covering(mountpoint, own) {
        let shown = escape(&mountpoint.to_string_lossy()).into_owned();
        let message = format!(
            "{shown} has another mount over this one ({} from {}), not ferry's to unmount: this mount \
             ends under it (`ferry unmount {shown}` once that one is gone)",
            over.fstype,
            escape(&over.source)
        );
        log.event("warning", json!({ "message": message }), || {
            format!("warning: {message}")
        });
        std::process::exit(1);
    }
    match lifecycle::unmount(mountpoint) {
        Ok(Unmounted::Clean) => {}
        Ok(Unmounted::Lazily) => {
            busy_message(mountpoint, log, "files still open there fail from now on");
            unmounted(mountpoint, log);
            std::process::exit(0);
        }
        Err(e) => log.event(
            "warning",
            json!({ "message": format!("cannot unmount: {e}") }),
            || format!("warning: cannot unmount {}: {e}", mountpoint.display()),
        ),
    }
}

fn unmounted(mountpoint: &Path, log: Log) {
    log.event(
        "unmounted",
        json!({ "mountpoint": mountpoint.to_string_lossy() }),
        || format!("unmounted {}", escape(&mountpoint.to_string_lossy())),
    );
}

/// `then`: what becomes of what is still open there.
fn busy_message(mountpoint: &Path, log: Log, then: &str) {
    let m = mountpoint.to_string_lossy();
    log.event(
        "notice",
        json!({ "message": "busy: detached lazily", "mountpoint": m }),
        || {
            format!(
                "{} is busy (a shell or program is inside it): detached now, {then}",
                escape(&m)
            )
        },
    );
}

/// The `Dial` of the link: the first connection once, then a new reach each time the link is lost.
fn dialler(
    first: Connected,
    me: Arc<Me>,
    peer: ferry_peers::Peer,
    share: &str,
    opts: &ferry_session::PeerOptions,
    args: &MountArgs,
) -> Dial {
    let first = Mutex::new(Some(first));
    let share = share.to_string();
    let opts = opts.clone();
    let direct = args.peer.peer;
    // A redial looks for as long as a request may wait; the link's supervisor tries again after that.
    let wait = args.deadline;
    Box::new(move || {
        let taken = first.lock().unwrap_or_else(|e| e.into_inner()).take();
        let connected = match taken {
            Some(c) => c,
            None => {
                let reach = paired::Reach {
                    opts: &opts,
                    peer: direct,
                    wait,
                };
                paired::reach_share(&me, &peer, &share, &reach, &mut ())
                    .map_err(|e| format!("{e:#}"))?
            }
        };
        split_tcp(connected.stream, connected.established).map_err(|e| e.to_string())
    })
}

/// `--daemon`: runs this command again in a new session with its output to a log file in the cache
/// directory, and returns once the mount is up (or the child failed).
fn daemonize(mountpoint: &Path, ui: &mut Ui) -> anyhow::Result<()> {
    let logs = cache_dir()
        .context("no cache directory: set HOME or XDG_CACHE_HOME")?
        .join("mounts");
    std::fs::create_dir_all(&logs)?;
    let log_path = logs.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let from = log.metadata()?.len();
    let mut child = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(DAEMON_CHILD, "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the mount in the background")?;
    let started = Instant::now();
    loop {
        if lifecycle::is_mounted(mountpoint) {
            ui.event(
                "mounted",
                json!({ "mountpoint": mountpoint.to_string_lossy(), "pid": child.id(),
                        "log": log_path.to_string_lossy() }),
            );
            ui.info(&format!(
                "mounted {} in the background (pid {}, log {})",
                mountpoint.display(),
                child.id(),
                log_path.display()
            ));
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            // What it said in the log, from its start: its error is the last one.
            let said = std::fs::read(&log_path).unwrap_or_default();
            let said = String::from_utf8_lossy(said.get(from as usize..).unwrap_or_default());
            let (code, message) = last_error(&said)
                .unwrap_or_else(|| (None, format!("it ended ({status}) without saying why")));
            return Err(Background {
                code,
                exit: status
                    .code()
                    .and_then(|c| u8::try_from(c).ok())
                    .filter(|&c| c != 0)
                    .unwrap_or(1),
                message,
                log: log_path.display().to_string(),
            }
            .into());
        }
        if started.elapsed() > Duration::from_secs(600) {
            anyhow::bail!("the background mount did not mount within 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last error a `ferry` process printed in `text` (its output): from a `--json` error event, its code
/// and message; from a line `ferry: MESSAGE`, the message.
fn last_error(text: &str) -> Option<(Option<ErrorCode>, String)> {
    text.lines().rev().find_map(|line| {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            let message = v["message"].as_str().filter(|_| v["event"] == "error")?;
            return Some((
                v["code"].as_str().and_then(ErrorCode::parse),
                message.to_string(),
            ));
        }
        line.strip_prefix("ferry: ").map(|m| (None, m.to_string()))
    })
}

/// Runs `ferry unmount`.
pub fn unmount(args: UnmountArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let mountpoint = lifecycle::resolve(&args.mountpoint)
        .with_context(|| format!("{}: no such directory", args.mountpoint.display()))?;
    let Some(mounted) = lifecycle::mounted_on(&mountpoint) else {
        return Err(Usage(format!(
            "{}: nothing is mounted there",
            mountpoint.display()
        ))
        .into());
    };
    // Only what `ferry mount` mounted: unmounting someone's tmpfs or sshfs is not this command's job.
    if !mounted.is_ferry() {
        return Err(Usage(format!(
            "{}: not a ferry mount (type {}, source {}): `ferry unmount` unmounts only what `ferry mount` \
             mounted (umount(8) unmounts the rest)",
            mountpoint.display(),
            mounted.fstype,
            escape(&mounted.source)
        ))
        .into());
    }
    let how = lifecycle::unmount(&mountpoint)
        .with_context(|| format!("cannot unmount {}", mountpoint.display()))?;
    let lazy = how == Unmounted::Lazily;
    ui.event(
        "unmounted",
        json!({ "mountpoint": mountpoint.to_string_lossy(), "lazy": lazy }),
    );
    if lazy {
        let then = "served until the last user leaves";
        busy_message(&mountpoint, Log { json: ui.is_json() }, then);
    } else {
        ui.info(&format!("unmounted {}", mountpoint.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_background_mount_s_last_error_is_found_in_its_log() {
        let text = "Connected directly (127.0.0.1:1), aes-256-gcm\n\
                    ferry: an older error\n\
                    warning: something\n\
                    ferry: cannot open the cache /c: the cache directory is in use by another mount\n\
                    \n";
        assert_eq!(
            last_error(text),
            Some((
                None,
                "cannot open the cache /c: the cache directory is in use by another mount".into()
            ))
        );
        let json = "{\"event\":\"connected\",\"peer\":\"a\"}\n\
                    {\"event\":\"error\",\"code\":\"peer-gone\",\"message\":\"a closed the connection\"}\n";
        assert_eq!(
            last_error(json),
            Some((Some(ErrorCode::PeerGone), "a closed the connection".into()))
        );
        // An unknown code keeps the message; a log without an error has none.
        let odd = "{\"event\":\"error\",\"code\":\"new-code\",\"message\":\"m\"}\n";
        assert_eq!(last_error(odd), Some((None, "m".into())));
        assert_eq!(last_error("mounted x\n{\"event\":\"mounted\"}\n"), None);
    }
}
