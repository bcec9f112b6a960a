//! `ferry send` and `ferry receive`: find the peer, open the secure channel, run the transfer engine.

use std::io::{BufRead, IsTerminal, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use ferry_channel::blocking::{self, split_tcp};
use ferry_channel::{Auth, ChannelError, Config, Handshake, Role};
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::{Code, NameplateHash};
use ferry_transfer::{Offer, ReceiveOptions, SendOptions};
use serde_json::json;

use crate::channel_io::{ChannelSink, ChannelSource};
use crate::failure::PeerNotFound;
use crate::ui::{human_bytes, Ui};

/// How long a handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a receiver looks for its sender on this host.
const FIND_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `ferry send`.
#[derive(Args, Debug)]
pub struct SendArgs {
    /// Files and directories to send (directories recursively).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Use this code instead of a generated one (form: NUMBER-word-word-word).
    #[arg(long)]
    code: Option<String>,
    /// Turn multicast discovery off (also FERRY_NO_DISCOVERY=1).
    #[arg(long, env = "FERRY_NO_DISCOVERY", value_parser = clap::builder::FalseyValueParser::new())]
    no_discovery: bool,
    /// One JSON event per line on stdout instead of text and a progress bar.
    #[arg(long)]
    json: bool,
    /// Address to listen on for the receiver (default: loopback, any free port).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
}

/// Arguments of `ferry receive`.
#[derive(Args, Debug)]
pub struct ReceiveArgs {
    /// The code the sender printed.
    code: String,
    /// Directory to receive into.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Accept the offer without asking.
    #[arg(long, short = 'y')]
    yes: bool,
    /// Replace files that already exist (never without this flag).
    #[arg(long)]
    overwrite: bool,
    /// Turn multicast discovery off (also FERRY_NO_DISCOVERY=1).
    #[arg(long, env = "FERRY_NO_DISCOVERY", value_parser = clap::builder::FalseyValueParser::new())]
    no_discovery: bool,
    /// One JSON event per line on stdout instead of text and a progress bar.
    #[arg(long)]
    json: bool,
    /// Connect straight to the sender at this address (printed by `ferry send --listen`).
    #[arg(long, value_name = "ADDR")]
    peer: Option<SocketAddr>,
}

impl SendArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.json
    }

    /// The paths to send.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
}

impl ReceiveArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.json
    }
}

fn registry() -> anyhow::Result<LocalRegistry> {
    LocalRegistry::open_default().context("cannot open the same-host rendezvous directory")
}

/// Runs `ferry send`.
pub fn send(args: SendArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let walked = ferry_transfer::walk(&args.paths)?;
    let registry = registry()?;
    let code = match &args.code {
        Some(c) => c.parse::<Code>()?,
        None => Code::generate(|n| !registry.is_taken(&NameplateHash::of(n))),
    };
    let listener = TcpListener::bind(
        args.listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
    )
    .context("cannot listen for the receiver")?;
    let addr = listener.local_addr()?;
    let _announcement = registry
        .announce(&code.nameplate_hash(), addr)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::anyhow!(
                "nameplate {} is in use by another ferry send on this host; choose another code",
                code.nameplate()
            )
            } else {
                anyhow::Error::new(e).context("cannot announce on this host")
            }
        })?;

    let totals = walked.manifest.totals();
    ui.event(
        "code",
        json!({ "code": code.to_string(), "listen": addr.to_string() }),
    );
    for w in &walked.warnings {
        ui.warn(&w.to_string());
    }
    ui.info(&format!(
        "Sending {} files, {} ({} directories).\nCode: {code}\nOn the other side run:  ferry receive {code}",
        totals.files,
        human_bytes(totals.bytes),
        totals.dirs,
    ));
    if args.listen.is_some() {
        ui.info(&format!(
            "Listening on {addr} (receiver: ferry receive --peer ADDR {code})"
        ));
    }
    let _ = args.no_discovery; // Multicast discovery is not used by this build; nothing to turn off.

    let (stream, est) = accept_peer(&listener, &code, ui)?;
    ui.info(&format!(
        "Connected to {} (direct, {})",
        stream.peer_addr()?,
        est.suite.name()
    ));
    ui.event("connected", json!({ "path": "direct", "peer": stream.peer_addr()?.to_string(), "suite": est.suite.name() }));
    let max_packet = est.sealer.max_payload().min(ferry_transfer::MAX_PACKET);
    let (reader, writer) = split_tcp(stream, est)?;
    let (mut sink, mut source) = (ChannelSink(writer), ChannelSource(reader));
    ferry_transfer::send(
        &mut sink,
        &mut source,
        &walked.manifest,
        &SendOptions { max_packet },
        ui,
    )?;
    sink.0.close()?;
    Ok(())
}

/// Waits for the receiver: the first connection that completes the PAKE. A wrong code ends the send (one
/// guess per code); connections that do not speak ferry are dropped and waiting goes on.
fn accept_peer(
    listener: &TcpListener,
    code: &Code,
    ui: &Ui,
) -> anyhow::Result<(TcpStream, ferry_channel::Established)> {
    loop {
        let (mut stream, peer) = listener.accept()?;
        stream.set_nodelay(true).ok();
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let hs = Handshake::new(
            Role::Responder,
            Config::ferry(),
            Auth::Code(code.password()),
        );
        match blocking::handshake(&mut stream, hs) {
            Ok(est) => {
                stream.set_read_timeout(None)?;
                return Ok((stream, est));
            }
            Err(ChannelError::WrongCode) => return Err(ChannelError::WrongCode.into()),
            Err(e) => ui.warn(&format!("dropped a connection from {peer}: {e}")),
        }
    }
}

/// Finds the sender of `code` on this host, waiting a little for it to appear.
fn find_sender(code: &Code) -> anyhow::Result<SocketAddr> {
    let registry = registry()?;
    let hash = code.nameplate_hash();
    let deadline = Instant::now() + FIND_TIMEOUT;
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(addr) = registry.lookup(&hash)? {
            return Ok(addr);
        }
        if Instant::now() >= deadline {
            return Err(PeerNotFound(format!(
                "no sender for nameplate {} found on this host (is `ferry send` running? give --peer ADDR for another machine)",
                code.nameplate()
            ))
            .into());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Runs `ferry receive`.
pub fn receive(args: ReceiveArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let code: Code = args.code.parse()?;
    let _ = args.no_discovery; // Multicast discovery is not used by this build; nothing to turn off.
    let addr = match args.peer {
        Some(a) => a,
        None => find_sender(&code)?,
    };
    let mut stream = TcpStream::connect(addr)
        .map_err(|e| PeerNotFound(format!("cannot reach the sender at {addr}: {e}")))?;
    stream.set_nodelay(true).ok();
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let hs = Handshake::new(
        Role::Initiator,
        Config::ferry(),
        Auth::Code(code.password()),
    );
    let est = blocking::handshake(&mut stream, hs)?;
    stream.set_read_timeout(None)?;
    ui.info(&format!(
        "Connected to {addr} (direct, {})",
        est.suite.name()
    ));
    ui.event(
        "connected",
        json!({ "path": "direct", "peer": addr.to_string(), "suite": est.suite.name() }),
    );

    let (reader, writer) = split_tcp(stream, est)?;
    let (mut sink, mut source) = (ChannelSink(writer), ChannelSource(reader));
    let mut opts = ReceiveOptions::new(&args.out);
    opts.overwrite = args.overwrite;
    let (yes, json) = (args.yes, ui.is_json());
    let mut accept = |offer: &Offer<'_>| accept_offer(offer, yes, json);
    ferry_transfer::receive(&mut source, &mut sink, &opts, &mut accept, ui)?;
    sink.0.close()?;
    Ok(())
}

/// Shows the offer and asks, unless `--yes`.
fn accept_offer(offer: &Offer<'_>, yes: bool, json: bool) -> bool {
    let t = offer.totals;
    let resumable = if offer.resumable_bytes > 0 {
        format!(
            ", {} already here from an earlier run",
            human_bytes(offer.resumable_bytes)
        )
    } else {
        String::new()
    };
    let summary = format!(
        "Offer: {} files, {} directories, {}{resumable}",
        t.files,
        t.dirs,
        human_bytes(t.bytes)
    );
    if yes || offer.resumable_bytes > 0 {
        // A resume of an offer the user already accepted asks no question.
        if !json {
            eprintln!("{summary}");
        }
        return true;
    }
    if json || !std::io::stdin().is_terminal() {
        eprintln!("{summary}\nferry: not asking without a terminal; pass --yes to accept");
        return false;
    }
    eprint!("{summary}\nAccept? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// Rejects obviously wrong uses early, with a clear message.
pub fn check_send_paths(paths: &[PathBuf]) -> anyhow::Result<()> {
    for p in paths {
        if std::fs::symlink_metadata(p).is_err() {
            bail!("{}: no such file or directory", p.display());
        }
    }
    Ok(())
}
