//! The looking side: `--peer`, this host, the LAN, then the relay, round after round.

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_channel::{ChannelError, CodeAttempts, MAX_FAILED_ATTEMPTS};
use ferry_rendezvous::local::LocalRegistry;
use ferry_rendezvous::mdns;
use ferry_rendezvous::NameplateHash;

use crate::error::relay_error;
use crate::handshake::{closed_at_once, initiate};
use crate::{Connected, Events, Meeting, MeetingAuth, PathKind, PeerOptions, SessionError};

/// How long the looking side waits for a TCP connection to a candidate.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the looking side looks on this host before asking the relay.
const FIND_BRIEFLY: Duration = Duration::from_millis(500);
/// The first pause between two rounds over every path; each pause doubles, up to [`RETRY_MOST`].
const RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest pause between two rounds over every path.
const RETRY_MOST: Duration = Duration::from_secs(2);
/// The longest step between two reads of this host's registry during a pause (a local file: cheap).
const REGISTRY_POLL_MOST: Duration = Duration::from_millis(5);
/// Least time given to one TCP connect, even when less of the wait is left.
const CONNECT_LEAST: Duration = Duration::from_secs(3);
/// Least time one wait at the relay lasts, even with `--wait 0`: a round trip and a pairing.
const RELAY_LEAST: Duration = Duration::from_secs(5);
/// How long one mDNS browse listens for the waiting side.
const BROWSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most LAN (mDNS) candidates one look dials.
const MAX_LAN_CANDIDATES: usize = 8;

/// The relay's answer to a receiver waiting there: a paired stream, or why not.
type RelayAnswer = Result<TcpStream, ferry_relay::RelayError>;

/// Waits at `relay` for the sender of any of `hashes`, up to `wait`, each on its own thread: direct paths are
/// retried meanwhile. The answer is the first paired stream, or the last error once every wait failed.
fn wait_at_relay(
    relay: &str,
    hashes: &[NameplateHash],
    wait: Duration,
) -> mpsc::Receiver<RelayAnswer> {
    let (tx, rx) = mpsc::channel();
    let (each_tx, each_rx) = mpsc::channel();
    for hash in hashes {
        let (relay, hash, each_tx) = (relay.to_string(), *hash, each_tx.clone());
        std::thread::spawn(move || {
            let answer =
                ferry_relay::connect(relay.as_str(), ferry_relay::Role::Receiver, hash.0, wait);
            let _ = each_tx.send(answer);
        });
    }
    drop(each_tx);
    std::thread::spawn(move || {
        let mut last = Err(ferry_relay::RelayError::Closed);
        for answer in each_rx {
            if answer.is_ok() {
                let _ = tx.send(answer);
                return;
            }
            last = answer;
        }
        let _ = tx.send(last);
    });
    rx
}

/// Where the receiver may find the sender directly, looked at once: `--peer`, this host (`registry`),
/// then the LAN (mDNS). Addresses in `tried` already failed a handshake and are not proposed again.
fn direct_candidates(
    hashes: &[NameplateHash],
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    registry: Option<&LocalRegistry>,
    tried: &HashSet<SocketAddr>,
) -> Result<Vec<(SocketAddr, PathKind)>, SessionError> {
    if let Some(addr) = peer {
        let fresh = !tried.contains(&addr);
        return Ok(fresh
            .then_some((addr, PathKind::Direct))
            .into_iter()
            .collect());
    }
    let Some(registry) = registry else {
        return Ok(Vec::new());
    };
    let mut here = Vec::new();
    for hash in hashes {
        if let Some(addr) = registry.lookup(hash)?.filter(|a| !tried.contains(a)) {
            here.push((addr, PathKind::SameHost));
        }
    }
    if !here.is_empty() {
        return Ok(here);
    }
    if !opts.no_discovery && tried.len() < MAX_LAN_CANDIDATES {
        // A failed browse (no multicast here) is no error: other paths remain. The browse returns only
        // addresses on a directly attached network: an announcement naming a routed one is a spoofer's.
        // Several hashes are browsed side by side, so a paired meeting's windows cost one browse's time.
        let browsed: Vec<SocketAddr> = std::thread::scope(|s| {
            let browses: Vec<_> = hashes
                .iter()
                .map(|h| s.spawn(move || mdns::browse(h, BROWSE_TIMEOUT).unwrap_or_default()))
                .collect();
            browses
                .into_iter()
                .flat_map(|b| b.join().unwrap_or_default())
                .collect()
        });
        let found: Vec<_> = browsed
            .into_iter()
            .filter(|a| !tried.contains(a))
            .take(MAX_LAN_CANDIDATES - tried.len())
            .collect();
        return Ok(found.into_iter().map(|a| (a, PathKind::Lan)).collect());
    }
    Ok(Vec::new())
}

/// The pause between two rounds over every path, until `until` (`None`: until the relay answers). It
/// ends early when the relay answers (returned) or when a sender with an address not dialled yet
/// (`fresh`) appears in this host's `registry` (a local file, read every few milliseconds, so that a
/// sender started a moment later is met at once; an address that was dialled waits for the next round).
fn pause(
    until: Option<Instant>,
    relay: Option<&mpsc::Receiver<RelayAnswer>>,
    registry: Option<&LocalRegistry>,
    hashes: &[NameplateHash],
    fresh: impl Fn(&SocketAddr) -> bool,
) -> Result<Option<RelayAnswer>, SessionError> {
    let mut step = Duration::from_millis(2);
    loop {
        if let Some(rx) = relay {
            match rx.try_recv() {
                Ok(answer) => return Ok(Some(answer)),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Ok(Some(Err(ferry_relay::RelayError::Closed)))
                }
            }
        }
        if let Some(registry) = registry {
            for hash in hashes {
                if registry.lookup(hash)?.is_some_and(|a| fresh(&a)) {
                    return Ok(None);
                }
            }
        }
        let now = Instant::now();
        if until.is_some_and(|u| now >= u) {
            return Ok(None);
        }
        let step_now = until.map_or(step, |u| step.min(u - now));
        std::thread::sleep(step_now);
        step = (step * 2).min(REGISTRY_POLL_MOST);
    }
}

/// The looking side (`ferry receive`, `ferry pair CODE`): `--peer` (`peer`), then this host, then the LAN,
/// then the relay, round after round until one answers or `wait` is over (`0`: one round). A connection that
/// never reached the PAKE (nobody listening yet, a timeout) costs the code no guess, so waiting spends none of
/// the budget; a round over the network starts at most every [`RETRY_MOST`] (sooner at first), and the relay
/// is waited at once, on its own thread.
pub fn connect(
    meeting: &Meeting,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    wait: Duration,
    events: &mut dyn Events,
) -> Result<Connected, SessionError> {
    if opts.force_relay && opts.relay.is_none() {
        return Err(SessionError::NoRelay);
    }
    let started = Instant::now();
    let deadline = started + wait;
    let hashes: Vec<NameplateHash> = meeting.hashes().copied().collect();
    let registry = match peer.is_none() && !opts.force_relay {
        true => Some(LocalRegistry::open_default()?),
        false => None,
    };
    let mut tried = HashSet::new();
    let mut unreachable = BTreeMap::new();
    let mut last_error = None;
    // Each attempt that reaches the PAKE hands the peer our confirmation, one guess it can check: a receive
    // gives at most MAX_FAILED_ATTEMPTS of them, whatever the LAN announces.
    let attempts = match meeting.auth {
        MeetingAuth::Code(_) => Some(CodeAttempts::at_most(MAX_FAILED_ATTEMPTS)),
        MeetingAuth::Other(_) => None,
    };
    let handshake = |stream| initiate(stream, meeting.auth.auth(), attempts.as_ref());
    // Addresses that closed a connection before their first byte (a waiting side whose handshake slots
    // were all taken): dialled again every round while the wait lasts, said once.
    let mut busy = HashSet::new();
    let mut relay_answers = None;
    let mut relay_waited = false;
    let mut retry = RETRY_FIRST;
    loop {
        for (addr, path) in direct_candidates(&hashes, opts, peer, registry.as_ref(), &tried)? {
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = CONNECT_TIMEOUT.min(left.max(CONNECT_LEAST));
            let stream = match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => s,
                Err(e) => {
                    // Maybe not listening yet: dialled again next round, if there is one; said once.
                    if unreachable.insert(addr, e.to_string()).is_none() {
                        let again = Instant::now() < deadline || opts.relay.is_some();
                        let again = if again { "; trying again" } else { "" };
                        events.warn(&format!("cannot reach {addr}: {e}{again}"));
                    }
                    continue;
                }
            };
            tried.insert(addr);
            let e = match handshake(stream) {
                Ok((stream, established)) => {
                    return Ok(Connected {
                        stream,
                        established,
                        path,
                        peer: addr.to_string(),
                        handshake: None,
                    })
                }
                Err((e, false)) if closed_at_once(&e) && Instant::now() < deadline => {
                    tried.remove(&addr);
                    if busy.insert(addr) {
                        events.warn(&format!(
                            "{addr} closed the connection before its first byte (busy?); trying again"
                        ));
                    }
                    last_error = Some(Failure::Busy(addr));
                    continue;
                }
                Err((e, _)) => e,
            };
            match e {
                // This host's registry is private to the user: a failed PAKE there means the wrong code. A
                // LAN announcement may be a spoofer's, whose failed PAKE must not stop us from looking on,
                // up to the limit of failed attempts.
                e if path != PathKind::Lan && opts.relay.is_none() => return Err(e.into()),
                ChannelError::WrongCode if path != PathKind::Lan => {
                    return Err(ChannelError::WrongCode.into())
                }
                e if attempts.as_ref().is_some_and(|a| a.is_dead()) => {
                    let failed = attempts.as_ref().map_or(0, |a| a.failed());
                    return Err(SessionError::WrongCode {
                        message: format!(
                            "{failed} attempts with this code failed (last: {path} path to {addr}: {e}); \
                             giving no more guesses away, check the code"
                        ),
                        source: ChannelError::WrongCode,
                    });
                }
                e => {
                    events.warn(&format!("{path} path to {addr} failed: {e}"));
                    last_error = Some(Failure::Handshake(e));
                }
            }
        }
        // Direct paths come first: the relay is asked once they had a moment, and then waited at for the
        // rest of `wait` (at least RELAY_LEAST) while they are retried.
        if let (Some(relay), None) = (&opts.relay, &relay_answers) {
            if opts.force_relay || started.elapsed() >= FIND_BRIEFLY {
                let left = deadline.saturating_duration_since(Instant::now());
                relay_answers = Some(wait_at_relay(relay, &hashes, left.max(RELAY_LEAST)));
            }
        }
        let now = Instant::now();
        let until = match (now < deadline, &relay_answers) {
            (true, _) => Some(now + retry.min(deadline - now)),
            // Time is up, but the relay is still being waited at: its answer ends the wait.
            (false, Some(_)) => None,
            // Time is up before the relay was asked (`--wait 0`): it is asked after its moment.
            (false, None) if opts.relay.is_some() => Some(started + FIND_BRIEFLY),
            (false, None) => break,
        };
        events.waiting("Waiting for the sender...");
        let fresh = |a: &SocketAddr| {
            !tried.contains(a) && !unreachable.contains_key(a) && !busy.contains(a)
        };
        match pause(
            until,
            relay_answers.as_ref(),
            registry.as_ref(),
            &hashes,
            fresh,
        )? {
            None => {}
            Some(Ok(stream)) => {
                let relay = opts.relay.clone().unwrap_or_default();
                let (stream, established) = match handshake(stream) {
                    Ok(done) => done,
                    // The sharer behind the relay was busy: the relay is asked again while the wait lasts.
                    Err((e, false)) if closed_at_once(&e) && Instant::now() < deadline => {
                        events.warn(&format!(
                            "the peer behind the relay {relay} closed the connection before its first \
                             byte (busy?); trying again"
                        ));
                        relay_answers = None;
                        continue;
                    }
                    Err((e, _)) => return Err(e.into()),
                };
                return Ok(Connected {
                    stream,
                    established,
                    path: PathKind::Relay,
                    peer: relay,
                    handshake: None,
                });
            }
            Some(Err(ferry_relay::RelayError::TimedOut)) => {
                relay_waited = true;
                break;
            }
            Some(Err(e)) => return Err(relay_error(opts.relay.as_deref().unwrap_or_default(), e)),
        }
        retry = (retry * 2).min(RETRY_MOST);
    }
    match last_error {
        Some(Failure::Handshake(e)) => return Err(e.into()),
        Some(Failure::Busy(addr)) => {
            return Err(SessionError::PeerNotFound(format!(
                "{addr} closed every connection before its first byte within {}: the {} there is \
                 busy (every handshake slot taken), or it is not ferry; --wait DURATION waits longer",
                exact_duration(wait),
                meeting.waited_for
            )))
        }
        None => {}
    }
    Err(not_found(
        meeting,
        opts,
        peer,
        wait,
        &unreachable,
        relay_waited,
    ))
}

/// The last way a direct path failed.
enum Failure {
    /// The handshake failed.
    Handshake(ChannelError),
    /// The address closed the connection before its first byte.
    Busy(SocketAddr),
}

/// The end of a wait with no sender: what was tried, and what to do.
fn not_found(
    meeting: &Meeting,
    opts: &PeerOptions,
    peer: Option<SocketAddr>,
    wait: Duration,
    unreachable: &BTreeMap<SocketAddr, String>,
    relay_waited: bool,
) -> SessionError {
    let mut tried = Vec::new();
    if let Some(addr) = peer {
        tried.push(format!("--peer {addr}"));
    } else if !opts.force_relay {
        tried.push("this host".to_string());
        if !opts.no_discovery {
            tried.push("the LAN (mDNS)".to_string());
        }
    }
    if let Some(relay) = &opts.relay {
        let how = match relay_waited {
            true => format!(" (no {} came)", meeting.waited_for),
            false => String::new(),
        };
        tried.push(format!("the relay {relay}{how}"));
    }
    let failures: String = unreachable
        .iter()
        .map(|(addr, e)| format!("; {addr}: {e}"))
        .collect();
    let when = match wait.is_zero() {
        true => "at once (--wait 0)".to_string(),
        false => format!("within {}", exact_duration(wait)),
    };
    SessionError::PeerNotFound(format!(
        "no {} for {} found {when} (tried {}{failures}); is {} running? \
         on another machine give --relay or --peer ADDR; --wait DURATION waits longer",
        meeting.waited_for,
        meeting.label,
        tried.join(", "),
        meeting.other_side,
    ))
}

/// `wait` as `--wait` takes it, exactly: `90s`, `5m`, `1h`, `250ms`.
fn exact_duration(wait: Duration) -> String {
    let secs = wait.as_secs();
    match (secs, wait.subsec_millis()) {
        (0, ms) => format!("{ms}ms"),
        (s, 0) if s % 3600 == 0 => format!("{}h", s / 3600),
        (s, 0) if s % 60 == 0 => format!("{}m", s / 60),
        (s, 0) => format!("{s}s"),
        _ => format!("{}ms", wait.as_millis()),
    }
}

#[cfg(test)]
mod tests {
    use super::exact_duration;
    use std::time::Duration;

    #[test]
    fn waits_are_shown_as_given() {
        assert_eq!(exact_duration(Duration::from_secs(90)), "90s");
        assert_eq!(exact_duration(Duration::from_secs(300)), "5m");
        assert_eq!(exact_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(exact_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(exact_duration(Duration::from_millis(1500)), "1500ms");
    }
}
