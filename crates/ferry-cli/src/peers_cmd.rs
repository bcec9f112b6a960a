//! `ferry id` and `ferry peers`: this machine's identity and the machines it is paired with.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, Subcommand};
use ferry_peers::{identity, Fingerprint, PeerName, PeerStore};
use serde_json::json;

use crate::settings::config_dir;
use crate::ui::{escape, stdout_line};

/// Arguments of `ferry id`.
#[derive(Args, Debug)]
pub struct IdArgs {
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ferry peers`.
#[derive(Args, Debug)]
pub struct PeersArgs {
    #[command(subcommand)]
    action: Option<PeersAction>,
    /// One JSON object on stdout.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
enum PeersAction {
    /// List paired peers (the default).
    List,
    /// Give a peer another name.
    Rename {
        /// Its name now.
        old: String,
        /// Its new name.
        new: String,
    },
    /// Forget a peer: its key is refused from now on (pair again to trust it again).
    Remove {
        /// The peer's name.
        name: String,
    },
}

/// The config directory, or a clear error.
pub fn config() -> anyhow::Result<PathBuf> {
    config_dir().context("no config directory: set HOME or XDG_CONFIG_HOME")
}

/// Runs `ferry id`: prints this machine's fingerprint, creating the identity key on first use.
pub fn id(args: IdArgs) -> anyhow::Result<()> {
    let dir = config()?;
    let (key, created) = identity::load_or_create(&dir)?;
    let fingerprint = Fingerprint::of(&key.public());
    if args.json {
        stdout_line(
            &json!({
                "fingerprint": fingerprint.to_string(),
                "key": hex(&key.public()),
                "created": created,
                "path": dir.join(identity::IDENTITY_FILE),
            })
            .to_string(),
        );
    } else {
        if created {
            stdout_line(&format!(
                "Created this machine's identity key in {}.",
                dir.join(identity::IDENTITY_FILE).display()
            ));
        }
        stdout_line(&format!("This machine's fingerprint: {fingerprint}"));
    }
    Ok(())
}

/// Runs `ferry peers`.
pub fn peers(args: PeersArgs) -> anyhow::Result<()> {
    let dir = config()?;
    match args.action.unwrap_or(PeersAction::List) {
        PeersAction::List => list(&PeerStore::load(&dir)?, args.json),
        PeersAction::Rename { old, new } => {
            let new = PeerName::new(&new)?;
            PeerStore::update(&dir, |s| s.rename(&old, new.clone()))?;
            if args.json {
                stdout_line(&json!({ "renamed": old, "name": new.as_str() }).to_string());
            } else {
                stdout_line(&format!("Renamed {} to {new}.", escape(&old)));
            }
            Ok(())
        }
        PeersAction::Remove { name } => {
            let gone = PeerStore::update(&dir, |s| s.remove(&name))?;
            if args.json {
                stdout_line(
                    &json!({ "removed": gone.name.as_str(), "key": hex(&gone.key) }).to_string(),
                );
            } else {
                stdout_line(&format!(
                    "Removed {} ({}): its key is refused from now on.",
                    gone.name,
                    gone.fingerprint()
                ));
            }
            Ok(())
        }
    }
}

fn list(store: &PeerStore, json: bool) -> anyhow::Result<()> {
    let now = unix_now();
    if json {
        let peers: Vec<_> = store
            .peers()
            .iter()
            .map(|p| {
                json!({
                    "name": p.name.as_str(),
                    "fingerprint": p.fingerprint().to_string(),
                    "key": hex(&p.key),
                    "paired_at": p.paired_at,
                    "last_seen": p.last_seen,
                    "last_address": p.last_address,
                })
            })
            .collect();
        stdout_line(&json!({ "peers": peers }).to_string());
        return Ok(());
    }
    if store.peers().is_empty() {
        stdout_line("No paired peers. Pair with another machine: `ferry pair` here, `ferry pair CODE` there.");
        return Ok(());
    }
    let width = store
        .peers()
        .iter()
        .map(|p| p.name.as_str().len())
        .max()
        .unwrap_or(4)
        .max(4);
    stdout_line(&format!(
        "{:width$}  {:54}  {:10}  LAST ADDRESS",
        "NAME", "FINGERPRINT", "LAST SEEN"
    ));
    for p in store.peers() {
        let seen = p
            .last_seen
            .map(|t| ago(now.saturating_sub(t)))
            .unwrap_or_else(|| "never".into());
        let addr = p.last_address.as_deref().map(escape).unwrap_or("-".into());
        stdout_line(&format!(
            "{:width$}  {:54}  {:10}  {addr}",
            p.name.as_str(),
            p.fingerprint().to_string(),
            seen
        ));
    }
    Ok(())
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// "just now", "5m ago", "3h ago", "12d ago".
fn ago(secs: u64) -> String {
    match secs {
        0..60 => "just now".into(),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_read_naturally() {
        assert_eq!(super::ago(5), "just now");
        assert_eq!(super::ago(300), "5m ago");
        assert_eq!(super::ago(3 * 3600 + 5), "3h ago");
        assert_eq!(super::ago(12 * 86400), "12d ago");
    }
}
