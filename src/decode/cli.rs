//! `asrforge compute-cer`: scores a hypothesis text against a reference text
//! with [`crate::decode::cer`], printing each utterance as WeNet's
//! `compute-wer.py` does and the `Overall -> …` summary line.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::decode::cer::{compute_cer, Report};
use crate::error::{Error, Result};

/// Arguments of `compute-cer`.
#[derive(Args, Debug, Clone)]
pub struct ComputeCerArgs {
    /// Reference text (`key transcript` lines).
    #[arg(long = "ref")]
    pub reference: PathBuf,
    /// Hypothesis text (`key transcript` lines), e.g. `{result_dir}/{mode}/text`.
    #[arg(long = "hyp")]
    pub hypothesis: PathBuf,
    /// Character mode (`--char`, `--char=1`, `--char 1`); `--char=0` or no flag scores words.
    #[arg(long = "char", num_args = 0..=1, default_missing_value = "1", default_value = "0", value_name = "0|1")]
    pub char_mode: String,
    /// Print only the overall line.
    #[arg(long = "quiet")]
    pub quiet: bool,
}

/// Parses `--char`'s value: 1/0, true/false, yes/no.
fn parse_flag(v: &str) -> Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        other => Err(Error::invalid("compute-cer", format!("--char: expected 0 or 1, found `{other}`"))),
    }
}

/// The printed report: per-utterance blocks (`utt:`, `WER:` or in `--char` mode `CER:`, `lab:`, `rec:`) then the overall line.
pub fn format_report(report: &Report, char_mode: bool, quiet: bool) -> String {
    let sep = if char_mode { "" } else { " " };
    let mut out = String::new();
    if !quiet {
        for u in &report.utterances {
            let _ = writeln!(out, "utt: {}", u.key);
            let _ = writeln!(out, "{}", u.line_as(char_mode));
            let _ = writeln!(out, "lab: {}", u.reference.join(sep));
            let _ = writeln!(out, "rec: {}{}", u.hypothesis.join(sep), if u.missing_hyp { "(no hypothesis)" } else { "" });
            out.push('\n');
        }
    }
    let _ = writeln!(out, "{}", report.overall_line());
    out
}

/// Runs `compute-cer`, returning what to print; skipped or missing keys are reported on stderr.
pub fn run_compute_cer(args: &ComputeCerArgs) -> Result<String> {
    let char_mode = parse_flag(&args.char_mode)?;
    let report = compute_cer(&args.reference, &args.hypothesis, char_mode)?;
    if !report.skipped_hyp_keys.is_empty() {
        eprintln!("compute-cer: {} hypothesis keys are not in the reference and were not scored", report.skipped_hyp_keys.len());
    }
    if report.missing_hyp > 0 {
        eprintln!("compute-cer: {} reference utterances have no hypothesis (scored as deletions)", report.missing_hyp);
    }
    Ok(format_report(&report, char_mode, args.quiet))
}
