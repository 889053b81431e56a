//! The differentiable ops. Each function checks its arguments (typed errors,
//! never a panic), dispatches on the device to the backend's kernel, and
//! records its backward on the tape when an input requires grad. Backward
//! passes run under `no_grad` and are written with the same ops or with a
//! dedicated backward kernel of the same family.

mod accuracy;
mod attention;
mod autocast;
mod binary;
mod cast;
mod conv;
mod conv_module;
mod ctc;
mod dropout;
pub mod fusion;
mod index;
mod label_smoothing;
mod layout;
mod matmul;
mod matmul_scaled;
mod norm;
mod placement;
mod reduce;
mod softmax;
mod unary;

pub use accuracy::token_accuracy;
pub use attention::{flash_attention, flash_attention_q_kv, flash_attention_qkv, FlashMask, RelPos};
pub use autocast::{autocast, autocast_dtype, autocast_params, autocast_params_packed, packed_params, set_autocast, AutocastGuard};
pub use binary::{add, add_scalar, add_scaled, div, mul, mul_scalar, sub, sum_to_shape};
pub use cast::{cat_cast_many, to_dtype, to_dtype_many, widen_half};
pub use conv::{conv1d_depthwise, conv1d_pointwise, conv1d_pointwise_channels_last, conv2d, conv2d_relu};
pub use conv_module::{conv_module_core, ConvCoreNorm};
pub use ctc::{ctc_loss, ctc_loss_fused, Reduction};
pub use dropout::{activation_dropout, dropout, pos_enc_dropout, pos_rows_dropout};
pub use index::{embedding, gather, index_select, masked_fill, where_cond};
pub use label_smoothing::{label_smoothing_loss, label_smoothing_loss_fused, label_smoothing_loss_reference};
pub use layout::{cat, flatten, narrow, pad, permute, reshape, squeeze, stack, transpose, unsqueeze};
pub use matmul::{linear, matmul, matmul_t};
pub use matmul_scaled::{matmul_pair_scaled, matmul_scaled};
pub use norm::{add_layer_norm, add_layer_norm_masked, batch_norm, layer_norm, BatchNormState};
pub use reduce::{broadcast_to, max, mean, mean_all, sum, sum_all};
pub use softmax::{log_softmax, masked_softmax, softmax};
pub use unary::{abs, affine, exp, gelu, glu, log, neg, pow, relu, rsqrt, sigmoid, silu, sqrt, tanh};

use crate::backend::cpu::CpuStorage;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{Shape, Tensor};

/// A fresh, untracked tensor over a kernel's output on either device.
///
/// The dispatch pattern of a converted op family:
/// ```text
/// let y = match &*x.storage() {
///     Storage::Cpu(c) => Storage::Cpu(cpu::softmax::softmax(c, ...)?),
///     Storage::Cuda(g) => Storage::Cuda(cuda::softmax::softmax(g, ...)?),
/// };
/// Ok(out_storage(y, shape))
/// ```
pub(crate) fn out_storage(s: Storage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(s, shape.into())
}

/// A fresh, untracked tensor over a kernel's CPU output.
pub(crate) fn out(s: CpuStorage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cpu(s), shape.into())
}

/// The error for storages of one op on different devices (CPU and GPU mixed).
pub(crate) fn mixed(op: &'static str) -> Error {
    Error::invalid(op, "operands on different devices (CPU and GPU storage mixed)")
}

/// Checks that two tensors share a device and a dtype.
pub(crate) fn same_kind(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch { op, lhs: a.device(), rhs: b.device() });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op, expected: a.dtype(), got: b.dtype() });
    }
    Ok(())
}

/// Checks an exact shape.
pub(crate) fn expect_shape(op: &'static str, what: &str, t: &Tensor, dims: &[usize]) -> Result<()> {
    if t.dims() != dims {
        return Err(Error::ShapeMismatch { op, expected: format!("{what} of shape {dims:?}"), got: format!("{}", t.shape()) });
    }
    Ok(())
}

/// Checks a rank.
pub(crate) fn expect_rank(op: &'static str, what: &str, t: &Tensor, ranks: &[usize]) -> Result<()> {
    if !ranks.contains(&t.rank()) {
        return Err(Error::ShapeMismatch { op, expected: format!("{what} of rank {ranks:?}"), got: format!("shape {}", t.shape()) });
    }
    Ok(())
}
