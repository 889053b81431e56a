//! The conformer convolution module, over x (B, T, C), channels last
//! throughout (no transposes; the parameters keep PyTorch's shapes):
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
//! WeNet's numbers exactly. With that zeroing the input's own zeroing
//! changes nothing (pointwise_conv1 is per frame), so it is skipped unless
//! a streaming cache reads the masked input or `wenet_masking` is on.
//!
//! With swish (WeNet's default), everything between the two pointwise convs
//! is `ops::conv_module_core`: fused kernels on the GPU when the fusion
//! switch has `convmodule` on (training, eval and streaming alike), the
//! composition of the same ops otherwise; other activations always run the
//! composition.
//!
//! Streaming (causal only, as WeNet's `forward` with a cache): the cache is
//! the last `k−1` input frames (after the input mask, before
//! pointwise_conv1); a chunk is the cache followed by its frames, so the
//! depthwise conv sees exactly what it sees in the whole utterance.

use super::config::{Activation, ConvNorm};
use super::ffn::activate;
use crate::error::Result;
use crate::nn::{BatchNorm1d, Conv1d, Conv1dKind, LayerNorm, Module};
use crate::ops::{self, ConvCoreNorm};
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
        self.run(x, pad, None, false, true).map(|(y, _)| y)
    }

    /// The module as a residual branch whose add zeroes the padded frames:
    /// `(rows, f)` with `rows` the output's frame mask (B, T, 1) (None
    /// without `pad`) and `f(x)` the forward without its last `masked_fill`,
    /// so that `masked_fill(f(x), rows, 0)` is `forward(x, pad)`. The
    /// residual block applies the mask, in the fused add's launches when the
    /// norm fusion is on (`ops::add_layer_norm_masked`).
    #[allow(clippy::type_complexity)]
    pub fn forward_for_residual<'a>(&'a self, pad: Option<&'a Tensor>) -> Result<(Option<Tensor>, Box<dyn Fn(&Tensor) -> Result<Tensor> + 'a>)> {
        let rows = pad.map(|m| self.frame_mask(m, 0)).transpose()?;
        Ok((rows, Box::new(move |x| self.run(x, pad, None, false, false).map(|(y, _)| y))))
    }

    /// As [`ConvolutionModule::forward`], continuing from `cache` (B, C, k−1),
    /// the input frames before x (causal modules only; `None` is the start of
    /// the stream, zero frames). Returns the output and the next cache
    /// (None for a non-causal module).
    pub fn forward_cached(&self, x: &Tensor, pad: Option<&Tensor>, cache: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
        self.run(x, pad, cache, true, true)
    }

    /// The module channels last throughout: x stays (B, T, C); the pointwise
    /// convs are `linear` on their (Co, Ci, 1) weights viewed as (Co, Ci),
    /// GLU and the norms act on the last dim, the depthwise conv is the
    /// channels-last kernel and the frame masks are (B, T, 1) views of
    /// `pad`. Only a requested next cache is transposed to WeNet's (B, C, k−1).
    /// Without `mask_output` the output's padded frames are left for the
    /// caller to zero ([`ConvolutionModule::forward_for_residual`]).
    fn run(&self, x: &Tensor, pad: Option<&Tensor>, cache: Option<&Tensor>, want_cache: bool, mask_output: bool) -> Result<(Tensor, Option<Tensor>)> {
        if x.rank() != 3 {
            return Err(crate::error::Error::ShapeMismatch { op: "ConvolutionModule", expected: "an input (B, T, C)".into(), got: format!("{}", x.shape()) });
        }
        let mask = pad.map(|m| self.frame_mask(m, 0)).transpose()?;
        let mut h = x.clone();
        // With the GLU mask (not `wenet_masking`), masking the input too
        // changes no value: pointwise_conv1 works frame by frame and the GLU
        // mask zeroes its padded frames, in values and, exactly, in
        // gradients (x's gradient there is then 0 · pointwise_conv1's weight,
        // a signed zero; x, a norm's output, is finite). It is kept where the
        // next cache reads the masked frames, and for WeNet's masking, where
        // padded input frames reach the depthwise conv. Skipping it saves a
        // launch each way per layer.
        let input_mask = if self.wenet_masking || want_cache { mask.as_ref() } else { None };
        if let Some(m) = input_mask {
            h = ops::masked_fill(&h, m, 0.0)?;
        }
        if self.lorder > 0 {
            h = match cache {
                Some(c) => ops::cat(&[&ops::transpose(c, 1, 2)?, &h], 1)?,
                None => ops::pad(&h, 1, self.lorder, 0, 0.0)?,
            };
        } else if cache.is_some() {
            return Err(crate::error::Error::invalid("ConvolutionModule", "a cache was given to a non-causal convolution module"));
        }
        let next = if self.lorder > 0 && want_cache {
            let t = h.dims()[1];
            Some(ops::transpose(&ops::narrow(&h, 1, t - self.lorder, self.lorder)?, 1, 2)?)
        } else {
            None
        };
        let a = self.pointwise_conv1.forward_channels_last(&h)?;
        let glu_mask = match (pad, self.wenet_masking) {
            (Some(m), false) => Some(self.frame_mask(m, self.lorder)?),
            _ => None,
        };
        let h = match (self.act, &self.depthwise_conv.kind) {
            (Activation::Swish, &Conv1dKind::Depthwise { padding, .. }) => self.core(&a, glu_mask.as_ref(), padding)?,
            _ => self.core_other_activation(&a, glu_mask.as_ref())?,
        };
        let mut h = self.pointwise_conv2.forward_channels_last(&h)?;
        if let (Some(m), true) = (&mask, mask_output) {
            h = ops::masked_fill(&h, m, 0.0)?;
        }
        Ok((h, next))
    }
}

impl ConvolutionModule {
    /// GLU → mask → depthwise conv → norm → swish between the two pointwise
    /// convs: `ops::conv_module_core` (fused on the GPU when the fusion
    /// switch has `convmodule` on, else the composition of the same ops).
    fn core(&self, a: &Tensor, glu_mask: Option<&Tensor>, padding: usize) -> Result<Tensor> {
        let (w, b) = (&self.depthwise_conv.weight, self.depthwise_conv.bias.as_ref());
        match &self.norm {
            ConvModuleNorm::Batch(bn) => {
                let y = ops::conv_module_core(a, glu_mask, w, b, padding, &ConvCoreNorm::Batch { weight: &bn.weight, bias: &bn.bias, state: bn.state() })?;
                bn.count_batch()?;
                Ok(y)
            }
            ConvModuleNorm::Layer(ln) => {
                ops::conv_module_core(a, glu_mask, w, b, padding, &ConvCoreNorm::Layer { weight: &ln.weight, bias: &ln.bias, eps: ln.eps })
            }
        }
    }

    /// The same composition with an activation other than swish (never fused).
    fn core_other_activation(&self, a: &Tensor, glu_mask: Option<&Tensor>) -> Result<Tensor> {
        let mut h = ops::glu(a, -1)?;
        if let Some(m) = glu_mask {
            h = ops::masked_fill(&h, m, 0.0)?;
        }
        let h = self.depthwise_conv.forward_channels_last(&h)?;
        let h = match &self.norm {
            ConvModuleNorm::Batch(bn) => {
                let (b, t, c) = (h.dims()[0], h.dims()[1], h.dims()[2]);
                ops::reshape(&bn.forward(&ops::reshape(&h, [b * t, c])?)?, [b, t, c])?
            }
            ConvModuleNorm::Layer(ln) => ln.forward(&h)?,
        };
        activate(self.act, &h)
    }

    /// The frame mask (B, 1, T) as (B, left + T, 1) for channels-last
    /// activations, widened by `left` unmasked frames: the causal left
    /// context (zero padding or the cache), which is not masked, so zero
    /// padding becomes `glu(bias)`, as in WeNet, whether the stream starts
    /// there or the utterance does. With `left` 0 it is a view of `m`.
    fn frame_mask(&self, m: &Tensor, left: usize) -> Result<Tensor> {
        if m.rank() != 3 || m.dims()[1] != 1 {
            return Err(crate::error::Error::ShapeMismatch {
                op: "ConvolutionModule",
                expected: "a frame mask (B, 1, T)".into(),
                got: format!("{}", m.shape()),
            });
        }
        let (b, t) = (m.dims()[0], m.dims()[2]);
        let m = ops::reshape(m, [b, t, 1])?;
        if left == 0 {
            return Ok(m);
        }
        // On the mask's device: a GPU mask is never read back by the host.
        ops::pad(&m, 1, left, 0, 0.0)
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
