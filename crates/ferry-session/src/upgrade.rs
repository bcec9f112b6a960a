//! Moving a session that met at the relay onto a direct connection when one works.
//!
//! After the relay path won, the sender sends its direct candidates (its listener's addresses) inside the
//! encrypted channel; the relay sees only ciphertext. The receiver answers `STAY`, or `TRY` with a fresh
//! 32-byte secret and then dials each candidate, running a new handshake whose PAKE password is that secret
//! (high entropy, delivered over the authenticated channel, used once). The first direct connection that
//! completes it replaces the relay path on both sides; otherwise the receiver sends `STAY` and the transfer
//! runs through the relay.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use ferry_channel::blocking::{split_tcp, SecureReader, SecureWriter};
use ferry_channel::{Auth, Established, Role};

use crate::handshake::handshake_with;
use crate::{Events, SessionError};

const MSG_CANDIDATES: u8 = 0xc1;
const MSG_TRY: u8 = 0xc2;
const MSG_STAY: u8 = 0xc3;
/// Most candidates accepted from the peer.
const MAX_CANDIDATES: usize = 16;
const SECRET_LEN: usize = 32;
/// How long the receiver gives one candidate to connect and authenticate.
const TRY_TIMEOUT: Duration = Duration::from_secs(3);

/// The two halves of a channel over TCP.
pub type Halves = (SecureReader<TcpStream>, SecureWriter<TcpStream>);

/// What the sender's side of an upgrade needs from where it waits ([`crate::Rendezvous`]).
pub trait DirectPaths {
    /// Addresses where the peer could reach us directly.
    fn direct_candidates(&self) -> Vec<SocketAddr>;
    /// The first new direct connection within `wait` that completes an upgrade handshake on `secret`.
    fn next_upgraded(
        &mut self,
        secret: &[u8],
        wait: Duration,
        events: &mut dyn Events,
    ) -> Option<(TcpStream, Established)>;
}

/// The upgrade went wrong: `why`.
fn bail<T>(why: &str) -> Result<T, SessionError> {
    Err(SessionError::Upgrade(why.to_string()))
}

fn encode_candidates(addrs: &[SocketAddr]) -> Vec<u8> {
    let addrs = &addrs[..addrs.len().min(MAX_CANDIDATES)];
    let mut out = vec![MSG_CANDIDATES, addrs.len() as u8];
    for a in addrs {
        match a.ip() {
            IpAddr::V4(v4) => {
                out.push(4);
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.push(6);
                out.extend_from_slice(&v6.octets());
            }
        }
        out.extend_from_slice(&a.port().to_le_bytes());
    }
    out
}

fn decode_candidates(msg: &[u8]) -> Result<Vec<SocketAddr>, SessionError> {
    let [MSG_CANDIDATES, count, tail @ ..] = msg else {
        return bail("peer sent no path candidates where they belong");
    };
    let mut rest: &[u8] = tail;
    if usize::from(*count) > MAX_CANDIDATES {
        return bail(&format!(
            "peer sent {count} path candidates, more than {MAX_CANDIDATES}"
        ));
    }
    let mut out = Vec::with_capacity(usize::from(*count));
    for _ in 0..*count {
        let (ip, tail): (IpAddr, &[u8]) = match rest {
            [4, a, b, c, d, tail @ ..] => (IpAddr::from([*a, *b, *c, *d]), tail),
            [6, tail @ ..] if tail.len() >= 16 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&tail[..16]);
                (IpAddr::from(o), &tail[16..])
            }
            _ => return bail("malformed path candidate"),
        };
        let [p0, p1, tail @ ..] = tail else {
            return bail("malformed path candidate");
        };
        out.push(SocketAddr::new(ip, u16::from_le_bytes([*p0, *p1])));
        rest = tail;
    }
    if !rest.is_empty() {
        return bail("trailing bytes after path candidates");
    }
    Ok(out)
}

fn recv_message(reader: &mut SecureReader<TcpStream>) -> Result<Vec<u8>, SessionError> {
    match reader.recv()? {
        Some(msg) => Ok(msg.to_vec()),
        None => bail("peer closed the channel during the path upgrade"),
    }
}

/// Sender: offer candidates; switch to a direct connection if the receiver reaches one.
pub fn sender(
    (mut reader, mut writer): Halves,
    rendezvous: &mut impl DirectPaths,
    events: &mut dyn Events,
) -> Result<(Halves, bool), SessionError> {
    writer.send(&encode_candidates(&rendezvous.direct_candidates()))?;
    writer.flush()?;
    let reply = recv_message(&mut reader)?;
    let secret = match reply.as_slice() {
        [MSG_STAY] => return Ok(((reader, writer), false)),
        [MSG_TRY, secret @ ..] if secret.len() == SECRET_LEN => secret.to_vec(),
        _ => return bail("unexpected message during the path upgrade"),
    };
    // Wait for the receiver's `STAY` on the relay path while accepting direct connections, whose handshakes
    // run side by side with their own deadlines: a slow connection cannot hold up the real one.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = recv_message(&mut reader);
        let _ = tx.send((result, reader));
    });
    loop {
        if let Ok((result, reader)) = rx.try_recv() {
            match result?.as_slice() {
                [MSG_STAY] => return Ok(((reader, writer), false)),
                _ => return bail("unexpected message during the path upgrade"),
            }
        }
        if let Some((stream, established)) =
            rendezvous.next_upgraded(&secret, Duration::from_millis(20), events)
        {
            let _ = writer.close();
            return Ok((split_tcp(stream, established)?, true));
        }
    }
}

/// Receiver: try the sender's candidates; move to the first that authenticates, else stay on the relay.
pub fn receiver(
    (mut reader, mut writer): Halves,
    force_relay: bool,
    events: &mut dyn Events,
) -> Result<(Halves, Option<SocketAddr>), SessionError> {
    let candidates = decode_candidates(&recv_message(&mut reader)?)?;
    if candidates.is_empty() || force_relay {
        writer.send(&[MSG_STAY])?;
        writer.flush()?;
        return Ok(((reader, writer), None));
    }
    let mut secret = vec![0u8; SECRET_LEN];
    ferry_channel::keys::fill_random(&mut secret);
    let mut msg = vec![MSG_TRY];
    msg.extend_from_slice(&secret);
    writer.send(&msg)?;
    writer.flush()?;
    for addr in candidates {
        let Ok(stream) = TcpStream::connect_timeout(&addr, TRY_TIMEOUT) else {
            continue;
        };
        let deadline = std::time::Instant::now() + TRY_TIMEOUT;
        let auth = Auth::Code(secret.clone());
        match handshake_with(stream, Role::Initiator, auth, None, deadline) {
            Ok((stream, established)) => {
                let _ = writer.close();
                return Ok((split_tcp(stream, established)?, Some(addr)));
            }
            Err(e) => events.warn(&format!("direct path to {addr} failed: {e}")),
        }
    }
    writer.send(&[MSG_STAY])?;
    writer.flush()?;
    Ok(((reader, writer), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_round_trip_and_hostile_input_is_refused() {
        let addrs: Vec<SocketAddr> = vec![
            "10.0.0.7:4000".parse().unwrap(),
            "[fd00::1]:5000".parse().unwrap(),
        ];
        assert_eq!(
            decode_candidates(&encode_candidates(&addrs)).unwrap(),
            addrs
        );
        assert!(decode_candidates(&[MSG_CANDIDATES, 200]).is_err());
        assert!(decode_candidates(&[MSG_CANDIDATES, 1, 4, 1, 2]).is_err());
        assert!(decode_candidates(&[MSG_CANDIDATES, 0, 9]).is_err());
        assert!(decode_candidates(&[MSG_STAY]).is_err());
        assert_eq!(decode_candidates(&[MSG_CANDIDATES, 0]).unwrap(), vec![]);
    }
}
