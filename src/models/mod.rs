//! The model zoo: WeNet's front end (global CMVN, convolutional
//! subsampling, positional encodings), Conformer and Transformer encoders,
//! the attention decoders, the CTC head and the hybrid CTC/attention
//! `AsrModel`, built from a WeNet-style `train.yaml` and saved as
//! safetensors with WeNet's `state_dict` keys.

pub mod asr_model;
pub mod average;
pub mod checkpoint;
pub mod cli;
pub mod cmvn;
pub mod config;
pub mod convolution;
pub mod ctc;
pub mod decoder;
pub mod decoder_cache;
pub mod encoder;
pub mod encoder_layer;
pub mod ffn;
pub mod limits;
pub mod mask;
pub mod pos_enc;
mod residual;
pub mod streaming;
pub mod subsampling;
pub mod summary;
mod yaml;

pub use asr_model::{AsrModel, LossDict, LossValues};
pub use checkpoint::{load_checkpoint, load_prefixes, save_checkpoint, LoadReport};
pub use cmvn::GlobalCmvn;
pub use config::ModelConfig;
pub use ctc::Ctc;
pub use decoder::{Decoder, TransformerDecoder};
pub use decoder_cache::DecoderCache;
pub use encoder::Encoder;
