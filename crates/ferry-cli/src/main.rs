//! The `ferry` command: wires the channel, transfer, rendezvous and benchmark crates to the command line.

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod bench;
mod failure;
mod hint;
mod interrupt;
mod ls_cmd;
mod mount_cmd;
mod pair_cmd;
mod paired;
mod peers_cmd;
mod prompt;
// Wired to the paired peers' connection code when the branches meet.
mod pull_cmd;
mod reach_args;
mod relay_cmd;
mod settings;
mod share_cmd;
mod spool;
mod transfer_cmd;
mod ui;

/// Move files between machines, encrypted end to end.
#[derive(Parser, Debug)]
#[command(name = "ferry", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Send files and directories; prints a code for the receiver.
    Send(transfer_cmd::SendArgs),
    /// Receive what a sender offers under CODE.
    Receive(transfer_cmd::ReceiveArgs),
    /// Pair with another machine: prints a code, or completes the pairing with the code printed there.
    Pair(pair_cmd::PairArgs),
    /// Print this machine's identity fingerprint (creating its key on first use).
    Id(peers_cmd::IdArgs),
    /// List, rename or remove paired peers.
    Peers(peers_cmd::PeersArgs),
    /// Serve a directory to paired peers (read-only unless --writable) until stopped.
    Share(share_cmd::ShareArgs),
    /// List a paired peer's share: NAME or NAME:PATH.
    Ls(ls_cmd::LsArgs),
    /// Fetch a file or tree from a paired peer's share: NAME:PATH [DEST], verified.
    Pull(pull_cmd::PullArgs),
    /// Mount a paired peer's share as a local directory: NAME[:SHARE] MOUNTPOINT (until unmounted).
    Mount(mount_cmd::MountArgs),
    /// Unmount what `ferry mount` mounted: MOUNTPOINT.
    Unmount(mount_cmd::UnmountArgs),
    /// Run the rendezvous and relay server (sees only ciphertext).
    Relay(relay_cmd::RelayArgs),
    /// Run the layered benchmark suite.
    Bench(bench::BenchArgs),
    /// Print shell completions.
    Completions {
        /// The shell to generate completions for.
        shell: clap_complete::Shell,
    },
}

// Closed stdout or stderr (`ferry ... | head`, a terminal that went away): SIGPIPE stays ignored, as Rust
// sets it up, and every write of ours to stdout or stderr goes through `ui::stdout_line`/`ui::stderr_line`,
// which drop a failed write instead of panicking like `println!`. Restoring SIGPIPE's default instead
// would make a closed pipe end the process, but it would also kill a sender or relay whose peer hangs up
// (splice and write on sockets raise SIGPIPE too) instead of letting it report `peer-gone` and clean up.
fn main() -> ExitCode {
    // `ferry bench share` re-runs this binary as its sharer (to measure the sharer's memory alone).
    ferry_bench::share::serve_if_child();
    let cli = Cli::parse();
    let (json, verb) = match &cli.command {
        Command::Send(a) => (a.json(), "sent"),
        Command::Receive(a) => (a.json(), "received"),
        Command::Pair(a) => (a.json(), ""),
        Command::Id(a) => (a.json, ""),
        Command::Peers(a) => (a.json, ""),
        Command::Share(a) => (a.json(), ""),
        Command::Ls(a) => (a.json(), ""),
        Command::Pull(a) => (a.json(), "pulled"),
        Command::Mount(a) => (a.json(), ""),
        Command::Unmount(a) => (a.json(), ""),
        _ => (false, ""),
    };
    let mut ui = ui::Ui::new(json, verb);
    if !matches!(
        cli.command,
        Command::Relay(_) | Command::Share(_) | Command::Mount(_)
    ) {
        // The relay, the share and the mount handle SIGINT/SIGTERM themselves, to shut down cleanly.
        interrupt::install(json);
    }
    let result = match cli.command {
        Command::Send(args) => args.check().and_then(|_| transfer_cmd::send(args, &mut ui)),
        Command::Receive(args) => transfer_cmd::receive(args, &mut ui),
        Command::Pair(args) => pair_cmd::pair(args, &mut ui),
        Command::Id(args) => peers_cmd::id(args),
        Command::Peers(args) => peers_cmd::peers(args),
        Command::Share(args) => share_cmd::run(args, &mut ui),
        Command::Ls(args) => ls_cmd::run(args, &mut ui),
        Command::Pull(args) => pull_cmd::run(args, &mut ui),
        Command::Mount(args) => mount_cmd::run(args, &mut ui),
        Command::Unmount(args) => mount_cmd::unmount(args, &mut ui),
        Command::Relay(args) => relay_cmd::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Completions { shell } => {
            // Generated into memory: clap_complete panics when its writer fails, and `| head` closes
            // the pipe early; nobody is left to read the rest, so a failed write ends quietly.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "ferry", &mut script);
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&script).and_then(|_| out.flush());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let f = failure::classify(&e);
            ui.error(f.code, &one_line(&e));
            ExitCode::from(f.exit)
        }
    }
}

/// The error and its causes on one line, each cause once: a cause whose text its parent already
/// includes is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}
