//! The data subcommands of the `asrforge` binary: `compute-cmvn` and `compute-feats`.
//!
//! Flag names follow WeNet's tools (underscores), with dashed aliases.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Args;

use crate::data::cmvn::compute_cmvn;
use crate::data::config::DataConfig;
use crate::data::feats_dump::{compute_feats, write_feats};
use crate::data::list::{DataList, ListFormat};
use crate::data::process::Processor;
use crate::error::{Error, Result};

/// `asrforge compute-cmvn`: global CMVN statistics, as WeNet's tools/compute_cmvn_stats.py.
#[derive(Args, Debug, Clone)]
pub struct ComputeCmvnArgs {
    /// Worker threads.
    #[arg(long = "num_workers", alias = "num-workers", default_value_t = 1)]
    pub num_workers: usize,
    /// train.yaml whose dataset_conf (fbank_conf, resample_conf) defines the features.
    #[arg(long = "train_config", alias = "train-config")]
    pub train_config: PathBuf,
    /// A wav.scp (`key path` lines).
    #[arg(long = "in_scp", alias = "in-scp", conflicts_with = "data_list")]
    pub in_scp: Option<PathBuf>,
    /// A data.list (raw JSON lines or `key wav txt`, or a shard list with --data_type shard).
    #[arg(long = "data_list", alias = "data-list")]
    pub data_list: Option<PathBuf>,
    /// `raw` or `shard` (for --data_list).
    #[arg(long = "data_type", alias = "data-type", default_value = "raw")]
    pub data_type: String,
    /// Where to write the JSON statistics.
    #[arg(long = "out_cmvn", alias = "out-cmvn", default_value = "global_cmvn")]
    pub out_cmvn: PathBuf,
    /// Accepted for WeNet compatibility; progress is shown by a bar instead.
    #[arg(long = "log_interval", alias = "log-interval", default_value_t = 1000)]
    pub log_interval: usize,
}

/// `asrforge compute-feats`: dump every utterance's fbank to a safetensors file.
#[derive(Args, Debug, Clone)]
pub struct ComputeFeatsArgs {
    /// train.yaml whose dataset_conf defines the features.
    #[arg(long = "config", alias = "train_config")]
    pub config: PathBuf,
    /// The data list.
    #[arg(long = "data_list", alias = "data-list")]
    pub data_list: PathBuf,
    /// `raw` or `shard`.
    #[arg(long = "data_type", alias = "data-type", default_value = "raw")]
    pub data_type: String,
    /// Output safetensors file.
    #[arg(long = "out")]
    pub out: PathBuf,
    /// Worker threads.
    #[arg(long = "num_workers", alias = "num-workers", default_value_t = 1)]
    pub num_workers: usize,
    /// Seed of the dither noise.
    #[arg(long = "seed", default_value_t = 777)]
    pub seed: u64,
}

/// Runs `compute-cmvn`; skipped utterances are reported on stderr.
pub fn run_compute_cmvn(args: &ComputeCmvnArgs) -> Result<()> {
    let cfg = DataConfig::from_yaml_file(&args.train_config)?;
    let mut dconf = cfg.dataset_conf;
    // WeNet's tool computes statistics without dither.
    dconf.fbank_conf.dither = 0.0;
    let proc = Processor::new(&dconf, None)?;
    let list = match (&args.in_scp, &args.data_list) {
        (Some(scp), _) => DataList::read(scp, ListFormat::Raw)?,
        (None, Some(l)) => DataList::read(l, ListFormat::parse(&args.data_type)?)?,
        (None, None) => return Err(Error::invalid("compute-cmvn", "expected --in_scp or --data_list, found neither")),
    };
    let (stats, skipped) = compute_cmvn(&list, &proc, args.num_workers)?;
    if stats.frame_num == 0 {
        return Err(Error::Data {
            path: list.path.clone(),
            msg: format!("expected at least one usable utterance, found none of {} lines ({})", list.len(), skipped.summary()),
        });
    }
    // Utterances with non-finite features are skipped; sums that still
    // overflow would be written as `null` and poison every later run.
    if let Some(d) = stats.mean_stat.iter().chain(&stats.var_stat).position(|x| !x.is_finite()) {
        return Err(Error::Data {
            path: list.path.clone(),
            msg: format!(
                "expected finite CMVN statistics, found a non-finite sum in dimension {} over {} frames ({}); {} not written",
                d % stats.mean_stat.len().max(1),
                stats.frame_num,
                skipped.summary(),
                args.out_cmvn.display()
            ),
        });
    }
    stats.write(&args.out_cmvn)?;
    eprintln!(
        "compute-cmvn: {} frames of dim {} from {} lines, {}; wrote {}",
        stats.frame_num,
        stats.mean_stat.len(),
        list.len(),
        skipped.summary(),
        args.out_cmvn.display()
    );
    Ok(())
}

/// Runs `compute-feats`; skipped utterances are reported on stderr.
pub fn run_compute_feats(args: &ComputeFeatsArgs) -> Result<()> {
    let cfg = DataConfig::from_yaml_file(&args.config)?;
    let dconf = &cfg.dataset_conf;
    let proc = Processor::new(dconf, None)?;
    let list = DataList::read(&args.data_list, ListFormat::parse(&args.data_type)?)?;
    let (samples, skipped) = compute_feats(&list, &proc, args.num_workers, args.seed)?;
    let metadata = HashMap::from([
        ("num_mel_bins".to_string(), dconf.fbank_conf.num_mel_bins.to_string()),
        ("sample_rate".to_string(), dconf.resample_conf.resample_rate.to_string()),
        ("frame_length_ms".to_string(), dconf.fbank_conf.frame_length.to_string()),
        ("frame_shift_ms".to_string(), dconf.fbank_conf.frame_shift.to_string()),
        ("dither".to_string(), dconf.fbank_conf.dither.to_string()),
        ("seed".to_string(), args.seed.to_string()),
    ]);
    write_feats(&samples, metadata, &args.out)?;
    eprintln!("compute-feats: {} utterances, {}; wrote {}", samples.len(), skipped.summary(), args.out.display());
    Ok(())
}
