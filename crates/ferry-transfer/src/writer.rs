//! The receiver's file work (create, write, mode and times, rename), done either on the receiving
//! thread or on a second thread.
//!
//! On the second thread ([`Mode::Queued`]), the file-system work of many small files overlaps
//! with reading, decrypting, parsing and hashing the next packet: the receiving thread describes
//! each packet's file work as one [`Batch`] (the file bytes copied out of the packet plus the
//! operations on them, in stream order) and queues it; the writer runs the operations in order
//! and hands the batch back for reuse, which also tells the receiving thread which files are now
//! under their final name. At most [`IN_FLIGHT`] batches exist, so memory stays bounded by a few
//! packets. The first error stops the writer; the receiving thread notices when it next hands
//! over work, and the writer's error is the one reported.
//!
//! For large files the copy into the batch costs more than the overlap gains (measured: the two
//! processes of a transfer already keep both cores of a small machine busy, so total CPU time
//! decides), and the work is done in place ([`Mode::Inline`]), writing straight from the packet.

use crate::dest::{Destination, TempFile};
use crate::{Entry, TransferError};
use std::io::Write;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};

/// Batches allocated at most (each holds at most one packet of file data).
const IN_FLIGHT: usize = 4;

/// Offers whose files average less than this many bytes get a writer thread.
pub(crate) const THREAD_BELOW_MEAN_SIZE: u64 = 256 << 10;

/// One file-system operation, in stream order.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Open the temporary file of entry `index` from `offset` (see [`Destination::open_temp`]),
    /// reserving the space of the rest of a large file when `reserve`.
    Open {
        index: u32,
        offset: u64,
        reserve: bool,
    },
    /// Append the next `len` bytes of the batch's data to the open file.
    Write { len: usize },
    /// Skip `len` bytes of the open file (a hole: zeros that are not written).
    Hole { len: u64 },
    /// The open file is verified: give it its mode, times and final name.
    Finish { index: u32, replace: bool },
    /// Entry `index` is complete without any file work (kept from an earlier run).
    Done { index: u32 },
    /// The open file's data was wrong: close and remove it.
    Remove { index: u32 },
}

/// The file work of one packet.
#[derive(Default)]
struct Batch {
    data: Vec<u8>,
    ops: Vec<Op>,
}

/// The file being written, and its entry.
type OpenFile = (u32, TempFile);

/// Runs one operation; `data` is the bytes of a [`Op::Write`].
fn apply(
    dest: &mut Destination,
    entries: &[Entry],
    open: &mut Option<OpenFile>,
    op: Op,
    data: &[u8],
) -> Result<(), TransferError> {
    match op {
        Op::Open {
            index,
            offset,
            reserve,
        } => {
            let e = &entries[index as usize];
            let temp = dest.open_temp(e, index, offset)?;
            if reserve {
                crate::dest::reserve(e, &temp, offset)?;
            }
            *open = Some((index, temp));
        }
        Op::Hole { len } => {
            let (index, temp) = open.as_mut().expect("holes follow an open");
            crate::dest::skip_hole(&entries[*index as usize], temp, len)?;
        }
        Op::Write { .. } => {
            let (index, temp) = open.as_mut().expect("writes follow an open");
            temp.file()
                .write_all(data)
                .map_err(|err| TransferError::file(entries[*index as usize].path_lossy(), err))?;
        }
        Op::Finish { index, replace } => {
            let (_, temp) = open.take().expect("finish follows an open");
            dest.finish_file(&entries[index as usize], index, temp, replace)?;
        }
        Op::Remove { index } => {
            if let Some((_, temp)) = open.take() {
                dest.remove_temp(&entries[index as usize], index, temp);
            }
        }
        Op::Done { .. } => {}
    }
    Ok(())
}

/// Where the work is done.
enum Mode<'a> {
    /// Right away, on the receiving thread.
    Inline {
        dest: &'a mut Destination,
        entries: &'a [Entry],
        open: Option<OpenFile>,
    },
    /// On the writer thread.
    Queued {
        jobs: Option<SyncSender<Batch>>,
        back: Receiver<Batch>,
        spare: Vec<Batch>,
        allocated: usize,
        cur: Batch,
    },
    /// Straight into one stream, in order: the single file of an offer sent to a pipe (or a text
    /// message into memory). No temporary file, so nothing to name or remove.
    Stream(&'a mut dyn Write),
}

/// The receiving thread's handle on the file work.
pub(crate) struct FileWriter<'a> {
    mode: Mode<'a>,
    /// Files completed, not yet taken by [`FileWriter::take_done`].
    done: Vec<u32>,
}

/// Runs `body` with a [`FileWriter`] working on `dest`, on a second thread if `threaded`, then
/// waits for everything queued to be done. Returns `body`'s value and the files completed since
/// its last [`FileWriter::take_done`], in order. The writer thread's error, if any, wins over
/// `body`'s (it concerns earlier data).
pub(crate) fn with_writer<T>(
    dest: &mut Destination,
    entries: &[Entry],
    threaded: bool,
    body: impl FnOnce(&mut FileWriter<'_>) -> Result<T, TransferError>,
) -> Result<(T, Vec<u32>), TransferError> {
    if !threaded {
        let mut w = FileWriter {
            mode: Mode::Inline {
                dest,
                entries,
                open: None,
            },
            done: Vec::new(),
        };
        let result = body(&mut w)?;
        return Ok((result, w.done));
    }
    std::thread::scope(|s| {
        let (jobs, jobs_rx) = mpsc::sync_channel::<Batch>(IN_FLIGHT);
        let (back_tx, back) = mpsc::channel::<Batch>();
        let handle = std::thread::Builder::new()
            .name("ferry-writer".into())
            .spawn_scoped(s, move || run(dest, entries, jobs_rx, back_tx))
            .map_err(TransferError::Io)?;
        let mut w = FileWriter {
            mode: Mode::Queued {
                jobs: Some(jobs),
                back,
                spare: Vec::new(),
                allocated: 1,
                cur: Batch::default(),
            },
            done: Vec::new(),
        };
        let result = body(&mut w);
        // Whatever is still queued (a removal after an error, say) goes out before the end.
        let _ = w.submit();
        let Mode::Queued { jobs, back, .. } = &mut w.mode else {
            unreachable!("queued above")
        };
        *jobs = None;
        let written = match handle.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        while let Ok(batch) = back.try_recv() {
            report(&batch, &mut w.done);
        }
        written?;
        Ok((result?, w.done))
    })
}

/// Runs `body` with a [`FileWriter`] that writes the file data to `out` (see [`Mode::Stream`]);
/// returns like [`with_writer`].
pub(crate) fn with_stream<T>(
    out: &mut dyn Write,
    body: impl FnOnce(&mut FileWriter<'_>) -> Result<T, TransferError>,
) -> Result<(T, Vec<u32>), TransferError> {
    let mut w = FileWriter {
        mode: Mode::Stream(out),
        done: Vec::new(),
    };
    let result = body(&mut w)?;
    Ok((result, w.done))
}

fn report(batch: &Batch, done: &mut Vec<u32>) {
    for op in &batch.ops {
        if let Op::Finish { index, .. } | Op::Done { index } = *op {
            done.push(index);
        }
    }
}

impl FileWriter<'_> {
    fn push(&mut self, op: Op, data: &[u8]) -> Result<(), TransferError> {
        match &mut self.mode {
            Mode::Inline {
                dest,
                entries,
                open,
            } => {
                apply(dest, entries, open, op, data)?;
                if let Op::Finish { index, .. } | Op::Done { index } = op {
                    self.done.push(index);
                }
            }
            Mode::Stream(out) => {
                let err = |e| TransferError::file("the output", e);
                match op {
                    // Receiving resumes nothing into a stream, so every file starts at 0.
                    Op::Open { offset, .. } if offset != 0 => {
                        return Err(TransferError::protocol("resumed data for a stream"))
                    }
                    Op::Write { .. } => out.write_all(data).map_err(err)?,
                    // A stream has no holes: the zeros are written.
                    Op::Hole { len } => {
                        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
                        let mut left = len;
                        while left > 0 {
                            let n = left.min(ZEROS.len() as u64) as usize;
                            out.write_all(&ZEROS[..n]).map_err(err)?;
                            left -= n as u64;
                        }
                    }
                    Op::Finish { index, .. } | Op::Done { index } => {
                        out.flush().map_err(err)?;
                        self.done.push(index);
                    }
                    Op::Open { .. } | Op::Remove { .. } => {}
                }
            }
            Mode::Queued { cur, .. } => {
                cur.data.extend_from_slice(data);
                match (cur.ops.last_mut(), op) {
                    (Some(Op::Write { len }), Op::Write { len: more }) => *len += more,
                    _ => cur.ops.push(op),
                }
            }
        }
        Ok(())
    }

    /// Opens the temporary file of entry `index` from `offset`, reserving the space of a large
    /// file when `reserve`.
    pub(crate) fn open(
        &mut self,
        index: u32,
        offset: u64,
        reserve: bool,
    ) -> Result<(), TransferError> {
        self.push(
            Op::Open {
                index,
                offset,
                reserve,
            },
            &[],
        )
    }

    /// Skips a hole of `len` bytes in the open file.
    pub(crate) fn hole(&mut self, len: u64) -> Result<(), TransferError> {
        self.push(Op::Hole { len }, &[])
    }

    /// Appends `data` to the open file.
    pub(crate) fn write(&mut self, data: &[u8]) -> Result<(), TransferError> {
        self.push(Op::Write { len: data.len() }, data)
    }

    /// Gives the open, verified file of entry `index` its final name.
    pub(crate) fn finish(&mut self, index: u32, replace: bool) -> Result<(), TransferError> {
        self.push(Op::Finish { index, replace }, &[])
    }

    /// Notes that entry `index` is complete without file work (reported in order with the rest).
    pub(crate) fn done(&mut self, index: u32) -> Result<(), TransferError> {
        self.push(Op::Done { index }, &[])
    }

    /// Removes the open temporary file of entry `index`.
    pub(crate) fn remove(&mut self, index: u32) {
        let _ = self.push(Op::Remove { index }, &[]);
    }

    /// True when the file work runs on the writer thread, behind the receiving thread.
    pub(crate) fn is_threaded(&self) -> bool {
        matches!(self.mode, Mode::Queued { .. })
    }

    /// Files completed so far (under their final name), in order.
    pub(crate) fn take_done(&mut self) -> std::vec::Drain<'_, u32> {
        self.done.drain(..)
    }

    /// Hands the queued work to the writer thread and starts a new batch, waiting for one to
    /// come back if [`IN_FLIGHT`] are out. Fails if the writer stopped (after an error, which
    /// [`with_writer`] returns).
    pub(crate) fn submit(&mut self) -> Result<(), TransferError> {
        let Mode::Queued {
            jobs,
            back,
            spare,
            allocated,
            cur,
        } = &mut self.mode
        else {
            return Ok(());
        };
        if cur.ops.is_empty() {
            return Ok(());
        }
        let gone = || TransferError::Io(std::io::Error::other("the file writer stopped"));
        let jobs = jobs.as_ref().ok_or_else(gone)?;
        let next = loop {
            match back.try_recv() {
                Ok(mut b) => {
                    report(&b, &mut self.done);
                    b.data.clear();
                    b.ops.clear();
                    spare.push(b);
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => return Err(gone()),
            }
            if let Some(b) = spare.pop() {
                break b;
            }
            if *allocated < IN_FLIGHT {
                *allocated += 1;
                break Batch::default();
            }
            let mut b = back.recv().map_err(|_| gone())?;
            report(&b, &mut self.done);
            b.data.clear();
            b.ops.clear();
            spare.push(b);
        };
        let batch = std::mem::replace(cur, next);
        jobs.send(batch).map_err(|_| gone())
    }
}

/// The writer thread: runs every batch's operations in order until the queue closes.
fn run(
    dest: &mut Destination,
    entries: &[Entry],
    jobs: Receiver<Batch>,
    back: Sender<Batch>,
) -> Result<(), TransferError> {
    let mut open = None;
    for batch in jobs {
        let mut at = 0;
        for &op in &batch.ops {
            let len = if let Op::Write { len } = op { len } else { 0 };
            apply(dest, entries, &mut open, op, &batch.data[at..at + len])?;
            at += len;
        }
        // The receiving thread may be gone already (after its own error); keep writing.
        let _ = back.send(batch);
    }
    Ok(())
}
