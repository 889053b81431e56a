//! The conformer convolution module, over x (B, T, C) as (B, C, T):
//! zero the padded frames → pointwise_conv1 (C → 2C) → GLU over channels →
//! depthwise_conv (kernel k, padding (k−1)/2, or k−1 on the left when
//! causal) → norm (batch or layer norm) → activation → pointwise_conv2 →
//! zero the padded frames.
//!
//! The padded frames are zeroed once more right before the depthwise conv.
//! WeNet does not do this: there, pointwise_conv1's bias makes padded frames
//! GLU(bias) ≠ 0, and the depthwise kernel carries that into the last
//! (k−1)/2 valid frames, so a sequence's output depends on how much padding
//! its batch has. Zeroing here makes a valid frame see exactly what it sees
//! when the sequence runs alone (the same parameters, the same result as
//! WeNet for an unpadded sequence). `wenet_masking` turns that extra zeroing
//! off (and leaves the causal left padding as `glu(bias)` too), reproducing
//! WeNet's numbers exactly.
//!
//! Streaming (causal only, as WeNet's `forward` with a cache): the cache is
//! the last `k−1` input frames (after the input mask, before
//! pointwise_conv1); a chunk is the cache followed by its frames, so the
//! depthwise conv sees exactly what it sees in the whole utterance.

use super::config::{Activation, ConvNorm};
use super::ffn::activate;
use crate::error::Result;
use crate::nn::{BatchNorm1d, Conv1d, LayerNorm, Module};
use crate::ops;
use crate::tensor::{DType, Rng, Tensor};

/// The norm after the depthwise conv.
#[derive(Clone, Debug)]
pub enum ConvModuleNorm {
    /// Over channels with running statistics.
    Batch(BatchNorm1d),
    /// Over channels per frame.
    Layer(LayerNorm),
}

/// WeNet's ConvolutionModule.
#[derive(Clone, Debug)]
pub struct ConvolutionModule {
    /// C → 2C, kernel 1.
    pub pointwise_conv1: Conv1d,
    /// Per-channel kernel.
    pub depthwise_conv: Conv1d,
    /// The norm.
    pub norm: ConvModuleNorm,
    /// C → C, kernel 1.
    pub pointwise_conv2: Conv1d,
    /// The activation.
    pub act: Activation,
    /// Left padding for a causal conv (0 when symmetric).
    pub lorder: usize,
    /// Mask only the module's input and output, as WeNet does.
    pub wenet_masking: bool,
}

impl ConvolutionModule {
    /// A module over `c` channels.
    // The arguments are WeNet's ConvolutionModule options, one for one.
    #[allow(clippy::too_many_arguments)]
    pub fn new(c: usize, kernel: usize, act: Activation, norm: ConvNorm, causal: bool, eps: f64, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let (padding, lorder) = if causal { (0, kernel.saturating_sub(1)) } else { ((kernel.saturating_sub(1)) / 2, 0) };
        let pointwise_conv1 = Conv1d::pointwise(c, 2 * c, true, dtype, rng)?;
        let depthwise_conv = Conv1d::depthwise(c, kernel, padding, true, dtype, rng)?;
        let norm = match norm {
            ConvNorm::BatchNorm => ConvModuleNorm::Batch(BatchNorm1d::new(c, eps, dtype)?),
            ConvNorm::LayerNorm => ConvModuleNorm::Layer(LayerNorm::new(c, eps, dtype)?),
        };
        let pointwise_conv2 = Conv1d::pointwise(c, c, true, dtype, rng)?;
        Ok(ConvolutionModule { pointwise_conv1, depthwise_conv, norm, pointwise_conv2, act, lorder, wenet_masking: false })
    }

    /// x (B, T, C); `pad` u8 (B, 1, T) with 1 at padded frames.
    pub fn forward(&self, x: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
        self.forward_cached(x, pad, None).map(|(y, _)| y)
    }

    /// As [`ConvolutionModule::forward`], continuing from `cache` (B, C, k−1),
    /// the input frames before x (causal modules only; `None` is the start of
    /// the stream, zero frames). Returns the output and the next cache
    /// (None for a non-causal module).
    pub fn forward_cached(&self, x: &Tensor, pad: Option<&Tensor>, cache: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
        let mut h = ops::transpose(x, 1, 2)?;
        if let Some(m) = pad {
            h = ops::masked_fill(&h, m, 0.0)?;
        }
        if self.lorder > 0 {
            h = match cache {
                Some(c) => ops::cat(&[c, &h], 2)?,
                None => ops::pad(&h, 2, self.lorder, 0, 0.0)?,
            };
        } else if cache.is_some() {
            return Err(crate::error::Error::invalid("ConvolutionModule", "a cache was given to a non-causal convolution module"));
        }
        let next = if self.lorder > 0 {
            let t = h.dims()[2];
            Some(ops::narrow(&h, 2, t - self.lorder, self.lorder)?)
        } else {
            None
        };
        let mut h = ops::glu(&self.pointwise_conv1.forward(&h)?, 1)?;
        if let (Some(m), false) = (pad, self.wenet_masking) {
            h = ops::masked_fill(&h, &self.left_padded(m)?, 0.0)?;
        }
        let h = self.depthwise_conv.forward(&h)?;
        let h = match &self.norm {
            ConvModuleNorm::Batch(bn) => bn.forward(&h)?,
            ConvModuleNorm::Layer(ln) => ops::transpose(&ln.forward(&ops::transpose(&h, 1, 2)?)?, 1, 2)?,
        };
        let mut h = self.pointwise_conv2.forward(&activate(self.act, &h)?)?;
        if let Some(m) = pad {
            h = ops::masked_fill(&h, m, 0.0)?;
        }
        Ok((ops::transpose(&h, 1, 2)?, next))
    }
}

impl ConvolutionModule {
    /// The frame mask widened by the causal left context (zero padding or
    /// the cache), which is not masked: zero padding becomes `glu(bias)`, as
    /// in WeNet, whether the stream starts there or the utterance does.
    fn left_padded(&self, m: &Tensor) -> Result<Tensor> {
        if self.lorder == 0 {
            return Ok(m.clone());
        }
        if m.rank() != 3 {
            return Err(crate::error::Error::ShapeMismatch {
                op: "ConvolutionModule",
                expected: "a frame mask (B, 1, T)".into(),
                got: format!("{}", m.shape()),
            });
        }
        let (b, t) = (m.dims()[0], m.dims()[2]);
        let v = m.to_vec::<u8>()?;
        let mut w = Vec::with_capacity(b * (t + self.lorder));
        for row in v.chunks(t.max(1)) {
            w.extend(std::iter::repeat_n(0u8, self.lorder));
            w.extend_from_slice(row);
        }
        Tensor::from_vec(w, [b, 1, t + self.lorder], &m.device())
    }
}

impl Module for ConvolutionModule {
    fn describe(&self) -> String {
        format!("ConvolutionModule(activation={:?})", self.act)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let norm: &dyn Module = match &self.norm {
            ConvModuleNorm::Batch(b) => b,
            ConvModuleNorm::Layer(l) => l,
        };
        vec![
            ("pointwise_conv1".into(), &self.pointwise_conv1 as &dyn Module),
            ("depthwise_conv".into(), &self.depthwise_conv),
            ("norm".into(), norm),
            ("pointwise_conv2".into(), &self.pointwise_conv2),
        ]
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        let norm: &mut dyn Module = match &mut self.norm {
            ConvModuleNorm::Batch(b) => b,
            ConvModuleNorm::Layer(l) => l,
        };
        vec![norm]
    }
}
