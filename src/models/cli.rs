//! `asrforge model-info`: build the model a config describes and print its
//! tree and parameter count, or (`--keys`) its state-dict keys and shapes.

use super::config::{apply_override, load_yaml, ModelConfig};
use super::summary::{model_summary, state_dict_keys};
use super::AsrModel;
use crate::error::Result;
use crate::tensor::{DType, Rng};
use std::path::PathBuf;

/// Arguments of `model-info`.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelInfoArgs {
    /// The train.yaml describing the model.
    #[arg(long)]
    pub config: PathBuf,
    /// Overrides a nested config key, e.g. "output_dim 4233" or "encoder_conf.num_blocks 6" (repeatable).
    #[arg(long = "override_config", value_name = "KEY VALUE")]
    pub override_config: Vec<String>,
    /// Print every state-dict key and its shape instead of the tree.
    #[arg(long)]
    pub keys: bool,
}

/// Runs `model-info`, returning what to print.
pub fn run_model_info(args: &ModelInfoArgs) -> Result<String> {
    let mut root = load_yaml(&args.config)?;
    for o in &args.override_config {
        apply_override(&mut root, o)?;
    }
    let (cfg, warnings) = ModelConfig::from_yaml(&root)?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    // Shapes do not depend on the CMVN statistics, so their file need not exist here.
    let model = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(0))?;
    Ok(if args.keys { state_dict_keys(&model) } else { model_summary(&model) })
}
