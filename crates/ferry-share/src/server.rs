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
//! A pull ([`Job::Pull`]) is the connection's only request: once the IO layer reports its path resolved
//! ([`Server::pull_resolved`]), the session's last packet out is [`crate::wire::Response::Transfer`] and it
//! takes no more packets ([`Server::switched`]): the connection carries the transfer protocol from there.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use crate::tree::{covering, Version, GROUP};
use crate::wire::{
    self, DecodeError, Entry, ErrorCode, Hello, Request, RequestId, Response, SharePath,
    PROTOCOL_VERSION,
};

/// The largest piece by default: a channel packet holds 1 MiB, and a piece's header and proof fit in the
/// 16 KiB left (the parents inside the piece, 64 bytes per group: 7.9 KiB with 8 KiB groups, and those on
/// its path from the root, at most 4 KiB).
pub const DEFAULT_PIECE: u64 = (1 << 20) - (16 << 10);
const _: () = assert!(DEFAULT_PIECE.is_multiple_of(GROUP));

/// Settings of a share's sessions.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The share's name, sent in the hello.
    pub share: Vec<u8>,
    /// Most requests one client may have in flight; more are answered [`ErrorCode::Busy`].
    pub max_in_flight: u32,
    /// Largest piece, in bytes (a multiple of [`GROUP`]).
    pub max_piece: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            share: Vec::new(),
            max_in_flight: 256,
            max_piece: DEFAULT_PIECE,
        }
    }
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
    /// The first message was not a hello, or the version is not ours.
    #[error("the client did not start with a compatible hello")]
    Hello,
    /// An id that is already in flight.
    #[error("request id {0} is already in flight")]
    DuplicateId(RequestId),
    /// A packet after the connection switched to the transfer protocol for a pull.
    #[error("the connection carries a pull")]
    Switched,
}

/// What a request in flight is waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum InFlight {
    Job,
    Opening {
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    },
    Reading,
    Subscribed,
    Pulling,
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
}

/// Refusals kept for the log until taken.
const MAX_REFUSED: usize = 64;

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
        }
    }

    /// Takes one packet from the client.
    pub fn handle(&mut self, packet: &[u8]) -> Result<(), ServerError> {
        if self.switched {
            return Err(ServerError::Switched);
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
        };
        if self.in_flight.contains_key(&id) {
            return Err(ServerError::DuplicateId(id));
        }
        let pulling = self.in_flight.values().any(|s| *s == InFlight::Pulling);
        if pulling || (state == InFlight::Pulling && !self.in_flight.is_empty()) {
            // The transfer protocol takes the whole connection: a pull goes alone.
            self.error(
                id,
                ErrorCode::BadRequest,
                "a pull must be the only request of its connection",
            );
            return Ok(());
        }
        if self.in_flight.len() >= self.config.max_in_flight as usize {
            self.error(id, ErrorCode::Busy, "too many requests in flight");
            return Ok(());
        }
        self.in_flight.insert(id, state);
        self.jobs.extend(job);
        Ok(())
    }

    /// The next request refused for trying to leave the share, described for the sharer's log.
    pub fn next_refusal(&mut self) -> Option<String> {
        self.refused.pop_front()
    }

    /// The next job for the file-system layer.
    pub fn next_job(&mut self) -> Option<Job> {
        self.jobs.pop_front()
    }

    /// Reports a stat.
    pub fn stat_done(&mut self, id: RequestId, result: Result<Entry, (ErrorCode, String)>) {
        if self.in_flight.remove(&id).is_none() {
            return; // cancelled meanwhile
        }
        match result {
            Ok(entry) => self.push(Response::Attr { id, entry }),
            Err((code, message)) => self.error(id, code, &message),
        }
    }

    /// Reports one page of a listing (`next` is [`wire::END`] after the last page).
    pub fn list_done(
        &mut self,
        id: RequestId,
        result: Result<(Vec<Entry>, u64), (ErrorCode, String)>,
    ) {
        if self.in_flight.remove(&id).is_none() {
            return;
        }
        match result {
            Ok((entries, next)) => self.push(Response::Entries { id, entries, next }),
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
        if !self.out.is_empty() {
            return None;
        }
        let (id, left) = self.reads.pop_front()?;
        let end = if left.is_empty() {
            left.end // the one piece of an empty file
        } else {
            (left.start + self.config.max_piece).min(left.end)
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

    /// A request failed in the file-system layer (a read error, a file that changed under its outboard).
    pub fn fail(&mut self, id: RequestId, code: ErrorCode, message: &str) {
        if self.in_flight.remove(&id).is_some() {
            self.reads.retain(|(r, _)| *r != id);
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

    fn cancel(&mut self, id: RequestId) {
        if self.in_flight.remove(&id).is_some() {
            self.jobs.retain(|j| match j {
                Job::Stat { id: j, .. }
                | Job::List { id: j, .. }
                | Job::Open { id: j, .. }
                | Job::Pull { id: j, .. } => *j != id,
            });
            self.reads.retain(|(r, _)| *r != id);
            self.error(id, ErrorCode::Cancelled, "cancelled");
        }
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
