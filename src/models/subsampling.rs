//! The encoder's input layer. Convolutional subsampling (WeNet's
//! Conv2dSubsampling4/6/8): x (B, T, F) as one image channel, conv k3 s2
//! (+ k3 s2 | k5 s3 | k3 s2, k3 s2), each followed by ReLU, no padding;
//! then (B, T', C·F') → Linear → (B, T', d) and the positional encoding.
//! A conv with kernel k and stride s maps a length L to (L−k)/s + 1, so
//! 1/4 gives ((T−1)//2 − 1)//2 frames; the sequence lengths (WeNet's padding
//! mask) are subsampled the same way, so valid output frames only ever see
//! valid input frames. `linear`: Linear + LayerNorm + Dropout, no subsampling.

use super::config::{InputLayer, PosEncType};
use super::pos_enc::PositionalEncoding;
use crate::error::{Error, Result};
use crate::nn::{Conv2d, Dropout, LayerNorm, Linear, Module};
use crate::ops;
use crate::tensor::{DType, Rng, Tensor};

/// An input layer with its positional encoding.
#[derive(Clone, Debug)]
pub struct Subsampling {
    /// Which layer.
    pub kind: InputLayer,
    /// The convolutions (empty for `linear`).
    pub convs: Vec<Conv2d>,
    /// The projection to the model dim.
    pub out: Linear,
    /// LayerNorm and dropout of the `linear` input layer.
    pub norm: Option<(LayerNorm, Dropout)>,
    /// The positional encoding.
    pub pos_enc: PositionalEncoding,
}

/// Output length of a valid (unpadded) conv of kernel `k`, stride `s` over `l` frames.
pub fn conv_len(l: usize, k: usize, s: usize) -> usize {
    if l >= k {
        (l - k) / s + 1
    } else {
        0
    }
}

impl Subsampling {
    /// The layer for `kind` from `idim` features to `odim`.
    pub fn new(kind: InputLayer, idim: usize, odim: usize, dropout: f64, pos: (PosEncType, f64), dtype: DType, rng: &mut Rng) -> Result<Self> {
        let pos_enc = PositionalEncoding::new(pos.0, odim, pos.1, dtype)?;
        let plan = Self::plan_of(kind);
        let mut convs = Vec::new();
        let mut f = idim;
        for (i, &(k, s)) in plan.iter().enumerate() {
            convs.push(Conv2d::new(if i == 0 { 1 } else { odim }, odim, k, s, 0, dtype, rng)?);
            f = conv_len(f, k, s);
        }
        if f == 0 {
            return Err(Error::config("input_dim", format!("{idim} features are too few for input_layer {kind:?}")));
        }
        let fin = if plan.is_empty() { idim } else { odim * f };
        let out = Linear::new(fin, odim, true, dtype, rng)?;
        let norm = if kind == InputLayer::Linear { Some((LayerNorm::new(odim, 1e-5, dtype)?, Dropout::new(dropout))) } else { None };
        Ok(Subsampling { kind, convs, out, norm, pos_enc })
    }

    /// (kernel, stride) of each convolution over time of `kind` (empty for `linear`).
    pub fn plan_of(kind: InputLayer) -> &'static [(usize, usize)] {
        match kind {
            InputLayer::Linear => &[],
            InputLayer::Conv2d => &[(3, 2), (3, 2)],
            InputLayer::Conv2d6 => &[(3, 2), (5, 3)],
            InputLayer::Conv2d8 => &[(3, 2), (3, 2), (3, 2)],
        }
    }

    /// The subsampling factor (1, 4, 6 or 8).
    pub fn rate(&self) -> usize {
        Self::plan_of(self.kind).iter().map(|&(_, s)| s).product()
    }

    /// Input frames after the first that one output frame reads (WeNet's
    /// `right_context`: 6, 10 and 14 for conv2d, conv2d6 and conv2d8).
    pub fn right_context(&self) -> usize {
        let mut stride = 1;
        let mut ctx = 0;
        for &(k, s) in Self::plan_of(self.kind) {
            ctx += (k - 1) * stride;
            stride *= s;
        }
        ctx
    }

    /// Output lengths for input lengths.
    pub fn out_lens(&self, lens: &[usize]) -> Vec<usize> {
        lens.iter().map(|&l| Self::plan_of(self.kind).iter().fold(l, |l, &(k, s)| conv_len(l, k, s))).collect()
    }

    /// x (B, T, F) → (output (B, T', d), positional rows (1, T', d), output lengths).
    pub fn forward(&self, x: &Tensor, lens: &[usize]) -> Result<(Tensor, Tensor, Vec<usize>)> {
        self.forward_at(x, lens, 0)
    }

    /// As [`Subsampling::forward`] for a chunk whose first output frame is frame `offset` of the stream.
    pub fn forward_at(&self, x: &Tensor, lens: &[usize], offset: usize) -> Result<(Tensor, Tensor, Vec<usize>)> {
        let y = if let Some((norm, drop)) = &self.norm {
            drop.forward(&norm.forward(&self.out.forward(x)?)?)?
        } else {
            let mut h = ops::unsqueeze(x, 1)?;
            for c in &self.convs {
                h = c.forward_relu(&h)?;
            }
            let (b, ch, t, f) = (h.dims()[0], h.dims()[1], h.dims()[2], h.dims()[3]);
            let h = ops::reshape(&ops::permute(&h, &[0, 2, 1, 3])?, [b, t, ch * f])?;
            self.out.forward(&h)?
        };
        let (y, pos) = self.pos_enc.forward_at(&y, offset)?;
        Ok((y, pos, self.out_lens(lens)))
    }
}

impl Module for Subsampling {
    fn describe(&self) -> String {
        match self.kind {
            InputLayer::Linear => "LinearNoSubsampling".into(),
            InputLayer::Conv2d => "Conv2dSubsampling4".into(),
            InputLayer::Conv2d6 => "Conv2dSubsampling6".into(),
            InputLayer::Conv2d8 => "Conv2dSubsampling8".into(),
        }
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        // Keys follow WeNet's nn.Sequential indices (a ReLU sits between convs).
        let mut v: Vec<(String, &dyn Module)> = self.convs.iter().enumerate().map(|(i, c)| (format!("conv.{}", 2 * i), c as &dyn Module)).collect();
        match (&self.norm, self.kind) {
            (Some((n, d)), _) => {
                v.push(("out.0".into(), &self.out));
                v.push(("out.1".into(), n));
                v.push(("out.2".into(), d));
            }
            (None, InputLayer::Conv2d) => v.push(("out.0".into(), &self.out)),
            (None, _) => v.push(("linear".into(), &self.out)),
        }
        v.push(("pos_enc".into(), &self.pos_enc));
        v
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        let mut v: Vec<&mut dyn Module> = self.convs.iter_mut().map(|c| c as &mut dyn Module).collect();
        v.push(&mut self.out);
        if let Some((n, d)) = &mut self.norm {
            v.push(n);
            v.push(d);
        }
        v.push(&mut self.pos_enc);
        v
    }
}
