//! The arguments of `asrforge train`, in WeNet's groups and spellings
//! (underscores, with hyphenated aliases).

use std::path::PathBuf;

/// Arguments of `train` (WeNet's `wenet/bin/train.py`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// The train.yaml.
    #[arg(long, help_heading = "Model")]
    pub config: PathBuf,
    /// Where checkpoints and the resolved train.yaml are written.
    #[arg(long = "model_dir", alias = "model-dir", help_heading = "Model")]
    pub model_dir: PathBuf,
    /// A checkpoint to start from (resumes exactly when its state file is beside it).
    #[arg(long, help_heading = "Model")]
    pub checkpoint: Option<PathBuf>,
    /// Remove another run's checkpoints from --model_dir instead of refusing to train there.
    #[arg(long, help_heading = "Model")]
    pub overwrite: bool,
    /// TensorBoard log directory.
    #[arg(long = "tensorboard_dir", alias = "tensorboard-dir", default_value = "tensorboard", help_heading = "Model")]
    pub tensorboard_dir: PathBuf,
    /// Overrides a nested config key, e.g. "encoder_conf.num_blocks 6" (repeatable).
    #[arg(long = "override_config", alias = "override-config", value_name = "KEY VALUE", help_heading = "Model")]
    pub override_config: Vec<String>,
    /// A checkpoint to initialise some modules from.
    #[arg(long = "enc_init", alias = "enc-init", help_heading = "Model")]
    pub enc_init: Option<PathBuf>,
    /// Comma-separated key prefixes taken from --enc_init.
    #[arg(long = "enc_init_mods", alias = "enc-init-mods", default_value = "encoder.", value_delimiter = ',', help_heading = "Model")]
    pub enc_init_mods: Vec<String>,

    /// raw or shard.
    #[arg(long = "data_type", alias = "data-type", default_value = "raw", value_parser = ["raw", "shard"], help_heading = "Dataset")]
    pub data_type: String,
    /// The training data.list.
    #[arg(long = "train_data", alias = "train-data", help_heading = "Dataset")]
    pub train_data: PathBuf,
    /// The cross-validation data.list.
    #[arg(long = "cv_data", alias = "cv-data", help_heading = "Dataset")]
    pub cv_data: PathBuf,
    /// units.txt (overrides tokenizer_conf.symbol_table_path).
    #[arg(long = "symbol_table", alias = "symbol-table", help_heading = "Dataset")]
    pub symbol_table: Option<PathBuf>,
    /// Decoding threads per loader.
    #[arg(long = "num_workers", alias = "num-workers", default_value_t = 0, help_heading = "Dataset")]
    pub num_workers: usize,
    /// Batches prefetched per loader.
    #[arg(long, default_value_t = 100, help_heading = "Dataset")]
    pub prefetch: usize,
    /// Accepted for WeNet compatibility (no effect on the CPU).
    #[arg(long = "pin_memory", alias = "pin-memory", help_heading = "Dataset")]
    pub pin_memory: bool,

    /// Communication backend of DDP (nccl, gloo).
    #[arg(long = "ddp.dist_backend", alias = "ddp.dist-backend", alias = "dist_backend", default_value = "nccl", help_heading = "DDP")]
    pub dist_backend: String,
    /// Mixed precision with a dynamic loss scaler.
    #[arg(long = "use_amp", alias = "use-amp", help_heading = "DDP")]
    pub use_amp: bool,
    /// All-reduces DDP's gradient buckets in half precision, as WeNet's flag
    /// (PyTorch's fp16_compress_hook): each bucket is divided by the world
    /// size, rounded to f16 (to bf16 when training with --dtype bf16),
    /// summed over the ranks and converted back. Half the bytes on the wire,
    /// at the price of half-precision rounding in the averaged gradients.
    /// For torch_ddp over several processes (nothing is communicated on one);
    /// --train_engine deepspeed refuses it.
    #[arg(long = "fp16_grad_sync", alias = "fp16-grad-sync", help_heading = "DDP")]
    pub fp16_grad_sync: bool,
    /// torch_ddp or deepspeed.
    #[arg(long = "train_engine", alias = "train-engine", default_value = "torch_ddp", value_parser = ["torch_ddp", "deepspeed"], help_heading = "DDP")]
    pub train_engine: String,

    /// A DeepSpeed JSON config.
    #[arg(long = "deepspeed_config", alias = "deepspeed-config", help_heading = "DeepSpeed")]
    pub deepspeed_config: Option<PathBuf>,
    /// Save optimizer states with DeepSpeed checkpoints (model_only or model+optimizer).
    #[arg(long = "deepspeed.save_states", alias = "deepspeed.save-states", default_value = "model_only", help_heading = "DeepSpeed")]
    pub deepspeed_save_states: String,
    /// Seconds any wait on another rank may last (rendezvous, join group, and
    /// every collective of the engine: gradient buckets, ZeRO shards, cv sums,
    /// the barrier after a save) before the job fails naming the silent rank;
    /// it must exceed the longest time one rank runs ahead of another (a step,
    /// a checkpoint save).
    #[arg(long, default_value_t = 30, help_heading = "DeepSpeed")]
    pub timeout: u64,

    /// Device to train on: cpu, or cuda (the GPU numbered LOCAL_RANK).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
    /// Precision of matrix products and convolutions (WeNet's --dtype):
    /// fp32, fp16 (with the loss scaler; --use_amp implies it) or bf16 (no scaler).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "fp16", "bf16"])]
    pub dtype: String,
    /// Allows TF32 tensor cores for f32 matrix products on the GPU (off by
    /// default, as in PyTorch; the config key `tf32: true` does the same).
    #[arg(long)]
    pub tf32: bool,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 777)]
    pub seed: u64,
}
