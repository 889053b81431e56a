//! The model zoo: WeNet's front end (global CMVN, convolutional
//! subsampling, positional encodings), Conformer and Transformer encoders,
//! the attention decoders, the CTC head and the hybrid CTC/attention
//! `AsrModel`, built from a WeNet-style `train.yaml` and saved as
//! safetensors with WeNet's `state_dict` keys.

pub mod cmvn;
pub mod config;
pub mod convolution;
pub mod encoder;
pub mod encoder_layer;
pub mod ffn;
pub mod pos_enc;
pub mod subsampling;
mod yaml;

pub use cmvn::GlobalCmvn;
pub use encoder::Encoder;
