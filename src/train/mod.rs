//! The training pipeline's steps and the services they use (logging, checkpoints, config).

pub mod tensorboard;
