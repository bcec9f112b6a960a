//! Lanes on real loopback sockets: the sender's listener takes a lane whose hello verifies and closes,
//! without a byte of answer, a forged hello and a replayed one.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ferry_channel::blocking::SecureReader;
use ferry_rendezvous::Code;
use ferry_session::lanes::dial_lanes;
use ferry_session::{connect, Meeting, PeerOptions, Rendezvous};

/// Far more than any step needs: only a hang goes past it.
const WAIT: Duration = Duration::from_secs(30);

/// What a connection to the sender's listener hears after sending `hello`: nothing, then the end.
fn closed_without_answer(addr: SocketAddr, hello: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut s, hello).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut got = Vec::new();
    // A reset is as good as an end; a timeout means the sender kept the connection.
    if let Err(e) = s.read_to_end(&mut got) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the sender kept a connection whose hello it should refuse"
        );
    }
    assert!(got.is_empty(), "the listener answered {} bytes", got.len());
}

#[test]
fn a_lane_joins_by_its_hello_and_forged_or_replayed_hellos_are_closed_unanswered() {
    let runtime = std::env::temp_dir().join(format!("ferry-session-lanes-{}", std::process::id()));
    std::fs::create_dir_all(&runtime).unwrap();
    std::env::set_var("XDG_RUNTIME_DIR", &runtime);
    let code: Code = "31-apple-orbit-violin".parse().unwrap();
    let opts = PeerOptions {
        relay: None,
        force_relay: false,
        no_discovery: true,
    };
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut rendezvous =
        Rendezvous::start(Meeting::code(&code), &opts, Some(listen), &mut ()).unwrap();
    let addr = rendezvous.listen.unwrap();
    let looking = {
        let (code, opts) = (code.clone(), opts.clone());
        std::thread::spawn(move || connect(&Meeting::code(&code), &opts, Some(addr), WAIT, &mut ()))
    };
    let sender = rendezvous.accept(&mut ()).unwrap();
    let receiver = looking.join().unwrap().unwrap();
    assert!(sender.handshake.is_some() && receiver.handshake.is_none());
    let max = sender.established.sealer.max_payload();
    let (ks, kr) = (
        sender.established.lane_keys(max),
        receiver.established.lane_keys(max),
    );
    let hello1 = kr.hello(1);
    let lanes = rendezvous.accept_lanes(ks, 3, &ferry_session::congestion::Policy::new());

    closed_without_answer(addr, &[0u8; 32]);
    // Lane 2 joins through dial_lanes (which dials lanes 1 and 2); lane 1 is then taken, and its hello
    // sent again is refused.
    let dialled: Vec<SecureReader<TcpStream>> =
        dial_lanes(addr, kr, 3).iter().map(|r| r.unwrap()).collect();
    let mut writers: Vec<_> = (0..2).map(|_| lanes.recv_timeout(WAIT).unwrap()).collect();
    closed_without_answer(addr, &hello1);
    for w in &mut writers {
        w.send(b"on a lane").unwrap();
        w.flush().unwrap();
    }
    for mut r in dialled {
        assert_eq!(r.recv().unwrap().unwrap(), b"on a lane");
    }
    assert!(lanes.try_recv().is_err(), "only lanes 1 and 2 joined");
    let _ = std::fs::remove_dir_all(&runtime);
}
