//! The early part (data sent before the answer, `wire`'s "Early data"): used as the start of the
//! data when the receiver accepts without claims, dropped after claims or a decline.

mod common;

use common::*;
use ferry_transfer::plain::{PlainSink, PlainSource};
use ferry_transfer::wire;
use ferry_transfer::{
    receive, send, walk, PacketSink, PacketSource, ReceiveOptions, ReceiveReport, SendOptions,
    SendReport, TransferError,
};
use std::fs;
use std::io;
use std::net::Shutdown;
use std::path::Path;

const MIB: usize = 1 << 20;

/// The receiver's packet source, noting each packet's message type.
struct Tap<S> {
    inner: S,
    types: Vec<u8>,
}

impl<S: PacketSource> PacketSource for Tap<S> {
    fn recv(&mut self) -> io::Result<Option<&mut [u8]>> {
        let packet = self.inner.recv()?;
        if let Some(p) = &packet {
            self.types.push(p[0]);
        }
        Ok(packet)
    }
}

/// A sink that asks for the channel's small first packets (`ferry_channel::sizing` starts at 4 KiB).
struct SmallFirst<K>(K);

impl<K: PacketSink> PacketSink for SmallFirst<K> {
    fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        self.0.send(payload)
    }
    fn payload_buf(&mut self, len: usize) -> &mut [u8] {
        self.0.payload_buf(len)
    }
    fn send_payload_buf(&mut self, len: usize) -> io::Result<()> {
        self.0.send_payload_buf(len)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
    fn packet_limit(&self, max: usize) -> usize {
        max.min(4096)
    }
}

/// Sends `paths` to a receiver with `ropts` answering `yes`; returns both results and the message
/// types the receiver read, in order.
fn run_tapped(
    paths: &[&Path],
    ropts: &ReceiveOptions,
    yes: bool,
) -> (
    Result<SendReport, TransferError>,
    Result<ReceiveReport, TransferError>,
    Vec<u8>,
) {
    run_tapped_with(paths, ropts, yes, false)
}

/// [`run_tapped`], the sender's packets `small` ([`SmallFirst`]) or not.
fn run_tapped_with(
    paths: &[&Path],
    ropts: &ReceiveOptions,
    yes: bool,
    small: bool,
) -> (
    Result<SendReport, TransferError>,
    Result<ReceiveReport, TransferError>,
    Vec<u8>,
) {
    let walked = walk(paths).unwrap();
    let (a, b) = tcp_pair();
    let sender = std::thread::spawn(move || {
        let mut source = PlainSource::new(a.try_clone().unwrap());
        let mut plain = PlainSink::new(a.try_clone().unwrap());
        let mut small_first = SmallFirst(PlainSink::new(a.try_clone().unwrap()));
        let sink: &mut dyn PacketSink = match small {
            true => &mut small_first,
            false => &mut plain,
        };
        let r = send(
            &mut &mut *sink,
            &mut source,
            &walked.manifest,
            &SendOptions::default(),
            &mut (),
        );
        let _ = a.shutdown(Shutdown::Both);
        r
    });
    let mut source = Tap {
        inner: PlainSource::new(b.try_clone().unwrap()),
        types: Vec::new(),
    };
    let mut sink = PlainSink::new(b.try_clone().unwrap());
    let received = receive(&mut source, &mut sink, ropts, &mut |_| yes, &mut ());
    let _ = b.shutdown(Shutdown::Both);
    (sender.join().unwrap(), received, source.types)
}

fn count(types: &[u8], t: u8) -> usize {
    types.iter().filter(|&&x| x == t).count()
}

#[test]
fn small_files_travel_whole_in_the_early_part() {
    let t = TempDir::new("early-small");
    let root = t.join("top");
    fs::create_dir_all(&root).unwrap();
    for i in 0..20 {
        fs::write(root.join(format!("f{i}")), data(5000, i)).unwrap();
    }
    let out = t.join("out");
    let (s, r, types) = run_tapped(&[&root], &opts(&out, &t.join("cache")), true);
    let (s, r) = (s.unwrap(), r.unwrap());
    assert_eq!((s.files, s.bytes_sent), (20, 100_000));
    assert_eq!((r.bytes_received, r.bytes_resumed), (100_000, 0));
    assert!(count(&types, wire::MSG_EARLY) > 0, "{types:?}");
    assert_eq!(count(&types, wire::MSG_EARLY_END), 1);
    // Everything, the final record too, came before the answer took effect.
    assert_eq!(count(&types, wire::MSG_DATA), 0, "{types:?}");
    for i in 0..20 {
        assert_eq!(
            fs::read(out.join(format!("top/f{i}"))).unwrap(),
            data(5000, i)
        );
    }
}

#[test]
fn accepted_without_claims_the_data_goes_on_after_the_early_part() {
    let t = TempDir::new("early-big");
    let size = 3 * MIB + 77;
    fs::write(t.join("big"), data(size, 4)).unwrap();
    let out = t.join("out");
    let (s, r, types) = run_tapped(&[&t.join("big")], &opts(&out, &t.join("cache")), true);
    let (s, r) = (s.unwrap(), r.unwrap());
    // Each byte went once: the early part is the start of the stream, not a copy of it.
    assert_eq!(s.bytes_sent, size as u64);
    assert_eq!(r.bytes_received, size as u64);
    let end = types
        .iter()
        .position(|&t| t == wire::MSG_EARLY_END)
        .unwrap();
    assert!(types[..end].contains(&wire::MSG_EARLY), "{types:?}");
    assert!(types[end + 1..].contains(&wire::MSG_DATA), "{types:?}");
    assert!(!types[end + 1..].contains(&wire::MSG_EARLY), "{types:?}");
    assert_eq!(fs::read(out.join("big")).unwrap(), data(size, 4));
}

#[test]
fn small_first_packets_fill_the_early_part_too() {
    // A channel's sink asks for 4 KiB packets at first: the early part is made of them.
    let t = TempDir::new("early-small-first");
    fs::write(t.join("big"), data(MIB, 7)).unwrap();
    let out = t.join("out");
    let ropts = opts(&out, &t.join("cache"));
    let (s, r, types) = run_tapped_with(&[&t.join("big")], &ropts, true, true);
    assert_eq!(s.unwrap().bytes_sent, r.unwrap().bytes_received);
    let early = count(&types, wire::MSG_EARLY);
    assert!(
        early >= 200,
        "{early} early packets of at most 4 KiB: {types:?}"
    );
    assert_eq!(fs::read(out.join("big")).unwrap(), data(MIB, 7));
}

#[test]
fn claims_make_the_early_part_void() {
    let t = TempDir::new("early-claims");
    let size = 5 * MIB + 123;
    fs::write(t.join("big"), data(size, 5)).unwrap();
    let out = t.join("out");
    let ropts = opts(&out, &t.join("cache"));
    let (s, r) = run_cut(&[&t.join("big")], &ropts, Some(3 * MIB + MIB / 2));
    assert!(s.is_err() && r.is_err(), "{s:?} {r:?}");

    // The second run claims the chunks kept: the early part (from offset 0) is read and dropped,
    // and the data starts again after the claims, from the first chunk not held.
    let (s, r, types) = run_tapped(&[&t.join("big")], &ropts, true);
    let (s, r) = (s.unwrap(), r.unwrap());
    assert!(r.bytes_resumed >= MIB as u64, "{r:?}");
    assert_eq!(s.bytes_resumed, r.bytes_resumed);
    assert_eq!(s.bytes_sent + s.bytes_resumed, size as u64);
    assert_eq!(r.bytes_received, s.bytes_sent);
    let early = count(&types, wire::MSG_EARLY);
    assert!(early > 0, "the sender sent an early part: {types:?}");
    let end = types
        .iter()
        .position(|&t| t == wire::MSG_EARLY_END)
        .unwrap();
    assert_eq!(
        end,
        2 + early,
        "offer, one manifest page, the early part: {types:?}"
    );
    assert!(types[end + 1..].contains(&wire::MSG_DATA), "{types:?}");
    assert_eq!(fs::read(out.join("big")).unwrap(), data(size, 5));
}

#[test]
fn a_declined_offer_with_a_full_early_part_is_declined_on_both_sides() {
    let t = TempDir::new("early-declined");
    let size = 4 * MIB;
    fs::write(t.join("big"), data(size, 6)).unwrap();
    let out = t.join("out");
    let (s, r, types) = run_tapped(&[&t.join("big")], &opts(&out, &t.join("cache")), false);
    assert!(matches!(s, Err(TransferError::Declined)), "{s:?}");
    assert!(matches!(r, Err(TransferError::Declined)), "{r:?}");
    // The receiver read the early part to its end before going.
    assert_eq!(count(&types, wire::MSG_EARLY_END), 1, "{types:?}");
    assert!(!out.join("big").exists());
}
