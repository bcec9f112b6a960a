//! Plaintext run of the transfer pipeline over loopback TCP, for quick measurements:
//! `cargo run --release -p ferry-transfer --example loopback -- OUT_DIR PATH...`

use ferry_transfer::plain::{PlainSink, PlainSource};
use ferry_transfer::{receive, send, walk, ReceiveOptions, SendOptions};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (out, paths) = args
        .split_first()
        .ok_or("usage: loopback OUT_DIR PATH...")?;
    let walked = walk(paths)?;
    let totals = walked.manifest.totals();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let start = Instant::now();
    let sender = std::thread::spawn(move || -> Result<(), ferry_transfer::TransferError> {
        let (conn, _) = listener.accept()?;
        let mut sink = PlainSink::new(conn.try_clone()?);
        let mut source = PlainSource::new(conn);
        send(
            &mut sink,
            &mut source,
            &walked.manifest,
            &SendOptions::default(),
            &mut (),
        )?;
        Ok(())
    });
    let conn = TcpStream::connect(addr)?;
    let mut sink = PlainSink::new(conn.try_clone()?);
    let mut source = PlainSource::new(conn);
    let mut opts = ReceiveOptions::new(out);
    opts.overwrite = true;
    receive(&mut source, &mut sink, &opts, &mut |_| true, &mut ())?;
    sender.join().expect("sender thread")?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} files, {} bytes in {:.3} s: {:.2} GB/s, {:.0} files/s",
        totals.files,
        totals.bytes,
        secs,
        totals.bytes as f64 / secs / 1e9,
        totals.files as f64 / secs
    );
    Ok(())
}
