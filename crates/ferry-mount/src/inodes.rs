//! The inode table: share paths <-> inode numbers, with what was last learned of each path (its entry, its
//! listing, its version) so that a lost link still shows what was seen, and so that a change notification
//! for a path can be turned into the kernel invalidations it needs.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ferry_share::tree::Version;
use ferry_share::wire::{Entry, Kind, SharePath};

/// The root's inode number (FUSE's).
pub const ROOT: u64 = 1;

/// A directory's entries, sorted by name, one per name: shared without copying (a readdir of a large
/// directory comes in many calls), a name found by binary search (a lookup per entry, `ls -l`).
pub type Listing = Arc<Vec<Entry>>;

/// `entries` as a [`Listing`]: sorted by name, one entry per name (a sharer that names one twice is
/// believed once).
pub fn listing_of(mut entries: Vec<Entry>) -> Listing {
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries.dedup_by(|a, b| a.name == b.name);
    Arc::new(entries)
}

/// What is known of one path.
#[derive(Debug)]
struct Node {
    path: SharePath,
    parent: u64,
    /// The kernel's lookup count: the node is forgotten when it reaches zero.
    lookups: u64,
    /// The last entry seen and when; `None` until stat or listed.
    entry: Option<(Entry, Instant)>,
    /// The last listing seen (directories) and when.
    listing: Option<(Listing, Instant)>,
    /// The version last opened (files): open works offline from a cached version.
    version: Option<Version>,
    /// Set by a change notification: the next use asks the sharer again.
    stale: bool,
    /// The access time set in the mount (utimensat): the share carries none.
    atime: Option<SystemTime>,
    /// The same for the listing (a lookup of the directory itself refreshes its entry, not its listing).
    listing_stale: bool,
    /// Kept when the kernel forgets it (a file with local writes: they are pushed under its path).
    held: bool,
    /// Handles open for classic (daemon) reads: while there are any, the kernel holds the inode in
    /// caching mode and answers a passthrough open of it with EIO.
    classic_opens: u32,
    /// Handles open with passthrough, and the version they read: while there are any, the kernel takes
    /// only passthrough opens of that same backing file.
    passthrough: (u32, Option<Version>),
}

/// The kernel-side caches to drop after a change: inodes (attributes and data) and directory entries.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invalidations {
    /// Inodes whose attributes and cached data are to be dropped.
    pub inodes: Vec<u64>,
    /// Directory entries `(parent inode, name)` to drop.
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// Paths and inode numbers, both ways.
#[derive(Debug)]
pub struct Inodes {
    by_ino: HashMap<u64, Node>,
    /// Ordered by the paths' bytes, so the paths beneath a directory are one range ([`Inodes::beneath`]).
    by_path: BTreeMap<SharePath, u64>,
    next: u64,
    fresh_for: Duration,
    /// What was last seen of paths the kernel forgot (entry, version opened): offline, a file read before
    /// is found and opened from the cache again. Bounded by [`REMEMBERED`].
    remembered: HashMap<SharePath, Remembered>,
}

/// What is kept of a path the kernel forgot: its last entry, the version last opened, its inode number (a
/// path looked up again gets it back, as on a local disk, unless another path took it), the access time
/// set in the mount and a directory's listing as last seen (its link count, and offline its names: the
/// kernel forgets a directory it holds no reference to at any time, a new one too).
#[derive(Debug, Clone)]
struct Remembered {
    entry: Entry,
    version: Option<Version>,
    ino: u64,
    atime: Option<SystemTime>,
    listing: Option<Listing>,
}

/// Most forgotten paths remembered for offline use (about 100 bytes each); beyond, the oldest half goes.
pub const REMEMBERED: usize = 100_000;

/// Largest listing remembered with a forgotten directory, so that the remembered paths stay about as
/// small as they are: a larger one is asked again (its link count is 2 meanwhile).
const REMEMBERED_LISTING: usize = 4096;

impl Inodes {
    /// A table holding the root; entries and listings count as fresh for `fresh_for`.
    pub fn new(fresh_for: Duration) -> Inodes {
        let mut t = Inodes {
            by_ino: HashMap::new(),
            by_path: BTreeMap::new(),
            next: ROOT + 1,
            fresh_for,
            remembered: HashMap::new(),
        };
        t.by_ino.insert(ROOT, node(SharePath::root(), ROOT));
        t.by_path.insert(SharePath::root(), ROOT);
        t
    }

    /// The path of inode `ino`.
    pub fn path(&self, ino: u64) -> Option<SharePath> {
        self.by_ino.get(&ino).map(|n| n.path.clone())
    }

    /// The inodes of the paths strictly beneath `dir` (every other one for the root): the range of the paths
    /// that start with `dir/`, which in the bytes' order lie from `dir/` up to `dir0` (`'0'` follows `'/'`).
    fn beneath(&self, dir: &SharePath) -> Vec<u64> {
        if dir.is_root() {
            return self
                .by_path
                .iter()
                .filter(|(p, _)| !p.is_root())
                .map(|(_, &ino)| ino)
                .collect();
        }
        let mut from = dir.as_bytes().to_vec();
        from.push(b'/');
        let mut to = dir.as_bytes().to_vec();
        to.push(b'/' + 1);
        self.by_path
            .range::<[u8], _>((Bound::Included(&from[..]), Bound::Excluded(&to[..])))
            .map(|(_, &ino)| ino)
            .collect()
    }

    /// The path of `ino` while it still leads to it: not after the mount removed it or renamed another
    /// file over it (the kernel may hold the inode for its open handles).
    pub fn current_path(&self, ino: u64) -> Option<SharePath> {
        let n = self.by_ino.get(&ino)?;
        (self.by_path.get(&n.path) == Some(&ino)).then(|| n.path.clone())
    }

    /// The inode of `path`, if the kernel knows it.
    pub fn ino(&self, path: &SharePath) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The inode for `path` (a new one if needed), with one more lookup counted, and `entry` remembered,
    /// also in the parent's listing as last seen: offline, the directory lists what was learned of its
    /// names since it was listed (a file made on the sharer and read here), not only the listing.
    pub fn looked_up(&mut self, path: SharePath, parent: u64, entry: Entry) -> u64 {
        let ino = self.ino_for(path, parent);
        let n = self.by_ino.get_mut(&ino).expect("just made");
        n.lookups += 1;
        n.entry = Some((entry.clone(), Instant::now()));
        n.stale = false;
        self.listed(parent, &entry);
        ino
    }

    /// The sharer said `path` does not exist: it leaves its parent's listing as last seen (so that offline
    /// the directory does not list a name that is gone).
    pub fn missing(&mut self, path: &SharePath) {
        self.unlisted(path);
        self.remembered.remove(path);
    }

    /// The inode for `path` without counting a lookup (readdir names inodes the kernel does not hold).
    pub fn ino_for(&mut self, path: SharePath, parent: u64) -> u64 {
        if let Some(&ino) = self.by_path.get(&path) {
            return ino;
        }
        let seen = self.remembered.remove(&path);
        let ino = match seen.as_ref().map(|r| r.ino) {
            Some(ino) if !self.by_ino.contains_key(&ino) => ino,
            _ => {
                self.next += 1;
                self.next - 1
            }
        };
        self.by_path.insert(path.clone(), ino);
        let mut n = node(path, parent);
        if let Some(r) = seen {
            // Old: asked again before any use online.
            n.entry = Some((r.entry, Instant::now()));
            n.stale = true;
            n.version = r.version;
            n.atime = r.atime;
            // As last seen, asked again before a lookup or readdir uses it online.
            n.listing = r.listing.map(|l| (l, Instant::now()));
            n.listing_stale = true;
        }
        self.by_ino.insert(ino, n);
        ino
    }

    /// The kernel dropped `n` lookups of `ino`; at zero the node goes (never the root).
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let Some(node) = self.by_ino.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 && !node.held {
            let node = self.by_ino.remove(&ino).expect("present");
            // A removed or renamed-over node no longer owns its path.
            if self.by_path.get(&node.path) != Some(&ino) {
                return;
            }
            self.by_path.remove(&node.path);
            if let Some((entry, _)) = node.entry {
                if self.remembered.len() >= REMEMBERED {
                    let drop: Vec<SharePath> = self
                        .remembered
                        .keys()
                        .take(REMEMBERED / 2)
                        .cloned()
                        .collect();
                    for p in drop {
                        self.remembered.remove(&p);
                    }
                }
                let seen = Remembered {
                    entry,
                    version: node.version,
                    ino,
                    atime: node.atime,
                    listing: node
                        .listing
                        .map(|(l, _)| l)
                        .filter(|l| l.len() <= REMEMBERED_LISTING),
                };
                self.remembered.insert(node.path, seen);
            }
        }
    }

    /// Keeps `ino` (and its path) while `held`, also after the kernel forgot it; let go, it goes once
    /// forgotten.
    pub fn hold(&mut self, ino: u64, held: bool) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.held = held;
        }
        if !held {
            self.forget(ino, 0);
        }
    }

    /// The entry of `ino` if still fresh (`fresh`) or whatever was last seen (`!fresh`, for offline use).
    pub fn entry(&self, ino: u64, fresh: bool) -> Option<Entry> {
        let n = self.by_ino.get(&ino)?;
        let (e, at) = n.entry.as_ref()?;
        (!fresh || (!n.stale && at.elapsed() < self.fresh_for)).then(|| e.clone())
    }

    /// Remembers the entry of `ino`, just learned.
    pub fn set_entry(&mut self, ino: u64, entry: Entry) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.entry = Some((entry, Instant::now()));
            n.stale = false;
        }
    }

    /// The listing of directory `ino`, fresh or last seen, as for [`Inodes::entry`].
    pub fn listing(&self, ino: u64, fresh: bool) -> Option<Listing> {
        let n = self.by_ino.get(&ino)?;
        let (l, at) = n.listing.as_ref()?;
        (!fresh || (!n.listing_stale && at.elapsed() < self.fresh_for)).then(|| Arc::clone(l))
    }

    /// What the listing of directory `ino` (fresh or last seen, as for [`Inodes::listing`]) says of
    /// `name`: `None` without such a listing, `Some(None)` when the name is not in it.
    pub fn listed_entry(&self, ino: u64, name: &[u8], fresh: bool) -> Option<Option<Entry>> {
        let l = self.listing(ino, fresh)?;
        let found = l.binary_search_by(|e| e.name.as_slice().cmp(name)).ok();
        Some(found.map(|i| l[i].clone()))
    }

    /// Remembers the listing of directory `ino`, and each child's entry for the inodes already known.
    pub fn set_listing(&mut self, ino: u64, entries: Listing) {
        let Some(n) = self.by_ino.get_mut(&ino) else {
            return;
        };
        let dir = n.path.clone();
        n.listing = Some((Arc::clone(&entries), Instant::now()));
        n.listing_stale = false;
        let now = Instant::now();
        for e in entries.iter() {
            let Some(path) = child(&dir, &e.name) else {
                continue;
            };
            if let Some(c) = self.by_path.get(&path).and_then(|i| self.by_ino.get_mut(i)) {
                c.entry = Some((e.clone(), now));
                c.stale = false;
            }
        }
    }

    /// The access time set at `ino` in the mount, if one was.
    pub fn atime(&self, ino: u64) -> Option<SystemTime> {
        self.by_ino.get(&ino)?.atime
    }

    /// Sets the access time shown at `ino` (the share carries none: kept here, with the path).
    pub fn set_atime(&mut self, ino: u64, atime: SystemTime) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.atime = Some(atime);
        }
    }

    /// How many directories the listing of `ino`, as last seen, holds (a directory's link count is two
    /// more).
    pub fn subdirs(&self, ino: u64) -> Option<usize> {
        let (l, _) = self.by_ino.get(&ino)?.listing.as_ref()?;
        Some(l.iter().filter(|e| e.kind == Kind::Dir).count())
    }

    /// The version last opened at `ino`.
    pub fn version(&self, ino: u64) -> Option<Version> {
        self.by_ino.get(&ino)?.version
    }

    /// Remembers the version opened at `ino`.
    pub fn set_version(&mut self, ino: u64, version: Version) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.version = Some(version);
        }
    }

    /// The entry last seen at `path`, also after the kernel forgot it (offline use).
    pub fn last_seen(&self, path: &SharePath) -> Option<Entry> {
        match self.by_path.get(path) {
            Some(ino) => self.entry(*ino, false),
            None => self.remembered.get(path).map(|r| r.entry.clone()),
        }
    }

    /// Whether `ino` may be opened with passthrough: no handle of it is open for classic reads.
    pub fn may_pass_through(&self, ino: u64) -> bool {
        self.by_ino.get(&ino).is_some_and(|n| n.classic_opens == 0)
    }

    /// The version `ino`'s open passthrough handles read, if any are open.
    pub fn passing_through(&self, ino: u64) -> Option<Version> {
        let n = self.by_ino.get(&ino)?;
        (n.passthrough.0 > 0).then_some(n.passthrough.1).flatten()
    }

    /// The file `ino`'s passthrough handles read holds `version` now (it grew: [`crate::fuse`]'s follow).
    pub fn passing_through_at(&mut self, ino: u64, version: Version) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            if n.passthrough.0 > 0 {
                n.passthrough.1 = Some(version);
                n.version = Some(version);
            }
        }
    }

    /// A handle of `ino` opened with passthrough at `Some(version)`, or released (`None`).
    pub fn passthrough_open(&mut self, ino: u64, opened: Option<Version>) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.passthrough = match opened {
                Some(v) => (n.passthrough.0.saturating_add(1), Some(v)),
                None => (n.passthrough.0.saturating_sub(1), n.passthrough.1),
            };
        }
    }

    /// A handle of `ino` opened (`true`) or released (`false`) for classic reads.
    pub fn classic_open(&mut self, ino: u64, opened: bool) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.classic_opens = match opened {
                true => n.classic_opens.saturating_add(1),
                false => n.classic_opens.saturating_sub(1),
            };
        }
    }

    /// `path` was made by this mount (create, mkdir, symlink) as `entry` in directory `parent`: a new inode
    /// (one lookup counted), and the parent's listing, if known, gains the name and stays as fresh as it
    /// was (a lookup of the next new name there answers without asking). A new directory is known empty.
    pub fn made(&mut self, path: SharePath, parent: u64, entry: Entry) -> u64 {
        // Whatever had the name before lives on only while the kernel holds it.
        self.by_path.remove(&path);
        self.remembered.remove(&path);
        let dir = entry.kind == Kind::Dir;
        self.listed(parent, &entry);
        let ino = self.looked_up(path, parent, entry);
        if dir {
            let n = self.by_ino.get_mut(&ino).expect("just made");
            n.listing = Some((Listing::default(), Instant::now()));
            n.listing_stale = false;
        }
        ino
    }

    /// This mount wrote `ino`'s content: `entry` is what the sharer has now (fresh), in its parent's
    /// listing too.
    pub fn wrote(&mut self, ino: u64, entry: Entry) {
        let Some(n) = self.by_ino.get_mut(&ino) else {
            return;
        };
        let parent = n.parent;
        n.entry = Some((entry.clone(), Instant::now()));
        n.stale = false;
        self.listed(parent, &entry);
    }

    /// `path`'s entry in its parent's listing as last seen.
    fn in_listing(&self, path: &SharePath) -> Option<Entry> {
        let (parent, name) = split_parent(path);
        let dir = *self.by_path.get(&parent)?;
        self.listed_entry(dir, name, false).flatten()
    }

    /// Takes `path`'s name out of its parent's listing, if the listing is known (fresh or not: it is what
    /// the mount shows offline).
    fn unlisted(&mut self, path: &SharePath) {
        if path.is_root() {
            return;
        }
        let (parent, name) = split_parent(path);
        let Some(&dir) = self.by_path.get(&parent) else {
            return;
        };
        let Some((listing, _)) = self.by_ino.get_mut(&dir).and_then(|n| n.listing.as_mut()) else {
            return;
        };
        if let Ok(i) = listing.binary_search_by(|e| e.name.as_slice().cmp(name)) {
            Arc::make_mut(listing).remove(i);
        }
    }

    /// Puts `entry` into `dir`'s listing (replacing the same name) if the listing is known, fresh or not.
    fn listed(&mut self, dir: u64, entry: &Entry) {
        let Some((listing, _)) = self.by_ino.get_mut(&dir).and_then(|n| n.listing.as_mut()) else {
            return;
        };
        let listing = Arc::make_mut(listing);
        match listing.binary_search_by(|e| e.name.cmp(&entry.name)) {
            Ok(i) => listing[i] = entry.clone(),
            Err(i) => listing.insert(i, entry.clone()),
        }
    }

    /// `path` was removed (by this mount): the name no longer leads to its inode, which lives on while
    /// the kernel holds it (an open file); a new file there gets a new inode.
    pub fn removed(&mut self, path: &SharePath) {
        self.changed(path);
        self.unlisted(path);
        self.by_path.remove(path);
        self.remembered.remove(path);
    }

    /// `from` was renamed to `to` (by this mount): its inode and those beneath it keep their numbers under
    /// the new paths; whatever was at `to` is removed.
    pub fn renamed(&mut self, from: &SharePath, to: &SharePath) {
        // The entry moves between the listings as last seen too, so that offline they show the rename.
        let moved_entry = self
            .last_seen(from)
            .or_else(|| self.in_listing(from))
            .map(|mut e| {
                e.name = split_parent(to).1.to_vec();
                e
            });
        self.changed(from);
        self.unlisted(from);
        self.removed(to);
        let new_parent = split_parent(to).0;
        let new_parent = self.by_path.get(&new_parent).copied();
        if let (Some(dir), Some(e)) = (new_parent, &moved_entry) {
            self.listed(dir, e);
        }
        // What was remembered of forgotten paths moves too: offline, a file read before under the old
        // name is found under the new one.
        let prefix_len = from.as_bytes().len();
        let remembered: Vec<SharePath> = self
            .remembered
            .keys()
            .filter(|p| *p == from || is_beneath(from, p))
            .cloned()
            .collect();
        for old in remembered {
            let mut p = to.as_bytes().to_vec();
            p.extend_from_slice(&old.as_bytes()[prefix_len..]);
            let (Some(seen), Ok(new)) = (self.remembered.remove(&old), SharePath::new(&p)) else {
                continue;
            };
            self.remembered.insert(new, seen);
        }
        let prefix = from.as_bytes().to_vec();
        let moved: Vec<u64> = self
            .by_path
            .get(from)
            .copied()
            .into_iter()
            .chain(self.beneath(from))
            .collect();
        for ino in moved {
            let n = self.by_ino.get_mut(&ino).expect("indexed");
            let mut p = to.as_bytes().to_vec();
            p.extend_from_slice(&n.path.as_bytes()[prefix.len()..]);
            let Ok(path) = SharePath::new(&p) else {
                continue;
            };
            self.by_path.remove(&n.path);
            if n.path == *from {
                if let Some(parent) = new_parent {
                    n.parent = parent;
                }
                if let (Some((e, _)), Some(moved)) = (n.entry.as_mut(), &moved_entry) {
                    e.name.clone_from(&moved.name);
                }
            }
            n.path = path.clone();
            n.stale = true;
            n.listing_stale = true;
            self.by_path.insert(path, ino);
        }
        self.changed(to);
    }

    /// `path` changed on the sharer: its node, its parent's listing and its descendants go stale; returns
    /// what the kernel must drop. The share's root means anything may have changed.
    pub fn changed(&mut self, path: &SharePath) -> Invalidations {
        let mut inv = Invalidations::default();
        let prefix = path.as_bytes();
        // A file (or symlink) has no descendants: its own node is all there is to find. Otherwise (a
        // directory, or a path this table does not hold, such as a file made on the sharer that the kernel
        // never looked up) its node and the range of paths beneath it: never a walk over every node, which
        // a burst of changes in a big tree would pay the square of its size for (10,000 files untarred into
        // a mount that knew 10,000 took twice the CPU per file). A node no path leads to any more (removed
        // or renamed over, while the kernel holds it) is not looked for.
        let leaf = self
            .by_path
            .get(path)
            .and_then(|i| self.by_ino.get(i))
            .is_some_and(|n| n.entry.is_some() && !is_dir_node(n));
        let own = self.by_path.get(path).copied();
        let walk: Vec<u64> = match leaf {
            true => own.into_iter().collect(),
            false => own.into_iter().chain(self.beneath(path)).collect(),
        };
        for ino in walk {
            let n = self.by_ino.get_mut(&ino).expect("indexed");
            let p = n.path.as_bytes();
            let inside = path.is_root()
                || p == prefix
                || (p.len() > prefix.len() && p.starts_with(prefix) && p[prefix.len()] == b'/');
            if !inside {
                continue;
            }
            n.stale = true;
            n.listing_stale = true;
            inv.inodes.push(ino);
            // A directory's own entry is not dropped: it may be a process's working directory, which
            // getcwd(2) could no longer name (git failed so). Its attributes and listing are asked again;
            // the kernel revalidates the name itself after the entry's timeout.
            if ino != ROOT && !is_dir_node(n) {
                inv.entries.push((n.parent, last_component(p).to_vec()));
            }
        }
        // The parent's listing changed too (a new or deleted name), and a name the kernel cached as
        // missing (a negative entry) must go.
        let a_dir = self
            .by_path
            .get(path)
            .and_then(|i| self.by_ino.get(i))
            .is_some_and(is_dir_node);
        if !path.is_root() {
            let (parent_path, name) = split_parent(path);
            if let Some(&pino) = self.by_path.get(&parent_path) {
                let pn = self.by_ino.get_mut(&pino).expect("indexed");
                pn.stale = true;
                pn.listing_stale = true;
                inv.inodes.push(pino);
                if !a_dir && !inv.entries.iter().any(|(p, n)| *p == pino && n == name) {
                    inv.entries.push((pino, name.to_vec()));
                }
            }
        }
        inv.inodes.sort_unstable();
        inv.inodes.dedup();
        inv
    }
}

/// Whether `path` lies beneath `dir` (not `dir` itself).
fn is_beneath(dir: &SharePath, path: &SharePath) -> bool {
    let (d, p) = (dir.as_bytes(), path.as_bytes());
    match dir.is_root() {
        true => !path.is_root(),
        false => p.len() > d.len() && p.starts_with(d) && p[d.len()] == b'/',
    }
}

/// Whether a node is a directory as last seen (an entry of kind Dir, or a listing).
fn is_dir_node(n: &Node) -> bool {
    n.listing.is_some() || n.entry.as_ref().is_some_and(|(e, _)| e.kind == Kind::Dir)
}

fn node(path: SharePath, parent: u64) -> Node {
    Node {
        path,
        parent,
        lookups: 0,
        entry: None,
        listing: None,
        version: None,
        stale: false,
        atime: None,
        listing_stale: false,
        held: false,
        classic_opens: 0,
        passthrough: (0, None),
    }
}

/// `dir/name`, or `None` when `name` is not a single safe component.
pub fn child(dir: &SharePath, name: &[u8]) -> Option<SharePath> {
    if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
        return None;
    }
    let mut p = dir.as_bytes().to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    SharePath::new(&p).ok()
}

fn last_component(p: &[u8]) -> &[u8] {
    p.rsplit(|&b| b == b'/').next().unwrap_or(p)
}

/// The parent of a non-root path, and its last component.
fn split_parent(path: &SharePath) -> (SharePath, &[u8]) {
    let p = path.as_bytes();
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => (
            SharePath::new(&p[..i]).expect("a prefix of a valid path"),
            &p[i + 1..],
        ),
        None => (SharePath::root(), p),
    }
}

/// Whether an entry is a directory.
pub fn is_dir(e: &Entry) -> bool {
    e.kind == Kind::Dir
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, size: u64) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            kind: Kind::File,
            size,
            mode: 0o644,
            mtime: 0,
            mtime_nsec: 0,
            target: Vec::new(),
        }
    }

    fn p(s: &str) -> SharePath {
        SharePath::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn a_rename_moves_the_inode_and_its_descendants_and_a_removal_frees_the_name() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let d = t.looked_up(p("d"), ROOT, file("d", 0));
        let f = t.looked_up(p("d/f"), d, file("f", 5));
        let e = t.looked_up(p("e"), ROOT, file("e", 0));
        let old = t.looked_up(p("x"), ROOT, file("x", 1));
        t.renamed(&p("d"), &p("x"));
        assert_eq!(t.path(d), Some(p("x")));
        assert_eq!(t.path(f), Some(p("x/f")));
        assert_eq!(t.ino(&p("x/f")), Some(f));
        assert_eq!(t.ino(&p("d")), None);
        assert_eq!(t.ino(&p("d/f")), None);
        // The inode renamed over keeps living for the kernel, under no path; its forget frees nothing else.
        t.forget(old, 1);
        assert_eq!(t.ino(&p("x")), Some(d));
        t.renamed(&p("x/f"), &p("e/f"));
        assert_eq!(t.path(f), Some(p("e/f")));
        t.removed(&p("e/f"));
        assert_eq!(t.ino(&p("e/f")), None);
        let g = t.ino_for(p("e/f"), e);
        assert_ne!(g, f, "a new file at a removed name is a new inode");
        t.forget(f, 1);
        assert_eq!(t.ino(&p("e/f")), Some(g));
    }

    /// A changed directory reaches exactly the paths beneath it, also past names that sort between it
    /// and its children (`d-x`, `d.x`) or just after them (`d0`), and a path the table does not hold
    /// reaches what is still held beneath it.
    #[test]
    fn a_change_reaches_exactly_the_paths_beneath_it() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let mut dir = file("d", 0);
        dir.kind = Kind::Dir;
        let d = t.looked_up(p("d"), ROOT, dir.clone());
        let e = t.looked_up(p("d/e"), d, dir.clone());
        let inside = [
            d,
            t.looked_up(p("d/f"), d, file("f", 1)),
            e,
            t.looked_up(p("d/e/g"), e, file("g", 1)),
        ];
        let outside = [
            t.looked_up(p("d-x"), ROOT, file("d-x", 1)),
            t.looked_up(p("d.x"), ROOT, file("d.x", 1)),
            t.looked_up(p("d0"), ROOT, file("d0", 1)),
            t.looked_up(p("dz"), ROOT, file("dz", 1)),
            t.looked_up(p("c"), ROOT, file("c", 1)),
        ];
        let reached = |inv: &Invalidations| {
            let mut got: Vec<u64> = inv.inodes.iter().copied().filter(|&i| i != ROOT).collect();
            got.sort_unstable();
            got.dedup();
            got
        };
        let mut want = inside.to_vec();
        want.sort_unstable();
        assert_eq!(reached(&t.changed(&p("d"))), want);
        for o in outside {
            assert!(t.changed(&p("d")).inodes.iter().all(|&i| i != o));
        }
        // The root reaches everything.
        let mut all: Vec<u64> = inside.iter().chain(&outside).copied().collect();
        all.sort_unstable();
        assert_eq!(reached(&t.changed(&SharePath::root())), all);
        // A path not held (a sharer's temp file) reaches nothing but its parent's listing.
        let inv = t.changed(&p("d/.ferry-put-0123"));
        assert_eq!(inv.inodes, vec![d]);
        // Nor does a removed directory's name hide what is still held beneath it (and its parent's
        // listing goes stale).
        t.removed(&p("d/e"));
        assert_eq!(reached(&t.changed(&p("d/e"))), vec![d, inside[3]]);
        // A rename moves the same set.
        t.renamed(&p("d"), &p("q"));
        assert_eq!(t.path(inside[1]), Some(p("q/f")));
        assert_eq!(t.path(outside[0]), Some(p("d-x")));
        assert_eq!(t.path(outside[2]), Some(p("d0")));
    }

    #[test]
    fn a_lookup_of_a_directory_does_not_make_its_changed_listing_fresh_again() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let d = t.looked_up(p("d"), ROOT, file("d", 0));
        t.set_listing(d, listing_of(vec![file("f", 28)]));
        t.changed(&p("d/f"));
        assert!(t.listing(d, true).is_none());
        t.looked_up(p("d"), ROOT, file("d", 0));
        assert!(t.listing(d, true).is_none(), "still stale");
        assert_eq!(
            t.listing(d, false).unwrap()[0].size,
            28,
            "kept for offline use"
        );
        t.set_listing(d, listing_of(vec![file("f", 8)]));
        assert_eq!(t.listing(d, true).unwrap()[0].size, 8);
    }

    #[test]
    fn a_held_inode_outlives_the_kernels_forget_until_let_go() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let a = t.looked_up(p("a"), ROOT, file("a", 1));
        t.hold(a, true);
        t.forget(a, 1);
        assert_eq!(t.path(a), Some(p("a")));
        assert_eq!(
            t.looked_up(p("a"), ROOT, file("a", 1)),
            a,
            "the same inode again"
        );
        t.hold(a, false);
        assert_eq!(t.path(a), Some(p("a")), "still looked up");
        t.forget(a, 1);
        assert_eq!(t.path(a), None);
        let b = t.looked_up(p("b"), ROOT, file("b", 1));
        t.hold(b, true);
        t.forget(b, 1);
        t.hold(b, false);
        assert_eq!(t.path(b), None, "let go after the forget: gone");
    }

    #[test]
    fn children_are_single_components() {
        assert_eq!(child(&SharePath::root(), b"a"), Some(p("a")));
        assert_eq!(child(&p("a"), b"b"), Some(p("a/b")));
        for bad in [&b""[..], b".", b"..", b"x/y"] {
            assert_eq!(child(&p("a"), bad), None, "{bad:?}");
        }
    }

    #[test]
    fn lookups_are_counted_and_forgotten() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let a = t.looked_up(p("a"), ROOT, file("a", 1));
        assert_eq!(t.looked_up(p("a"), ROOT, file("a", 2)), a);
        assert_eq!(t.entry(a, true).unwrap().size, 2);
        t.forget(a, 1);
        assert_eq!(t.path(a), Some(p("a")));
        t.forget(a, 1);
        assert_eq!(t.path(a), None);
        assert_eq!(t.ino(&p("a")), None);
        t.forget(ROOT, 5);
        assert_eq!(t.path(ROOT), Some(SharePath::root()));
    }

    #[test]
    fn a_forgotten_path_is_remembered_with_its_version_for_offline_use() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let a = t.looked_up(p("a"), ROOT, file("a", 7));
        let v = Version {
            root: [3; 32],
            size: 7,
        };
        t.set_version(a, v);
        t.forget(a, 1);
        assert_eq!(t.ino(&p("a")), None);
        assert_eq!(t.last_seen(&p("a")).unwrap().size, 7);
        let a = t.ino_for(p("a"), ROOT);
        assert_eq!(t.version(a), Some(v));
        assert_eq!(t.entry(a, true), None, "not fresh: asked again online");
        assert_eq!(t.entry(a, false).unwrap().size, 7);
    }

    #[test]
    fn an_open_classic_handle_bars_passthrough_until_released() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let a = t.looked_up(p("a"), ROOT, file("a", 1));
        assert!(t.may_pass_through(a));
        t.classic_open(a, true);
        t.classic_open(a, true);
        t.classic_open(a, false);
        assert!(!t.may_pass_through(a));
        t.classic_open(a, false);
        assert!(t.may_pass_through(a));
        assert!(!t.may_pass_through(a + 1), "an unknown inode");
        let v = Version {
            root: [1; 32],
            size: 1,
        };
        assert_eq!(t.passing_through(a), None);
        t.passthrough_open(a, Some(v));
        t.passthrough_open(a, Some(v));
        t.passthrough_open(a, None);
        assert_eq!(t.passing_through(a), Some(v));
        t.passthrough_open(a, None);
        assert_eq!(t.passing_through(a), None);
    }

    #[test]
    fn a_change_invalidates_the_path_its_descendants_and_its_parent_but_keeps_what_was_seen() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let mut dir = file("d", 0);
        dir.kind = Kind::Dir;
        let d = t.looked_up(p("d"), ROOT, dir);
        let f = t.looked_up(p("d/f"), d, file("f", 5));
        let g = t.looked_up(p("d/g"), d, file("g", 5));
        let other = t.looked_up(p("dd"), ROOT, file("dd", 1));
        let inv = t.changed(&p("d/f"));
        assert_eq!(inv.inodes, vec![d, f]);
        assert_eq!(inv.entries, vec![(d, b"f".to_vec())]);
        assert!(t.entry(f, true).is_none(), "stale");
        assert_eq!(t.entry(f, false).unwrap().size, 5, "kept for offline use");
        assert!(t.entry(g, true).is_some());
        let inv = t.changed(&p("d"));
        assert!(inv.inodes.contains(&g) && !inv.inodes.contains(&other));
        // A directory's own name stays (it may be a working directory); its files' names go.
        assert!(inv.entries.contains(&(d, b"g".to_vec())));
        assert!(!inv.entries.iter().any(|(_, n)| n == b"d"), "{inv:?}");
        let all = t.changed(&SharePath::root());
        assert_eq!(all.inodes.len(), 5);
    }

    #[test]
    fn a_listing_refreshes_the_known_children() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let f = t.looked_up(p("f"), ROOT, file("f", 1));
        t.changed(&p("f"));
        t.set_listing(ROOT, listing_of(vec![file("new", 3), file("f", 9)]));
        assert_eq!(t.entry(f, true).unwrap().size, 9);
        assert_eq!(t.listing(ROOT, true).unwrap().len(), 2);
    }

    #[test]
    fn a_listing_is_sorted_one_entry_per_name_and_found_by_name() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let names: Vec<String> = (0..1000).rev().map(|i| format!("f{i:04}")).collect();
        let mut entries: Vec<Entry> = names.iter().map(|n| file(n, 1)).collect();
        // A sharer that names one twice is believed once.
        entries.push(file("f0500", 2));
        t.set_listing(ROOT, listing_of(entries));
        let l = t.listing(ROOT, true).unwrap();
        assert_eq!(l.len(), 1000);
        assert!(l.windows(2).all(|w| w[0].name < w[1].name));
        assert_eq!(
            t.listed_entry(ROOT, b"f0007", true).unwrap().unwrap().name,
            b"f0007"
        );
        assert_eq!(t.listed_entry(ROOT, b"nope", true), Some(None));
        assert_eq!(t.listed_entry(4242, b"f0007", true), None);
        // What this mount makes goes in at its place; the listing handed out before stays as it was.
        t.made(p("f0007x"), ROOT, file("f0007x", 5));
        let after = t.listing(ROOT, true).unwrap();
        assert_eq!(after.len(), 1001);
        assert_eq!(l.len(), 1000);
        assert!(after.windows(2).all(|w| w[0].name < w[1].name));
        assert_eq!(
            t.listed_entry(ROOT, b"f0007x", true).unwrap().unwrap().size,
            5
        );
        // Stale: not fresh, but still known for offline use.
        t.changed(&p("f0001"));
        assert_eq!(t.listed_entry(ROOT, b"f0001", true), None);
        assert!(t.listed_entry(ROOT, b"f0001", false).unwrap().is_some());
    }

    #[test]
    fn the_listing_as_last_seen_keeps_what_the_mount_did_and_learned_since() {
        let mut t = Inodes::new(Duration::from_secs(60));
        t.set_listing(ROOT, listing_of(vec![file("a.txt", 1)]));
        let a = t.looked_up(p("a.txt"), ROOT, file("a.txt", 1));
        // touch t; rm t; mv a.txt b.txt; and a file made on the sharer, then read here.
        t.made(p("t"), ROOT, file("t", 0));
        t.removed(&p("t"));
        t.renamed(&p("a.txt"), &p("b.txt"));
        t.changed(&SharePath::root());
        t.looked_up(p("new"), ROOT, file("new", 3));
        // Offline (the listing is stale): what the mount shows is what it did and learned.
        assert_eq!(t.listing(ROOT, true), None);
        let names: Vec<Vec<u8>> = t
            .listing(ROOT, false)
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(names, [b"b.txt".to_vec(), b"new".to_vec()]);
        assert_eq!(t.entry(a, false).unwrap().name, b"b.txt");
        // A name the sharer says is gone leaves the listing too.
        t.missing(&p("new"));
        assert_eq!(t.listing(ROOT, false).unwrap().len(), 1);
    }

    #[test]
    fn a_path_looked_up_again_gets_its_inode_number_and_access_time_back() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let f = t.looked_up(p("f"), ROOT, file("f", 1));
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000_000);
        t.set_atime(f, at);
        t.forget(f, 1);
        assert_eq!(t.ino(&p("f")), None);
        let again = t.looked_up(p("f"), ROOT, file("f", 1));
        assert_eq!(again, f, "the same number, as on a local disk");
        assert_eq!(t.atime(again), Some(at));
    }

    #[test]
    fn a_forgotten_file_is_remembered_under_the_name_a_rename_of_its_directory_gave_it() {
        let mut t = Inodes::new(Duration::from_secs(60));
        let d = t.looked_up(p("d"), ROOT, file("d", 0));
        let x = t.looked_up(p("d/x"), d, file("x", 1));
        t.forget(x, 1);
        t.renamed(&p("d"), &p("d2"));
        assert_eq!(t.last_seen(&p("d2/x")).unwrap().size, 1);
        assert_eq!(t.last_seen(&p("d/x")), None);
    }
}
