//! The sharer's side of one client connection, as a state machine: packets in, jobs for the file-system
//! layer out, answers and pieces back in, packets out. No sockets, no files, no clocks.
//!
//! The IO layer loops: feed every packet from the channel to [`Server::handle`]; run each [`Job`] from
//! [`Server::next_job`] against the share and report the result (`*_done`, [`Server::read_opened`]); send
//! everything [`Server::poll_transmit`] gives; and while it gives nothing, build the next piece that
//! [`Server::next_piece`] names (a [`crate::wire::data_header`] and [`crate::tree::encode_piece`] into one
//! packet). Small answers always go before the next piece, and reads take turns piece by piece, so a large
//! read never holds back a stat.
//!
//! Writes (only when [`ServerConfig::writable`]; otherwise each is answered [`ErrorCode::ReadOnly`]) are jobs
//! too, run in the order they arrived: a put is [`Job::Put`], its [`Job::PutData`] and [`Job::PutEnd`],
//! reported with [`Server::put_done`] (or [`Server::fail`]); the others are [`Job::Write`], reported with
//! [`Server::write_done`]. Data of a put that failed is dropped until its end.
//!
//! A pull ([`Job::Pull`]) is the connection's only request: once the IO layer reports its path resolved
//! ([`Server::pull_resolved`]), the session's last packet out is [`crate::wire::Response::Transfer`] and it
//! takes no more packets ([`Server::switched`]): the connection carries the transfer protocol from there.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use crate::tree::{covering, Version, GROUP};
use crate::wire::{
    self, DecodeError, Entry, ErrorCode, Hello, PutHeader, Request, RequestId, Response, SharePath,
    Space, Time, PROTOCOL_VERSION,
};

/// The largest piece by default: 1 MiB, a mount's read, in one packet of [`wire::MAX_PACKET`] bytes with its
/// header and proof, so the client hands the piece's bytes on where they arrived.
pub const DEFAULT_PIECE: u64 = 1 << 20;
const _: () = assert!(DEFAULT_PIECE.is_multiple_of(GROUP));

/// Room a packet keeps for a piece's header and proof: the parents inside a 1 MiB piece (64 bytes per
/// group: 7.9 KiB with 8 KiB groups) and those on its path from the root (at most 4 KiB).
const PROOF_ROOM: u64 = 16 << 10;
const _: () = assert!(DEFAULT_PIECE + PROOF_ROOM <= wire::MAX_PACKET as u64);

/// Settings of a share's sessions.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The share's name, sent in the hello.
    pub share: Vec<u8>,
    /// Most requests one client may have in flight; more are answered [`ErrorCode::Busy`].
    pub max_in_flight: u32,
    /// Largest piece, in bytes (a multiple of [`GROUP`]).
    pub max_piece: u64,
    /// Whether the client may write; otherwise every write is answered [`ErrorCode::ReadOnly`].
    pub writable: bool,
    /// The client's name, in the names of conflict copies (`NAME.conflict-PEER-DATE`).
    pub peer: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            share: Vec::new(),
            max_in_flight: 256,
            max_piece: DEFAULT_PIECE,
            writable: false,
            peer: "peer".into(),
        }
    }
}

/// A write other than a put: run it and report with [`Server::write_done`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Create a directory.
    Mkdir {
        /// The new directory.
        path: SharePath,
        /// Its permission bits.
        mode: u32,
    },
    /// Remove an empty directory.
    Rmdir {
        /// The directory.
        path: SharePath,
    },
    /// Remove a file or symlink; a file that is not the version `base` (when given) stays:
    /// [`ErrorCode::Conflict`].
    Unlink {
        /// The file or symlink.
        path: SharePath,
        /// The version meant.
        base: Option<[u8; 32]>,
    },
    /// Rename a path; a file at `to` that is not the version `base` (when given) stays, and `from` goes
    /// beside it under a conflict name ([`PutOutcome::Conflicted`]).
    Rename {
        /// The path renamed.
        from: SharePath,
        /// Its new path.
        to: SharePath,
        /// Whether an existing `to` is replaced.
        replace: bool,
        /// The version of `to` meant to be replaced.
        base: Option<[u8; 32]>,
    },
    /// Change permission bits or the modification time.
    SetAttr {
        /// The file or directory.
        path: SharePath,
        /// New permission bits.
        mode: Option<u32>,
        /// New modification time.
        mtime: Option<Time>,
    },
    /// Create a symlink (its target was checked to stay inside the share).
    Symlink {
        /// The new symlink.
        path: SharePath,
        /// Its target.
        target: Vec<u8>,
    },
}

impl WriteOp {
    /// The paths the write changes, for change notifications.
    pub fn paths(&self) -> Vec<SharePath> {
        match self {
            WriteOp::Mkdir { path, .. }
            | WriteOp::Rmdir { path }
            | WriteOp::Unlink { path, .. }
            | WriteOp::SetAttr { path, .. }
            | WriteOp::Symlink { path, .. } => vec![path.clone()],
            WriteOp::Rename { from, to, .. } => vec![from.clone(), to.clone()],
        }
    }
}

/// How a put (or a write) ended, reported with [`Server::put_done`] (or [`Server::write_done`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// The file was replaced (or created) with the new content; the write was done.
    Written,
    /// The sharer's file changed since the put's (or rename's) base: it stayed, and the new content (the
    /// renamed file) was kept beside it under this name.
    Conflicted(Vec<u8>),
}

/// Work for the file-system layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Stat `path`; report with [`Server::stat_done`].
    Stat {
        /// The request.
        id: RequestId,
        /// The path.
        path: SharePath,
    },
    /// Find the size and free space of the share's file system; report with [`Server::space_done`].
    Space {
        /// The request.
        id: RequestId,
    },
    /// List one page of `path`; report with [`Server::list_done`].
    List {
        /// The request.
        id: RequestId,
        /// The directory.
        path: SharePath,
        /// Where the page starts.
        cursor: u64,
        /// Most entries.
        max: u32,
    },
    /// Open `path` for reading and find its version (outboard); report with [`Server::read_opened`] and keep
    /// the file open until the read is done or failed.
    Open {
        /// The request.
        id: RequestId,
        /// The file.
        path: SharePath,
    },
    /// Resolve `path` (a file or directory) for a pull; report with [`Server::pull_resolved`], then, when
    /// [`Server::switched`], send it with the transfer protocol.
    Pull {
        /// The request.
        id: RequestId,
        /// The file or directory.
        path: SharePath,
    },
    /// Start a put (its temp file); report a failure with [`Server::fail`], success only at its end.
    Put {
        /// The request.
        id: RequestId,
        /// What to write.
        put: PutHeader,
    },
    /// Write bytes of a put's content (the range lies inside the put's size).
    PutData {
        /// The put.
        id: RequestId,
        /// Where.
        offset: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// A put's content is complete: verify it against `root` and make it visible; report with
    /// [`Server::put_done`].
    PutEnd {
        /// The put.
        id: RequestId,
        /// The root the client named for the content.
        root: [u8; 32],
    },
    /// Run a write; report with [`Server::write_done`].
    Write {
        /// The request.
        id: RequestId,
        /// The write.
        op: WriteOp,
    },
}

impl Job {
    fn id(&self) -> RequestId {
        match self {
            Job::Stat { id, .. }
            | Job::Space { id }
            | Job::List { id, .. }
            | Job::Open { id, .. }
            | Job::Pull { id, .. }
            | Job::Put { id, .. }
            | Job::PutData { id, .. }
            | Job::PutEnd { id, .. }
            | Job::Write { id, .. } => *id,
        }
    }
}

/// A piece to build: the data of `range` of the read `id`, with its proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The read.
    pub id: RequestId,
    /// Group-aligned byte range.
    pub range: Range<u64>,
}

/// A client broke the protocol; the session ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// A packet did not decode.
    #[error("malformed request: {0}")]
    Malformed(#[from] DecodeError),
    /// The first message was not a hello.
    #[error("the client did not start with a hello")]
    Hello,
    /// The client speaks another version of the share protocol (another ferry release).
    #[error(
        "the client speaks share protocol version {theirs}, this ferry version {}: run the same ferry \
         release on both machines",
        PROTOCOL_VERSION
    )]
    Version {
        /// The client's version.
        theirs: u16,
    },
    /// An id that is already in flight.
    #[error("request id {0} is already in flight")]
    DuplicateId(RequestId),
    /// A packet after the connection switched to the transfer protocol for a pull.
    #[error("the connection carries a pull")]
    Switched,
    /// Put data or a put's end for no put.
    #[error("put data for request {0}, which is no put in flight")]
    NoSuchPut(RequestId),
}

/// What a request in flight is waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum InFlight {
    Job,
    /// A write other than a put, and the path whose version it names (for the conflict log).
    Writing(SharePath),
    Opening {
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    },
    Reading,
    Subscribed,
    Pulling,
    /// A put receiving its content (`ended`: its end arrived, the file-system layer finishes it).
    Putting {
        path: SharePath,
        size: u64,
        ended: bool,
    },
}

/// One client's session.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    greeted: bool,
    out: VecDeque<Vec<u8>>,
    jobs: VecDeque<Job>,
    in_flight: HashMap<RequestId, InFlight>,
    /// Reads with pieces left, taking turns: id and the bytes still to send.
    reads: VecDeque<(RequestId, Range<u64>)>,
    /// Requests refused with [`ErrorCode::UnsafePath`], for the log (the oldest dropped past a bound).
    refused: VecDeque<String>,
    /// A pull was resolved: the session is over, the transfer protocol follows.
    switched: bool,
    /// Puts refused or failed whose data may still arrive: it is dropped until their end.
    dead_puts: VecDeque<RequestId>,
    /// Puts that ended in a conflict, described for the log.
    conflicts: VecDeque<String>,
}

/// Refusals (and conflicts) kept for the log until taken.
const MAX_REFUSED: usize = 64;
/// Failed puts remembered so their remaining data is dropped quietly.
const MAX_DEAD_PUTS: usize = 1024;

impl Server {
    /// A session; its hello is the first packet out.
    pub fn new(config: ServerConfig) -> Self {
        assert!(
            config.max_piece >= GROUP && config.max_piece.is_multiple_of(GROUP),
            "pieces are whole groups"
        );
        let mut hello = Vec::new();
        Response::Hello(Hello {
            version: PROTOCOL_VERSION,
            max_in_flight: config.max_in_flight,
            share: config.share.clone(),
        })
        .encode(&mut hello);
        Server {
            config,
            greeted: false,
            out: VecDeque::from([hello]),
            jobs: VecDeque::new(),
            in_flight: HashMap::new(),
            reads: VecDeque::new(),
            refused: VecDeque::new(),
            switched: false,
            dead_puts: VecDeque::new(),
            conflicts: VecDeque::new(),
        }
    }

    /// The session's settings.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Takes one packet from the client.
    pub fn handle(&mut self, packet: &[u8]) -> Result<(), ServerError> {
        if self.switched {
            return Err(ServerError::Switched);
        }
        if self.greeted && wire::is_put_data(packet) {
            // The bulk of a put: borrowed, checked and queued without decoding into a copy first.
            let (id, offset, bytes) = wire::put_data(packet)?;
            return self.put_data(id, offset, bytes);
        }
        let req = match Request::decode(packet) {
            Ok(req) => req,
            // A request whose path breaks the name rules (`..`, absolute, NUL, ...) is refused on its own;
            // the session goes on.
            Err(DecodeError::UnsafePath(problem)) if self.greeted => {
                let (id, path) =
                    wire::request_path(packet).ok_or(DecodeError::UnsafePath(problem))?;
                if self.in_flight.contains_key(&id) {
                    return Err(ServerError::DuplicateId(id));
                }
                let shown = String::from_utf8_lossy(path).escape_debug().to_string();
                if packet.first() == Some(&wire::PUT) {
                    self.bury_put(id);
                }
                self.refuse(id, format!("{shown}: {problem}"));
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        if !self.greeted {
            return match req {
                Request::Hello(h) if h.version == PROTOCOL_VERSION => {
                    self.greeted = true;
                    Ok(())
                }
                Request::Hello(h) => Err(ServerError::Version { theirs: h.version }),
                _ => Err(ServerError::Hello),
            };
        }
        let (id, job, state) = match req {
            Request::Hello(_) => return Err(ServerError::Hello),
            Request::Cancel { id } => {
                self.cancel(id);
                return Ok(());
            }
            Request::Stat { id, path } => (id, Some(Job::Stat { id, path }), InFlight::Job),
            Request::SpaceOf { id } => (id, Some(Job::Space { id }), InFlight::Job),
            Request::List {
                id,
                path,
                cursor,
                max,
            } => (
                id,
                Some(Job::List {
                    id,
                    path,
                    cursor,
                    max,
                }),
                InFlight::Job,
            ),
            Request::Read {
                id,
                path,
                version,
                offset,
                len,
            } => (
                id,
                Some(Job::Open { id, path }),
                InFlight::Opening {
                    version,
                    offset,
                    len,
                },
            ),
            Request::Subscribe { id } => (id, None, InFlight::Subscribed),
            Request::Pull { id, path } => (id, Some(Job::Pull { id, path }), InFlight::Pulling),
            Request::PutData { id, offset, bytes } => return self.put_data(id, offset, &bytes),
            Request::PutEnd { id, root } => return self.put_end(id, root),
            Request::Put { id, put } => {
                let state = InFlight::Putting {
                    path: put.path.clone(),
                    size: put.size,
                    ended: false,
                };
                (id, Some(Job::Put { id, put }), state)
            }
            Request::Mkdir { id, path, mode } => write(id, WriteOp::Mkdir { path, mode }),
            Request::Rmdir { id, path } => write(id, WriteOp::Rmdir { path }),
            Request::Unlink { id, path, base } => write(id, WriteOp::Unlink { path, base }),
            Request::Rename {
                id,
                from,
                to,
                replace,
                base,
            } => write(
                id,
                WriteOp::Rename {
                    from,
                    to,
                    replace,
                    base,
                },
            ),
            Request::SetAttr {
                id,
                path,
                mode,
                mtime,
            } => write(id, WriteOp::SetAttr { path, mode, mtime }),
            Request::Symlink { id, path, target } => write(id, WriteOp::Symlink { path, target }),
        };
        if self.in_flight.contains_key(&id) {
            return Err(ServerError::DuplicateId(id));
        }
        // A new request with an id that was a failed put's: its old data is all in (the channel keeps order).
        self.dead_puts.retain(|d| *d != id);
        let is_put = matches!(state, InFlight::Putting { .. });
        let is_write = is_put || matches!(job, Some(Job::Write { .. }));
        if is_write && !self.config.writable {
            self.refuse_request(id, is_put, ErrorCode::ReadOnly, "the share is read-only");
            return Ok(());
        }
        let pulling = self.in_flight.values().any(|s| *s == InFlight::Pulling);
        if pulling || (state == InFlight::Pulling && !self.in_flight.is_empty()) {
            // The transfer protocol takes the whole connection: a pull goes alone.
            let message = "a pull must be the only request of its connection";
            self.refuse_request(id, is_put, ErrorCode::BadRequest, message);
            return Ok(());
        }
        if self.in_flight.len() >= self.config.max_in_flight as usize {
            self.refuse_request(id, is_put, ErrorCode::Busy, "too many requests in flight");
            return Ok(());
        }
        self.in_flight.insert(id, state);
        self.jobs.extend(job);
        Ok(())
    }

    /// Answers a request that is refused before it starts; a put's data that may follow is dropped.
    fn refuse_request(&mut self, id: RequestId, is_put: bool, code: ErrorCode, message: &str) {
        if is_put {
            self.bury_put(id);
        }
        self.error(id, code, message);
    }

    fn bury_put(&mut self, id: RequestId) {
        if self.dead_puts.len() == MAX_DEAD_PUTS {
            self.dead_puts.pop_front();
        }
        self.dead_puts.push_back(id);
    }

    fn put_data(&mut self, id: RequestId, offset: u64, bytes: &[u8]) -> Result<(), ServerError> {
        match self.in_flight.get(&id) {
            Some(InFlight::Putting {
                size, ended: false, ..
            }) => {
                if offset + bytes.len() as u64 > *size {
                    self.fail(id, ErrorCode::BadRequest, "put data past the put's size");
                } else {
                    self.jobs.push_back(Job::PutData {
                        id,
                        offset,
                        bytes: bytes.to_vec(),
                    });
                }
                Ok(())
            }
            _ if self.dead_puts.contains(&id) => Ok(()),
            _ => Err(ServerError::NoSuchPut(id)),
        }
    }

    fn put_end(&mut self, id: RequestId, root: [u8; 32]) -> Result<(), ServerError> {
        match self.in_flight.get_mut(&id) {
            Some(InFlight::Putting { ended, .. }) if !*ended => {
                *ended = true;
                self.jobs.push_back(Job::PutEnd { id, root });
                Ok(())
            }
            _ if self.dead_puts.contains(&id) => {
                self.dead_puts.retain(|d| *d != id);
                Ok(())
            }
            _ => Err(ServerError::NoSuchPut(id)),
        }
    }

    /// Reports a put's end: its content landed, or was kept beside a file that changed (a conflict, logged),
    /// or it failed.
    pub fn put_done(&mut self, id: RequestId, result: Result<PutOutcome, (ErrorCode, String)>) {
        let Some(InFlight::Putting { path, .. }) = self.in_flight.remove(&id) else {
            return;
        };
        match result {
            Ok(PutOutcome::Written) => self.push(Response::Done { id }),
            Ok(PutOutcome::Conflicted(name)) => self.conflicted(id, &path, name),
            Err((code, message)) => self.error(id, code, &message),
        }
    }

    /// Logs a write kept beside `path` as `name` and answers it.
    fn conflicted(&mut self, id: RequestId, path: &SharePath, name: Vec<u8>) {
        let kept = format!(
            "theirs kept as {}",
            String::from_utf8_lossy(&name).escape_debug()
        );
        self.log_conflict(path, &kept);
        self.push(Response::Conflicted { id, name });
    }

    fn log_conflict(&mut self, path: &SharePath, outcome: &str) {
        if self.conflicts.len() == MAX_REFUSED {
            self.conflicts.pop_front();
        }
        self.conflicts.push_back(format!(
            "{}: changed on this side since {}'s version; {outcome}",
            String::from_utf8_lossy(path.as_bytes()).escape_debug(),
            self.config.peer,
        ));
    }

    /// Reports a write other than a put: done, a rename's file kept beside the changed file it was to
    /// replace, or failed (a removal of a changed file, [`ErrorCode::Conflict`], is logged as a conflict).
    pub fn write_done(&mut self, id: RequestId, result: Result<PutOutcome, (ErrorCode, String)>) {
        let Some(InFlight::Writing(path)) = self.in_flight.remove(&id) else {
            return;
        };
        match result {
            Ok(PutOutcome::Written) => self.push(Response::Done { id }),
            Ok(PutOutcome::Conflicted(name)) => self.conflicted(id, &path, name),
            Err((ErrorCode::Conflict, message)) => {
                self.log_conflict(&path, "their removal was refused and it stays");
                self.error(id, ErrorCode::Conflict, &message);
            }
            Err((code, message)) => self.error(id, code, &message),
        }
    }

    /// The next put that ended in a conflict, described for the sharer's log.
    pub fn next_conflict(&mut self) -> Option<String> {
        self.conflicts.pop_front()
    }

    /// Whether `id` is a put in progress (its temp file must stay).
    pub fn is_putting(&self, id: RequestId) -> bool {
        matches!(self.in_flight.get(&id), Some(InFlight::Putting { .. }))
    }

    /// The next request refused for trying to leave the share, described for the sharer's log.
    pub fn next_refusal(&mut self) -> Option<String> {
        self.refused.pop_front()
    }

    /// The next job for the file-system layer: in the order the requests came, except that a stat, a
    /// listing, the space or a read's open waiting behind a put's data runs before that data. No one sees
    /// a put's content before its end (the temp file is renamed into place then), so the answer is the same
    /// as after it, and it does not wait for megabytes to be written and hashed first. Nothing overtakes
    /// any other write: a put's start and end, a mkdir, a rename keep their places.
    pub fn next_job(&mut self) -> Option<Job> {
        let data = self
            .jobs
            .iter()
            .take_while(|j| matches!(j, Job::PutData { .. }))
            .count();
        if data > 0 {
            if let Some(
                Job::Stat { .. } | Job::List { .. } | Job::Space { .. } | Job::Open { .. },
            ) = self.jobs.get(data)
            {
                return self.jobs.remove(data);
            }
        }
        self.jobs.pop_front()
    }

    /// Whether jobs wait for the file-system layer.
    pub fn has_jobs(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// Bytes of put data waiting in the jobs.
    pub fn data_queued(&self) -> usize {
        self.jobs
            .iter()
            .map(|j| match j {
                Job::PutData { bytes, .. } => bytes.len(),
                _ => 0,
            })
            .sum()
    }

    /// Reports a stat.
    pub fn stat_done(&mut self, id: RequestId, result: Result<Entry, (ErrorCode, String)>) {
        self.answer(id, result, |entry| Response::Attr { id, entry });
    }

    /// Reports the size and free space of the share's file system.
    pub fn space_done(&mut self, id: RequestId, result: Result<Space, (ErrorCode, String)>) {
        self.answer(id, result, |space| Response::Space { id, space });
    }

    /// Reports one page of a listing (`next` is [`wire::END`] after the last page).
    pub fn list_done(
        &mut self,
        id: RequestId,
        result: Result<(Vec<Entry>, u64), (ErrorCode, String)>,
    ) {
        self.answer(id, result, |(entries, next)| Response::Entries {
            id,
            entries,
            next,
        });
    }

    /// Ends the one-answer job `id`: its answer made of `result`, or its error; nothing when it was
    /// cancelled meanwhile.
    fn answer<T>(
        &mut self,
        id: RequestId,
        result: Result<T, (ErrorCode, String)>,
        answer: impl FnOnce(T) -> Response<'static>,
    ) {
        if self.in_flight.remove(&id).is_none() {
            return; // cancelled meanwhile
        }
        match result {
            Ok(t) => self.push(answer(t)),
            Err((code, message)) => self.error(id, code, &message),
        }
    }

    /// Reports an opened file's version; its pieces follow. A read that named another version fails with
    /// [`ErrorCode::Changed`] (after the current version, so the client learns it).
    pub fn read_opened(&mut self, id: RequestId, result: Result<Version, (ErrorCode, String)>) {
        let Some(InFlight::Opening {
            version: wanted,
            offset,
            len,
        }) = self.in_flight.get(&id).cloned()
        else {
            return;
        };
        let version = match result {
            Ok(v) => v,
            Err((code, message)) => {
                self.in_flight.remove(&id);
                return self.error(id, code, &message);
            }
        };
        self.push(Response::Version {
            id,
            size: version.size,
            root: version.root,
        });
        if wanted.is_some_and(|w| w != version.root) {
            self.in_flight.remove(&id);
            return self.error(
                id,
                ErrorCode::Changed,
                "the file changed since that version",
            );
        }
        if offset > version.size {
            self.in_flight.remove(&id);
            return self.error(
                id,
                ErrorCode::BadRequest,
                "the range starts past the end of the file",
            );
        }
        let range = covering(version.size, offset, len);
        self.in_flight.insert(id, InFlight::Reading);
        if range.is_empty() && version.size != 0 {
            self.finish(id);
        } else {
            self.reads.push_back((id, range));
        }
    }

    /// Reports a pull's path resolved (`Ok`) or refused. Once resolved, [`Server::poll_transmit`] gives the
    /// [`crate::wire::Response::Transfer`] that switches the connection, and [`Server::switched`] is true.
    pub fn pull_resolved(&mut self, id: RequestId, result: Result<(), (ErrorCode, String)>) {
        if self.in_flight.remove(&id) != Some(InFlight::Pulling) {
            return;
        }
        match result {
            Ok(()) => {
                self.push(Response::Transfer { id });
                self.switched = true;
            }
            Err((code, message)) => self.error(id, code, &message),
        }
    }

    /// Whether a pull was resolved: after the packets still queued, the connection carries the transfer
    /// protocol and this session takes no more packets.
    pub fn switched(&self) -> bool {
        self.switched
    }

    /// The next piece to build, when no answer is waiting to go out: reads take turns. After building it,
    /// call [`Server::piece_sent`] (or [`Server::fail`]).
    pub fn next_piece(&mut self) -> Option<Piece> {
        self.next_piece_within(usize::MAX)
    }

    /// [`Server::next_piece`] for a packet of at most about `limit` bytes (the channel's small-first
    /// packet sizing, `ferry_channel::sizing`): the piece's data is `limit` less [`PROOF_ROOM`] for the proof,
    /// rounded down to whole groups, at least one group and at most the configured largest piece.
    pub fn next_piece_within(&mut self, limit: usize) -> Option<Piece> {
        if !self.out.is_empty() {
            return None;
        }
        let (id, left) = self.reads.pop_front()?;
        let limit = u64::try_from(limit)
            .unwrap_or(u64::MAX)
            .saturating_sub(PROOF_ROOM);
        let len = (limit - limit % GROUP).clamp(GROUP, self.config.max_piece);
        let end = if left.is_empty() {
            left.end // the one piece of an empty file
        } else {
            (left.start + len).min(left.end)
        };
        let piece = Piece {
            id,
            range: left.start..end,
        };
        if end < left.end {
            self.reads.push_back((id, end..left.end));
        }
        Some(piece)
    }

    /// The piece `piece` was sent; the read is done after its last one.
    pub fn piece_sent(&mut self, piece: &Piece) {
        if !self.reads.iter().any(|(id, _)| *id == piece.id) {
            self.finish(piece.id);
        }
    }

    /// A request failed in the file-system layer (a read error, a file that changed under its outboard, a
    /// put that cannot be written). A put's remaining data is dropped.
    pub fn fail(&mut self, id: RequestId, code: ErrorCode, message: &str) {
        if let Some(state) = self.in_flight.remove(&id) {
            self.reads.retain(|(r, _)| *r != id);
            self.jobs.retain(|j| j.id() != id);
            if let InFlight::Putting { ended: false, .. } = state {
                self.bury_put(id);
            }
            self.error(id, code, message);
        }
    }

    /// Tells subscribed clients that `paths` changed.
    pub fn changed(&mut self, paths: &[SharePath]) {
        let subs: Vec<RequestId> = self
            .in_flight
            .iter()
            .filter(|(_, s)| **s == InFlight::Subscribed)
            .map(|(id, _)| *id)
            .collect();
        for id in subs {
            for batch in paths.chunks(wire::MAX_CHANGED as usize) {
                self.push(Response::Changed {
                    id,
                    paths: batch.to_vec(),
                });
            }
        }
    }

    /// The next packet to send.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// Whether `id` is a read that still has pieces to come (its file must stay open).
    pub fn is_reading(&self, id: RequestId) -> bool {
        self.in_flight.get(&id) == Some(&InFlight::Reading)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Cancels a request; a write whose job has not run yet never runs (one that ran answered already).
    fn cancel(&mut self, id: RequestId) {
        self.fail(id, ErrorCode::Cancelled, "cancelled");
    }

    fn finish(&mut self, id: RequestId) {
        if self.in_flight.remove(&id).is_some() {
            self.push(Response::Done { id });
        }
    }

    fn refuse(&mut self, id: RequestId, message: String) {
        self.error(id, ErrorCode::UnsafePath, &message);
    }

    fn error(&mut self, id: RequestId, code: ErrorCode, message: &str) {
        if code == ErrorCode::UnsafePath {
            if self.refused.len() == MAX_REFUSED {
                self.refused.pop_front();
            }
            self.refused.push_back(message.to_string());
        }
        self.push(Response::Error {
            id,
            code,
            message: message.to_string(),
        });
    }

    fn push(&mut self, rsp: Response<'_>) {
        let mut buf = Vec::new();
        rsp.encode(&mut buf);
        self.out.push_back(buf);
    }
}

/// A write request's id, job and state in flight.
fn write(id: RequestId, op: WriteOp) -> (RequestId, Option<Job>, InFlight) {
    let named = op.paths().pop().expect("a write names a path");
    (id, Some(Job::Write { id, op }), InFlight::Writing(named))
}
