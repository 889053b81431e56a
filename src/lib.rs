//! asrforge: an end-to-end speech recognition trainer that owns its tensors,
//! its autograd tape and its kernels. The CPU backend is the reference every
//! CUDA kernel is checked against. See DESIGN.md in the project's shared docs.

pub mod autograd;
pub mod backend;
pub mod data;
pub mod decode;
pub mod dist;
pub mod engine;
pub mod error;
pub mod launch;
pub mod models;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod tensor;
pub mod train;

pub use error::{Error, Result};
pub use tensor::{DType, Device, Shape, Tensor};
