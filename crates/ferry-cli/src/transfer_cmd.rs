//! `ferry send` and `ferry receive`: find the peer, open the secure channel, run the transfer engine.

use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use ferry_channel::blocking::split_tcp;
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::Code;
use ferry_transfer::{Offer, ReceiveOptions, SendOptions, TransferError};
use serde_json::json;

use crate::peer::{receiver_connect, Connected, PeerOptions, SenderRendezvous};
use crate::settings::Settings;
use crate::ui::{count, human_bytes, show_offer, Ui};
use crate::upgrade;
use ferry_transfer::secure::{ChannelSink, ChannelSource};

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
    /// Address to listen on for the receiver; any connection that reaches it may try the code. Default: a free
    /// port on loopback with --no-discovery; with discovery, on every interface, taking connections only from
    /// this host and from directly attached networks (where mDNS reaches).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Relay to meet the receiver through when no direct path works (also FERRY_RELAY, config `relay`).
    #[arg(long, env = "FERRY_RELAY", value_name = "HOST:PORT")]
    relay: Option<String>,
    /// Use only the relay, no direct paths.
    #[arg(long)]
    force_relay: bool,
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
    /// Replace files that already exist (never without this flag); implies --merge.
    #[arg(long)]
    overwrite: bool,
    /// Receive into offered directories that already exist in --out, adding what is new
    /// (without it, an offered name that exists is a conflict).
    #[arg(long)]
    merge: bool,
    /// Turn multicast discovery off (also FERRY_NO_DISCOVERY=1).
    #[arg(long, env = "FERRY_NO_DISCOVERY", value_parser = clap::builder::FalseyValueParser::new())]
    no_discovery: bool,
    /// One JSON event per line on stdout instead of text and a progress bar.
    #[arg(long)]
    json: bool,
    /// Connect straight to the sender at this address (printed by `ferry send --listen`).
    #[arg(long, value_name = "ADDR")]
    peer: Option<SocketAddr>,
    /// Relay to meet the sender through when no direct path works (also FERRY_RELAY, config `relay`).
    #[arg(long, env = "FERRY_RELAY", value_name = "HOST:PORT")]
    relay: Option<String>,
    /// Use only the relay, no direct paths.
    #[arg(long)]
    force_relay: bool,
    /// Refuse offers whose file list needs more memory than SIZE before it is accepted (each entry
    /// counts 155 bytes plus its name and link target; suffixes K, M, G, KiB, MiB, GiB).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    max_manifest: u64,
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

fn peer_options(
    relay: Option<String>,
    force_relay: bool,
    no_discovery: bool,
) -> anyhow::Result<PeerOptions> {
    let settings = Settings::load()?;
    Ok(PeerOptions {
        relay: relay.filter(|r| !r.is_empty()).or(settings.relay),
        force_relay,
        no_discovery: no_discovery || settings.no_discovery.unwrap_or(false),
    })
}

/// Reports how the peer was reached.
fn report_path(ui: &Ui, c: &Connected) {
    let how = match c.path {
        "relay" => format!("through the relay {}", c.peer),
        "same-host" => format!("directly on this host ({})", c.peer),
        "lan" => format!("directly on the LAN ({})", c.peer),
        _ => format!("directly ({})", c.peer),
    };
    ui.info(&format!("Connected {how}, {}", c.established.suite.name()));
    ui.event(
        "connected",
        json!({ "path": c.path, "peer": c.peer, "suite": c.established.suite.name() }),
    );
}

/// Reports that a session that met at the relay moved to a direct connection.
fn report_upgrade(ui: &Ui, peer: &str) {
    ui.info(&format!(
        "Moved from the relay to a direct connection ({peer})"
    ));
    ui.event(
        "connected",
        json!({ "path": "direct", "peer": peer, "upgraded_from": "relay" }),
    );
}

/// Runs `ferry send`.
pub fn send(args: SendArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let opts = peer_options(args.relay.clone(), args.force_relay, args.no_discovery)?;
    let code = match &args.code {
        Some(c) => c.parse::<Code>()?,
        None => {
            let registry = LocalRegistry::open_default()?;
            Code::generate(|h| !registry.is_taken(h))
        }
    };
    // Be findable first: the receiver connects while the tree is walked (the handshake waits for it).
    let mut rendezvous = SenderRendezvous::start(&code, &opts, args.listen)?;
    let walked = ferry_transfer::walk(&args.paths)?;

    let totals = walked.manifest.totals();
    ui.event(
        "code",
        json!({ "code": code.to_string(), "listen": rendezvous.listen.map(|a| a.to_string()), "relay": opts.relay }),
    );
    for w in &walked.warnings {
        ui.warn(&w.to_string());
    }
    ui.info(&format!(
        "Sending {}, {} ({}).\nCode: {code}\nOn the other side run:  ferry receive {code}",
        count(totals.files, "file", "files"),
        human_bytes(totals.bytes),
        count(totals.dirs, "directory", "directories"),
    ));
    if let (Some(addr), Some(_)) = (rendezvous.listen, args.listen) {
        ui.info(&format!(
            "Listening on {addr} (from another machine: ferry receive --peer {addr} {code})"
        ));
    }

    let connected = rendezvous.accept(&code, ui)?;
    report_path(ui, &connected);
    let max_packet = connected
        .established
        .sealer
        .max_payload()
        .min(ferry_transfer::MAX_PACKET);
    let relayed = connected.path == "relay";
    let mut halves = split_tcp(connected.stream, connected.established)?;
    if relayed {
        let (h, direct) = upgrade::sender(halves, &mut rendezvous, ui)?;
        halves = h;
        if direct {
            report_upgrade(ui, &halves.0.get_ref().peer_addr()?.to_string());
        }
    }
    let (reader, writer) = halves;
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

/// Runs `ferry receive`.
pub fn receive(args: ReceiveArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let code: Code = args.code.parse()?;
    let opts = peer_options(args.relay.clone(), args.force_relay, args.no_discovery)?;
    let connected = receiver_connect(&code, &opts, args.peer, ui)?;
    report_path(ui, &connected);
    let relayed = connected.path == "relay";
    let mut halves = split_tcp(connected.stream, connected.established)?;
    if relayed {
        let (h, direct) = upgrade::receiver(halves, opts.force_relay, ui)?;
        halves = h;
        if let Some(addr) = direct {
            report_upgrade(ui, &addr.to_string());
        }
    }
    let (reader, writer) = halves;
    let (mut sink, mut source) = (ChannelSink(writer), ChannelSource(reader));
    let mut ropts = ReceiveOptions::new(&args.out);
    ropts.overwrite = args.overwrite;
    ropts.merge = args.merge;
    ropts.max_manifest = args.max_manifest;
    let (yes, json) = (args.yes, ui.is_json());
    let mut accept = |offer: &Offer<'_>| accept_offer(offer, yes, json);
    ferry_transfer::receive(&mut source, &mut sink, &ropts, &mut accept, ui).map_err(|e| {
        if let TransferError::Conflict { .. } = e {
            anyhow::Error::new(e).context(
                "not writing into what exists (--merge adds to existing directories, --overwrite replaces files)",
            )
        } else {
            e.into()
        }
    })?;
    sink.0.close()?;
    Ok(())
}

/// Shows the offer and asks, unless `--yes`. A resumed offer asks like any other: the sender can
/// cut a transfer itself, so an earlier acceptance says nothing about this run.
fn accept_offer(offer: &Offer<'_>, yes: bool, json: bool) -> bool {
    let summary = show_offer(offer, json);
    if yes {
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

/// Parses a size such as `65536`, `64M` or `64MiB` (powers of 1024 either way).
fn parse_size(s: &str) -> Result<u64, String> {
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

#[cfg(test)]
mod tests {
    use super::parse_size;

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
