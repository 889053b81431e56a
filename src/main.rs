//! The `asrforge` command line.

use clap::{Parser, Subcommand};

/// asrforge: an end-to-end speech recognition trainer.
#[derive(Parser, Debug)]
#[command(name = "asrforge", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
enum Command {
    /// Print the model a config describes: its tree and parameter count, or its state-dict keys.
    ModelInfo(asrforge::models::cli::ModelInfoArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::ModelInfo(a) => asrforge::models::cli::run_model_info(a).map(|s| print!("{s}")),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
