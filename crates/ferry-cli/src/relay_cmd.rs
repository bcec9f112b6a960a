//! `ferry relay`: the rendezvous and relay server.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_relay::{Forwarding, Relay, RelayConfig};

/// Arguments of `ferry relay`.
#[derive(Args, Debug)]
pub struct RelayArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:7440", value_name = "ADDR")]
    listen: SocketAddr,
    /// Most sessions (waiting and paired) at once.
    #[arg(long, default_value_t = RelayConfig::default().max_sessions)]
    max_sessions: usize,
    /// New sessions allowed per source address per minute.
    #[arg(long, default_value_t = RelayConfig::default().sessions_per_ip_per_minute)]
    per_ip_per_minute: u32,
    /// Most connections from one source address (IPv6: one /64) that have not sent their hello
    /// yet; a newcomer beyond it takes the place of that source's oldest silent one.
    #[arg(long, default_value_t = RelayConfig::default().max_handshakes_per_ip)]
    max_handshakes_per_ip: usize,
    /// Seconds a new connection has to send its hello (a client sends it as it connects).
    #[arg(long, default_value_t = RelayConfig::default().hello_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    hello_timeout: u64,
    /// Most connections from one source address (IPv6: one /64) in sessions (waiting or paired)
    /// at once; more are refused.
    #[arg(long, default_value_t = RelayConfig::default().max_sessions_per_ip)]
    max_sessions_per_ip: usize,
    /// Most listeners (`ferry share --relay`) registered from one source address (IPv6: one
    /// /64) at once; more are refused.
    #[arg(long, default_value_t = RelayConfig::default().max_listeners_per_ip)]
    max_listeners_per_ip: usize,
    /// Seconds a paired session may stay silent before it is closed; also the window of
    /// --min-bytes-per-window.
    #[arg(long, default_value_t = RelayConfig::default().idle_timeout.as_secs())]
    idle_timeout: u64,
    /// Bytes a paired session must move (both ways together) in every --idle-timeout window
    /// from the pairing, or it is closed (0: no minimum).
    #[arg(long, default_value_t = RelayConfig::default().min_bytes_per_window)]
    min_bytes_per_window: u64,
    /// Seconds after pairing at which a session is closed whatever it moves (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_lifetime: u64,
    /// Seconds the first side waits for the second.
    #[arg(long, default_value_t = RelayConfig::default().max_wait.as_secs())]
    max_wait: u64,
    /// Seconds between stats lines on stderr (0: only at shutdown).
    #[arg(long, default_value_t = 60)]
    stats_interval: u64,
    /// Forward with a copy loop instead of splice(2).
    #[arg(long)]
    copy: bool,
}

/// Runs the relay until SIGINT or SIGTERM.
pub fn run(args: RelayArgs) -> anyhow::Result<()> {
    let config = RelayConfig {
        forwarding: if args.copy {
            Forwarding::Copy
        } else {
            Forwarding::Splice
        },
        max_sessions: args.max_sessions,
        sessions_per_ip_per_minute: args.per_ip_per_minute,
        max_handshakes_per_ip: args.max_handshakes_per_ip,
        max_sessions_per_ip: args.max_sessions_per_ip,
        max_listeners_per_ip: args.max_listeners_per_ip,
        hello_timeout: Duration::from_secs(args.hello_timeout),
        idle_timeout: Duration::from_secs(args.idle_timeout),
        min_bytes_per_window: args.min_bytes_per_window,
        max_session_lifetime: (args.max_lifetime > 0)
            .then(|| Duration::from_secs(args.max_lifetime)),
        max_wait: Duration::from_secs(args.max_wait),
        stats_interval: (args.stats_interval > 0).then(|| Duration::from_secs(args.stats_interval)),
        ..RelayConfig::default()
    };
    let relay = Relay::bind(args.listen, config)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    crate::ui::stderr_line(&format!("ferry relay listening on {}", relay.local_addr()));
    let stats = relay.run_blocking_until_signal()?;
    crate::ui::stderr_line(&format!("ferry relay stopped: {stats}"));
    Ok(())
}
