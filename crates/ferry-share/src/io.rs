//! Blocking IO around the sans-IO sessions: a share served, and a share used, over an established channel.
//!
//! The server reads packets on a thread of its own (so a client's cancel or stat reaches the session while
//! pieces are being written) and runs everything else on the caller's thread: the session's jobs against
//! [`ShareRoot`], its answers, then its pieces, each built and sent before the next packet is handled.
//!
//! A pull switches the connection to the transfer protocol: once its path is resolved and walked
//! ([`Subtree`]), [`serve`] sends the session's last answer and runs [`ferry_transfer::send_from`] on the
//! subtree, the packets from the reading thread as its source, until the client confirmed or failed.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_channel::ChannelError;

use crate::client::{Client, ClientError, Event, Failure, Listing, DEFAULT_MAX_LISTING};
use crate::fs::{Cached, FileId, OutboardCache, ShareRoot};
use crate::server::{Job, Piece, PutOutcome, Server, ServerConfig, ServerError, WriteOp};
use crate::subtree::Subtree;
use crate::tree::{encode_piece_from_file, Version, GROUP};
use crate::wire::{self, Entry, ErrorCode, RequestId, SharePath, Time, END};
use crate::write::{sibling, Upload};

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The channel failed (the peer went away, or tampering).
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The client broke the protocol.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The sharer broke the protocol.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A request failed.
    #[error("{}: {}", .0.as_str(), .1)]
    Remote(ErrorCode, String),
    /// Data did not verify against its version.
    #[error("the data does not match its version's hash (the file changed while it was read, or the sharer is faulty)")]
    Integrity,
    /// A local file could not be written.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The peer closed the session.
    #[error("the peer closed the session")]
    Closed,
    /// A range ends past the end of the file.
    #[error("the range ends past the end of the file ({size} bytes)")]
    PastEnd {
        /// The file's size.
        size: u64,
    },
    /// A pull's transfer failed (on either side; the other side was told).
    #[error(transparent)]
    Transfer(#[from] ferry_transfer::TransferError),
}

impl SessionError {
    /// The code that classifies this failure for scripts and exit statuses.
    pub fn code(&self) -> ferry_wire::ErrorCode {
        use ferry_wire::ErrorCode as C;
        match self {
            SessionError::Channel(e) => match e {
                ChannelError::Io(_) | ChannelError::Truncated | ChannelError::Closed => C::PeerGone,
                ChannelError::Tampered => C::Tampered,
                _ => C::Protocol,
            },
            // Another ferry release on the other side: as the channel's own version mismatch.
            SessionError::Server(ServerError::Version { .. })
            | SessionError::Client(ClientError::Version { .. }) => C::VersionMismatch,
            SessionError::Server(_) | SessionError::Client(_) => C::Protocol,
            SessionError::Remote(code, _) => match code {
                // As a local path that is not there, or not of the kind asked for.
                ErrorCode::NotFound | ErrorCode::WrongKind => C::Io,
                ErrorCode::BadRequest => C::Protocol,
                ErrorCode::UnsafePath => C::UnsafePath,
                ErrorCode::Changed => C::SourceChanged,
                ErrorCode::Permission | ErrorCode::HardLinked => C::Permission,
                ErrorCode::Busy | ErrorCode::Cancelled => C::Remote,
                ErrorCode::Io | ErrorCode::NotEmpty => C::Io,
                // The sharer does not let this peer write: as a file it may not write.
                ErrorCode::ReadOnly => C::Permission,
                ErrorCode::Conflict | ErrorCode::Exists => C::Conflict,
                ErrorCode::Integrity => C::Integrity,
                ErrorCode::DiskFull => C::DiskFull,
            },
            SessionError::Integrity => C::Integrity,
            SessionError::Io(_) => C::Io,
            SessionError::Closed => C::PeerGone,
            SessionError::PastEnd { .. } => C::Error,
            // A peer's code is untrusted text: only the codes a peer's transfer reports keep their class.
            SessionError::Transfer(ferry_transfer::TransferError::Remote { code, .. }) => {
                C::parse(code)
                    .filter(|c| ferry_transfer::TransferError::PEER_CODES.contains(c))
                    .unwrap_or(C::Remote)
            }
            SessionError::Transfer(e) => e.code(),
        }
    }
}

/// What reaches a session's loop: a packet from its client, or changes in the share.
enum Input {
    Packet(Result<Vec<u8>, ChannelError>),
    /// The client hung up.
    Closed,
    Changed(Vec<SharePath>),
    /// A request that only looks is waiting in [`Looks`].
    Look,
}

/// Requests that only look (a listing, a stat, a read, the space), read off the connection while nothing but
/// put data waits ahead of them in the inbox: the session takes them before that data, so browsing a mount
/// that pushes a large file does not wait for megabytes to be written first (the jobs keep that order:
/// [`Server::next_job`]). Every other packet keeps its place.
#[derive(Default)]
struct Looks {
    queue: Mutex<VecDeque<Vec<u8>>>,
    /// Packets other than put data sent to the inbox and not handled yet: while there are any, a request
    /// that only looks waits behind them in the inbox too.
    in_line: AtomicUsize,
}

impl Looks {
    /// Takes `packet` ahead if it may go there.
    fn offer(&self, packet: &[u8]) -> bool {
        if !wire::only_looks(packet) {
            return false;
        }
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if self.in_line.load(Ordering::SeqCst) != 0 || queue.len() >= INPUT_QUEUE {
            return false;
        }
        queue.push_back(packet.to_vec());
        true
    }

    fn take(&self) -> VecDeque<Vec<u8>> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A session's inbox, and whether a change announcement did not fit in it.
type Inbox = (mpsc::SyncSender<Input>, Arc<AtomicBool>);

/// Change announcements for every session of a share (from [`crate::watch`]).
#[derive(Clone, Default)]
pub struct Changes {
    sessions: Arc<Mutex<Vec<Inbox>>>,
}

impl Changes {
    /// Announces `paths` to every session. A session whose inbox is full is told later that anything
    /// may have changed (the whole share), so nothing is lost and nothing waits for a slow client.
    pub fn publish(&self, paths: Vec<SharePath>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(
            |(tx, missed)| match tx.try_send(Input::Changed(paths.clone())) {
                Ok(()) => true,
                Err(mpsc::TrySendError::Full(_)) => {
                    missed.store(true, Ordering::Relaxed);
                    true
                }
                Err(mpsc::TrySendError::Disconnected(_)) => false,
            },
        );
    }

    fn register(&self, inbox: Inbox) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(inbox);
    }
}

/// Packets read ahead of the session (and taken at once before the jobs run).
const INPUT_QUEUE: usize = 64;

/// Put data taken into jobs ahead of being written.
const DATA_AHEAD: usize = 16 << 20;

/// Put data written in one turn of a session's loop.
const DATA_TURN: usize = 4 << 20;

/// Serves `root` to one client until it hangs up. Requests that try to leave the share are refused with
/// `unsafe-path` and reported to `log` (`refused: ...`), as are puts that ended in a conflict
/// (`conflict: ...`). Writes (when [`ServerConfig::writable`]) are announced on `changes`.
pub fn serve<R, W>(
    mut reader: SecureReader<R>,
    mut writer: SecureWriter<W>,
    root: &ShareRoot,
    cache: &OutboardCache,
    changes: &Changes,
    config: ServerConfig,
    log: &mut dyn FnMut(&str),
) -> Result<(), SessionError>
where
    R: Read + Send + 'static,
    W: Write,
{
    // A 1 MiB piece goes with its proof in one packet (the client's reader accepts it: wire::MAX_PACKET).
    writer.set_max_payload(wire::MAX_PACKET);
    let (tx, rx) = mpsc::sync_channel::<Input>(INPUT_QUEUE);
    let missed = Arc::new(AtomicBool::new(false));
    changes.register((tx.clone(), Arc::clone(&missed)));
    let looks = Arc::new(Looks::default());
    let ahead = Arc::clone(&looks);
    std::thread::spawn(move || {
        // After a pull the transfer protocol's packets follow: none of them goes ahead.
        let mut pulled = false;
        loop {
            let item = match reader.recv() {
                Ok(Some(p)) => {
                    pulled |= p.first() == Some(&wire::PULL);
                    if !pulled && ahead.offer(p) {
                        // A loop waiting for input wakes; a full inbox is taken soon anyway.
                        let _ = tx.try_send(Input::Look);
                        continue;
                    }
                    if !wire::is_put_data(p) {
                        ahead.in_line.fetch_add(1, Ordering::SeqCst);
                    }
                    Input::Packet(Ok(p.to_vec()))
                }
                Ok(None) => Input::Closed,
                Err(e) => Input::Packet(Err(e)),
            };
            let last = !matches!(item, Input::Packet(Ok(_)));
            if tx.send(item).is_err() || last {
                return;
            }
        }
    });
    let mut server = Server::new(config);
    let mut files = Files::new(root, cache);
    files.publish_to(changes.clone());
    loop {
        // Answers first, then one piece; block for input only when there is nothing to send.
        while let Some(out) = server.poll_transmit() {
            writer.send(&out)?;
        }
        // Pieces start small on a fresh (or rested) connection, as the transfer engine's packets do:
        // the first bytes can be verified before TCP's window has grown.
        let idle = match server.next_piece_within(writer.packet_limit()) {
            Some(piece) => {
                let sent = if piece.range.end - piece.range.start < SMALL_PIECE {
                    // A small piece is built in place among the answers waiting to go out in one
                    // write; a large one is sealed where it was built.
                    let room = SMALL_PIECE as usize + GROUP as usize;
                    match writer.send_built(room, |buf| files.build_piece(&piece, buf))? {
                        Ok(()) => Ok(true),
                        Err(e) => Ok(fail(&mut server, &piece, e)),
                    }
                } else {
                    let max = writer.max_payload();
                    match files.build_piece(&piece, writer.payload_buf(max)?) {
                        Ok(len) => writer.send_payload_buf(len).map(|()| true),
                        Err(e) => Ok(fail(&mut server, &piece, e)),
                    }
                };
                if sent? {
                    server.piece_sent(&piece);
                    files.forget_if_done(&server, piece.id);
                }
                false
            }
            None => true,
        };
        // Requests that only look first: ahead of the put data in the inbox and in the jobs.
        let looked = looks.take();
        let idle = idle && looked.is_empty() && !server.has_jobs();
        for p in &looked {
            server.handle(p)?;
        }
        // At most a channel's worth of packets before their jobs run, and no more once DATA_AHEAD of put
        // data waits to be written: a put's data (up to 1 MiB a packet) never piles up in memory faster than
        // it is written.
        let room = |server: &Server| server.data_queued() < DATA_AHEAD;
        let mut next = if idle {
            writer.flush()?;
            rx.recv().ok()
        } else if room(&server) {
            rx.try_recv().ok()
        } else {
            None
        };
        let mut taken = 0;
        while let Some(input) = next {
            match input {
                Input::Packet(p) => {
                    let p = p?;
                    server.handle(&p)?;
                    if !wire::is_put_data(&p) {
                        looks.in_line.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                Input::Closed => return Ok(()),
                Input::Changed(paths) => server.changed(&paths),
                Input::Look => {
                    for p in looks.take() {
                        server.handle(&p)?;
                    }
                }
            }
            taken += 1;
            next = match taken < INPUT_QUEUE && room(&server) {
                true => rx.try_recv().ok(),
                false => None,
            };
        }
        if missed.swap(false, Ordering::Relaxed) {
            server.changed(&[SharePath::root()]);
        }
        // A turn of put data at a time: the answers, pieces and requests that came meanwhile go between.
        files.run_within(&mut server, DATA_TURN);
        // Reads that ended by their last piece were forgotten above; failed and cancelled ones (and puts)
        // here. Not by comparing counts with the requests in flight: a subscription or a stat in flight
        // hid a cancelled put, whose temp file and promised space then stayed until the link closed.
        if !files.open.is_empty() || !files.uploads.is_empty() {
            files.forget_done(&server);
        }
        while let Some(refusal) = server.next_refusal() {
            log(&format!("refused: {refusal}"));
        }
        while let Some(conflict) = server.next_conflict() {
            log(&format!("conflict: {conflict}"));
        }
        if server.switched() {
            while let Some(out) = server.poll_transmit() {
                writer.send(&out)?;
            }
            let subtree = files
                .take_pull()
                .expect("a switched session resolved its pull");
            return send_pull(&subtree, writer, rx, log);
        }
    }
}

/// Sends a resolved pull with the transfer protocol; the client's packets come from `rx`.
fn send_pull<W: Write>(
    subtree: &Subtree,
    writer: SecureWriter<W>,
    rx: mpsc::Receiver<Input>,
    log: &mut dyn FnMut(&str),
) -> Result<(), SessionError> {
    let shown = String::from_utf8_lossy(subtree.path().as_bytes()).into_owned();
    for warning in &subtree.walk().warnings {
        log(&format!("pull {shown:?}: {warning}"));
    }
    let opts = ferry_transfer::SendOptions {
        max_packet: writer.max_payload().min(ferry_transfer::MAX_PACKET),
        ..Default::default()
    };
    let mut sink = ferry_transfer::secure::ChannelSink(writer);
    let mut source = PullSource {
        rx,
        packet: Vec::new(),
    };
    let manifest = &subtree.walk().manifest;
    let sent = ferry_transfer::send_from(&mut sink, &mut source, manifest, subtree, &opts, &mut ());
    match sent {
        Ok(report) => {
            log(&format!(
                "pull {shown:?}: {} file{}, {} bytes sent, {} resumed",
                report.files,
                if report.files == 1 { "" } else { "s" },
                report.bytes_sent,
                report.bytes_resumed
            ));
            sink.0.flush()?;
            Ok(())
        }
        Err(e) => {
            log(&format!("pull {shown:?} failed: {e}"));
            Err(e.into())
        }
    }
}

/// The client's packets, from the reading thread, as the transfer engine's packet source (change
/// announcements are not for a pull).
struct PullSource {
    rx: mpsc::Receiver<Input>,
    packet: Vec<u8>,
}

impl ferry_transfer::PacketSource for PullSource {
    fn recv(&mut self) -> io::Result<Option<&mut [u8]>> {
        loop {
            match self.rx.recv() {
                Ok(Input::Packet(Ok(p))) => {
                    self.packet = p;
                    return Ok(Some(&mut self.packet));
                }
                Ok(Input::Packet(Err(e))) => return Err(e.into_io()),
                Ok(Input::Closed) => return Ok(None),
                Ok(Input::Changed(_) | Input::Look) => {}
                Err(_) => return Err(io::ErrorKind::UnexpectedEof.into()),
            }
        }
    }
}

fn fail(server: &mut Server, piece: &Piece, (code, message): (ErrorCode, String)) -> bool {
    server.fail(piece.id, code, &message);
    false
}

/// Pieces smaller than this are gathered with other packets into one write (the channel's writer does that
/// for packets under 64 KiB); larger ones are built in the writer's packet buffer, not copied again.
const SMALL_PIECE: u64 = 32 << 10;

/// A file being read: its descriptor, its outboard, and the identity the outboard belongs to.
#[derive(Clone)]
struct Opened {
    file: Arc<File>,
    cached: Cached,
}

/// The file-system side of one session: runs a [`Server`]'s jobs against the share and builds its pieces,
/// keeping each read's file open until the read ends. [`serve`] drives it over a channel; anything else
/// (another event loop, a test) can drive it with packets of its own.
pub struct Files<'a> {
    root: &'a ShareRoot,
    cache: &'a OutboardCache,
    open: HashMap<RequestId, Opened>,
    /// A pull resolved and walked, to send once the session switched.
    pulled: Option<Subtree>,
    /// Puts receiving their content (each temp file removed if its put ends otherwise).
    uploads: HashMap<RequestId, Upload>,
    /// Where writes are announced.
    changes: Option<Changes>,
}

impl<'a> Files<'a> {
    /// The files of `root`, with outboards from `cache`.
    pub fn new(root: &'a ShareRoot, cache: &'a OutboardCache) -> Self {
        Files {
            root,
            cache,
            open: HashMap::new(),
            pulled: None,
            uploads: HashMap::new(),
            changes: None,
        }
    }

    /// Announces every write that lands to `changes` (the share's change feed: every session hears of it).
    pub fn publish_to(&mut self, changes: Changes) {
        self.changes = Some(changes);
    }

    fn publish(&self, paths: Vec<SharePath>) {
        if let Some(c) = &self.changes {
            c.publish(paths);
        }
    }

    /// Runs every job `server` has and reports their results. Reads of one path among them share one
    /// open of it (and its outboard): they all arrived before it was opened, so each gets the file as it
    /// was at a moment after its request, as if opened alone. That spares a random read its path walk,
    /// `fstat`s and `close` when many are in flight (measured: about 1 µs of the sharer's CPU per read).
    pub fn run_all(&mut self, server: &mut Server) {
        self.run_within(server, usize::MAX);
    }

    /// [`Files::run_all`], until the put data written reaches `data` bytes (the rest waits for the next
    /// call).
    pub fn run_within(&mut self, server: &mut Server, data: usize) {
        let mut opened: Option<(SharePath, Opened)> = None;
        let mut written = 0usize;
        while written < data {
            let Some(job) = server.next_job() else {
                return;
            };
            if let Job::PutData { bytes, .. } = &job {
                written = written.saturating_add(bytes.len());
            }
            match job {
                Job::Open { id, path } => {
                    let again = opened.as_ref().filter(|(p, _)| *p == path);
                    let r = match again {
                        Some((_, o)) => Ok(o.clone()),
                        None => self.open_read(&path),
                    };
                    if let Ok(o) = &r {
                        opened = Some((path, o.clone()));
                    }
                    self.opened(server, id, r);
                }
                job => self.run(server, job),
            }
        }
    }

    fn open_read(&self, path: &SharePath) -> Result<Opened, (ErrorCode, String)> {
        self.root.open_file(path).and_then(|file| {
            self.cache
                .outboard(&file)
                .map(|cached| Opened {
                    file: Arc::new(file),
                    cached,
                })
                .map_err(|e| (ErrorCode::Io, e.to_string()))
        })
    }

    fn opened(
        &mut self,
        server: &mut Server,
        id: RequestId,
        r: Result<Opened, (ErrorCode, String)>,
    ) {
        match r {
            Ok(opened) => {
                let version = opened.cached.outboard.version();
                self.open.insert(id, opened);
                server.read_opened(id, Ok(version));
            }
            Err(e) => server.read_opened(id, Err(e)),
        }
    }

    /// Runs one job and reports its result to `server`.
    pub fn run(&mut self, server: &mut Server, job: Job) {
        match job {
            Job::Stat { id, path } => server.stat_done(id, self.root.stat(&path)),
            Job::Space { id } => server.space_done(id, self.root.space()),
            Job::List {
                id,
                path,
                cursor,
                max,
            } => server.list_done(id, self.root.list(&path, cursor, max)),
            Job::Open { id, path } => {
                let r = self.open_read(&path);
                self.opened(server, id, r);
            }
            Job::Pull { id, path } => {
                let resolved = Subtree::resolve(self.root, &path).map(|s| self.pulled = Some(s));
                server.pull_resolved(id, resolved);
            }
            Job::Put { id, put } => match self.root.begin_put(self.cache, put) {
                Ok(upload) => {
                    self.uploads.insert(id, upload);
                }
                Err((code, message)) => server.fail(id, code, &message),
            },
            Job::PutData { id, offset, bytes } => {
                let Some(upload) = self.uploads.get_mut(&id) else {
                    return;
                };
                if let Err((code, message)) = upload.write(offset, &bytes) {
                    self.uploads.remove(&id);
                    server.fail(id, code, &message);
                }
            }
            Job::PutEnd { id, root } => {
                let Some(upload) = self.uploads.remove(&id) else {
                    return;
                };
                let path = upload.path().clone();
                let result = upload.finish(self.cache, &server.config().peer, root);
                match &result {
                    Ok(PutOutcome::Written) => self.publish(vec![path]),
                    Ok(PutOutcome::Conflicted(name)) => {
                        self.publish(sibling(&path, name).into_iter().collect())
                    }
                    Err(_) => {}
                }
                server.put_done(id, result);
            }
            Job::Write { id, op } => {
                let result = self.root.write(self.cache, &server.config().peer, &op);
                match (&result, &op) {
                    (Ok(PutOutcome::Written), _) => self.publish(op.paths()),
                    // A rename kept beside the file it was to replace: `to` is named too, so that a
                    // mount that showed the moved file there looks again.
                    (Ok(PutOutcome::Conflicted(name)), WriteOp::Rename { from, to, .. }) => {
                        let kept = sibling(to, name);
                        self.publish([from.clone(), to.clone()].into_iter().chain(kept).collect())
                    }
                    _ => {}
                }
                server.write_done(id, result);
            }
        }
    }

    /// The pull resolved by [`Files::run`], once the session switched to sending it.
    pub fn take_pull(&mut self) -> Option<Subtree> {
        self.pulled.take()
    }

    /// Builds the packet of `piece` at the front of `buf` (at least a piece's range plus one group long):
    /// the DATA header, then the proof and the data read from the file straight into place. Returns its
    /// length. A file whose identity changed since it was opened is another version: the read fails with
    /// [`ErrorCode::Changed`] instead of mixing versions.
    pub fn build_piece(&self, piece: &Piece, buf: &mut [u8]) -> Result<usize, (ErrorCode, String)> {
        let io_error = |e: io::Error| (ErrorCode::Io, e.to_string());
        let opened = self
            .open
            .get(&piece.id)
            .ok_or((ErrorCode::Io, "the read's file is not open".to_string()))?;
        if FileId::of(&opened.file).map_err(io_error)? != opened.cached.id {
            return Err((
                ErrorCode::Changed,
                "the file changed while it was read".into(),
            ));
        }
        let len = (piece.range.end - piece.range.start) as u32;
        let header = wire::data_header_bytes(piece.id, piece.range.start, len);
        buf[..header.len()].copy_from_slice(&header);
        let body = encode_piece_from_file(
            &opened.file,
            &opened.cached.outboard,
            piece.range.clone(),
            &mut buf[header.len()..],
        )
        .map_err(io_error)?;
        Ok(header.len() + body)
    }

    /// Closes the file of the read `id` if it ended (its last piece went out).
    pub fn forget_if_done(&mut self, server: &Server, id: RequestId) {
        if !server.is_reading(id) {
            self.open.remove(&id);
        }
    }

    /// Closes the files of reads that ended, and removes the temp files of puts that failed or were
    /// cancelled.
    pub fn forget_done(&mut self, server: &Server) {
        self.open.retain(|id, _| server.is_reading(*id));
        self.uploads.retain(|id, _| server.is_putting(*id));
    }
}

/// A session with a sharer, driven one request at a time or pipelined.
pub struct Session<R: Read, W: Write> {
    client: Client,
    reader: SecureReader<R>,
    writer: SecureWriter<W>,
    share: Vec<u8>,
}

impl<R: Read, W: Write> Session<R, W> {
    /// Opens a session over an established channel: hellos both ways.
    pub fn open(
        reader: SecureReader<R>,
        writer: SecureWriter<W>,
        max_in_flight: u32,
    ) -> Result<Self, SessionError> {
        let mut s = Session {
            client: Client::new(max_in_flight),
            reader,
            writer,
            share: Vec::new(),
        };
        s.reader.set_max_payload(wire::MAX_PACKET);
        match s.next_event()? {
            Event::Ready { share } => s.share = share,
            _ => return Err(ClientError::Hello.into()),
        }
        Ok(s)
    }

    /// The channel's halves back, to carry another protocol (a pull's transfer).
    pub fn into_parts(self) -> (SecureReader<R>, SecureWriter<W>) {
        (self.reader, self.writer)
    }

    /// The share's name.
    pub fn share(&self) -> &[u8] {
        &self.share
    }

    /// The protocol state, to issue requests directly (then drive with [`Session::next_event`]).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Sends what is queued, then waits for the next event.
    pub fn next_event(&mut self) -> Result<Event, SessionError> {
        loop {
            let mut sent = false;
            while let Some(p) = self.client.poll_transmit() {
                self.writer.send(&p)?;
                sent = true;
            }
            if sent {
                self.writer.flush()?;
            }
            let packet = self.reader.recv()?.ok_or(SessionError::Closed)?;
            if let Some(ev) = self.client.handle(packet)? {
                return Ok(ev);
            }
        }
    }

    /// The attributes of `path`.
    pub fn stat(&mut self, path: SharePath) -> Result<Entry, SessionError> {
        let id = self.client.stat(path).map_err(|_| busy())?;
        loop {
            match self.next_event()? {
                Event::Attr { id: i, entry } if i == id => return Ok(entry),
                Event::Failed { id: i, failure } if i == id => return Err(failed(failure)),
                _ => {}
            }
        }
    }

    /// Every entry of the directory `path`, page by page, within [`DEFAULT_MAX_LISTING`].
    pub fn list_all(&mut self, path: SharePath) -> Result<Vec<Entry>, SessionError> {
        self.list_within(path, DEFAULT_MAX_LISTING)
    }

    /// Every entry of the directory `path`, page by page, failing once they take more than `max` bytes
    /// ([`Listing`]).
    pub fn list_within(&mut self, path: SharePath, max: u64) -> Result<Vec<Entry>, SessionError> {
        let mut all = Listing::new(max);
        let mut cursor = 0;
        while cursor != END {
            let id = self
                .client
                .list(path.clone(), cursor, wire::MAX_PAGE_ENTRIES)
                .map_err(|_| busy())?;
            loop {
                match self.next_event()? {
                    Event::Entries {
                        id: i,
                        entries,
                        next,
                    } if i == id => {
                        all.add(entries)?;
                        cursor = next;
                        break;
                    }
                    Event::Failed { id: i, failure } if i == id => return Err(failed(failure)),
                    _ => {}
                }
            }
        }
        Ok(all.into_entries())
    }

    /// Reads `len` bytes from `offset` of `path` into `out` (positioned writes), every byte verified;
    /// returns the version read. Nothing unverified is written.
    pub fn read_into(
        &mut self,
        path: SharePath,
        offset: u64,
        len: u64,
        out: &mut impl std::os::unix::fs::FileExt,
    ) -> Result<Version, SessionError> {
        let id = self
            .client
            .read(path, None, offset, len)
            .map_err(|_| busy())?;
        let mut version = None;
        loop {
            match self.next_event()? {
                Event::Version { id: i, version: v } if i == id => version = Some(v),
                Event::Data {
                    id: i,
                    offset,
                    bytes,
                    ..
                } if i == id => out.write_all_at(&bytes, offset)?,
                Event::Done { id: i } if i == id => {
                    return version.ok_or(SessionError::Integrity);
                }
                Event::Failed { id: i, failure } if i == id => return Err(failed(failure)),
                _ => {}
            }
        }
    }
}

/// Writes (the sharer must share `--writable`; otherwise each fails with [`ErrorCode::ReadOnly`]).
impl<R: Read, W: Write> Session<R, W> {
    /// Writes the whole content of `file` to `path`. `base`: the root of the sharer's version this content
    /// derives from (`None`: a new file). Returns whether it landed or was kept beside a file that changed.
    pub fn put_file(
        &mut self,
        path: SharePath,
        base: Option<[u8; 32]>,
        file: &File,
        mode: u32,
        mtime: Option<Time>,
    ) -> Result<PutOutcome, SessionError> {
        let size = file.metadata()?.len();
        let whole = 0..size;
        let ranges = std::slice::from_ref(&whole);
        self.put(path, base, false, file, ranges, mode, mtime)
    }

    /// Writes `file`'s content to `path` by sending only `ranges` of it: the sharer starts from the version
    /// `base` (cut or zero-extended to `file`'s size: a truncate sends no range). A sharer whose file is no
    /// longer `base` answers [`ErrorCode::Changed`]: send it whole then ([`Session::put_file`]).
    #[allow(clippy::too_many_arguments)]
    pub fn put_ranges(
        &mut self,
        path: SharePath,
        base: [u8; 32],
        file: &File,
        ranges: &[std::ops::Range<u64>],
        mode: u32,
        mtime: Option<Time>,
    ) -> Result<PutOutcome, SessionError> {
        self.put(path, Some(base), true, file, ranges, mode, mtime)
    }

    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        path: SharePath,
        base: Option<[u8; 32]>,
        from_base: bool,
        file: &File,
        ranges: &[std::ops::Range<u64>],
        mode: u32,
        mtime: Option<Time>,
    ) -> Result<PutOutcome, SessionError> {
        use std::os::unix::fs::FileExt;
        let size = file.metadata()?.len();
        let mut running = crate::write::RunningRoot::new();
        let id = self
            .client
            .put(wire::PutHeader {
                path,
                base,
                from_base,
                size,
                mode,
                mtime,
            })
            .map_err(|_| busy())?;
        while let Some(p) = self.client.poll_transmit() {
            self.writer.send(&p)?;
        }
        let chunk = (self.writer.max_payload() - wire::PUT_DATA_HEADER_LEN).min(wire::MAX_PUT_DATA);
        for range in ranges {
            let end = range.end.min(size);
            let mut at = range.start;
            while at < end {
                let n = (end - at).min(chunk as u64) as usize;
                let header = self
                    .client
                    .put_data_header(id, at, n)
                    .map_err(|e| SessionError::Io(io::Error::other(e)))?;
                // Built in the channel's packet buffer: the file's bytes are read straight into place.
                let len = header.len() + n;
                let buf = self.writer.payload_buf(len)?;
                buf[..header.len()].copy_from_slice(&header);
                file.read_exact_at(&mut buf[header.len()..len], at)?;
                running.update(at, &buf[header.len()..len]);
                self.writer.send_payload_buf(len)?;
                at += n as u64;
            }
        }
        let root = running.root(file, size)?;
        self.client
            .put_end(id, root)
            .map_err(|e| SessionError::Io(io::Error::other(e)))?;
        loop {
            match self.next_event()? {
                Event::Done { id: i } if i == id => return Ok(PutOutcome::Written),
                Event::Conflicted { id: i, name } if i == id => {
                    return Ok(PutOutcome::Conflicted(name))
                }
                Event::Failed { id: i, failure } if i == id => return Err(failed(failure)),
                _ => {}
            }
        }
    }

    /// Creates the directory `path`.
    pub fn mkdir(&mut self, path: SharePath, mode: u32) -> Result<(), SessionError> {
        let id = self.client.mkdir(path, mode).map_err(|_| busy())?;
        self.wait_done(id)
    }

    /// Removes the empty directory `path`.
    pub fn rmdir(&mut self, path: SharePath) -> Result<(), SessionError> {
        let id = self.client.rmdir(path).map_err(|_| busy())?;
        self.wait_done(id)
    }

    /// Removes the file or symlink `path`; a file that is no longer the version `base` (when given) stays
    /// and this fails with [`ErrorCode::Conflict`].
    pub fn unlink(&mut self, path: SharePath, base: Option<[u8; 32]>) -> Result<(), SessionError> {
        let id = self.client.unlink(path, base).map_err(|_| busy())?;
        self.wait_done(id)
    }

    /// Renames `from` to `to`, replacing an existing `to` only when `replace` (whatever version it is).
    pub fn rename(
        &mut self,
        from: SharePath,
        to: SharePath,
        replace: bool,
    ) -> Result<(), SessionError> {
        let id = self
            .client
            .rename(from, to, replace, None)
            .map_err(|_| busy())?;
        self.wait_done(id)
    }

    /// Changes the permission bits and/or modification time of `path`.
    pub fn set_attr(
        &mut self,
        path: SharePath,
        mode: Option<u32>,
        mtime: Option<Time>,
    ) -> Result<(), SessionError> {
        let id = self
            .client
            .set_attr(path, mode, mtime)
            .map_err(|_| busy())?;
        self.wait_done(id)
    }

    /// Creates a symlink at `path` to `target`.
    pub fn symlink(&mut self, path: SharePath, target: &[u8]) -> Result<(), SessionError> {
        let id = self
            .client
            .symlink(path, target.to_vec())
            .map_err(|_| busy())?;
        self.wait_done(id)
    }

    fn wait_done(&mut self, id: RequestId) -> Result<(), SessionError> {
        loop {
            match self.next_event()? {
                Event::Done { id: i } if i == id => return Ok(()),
                Event::Failed { id: i, failure } if i == id => return Err(failed(failure)),
                _ => {}
            }
        }
    }
}

pub(crate) fn busy() -> SessionError {
    SessionError::Remote(ErrorCode::Busy, "too many requests in flight".into())
}

pub(crate) fn failed(f: Failure) -> SessionError {
    match f {
        Failure::Remote(code, msg) => SessionError::Remote(code, msg),
        Failure::Integrity => SessionError::Integrity,
    }
}
