//! `ferry send` and `ferry receive`: find the peer, open the secure channel, run the transfer engine.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufRead, IsTerminal};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use clap::Args;
use ferry_channel::blocking::split_tcp;
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::Code;
use ferry_session::upgrade::{self, DirectPaths};
use ferry_session::{Connected, Meeting, PathKind, Rendezvous};
use ferry_transfer::{Offer, Output, ReceiveOptions, SendOptions, TransferError};
use serde_json::json;

use crate::failure::{self, GoneAtQuestion, InterruptedAtQuestion, Usage};
use crate::hint::{listen_hint, OtherSide};
use crate::interrupt;
use crate::paired;
use crate::prompt;
use crate::reach_args::{
    peer_options, CommonArgs, LanesArg, ListenArg, PeerArg, RelayArgs, WaitArg,
};
use crate::spool;
use crate::ui::{
    count, dirs_and_symlinks, escape, human_bytes, qr_code, show_offer, show_text, stderr_line,
    stderr_text, Ui,
};
use ferry_channel::blocking::SecureReader;
use ferry_channel::lanes::{LaneKeys, LANE_HEADER, MAX_LANES};
use ferry_session::congestion::{DataStream, Policy};
use ferry_session::lanes::{dial_lanes, lane_count, tune_lane, tune_sender};
use ferry_transfer::lanes::{LaneSink, LaneSource};
use ferry_transfer::secure::{ChannelSink, ChannelSource};
use ferry_transfer::{PacketSink, PacketSource};
use std::net::TcpStream;

/// Arguments of `ferry send`.
#[derive(Args, Debug)]
#[command(mut_arg("relay", |a| a.help(
    "Relay to meet the receiver through when no direct path works (also FERRY_RELAY, config `relay`)"
)))]
pub struct SendArgs {
    /// Files and directories to send (directories recursively); `-` alone sends standard input as
    /// one file (named by --name).
    #[arg(required_unless_present = "text")]
    paths: Vec<PathBuf>,
    /// Send a text message instead of files (`-`: read it from standard input); the receiver
    /// prints it. At most 1 MiB.
    #[arg(long, value_name = "TEXT", conflicts_with = "paths")]
    text: Option<String>,
    /// The name standard input arrives under with `ferry send -` (default: stdin).
    #[arg(long, value_name = "NAME")]
    name: Option<OsString>,
    /// Use this code instead of a generated one (form: NUMBER-word-word-word).
    #[arg(long)]
    code: Option<String>,
    /// Send to the paired peer NAME (see `ferry peers`), which runs `ferry receive --from`: no code.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["code", "qr"])]
    to: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    listen: ListenArg,
    #[command(flatten)]
    relay: RelayArgs,
    #[command(flatten)]
    lanes: LanesArg,
    /// Also show the receiver's command as a QR code (on stderr).
    #[arg(long)]
    qr: bool,
}

/// Arguments of `ferry receive`.
#[derive(Args, Debug)]
#[command(mut_arg("relay", |a| a.help(
    "Relay to meet the sender through when no direct path works (also FERRY_RELAY, config `relay`)"
)))]
pub struct ReceiveArgs {
    /// The code the sender printed; without it, asked for at the terminal (Tab completes the words).
    code: Option<String>,
    /// Receive from the paired peer NAME (see `ferry peers`), which runs `ferry send --to`: no code.
    #[arg(long, value_name = "NAME", conflicts_with = "code")]
    from: Option<String>,
    /// Directory to receive into.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Accept the offer without asking.
    #[arg(long, short = 'y')]
    yes: bool,
    /// Replace files that already exist (never without this flag); implies --merge.
    #[arg(long)]
    overwrite: bool,
    /// Receive into offered directories that already exist in --out, adding what is new
    /// (without it, an offered name that exists is a conflict).
    #[arg(long)]
    merge: bool,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    peer: PeerArg,
    #[command(flatten)]
    relay: RelayArgs,
    /// Receive the offer's one item (a file, a directory or a text message) under NAME in --out;
    /// an offer of more than one item is refused. `-`: write the one file to standard output (not
    /// a terminal, not with --json; no resume).
    #[arg(long, short = 'o', value_name = "NAME")]
    output: Option<OsString>,
    /// Refuse offers whose file list needs more memory than SIZE before it is accepted (each entry
    /// counts 155 bytes plus its name and link target; suffixes K, M, G, KiB, MiB, GiB).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    max_manifest: u64,
    #[command(flatten)]
    wait: WaitArg,
    #[command(flatten)]
    lanes: LanesArg,
    /// Show every name in the offer, with file sizes, before the question (`--json`: the offer's
    /// `entries`).
    #[arg(long)]
    list: bool,
    /// Accept an offer even when its data does not fit in the free space of --out's file system
    /// (without it, such an offer is refused before any data moves, with `disk-full`).
    #[arg(long)]
    no_space_check: bool,
}

impl SendArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }

    /// Rejects a bad command line before anything else happens: the paths (see
    /// [`check_send_paths`]), standard input and text (see [`spool::check_args`]).
    pub fn check(&self) -> anyhow::Result<()> {
        spool::check_args(&self.paths, self.text.as_deref(), self.name.as_deref())?;
        if spool::is_stdin(&self.paths) {
            return Ok(());
        }
        check_send_paths(&self.paths)
    }
}

impl ReceiveArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// The looking side: finds the peer waiting on `code` (see [`ferry_session::connect`]), the wait shown until
/// it ends.
pub(crate) fn look_for(
    code: &Code,
    opts: &ferry_session::PeerOptions,
    peer: &PeerArg,
    wait: &WaitArg,
    ui: &mut Ui,
) -> Result<Connected, ferry_session::SessionError> {
    let connected = ferry_session::connect(&Meeting::code(code), opts, peer.peer, wait.wait, ui);
    ui.waited();
    connected
}

/// Reports how the peer was reached.
pub(crate) fn report_path(ui: &Ui, c: &Connected) {
    let how = match c.path {
        PathKind::Relay => format!("through the relay {}", c.peer),
        PathKind::SameHost => format!("directly on this host ({})", c.peer),
        PathKind::Lan => format!("directly on the LAN ({})", c.peer),
        PathKind::Direct => format!("directly ({})", c.peer),
    };
    if ui.show_path {
        ui.info(&format!("Connected {how}, {}", c.established.suite.name()));
    }
    ui.event(
        "connected",
        json!({ "path": c.path.as_str(), "peer": c.peer, "suite": c.established.suite.name() }),
    );
}

/// Reports that a session that met at the relay moved to a direct connection.
fn report_upgrade(ui: &Ui, peer: &str) {
    ui.info(&format!(
        "Moved from the relay to a direct connection ({peer})"
    ));
    ui.event(
        "connected",
        json!({ "path": PathKind::Direct.as_str(), "peer": peer, "upgraded_from": PathKind::Relay.as_str() }),
    );
}

/// Runs `ferry send`.
pub fn send(args: SendArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let opts = peer_options(&args.common, &args.relay)?;
    // A paired peer is met by identity under the pair's hash, a stranger by a code.
    let (meeting, code, paired) = match &args.to {
        Some(name) => {
            let me = paired::Me::load()?;
            let peer = me.peer(name)?;
            (
                me.waiting_for(&peer, paired::TRANSFER),
                None,
                Some((me, peer)),
            )
        }
        None => {
            let code = match &args.code {
                Some(c) => c.parse::<Code>()?,
                None => {
                    let registry = LocalRegistry::open_default()?;
                    Code::generate(|h| !registry.is_taken(h))
                }
            };
            (Meeting::code(&code), Some(code), None)
        }
    };
    // Be findable first: the receiver connects while the tree is walked (the handshake waits for it).
    let mut rendezvous = Rendezvous::start(meeting, &opts, args.listen.listen, ui)?;
    let spooled = match &args.text {
        Some(text) => Some(spool::text(text, args.common.json)?),
        None if spool::is_stdin(&args.paths) => {
            Some(spool::stdin(args.name.as_deref(), args.common.json)?)
        }
        None => None,
    };
    let walked_paths;
    let walked = match &spooled {
        Some(s) => &s.walked,
        None => {
            walked_paths = ferry_transfer::walk(&args.paths)?;
            &walked_paths
        }
    };

    let totals = walked.manifest.totals();
    let listen = rendezvous.listen.map(|a| a.to_string());
    match (&code, &paired) {
        (Some(code), _) => ui.event(
            "code",
            json!({ "code": code.to_string(), "listen": listen, "relay": opts.relay }),
        ),
        (None, Some((_, peer))) => ui.event(
            "waiting",
            json!({ "peer": peer.name.as_str(), "listen": listen, "relay": opts.relay }),
        ),
        (None, None) => {}
    }
    for w in &walked.warnings {
        ui.warn(&w.to_string());
    }
    ui.skipped_before = walked.warnings.len() as u64;
    let what = if args.text.is_some() {
        format!("a text message ({})", human_bytes(totals.bytes))
    } else {
        format!(
            "{}, {} ({})",
            count(totals.files, "file", "files"),
            human_bytes(totals.bytes),
            dirs_and_symlinks(&totals),
        )
    };
    let reachable = rendezvous.direct_candidates();
    let other_side = OtherSide::of(
        &opts,
        rendezvous.listen,
        args.listen.listen.is_some(),
        &reachable,
    );
    let flags = &other_side.flags;
    if let Some(code) = &code {
        let command = format!("ferry receive {flags}{code}");
        ui.info(&format!(
            "Sending {what}.\nCode: {code}\n{}",
            other_side.lines("the other side", &command, "ferry send")
        ));
        if args.qr {
            // Asked for: shown also with --json (on stderr, which carries no events).
            stderr_text(&qr_code(&command));
        }
        if let (Some(addr), Some(_)) = (rendezvous.listen, args.listen.listen) {
            ui.info(&listen_hint(
                addr,
                &reachable,
                &format!("ferry receive {code}"),
            ));
        }
    }
    if let Some((_, peer)) = &paired {
        let name = escape(peer.name.as_str());
        let command = format!("ferry receive {flags}--from NAME (NAME: this machine's name there)");
        ui.info(&format!(
            "Sending {what} to {name}.\n{}",
            other_side.lines(&name, &command, "ferry send --to")
        ));
    }

    let connected = rendezvous.accept(ui)?;
    if spooled.is_none() {
        // Standard input and a text message are not resumed: sent again, they are another offer.
        interrupt::leaves(
            "; the receiver keeps what arrived: send the same paths again (and receive them) to resume",
        );
    }
    report_path(ui, &connected);
    if let Some((me, peer)) = &paired {
        if let Err(w) = me.seen(&peer.key, &connected.peer) {
            ui.warn(&w);
        }
    }
    let session_max = connected.established.sealer.max_payload();
    let relayed = connected.path == PathKind::Relay;
    // Lanes need the session's own connection and listener: over the relay (moved to a direct path or
    // not) the data takes one connection.
    let lanes = match (relayed, args.lanes.lanes) {
        (true, _) => 1,
        (false, Some(n)) => n as usize,
        (false, None) => connected
            .handshake
            .map_or(1, |h| lane_count(h, totals.bytes)),
    };
    let lane_keys = connected.established.lane_keys(session_max);
    tune_sender(&connected.stream);
    if lanes > 1 {
        tune_lane(&connected.stream);
    }
    let mut halves = split_tcp(connected.stream, connected.established)?;
    let mut path = connected.path;
    if relayed {
        let (h, direct) = upgrade::sender(halves, &mut rendezvous, ui)?;
        halves = h;
        if direct {
            path = PathKind::Direct;
            report_upgrade(ui, &halves.0.get_ref().peer_addr()?.to_string());
        }
    }
    let (reader, writer) = halves;
    // The data's congestion control: BBR, CUBIC once the path overflowed only its own buffer, BBR for
    // good at a loss of the path's; the system's choice through a relay.
    let policy = Policy::for_path(path);
    let mut writer = writer.map_inner(|s| DataStream::new(s, &policy));
    // The receiver learns the lane count first, before anything of the engine's.
    writer.send(&ferry_channel::lanes::announcement(lanes))?;
    let mut sending = match lanes {
        1 => Sending::One(Box::new(ChannelSink(writer))),
        _ => {
            ui.info(&format!("Sending on up to {lanes} connections (lanes)"));
            Sending::Lanes(LaneSink::new(
                writer,
                rendezvous.accept_lanes(lane_keys, lanes, &policy),
            ))
        }
    };
    let mut source = ChannelSource(reader);
    let max_packet = sending.max_packet(session_max);
    let report = ferry_transfer::send(
        &mut sending.sink(),
        &mut source,
        &walked.manifest,
        &SendOptions {
            max_packet,
            text: args.text.is_some(),
        },
        ui,
    )
    .map_err(|e| {
        peer_gone_says(
            e.into(),
            "the receiver is gone (it stopped, or the connection broke); it keeps what arrived: \
             send the same paths again (and receive them) to resume",
        )
    })?;
    // The receiver confirmed every file (Done) before this: it may close its ends first, and a lane's
    // closing packets then meet a reset; that fails nothing that was sent.
    let started = sending.lanes();
    let used = sending.close().unwrap_or(started);
    if used > 1 {
        ui.info(&format!("Sent on {used} connections (lanes)"));
        ui.event("lanes", json!({ "lanes": used }));
    }
    partial(walked.warnings.len() as u64 + report.skipped)
}

/// The sending half of the data: the session's connection, or lanes.
enum Sending {
    One(Box<ChannelSink<DataStream>>),
    Lanes(LaneSink<DataStream>),
}

impl Sending {
    fn sink(&mut self) -> &mut dyn PacketSink {
        match self {
            Sending::One(s) => s.as_mut(),
            Sending::Lanes(s) => s,
        }
    }

    /// The engine's packet size: the session's, less the lane header on lanes.
    fn max_packet(&self, session_max: usize) -> usize {
        let max = match self {
            Sending::One(_) => session_max,
            Sending::Lanes(_) => session_max - LANE_HEADER,
        };
        max.min(ferry_transfer::MAX_PACKET)
    }

    /// The connections carrying the data now.
    fn lanes(&self) -> usize {
        match self {
            Sending::One(_) => 1,
            Sending::Lanes(s) => s.lanes(),
        }
    }

    /// Closes the data's connections: how many carried it.
    fn close(self) -> anyhow::Result<usize> {
        Ok(match self {
            Sending::One(s) => {
                s.0.close()?;
                1
            }
            Sending::Lanes(s) => s.close()?,
        })
    }
}

/// The receiving half of the data: the session's connection, or lanes.
enum Receiving {
    One(Box<ChannelSource>),
    Lanes(LaneSource),
}

impl Receiving {
    fn source(&mut self) -> &mut dyn PacketSource {
        match self {
            Receiving::One(s) => s.as_mut(),
            Receiving::Lanes(s) => s,
        }
    }
}

/// The lane count the sender announced.
fn read_lanes_announcement(reader: &mut SecureReader<TcpStream>) -> anyhow::Result<usize> {
    match reader.recv()?.as_deref() {
        Some(packet) => ferry_channel::lanes::read_announcement(packet).ok_or_else(|| {
            ferry_channel::ChannelError::AuthProtocol(
                "the sender's first packet is not a lane count",
            )
            .into()
        }),
        None => Err(ferry_channel::ChannelError::Truncated.into()),
    }
}

/// Reads the data on the session's connection (`lane0`) and on `lanes - 1` more, dialled to `addr` in the
/// background: a lane that cannot be dialled is given up, the others carry the data.
fn receive_on_lanes(
    lane0: SecureReader<TcpStream>,
    addr: SocketAddr,
    keys: LaneKeys,
    lanes: usize,
) -> LaneSource {
    let source = LaneSource::new(lane0);
    let joiner = source.joiner();
    for _ in 1..lanes {
        joiner.expect();
    }
    let dialled = dial_lanes(addr, keys, lanes);
    std::thread::spawn(move || {
        for lane in dialled {
            match lane {
                Ok(reader) => joiner.join(reader),
                Err(_) => joiner.gave_up(),
            }
        }
    });
    source
}

/// Runs `ferry receive`.
pub fn receive(args: ReceiveArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let opts = peer_options(&args.common, &args.relay)?;
    match std::fs::metadata(&args.out) {
        Ok(m) if !m.is_dir() => {
            return Err(Usage(format!(
                "--out {} is not a directory (give the directory to receive into)",
                args.out.display()
            ))
            .into())
        }
        _ => {}
    }
    let output = output(args.output.as_deref(), args.common.json)?;
    let connected = match &args.from {
        Some(name) => {
            let me = paired::Me::load()?;
            let peer = me.peer(name)?;
            let meeting = me.looking_for(&peer, paired::TRANSFER);
            let connected =
                ferry_session::connect(&meeting, &opts, args.peer.peer, args.wait.wait, ui);
            ui.waited();
            let connected = connected?;
            if let Err(w) = me.seen(&peer.key, &connected.peer) {
                ui.warn(&w);
            }
            connected
        }
        None => {
            let code: Code = match &args.code {
                Some(code) => code.parse()?,
                None if !ui.is_json() && std::io::stdin().is_terminal() => prompt::ask_code()?,
                None => {
                    return Err(Usage(
                        "give the code the sender printed: ferry receive CODE (it is asked for only at a terminal, without --json), or --from NAME for a paired peer"
                            .into(),
                    )
                    .into())
                }
            };
            look_for(&code, &opts, &args.peer, &args.wait, ui)?
        }
    };
    report_path(ui, &connected);
    let relayed = connected.path == PathKind::Relay;
    let session_max = connected.established.sealer.max_payload();
    let lane_keys = connected.established.lane_keys(session_max);
    let lane_addr = connected.stream.peer_addr()?;
    let mut halves = split_tcp(connected.stream, connected.established)?;
    if relayed {
        let (h, direct) = upgrade::receiver(halves, opts.force_relay, ui)?;
        halves = h;
        if let Some(addr) = direct {
            report_upgrade(ui, &addr.to_string());
        }
    }
    let (mut reader, writer) = halves;
    // Watched while the offer's question waits for a person, to notice a sender that went away meanwhile.
    let connection = reader.get_ref().try_clone()?;
    let announced = read_lanes_announcement(&mut reader)?;
    let mut receiving = match announced {
        1 => Receiving::One(Box::new(ChannelSource(reader))),
        _ => {
            let cap = args.lanes.lanes.map_or(MAX_LANES, usize::from);
            Receiving::Lanes(receive_on_lanes(
                reader,
                lane_addr,
                lane_keys,
                announced.min(cap),
            ))
        }
    };
    let mut sink = ChannelSink(writer);
    let mut ropts = ReceiveOptions::new(&args.out);
    ropts.overwrite = args.overwrite;
    ropts.merge = args.merge;
    ropts.max_manifest = args.max_manifest;
    ropts.space_check = !args.no_space_check;
    let stream = matches!(output, Output::Stream(_));
    let on_disk = !matches!(output, Output::Offered);
    ropts.output = output;
    let (yes, json, list) = (args.yes, ui.is_json(), args.list);
    let mut interrupted = false;
    let mut gone = false;
    let mut accepted = false;
    // A text message shown on stdout writes nothing to disk: it is accepted without a question.
    let mut accept = |offer: &Offer<'_>| {
        let yes = yes || offer.text && !on_disk;
        match accept_offer(offer, yes, json, list, &connection) {
            Answer::Yes => {
                accepted = true;
                if !stream && !offer.text {
                    // What goes to standard output, and a text message, are not kept for a resume.
                    interrupt::leaves(
                        "; what arrived is kept: receive again from a new send of the same paths to resume",
                    );
                }
                true
            }
            Answer::No => false,
            Answer::Interrupted => {
                interrupted = true;
                false
            }
            Answer::Gone => {
                gone = true;
                false
            }
        }
    };
    let received =
        ferry_transfer::receive(&mut receiving.source(), &mut sink, &ropts, &mut accept, ui);
    if interrupted {
        // The engine told the sender it was declined; nothing was written.
        return Err(InterruptedAtQuestion.into());
    }
    if gone {
        return Err(GoneAtQuestion.into());
    }
    let report = received.map_err(|e| match e {
        TransferError::Conflict { .. } => anyhow::Error::new(e).context(
            "not writing into what exists (--merge adds to existing directories, --overwrite replaces files)",
        ),
        TransferError::Integrity { .. } if stream && accepted => anyhow::Error::new(e)
            .context("what was written to standard output is not to be trusted"),
        _ if stream && accepted => {
            anyhow::Error::new(e).context("what was written to standard output is incomplete")
        }
        _ if accepted => peer_gone_says(
            e.into(),
            "the sender is gone (it stopped, or the connection broke); what arrived is kept: \
             receive again from a new send of the same paths to resume",
        ),
        _ => peer_gone_says(
            e.into(),
            "the sender is gone (it stopped, or the connection broke)",
        ),
    })?;
    sink.0.close()?;
    if let Some(text) = report.text {
        show_text(ui, &text);
    }
    partial(report.skipped)
}

/// `e` with `what` before it when it means the peer is gone (`peer-gone`): the cause alone ("Connection reset
/// by peer", "connection truncated") says what broke, not what happened nor what to do.
fn peer_gone_says(e: anyhow::Error, what: &'static str) -> anyhow::Error {
    match failure::classify(&e).code {
        "peer-gone" => e.context(what),
        _ => e,
    }
}

/// Success, or exit status 9 (`partial`) when `skipped` entries were not sent.
fn partial(skipped: u64) -> anyhow::Result<()> {
    if skipped > 0 {
        return Err(TransferError::Partial { skipped }.into());
    }
    Ok(())
}

/// Where `receive -o` puts the offer: `-` is standard output (refused with `--json`, whose events go
/// there, and on a terminal, where a peer's bytes could drive it), any other value one file name.
fn output(name: Option<&OsStr>, json: bool) -> anyhow::Result<Output> {
    let Some(name) = name else {
        return Ok(Output::Offered);
    };
    if name != "-" {
        spool::check_file_name("-o", name)?;
        return Ok(Output::Named(name.as_bytes().to_vec()));
    }
    if json {
        return Err(Usage(
            "-o - writes the data to standard output, where --json writes its events; give one of them"
                .into(),
        )
        .into());
    }
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        return Err(Usage(
            "-o - does not write a peer's bytes to a terminal; pipe or redirect standard output, or give -o NAME"
                .into(),
        )
        .into());
    }
    let fd = stdout.as_fd().try_clone_to_owned()?;
    Ok(Output::Stream(Arc::new(File::from(fd))))
}

/// The answer to the offer's question.
enum Answer {
    Yes,
    No,
    /// Ctrl-C (or SIGTERM, SIGHUP) at the question: declined, and the command ends as interrupted.
    Interrupted,
    /// The sender's connection closed while asking: the command ends as `peer-gone`.
    Gone,
}

/// Shows the offer and asks, unless `--yes`. A resumed offer asks like any other: the sender can
/// cut a transfer itself, so an earlier acceptance says nothing about this run. While a person
/// decides, `connection` (the sender's) is watched: a sender that went away ends the question.
fn accept_offer(
    offer: &Offer<'_>,
    yes: bool,
    json: bool,
    list: bool,
    connection: &TcpStream,
) -> Answer {
    let summary = show_offer(offer, json, list);
    if yes {
        if !json {
            stderr_line(&summary);
        }
        return Answer::Yes;
    }
    if json || !std::io::stdin().is_terminal() {
        stderr_line(&format!(
            "{summary}\nferry: not asking without a terminal; pass --yes to accept"
        ));
        return Answer::No;
    }
    // The line is read on its own thread so that Ctrl-C can answer instead (the handler cannot reach
    // the channel to tell the sender; this thread can, by declining).
    let (tx, rx) = mpsc::channel();
    interrupt::asking(tx.clone());
    stderr_text(&format!("{summary}\nAccept? [y/N] "));
    let asking = Arc::new(AtomicBool::new(true));
    if let Ok(connection) = connection.try_clone() {
        let (tx, asking) = (tx.clone(), Arc::clone(&asking));
        std::thread::spawn(move || {
            while asking.load(Ordering::Relaxed) {
                if hung_up(&connection, Duration::from_millis(200)) {
                    let _ = tx.send(interrupt::Answer::PeerGone);
                    return;
                }
            }
        });
    }
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = std::io::stdin().lock().read_line(&mut line);
        let _ = tx.send(interrupt::Answer::Line(match read {
            Ok(n) if n > 0 => Some(line),
            _ => None,
        }));
    });
    let answer = rx.recv();
    asking.store(false, Ordering::Relaxed);
    interrupt::question_answered();
    match answer {
        Ok(interrupt::Answer::Line(Some(line))) => {
            if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
                // The watch may not have run since the sender left: a yes nobody hears is no transfer.
                if hung_up(connection, Duration::ZERO) {
                    return Answer::Gone;
                }
                Answer::Yes
            } else {
                Answer::No
            }
        }
        Ok(interrupt::Answer::Line(None)) => {
            // End of input (Ctrl-D) left the cursor after the question.
            stderr_line("");
            Answer::No
        }
        Ok(interrupt::Answer::PeerGone) => {
            // The cursor is still after the question.
            stderr_line("");
            Answer::Gone
        }
        Ok(interrupt::Answer::Interrupted) | Err(_) => {
            // The terminal echoed `^C` after the question: the error goes on a line of its own.
            stderr_line("");
            Answer::Interrupted
        }
    }
}

/// Whether the peer closed `connection` (or it broke), waiting at most `timeout`: its data may still be unread
/// (the sender sends the first data with the offer), so only the hang-up counts, not readability.
fn hung_up(connection: &TcpStream, timeout: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: connection.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: poll(2) on one pollfd that lives for the call, naming a socket `connection` keeps open.
    let ready = unsafe { libc::poll(&mut fd, 1, millis) };
    ready > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Rejects wrong uses before anything else happens, with a clear message: a path that is not there
/// (`io`); a fifo, socket or device, which would never end or mean nothing elsewhere, and two paths
/// with the same name, which would arrive at the same place (both a bad command line).
pub fn check_send_paths(paths: &[PathBuf]) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let mut names: HashMap<&OsStr, &Path> = HashMap::new();
    for p in paths {
        if let Err(e) = std::fs::symlink_metadata(p) {
            return Err(anyhow::Error::new(e).context(format!("cannot send {}", p.display())));
        }
        // A symlink named on the command line is followed, as the walk does.
        if let Ok(ft) = std::fs::metadata(p).map(|m| m.file_type()) {
            let kind = if ft.is_fifo() {
                Some("a FIFO")
            } else if ft.is_socket() {
                Some("a socket")
            } else if ft.is_block_device() || ft.is_char_device() {
                Some("a device")
            } else {
                None
            };
            if let Some(kind) = kind {
                return Err(Usage(format!(
                    "{} is {kind}; ferry sends regular files, directories and symlinks",
                    p.display()
                ))
                .into());
            }
        }
        if let Some(name) = p.file_name() {
            if let Some(first) = names.insert(name, p) {
                return Err(Usage(format!(
                    "{} and {} have the same name and would arrive at the same place; send one of them from another command, or rename it",
                    first.display(),
                    p.display()
                ))
                .into());
            }
        }
    }
    Ok(())
}

/// Parses a size such as `65536`, `64M` or `64MiB` (powers of 1024 either way).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        _ => return Err(format!("unknown unit {unit:?} (use K, M or G)")),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 64MiB)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses a duration such as `30s`, `5m`, `1h`, `250ms` or plain seconds (`90`, `0`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30s, 5m, 1h)"))?;
    let unit_secs = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => return Ok(Duration::from_millis(n)),
        "" | "s" | "sec" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        _ => return Err(format!("unknown unit {unit:?} (use s, m or h)")),
    };
    n.checked_mul(unit_secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, parse_size};
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("99999999999999999h").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1 K"), Ok(1024));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }
}
