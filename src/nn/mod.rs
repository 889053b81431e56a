//! Layers with named parameters, on the tape from `ops` and `autograd`.
//!
//! A layer is a plain struct of tensor handles. Cloning one is cheap and the
//! clone shares the parameters (and their gradient slots), which is how an
//! activation-checkpointed segment captures the layer it re-runs.

mod attention;
mod conv;
mod dropout;
mod embedding;
mod init;
mod linear;
mod module;
mod norm;

pub use attention::{chunk_window, AttentionMask, KvCache, MultiHeadedAttention, RelPositionMultiHeadedAttention};
pub use conv::{Conv1d, Conv1dKind, Conv2d};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use init::{kaiming_uniform_bound, uniform_param, xavier_uniform_bound};
pub use linear::Linear;
pub use module::{format_shape, Module, NamedTensor, TensorKind};
pub use norm::{BatchNorm1d, LayerNorm};
