//! The engine's packet transport over lanes: one session's packets spread over several connections
//! ([`ferry_channel::lanes`]), so that the engine stays unchanged.
//!
//! The sending side ([`LaneSink`]) numbers each packet and puts it in one bounded queue; one thread per
//! lane takes the next packet when its connection has room, seals it and writes it, so a faster lane carries
//! more (and sealing runs on several cores). Lanes join while the transfer runs (dialled by the receiver,
//! accepted by the session layer) and are handed over on a channel. The receiving side ([`LaneSource`])
//! reads each lane on a thread of its own into the session's [`Reorder`] buffer and gives the engine the
//! packets in order; a lane whose packet is past the reorder window waits, so TCP holds the rest back.
//! Any lane that fails ends the stream with its error; nothing is delivered out of order or twice.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::Instant;

use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_channel::lanes::{LaneHeader, Reorder, LANE_HEADER};
use ferry_channel::sizing::PacketSizing;
use ferry_channel::ChannelError;

use crate::{PacketSink, PacketSource};

/// Packets queued for the lanes' writers, beyond those they are writing.
const QUEUE: usize = 8;

/// The first failure of any lane, which ends the stream.
type Failure = Arc<Mutex<Option<String>>>;

/// The sending half over lanes: lane 0 is the session's own connection, more join as they arrive. Small
/// packets are gathered and leave at [`PacketSink::flush`], as with one connection.
pub struct LaneSink<W: Write + Send + 'static = TcpStream> {
    queue: Option<SyncSender<Job>>,
    taken: Arc<Mutex<Receiver<Job>>>,
    joining: Receiver<SecureWriter<W>>,
    writers: Vec<JoinHandle<()>>,
    failure: Failure,
    recycled: Receiver<Vec<u8>>,
    recycle: mpsc::Sender<Vec<u8>>,
    buf: Vec<u8>,
    /// Small packets gathered into one job (each as a 4-byte length and the packet), as the channel's
    /// writer coalesces them into one write: one job, and one write, per [`BATCH`] bytes.
    batch: Vec<u8>,
    seq: u64,
    max_data: usize,
    sizing: PacketSizing,
}

/// Small packets gathered before they go to a lane as one job.
const BATCH: usize = 64 << 10;
/// Bytes before each packet of a batch: its length.
const BATCH_LEN: usize = 4;

/// What a lane's writer takes from the queue.
enum Job {
    /// One packet, header included.
    One(Vec<u8>),
    /// Small packets, each after its 4-byte little-endian length.
    Batch(Vec<u8>),
}

impl<W: Write + Send + 'static> LaneSink<W> {
    /// A sink writing on `lane0` and on every lane that arrives on `joining`.
    pub fn new(lane0: SecureWriter<W>, joining: Receiver<SecureWriter<W>>) -> Self {
        let max_data = lane0.max_payload() - LANE_HEADER;
        let (queue, taken) = mpsc::sync_channel(QUEUE);
        let (recycle, recycled) = mpsc::channel();
        let mut sink = LaneSink {
            queue: Some(queue),
            taken: Arc::new(Mutex::new(taken)),
            joining,
            writers: Vec::new(),
            failure: Arc::new(Mutex::new(None)),
            recycled,
            recycle,
            buf: Vec::new(),
            batch: Vec::new(),
            seq: 0,
            max_data,
            sizing: PacketSizing::new(max_data),
        };
        sink.start_writer(lane0);
        sink
    }

    /// Lanes writing now.
    pub fn lanes(&self) -> usize {
        self.writers.len()
    }

    fn start_writer(&mut self, writer: SecureWriter<W>) {
        let (taken, failure, recycle) = (
            Arc::clone(&self.taken),
            Arc::clone(&self.failure),
            self.recycle.clone(),
        );
        self.writers.push(std::thread::spawn(move || {
            lane_writer(writer, &taken, &failure, &recycle)
        }));
    }

    fn join_lanes(&mut self) {
        while let Ok(w) = self.joining.try_recv() {
            self.start_writer(w);
        }
    }

    fn check(&self) -> io::Result<()> {
        match &*self.failure.lock().expect("no writer panics holding it") {
            Some(e) => Err(io::Error::other(format!("a lane failed: {e}"))),
            None => Ok(()),
        }
    }

    fn enqueue(&mut self, job: Job) -> io::Result<()> {
        self.check()?;
        self.join_lanes();
        self.queue
            .as_ref()
            .expect("open until close")
            .send(job)
            .map_err(|_| io::Error::other("every lane is closed"))
    }

    /// Sends the small packets gathered so far.
    fn send_batch(&mut self) -> io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH + (4 << 10)));
        self.enqueue(Job::Batch(batch))
    }

    fn fresh(&mut self, len: usize) -> Vec<u8> {
        let mut v = self.recycled.try_recv().unwrap_or_default();
        v.clear();
        v.resize(LANE_HEADER + len, 0);
        v
    }

    fn next_header(&mut self) -> [u8; LANE_HEADER] {
        let h = LaneHeader::Data(self.seq).encode();
        self.seq += 1;
        h
    }

    /// Sends the end of stream, waits for every lane to write what it took and to close; the number of
    /// lanes that carried the stream, or the first lane's failure.
    pub fn close(mut self) -> io::Result<usize> {
        self.send_batch()?;
        let end = LaneHeader::End(self.seq).encode().to_vec();
        self.enqueue(Job::One(end))?;
        self.join_lanes();
        drop(self.queue.take());
        let lanes = self.writers.len();
        for w in self.writers.drain(..) {
            let _ = w.join();
        }
        self.check().map(|()| lanes)
    }
}

/// One lane's writer: takes the next packet whenever its connection took the last one, flushes whenever
/// nothing waits, and closes the lane (authenticated) once the sink is closed.
fn lane_writer<W: Write>(
    mut w: SecureWriter<W>,
    taken: &Mutex<Receiver<Job>>,
    failure: &Mutex<Option<String>>,
    recycle: &mpsc::Sender<Vec<u8>>,
) {
    let mut result = Ok(());
    loop {
        // Whoever holds the queue may wait in it: flush first, so no small packet waits behind it.
        let rx = match taken.try_lock() {
            Ok(rx) => rx,
            Err(TryLockError::WouldBlock) => match w.flush() {
                Ok(()) => taken.lock().expect("no writer panics holding it"),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            },
            Err(TryLockError::Poisoned(_)) => break,
        };
        let packet = match rx.try_recv() {
            Ok(p) => Ok(p),
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => match w.flush() {
                Ok(()) => rx.recv().map_err(|_| None),
                Err(e) => Err(Some(e)),
            },
        };
        drop(rx);
        match packet {
            Ok(Job::One(p)) => {
                if let Err(e) = w.send(&p) {
                    result = Err(e);
                    break;
                }
                let _ = recycle.send(p);
            }
            Ok(Job::Batch(b)) => {
                if let Err(e) = send_batch(&mut w, &b) {
                    result = Err(e);
                    break;
                }
            }
            Err(None) => break,
            Err(Some(e)) => {
                result = Err(e);
                break;
            }
        }
    }
    let result = result.and_then(|()| w.close().map(drop));
    if let Err(e) = result {
        failure
            .lock()
            .expect("no writer panics holding it")
            .get_or_insert(e.to_string());
        // Keep taking packets, so the sink never waits on a full queue; its next send fails.
        while let Ok(p) = taken.lock().map(|rx| rx.recv()) {
            if p.is_err() {
                break;
            }
        }
    }
}

/// Sends the packets of a batch, in order (coalesced by the channel's writer).
fn send_batch<W: Write>(w: &mut SecureWriter<W>, mut batch: &[u8]) -> Result<(), ChannelError> {
    while batch.len() >= BATCH_LEN {
        let (len, rest) = batch.split_at(BATCH_LEN);
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let (packet, rest) = rest.split_at(len);
        w.send(packet)?;
        batch = rest;
    }
    Ok(())
}

impl<W: Write + Send + 'static> PacketSink for LaneSink<W> {
    fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        if payload.len() > self.max_data {
            return Err(ChannelError::Oversized {
                len: payload.len(),
                max: self.max_data,
            }
            .into_io());
        }
        if payload.len() < BATCH {
            let header = self.next_header();
            let len = (LANE_HEADER + payload.len()) as u32;
            self.batch.extend_from_slice(&len.to_le_bytes());
            self.batch.extend_from_slice(&header);
            self.batch.extend_from_slice(payload);
            if self.batch.len() >= BATCH {
                self.send_batch()?;
            }
            return Ok(());
        }
        self.send_batch()?;
        let mut p = self.fresh(payload.len());
        p[..LANE_HEADER].copy_from_slice(&self.next_header());
        p[LANE_HEADER..].copy_from_slice(payload);
        self.enqueue(Job::One(p))
    }

    fn payload_buf(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.max_data, "payload_buf over the packet limit");
        if self.buf.len() != LANE_HEADER + len {
            let mut b = std::mem::take(&mut self.buf);
            if b.capacity() < LANE_HEADER + len {
                b = self.fresh(len);
            }
            b.resize(LANE_HEADER + len, 0);
            self.buf = b;
        }
        &mut self.buf[LANE_HEADER..]
    }

    fn send_payload_buf(&mut self, len: usize) -> io::Result<()> {
        self.send_batch()?;
        let mut p = std::mem::take(&mut self.buf);
        p.truncate(LANE_HEADER + len);
        p[..LANE_HEADER].copy_from_slice(&self.next_header());
        self.sizing.wrote(p.len(), Instant::now());
        let next = self.fresh(0);
        self.buf = next;
        self.enqueue(Job::One(p))
    }

    fn flush(&mut self) -> io::Result<()> {
        // Each lane's writer flushes whenever nothing waits for it.
        self.send_batch()?;
        self.check()
    }

    fn packet_limit(&self, max: usize) -> usize {
        self.sizing
            .limit(Instant::now())
            .min(max)
            .min(self.max_data)
    }
}

struct State {
    reorder: Reorder,
    failure: Option<String>,
    /// Lanes being read or dialled.
    alive: usize,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// The receiving half over lanes: the packets of every lane, in order.
pub struct LaneSource {
    shared: Shared,
    current: Vec<u8>,
}

/// Adds lanes to a [`LaneSource`] from another thread (the one that dials them).
#[derive(Clone)]
pub struct LaneJoiner {
    shared: Shared,
}

impl LaneSource {
    /// A source reading `lane0`, the session's own connection; more lanes join through [`Self::joiner`].
    pub fn new<R: Read + Send + 'static>(lane0: SecureReader<R>) -> Self {
        let source = LaneSource {
            shared: Arc::new((
                Mutex::new(State {
                    reorder: Reorder::new(),
                    failure: None,
                    alive: 0,
                }),
                Condvar::new(),
            )),
            current: Vec::new(),
        };
        let joiner = source.joiner();
        joiner.expect();
        joiner.join(lane0);
        source
    }

    /// A handle that adds lanes.
    pub fn joiner(&self) -> LaneJoiner {
        LaneJoiner {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl LaneJoiner {
    /// A lane is being dialled: the stream does not end before it joined or [`Self::gave_up`].
    pub fn expect(&self) {
        self.shared
            .0
            .lock()
            .expect("no reader panics holding it")
            .alive += 1;
    }

    /// A lane announced by [`Self::expect`] will not join.
    pub fn gave_up(&self) {
        let (lock, cv) = &*self.shared;
        lock.lock().expect("no reader panics holding it").alive -= 1;
        cv.notify_all();
    }

    /// Reads `lane` (announced by [`Self::expect`]) on a thread of its own.
    pub fn join<R: Read + Send + 'static>(&self, lane: SecureReader<R>) {
        let shared = Arc::clone(&self.shared);
        std::thread::spawn(move || lane_reader(lane, &shared));
    }
}

fn lane_reader<R: Read>(mut lane: SecureReader<R>, shared: &Shared) {
    let (lock, cv) = &**shared;
    let failed = loop {
        let (header, contents) = match lane.recv() {
            Ok(None) => break None,
            Err(e) => break Some(e.to_string()),
            Ok(Some(packet)) => match LaneHeader::decode(packet) {
                Ok((h, c)) => (h, c.to_vec()),
                Err(e) => break Some(e.to_string()),
            },
        };
        let mut st = lock.lock().expect("no reader panics holding it");
        while !st.reorder.admits(header) && st.failure.is_none() && !st.reorder.is_finished() {
            st = cv.wait(st).expect("no reader panics holding it");
        }
        if st.failure.is_some() {
            break None;
        }
        if let Err(e) = st.reorder.insert(header, contents) {
            break Some(e.to_string());
        }
        cv.notify_all();
    };
    let mut st = lock.lock().expect("no reader panics holding it");
    st.alive -= 1;
    // A lane that ends after the whole stream arrived ends nothing.
    if let Some(e) = failed.filter(|_| !st.reorder.is_finished()) {
        st.failure.get_or_insert(e);
    }
    cv.notify_all();
}

impl PacketSource for LaneSource {
    fn recv(&mut self) -> io::Result<Option<&mut [u8]>> {
        let (lock, cv) = &*self.shared;
        let mut st = lock.lock().expect("no reader panics holding it");
        loop {
            if let Some(p) = st.reorder.pop() {
                drop(st);
                // Room in the window: a lane that waited may go on.
                cv.notify_all();
                self.current = p;
                return Ok(Some(&mut self.current[..]));
            }
            if st.reorder.is_finished() {
                return Ok(None);
            }
            if let Some(e) = &st.failure {
                return Err(io::Error::other(format!("a lane failed: {e}")));
            }
            if st.alive == 0 {
                return Err(ChannelError::Truncated.into_io());
            }
            st = cv.wait(st).expect("no reader panics holding it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_channel::lanes::LaneKeys;
    use ferry_channel::Suite;
    use std::net::TcpListener;

    /// `n` lanes over real loopback connections: the sending halves and the receiving halves.
    fn lanes(
        n: usize,
        keys: &LaneKeys,
    ) -> (Vec<SecureWriter<TcpStream>>, Vec<SecureReader<TcpStream>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        (0..n)
            .map(|i| {
                let dialled = TcpStream::connect(addr).unwrap();
                let (accepted, _) = listener.accept().unwrap();
                (
                    SecureWriter::new(accepted, keys.sealer(i)),
                    SecureReader::new(dialled, keys.opener(i)),
                )
            })
            .unzip()
    }

    fn packets() -> Vec<Vec<u8>> {
        (0..3000u32)
            .map(|i| {
                let len = [10usize, 70_000, 1 << 16, 3][i as usize % 4];
                (0..len).map(|j| (i as usize * 7 + j) as u8).collect()
            })
            .collect()
    }

    #[test]
    fn packets_cross_four_lanes_in_order() {
        let keys = LaneKeys::from_secret([1; 32], Suite::Aes256Gcm, (1 << 17) + LANE_HEADER);
        let (mut writers, mut readers) = lanes(4, &keys);
        let (join_tx, join_rx) = mpsc::channel();
        let mut sink = LaneSink::new(writers.remove(0), join_rx);
        let mut source = LaneSource::new(readers.remove(0));
        let joiner = source.joiner();
        for (w, r) in writers.into_iter().zip(readers) {
            joiner.expect();
            joiner.join(r);
            join_tx.send(w).unwrap();
        }
        let sent = packets();
        let want = sent.clone();
        let sender = std::thread::spawn(move || {
            for (i, p) in sent.iter().enumerate() {
                if i % 2 == 0 {
                    sink.send(p).unwrap();
                } else {
                    sink.payload_buf(p.len()).copy_from_slice(p);
                    sink.send_payload_buf(p.len()).unwrap();
                }
            }
            sink.close().unwrap()
        });
        let mut got = Vec::new();
        while let Some(p) = source.recv().unwrap() {
            got.push(p.to_vec());
        }
        assert_eq!(sender.join().unwrap(), 4);
        assert_eq!(got.len(), want.len());
        assert!(got == want, "packets arrived changed or out of order");
    }

    #[test]
    fn a_lane_that_dies_fails_the_stream() {
        let keys = LaneKeys::from_secret([2; 32], Suite::Aes256Gcm, (1 << 17) + LANE_HEADER);
        let (mut writers, mut readers) = lanes(2, &keys);
        let (_join_tx, join_rx) = mpsc::channel();
        let mut sink = LaneSink::new(writers.remove(0), join_rx);
        let mut source = LaneSource::new(readers.remove(0));
        // Lane 1 joins the receiver, carries half a packet and dies.
        let joiner = source.joiner();
        joiner.expect();
        joiner.join(readers.remove(0));
        let dying = writers.remove(0);
        sink.send(b"on lane 0").unwrap();
        sink.flush().unwrap();
        // Taken before lane 1 dies: a failed lane is reported at once, even ahead of packets waiting to be
        // taken from the others.
        assert_eq!(source.recv().unwrap().unwrap(), b"on lane 0");
        let mut wire = Vec::new();
        keys.sealer(1)
            .seal_into(&mut wire, 0, &LaneHeader::Data(1).encode())
            .unwrap();
        let stream = dying.get_ref();
        (&*stream).write_all(&wire[..wire.len() / 2]).unwrap();
        stream.shutdown(std::net::Shutdown::Both).unwrap();
        // Packet 1 never comes: the source fails; it neither waits for lane 0 nor skips the packet.
        let e = source.recv().unwrap_err();
        assert!(e.to_string().contains("a lane failed"), "{e}");
    }

    #[test]
    fn a_stream_whose_every_lane_closed_without_its_end_is_truncated() {
        let keys = LaneKeys::from_secret([3; 32], Suite::Aes256Gcm, (1 << 17) + LANE_HEADER);
        let (mut writers, mut readers) = lanes(1, &keys);
        let mut source = LaneSource::new(readers.remove(0));
        let mut w = writers.remove(0);
        w.send(&LaneHeader::Data(0).encode()).unwrap();
        w.close().unwrap();
        assert_eq!(source.recv().unwrap().unwrap(), b"");
        let e = source.recv().unwrap_err();
        assert!(ChannelError::from_io_ref(&e).is_some_and(|c| matches!(c, ChannelError::Truncated)));
    }
}
