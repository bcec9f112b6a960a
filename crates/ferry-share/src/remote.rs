//! A share used from many threads at once, over a link that can die and come back: what `ferry mount` asks
//! the sharer through.
//!
//! One [`Client`] state machine per connection, under a mutex, is shared by every caller. A caller issues
//! its request under that mutex (waiting there while the sharer's in-flight limit is used, never getting a
//! busy error) and gets a channel of its own; a reader thread owns the connection's [`SecureReader`], feeds
//! each packet to the client and routes the verified event by request id to that channel. A large packet
//! is handed to the client in the buffer it was received in, so a piece that brings a whole read reaches
//! its caller in that buffer, not copied ([`Client::handle_owned`]; the buffers come back to the
//! connection's [`Pool`]). Packets go out
//! under the writer's mutex: whoever holds it sends everything the client queued, in order, so a cancel
//! always reaches the sharer before the request that reuses its slot.
//!
//! A supervisor thread per [`Remote`] keeps the link: it probes an idle link (a stat of the root), declares it
//! lost when nothing came for [`RemoteConfig::deadline`] while answers were due, and redials with backoff
//! through the [`Dial`] closure, re-subscribing to changes and announcing a change of the root ("anything
//! may have changed") once it is back.
//!
//! Every wait has a deadline counted from the request's last progress (its last piece), so a long read on a
//! slow link never times out while pieces keep coming, and a request made while the link is down waits for
//! the redial until its deadline. Memory: the pieces of a read queue for its [`ReadHandle`] until taken, so
//! what a slow consumer piles up is bounded by the lengths of its reads in flight (the caller's choice), and
//! at most the sharer's in-flight limit of requests is ever issued.

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use ferry_channel::blocking::{Received, SecureReader, SecureWriter};
use ferry_channel::ChannelError;

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use crate::bytes::{Bytes, Pool};
use crate::client::{Busy, Client, Event, Failure, Listing, PutError, DEFAULT_MAX_LISTING};
use crate::tree::{GroupCv, Version};
use crate::wire::{
    Entry, ErrorCode, PutHeader, RequestId, SharePath, Space, Time, END, MAX_PAGE_ENTRIES,
    MAX_PUT_DATA, PUT_DATA_HEADER_LEN,
};
use crate::write::RunningRoot;

/// How to (re)open the channel to the sharer: the CLI passes a closure that reaches the paired peer
/// (ferry-cli's `paired::open_share` does the reaching today). Called again after a connection is lost.
pub type Dial = Box<
    dyn Fn() -> Result<(SecureReader<TcpStream>, SecureWriter<TcpStream>), String> + Send + Sync,
>;

/// Gets every change notification of the share.
pub type OnChange = Box<dyn Fn(Vec<SharePath>) + Send + Sync>;

/// Gets every change of the link's state.
pub type OnLink = Box<dyn Fn(LinkState) + Send + Sync>;

/// How a [`Remote`] uses its link.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Most requests in flight (the sharer may lower it); more wait for a slot. A thread holding that many
    /// unfinished [`ReadHandle`]s waits in its next request until one is finished or dropped.
    pub max_in_flight: u32,
    /// How long a request may go without progress (an answer, a piece, the link back) before it fails; also
    /// how long the link may stay silent while answers are due before it is declared lost.
    pub deadline: Duration,
    /// The first and the longest pause between two redials (doubling in between).
    pub redial_backoff: (Duration, Duration),
    /// A link idle this long is probed (a stat of the root), so a vanished sharer is noticed.
    pub keepalive: Duration,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            max_in_flight: 64,
            deadline: Duration::from_secs(10),
            redial_backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            keepalive: Duration::from_secs(5),
        }
    }
}

/// Packets with at least this many bytes of contents are kept in the buffer they were received in and handed
/// to the client ([`Client::handle_owned`]): a piece that brings a whole read then reaches the reader
/// without a copy. Smaller ones are copied out, so a small piece never pins a 1 MiB buffer.
const TAKE_FROM: usize = 256 << 10;

/// Idle receive buffers a connection keeps for the next large packets (the others are freed).
const POOL_KEEP: usize = 16;

/// Why a dial failed when the sharer closed the connection before its hello ([`RemoteError::Disconnected`]
/// carries it): what a sharer does to a client it refuses (not paired, not allowed, full).
pub const CLOSED_BEFORE_HELLO: &str = "the sharer closed the connection before its hello";

/// What the link is doing, for the mount to print ("lost", "back").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// The first connection is open.
    Up,
    /// The connection was lost (why); requests wait for the redial until their deadline.
    Lost(String),
    /// A new connection is open after a loss.
    Back,
}

/// Why a request of a [`Remote`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The sharer's refusal (not-found, changed, ...).
    #[error("{msg}: {1}", msg = .0.as_str())]
    Remote(ErrorCode, String),
    /// Data did not verify.
    #[error("data did not verify")]
    Integrity,
    /// No answer within the deadline.
    #[error("no answer within the deadline")]
    Deadline,
    /// The link is down and was not back within the deadline.
    #[error("the link to the sharer is down: {0}")]
    Disconnected(String),
    /// The [`Remote`] was shut down.
    #[error("closed")]
    Closed,
    /// The local copy a write sends could not be read.
    #[error("reading the local copy: {0}")]
    Local(String),
    /// An answer larger than the client takes (a listing past its limit).
    #[error("{0}")]
    TooLarge(String),
    /// The caller stopped the request (its process was interrupted): a put's partial content is dropped
    /// on the sharer.
    #[error("stopped before it was done")]
    Stopped,
}

impl RemoteError {
    /// The errno a file system reports for it: `ENOENT`, `ENOTDIR`, `EACCES`, `ESTALE` for a changed file
    /// (and a write's conflict), `EROFS` for a share that is not writable, `EEXIST`, `ENOTEMPTY`, `ENOSPC`,
    /// `EIO` for integrity, deadline and a lost link, `ENOTCONN` once closed.
    pub fn errno(&self) -> i32 {
        use rustix::io::Errno;
        let e = match self {
            RemoteError::Remote(code, _) => match code {
                ErrorCode::NotFound => Errno::NOENT,
                ErrorCode::WrongKind => Errno::NOTDIR,
                ErrorCode::UnsafePath | ErrorCode::Permission => Errno::ACCESS,
                ErrorCode::Changed => Errno::STALE,
                ErrorCode::Busy => Errno::AGAIN,
                ErrorCode::BadRequest => Errno::INVAL,
                ErrorCode::Cancelled => Errno::CANCELED,
                ErrorCode::Io | ErrorCode::Integrity => Errno::IO,
                ErrorCode::ReadOnly => Errno::ROFS,
                // The sharer's file is no longer the version the write was based on: the caller's view is
                // stale (as for a read of a changed file).
                ErrorCode::Conflict => Errno::STALE,
                ErrorCode::DiskFull => Errno::NOSPC,
                ErrorCode::Exists => Errno::EXIST,
                ErrorCode::NotEmpty => Errno::NOTEMPTY,
                // chmod(2)'s answer to a change it may not make.
                ErrorCode::HardLinked => Errno::PERM,
            },
            RemoteError::Integrity
            | RemoteError::Deadline
            | RemoteError::Disconnected(_)
            | RemoteError::Local(_) => Errno::IO,
            RemoteError::TooLarge(_) => Errno::NOMEM,
            RemoteError::Closed => Errno::NOTCONN,
            RemoteError::Stopped => Errno::INTR,
        };
        e.raw_os_error()
    }
}

impl From<Failure> for RemoteError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Remote(code, message) => RemoteError::Remote(code, message),
            Failure::Integrity => RemoteError::Integrity,
        }
    }
}

/// What a [`Remote::put`] sends: a local file, and how it lands.
#[derive(Clone, Copy)]
pub struct PutContent<'a> {
    /// The content (its whole length).
    pub file: &'a File,
    /// Only these ranges of `file` are sent: the sharer starts from its copy of the put's base.
    pub ranges: Option<&'a [Range<u64>]>,
    /// The permission bits the file gets.
    pub mode: u32,
    /// The modification time the file gets (`None`: the sharer's clock).
    pub mtime: Option<Time>,
    /// Asked between chunks (keep it cheap): `true` ends the put at once.
    pub stop: &'a dyn Fn() -> bool,
}

impl<'a> PutContent<'a> {
    /// `file`, sent until it is done.
    pub fn new(
        file: &'a File,
        ranges: Option<&'a [Range<u64>]>,
        mode: u32,
        mtime: Option<Time>,
    ) -> Self {
        PutContent {
            file,
            ranges,
            mode,
            mtime,
            stop: &|| false,
        }
    }

    /// The same content, ended at once when `stop` says so.
    pub fn stopped_by(self, stop: &'a dyn Fn() -> bool) -> Self {
        PutContent { stop, ..self }
    }
}

/// How a [`Remote::put`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// The sharer's file is the new content now: this version (the base of the next write).
    Written {
        /// The new content's size and root.
        version: Version,
    },
    /// The sharer's file had changed since the put's base: it stayed as it is, and the new content was kept
    /// beside it (same directory) under `name`.
    Conflicted {
        /// The sibling's name.
        name: Vec<u8>,
    },
}

/// One event of a read, as [`ReadHandle::next`] hands it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadPiece {
    /// The version the read is served from (first).
    Version(Version),
    /// Verified bytes from `offset` (in offset order).
    Data {
        /// Offset of the first byte.
        offset: u64,
        /// The bytes (in the buffer their packet came in, when it brought a whole read).
        bytes: Bytes,
        /// The verified value of each group the bytes make up, in order (empty when the read's ends cut
        /// a group): what a cache keeps to check its copy, without hashing the bytes again.
        cvs: Vec<GroupCv>,
    },
}

/// A share used from many threads at once: `Send + Sync`, cheap to clone. Dropping the last clone stops its
/// threads and closes the connection.
#[derive(Clone)]
pub struct Remote {
    owner: Arc<Owner>,
}

/// Closes the link when the last [`Remote`] goes (threads and handles hold [`Shared`], not this).
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// What a request's channel carries.
enum Msg {
    /// Events in order; a read's version and its last piece wait for the event after them, so a small read
    /// wakes its caller once, not three times.
    Events(Vec<Event>),
    Lost(String),
}

/// What the notice thread hands to the callbacks.
enum Notice {
    Changed(Vec<SharePath>),
    Link(LinkState),
}

/// Where a request's events go.
struct Route {
    tx: Sender<Msg>,
    /// For a read: where its data ends (the range asked, then cut at the file's end).
    end: u64,
    held: Vec<Event>,
}

impl Route {
    /// Hands on `event` (with those held before it), or holds it when the next one follows at once.
    fn route(&mut self, event: Event) {
        let hold = match &event {
            Event::Version { version, .. } => {
                self.end = self.end.min(version.size);
                true
            }
            Event::Data { offset, bytes, .. } => offset + bytes.len() as u64 >= self.end,
            _ => false,
        };
        self.held.push(event);
        if !hold {
            // A probe's channel has no receiver.
            let _ = self.tx.send(Msg::Events(std::mem::take(&mut self.held)));
        }
    }
}

struct Shared {
    config: RemoteConfig,
    dial: Dial,
    /// To the thread that calls `on_change` and `on_link`; taken at close.
    notices: Mutex<Option<Sender<Notice>>>,
    share: Vec<u8>,
    /// Lock order: `writer` before `state`; the reader threads take only `state`.
    writer: Mutex<Option<(u64, SecureWriter<TcpStream>)>>,
    state: Mutex<State>,
    /// A slot was freed or the link came or went: for callers waiting to issue.
    room: Condvar,
    /// The link was lost or the remote closed: for the supervisor.
    wake: Condvar,
}

struct State {
    link: Option<Link>,
    generation: u64,
    closed: bool,
    /// Why the link is down, and since when.
    lost: String,
    lost_at: Instant,
    /// Why the last redial failed (empty while none failed).
    redial: String,
    /// Callers waiting in [`Shared::issue`].
    waiters: usize,
}

/// One connection's session.
struct Link {
    generation: u64,
    client: Client,
    routes: HashMap<RequestId, Route>,
    /// A clone of the connection's socket, to cut it.
    stream: TcpStream,
    /// When the sharer was last heard from, or when answers became due after an idle time.
    quiet_since: Instant,
    /// The client has packets queued that no flush took yet.
    unsent: bool,
}

/// A connection dialled and greeted, not yet in use.
struct Opened {
    reader: SecureReader<TcpStream>,
    writer: SecureWriter<TcpStream>,
    stream: TcpStream,
    client: Client,
    share: Vec<u8>,
}

impl State {
    /// Why the link is down, for [`RemoteError::Disconnected`].
    fn why_down(&self) -> String {
        match self.redial.is_empty() {
            true => self.lost.clone(),
            false => format!("{}; redialling: {}", self.lost, self.redial),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Remote {
    /// Dials once (an error here is the caller's: nothing to mount), opens the session (hellos), starts the
    /// IO threads. `on_change` gets every change notification (subscribing is automatic, and is renewed
    /// after a reconnect, followed by one synthetic change of the share's root: "anything may have
    /// changed"); `on_link` gets the link's state changes. Both run on a thread of their own, one call at a
    /// time in order, so they may use the remote themselves.
    pub fn connect(
        dial: Dial,
        config: RemoteConfig,
        on_change: OnChange,
        on_link: OnLink,
    ) -> Result<Remote, RemoteError> {
        let opened = open(&dial, &config).map_err(RemoteError::Disconnected)?;
        let (notices, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("ferry-remote-note".into())
            .spawn(move || {
                for notice in rx {
                    match notice {
                        Notice::Changed(paths) => on_change(paths),
                        Notice::Link(state) => on_link(state),
                    }
                }
            })
            .map_err(|e| RemoteError::Disconnected(e.to_string()))?;
        let shared = Arc::new(Shared {
            config,
            dial,
            notices: Mutex::new(Some(notices)),
            share: opened.share.clone(),
            writer: Mutex::new(None),
            state: Mutex::new(State {
                link: None,
                generation: 0,
                closed: false,
                lost: String::new(),
                lost_at: Instant::now(),
                redial: String::new(),
                waiters: 0,
            }),
            room: Condvar::new(),
            wake: Condvar::new(),
        });
        shared.notify(Notice::Link(LinkState::Up));
        // Closes the link if anything below fails.
        let owner = Owner(Arc::clone(&shared));
        if !shared.install(opened) {
            return Err(RemoteError::Disconnected(lock(&shared.state).why_down()));
        }
        std::thread::Builder::new()
            .name("ferry-remote-link".into())
            .spawn(move || shared.supervise())
            .map_err(|e| RemoteError::Disconnected(e.to_string()))?;
        Ok(Remote {
            owner: Arc::new(owner),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.owner.0
    }

    /// The share's name, from the sharer's first hello; a redial that reaches a sharer of another name is
    /// refused (the link stays down, requests fail with that reason).
    pub fn share(&self) -> Vec<u8> {
        self.shared().share.clone()
    }

    /// Whether the link is up now (it may go down the next moment; requests wait for it anyway).
    pub fn is_up(&self) -> bool {
        lock(&self.shared().state).link.is_some()
    }

    /// The attributes of `path`. Retried on a new connection if the link is lost before the answer, within
    /// the deadline.
    pub fn stat(&self, path: &SharePath) -> Result<Entry, RemoteError> {
        let s = self.shared();
        s.retrying(|since| {
            let request = s.issue(since, END, |c| c.stat(path.clone()))?;
            match s.wait(&request)?.pop() {
                Some(Event::Attr { entry, .. }) => Ok(entry),
                other => Err(unexpected(other)),
            }
        })
    }

    /// The size and free space of the file system the share is on. Retried as [`Remote::stat`].
    pub fn space(&self) -> Result<Space, RemoteError> {
        let s = self.shared();
        s.retrying(|since| {
            let request = s.issue(since, END, |c| c.space())?;
            match s.wait(&request)?.pop() {
                Some(Event::Space { space, .. }) => Ok(space),
                other => Err(unexpected(other)),
            }
        })
    }

    /// Every entry of the directory `path`, all pages, within [`DEFAULT_MAX_LISTING`] (the mount's
    /// daemon may run as root: a sharer must not make it hold more).
    pub fn list(&self, path: &SharePath) -> Result<Vec<Entry>, RemoteError> {
        let s = self.shared();
        let mut all = Listing::new(DEFAULT_MAX_LISTING);
        let mut cursor = 0;
        while cursor != END {
            let (entries, next) = s.retrying(|since| {
                let request = s.issue(since, END, |c| {
                    c.list(path.clone(), cursor, MAX_PAGE_ENTRIES)
                })?;
                match s.wait(&request)?.pop() {
                    Some(Event::Entries { entries, next, .. }) => Ok((entries, next)),
                    other => Err(unexpected(other)),
                }
            })?;
            all.add(entries)
                .map_err(|e| RemoteError::TooLarge(e.to_string()))?;
            cursor = next;
        }
        Ok(all.into_entries())
    }

    /// Starts a verified read of `len` bytes from `offset` (cut at the end of the file), of `version` if
    /// given; pieces arrive on the handle. They queue there until taken, so `len` bounds what a slow
    /// consumer piles up. Dropping the handle cancels the request. A link lost under it fails the handle
    /// with [`RemoteError::Disconnected`] (to read again, pinned to the version it named); [`Remote::read_into`]
    /// does that by itself.
    pub fn read(
        &self,
        path: &SharePath,
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    ) -> Result<ReadHandle, RemoteError> {
        self.read_since(Instant::now(), path, version, offset, len)
    }

    /// The whole range into `buf`: returns the version and the bytes read (short only at the end of the
    /// file). A link lost in the middle is redialled within the deadline and the rest read from the same
    /// version (or [`ErrorCode::Changed`]), never a mix.
    pub fn read_into(
        &self,
        path: &SharePath,
        version: Option<[u8; 32]>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(Version, usize), RemoteError> {
        let s = self.shared();
        let mut done = 0usize;
        let mut known: Option<Version> = None;
        let began = Instant::now();
        let mut progress = began;
        loop {
            let pinned = known.map(|v| v.root).or(version);
            let at = offset + done as u64;
            if done == buf.len() && known.is_some() {
                break;
            }
            let attempt = (|| {
                let mut handle =
                    self.read_since(progress, path, pinned, at, (buf.len() - done) as u64)?;
                while let Some(piece) = handle.next()? {
                    progress = Instant::now();
                    match piece {
                        ReadPiece::Version(v) => known = Some(v),
                        ReadPiece::Data {
                            offset: o, bytes, ..
                        } => {
                            // The client hands on pieces in order and inside the range asked.
                            let from =
                                usize::try_from(o - offset).map_err(|_| RemoteError::Integrity)?;
                            if from != done || from + bytes.len() > buf.len() {
                                return Err(RemoteError::Integrity);
                            }
                            buf[from..from + bytes.len()].copy_from_slice(&bytes);
                            done += bytes.len();
                        }
                    }
                }
                Ok(())
            })();
            match attempt {
                Ok(()) => break,
                Err(RemoteError::Disconnected(_))
                    if progress.elapsed() < s.config.deadline && s.lost_since(began) => {}
                Err(e) => return Err(e),
            }
        }
        known.map(|v| (v, done)).ok_or(RemoteError::Integrity)
    }

    fn read_since(
        &self,
        since: Instant,
        path: &SharePath,
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    ) -> Result<ReadHandle, RemoteError> {
        let s = self.shared();
        let end = offset.saturating_add(len);
        let request = s.issue(since, end, |c| c.read(path.clone(), version, offset, len))?;
        Ok(ReadHandle {
            shared: Arc::clone(s),
            request,
            queue: VecDeque::new(),
            ended: false,
        })
    }

    /// Writes the content of `content.file` (its whole length) to `path`. `base`: the root of the sharer's
    /// version the content derives from (`None`: the caller believes `path` does not exist). With
    /// `content.ranges`, only those ranges are sent and the sharer starts from its copy of `base` (cut or
    /// zero-extended to the file's length: a truncate sends no range); if that copy is gone, the whole content
    /// is sent instead (and conflicts). The sharer verifies the content's root before anything becomes
    /// visible, then lands it or keeps it beside a file that changed since `base` ([`PutOutcome::Conflicted`]):
    /// nothing is lost. `content.stop`, asked between chunks, ends the put at once ([`RemoteError::Stopped`]).
    ///
    /// The data sent counts as progress for the deadlines. A link lost before the put's end retries it on the
    /// next connection (the sharer dropped the partial content); one lost after its end first looks whether
    /// the content landed.
    pub fn put(
        &self,
        path: &SharePath,
        base: Option<[u8; 32]>,
        content: PutContent<'_>,
    ) -> Result<PutOutcome, RemoteError> {
        let PutContent {
            file,
            ranges,
            mode,
            mtime,
            stop,
        } = content;
        let s = self.shared();
        let local = |e: std::io::Error| RemoteError::Local(e.to_string());
        let size = file.metadata().map_err(local)?.len();
        // Known once the content went out whole: hashed as it went (or read back for what did not).
        let mut version: Option<Version> = None;
        let whole = 0..size;
        let mut from_base = ranges.is_some() && base.is_some();
        let began = Instant::now();
        let mut progress = began;
        loop {
            let sent = match ranges {
                Some(ranges) if from_base => ranges,
                _ => std::slice::from_ref(&whole),
            };
            let mut ended = false;
            let attempt = (|| {
                let request = s.issue(progress, END, |c| {
                    c.put(PutHeader {
                        path: path.clone(),
                        base,
                        from_base,
                        size,
                        mode,
                        mtime,
                    })
                })?;
                let chunk = s.put_chunk();
                let mut buf = Vec::new();
                let mut running = RunningRoot::new();
                let mut refused = false;
                'send: for range in sent {
                    let (mut at, end) = (range.start.min(size), range.end.min(size));
                    while at < end {
                        if stop() {
                            s.cancel(&request);
                            return Err(RemoteError::Stopped);
                        }
                        let n = (end - at).min(chunk as u64) as usize;
                        buf.resize(n, 0);
                        file.read_exact_at(&mut buf, at).map_err(local)?;
                        running.update(at, &buf);
                        if !s.put_data(&request, at, &buf)? {
                            // The put failed early: its answer is on the way.
                            refused = true;
                            break 'send;
                        }
                        progress = Instant::now();
                        at += n as u64;
                    }
                }
                if refused {
                    // Its answer says why; the rest of the file is neither sent nor hashed (a sharer that
                    // refuses a huge size at once is not made to wait for the hash of every byte of it).
                    return Err(unexpected(s.wait(&request)?.pop()));
                }
                let known = match version {
                    Some(v) => v,
                    None => {
                        let mut stopped = false;
                        let root = running
                            .root_unless(file, size, &mut || {
                                stopped = stop();
                                stopped || s.put_refused(&request)
                            })
                            .map_err(local)?;
                        match root {
                            Some(root) => Version { size, root },
                            None if stopped => {
                                s.cancel(&request);
                                return Err(RemoteError::Stopped);
                            }
                            None => return Err(unexpected(s.wait(&request)?.pop())),
                        }
                    }
                };
                version = Some(known);
                ended = s.put_end(&request, known.root)?;
                match s.wait(&request)?.pop() {
                    Some(Event::Done { .. }) => Ok(PutOutcome::Written { version: known }),
                    Some(Event::Conflicted { name, .. }) => Ok(PutOutcome::Conflicted { name }),
                    other => Err(unexpected(other)),
                }
            })();
            match attempt {
                Err(RemoteError::Remote(ErrorCode::Changed, _)) if from_base => from_base = false,
                Err(RemoteError::Disconnected(why))
                    if progress.elapsed() < s.config.deadline && s.lost_since(began) =>
                {
                    if let Some(version) = version.filter(|_| ended) {
                        // Its end went out: it may have landed before the link was lost.
                        match self.read_into(path, Some(version.root), 0, &mut []) {
                            Ok((v, _)) if v == version => {
                                return Ok(PutOutcome::Written { version })
                            }
                            Ok(_) | Err(RemoteError::Remote(..)) => {}
                            Err(RemoteError::Disconnected(_)) => {
                                return Err(RemoteError::Disconnected(why))
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                other => return other,
            }
        }
    }

    /// Creates the directory `path`.
    pub fn mkdir(&self, path: &SharePath, mode: u32) -> Result<(), RemoteError> {
        self.write(ErrorCode::Exists, |c| c.mkdir(path.clone(), mode))
    }

    /// Removes the empty directory `path`.
    pub fn rmdir(&self, path: &SharePath) -> Result<(), RemoteError> {
        self.write(ErrorCode::NotFound, |c| c.rmdir(path.clone()))
    }

    /// Removes the file or symlink `path`; a file that is no longer the version `base` (when given) stays,
    /// and this fails with [`ErrorCode::Conflict`].
    pub fn unlink(&self, path: &SharePath, base: Option<[u8; 32]>) -> Result<(), RemoteError> {
        self.write(ErrorCode::NotFound, |c| c.unlink(path.clone(), base))
    }

    /// Renames `from` to `to`, replacing an existing `to` only when `replace`. With `base` (the version of
    /// the file at `to` last seen), a file there that changed since stays and `from` is kept beside it:
    /// `Some` of that name.
    pub fn rename(
        &self,
        from: &SharePath,
        to: &SharePath,
        replace: bool,
        base: Option<[u8; 32]>,
    ) -> Result<Option<Vec<u8>>, RemoteError> {
        self.write(ErrorCode::NotFound, |c| {
            c.rename(from.clone(), to.clone(), replace, base)
        })
    }

    /// Changes the permission bits and/or the modification time of `path`.
    pub fn set_attr(
        &self,
        path: &SharePath,
        mode: Option<u32>,
        mtime: Option<Time>,
    ) -> Result<(), RemoteError> {
        // Done twice is done once: no answer means it was done.
        self.write(ErrorCode::Cancelled, |c| {
            c.set_attr(path.clone(), mode, mtime)
        })
    }

    /// Creates a symlink at `path` to `target` (relative, staying inside the share, or the sharer refuses
    /// it with [`ErrorCode::UnsafePath`]).
    pub fn symlink(&self, path: &SharePath, target: &[u8]) -> Result<(), RemoteError> {
        self.write(ErrorCode::Exists, |c| {
            c.symlink(path.clone(), target.to_vec())
        })
    }

    /// A write answered Done. Retried on a new connection if the link is lost before the answer, within the
    /// deadline; the retry's `done_before` refusal (the path exists, or is gone) then means the first attempt
    /// did it.
    /// A rename may answer that it was kept beside the file it was to replace: `Some` of that name.
    fn write<T: Written>(
        &self,
        done_before: ErrorCode,
        make: impl Fn(&mut Client) -> Result<RequestId, Busy>,
    ) -> Result<T, RemoteError> {
        let s = self.shared();
        let mut lost = false;
        s.retrying(|since| {
            let attempt = (|| {
                let request = s.issue(since, END, &make)?;
                match s.wait(&request)?.pop() {
                    Some(Event::Done { .. }) => Ok(T::done()),
                    Some(Event::Conflicted { name, .. }) => {
                        T::kept(name).ok_or(RemoteError::Integrity)
                    }
                    other => Err(unexpected(other)),
                }
            })();
            match attempt {
                Err(RemoteError::Remote(code, _)) if lost && code == done_before => Ok(T::done()),
                Err(RemoteError::Disconnected(why)) => {
                    lost = true;
                    Err(RemoteError::Disconnected(why))
                }
                other => other,
            }
        })
    }
}

/// What a write answers: done, or (a rename only) kept beside the file it was to replace.
trait Written: Sized {
    fn done() -> Self;
    fn kept(name: Vec<u8>) -> Option<Self>;
}

impl Written for () {
    fn done() -> Self {}
    fn kept(_: Vec<u8>) -> Option<Self> {
        None
    }
}

impl Written for Option<Vec<u8>> {
    fn done() -> Self {
        None
    }
    fn kept(name: Vec<u8>) -> Option<Self> {
        Some(Some(name))
    }
}

/// A request issued: its connection, id and channel.
struct Issued {
    generation: u64,
    id: RequestId,
    rx: Receiver<Msg>,
}

/// A read in progress. Dropping it before its end cancels the read.
pub struct ReadHandle {
    shared: Arc<Shared>,
    request: Issued,
    /// Events received, not yet taken.
    queue: VecDeque<Event>,
    /// The request is over (nothing to cancel).
    ended: bool,
}

impl ReadHandle {
    /// The next event of this read: Version first, then Data in offset order, then `None` (also after the
    /// end or a failure). Fails with [`RemoteError::Deadline`] when neither this read nor the link made
    /// progress for the deadline (or the read alone for four deadlines).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<ReadPiece>, RemoteError> {
        if self.queue.is_empty() && !self.ended {
            let events = self
                .shared
                .wait(&self.request)
                .inspect_err(|_| self.ended = true)?;
            self.ended = events
                .iter()
                .any(|e| matches!(e, Event::Done { .. } | Event::Failed { .. }));
            self.queue.extend(events);
        }
        match self.queue.pop_front() {
            None | Some(Event::Done { .. }) => {
                self.queue.clear();
                Ok(None)
            }
            Some(Event::Version { version, .. }) => Ok(Some(ReadPiece::Version(version))),
            Some(Event::Data {
                offset, bytes, cvs, ..
            }) => Ok(Some(ReadPiece::Data { offset, bytes, cvs })),
            Some(other) => {
                self.queue.clear();
                Err(unexpected(Some(other)))
            }
        }
    }
}

impl Drop for ReadHandle {
    fn drop(&mut self) {
        if !self.ended {
            self.shared.cancel(&self.request);
        }
    }
}

/// The failure a request ended with, or an answer it cannot get.
fn unexpected(event: Option<Event>) -> RemoteError {
    match event {
        Some(Event::Failed { failure, .. }) => failure.into(),
        _ => RemoteError::Integrity,
    }
}

/// The link of connection `generation`, or why it is down.
fn link_of(st: &mut State, generation: u64) -> Result<&mut Link, RemoteError> {
    match st.link.as_ref().is_some_and(|l| l.generation == generation) {
        true => Ok(st.link.as_mut().expect("checked")),
        false => Err(RemoteError::Disconnected(st.why_down())),
    }
}

/// Why the channel failed before the sharer's hello: [`CLOSED_BEFORE_HELLO`] when the sharer ended the
/// connection, as it does to a client it refuses (cleanly, cut, or reset with this client's hello unread).
fn before_hello(e: ChannelError) -> String {
    use std::io::ErrorKind::*;
    match &e {
        ChannelError::Truncated | ChannelError::Closed => CLOSED_BEFORE_HELLO.into(),
        ChannelError::Io(io)
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) =>
        {
            CLOSED_BEFORE_HELLO.into()
        }
        _ => format!("no hello from the sharer: {e}"),
    }
}

/// Dials and greets: the sharer's hello within the deadline, then the subscription queued.
fn open(dial: &Dial, config: &RemoteConfig) -> Result<Opened, String> {
    let (mut reader, mut writer) = dial()?;
    // The sharer sends pieces of up to 1 MiB with their proof in one packet.
    reader.set_max_payload(crate::wire::MAX_PACKET);
    let stream = writer.get_ref().try_clone().map_err(|e| e.to_string())?;
    // A write to a sharer that stopped reading fails instead of hanging; the hello must come in time.
    let timeouts = stream
        .set_write_timeout(Some(config.deadline))
        .and_then(|()| stream.set_read_timeout(Some(config.deadline)));
    timeouts.map_err(|e| e.to_string())?;
    // One slot more than asked, for the subscription that stays in flight.
    let mut client = Client::new(config.max_in_flight.saturating_add(1));
    while let Some(p) = client.poll_transmit() {
        writer.send(&p).map_err(before_hello)?;
    }
    writer.flush().map_err(before_hello)?;
    let share = loop {
        let packet = reader
            .recv()
            .map_err(before_hello)?
            .ok_or(CLOSED_BEFORE_HELLO)?;
        match client.handle(packet) {
            Ok(Some(Event::Ready { share })) => break share,
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    };
    // From now on the reader thread waits as long as the link lives; the supervisor judges silence.
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    client
        .subscribe()
        .map_err(|Busy| "no room to subscribe".to_string())?;
    Ok(Opened {
        reader,
        writer,
        stream,
        client,
        share,
    })
}

impl Shared {
    /// Puts a new connection in use and starts its reader thread.
    fn install(self: &Arc<Self>, o: Opened) -> bool {
        let generation;
        {
            let mut w = lock(&self.writer);
            let mut st = lock(&self.state);
            if st.closed {
                let _ = o.stream.shutdown(Shutdown::Both);
                return false;
            }
            st.generation += 1;
            generation = st.generation;
            st.link = Some(Link {
                generation,
                client: o.client,
                routes: HashMap::new(),
                stream: o.stream,
                quiet_since: Instant::now(),
                // The subscription.
                unsent: true,
            });
            *w = Some((generation, o.writer));
            self.room.notify_all();
        }
        let shared = Arc::clone(self);
        let mut reader = o.reader;
        let spawned = std::thread::Builder::new()
            .name("ferry-remote-read".into())
            .spawn(move || {
                let why = shared.read_loop(generation, &mut reader);
                shared.lose(generation, why);
            });
        if let Err(e) = spawned {
            self.lose(generation, format!("no reader thread: {e}"));
            return false;
        }
        // The subscription.
        self.flush();
        true
    }

    /// Content bytes in one put data packet on the current connection.
    fn put_chunk(&self) -> usize {
        let max = lock(&self.writer)
            .as_ref()
            .map_or(MAX_PUT_DATA, |(_, w)| w.max_payload());
        max.saturating_sub(PUT_DATA_HEADER_LEN)
            .clamp(1, MAX_PUT_DATA)
    }

    /// Sends `bytes` at `offset` of the put `request`, right away (under the writer's lock, so a put's data
    /// never piles up in memory): `false` when the put is over already (it failed; its answer is on the
    /// way). Sending counts as the link's progress: the sharer takes the bytes (one that stops taking them
    /// fails the send by its timeout, the deadline).
    /// Whether the put `request` is over before it was sent whole (the sharer refused it; its answer is on
    /// the way), or its link is gone.
    fn put_refused(&self, request: &Issued) -> bool {
        let mut st = lock(&self.state);
        match link_of(&mut st, request.generation) {
            Ok(link) => matches!(
                link.client.put_data_header(request.id, 0, 0),
                Err(PutError::NoPut(_))
            ),
            Err(_) => true,
        }
    }

    fn put_data(&self, request: &Issued, offset: u64, bytes: &[u8]) -> Result<bool, RemoteError> {
        let mut w = lock(&self.writer);
        let packets: Vec<Vec<u8>> = {
            let mut st = lock(&self.state);
            let link = link_of(&mut st, request.generation)?;
            match link.client.put_data(request.id, offset, bytes) {
                Ok(()) => {}
                Err(PutError::NoPut(_)) => return Ok(false),
                Err(e @ PutError::OutOfRange) => {
                    return Err(RemoteError::Remote(ErrorCode::BadRequest, e.to_string()))
                }
            }
            link.unsent = false;
            link.quiet_since = Instant::now();
            std::iter::from_fn(|| link.client.poll_transmit()).collect()
        };
        let Some((generation, writer)) = w.as_mut().filter(|(g, _)| *g == request.generation)
        else {
            return Err(RemoteError::Disconnected(lock(&self.state).why_down()));
        };
        let sent = packets
            .iter()
            .try_for_each(|p| writer.send(p))
            .and_then(|()| writer.flush());
        if let Err(e) = sent {
            let (generation, why) = (*generation, format!("sending failed: {e}"));
            *w = None;
            drop(w);
            self.lose(generation, why.clone());
            return Err(RemoteError::Disconnected(why));
        }
        drop(w);
        // Packets other callers queued while this one held the writer.
        self.flush();
        Ok(true)
    }

    /// Ends the put `request`; `false` when it was over already.
    fn put_end(&self, request: &Issued, root: [u8; 32]) -> Result<bool, RemoteError> {
        {
            let mut st = lock(&self.state);
            let link = link_of(&mut st, request.generation)?;
            if link.client.put_end(request.id, root).is_err() {
                return Ok(false);
            }
            link.unsent = true;
        }
        self.flush();
        Ok(true)
    }

    /// Feeds the connection's packets to its client and routes the events, until the connection ends.
    fn read_loop(&self, generation: u64, reader: &mut SecureReader<TcpStream>) -> String {
        let pool = Pool::new(POOL_KEEP);
        loop {
            let packet = match reader.recv_taking(TAKE_FROM, |len| pool.take(len)) {
                Ok(Some(p)) => p,
                Ok(None) => return "the sharer closed the connection".into(),
                Err(e) => return e.to_string(),
            };
            let changed = {
                let mut st = lock(&self.state);
                let waiters = st.waiters;
                let Some(link) = st.link.as_mut().filter(|l| l.generation == generation) else {
                    return "replaced".into();
                };
                link.quiet_since = Instant::now();
                let handled = match packet {
                    Received::Borrowed(p) => link.client.handle(p),
                    Received::Taken { buf, contents } => {
                        link.client.handle_owned(buf, contents, &pool)
                    }
                };
                let event = match handled {
                    Ok(Some(event)) => event,
                    Ok(None) => continue,
                    Err(e) => return format!("the sharer broke the protocol: {e}"),
                };
                match event {
                    Event::Changed { paths } => Some(paths),
                    Event::Ready { .. } | Event::Transfer { .. } => {
                        return "the sharer broke the protocol: an answer nothing asked for".into()
                    }
                    event => {
                        let (id, finished) = match &event {
                            Event::Version { id, .. } | Event::Data { id, .. } => (*id, false),
                            Event::Attr { id, .. }
                            | Event::Space { id, .. }
                            | Event::Entries { id, .. }
                            | Event::Done { id }
                            | Event::Conflicted { id, .. }
                            | Event::Failed { id, .. } => (*id, true),
                            Event::Changed { .. }
                            | Event::Ready { .. }
                            | Event::Transfer { .. } => {
                                unreachable!("matched above")
                            }
                        };
                        // A read that did not verify queued its cancel.
                        link.unsent |= matches!(event, Event::Failed { .. });
                        // The subscription's failure has no route.
                        if finished {
                            if let Some(mut route) = link.routes.remove(&id) {
                                route.route(event);
                            }
                            if waiters > 0 {
                                self.room.notify_one();
                            }
                        } else if let Some(route) = link.routes.get_mut(&id) {
                            route.route(event);
                        }
                        None
                    }
                }
            };
            if let Some(paths) = changed {
                self.notify(Notice::Changed(paths));
            }
        }
    }

    /// Ends connection `generation` (once): its requests fail with [`RemoteError::Disconnected`], callers wait
    /// for the redial, the supervisor redials.
    fn lose(&self, generation: u64, why: String) {
        let link = {
            let mut st = lock(&self.state);
            if st.link.as_ref().is_none_or(|l| l.generation != generation) {
                return;
            }
            st.lost = why.clone();
            st.lost_at = Instant::now();
            st.redial.clear();
            // Said before the supervisor can see the link down (under this lock), so never after its
            // "back": a loss said late would leave the link's last state lost while it is up.
            self.notify(Notice::Link(LinkState::Lost(why.clone())));
            self.room.notify_all();
            self.wake.notify_all();
            st.link.take().expect("checked")
        };
        let _ = link.stream.shutdown(Shutdown::Both);
        for route in link.routes.values() {
            let _ = route.tx.send(Msg::Lost(why.clone()));
        }
        {
            let mut w = lock(&self.writer);
            if w.as_ref().is_some_and(|(g, _)| *g == generation) {
                *w = None;
            }
        }
    }

    /// Issues a request once the link is up and has room. While it waits for room, its deadline counts from
    /// `since` or from the link's last sign of life (slots are freed as answers come). While the link is
    /// down it counts from when the link was lost, not from this request: once the sharer has been out of
    /// reach for a whole deadline, requests fail at once (the supervisor goes on redialling) instead of each
    /// waiting a deadline of its own, so that a mount answers from what it knows without a pause per call.
    fn issue(
        &self,
        since: Instant,
        end: u64,
        make: impl FnOnce(&mut Client) -> Result<RequestId, Busy>,
    ) -> Result<Issued, RemoteError> {
        let mut st = lock(&self.state);
        let mut progress = since;
        loop {
            if st.closed {
                return Err(RemoteError::Closed);
            }
            progress = match &st.link {
                Some(link) if link.client.has_room() => break,
                Some(link) => progress.max(link.quiet_since),
                None => st.lost_at,
            };
            let (now, until) = (Instant::now(), progress + self.config.deadline);
            if now >= until {
                let e = match st.link {
                    None => RemoteError::Disconnected(st.why_down()),
                    Some(_) => RemoteError::Deadline,
                };
                // The wake-up this waiter may have taken goes to the next one.
                if st.waiters > 0 {
                    self.room.notify_one();
                }
                return Err(e);
            }
            st.waiters += 1;
            st = self
                .room
                .wait_timeout(st, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            st.waiters -= 1;
        }
        let link = st.link.as_mut().expect("checked");
        let id = make(&mut link.client).map_err(|Busy| RemoteError::Deadline)?;
        let (tx, rx) = mpsc::channel();
        if link.routes.is_empty() {
            // Answers are due from now on; the silence before does not count against the link.
            link.quiet_since = Instant::now();
        }
        let held = Vec::new();
        link.routes.insert(id, Route { tx, end, held });
        link.unsent = true;
        let generation = link.generation;
        drop(st);
        self.flush();
        Ok(Issued { generation, id, rx })
    }

    /// The request's next events. It waits while the request or its link makes progress
    /// (reads take turns on the sharer, so a read among many on a slow link hears nothing of its own for a
    /// while), at most the deadline since the link's last sign of life and four deadlines since the
    /// request's own; then the request is cancelled.
    fn wait(&self, request: &Issued) -> Result<Vec<Event>, RemoteError> {
        let own = Instant::now();
        let mut timeout = self.config.deadline;
        loop {
            match request.rx.recv_timeout(timeout) {
                Ok(Msg::Events(events)) => return Ok(events),
                Ok(Msg::Lost(why)) => return Err(RemoteError::Disconnected(why)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    let st = lock(&self.state);
                    return Err(match st.closed {
                        true => RemoteError::Closed,
                        false => RemoteError::Disconnected(st.why_down()),
                    });
                }
            }
            let heard = lock(&self.state)
                .link
                .as_ref()
                .filter(|l| l.generation == request.generation)
                .map(|l| l.quiet_since);
            let now = Instant::now();
            let until = heard.map(|h| h + self.config.deadline).unwrap_or(now);
            let until = until.min(own + 4 * self.config.deadline);
            if until <= now {
                self.cancel(request);
                return Err(RemoteError::Deadline);
            }
            timeout = until - now;
        }
    }

    /// Cancels a request still in flight on its connection.
    fn cancel(&self, request: &Issued) {
        {
            let mut st = lock(&self.state);
            let waiters = st.waiters;
            let Some(link) = st
                .link
                .as_mut()
                .filter(|l| l.generation == request.generation)
            else {
                return;
            };
            if link.routes.remove(&request.id).is_none() {
                return;
            }
            link.client.cancel(request.id);
            link.unsent = true;
            if waiters > 0 {
                self.room.notify_one();
            }
        }
        self.flush();
    }

    /// Sends everything the client queued, in order: drains are serialized by the writer's lock. A caller
    /// that finds the lock taken leaves its packets to the holder, which looks again after letting go, so
    /// many callers at once share writes instead of queueing for the lock.
    fn flush(&self) {
        loop {
            let mut w = match self.writer.try_lock() {
                Ok(w) => w,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            loop {
                let Some((generation, writer)) = w.as_mut() else {
                    return;
                };
                let packets: Vec<Vec<u8>> = {
                    let mut st = lock(&self.state);
                    let Some(link) = st.link.as_mut().filter(|l| l.generation == *generation)
                    else {
                        return;
                    };
                    link.unsent = false;
                    std::iter::from_fn(|| link.client.poll_transmit()).collect()
                };
                if packets.is_empty() {
                    break;
                }
                let sent = packets
                    .iter()
                    .try_for_each(|p| writer.send(p))
                    .and_then(|()| writer.flush());
                if let Err(e) = sent {
                    let generation = *generation;
                    *w = None;
                    drop(w);
                    self.lose(generation, format!("sending failed: {e}"));
                    return;
                }
            }
            drop(w);
            // Packets queued by callers that found the lock taken after this thread's last look.
            if !lock(&self.state).link.as_ref().is_some_and(|l| l.unsent) {
                return;
            }
        }
    }

    /// Whether the link was lost after `began` (under a call that began then): only such a call is tried
    /// again. One that began with the link down already waited for it in [`Shared::issue`]; trying it
    /// again would spin until its deadline (a push to a sharer long gone took a whole deadline so).
    fn lost_since(&self, began: Instant) -> bool {
        lock(&self.state).lost_at >= began
    }

    /// Retries `attempt` on a new connection when the link was lost under it (after the call began), while
    /// the deadline allows; `attempt` gets the moment its wait for the link counts from. A link that was
    /// already down when the call began is not retried: [`Shared::issue`] waited for it.
    fn retrying<T>(
        &self,
        mut attempt: impl FnMut(Instant) -> Result<T, RemoteError>,
    ) -> Result<T, RemoteError> {
        let since = Instant::now();
        loop {
            match attempt(since) {
                Err(RemoteError::Disconnected(_))
                    if since.elapsed() < self.config.deadline && self.lost_since(since) => {}
                other => return other,
            }
        }
    }

    /// Keeps the link: probes it when idle, cuts it when silent while answers are due, redials when lost.
    fn supervise(self: Arc<Self>) {
        let (first, longest) = self.config.redial_backoff;
        let mut backoff = first;
        let tick = (self.config.deadline.min(self.config.keepalive) / 4)
            .clamp(Duration::from_millis(10), Duration::from_millis(500));
        loop {
            let mut st = lock(&self.state);
            if st.closed {
                return;
            }
            if st.link.is_none() {
                drop(st);
                // The same share or none: a sharer of another share where this one was is refused.
                let opened =
                    open(&self.dial, &self.config).and_then(|o| match o.share == self.share {
                        true => Ok(o),
                        false => Err(format!(
                            "the sharer reached now shares {:?}, not {:?}",
                            String::from_utf8_lossy(&o.share),
                            String::from_utf8_lossy(&self.share)
                        )),
                    });
                match opened {
                    Ok(opened) => {
                        if !self.install(opened) {
                            continue;
                        }
                        backoff = first;
                        self.notify(Notice::Link(LinkState::Back));
                        self.notify(Notice::Changed(vec![SharePath::root()]));
                    }
                    Err(e) => {
                        let mut st = lock(&self.state);
                        st.redial = e;
                        if !st.closed {
                            let _ = self.wake.wait_timeout(st, backoff);
                        }
                        backoff = (backoff * 2).min(longest);
                    }
                }
                continue;
            }
            let link = st.link.as_mut().expect("checked");
            let now = Instant::now();
            let silent = now.duration_since(link.quiet_since);
            if !link.routes.is_empty() && silent > self.config.deadline {
                let generation = link.generation;
                drop(st);
                self.lose(
                    generation,
                    format!("no answer from the sharer for {}s", silent.as_secs_f32()),
                );
                continue;
            }
            if link.routes.is_empty() && silent > self.config.keepalive && link.client.has_room() {
                // A probe: its answer (or the silence) tells whether the sharer is still there.
                if let Ok(id) = link.client.stat(SharePath::root()) {
                    let (tx, held) = (mpsc::channel().0, Vec::new());
                    link.routes.insert(id, Route { tx, end: END, held });
                    link.unsent = true;
                    link.quiet_since = now;
                }
            }
            st = self
                .wake
                .wait_timeout(st, tick)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            drop(st);
            self.flush();
        }
    }

    fn notify(&self, notice: Notice) {
        if let Some(tx) = lock(&self.notices).as_ref() {
            let _ = tx.send(notice);
        }
    }

    /// Shuts down: requests fail with [`RemoteError::Closed`], the connection ends, the threads stop.
    fn close(&self) {
        let link = {
            let mut st = lock(&self.state);
            st.closed = true;
            // The notice thread ends after the notices before.
            lock(&self.notices).take();
            self.room.notify_all();
            self.wake.notify_all();
            st.link.take()
        };
        // The channel's authenticated end, so the sharer sees a clean close.
        let writer = lock(&self.writer).take();
        if let Some((_, writer)) = writer {
            let _ = writer
                .get_ref()
                .set_write_timeout(Some(Duration::from_millis(200)));
            let _ = writer.close();
        }
        if let Some(link) = link {
            let _ = link.stream.shutdown(Shutdown::Both);
        }
    }
}
