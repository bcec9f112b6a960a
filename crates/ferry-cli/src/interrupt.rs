//! SIGINT, SIGTERM and SIGHUP: what must still happen when a signal ends the process, and Ctrl-C at
//! the offer's question.
//!
//! The handler ends the process with `exit`, which runs no destructor, so whatever must not outlive the
//! process (the same-host announcement, the mDNS advertisement) is handed to [`keep_until_exit`]: the
//! handler drops it before exiting. Unwinding the main thread from a signal handler is not possible (it is
//! blocked in a read or an accept), hence this explicit list.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard};

use crate::failure;
use crate::ui;

type Kept = Vec<(u64, Box<dyn Any + Send>)>;

/// Values whose destructors must run when a signal ends the process.
static KEPT: Mutex<Kept> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Set while the receiver asks its question: Ctrl-C then answers it (a decline the sender hears of).
static QUESTION: Mutex<Option<mpsc::Sender<Answer>>> = Mutex::new(None);
/// What an interruption leaves and how to go on, said after "interrupted" (see [`leaves`]).
static LEFT: Mutex<&str> = Mutex::new("");

fn kept() -> MutexGuard<'static, Kept> {
    // A panic while the list was held cannot leave it inconsistent: each change is one push or remove.
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

fn question() -> MutexGuard<'static, Option<mpsc::Sender<Answer>>> {
    QUESTION.lock().unwrap_or_else(|e| e.into_inner())
}

/// Owns a value kept by [`keep_until_exit`]; dropping it drops the value.
pub struct KeptUntilExit(u64);

/// Keeps `value` until the returned handle is dropped or a signal ends the process, whichever comes
/// first: either way its destructor runs.
pub fn keep_until_exit<T: Send + 'static>(value: T) -> KeptUntilExit {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    kept().push((id, Box::new(value)));
    KeptUntilExit(id)
}

impl Drop for KeptUntilExit {
    fn drop(&mut self) {
        let value = {
            let mut kept = kept();
            kept.iter()
                .position(|(id, _)| *id == self.0)
                .map(|i| kept.swap_remove(i))
        };
        drop(value);
    }
}

/// Drops what [`keep_until_exit`] holds now: a server that stops on a signal by itself (`ferry share`)
/// withdraws its announcements before it exits.
pub fn release_kept() {
    let values = std::mem::take(&mut *kept());
    drop(values);
}

/// What ended the question.
pub enum Answer {
    /// A line was read (`None`: end of input or a read error).
    Line(Option<String>),
    /// Ctrl-C (or SIGTERM, SIGHUP) while asking.
    Interrupted,
    /// The peer closed the connection while asking: nobody is left to answer.
    PeerGone,
}

/// Routes the next signal to `tx` as [`Answer::Interrupted`] instead of ending the process, until
/// [`question_answered`].
pub fn asking(tx: mpsc::Sender<Answer>) {
    *question() = Some(tx);
}

/// The question is over: signals end the process again.
pub fn question_answered() {
    *question() = None;
}

/// From now on an interruption leaves `left` ("; what arrived is kept: ..."): set once data may have moved, so
/// that a command stopped while it still looks for its peer does not speak of data it never had.
pub fn leaves(left: &'static str) {
    *LEFT.lock().unwrap_or_else(|e| e.into_inner()) = left;
}

/// Installs the handler: at the question, a signal answers it; otherwise the process ends with status
/// 130 after dropping what [`keep_until_exit`] holds, saying `interrupted` and what [`leaves`] set.
pub fn install(json: bool) {
    let _ = ctrlc::set_handler(move || {
        let asked = question().take();
        if let Some(tx) = asked {
            if tx.send(Answer::Interrupted).is_ok() {
                return;
            }
        }
        release_kept();
        let e = failure::Interrupted(*LEFT.lock().unwrap_or_else(|e| e.into_inner()));
        let code = ferry_wire::ErrorCode::Interrupted;
        if json {
            ui::stdout_line(
                &serde_json::json!({"event": "error", "code": code.as_str(), "message": e.to_string()})
                    .to_string(),
            );
        } else {
            ui::stderr_line(&format!("\nferry: {e}"));
        }
        std::process::exit(i32::from(code.exit_status()));
    });
}

/// Reads SIGINT, SIGTERM, SIGHUP and SIGUSR1 on a thread of its own, so nothing unsafe runs in a handler
/// (for the commands that stop cleanly by themselves: `share`, `mount`): `on_stop` runs at each of the first
/// three, `on_stats` at each SIGUSR1. Registered before returning, so no signal from then on is missed.
pub fn on_signals(
    on_stats: impl Fn() + Send + 'static,
    on_stop: impl Fn() + Send + 'static,
) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut int, mut term, mut hup, mut usr1) = runtime.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
            signal(SignalKind::user_defined1())?,
        ))
    })?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            loop {
                tokio::select! {
                    _ = int.recv() => on_stop(),
                    _ = term.recv() => on_stop(),
                    _ = hup.recv() => on_stop(),
                    _ = usr1.recv() => on_stats(),
                }
            }
        })
    });
    Ok(())
}
