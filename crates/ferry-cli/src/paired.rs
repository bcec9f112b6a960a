//! Paired peers as commands reach them: this machine's identity and `peers.toml` turned into meetings
//! (`send --to`, `receive --from`, `ls`, `pull`), and the check a sharer makes of every peer that reached it.
//!
//! A meeting with a paired peer is found under hashes only the pair can compute ([`ferry_peers::meeting`]):
//! the waiting side announces the current window's hash, the looking side tries the current window, the
//! previous and the next, all in each round. Both sides authenticate by identity: the looking side pins the
//! peer's key; a sharer, which serves every allowed peer, accepts any key in the handshake and checks it
//! against `peers.toml` (read again for every connection, so `ferry peers remove` takes effect at once)
//! before it reads a single request.

use std::ffi::OsStr;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_channel::blocking::split_tcp;
use ferry_channel::{Auth, IdentityKey, PeerKey, PUBLIC_KEY_LEN};
use ferry_peers::meeting::{hashes_to_try, meeting_hash, window_of};
use ferry_peers::{identity, Fingerprint, Peer, PeerStore};
use ferry_rendezvous::NameplateHash;
use ferry_session::{Connected, HashSource, Meeting, MeetingAuth, PeerOptions};
use ferry_share::io::{Session, SessionError as ShareError};

use crate::failure::Usage;
use crate::peers_cmd::{config, unix_now};
use crate::ui::{escape, escape_bytes, Ui};

/// The purpose of `send --to` / `receive --from` meetings.
pub const TRANSFER: &str = "transfer";

/// The purpose of the meetings of the share `name`.
pub fn share_purpose(name: &str) -> String {
    format!("share:{name}")
}

/// This machine as paired peers know it: where its config lives and its identity key.
pub struct Me {
    /// The config directory (`peers.toml`, `identity`).
    pub dir: PathBuf,
    key: IdentityKey,
}

impl Me {
    /// Loads this machine's identity (creating it on first use).
    pub fn load() -> anyhow::Result<Me> {
        let dir = config()?;
        let (key, _) = identity::load_or_create(&dir)?;
        Ok(Me { dir, key })
    }

    /// The paired peer called `name`; an unknown name is a usage error that points at `ferry peers`.
    pub fn peer(&self, name: &str) -> anyhow::Result<Peer> {
        Ok(PeerStore::load(&self.dir)?.get(name)?.clone())
    }

    /// Authenticates each handshake with this machine's key; the peer's is checked as `peer` says.
    pub fn auth(&self, peer: PeerKey) -> MeetingAuth {
        // The key is not Clone: each handshake gets its own, made from the seed.
        let seed = *self.key.seed();
        MeetingAuth::Other(Arc::new(move || Auth::Identity {
            key: IdentityKey::from_seed(seed),
            peer: peer.clone(),
        }))
    }

    /// The meeting the looking side seeks with `peer` for `purpose`: this window's hash, then the previous
    /// and the next window's, so clocks up to a window apart meet.
    pub fn looking_for(&self, peer: &Peer, purpose: &str) -> Meeting {
        let (hash, also) = hashes_to_try(&peer.secret, purpose, unix_now());
        Meeting {
            hash,
            also,
            label: format!("{purpose} with {}", peer.name),
            waited_for: if purpose.starts_with("share:") {
                "sharer"
            } else {
                "sender"
            }
            .into(),
            other_side: if purpose.starts_with("share:") {
                format!("`ferry share` on {}", peer.name)
            } else {
                format!("`ferry send --to` on {}", peer.name)
            },
            auth: self.auth(PeerKey::Pinned(peer.key)),
        }
    }

    /// The meeting the waiting side announces for `peer` and `purpose`: this window's hash.
    pub fn waiting_for(&self, peer: &Peer, purpose: &str) -> Meeting {
        Meeting {
            hash: meeting_hash(&peer.secret, purpose, window_of(unix_now())),
            also: Vec::new(),
            label: format!("{purpose} with {}", peer.name),
            waited_for: "receiver".into(),
            other_side: format!("`ferry receive --from` on {}", peer.name),
            auth: self.auth(PeerKey::Pinned(peer.key)),
        }
    }

    /// Records a successful session with `key` at `address` in `peers.toml`; a failure to write it is only
    /// worth a warning (`Err` holds it).
    pub fn seen(&self, key: &[u8; PUBLIC_KEY_LEN], address: &str) -> Result<(), String> {
        PeerStore::update(&self.dir, |s| {
            s.seen(key, unix_now(), Some(address.to_string()));
            Ok(())
        })
        .map_err(|e| format!("cannot record the session in peers.toml: {e}"))
    }
}

/// How to look for a peer: the reach options of the command.
pub struct Reach<'a> {
    /// `--relay`, `--force-relay`, `--no-discovery`.
    pub opts: &'a PeerOptions,
    /// `--peer ADDR`.
    pub peer: Option<SocketAddr>,
    /// `--wait`.
    pub wait: Duration,
}

/// Reaches the share `share` of `peer` and returns the connection, before any hello: `ls` and `pull` open
/// a session on it, and `mount` dials again with this whenever its link is lost (with `events` that print
/// nothing).
pub fn reach_share(
    me: &Me,
    peer: &Peer,
    share: &str,
    reach: &Reach<'_>,
    events: &mut dyn ferry_session::Events,
) -> anyhow::Result<Connected> {
    let meeting = me.looking_for(peer, &share_purpose(share));
    let connected = ferry_session::connect(&meeting, reach.opts, reach.peer, reach.wait, events)
        .map_err(|e| {
            let refused = matches!(
                &e,
                ferry_session::SessionError::Channel(ferry_channel::ChannelError::NotAdmitted)
            );
            let context = match refused {
                true => format!(
                    "{} refused this machine's key: this machine is not paired there (or was removed, \
                     or is not in its --allow list)",
                    peer.name
                ),
                false => format!(
                    "cannot reach the share {share:?} of {} (is `ferry share` running there?)",
                    peer.name
                ),
            };
            anyhow::Error::new(e).context(context)
        })?;
    if let Err(w) = me.seen(&peer.key, &connected.peer) {
        events.warn(&w);
    }
    Ok(connected)
}

/// A command line's `NAME:PATH` split at its first colon: the paired peer's name (text, as `ferry peers`
/// names peers) and the path's bytes as given (file names are bytes: `$'bad\\xffname'` names a file that
/// is not UTF-8), `None` without a colon. The path is not checked here.
pub fn split_target(target: &OsStr) -> Result<(&str, Option<&[u8]>), Usage> {
    let bytes = target.as_bytes();
    let (name, path) = match bytes.iter().position(|&b| b == b':') {
        Some(at) => (&bytes[..at], Some(&bytes[at + 1..])),
        None => (bytes, None),
    };
    let name = std::str::from_utf8(name).map_err(|_| {
        Usage(format!(
            "\"{}\": a paired peer's name is text (UTF-8); give it first, as NAME:PATH",
            escape_bytes(bytes)
        ))
    })?;
    if name.is_empty() {
        return Err(Usage(format!(
            "\"{}\": give the paired peer's name first, as NAME:PATH",
            escape_bytes(bytes)
        )));
    }
    Ok((name, path))
}

/// Refuses a sharer whose hello names another share than `asked`: discovery finds only the sharer of the
/// share asked for, but at an address given with `--peer` whichever share runs there answers.
pub fn check_share(peer: &Peer, asked: &str, got: &[u8]) -> anyhow::Result<()> {
    if got == asked.as_bytes() {
        return Ok(());
    }
    anyhow::bail!(
        "{} answered there with its share \"{}\", not \"{asked}\"",
        peer.name,
        escape_bytes(got)
    )
}

/// What to say when a sharer closed the connection before its hello.
pub fn refused_before_hello(peer: &Peer) -> String {
    format!(
        "{} closed the connection before its share's hello: this machine is not paired there (or was \
         removed), not in its --allow list, or the share serves as many clients as it takes",
        peer.name
    )
}

/// Reaches the share `share` of the paired peer `name` (`ls`, `pull`) and opens a session with at most
/// `in_flight` requests in flight; returns it with the peer. A sharer that refuses this machine closes the
/// connection before its hello: that is said in words.
pub fn open_share(
    name: &str,
    share: &str,
    reach: &Reach<'_>,
    in_flight: u32,
    ui: &mut Ui,
) -> anyhow::Result<(Session<TcpStream, TcpStream>, Peer)> {
    let me = Me::load()?;
    let peer = me.peer(name)?;
    let connected = reach_share(&me, &peer, share, reach, ui);
    ui.waited();
    let connected = connected?;
    crate::transfer_cmd::report_path(ui, &connected);
    let (reader, writer) = split_tcp(connected.stream, connected.established)?;
    match Session::open(reader, writer, in_flight) {
        Ok(session) => {
            check_share(&peer, share, session.share())?;
            Ok((session, peer))
        }
        Err(e @ (ShareError::Closed | ShareError::Channel(_))) => {
            Err(anyhow::Error::new(e).context(refused_before_hello(&peer)))
        }
        Err(e) => Err(e.into()),
    }
}

/// Which paired peers a sharer serves: all of them, or those `--allow` names.
#[derive(Debug, Clone, Default)]
pub struct Allowed(Option<Vec<[u8; PUBLIC_KEY_LEN]>>);

impl Allowed {
    /// All paired peers (`names` empty), or only `names`; each must name a paired peer now, and is bound to
    /// that peer's key: a rename or a new pairing that reuses a name does not change who is allowed.
    pub fn new(dir: &Path, names: &[String]) -> anyhow::Result<Allowed> {
        if names.is_empty() {
            return Ok(Allowed(None));
        }
        let store = PeerStore::load(dir)?;
        let mut allowed = Vec::new();
        for n in names {
            allowed.push(store.get(n)?.key);
        }
        Ok(Allowed(Some(allowed)))
    }

    fn allows(&self, peer: &Peer) -> bool {
        self.0.as_ref().is_none_or(|keys| keys.contains(&peer.key))
    }

    /// The hashes a sharer of `purpose` announces now: one per allowed peer, this window's (read from
    /// `peers.toml` each time, so peers paired and removed while it runs are followed).
    pub fn hashes(&self, dir: PathBuf, purpose: String) -> HashSource {
        let allowed = self.clone();
        Arc::new(move || -> Vec<NameplateHash> {
            let Ok(store) = PeerStore::load(&dir) else {
                return Vec::new();
            };
            let window = window_of(unix_now());
            store
                .peers()
                .iter()
                .filter(|p| allowed.allows(p))
                .map(|p| meeting_hash(&p.secret, &purpose, window))
                .collect()
        })
    }

    /// The paired, allowed peer holding `key` (`peers.toml` read now), or why the connection is refused.
    pub fn admit(&self, dir: &Path, key: Option<&[u8; PUBLIC_KEY_LEN]>) -> Result<Peer, String> {
        let key = key.ok_or("no identity was presented")?;
        let store = PeerStore::load(dir).map_err(|e| format!("cannot read the peer list: {e}"))?;
        let Some(peer) = store.by_key(key) else {
            return Err(format!(
                "the key {} is not paired with this machine",
                Fingerprint::of(key)
            ));
        };
        if !self.allows(peer) {
            return Err(format!("{} is not in --allow", escape(peer.name.as_str())));
        }
        Ok(peer.clone())
    }
}
