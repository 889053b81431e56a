//! The `asrforge` command line: one subcommand per task, each with its own
//! argument struct and run function in the module that owns the task.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use asrforge::data::cli::{run_compute_cmvn, run_compute_feats, ComputeCmvnArgs, ComputeFeatsArgs};

/// asrforge: end-to-end speech recognition training.
#[derive(Parser, Debug)]
#[command(name = "asrforge", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Every subcommand; add a variant (and its run function) for a new one.
#[derive(Subcommand, Debug)]
enum Command {
    /// Global CMVN statistics in WeNet's JSON format.
    ComputeCmvn(ComputeCmvnArgs),
    /// Dump every utterance's fbank features to a safetensors file.
    ComputeFeats(ComputeFeatsArgs),
    /// Print the model a config describes: its tree and parameter count, or its state-dict keys.
    ModelInfo(asrforge::models::cli::ModelInfoArgs),
    /// Train a model from a WeNet train.yaml (WeNet's train.py).
    Train(asrforge::train::TrainArgs),
    /// Character / word error rate of a hypothesis text against a reference text.
    ComputeCer(asrforge::decode::cli::ComputeCerArgs),
    /// Average several checkpoints' parameters (the N latest or the N with the best cv_loss).
    Average(asrforge::models::average::AverageArgs),
    /// Decode a test list with a checkpoint in one or more modes.
    Recognize(asrforge::decode::recognize::RecognizeArgs),
    /// Start the workers of a job on this node (torchrun's flags), or on every host of a --hostfile.
    Launch(asrforge::launch::LaunchArgs),
    /// Train a config's model for a few steps on synthetic features and report losses, frames/s and peak memory.
    #[command(name = "bench-train")]
    BenchTrain(asrforge::train::bench::BenchTrainArgs),
    /// The build (version, features, embedded kernels and archs), the CUDA driver and libraries found, and the GPUs visible.
    Info,
}

fn run(command: &Command) -> asrforge::Result<()> {
    match command {
        Command::ComputeCmvn(args) => run_compute_cmvn(args),
        Command::ComputeFeats(args) => run_compute_feats(args),
        Command::ModelInfo(args) => asrforge::models::cli::run_model_info(args).map(|s| print!("{s}")),
        Command::Train(args) => asrforge::train::run_train(args).map(|_| ()),
        Command::ComputeCer(args) => asrforge::decode::cli::run_compute_cer(args).map(|s| print!("{s}")),
        Command::Average(args) => asrforge::models::average::run_average(args).map(|s| print!("{s}")),
        Command::Recognize(args) => asrforge::decode::recognize::run_recognize(args).map(|s| eprint!("{s}")),
        // Handled in `main`: the launcher exits with its workers' status.
        Command::Launch(_) => Ok(()),
        Command::BenchTrain(args) => asrforge::train::bench::run_bench_train(args).map(|r| {
            if let Some(p) = &r.profile {
                print!("{}", p.table(40));
            }
            if let Some((k, _)) = &r.kernel_profile {
                print!("{}", k.table());
            }
            println!("{}", r.line())
        }),
        Command::Info => {
            print!("{}", asrforge::backend::cuda::info::report());
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    return ExitCode::SUCCESS;
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    return ExitCode::from(1);
                }
                _ => {}
            }
            if e.kind() == ErrorKind::MissingRequiredArgument {
                if let Some(clap::error::ContextValue::Strings(missing)) = e.get(clap::error::ContextKind::InvalidArg) {
                    eprintln!("error: the following required arguments were not provided: {} (see --help)", missing.join(", "));
                    return ExitCode::from(1);
                }
            }
            // One line, no usage block: the first line of clap's message.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("error: {} (see --help)", first.trim_start_matches("error: "));
            return ExitCode::from(1);
        }
    };
    if let Command::Launch(args) = &cli.command {
        // The launcher exits with its workers' status.
        let subcommands: Vec<String> = Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect();
        return match asrforge::launch::run_launch(args, &subcommands) {
            Ok(status) => ExitCode::from(u8::try_from(status).unwrap_or(1)),
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        };
    }
    match run(&cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
