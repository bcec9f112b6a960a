//! `ferry pair [CODE]`: one machine prints a code, the other types it; both then trust each other's identity.
//!
//! The code authenticates the channel (SPAKE2, as for send/receive, with the guess limits), then the two sides
//! exchange signed identity keys and halves of their shared secret ([`ferry_peers::pairing`]), say to each
//! other that they are ready to store, and only then write `peers.toml`.

use anyhow::Context;
use clap::Args;
use ferry_channel::blocking::split_tcp;
use ferry_peers::pairing::{Pairing, PairingMessage, MAX_MESSAGE};
use ferry_peers::{identity, Fingerprint, Peer, PeerName, PeerStore, PeersError};
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::{Code, CodePurpose};
use ferry_session::upgrade::DirectPaths;
use ferry_session::{Meeting, Rendezvous, SessionError};
use serde_json::json;

use crate::hint::{listen_hint, OtherSide};
use crate::peers_cmd::{config, hex, unix_now};
use crate::reach_args::{peer_options, CommonArgs, ListenArg, PeerArg, RelayArgs, WaitArg};
use crate::transfer_cmd::{look_for, report_path};
use crate::ui::{escape, Ui};

/// Arguments of `ferry pair`.
#[derive(Args, Debug)]
#[command(
    mut_arg("json", |a| a.help("One JSON event per line on stdout")),
    mut_arg("listen", |a| a.help(
        "Address to listen on (the side that prints the code); as `ferry send --listen`"
    )),
    mut_arg("peer", |a| a.help(
        "Connect straight to the other side at this address (the side that types the code)"
    )),
    mut_arg("wait", |a| a.help(
        "How long the side that types the code looks for the other (30s, 5m, 1h, or seconds; 0 tries once)"
    )),
)]
pub struct PairArgs {
    /// The code `ferry pair` printed on the other machine; without it, this side prints a code.
    code: Option<String>,
    /// The name to give the other machine here (default: its host name, made unique).
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    listen: ListenArg,
    #[command(flatten)]
    peer: PeerArg,
    #[command(flatten)]
    relay: RelayArgs,
    #[command(flatten)]
    wait: WaitArg,
}

impl PairArgs {
    /// `--json` given.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// "Ready to store" and "refused", after the pairing messages.
const READY: u8 = 1;
const REFUSED: u8 = 0;
/// Longest reason a side gives for refusing.
const MAX_REASON: usize = 256;

/// Runs `ferry pair`.
pub fn pair(args: PairArgs, ui: &mut Ui) -> anyhow::Result<()> {
    let dir = config()?;
    let wanted = args.name.as_deref().map(PeerName::new).transpose()?;
    let opts = peer_options(&args.common, &args.relay)?;
    let (key, created) = identity::load_or_create(&dir)?;
    let own = Fingerprint::of(&key.public());
    if created {
        ui.info(&format!(
            "Created this machine's identity key in {}.",
            dir.join(identity::IDENTITY_FILE).display()
        ));
    }

    let connected = match &args.code {
        None => {
            let registry = LocalRegistry::open_default()?;
            let code = Code::generate_for(CodePurpose::Pairing, |h| !registry.is_taken(h));
            let mut rendezvous =
                Rendezvous::start(Meeting::code(&code), &opts, args.listen.listen, ui)?;
            ui.event(
                "code",
                json!({ "code": code.to_string(), "listen": rendezvous.listen.map(|a| a.to_string()), "relay": opts.relay }),
            );
            let reachable = rendezvous.direct_candidates();
            let other_side = OtherSide::of(
                &opts,
                rendezvous.listen,
                args.listen.listen.is_some(),
                &reachable,
            );
            let command = format!("ferry pair {}{code}", other_side.flags);
            ui.info(&format!(
                "Pairing code: {code}\n{}",
                other_side.lines("the other machine", &command, "ferry pair")
            ));
            if let (Some(addr), Some(_)) = (rendezvous.listen, args.listen.listen) {
                ui.info(&listen_hint(
                    addr,
                    &reachable,
                    &format!("ferry pair {code}"),
                ));
            }
            rendezvous.accept(ui)?
        }
        Some(typed) => {
            let code = typed.parse::<Code>()?.with_purpose(CodePurpose::Pairing);
            look_for(&code, &opts, &args.peer, &args.wait, ui)?
        }
    };
    report_path(ui, &connected);
    let peer_address = connected.peer.clone();
    let est = &connected.established;
    let pairing = Pairing::new(est.role, est.transcript, &key, &host_name());
    let (mut reader, mut writer) = split_tcp(connected.stream, connected.established)?;
    writer.send(&pairing.message().encode())?;
    writer.flush()?;
    let theirs = {
        let packet = reader.recv()?.ok_or_else(gone)?;
        if packet.len() > MAX_MESSAGE {
            return Err(PeersError::Malformed("longer than a pairing message").into());
        }
        PairingMessage::decode(packet)?
    };
    let paired = pairing.finish(&theirs)?;

    // Settle the name before telling the other side we are ready, so that a clash stops both.
    let store = PeerStore::load(&dir)?;
    let name = match &wanted {
        Some(n) => {
            if store
                .peers()
                .iter()
                .any(|p| &p.name == n && p.key != paired.peer_key)
            {
                let reason = format!("the name {n} is taken on the other machine");
                let mut refusal = vec![REFUSED];
                refusal.extend_from_slice(reason.as_bytes());
                let _ = writer.send(&refusal).and_then(|()| writer.flush());
                return Err(PeersError::NameTaken(n.to_string()).into());
            }
            n.clone()
        }
        None => store.free_name(&paired.suggested_name, &paired.peer_key),
    };
    writer.send(&[READY])?;
    writer.flush()?;
    match reader.recv()?.ok_or_else(gone)? {
        [READY] => {}
        [REFUSED, reason @ ..] => {
            let reason = String::from_utf8_lossy(&reason[..reason.len().min(MAX_REASON)]);
            anyhow::bail!("the other side refused the pairing: {}", escape(&reason));
        }
        _ => return Err(PeersError::Malformed("expected ready or refused").into()),
    }

    let peer = Peer {
        name: name.clone(),
        key: paired.peer_key,
        secret: paired.secret,
        paired_at: unix_now(),
        last_seen: Some(unix_now()),
        last_address: Some(peer_address),
    };
    let replaced =
        PeerStore::update(&dir, |s| s.add(peer)).context("paired, but cannot store the peer")?;
    let theirs_fp = Fingerprint::of(&paired.peer_key);
    ui.event(
        "paired",
        json!({
            "name": name.as_str(),
            "fingerprint": theirs_fp.to_string(),
            "key": hex(&paired.peer_key),
            "own_fingerprint": own.to_string(),
        }),
    );
    let again = match replaced {
        ferry_peers::store::Added::Replaced(old) => format!(" (paired before as {old})"),
        ferry_peers::store::Added::New => String::new(),
    };
    ui.info(&format!(
        "Paired with {name}{again}.\n  its fingerprint:  {theirs_fp}\n  this machine's:   {own}\n\
         Both sides print both; they must match (`ferry id` shows a machine's own)."
    ));
    let _ = writer.close();
    Ok(())
}

fn gone() -> anyhow::Error {
    SessionError::PeerNotFound("the other side hung up during the pairing".into()).into()
}

/// This machine's host name, as the name it suggests to the peer.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "peer".into())
}
