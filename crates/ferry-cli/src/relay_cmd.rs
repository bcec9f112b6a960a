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
    /// Seconds a paired session may stay silent before it is closed.
    #[arg(long, default_value_t = RelayConfig::default().idle_timeout.as_secs())]
    idle_timeout: u64,
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
        idle_timeout: Duration::from_secs(args.idle_timeout),
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
