//! The training pipeline's steps and the services they use (logging, checkpoints, config).

pub mod args;
pub mod bench;
pub mod bench_stats;
pub mod checkpoint;
pub mod config;
pub mod deepspeed;
pub mod device;
pub mod dist;
pub mod executor;
pub mod model_dir;
pub mod run;
pub mod setup;
pub mod tensorboard;
pub mod wrap;

pub use crate::engine::{Engine, SingleProcess};
pub use args::TrainArgs;
pub use checkpoint::{save_model, Position, TrainState};
pub use config::{check_modify_and_save_config, parse_train_config, read_config, TrainConfig};
pub use device::{amp_dtype, grad_sync_dtype, init_device, move_model};
pub use dist::{init_distributed, DistInfo, Distributed};
pub use executor::{BatchLoss, BatchSize, CvResult, Executor, ExecutorParts, StepReport};
pub use run::run_train;
pub use setup::{init_dataset_and_dataloader, init_model, init_optimizer_and_scheduler, init_scaler, init_summary_writer, print_model, Optim, Resume};
pub use wrap::wrap_model;
