//! `ferry share DIR`: serves a directory to paired peers until SIGINT or SIGTERM.
//!
//! One [`Standing`] waiting side is reachable under every allowed peer's meeting hash (renewed as windows turn
//! and peers come and go); each handshake accepts any identity, and the key is checked against `peers.toml`
//! and `--allow` before a single request is read. Each admitted client gets a thread running
//! [`ferry_share::io::serve`], with one outboard cache and one change feed for all of them.

use std::any::Any;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_channel::{Admit, ChannelError, PeerKey, PUBLIC_KEY_LEN};
use ferry_session::congestion::{DataStream, Policy};
use ferry_session::{Connected, Events, Standing};
use ferry_share::fs::{OutboardCache, ShareRoot};
use ferry_share::io::{serve, Changes};
use ferry_share::server::ServerConfig;
use ferry_share::watch::WatchNotice;
use serde_json::{json, Value};

use crate::failure::Usage;
use crate::hint::{dialable, OtherSide};
use crate::paired::{self, Allowed, Me};
use crate::reach_args::{peer_options, CommonArgs, ListenArg, RelayArgs};
use crate::settings::cache_dir;
use crate::ui::{count, escape, human_bytes, print_event, stderr_line, Ui};

/// Most clients served at once; one more is refused (and told nothing: its connection closes).
const MAX_CLIENTS: usize = 64;
/// How long changes in the share are gathered before clients hear of them.
const CHANGE_DEBOUNCE: Duration = Duration::from_millis(100);
/// Longest share name.
const MAX_SHARE_NAME: usize = 64;

/// Arguments of `ferry share`.
#[derive(Args, Debug)]
#[command(
    mut_arg("json", |a| a.help("One JSON event per line on stdout (ready, client-connected, client-gone, refused, request-error, pull, conflict, stats, stopped)")),
    mut_arg("listen", |a| a.help(
        "Address to listen on for peers. Default: a free port on loopback with --no-discovery; with discovery, \
         every interface, taking connections only from this host and directly attached networks"
    )),
    mut_arg("relay", |a| a.help(
        "Relay to stay registered at, for peers no direct path reaches (also FERRY_RELAY, config `relay`)"
    )),
)]
pub struct ShareArgs {
    /// The directory to serve (read-only unless --writable).
    dir: PathBuf,
    /// The share's name; peers reach it with `--share NAME` (letters, digits, '.', '_', '-').
    #[arg(long, default_value = "default", value_name = "SHARE")]
    name: String,
    /// Serve only these paired peers (comma-separated names from `ferry peers`; default: every paired peer).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    allow: Vec<String>,
    /// Let the peers write (files, directories, renames, modes, times, symlinks); a file changed here since
    /// the version a peer's write derives from stays, and the peer's content lands beside it as
    /// NAME.conflict-PEER-DATE.
    #[arg(long)]
    writable: bool,
    /// With --writable: keep at least SIZE free on the share's file system (suffixes K, M, G, KiB, MiB,
    /// GiB); a write that would leave less, counting the writes in progress, is refused with disk-full
    /// before any byte is written. Default and floor: 5 % of the file system.
    #[arg(long, value_name = "SIZE", default_value = "0", hide_default_value = true,
          value_parser = crate::transfer_cmd::parse_size)]
    min_free: u64,
    /// Also print the stats line every DURATION (30s, 5m, 1h); it is always printed on SIGUSR1.
    #[arg(long, value_name = "DURATION", value_parser = crate::transfer_cmd::parse_duration)]
    stats_interval: Option<Duration>,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    listen: ListenArg,
    #[command(flatten)]
    relay: RelayArgs,
}

impl ShareArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// What a share reports: JSON events on stdout, or one line each on stderr. Copied into every client's thread.
#[derive(Clone, Copy)]
pub(crate) struct Log {
    pub(crate) json: bool,
}

impl Log {
    /// A JSON event with `fields`, or the line `text` makes (escaped) on stderr.
    pub(crate) fn event(&self, event: &str, fields: Value, text: impl FnOnce() -> String) {
        if self.json {
            print_event(event, fields);
        } else {
            // Each line escaped: names from the file system or a peer never drive the terminal.
            let lines: Vec<_> = text().lines().map(|l| escape(l).into_owned()).collect();
            stderr_line(&lines.join("\n"));
        }
    }
}

/// What the stats line counts.
#[derive(Default)]
struct Stats {
    clients: AtomicUsize,
    sessions: AtomicU64,
    refused: AtomicU64,
    bytes_sent: Arc<AtomicU64>,
    bytes_received: Arc<AtomicU64>,
}

impl Stats {
    fn report(&self, log: Log) {
        let (clients, sessions, refused) = (
            self.clients.load(Ordering::Relaxed),
            self.sessions.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        );
        let (sent, received) = (
            self.bytes_sent.load(Ordering::Relaxed),
            self.bytes_received.load(Ordering::Relaxed),
        );
        log.event(
            "stats",
            json!({ "clients": clients, "sessions": sessions, "refused": refused,
                    "bytes_sent": sent, "bytes_received": received }),
            || {
                format!(
                    "stats: {clients} clients now, {sessions} sessions in all, {refused} refused, {} sent, {} received",
                    human_bytes(sent),
                    human_bytes(received)
                )
            },
        );
    }
}

/// A stream that counts the bytes through it.
struct Counted<S> {
    stream: S,
    count: Arc<AtomicU64>,
}

impl<S: Read> Read for Counted<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl<S: Write> Write for Counted<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.stream.write(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A share name: 1 to 64 letters, digits, '.', '_' or '-' (it goes into the meeting's purpose and the hello).
pub(crate) fn check_share_name(name: &str) -> Result<(), Usage> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SHARE_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    match ok {
        true => Ok(()),
        false => Err(Usage(format!(
            "{:?} is not a share name: use 1 to {MAX_SHARE_NAME} letters, digits, '.', '_' or '-'",
            name.chars().take(80).collect::<String>()
        ))),
    }
}

/// Runs `ferry share` until a signal stops it.
pub fn run(args: ShareArgs, ui: &mut Ui) -> anyhow::Result<()> {
    check_share_name(&args.name)?;
    let opts = peer_options(&args.common, &args.relay)?;
    let me = Me::load()?;
    let allowed = Allowed::new(&me.dir, &args.allow)?;
    let root = Arc::new(
        ShareRoot::open(&args.dir)
            .with_context(|| format!("cannot share {}", args.dir.display()))?
            .with_min_free(args.min_free),
    );
    let cache_dir = cache_dir()
        .context("no cache directory: set HOME or XDG_CACHE_HOME")?
        .join("share");
    let cache = OutboardCache::new(cache_dir);
    let changes = Changes::default();
    let log = Log {
        json: args.common.json,
    };
    if args.writable {
        // Temp files of puts that a crash of an earlier sharer left behind.
        let swept = root.sweep_temps(std::time::SystemTime::now());
        if swept > 0 {
            let w = format!(
                "removed {} left by an earlier run",
                count(swept as u64, "unfinished write", "unfinished writes")
            );
            log.event("warning", json!({ "message": w }), || {
                format!("warning: {w}")
            });
        }
    }
    let _watcher = {
        let changes = changes.clone();
        ferry_share::watch::watch(
            &args.dir,
            CHANGE_DEBOUNCE,
            move |paths| changes.publish(paths),
            move |notice| match notice {
                WatchNotice::Warning(warning) => {
                    log.event("warning", json!({ "message": warning }), || {
                        format!("warning: {warning}")
                    })
                }
                // Serving on would answer from a directory that is no longer at DIR (or from nothing):
                // the sharer stops, as on a signal, with the reason.
                WatchNotice::Gone(why) => {
                    crate::interrupt::release_kept();
                    let message = format!("{why}: stopped sharing it");
                    log.event("error", json!({ "code": "io", "message": message }), || {
                        format!("ferry: {message}")
                    });
                    std::process::exit(1);
                }
            },
        )
        .with_context(|| format!("cannot watch {} for changes", args.dir.display()))?
    };
    let stats = Arc::new(Stats::default());
    stop_on_signals(Arc::clone(&stats), log)?;
    if let Some(every) = args.stats_interval.filter(|d| !d.is_zero()) {
        let stats = Arc::clone(&stats);
        std::thread::spawn(move || loop {
            std::thread::sleep(every);
            stats.report(log);
        });
    }

    let purpose = paired::share_purpose(&args.name);
    let hashes = allowed.hashes(me.dir.clone(), purpose);
    // A key is admitted in the handshake, before this machine's own key is shown to it.
    let admit: Admit = {
        let (allowed, dir) = (allowed.clone(), me.dir.clone());
        Arc::new(move |key: &[u8; PUBLIC_KEY_LEN]| allowed.admit(&dir, Some(key)).map(|_| ()))
    };
    let auth = me.auth(PeerKey::Admitted(admit));
    let mut standing = Standing::start(hashes, auth, &opts, args.listen.listen, ui)?;
    let peers = standing.hashes().len();
    log.event(
        "ready",
        json!({ "share": args.name, "dir": args.dir.to_string_lossy(), "peers": peers,
                "listen": standing.listen.map(|a| a.to_string()), "relay": opts.relay,
                "writable": args.writable }),
        || {
            let listen = standing
                .listen
                .map(|a| format!(", listening on {a}"))
                .unwrap_or_default();
            let relay = opts
                .relay
                .as_ref()
                .map(|r| format!(", at the relay {r}"))
                .unwrap_or_default();
            let share = match args.name.as_str() {
                "default" => String::new(),
                name => format!("--share {name} "),
            };
            let writable = match args.writable {
                true => " (writable)",
                false => "",
            };
            let reachable = standing.listen.map(dialable).unwrap_or_default();
            let other_side = OtherSide::of(
                &opts,
                standing.listen,
                args.listen.listen.is_some(),
                &reachable,
            );
            let command = format!(
                "ferry ls {}{share}NAME[:PATH]  (NAME: this machine's name there)",
                other_side.flags
            );
            format!(
                "Sharing {}{writable} as {:?} with {}{listen}{relay}. Ctrl-C stops.\n{}",
                args.dir.display(),
                args.name,
                count(peers as u64, "paired peer", "paired peers"),
                other_side.lines("a peer", &command, "ferry share"),
            )
        },
    );
    let config = ServerConfig {
        share: args.name.clone().into_bytes(),
        writable: args.writable,
        ..ServerConfig::default()
    };
    loop {
        let connected = standing.accept(&mut Serving {
            ui,
            stats: &stats,
            log,
        })?;
        let address = connected.peer.clone();
        // Who it is, decided before anything is read from it.
        let peer = match allowed.admit(&me.dir, connected.established.peer_identity.as_ref()) {
            Ok(peer) => peer,
            Err(reason) => {
                refuse(&stats, log, &address, &reason);
                continue;
            }
        };
        if stats.clients.load(Ordering::Relaxed) >= MAX_CLIENTS {
            let reason = format!("{MAX_CLIENTS} clients are connected already");
            refuse(&stats, log, peer.name.as_str(), &reason);
            continue;
        }
        if let Err(w) = me.seen(&peer.key, &address) {
            log.event("warning", json!({ "message": w }), || {
                format!("warning: {w}")
            });
        }
        stats.clients.fetch_add(1, Ordering::Relaxed);
        stats.sessions.fetch_add(1, Ordering::Relaxed);
        let name = peer.name.to_string();
        log.event(
            "client-connected",
            json!({ "peer": name, "address": address, "path": connected.path.as_str() }),
            || format!("{name} connected ({}, {address})", connected.path),
        );
        let (root, cache, changes, stats) = (
            Arc::clone(&root),
            cache.clone(),
            changes.clone(),
            Arc::clone(&stats),
        );
        // The peer's name goes into the names of its conflict copies.
        let config = ServerConfig {
            peer: name.clone(),
            ..config.clone()
        };
        std::thread::spawn(move || {
            let served = serve_client(
                connected, &root, &cache, &changes, config, &stats, &name, log,
            );
            stats.clients.fetch_sub(1, Ordering::Relaxed);
            match served {
                // A client that hangs up without the channel's close costs the share nothing.
                Ok(()) | Err(ferry_share::io::SessionError::Channel(ChannelError::Truncated)) => {
                    log.event("client-gone", json!({ "peer": name }), || {
                        format!("{name} disconnected")
                    })
                }
                Err(e) => {
                    if let ferry_share::io::SessionError::Server(bad) = &e {
                        // The client broke the protocol: its request is what ended the session.
                        let bad = bad.to_string();
                        log.event(
                            "request-error",
                            json!({ "peer": name, "error": bad }),
                            || format!("{name}: bad request: {bad}"),
                        );
                    }
                    let e = e.to_string();
                    log.event("client-gone", json!({ "peer": name, "error": e }), || {
                        format!("{name} disconnected: {e}")
                    })
                }
            }
        });
    }
}

/// Logs a refused connection; dropping it closes it.
/// The waiting side's events as a sharer reports them: refusals in its log (`refused` events), the rest as
/// every command does.
struct Serving<'a> {
    ui: &'a mut Ui,
    stats: &'a Stats,
    log: Log,
}

impl Events for Serving<'_> {
    fn warn(&mut self, message: &str) {
        Events::warn(self.ui, message);
    }

    fn waiting(&mut self, what: &str) {
        Events::waiting(self.ui, what);
    }

    fn keep_until_exit(&mut self, value: Box<dyn Any + Send>) -> Box<dyn Any + Send> {
        Events::keep_until_exit(self.ui, value)
    }

    fn refused(&mut self, peer: &str, reason: &str) {
        refuse(self.stats, self.log, peer, reason);
    }
}

fn refuse(stats: &Stats, log: Log, peer: &str, reason: &str) {
    stats.refused.fetch_add(1, Ordering::Relaxed);
    log.event("refused", json!({ "peer": peer, "reason": reason }), || {
        format!("refused {peer}: {reason}")
    });
}

/// Serves one admitted client until it hangs up.
#[allow(clippy::too_many_arguments)]
fn serve_client(
    connected: Connected,
    root: &ShareRoot,
    cache: &OutboardCache,
    changes: &Changes,
    config: ServerConfig,
    stats: &Stats,
    name: &str,
    log: Log,
) -> Result<(), ferry_share::io::SessionError> {
    let est = connected.established;
    let reading = connected.stream.try_clone()?;
    let reader = SecureReader::new(
        Counted {
            stream: reading,
            count: Arc::clone(&stats.bytes_received),
        },
        est.opener,
    );
    // The replies' congestion control as `send`'s data (ferry_session::congestion).
    let policy = Policy::for_path(connected.path);
    let writer = SecureWriter::new(
        Counted {
            stream: DataStream::new(connected.stream, &policy),
            count: Arc::clone(&stats.bytes_sent),
        },
        est.sealer,
    );
    // The session logs refusals ("refused: ..."), writes that conflicted ("conflict: ...") and what its
    // pulls did (sent, skipped, failed).
    let mut on_log = |line: &str| {
        if let Some(what) = line.strip_prefix("refused: ") {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            log.event("refused", json!({ "peer": name, "reason": what }), || {
                format!("refused a request of {name}: {what}")
            })
        } else if let Some(what) = line.strip_prefix("conflict: ") {
            log.event("conflict", json!({ "peer": name, "message": what }), || {
                format!("conflict with {name}: {what}")
            })
        } else {
            log.event("pull", json!({ "peer": name, "message": line }), || {
                format!("{name}: {line}")
            })
        }
    };
    serve(reader, writer, root, cache, changes, config, &mut on_log)
}

/// SIGINT, SIGTERM and SIGHUP end the share (announcements withdrawn, sessions closed, exit 0); SIGUSR1
/// prints the stats line. Signals are read on a thread of their own, so nothing unsafe runs in a handler.
fn stop_on_signals(stats: Arc<Stats>, log: Log) -> anyhow::Result<()> {
    let reported = Arc::clone(&stats);
    crate::interrupt::on_signals(
        move || reported.report(log),
        move || {
            crate::interrupt::release_kept();
            stats.report(log);
            log.event("stopped", json!({}), || "stopped".to_string());
            std::process::exit(0);
        },
    )?;
    Ok(())
}
