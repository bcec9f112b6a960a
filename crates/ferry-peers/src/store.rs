//! The pinned peers, `peers.toml` in the config directory.
//!
//! ```toml
//! [[peer]]
//! name = "laptop"
//! key = "3b6a27bc…"          # Ed25519 public key, hex
//! secret = "9f0c…"           # the pair's shared secret, hex (keys the rendezvous hashes)
//! paired_at = 1795000000     # Unix seconds
//! last_seen = 1795000100     # optional
//! last_address = "192.168.1.20:7611"   # optional
//! ```
//!
//! Changes go through [`PeerStore::update`]: an exclusive lock on `peers.lock`, a fresh read, the change, and
//! an atomic replace (temporary file, fsync, rename), so two ferry processes never lose each other's writes.
//! The file holds secrets: it is written 0600 and refused when other users may read or change it. Removing a
//! peer is revocation: its key is no longer pinned, so it is refused like any unpaired key.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ferry_channel::PUBLIC_KEY_LEN;
use serde::{Deserialize, Serialize};

use crate::identity::{check_private, create_private_dir, open_private};
use crate::{Fingerprint, PairSecret, PeersError};

/// File name of the peer list in the config directory.
pub const PEERS_FILE: &str = "peers.toml";
const LOCK_FILE: &str = "peers.lock";
/// Largest peer list read (about 4,000 peers).
const MAX_FILE: u64 = 1 << 20;
/// Longest peer name.
pub const MAX_NAME: usize = 32;

/// A peer's local name: 1 to [`MAX_NAME`] ASCII letters, digits, `.`, `_`, `-`, starting with a letter or
/// digit, so it is safe in a file name, a shell and `NAME:PATH` arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerName(String);

impl PeerName {
    /// Checks `name`.
    pub fn new(name: &str) -> Result<Self, PeersError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name.as_bytes()[0].is_ascii_alphanumeric()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok {
            Ok(PeerName(name.to_string()))
        } else {
            Err(PeersError::BadName(name.chars().take(64).collect()))
        }
    }

    /// A usable name made from anything (a host name the peer suggested): invalid characters become `-`,
    /// cut to [`MAX_NAME`]; `peer` when nothing is left.
    pub fn sanitized(suggestion: &str) -> Self {
        let mut s: String = suggestion
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(MAX_NAME)
            .collect();
        while s.starts_with(['.', '_', '-']) {
            s.remove(0);
        }
        PeerName::new(&s).unwrap_or_else(|_| PeerName("peer".into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PeerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One paired peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Our name for it.
    pub name: PeerName,
    /// Its Ed25519 public key, pinned.
    pub key: [u8; PUBLIC_KEY_LEN],
    /// The secret the pair shares.
    pub secret: PairSecret,
    /// When the pairing happened (Unix seconds).
    pub paired_at: u64,
    /// When a session with it last succeeded (Unix seconds).
    pub last_seen: Option<u64>,
    /// The address of that session.
    pub last_address: Option<String>,
}

impl Peer {
    /// Its key's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.key)
    }
}

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(default)]
    peer: Vec<PeerForm>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerForm {
    name: String,
    key: String,
    secret: String,
    paired_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_seen: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_address: Option<String>,
}

/// What [`PeerStore::add`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Added {
    /// A new peer.
    New,
    /// The key was paired before (under this old name); its entry was replaced.
    Replaced(PeerName),
}

/// The peer list.
#[derive(Debug)]
pub struct PeerStore {
    path: PathBuf,
    peers: Vec<Peer>,
}

impl PeerStore {
    /// Reads the peer list in `dir`; no file is an empty list.
    pub fn load(dir: &Path) -> Result<Self, PeersError> {
        let path = dir.join(PEERS_FILE);
        let file = match open_private(&path) {
            Ok(f) => f,
            Err(PeersError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(PeerStore {
                    path,
                    peers: Vec::new(),
                })
            }
            Err(e) => return Err(e),
        };
        let peers = parse(file, &path)?;
        Ok(PeerStore { path, peers })
    }

    /// Runs `change` on a fresh copy of the list under the lock and saves the result when `change` succeeds.
    pub fn update<T>(
        dir: &Path,
        change: impl FnOnce(&mut PeerStore) -> Result<T, PeersError>,
    ) -> Result<T, PeersError> {
        create_private_dir(dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&lock_path)
            .map_err(|e| PeersError::io(&lock_path, e))?;
        check_private(&lock, &lock_path)?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| PeersError::io(&lock_path, e.into()))?;
        let mut store = PeerStore::load(dir)?;
        let out = change(&mut store)?;
        store.save()?;
        Ok(out)
        // The lock is released when `lock` is closed.
    }

    /// Every peer, in the order they were paired.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// The peer called `name`.
    pub fn get(&self, name: &str) -> Result<&Peer, PeersError> {
        self.peers
            .iter()
            .find(|p| p.name.as_str() == name)
            .ok_or_else(|| PeersError::UnknownPeer(name.chars().take(64).collect()))
    }

    /// The peer with this key, if it is pinned.
    pub fn by_key(&self, key: &[u8; PUBLIC_KEY_LEN]) -> Option<&Peer> {
        self.peers.iter().find(|p| &p.key == key)
    }

    /// Pins a peer. A key paired before is replaced (pairing again renews the secret); a name that another key
    /// has is refused.
    pub fn add(&mut self, peer: Peer) -> Result<Added, PeersError> {
        if self
            .peers
            .iter()
            .any(|p| p.name == peer.name && p.key != peer.key)
        {
            return Err(PeersError::NameTaken(peer.name.to_string()));
        }
        if let Some(old) = self.peers.iter_mut().find(|p| p.key == peer.key) {
            let was = std::mem::replace(old, peer);
            return Ok(Added::Replaced(was.name));
        }
        self.peers.push(peer);
        Ok(Added::New)
    }

    /// A free name based on `wanted` (`wanted`, `wanted-2`, `wanted-3`, ...), or `wanted` itself when `key`
    /// already has it.
    pub fn free_name(&self, wanted: &PeerName, key: &[u8; PUBLIC_KEY_LEN]) -> PeerName {
        let taken = |n: &PeerName| self.peers.iter().any(|p| &p.name == n && &p.key != key);
        if !taken(wanted) {
            return wanted.clone();
        }
        (2..)
            .map(|i| {
                let suffix = format!("-{i}");
                let base: String = wanted
                    .as_str()
                    .chars()
                    .take(MAX_NAME - suffix.len())
                    .collect();
                PeerName(base + &suffix)
            })
            .find(|n| !taken(n))
            .expect("some suffix is free")
    }

    /// Renames a peer.
    pub fn rename(&mut self, old: &str, new: PeerName) -> Result<(), PeersError> {
        if self
            .peers
            .iter()
            .any(|p| p.name == new && p.name.as_str() != old)
        {
            return Err(PeersError::NameTaken(new.to_string()));
        }
        let peer = self
            .peers
            .iter_mut()
            .find(|p| p.name.as_str() == old)
            .ok_or_else(|| PeersError::UnknownPeer(old.chars().take(64).collect()))?;
        peer.name = new;
        Ok(())
    }

    /// Forgets a peer: from now on its key is refused like any unpaired key.
    pub fn remove(&mut self, name: &str) -> Result<Peer, PeersError> {
        let i = self
            .peers
            .iter()
            .position(|p| p.name.as_str() == name)
            .ok_or_else(|| PeersError::UnknownPeer(name.chars().take(64).collect()))?;
        Ok(self.peers.remove(i))
    }

    /// Records a successful session with the peer holding `key`.
    pub fn seen(&mut self, key: &[u8; PUBLIC_KEY_LEN], when: u64, address: Option<String>) {
        if let Some(p) = self.peers.iter_mut().find(|p| &p.key == key) {
            p.last_seen = Some(when);
            if address.is_some() {
                p.last_address = address;
            }
        }
    }

    fn save(&self) -> Result<(), PeersError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let form = FileForm {
            peer: self
                .peers
                .iter()
                .map(|p| PeerForm {
                    name: p.name.to_string(),
                    key: crate::to_hex(&p.key),
                    secret: crate::to_hex(&p.secret.0),
                    paired_at: p.paired_at,
                    last_seen: p.last_seen,
                    last_address: p.last_address.clone(),
                })
                .collect(),
        };
        let text = toml::to_string(&form).expect("the peer list serializes");
        let temp = dir.join(format!(".{PEERS_FILE}.{}.tmp", std::process::id()));
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            f.write_all(
                b"# ferry's paired peers: edit with `ferry peers`. Holds secrets: keep it 0600.\n",
            )?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&temp, &self.path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written.map_err(|e| PeersError::io(&self.path, e))
    }
}

fn parse(file: File, path: &Path) -> Result<Vec<Peer>, PeersError> {
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| PeersError::io(path, e))?;
    let damaged = |problem: String| PeersError::Damaged {
        path: path.to_path_buf(),
        problem,
    };
    if text.len() as u64 > MAX_FILE {
        return Err(damaged("larger than 1 MiB".into()));
    }
    let form: FileForm = toml::from_str(&text).map_err(|e| damaged(e.message().to_string()))?;
    let mut names = HashSet::new();
    let mut keys = HashSet::new();
    let mut peers = Vec::with_capacity(form.peer.len());
    for p in form.peer {
        let name = PeerName::new(&p.name).map_err(|e| damaged(e.to_string()))?;
        let key = crate::from_hex32(&p.key)
            .ok_or_else(|| damaged(format!("peer {name}: key is not 64 hex digits")))?;
        let secret = crate::from_hex32(&p.secret)
            .ok_or_else(|| damaged(format!("peer {name}: secret is not 64 hex digits")))?;
        if !names.insert(name.clone()) || !keys.insert(key) {
            return Err(damaged(format!("peer {name} is listed twice")));
        }
        peers.push(Peer {
            name,
            key,
            secret: PairSecret(secret),
            paired_at: p.paired_at,
            last_seen: p.last_seen,
            last_address: p.last_address,
        });
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn peer(name: &str, k: u8) -> Peer {
        Peer {
            name: PeerName::new(name).unwrap(),
            key: [k; 32],
            secret: PairSecret([k ^ 0xff; 32]),
            paired_at: 1_795_000_000,
            last_seen: None,
            last_address: None,
        }
    }

    #[test]
    fn names_are_checked_and_suggestions_cleaned() {
        for good in ["laptop", "a", "nas-2.home", "x_y", &"z".repeat(32)] {
            assert!(PeerName::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-x",
            ".hidden",
            "a b",
            "a/b",
            "a:b",
            "ü",
            &"z".repeat(33),
        ] {
            assert!(PeerName::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(PeerName::sanitized("Bob's Mac").as_str(), "Bob-s-Mac");
        assert_eq!(
            PeerName::sanitized("../../etc").as_str(),
            "..-..-etc".trim_start_matches(['.', '-'])
        );
        assert_eq!(PeerName::sanitized("\u{1b}[31m").as_str(), "31m");
        assert_eq!(PeerName::sanitized("").as_str(), "peer");
    }

    #[test]
    fn the_list_survives_a_round_trip_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("ferry");
        PeerStore::update(&conf, |s| {
            s.add(peer("laptop", 1))?;
            s.add(peer("nas", 2))?;
            s.seen(&[2; 32], 1_795_000_500, Some("127.0.0.1:7611".into()));
            Ok(())
        })
        .unwrap();
        let s = PeerStore::load(&conf).unwrap();
        assert_eq!(s.peers().len(), 2);
        let nas = s.get("nas").unwrap();
        assert_eq!(nas.last_seen, Some(1_795_000_500));
        assert_eq!(nas.last_address.as_deref(), Some("127.0.0.1:7611"));
        assert_eq!(nas.secret, PairSecret([0xfd; 32]));
        assert_eq!(s.by_key(&[1; 32]).unwrap().name.as_str(), "laptop");
        let mode = fs::metadata(conf.join(PEERS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn rename_remove_and_name_clashes() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = PeerStore::load(dir.path()).unwrap();
        s.add(peer("laptop", 1)).unwrap();
        assert!(matches!(
            s.add(peer("laptop", 2)),
            Err(PeersError::NameTaken(_))
        ));
        assert_eq!(
            s.free_name(&PeerName::new("laptop").unwrap(), &[2; 32])
                .as_str(),
            "laptop-2"
        );
        assert_eq!(
            s.free_name(&PeerName::new("laptop").unwrap(), &[1; 32])
                .as_str(),
            "laptop"
        );
        // Pairing the same key again replaces its entry.
        assert_eq!(
            s.add(peer("work", 1)).unwrap(),
            Added::Replaced(PeerName::new("laptop").unwrap())
        );
        assert_eq!(s.peers().len(), 1);
        s.add(peer("nas", 2)).unwrap();
        assert!(matches!(
            s.rename("work", PeerName::new("nas").unwrap()),
            Err(PeersError::NameTaken(_))
        ));
        s.rename("work", PeerName::new("laptop").unwrap()).unwrap();
        assert!(matches!(
            s.rename("nope", PeerName::new("x").unwrap()),
            Err(PeersError::UnknownPeer(_))
        ));
        let gone = s.remove("laptop").unwrap();
        assert_eq!(gone.key, [1; 32]);
        assert!(
            s.by_key(&[1; 32]).is_none(),
            "a removed key is no longer pinned"
        );
        assert!(matches!(s.get("laptop"), Err(PeersError::UnknownPeer(_))));
    }

    #[test]
    fn a_hostile_or_exposed_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PEERS_FILE);
        let write = |text: &str, mode: u32| {
            fs::write(&path, text).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        };
        let key = "ab".repeat(32);
        let ok = format!(
            "[[peer]]\nname = \"nas\"\nkey = \"{key}\"\nsecret = \"{key}\"\npaired_at = 1\n"
        );
        write(&ok, 0o600);
        assert!(PeerStore::load(dir.path()).is_ok());
        write(&ok, 0o622);
        assert!(matches!(
            PeerStore::load(dir.path()),
            Err(PeersError::Exposed { .. })
        ));
        for bad in [
            ok.replace("nas", "../x"),
            ok.replace(&format!("key = \"{key}\""), "key = \"ab\""),
            format!("{ok}{ok}"),
            format!("{ok}extra = 1\n"),
            "[[peer]]\nname = 1\n".to_string(),
        ] {
            write(&bad, 0o600);
            let err = PeerStore::load(dir.path()).err().unwrap();
            assert!(matches!(err, PeersError::Damaged { .. }), "{bad}: {err}");
        }
        write(&"#".repeat(MAX_FILE as usize + 10), 0o600);
        assert!(matches!(
            PeerStore::load(dir.path()),
            Err(PeersError::Damaged { .. })
        ));
    }

    #[test]
    fn concurrent_updates_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().to_path_buf();
        let threads: Vec<_> = (0..8u8)
            .map(|i| {
                let conf = conf.clone();
                std::thread::spawn(move || {
                    PeerStore::update(&conf, |s| s.add(peer(&format!("p{i}"), i + 1))).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(PeerStore::load(&conf).unwrap().peers().len(), 8);
    }
}
