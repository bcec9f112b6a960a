//! The command-line options of every command that reaches a peer (`send`, `receive`, `pair`, `share`, `ls`,
//! `pull`), as structs each command flattens in (`#[command(flatten)]`). A command whose help
//! says it differently overrides the text with `#[command(mut_arg(...))]`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use ferry_session::PeerOptions;

use crate::failure::Usage;
use crate::settings::Settings;

/// `--no-discovery` and `--json`.
#[derive(Args, Debug)]
pub struct CommonArgs {
    /// Turn multicast discovery off (also FERRY_NO_DISCOVERY=1).
    #[arg(long, env = "FERRY_NO_DISCOVERY", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_discovery: bool,
    /// One JSON event per line on stdout instead of text and a progress bar.
    #[arg(long)]
    pub json: bool,
}

/// `--listen`, for the side that waits.
#[derive(Args, Debug)]
pub struct ListenArg {
    /// Address to listen on for the receiver; any connection that reaches it may try the code. Default: a free
    /// port on loopback with --no-discovery; with discovery, on every interface, taking connections only from
    /// this host and from directly attached networks (where mDNS reaches).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

/// `--peer`, for the side that looks.
#[derive(Args, Debug)]
pub struct PeerArg {
    /// Connect straight to the sender at this address (printed by `ferry send --listen`).
    #[arg(long, value_name = "ADDR")]
    pub peer: Option<SocketAddr>,
}

/// `--relay` and `--force-relay`.
#[derive(Args, Debug)]
pub struct RelayArgs {
    /// Relay to meet through when no direct path works (also FERRY_RELAY, config `relay`).
    #[arg(long, env = "FERRY_RELAY", value_name = "HOST:PORT")]
    pub relay: Option<String>,
    /// Use only the relay, no direct paths.
    #[arg(long)]
    pub force_relay: bool,
}

/// `--wait`, for the side that looks.
#[derive(Args, Debug)]
pub struct WaitArg {
    /// How long to look for a sender that is not there yet, trying every path again and again
    /// (30s, 5m, 1h, or seconds; 0 tries once).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::transfer_cmd::parse_duration)]
    pub wait: Duration,
}

/// `--lanes`, for `send` and `receive`.
#[derive(Args, Debug)]
pub struct LanesArg {
    /// TCP connections to carry the data on (1-16; 1: one connection). Default: the sender chooses from the
    /// round trip and this host's socket buffers (one on a LAN, several where one stream's window cannot
    /// cover the path); the receiver dials at most this many. Over the relay: one.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=16))]
    pub lanes: Option<u8>,
}

/// How to find the peer, from the flags and the config file; a relay that is not `HOST:PORT`, or
/// `--force-relay` without a relay, is a bad command line, reported before anything else happens.
pub fn peer_options(common: &CommonArgs, relay: &RelayArgs) -> anyhow::Result<PeerOptions> {
    let settings = Settings::load()?;
    let chosen = relay
        .relay
        .clone()
        .filter(|r| !r.is_empty())
        .or(settings.relay);
    if let Some(chosen) = &chosen {
        check_relay_address(chosen)?;
    }
    if relay.force_relay && chosen.is_none() {
        return Err(Usage(
            "--force-relay needs a relay: give --relay HOST:PORT, FERRY_RELAY or `relay` in the config file"
                .into(),
        )
        .into());
    }
    Ok(PeerOptions {
        relay: chosen,
        force_relay: relay.force_relay,
        no_discovery: common.no_discovery || settings.no_discovery.unwrap_or(false),
    })
}

/// A relay address must be `HOST:PORT` (`[v6]:PORT` for an IPv6 address) with a port from 1 to 65535;
/// whether HOST resolves is found out later, on the network.
fn check_relay_address(relay: &str) -> Result<(), Usage> {
    let bad = || {
        Usage(format!(
            "relay {:?} is not HOST:PORT (for example relay.example.net:7440)",
            relay
        ))
    };
    let (host, port) = relay.rsplit_once(':').ok_or_else(bad)?;
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    let host_ok = !host.is_empty() && (bracketed || !host.contains(':'));
    if !port_ok || !host_ok || host.chars().any(char::is_whitespace) {
        return Err(bad());
    }
    Ok(())
}
