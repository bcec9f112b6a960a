//! The client's side of a share session, as a state machine: requests in, packets out; packets in, verified
//! events out. No sockets, no clocks.
//!
//! Every byte a [`Event::Data`] hands on has been verified against the version the read announced
//! ([`crate::tree::verify_piece`]); a piece that does not verify fails its read with [`Failure::Integrity`]
//! and hands on nothing. Pieces of one read arrive in order (the server sends them so); reads interleave.
//!
//! Writes: [`Client::put`] starts a file's new content, [`Client::put_data`] (or a packet built in place
//! behind [`Client::put_data_header`]) sends its ranges, [`Client::put_end`] ends it; the answer is
//! [`Event::Done`] or [`Event::Conflicted`]. The other writes ([`Client::mkdir`], ...) answer [`Event::Done`],
//! a rename over a file that changed also [`Event::Conflicted`].

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use crate::bytes::{Bytes, Pool};
use crate::tree::{covering, verify_piece_cvs, verify_piece_in_place, GroupCv, Version, GROUP};
use crate::wire::{
    self, DecodeError, Entry, ErrorCode, Hello, PutHeader, Request, RequestId, Response, SharePath,
    Space, Time, PROTOCOL_VERSION,
};

/// How a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The sharer refused or failed it.
    Remote(ErrorCode, String),
    /// Data that does not match its version: the file changed while it was read, or the sharer lies.
    Integrity,
}

/// What the session learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The sharer's hello: the session is open.
    Ready {
        /// The share's name.
        share: Vec<u8>,
    },
    /// The size and free space of the share's file system.
    Space {
        /// The request.
        id: RequestId,
        /// The figures.
        space: Space,
    },
    /// A stat's answer.
    Attr {
        /// The request.
        id: RequestId,
        /// The attributes.
        entry: Entry,
    },
    /// One page of a listing; `next` is [`crate::wire::END`] after the last.
    Entries {
        /// The request.
        id: RequestId,
        /// The entries.
        entries: Vec<Entry>,
        /// The next page's cursor.
        next: u64,
    },
    /// The version a read is served from (before its data).
    Version {
        /// The request.
        id: RequestId,
        /// The version.
        version: Version,
    },
    /// Verified bytes of a read, from `offset`.
    Data {
        /// The request.
        id: RequestId,
        /// Offset of the first byte.
        offset: u64,
        /// The bytes: their own buffer, or the packet's they came in ([`Client::handle_owned`]).
        bytes: Bytes,
        /// The verified value of each group the bytes make up, in order, as the verification computed
        /// them ([`crate::tree::verify_piece_cvs`]); empty when the read's ends cut a group.
        cvs: Vec<GroupCv>,
    },
    /// A read (or another request) completed.
    Done {
        /// The request.
        id: RequestId,
    },
    /// Paths changed on the sharer.
    Changed {
        /// The paths.
        paths: Vec<SharePath>,
    },
    /// A request failed.
    Failed {
        /// The request.
        id: RequestId,
        /// Why.
        failure: Failure,
    },
    /// A pull was resolved: the next packets are the transfer protocol's, and this session takes no more.
    Transfer {
        /// The pull.
        id: RequestId,
    },
    /// A put's content was verified, but the sharer's file had changed since the put's base: the sharer's
    /// file stayed, and the content was kept beside it as `name` (same directory).
    Conflicted {
        /// The put.
        id: RequestId,
        /// The sibling's name.
        name: Vec<u8>,
    },
}

/// The sharer broke the protocol; the session ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// A packet did not decode.
    #[error("malformed answer: {0}")]
    Malformed(#[from] DecodeError),
    /// No hello first.
    #[error("the sharer did not start with a hello")]
    Hello,
    /// The sharer speaks another version of the share protocol (another ferry release).
    #[error(
        "the sharer speaks share protocol version {theirs}, this ferry version {}: run the same ferry \
         release on both machines",
        PROTOCOL_VERSION
    )]
    Version {
        /// The sharer's version.
        theirs: u16,
    },
    /// An answer that fits no request in flight.
    #[error("unexpected answer for request {0}")]
    Unexpected(RequestId),
    /// A listing's page whose next cursor does not come after the one asked for.
    #[error("the sharer's listing does not move on (cursor {cursor}, then {next})")]
    Cursor {
        /// The cursor asked for.
        cursor: u64,
        /// The next cursor the sharer gave.
        next: u64,
    },
    /// A listing larger than its limit ([`Listing`]).
    #[error(
        "the listing takes more than {max} bytes of memory (after {entries} entries; each counts \
         {ENTRY_COST} bytes plus its name and link target): a very large directory, or a sharer that \
         does not stop"
    )]
    ListingTooLarge {
        /// Entries received when it was refused.
        entries: u64,
        /// The limit, in bytes.
        max: u64,
    },
}

/// The memory one listing (all its pages) may take by default, as `receive --max-manifest`.
pub const DEFAULT_MAX_LISTING: u64 = 64 << 20;
/// What one entry of a listing counts for, besides its name and link target.
pub const ENTRY_COST: u64 = std::mem::size_of::<Entry>() as u64;

/// A directory's listing gathered page by page, refused once it would take more than its limit.
#[derive(Debug)]
pub struct Listing {
    entries: Vec<Entry>,
    bytes: u64,
    max: u64,
}

impl Listing {
    /// An empty listing that may take `max` bytes.
    pub fn new(max: u64) -> Self {
        Listing {
            entries: Vec::new(),
            bytes: 0,
            max,
        }
    }

    /// Adds one page, or fails when the listing would pass its limit.
    pub fn add(&mut self, page: Vec<Entry>) -> Result<(), ClientError> {
        for e in &page {
            self.bytes += ENTRY_COST + e.name.len() as u64 + e.target.len() as u64;
        }
        if self.bytes > self.max {
            return Err(ClientError::ListingTooLarge {
                entries: (self.entries.len() + page.len()) as u64,
                max: self.max,
            });
        }
        self.entries.extend(page);
        Ok(())
    }

    /// The entries gathered.
    pub fn into_entries(self) -> Vec<Entry> {
        self.entries
    }
}

/// All requests in flight are used: wait for answers first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many requests in flight")]
pub struct Busy;

/// Put data that cannot be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PutError {
    /// The id is no put in flight (it failed, or ended).
    #[error("request {0} is no put in flight")]
    NoPut(RequestId),
    /// The range lies outside the put's size, or is over [`wire::MAX_PUT_DATA`].
    #[error("put data outside the put's size")]
    OutOfRange,
}

#[derive(Debug)]
enum Pending {
    Stat,
    Space,
    /// A page asked from `cursor`, of at most `max` entries.
    List {
        cursor: u64,
        max: u32,
    },
    Read {
        want: Range<u64>,
        /// The version the read asked for: after another one was announced, only the sharer's
        /// [`ErrorCode::Changed`] may follow, never data.
        asked: Option<[u8; 32]>,
        version: Option<Version>,
        /// Start of the next piece expected.
        next: u64,
        end: u64,
        /// Verified pieces not handed on yet: the rest of the read fits behind them (see [`COALESCE`]).
        held: Option<Verified>,
    },
    Subscribe,
    Pull,
    Put {
        size: u64,
        ended: bool,
    },
    Write,
}

/// Verified bytes of a read from `start` (group-aligned), with their groups' values.
#[derive(Debug)]
struct Verified {
    start: u64,
    bytes: Vec<u8>,
    cvs: Vec<GroupCv>,
    /// The rest of the read from `start` fits ([`COALESCE`]): pieces are gathered until its end.
    whole: bool,
}

/// A read of at most this many bytes is handed on as one [`Event::Data`] however many pieces the sharer
/// cut it into (a piece is at most one packet: 1 MiB, fewer while the channel's packets grow after a pause):
/// a read in one piece is handed on in its packet's buffer ([`Client::handle_owned`]), one in several
/// pieces gathered into one buffer, so a consumer that reads in units of its requests (the mount: 1 MiB)
/// gets each request's bytes in one place. Of a longer read, pieces are handed on one by one until the rest
/// fits.
pub const COALESCE: u64 = 1 << 20;

/// What of `span` (verified bytes from the sharer, with their groups' values `cvs`) read `want` asked for,
/// which is what is handed on; the values go only with uncut groups, so any cut drops them.
fn handed_on(want: &Range<u64>, span: Range<u64>, cvs: &mut Vec<GroupCv>) -> Range<u64> {
    let from = want.start.max(span.start);
    let to = want.end.min(span.end).max(from);
    if from != span.start || to != span.end {
        cvs.clear();
    }
    from..to
}

/// One session with a sharer.
#[derive(Debug)]
pub struct Client {
    hello_seen: bool,
    max_in_flight: u32,
    next_id: RequestId,
    pending: HashMap<RequestId, Pending>,
    /// Cancelled reads whose last answers may still be on their way.
    cancelled: HashMap<RequestId, ()>,
    out: VecDeque<Vec<u8>>,
}

impl Client {
    /// A session that keeps at most `max_in_flight` requests in flight (the sharer may lower it); its hello
    /// is the first packet out.
    pub fn new(max_in_flight: u32) -> Self {
        let mut hello = Vec::new();
        Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            max_in_flight,
            share: Vec::new(),
        })
        .encode(&mut hello);
        Client {
            hello_seen: false,
            max_in_flight: max_in_flight.max(1),
            next_id: 1,
            pending: HashMap::new(),
            cancelled: HashMap::new(),
            out: VecDeque::from([hello]),
        }
    }

    /// Whether another request fits in flight.
    pub fn has_room(&self) -> bool {
        self.pending.len() < self.max_in_flight as usize
    }

    /// Asks for `path`'s attributes.
    pub fn stat(&mut self, path: SharePath) -> Result<RequestId, Busy> {
        self.send(Pending::Stat, |id| Request::Stat { id, path })
    }

    /// Asks for the size and free space of the share's file system.
    pub fn space(&mut self) -> Result<RequestId, Busy> {
        self.send(Pending::Space, |id| Request::SpaceOf { id })
    }

    /// Asks for one page of a listing.
    pub fn list(&mut self, path: SharePath, cursor: u64, max: u32) -> Result<RequestId, Busy> {
        let max = max.clamp(1, crate::wire::MAX_PAGE_ENTRIES);
        self.send(Pending::List { cursor, max }, |id| Request::List {
            id,
            path,
            cursor,
            max,
        })
    }

    /// Asks for `len` bytes from `offset` of `path` (cut at its end), of `version` if given.
    pub fn read(
        &mut self,
        path: SharePath,
        version: Option<[u8; 32]>,
        offset: u64,
        len: u64,
    ) -> Result<RequestId, Busy> {
        let want = offset..offset.saturating_add(len);
        self.send(
            Pending::Read {
                want,
                asked: version,
                version: None,
                next: 0,
                end: 0,
                held: None,
            },
            |id| Request::Read {
                id,
                path,
                version,
                offset,
                len,
            },
        )
    }

    /// Asks for change notifications.
    pub fn subscribe(&mut self) -> Result<RequestId, Busy> {
        self.send(Pending::Subscribe, |id| Request::Subscribe { id })
    }

    /// Asks for the file or subtree `path` by the transfer protocol: the connection's only request. Its
    /// answer is [`Event::Transfer`] (or a failure); the packets after it are the transfer protocol's.
    pub fn pull(&mut self, path: SharePath) -> Result<RequestId, Busy> {
        self.send(Pending::Pull, |id| Request::Pull { id, path })
    }

    /// Starts writing a file (see [`Request::Put`]); its data follows with [`Client::put_data`], then
    /// [`Client::put_end`].
    pub fn put(&mut self, put: PutHeader) -> Result<RequestId, Busy> {
        let put = PutHeader {
            from_base: put.from_base && put.base.is_some(),
            ..put
        };
        let pending = Pending::Put {
            size: put.size,
            ended: false,
        };
        self.send(pending, |id| Request::Put { id, put })
    }

    /// Checks a range of the put `id` and gives the header of its [`wire::PUT_DATA`] packet, for a packet
    /// built in place (the `len` bytes follow the header).
    pub fn put_data_header(
        &self,
        id: RequestId,
        offset: u64,
        len: usize,
    ) -> Result<[u8; wire::PUT_DATA_HEADER_LEN], PutError> {
        match self.pending.get(&id) {
            Some(Pending::Put { size, ended: false }) => {
                let fits = len <= wire::MAX_PUT_DATA
                    && offset
                        .checked_add(len as u64)
                        .is_some_and(|end| end <= *size);
                match fits {
                    true => Ok(wire::put_data_header(id, offset)),
                    false => Err(PutError::OutOfRange),
                }
            }
            _ => Err(PutError::NoPut(id)),
        }
    }

    /// Queues `bytes` at `offset` of the put `id`.
    pub fn put_data(&mut self, id: RequestId, offset: u64, bytes: &[u8]) -> Result<(), PutError> {
        let header = self.put_data_header(id, offset, bytes.len())?;
        let mut packet = Vec::with_capacity(header.len() + bytes.len());
        packet.extend_from_slice(&header);
        packet.extend_from_slice(bytes);
        self.out.push_back(packet);
        Ok(())
    }

    /// Ends the put `id`: the sharer verifies the content against `root` (its BLAKE3 root) and makes it
    /// visible.
    pub fn put_end(&mut self, id: RequestId, root: [u8; 32]) -> Result<(), PutError> {
        match self.pending.get_mut(&id) {
            Some(Pending::Put { ended, .. }) if !*ended => {
                *ended = true;
                let mut buf = Vec::new();
                Request::PutEnd { id, root }.encode(&mut buf);
                self.out.push_back(buf);
                Ok(())
            }
            _ => Err(PutError::NoPut(id)),
        }
    }

    /// Creates the directory `path`.
    pub fn mkdir(&mut self, path: SharePath, mode: u32) -> Result<RequestId, Busy> {
        self.send(Pending::Write, |id| Request::Mkdir { id, path, mode })
    }

    /// Removes the empty directory `path`.
    pub fn rmdir(&mut self, path: SharePath) -> Result<RequestId, Busy> {
        self.send(Pending::Write, |id| Request::Rmdir { id, path })
    }

    /// Removes the file or symlink `path`; a file that is no longer the version `base` (when given) stays.
    pub fn unlink(&mut self, path: SharePath, base: Option<[u8; 32]>) -> Result<RequestId, Busy> {
        self.send(Pending::Write, |id| Request::Unlink { id, path, base })
    }

    /// Renames `from` to `to` (replacing an existing `to` only when `replace`); a file at `to` that is no
    /// longer the version `base` (when given) stays, and `from` is kept beside it ([`Event::Conflicted`]).
    pub fn rename(
        &mut self,
        from: SharePath,
        to: SharePath,
        replace: bool,
        base: Option<[u8; 32]>,
    ) -> Result<RequestId, Busy> {
        self.send(Pending::Write, |id| Request::Rename {
            id,
            from,
            to,
            replace,
            base,
        })
    }

    /// Changes the permission bits and/or modification time of `path`.
    pub fn set_attr(
        &mut self,
        path: SharePath,
        mode: Option<u32>,
        mtime: Option<Time>,
    ) -> Result<RequestId, Busy> {
        self.send(Pending::Write, |id| Request::SetAttr {
            id,
            path,
            mode,
            mtime,
        })
    }

    /// Creates a symlink at `path` to `target` (relative, staying inside the share, or the sharer refuses).
    pub fn symlink(&mut self, path: SharePath, target: Vec<u8>) -> Result<RequestId, Busy> {
        self.send(Pending::Write, |id| Request::Symlink { id, path, target })
    }

    /// Cancels a request; answers already on their way are dropped.
    pub fn cancel(&mut self, id: RequestId) {
        if self.pending.remove(&id).is_some() {
            self.cancelled.insert(id, ());
            let mut buf = Vec::new();
            Request::Cancel { id }.encode(&mut buf);
            self.out.push_back(buf);
        }
    }

    /// The next packet to send.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// Takes one packet from the sharer.
    pub fn handle(&mut self, packet: &[u8]) -> Result<Option<Event>, ClientError> {
        self.handle_in(packet, None)
    }

    /// [`Client::handle`] for a packet at `contents` of a buffer the caller hands over (the one it was
    /// received in: [`ferry_channel::blocking::SecureReader::recv_taking`]). A piece that brings the whole
    /// rest of a read is verified where it lies and its bytes handed on in this buffer, which goes back to
    /// `pool` when they are dropped: no copy. Any other packet is handled as by [`Client::handle`], and the
    /// buffer goes back to `pool` at once.
    pub fn handle_owned(
        &mut self,
        buf: Vec<u8>,
        contents: Range<usize>,
        pool: &Arc<Pool>,
    ) -> Result<Option<Event>, ClientError> {
        let mut in_place = None;
        let mut event = self.handle_in(&buf[contents.clone()], Some(&mut in_place))?;
        match (in_place, event.as_mut()) {
            (Some(at), Some(Event::Data { bytes, .. })) => {
                let range = contents.start + at.start..contents.start + at.end;
                *bytes = Bytes::in_buffer(buf, range, Some(Arc::clone(pool)));
            }
            // Copied out (or nothing to hand on): the buffer is free again.
            _ => pool.give(buf),
        }
        Ok(event)
    }

    /// Handles `packet`; with `in_place`, a piece that is the whole rest of its read is verified where it
    /// lies, its [`Event::Data`] gets empty bytes, and `in_place` says where in `packet` its bytes are.
    fn handle_in(
        &mut self,
        packet: &[u8],
        in_place: Option<&mut Option<Range<usize>>>,
    ) -> Result<Option<Event>, ClientError> {
        let rsp = Response::decode(packet)?;
        if !self.hello_seen {
            return match rsp {
                Response::Hello(h) if h.version == PROTOCOL_VERSION => {
                    self.hello_seen = true;
                    self.max_in_flight = self.max_in_flight.min(h.max_in_flight.max(1));
                    Ok(Some(Event::Ready { share: h.share }))
                }
                Response::Hello(h) => Err(ClientError::Version { theirs: h.version }),
                _ => Err(ClientError::Hello),
            };
        }
        let id = match &rsp {
            Response::Hello(_) => return Err(ClientError::Hello),
            Response::Entries { id, .. }
            | Response::Attr { id, .. }
            | Response::Version { id, .. }
            | Response::Data { id, .. }
            | Response::Done { id }
            | Response::Changed { id, .. }
            | Response::Error { id, .. }
            | Response::Transfer { id }
            | Response::Conflicted { id, .. }
            | Response::Space { id, .. } => *id,
        };
        let Some(pending) = self.pending.get_mut(&id) else {
            if self.cancelled.contains_key(&id) {
                if matches!(rsp, Response::Error { .. } | Response::Done { .. }) {
                    self.cancelled.remove(&id);
                }
                return Ok(None);
            }
            return Err(ClientError::Unexpected(id));
        };
        let event = match (pending, rsp) {
            (_, Response::Error { code, message, .. }) => {
                self.pending.remove(&id);
                Event::Failed {
                    id,
                    failure: Failure::Remote(code, message),
                }
            }
            (Pending::Stat, Response::Attr { entry, .. }) => {
                self.pending.remove(&id);
                Event::Attr { id, entry }
            }
            (Pending::Space, Response::Space { space, .. }) => {
                self.pending.remove(&id);
                Event::Space { id, space }
            }
            (Pending::List { cursor, max }, Response::Entries { entries, next, .. }) => {
                let (cursor, max) = (*cursor, *max);
                // A cursor that does not move on (or a page larger than asked) would have the client ask
                // for ever and keep what it got.
                if next != crate::wire::END && next <= cursor {
                    return Err(ClientError::Cursor { cursor, next });
                }
                if entries.len() > max as usize {
                    return Err(ClientError::Unexpected(id));
                }
                self.pending.remove(&id);
                Event::Entries { id, entries, next }
            }
            (Pending::Subscribe, Response::Changed { paths, .. }) => Event::Changed { paths },
            (Pending::Pull, Response::Transfer { .. }) => {
                self.pending.remove(&id);
                Event::Transfer { id }
            }
            (Pending::Put { .. } | Pending::Write, Response::Done { .. }) => {
                self.pending.remove(&id);
                Event::Done { id }
            }
            // A put, or a rename over a file that changed since the version it named.
            (Pending::Put { .. } | Pending::Write, Response::Conflicted { name, .. }) => {
                self.pending.remove(&id);
                Event::Conflicted { id, name }
            }
            (
                Pending::Read {
                    want,
                    version: v @ None,
                    next,
                    end,
                    ..
                },
                Response::Version { size, root, .. },
            ) => {
                let version = Version { size, root };
                let range = covering(size, want.start, want.end - want.start);
                *v = Some(version);
                *next = range.start;
                *end = range.end;
                Event::Version { id, version }
            }
            (
                Pending::Read {
                    want,
                    asked,
                    version: Some(version),
                    next,
                    end,
                    held,
                },
                Response::Data {
                    offset, len, piece, ..
                },
            ) => {
                let range = offset..offset.saturating_add(u64::from(len));
                // In order, inside the read, and of the version asked for (after announcing another one
                // the sharer must refuse the read, never send data).
                let expected = offset == *next
                    && range.end <= *end
                    && asked.is_none_or(|root| root == version.root);
                // A piece past the end fails the check below; sized without underflow first.
                let whole = end.saturating_sub(range.start);
                if let Some(at) =
                    in_place.filter(|_| expected && held.is_none() && range.end == *end)
                {
                    // The whole rest of the read in one piece, in a buffer the caller owns: verified and
                    // handed on where it lies.
                    let mut cvs = Vec::with_capacity(whole.div_ceil(GROUP) as usize);
                    let Ok(data) = verify_piece_in_place(version, range.clone(), piece, &mut cvs)
                    else {
                        return Ok(Some(self.failed_integrity(id)));
                    };
                    *next = range.end;
                    let part = handed_on(want, range.clone(), &mut cvs);
                    // The piece is the packet's rest, after the data header.
                    let piece_at = packet.len() - piece.len();
                    let first = piece_at + data.start + (part.start - range.start) as usize;
                    *at = Some(first..first + (part.end - part.start) as usize);
                    return Ok(Some(Event::Data {
                        id,
                        offset: part.start,
                        bytes: Bytes::from(Vec::new()),
                        cvs,
                    }));
                }
                let acc = held.get_or_insert_with(|| {
                    // Room for the whole rest of the read when it may be coalesced, else this piece.
                    let fits = whole <= COALESCE;
                    let room = if fits { whole } else { u64::from(len) };
                    Verified {
                        start: range.start,
                        bytes: Vec::with_capacity(room as usize),
                        cvs: Vec::with_capacity(room.div_ceil(GROUP) as usize),
                        whole: fits,
                    }
                });
                if !expected
                    || verify_piece_cvs(version, range.clone(), piece, &mut acc.bytes, &mut acc.cvs)
                        .is_err()
                {
                    return Ok(Some(self.failed_integrity(id)));
                }
                *next = range.end;
                // More to come and room for all of it: handed on with the rest.
                if range.end < *end && acc.whole {
                    return Ok(None);
                }
                let Verified {
                    start,
                    mut bytes,
                    mut cvs,
                    ..
                } = held.take().expect("set above");
                let part = handed_on(want, start..range.end, &mut cvs);
                // In place: the pieces' bytes are not copied again.
                bytes.truncate((part.end - start) as usize);
                bytes.drain(..(part.start - start) as usize);
                Event::Data {
                    id,
                    offset: part.start,
                    bytes: bytes.into(),
                    cvs,
                }
            }
            (
                Pending::Read {
                    version: Some(_),
                    next,
                    end,
                    ..
                },
                Response::Done { .. },
            ) => {
                let complete = next == end;
                self.pending.remove(&id);
                if !complete {
                    return Ok(Some(Event::Failed {
                        id,
                        failure: Failure::Integrity,
                    }));
                }
                Event::Done { id }
            }
            _ => return Err(ClientError::Unexpected(id)),
        };
        Ok(Some(event))
    }

    /// Fails read `id` after a piece that did not verify, and cancels its other pieces (they are dropped
    /// when they come).
    fn failed_integrity(&mut self, id: RequestId) -> Event {
        self.cancel(id);
        Event::Failed {
            id,
            failure: Failure::Integrity,
        }
    }

    fn send(
        &mut self,
        pending: Pending,
        request: impl FnOnce(RequestId) -> Request,
    ) -> Result<RequestId, Busy> {
        if !self.has_room() {
            return Err(Busy);
        }
        let id = self.next_id;
        // Ids wrap after 4 billion requests; one still in flight is skipped.
        self.next_id = self.next_id.wrapping_add(1).max(1);
        while self.pending.contains_key(&self.next_id) || self.cancelled.contains_key(&self.next_id)
        {
            self.next_id = self.next_id.wrapping_add(1).max(1);
        }
        let mut buf = Vec::new();
        request(id).encode(&mut buf);
        self.out.push_back(buf);
        self.pending.insert(id, pending);
        Ok(id)
    }
}
