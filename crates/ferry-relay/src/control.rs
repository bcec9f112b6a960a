//! The relay's side of a listener's control connection: register hashes, announce clients,
//! expire unanswered tokens, keep the connection alive, and refuse a flood.
//!
//! One task per listener. Everything it holds is bounded: a read buffer of the longest message,
//! at most [`RelayConfig::max_pending_per_listener`](crate::RelayConfig) notices queued, and
//! its writes must complete within a keep-alive interval. The listener's registration (its seat
//! in the rendezvous table) is dropped whichever way the task ends, which frees its hashes and
//! ends the waits of the clients announced to it.

use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::pairing::{ListenerSeat, Notice, SourceSlot};
use crate::protocol::{FromRelay, Status, ToRelay, MAX_CONTROL_LEN};
use crate::server::{refuse, send_status, write_within, Shared};
use crate::stats::{bump, Gauge};

/// Messages a listener may send at once before the rate applies.
const BURST: f64 = 16.0;
/// Messages a listener may send per keep-alive interval after its burst: an honest one sends one
/// `PING` and one `PONG` per interval, and a `SET_HASHES` an hour.
const PER_INTERVAL: f64 = 4.0;
/// Keep-alive intervals of silence after which the listener counts as dead.
const SILENT_INTERVALS: u32 = 3;

/// Why a control connection ended.
enum End {
    /// The listener hung up, or the relay is stopping.
    Closed,
    /// The relay dropped it: silent, flooding, or speaking garbage.
    Dropped,
}

/// What woke the control task.
enum Event {
    /// The socket is readable (`false`: it failed).
    Readable(bool),
    Notice(Option<Notice>),
    Timer,
    Stop,
}

/// Serves one listener's control connection until it ends. `_places` are the listener's places
/// under its source's session cap and listener cap, held for as long as it is registered.
pub(crate) async fn serve(
    shared: &Arc<Shared>,
    stream: TcpStream,
    _places: (SourceSlot, SourceSlot),
) {
    let Some(mut seat) = shared.rendezvous.add_listener() else {
        bump(&shared.counters.refused_full);
        return refuse(stream, Status::Full).await;
    };
    let _registered = Gauge::new(&shared.counters.listeners);
    bump(&shared.counters.listeners_total);
    if send_status(&stream, Status::Listening).await.is_err() {
        return;
    }
    if let End::Dropped = run(shared, &stream, &mut seat).await {
        bump(&shared.counters.listeners_dropped);
    }
}

async fn run(shared: &Arc<Shared>, stream: &TcpStream, seat: &mut ListenerSeat<'_>) -> End {
    let every = shared.config.keepalive_interval;
    let send = |msg: FromRelay| async move { write_within(stream, &msg.encode(), every).await };
    let mut buf = vec![0u8; MAX_CONTROL_LEN];
    let mut filled = 0;
    let mut heard = Instant::now();
    let mut next_ping = heard + every;
    let mut budget = (BURST, Instant::now());
    let mut next_expiry = None;
    let mut stop = shared.shutdown.subscribe();
    loop {
        let wake = next_expiry.map_or(next_ping, |e: Instant| e.min(next_ping));
        let event = tokio::select! {
            r = stream.readable() => Event::Readable(r.is_ok()),
            n = seat.notices.recv() => Event::Notice(n),
            _ = tokio::time::sleep_until(wake.into()) => Event::Timer,
            _ = stop.wait_for(|s| *s) => Event::Stop,
        };
        match event {
            Event::Readable(false) | Event::Stop | Event::Notice(None) => return End::Closed,
            Event::Readable(true) => {
                match stream.try_read(&mut buf[filled..]) {
                    Ok(0) => return End::Closed,
                    Ok(n) => {
                        filled += n;
                        heard = Instant::now();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(_) => return End::Closed,
                }
                loop {
                    let (msg, used) = match ToRelay::decode(&buf[..filled]) {
                        Ok(Some(m)) => m,
                        Ok(None) => break,
                        Err(_) => return End::Dropped,
                    };
                    buf.copy_within(used..filled, 0);
                    filled -= used;
                    if !spend(&mut budget, every) {
                        return End::Dropped;
                    }
                    let answer = match msg {
                        ToRelay::SetHashes(hashes) => {
                            let r = shared.rendezvous.set_hashes(seat.id, &hashes);
                            if r.is_err() {
                                bump(&shared.counters.refused_taken);
                            }
                            FromRelay::HashesSet(r)
                        }
                        ToRelay::Ping => FromRelay::Pong,
                        ToRelay::Pong => continue,
                    };
                    if send(answer).await.is_err() {
                        return End::Dropped;
                    }
                }
            }
            Event::Notice(Some(n)) => {
                bump(&shared.counters.notifications);
                let msg = FromRelay::Incoming {
                    token: n.token,
                    hash: n.hash,
                };
                if send(msg).await.is_err() {
                    return End::Dropped;
                }
            }
            Event::Timer => {
                let now = Instant::now();
                if now >= next_ping {
                    if now.duration_since(heard) >= every * SILENT_INTERVALS {
                        return End::Dropped;
                    }
                    if send(FromRelay::Ping).await.is_err() {
                        return End::Dropped;
                    }
                    next_ping = now + every;
                }
            }
        }
        // Announcements may have come from this task (a set that found a waiting client) or
        // from clients' tasks; either way the earliest deadline is recomputed here.
        let (expired, next) = shared.rendezvous.expire(seat.id, Instant::now());
        for _ in 0..expired {
            bump(&shared.counters.tokens_expired);
        }
        next_expiry = next;
    }
}

/// Takes one message from the listener's token bucket; `false` when it is flooding.
fn spend(budget: &mut (f64, Instant), every: std::time::Duration) -> bool {
    let now = Instant::now();
    let refill = now.duration_since(budget.1).as_secs_f64() / every.as_secs_f64() * PER_INTERVAL;
    *budget = ((budget.0 + refill).min(BURST), now);
    if budget.0 < 1.0 {
        return false;
    }
    budget.0 -= 1.0;
    true
}
