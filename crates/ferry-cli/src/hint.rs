//! The waiting side's "run this on the other side" line (`send`, `pair`, `share`): a command that works when
//! pasted where it says, or one for this machine with what another machine would need.

use std::net::SocketAddr;

use ferry_session::PeerOptions;

/// Where the looking side can find the waiting one, as the flags its command needs.
pub struct OtherSide {
    /// The flags before the code or target, each followed by a space: `--relay R `, `--peer A `, or nothing.
    pub flags: String,
    /// Why only this machine can reach the waiting side, when that is so.
    pub here_only: Option<&'static str>,
}

impl OtherSide {
    /// What the looking side of a waiting side started with `opts` needs: the relay when there is one (it
    /// works from anywhere the relay is reachable, also without the relay in its config), else the address it listens on when the user chose one
    /// other machines can dial (`reachable`: the addresses to dial for an unspecified one), else nothing
    /// (this host's registry, and the LAN by mDNS when discovery is on).
    pub fn of(
        opts: &PeerOptions,
        listen: Option<SocketAddr>,
        explicit_listen: bool,
        reachable: &[SocketAddr],
    ) -> OtherSide {
        let found = |flags: String| OtherSide {
            flags,
            here_only: None,
        };
        if let Some(relay) = &opts.relay {
            return found(format!("--relay {relay} "));
        }
        match listen.filter(|_| explicit_listen) {
            Some(addr) if addr.ip().is_loopback() => OtherSide {
                flags: String::new(),
                here_only: Some("it listens on loopback"),
            },
            Some(addr) if !addr.ip().is_unspecified() => found(format!("--peer {addr} ")),
            Some(_) => match reachable.first() {
                Some(first) => found(format!("--peer {first} ")),
                None => OtherSide {
                    flags: String::new(),
                    here_only: Some("this machine has no address other machines can dial"),
                },
            },
            None if opts.no_discovery => OtherSide {
                flags: String::new(),
                here_only: Some("discovery is off and no relay is set"),
            },
            None => found(String::new()),
        }
    }

    /// The lines that tell the user what to run: `On THERE run:  COMMAND` (`there`: "the other side", a
    /// peer's name), or, when only this machine can reach it, `On this machine run:  COMMAND` and what a
    /// command elsewhere needs (`started`: the waiting command, e.g. `ferry send`).
    pub fn lines(&self, there: &str, command: &str, started: &str) -> String {
        match self.here_only {
            None => format!("On {there} run:  {command}"),
            Some(why) => format!(
                "On this machine run:  {command}\n\
                 Only this machine can reach it ({why}): to reach it from elsewhere, start {started} \
                 with --relay HOST:PORT, or with --listen 0.0.0.0:PORT and use the --peer address it prints."
            ),
        }
    }
}

/// Where other machines could dial a listener bound to `listen`: the address itself when it is a specific
/// one, else every interface address of its family with its port.
pub fn dialable(listen: SocketAddr) -> Vec<SocketAddr> {
    if !listen.ip().is_unspecified() {
        return vec![listen];
    }
    ferry_rendezvous::netif::interface_addresses()
        .into_iter()
        .filter(|ip| ip.is_ipv4() == listen.is_ipv4() || listen.is_ipv6())
        .map(|ip| SocketAddr::new(ip, listen.port()))
        .collect()
}

/// What `--listen ADDR` means for a looking side: the addresses to give `--peer` (`command` is its command
/// without them, e.g. `ferry receive CODE`). An unspecified address (`0.0.0.0`, `::`) is no address to dial:
/// the interfaces' addresses are (`reachable`); a loopback address reaches this machine only.
pub fn listen_hint(addr: SocketAddr, reachable: &[SocketAddr], command: &str) -> String {
    let with_peer = |peer: SocketAddr| match command.split_once(' ') {
        Some((program, rest)) => match rest.split_once(' ') {
            Some((verb, rest)) => format!("{program} {verb} --peer {peer} {rest}"),
            None => format!("{command} --peer {peer}"),
        },
        None => format!("{command} --peer {peer}"),
    };
    if addr.ip().is_loopback() {
        return format!(
            "Listening on {addr}, this machine only ({})",
            with_peer(addr)
        );
    }
    if !addr.ip().is_unspecified() {
        return format!(
            "Listening on {addr} (from another machine: {})",
            with_peer(addr)
        );
    }
    match reachable {
        [] => format!(
            "Listening on {addr}: every interface, but this machine has no address other machines can dial"
        ),
        [first, rest @ ..] => {
            let others: Vec<String> = rest.iter().map(|a| format!(" or --peer {a}")).collect();
            format!(
                "Listening on {addr} (from another machine: {}{})",
                with_peer(*first),
                if others.is_empty() {
                    String::new()
                } else {
                    format!("; also{}", others.concat())
                }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(relay: Option<&str>, no_discovery: bool) -> PeerOptions {
        PeerOptions {
            relay: relay.map(String::from),
            force_relay: false,
            no_discovery,
        }
    }

    #[test]
    fn the_command_names_what_another_machine_needs() {
        let lan: SocketAddr = "192.168.1.20:7070".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let relay = opts(Some("r.example:7440"), true);
        assert_eq!(
            OtherSide::of(&relay, Some(lo), false, &[]).flags,
            "--relay r.example:7440 "
        );
        let off = opts(None, true);
        assert!(OtherSide::of(&off, Some(lo), false, &[])
            .here_only
            .is_some());
        assert!(OtherSide::of(&off, Some(lo), true, &[]).here_only.is_some());
        assert_eq!(
            OtherSide::of(&off, Some(any), true, &[lan]).flags,
            "--peer 192.168.1.20:7070 "
        );
        assert!(OtherSide::of(&off, Some(any), true, &[])
            .here_only
            .is_some());
        let on = opts(None, false);
        let lan_only = OtherSide::of(&on, Some(any), false, &[lan]);
        assert_eq!((lan_only.flags.as_str(), lan_only.here_only), ("", None));
    }

    #[test]
    fn the_listen_hint_puts_peer_after_the_verb() {
        let lo: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        assert_eq!(
            listen_hint(lo, &[], "ferry pair 7-apple-orbit-violin"),
            "Listening on 127.0.0.1:7070, this machine only (ferry pair --peer 127.0.0.1:7070 7-apple-orbit-violin)"
        );
    }
}
