//! The transfer engine in-process, N runs, seconds per run (plaintext or channel): `ferry bench transfer`'s
//! engine case on its own, to build against two checkouts and compare (BENCHMARKS.md, "Issue 10's in-process
//! rows, again"). Not part of the workspace: put it in `src/main.rs` of a crate outside it whose
//! Cargo.toml depends on `ferry-transfer` and `ferry-channel` by path (to the checkout under test), with
//! `[profile.release] debug = 1, codegen-units = 4, lto = "thin"` and an empty `[workspace]`; copy that
//! checkout's Cargo.lock. Usage: `eng SRC SCRATCH RUNS secure|plain`.
use ferry_channel::blocking::{handshake, split_tcp};
use ferry_channel::{Auth, Config, Handshake, Role};
use ferry_transfer::plain::{PlainSink, PlainSource};
use ferry_transfer::secure::{ChannelSink, ChannelSource};
use ferry_transfer::{PacketSink, PacketSource, ReceiveOptions, SendOptions};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

fn halves(mut stream: TcpStream, role: Role, enc: bool) -> (Box<dyn PacketSink + Send>, Box<dyn PacketSource + Send>) {
    stream.set_nodelay(true).unwrap();
    if !enc {
        let sink = PlainSink::new(stream.try_clone().unwrap());
        return (Box::new(sink), Box::new(PlainSource::new(stream)));
    }
    let hs = Handshake::new(role, Config::ferry(), Auth::Code(b"bench".to_vec()));
    let est = handshake(&mut stream, hs).unwrap();
    let (r, w) = split_tcp(stream, est).unwrap();
    (Box::new(ChannelSink(w)), Box::new(ChannelSource(r)))
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let src = a[1].clone();
    let scratch = std::path::PathBuf::from(&a[2]);
    let runs: usize = a[3].parse().unwrap();
    let enc = a[4] == "secure";
    for _ in 0..runs {
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(scratch.join("out")).unwrap();
        let walked = ferry_transfer::walk(&[src.clone()]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let start = Instant::now();
        let sender = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let (mut sink, mut source) = halves(conn, Role::Responder, enc);
            ferry_transfer::send(&mut sink.as_mut(), &mut source.as_mut(), &walked.manifest, &SendOptions::default(), &mut ()).unwrap();
        });
        let (mut sink, mut source) = halves(TcpStream::connect(addr).unwrap(), Role::Initiator, enc);
        let mut ropts = ReceiveOptions::new(scratch.join("out"));
        ropts.partial_dir = Some(scratch.join("cache"));
        ferry_transfer::receive(&mut source.as_mut(), &mut sink.as_mut(), &ropts, &mut |_| true, &mut ()).unwrap();
        sender.join().unwrap();
        println!("{:.4}", start.elapsed().as_secs_f64());
    }
}
