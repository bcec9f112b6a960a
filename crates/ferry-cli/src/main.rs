//! The `ferry` command: wires the channel, transfer and benchmark crates to the command line.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod bench;

/// Move files between machines, encrypted end to end.
#[derive(Parser, Debug)]
#[command(name = "ferry", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the layered benchmark suite.
    Bench(bench::BenchArgs),
    /// Print shell completions.
    Completions {
        /// The shell to generate completions for.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ferry", &mut std::io::stdout());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: {e:#}");
            ExitCode::FAILURE
        }
    }
}
