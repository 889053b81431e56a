//! One encoder block. Conformer (pre-norm, macaron):
//!   x += ½·ff_macaron(norm_ff_macaron(x))
//!   x += mha(norm_mha(x))
//!   x += conv(norm_conv(x))
//!   x += ½·ff(norm_ff(x))
//!   x  = norm_final(x)
//! each branch followed by dropout. Without macaron the FFN scale is 1;
//! without the conv module there is no norm_conv / norm_final. A transformer
//! block is the same with neither, its norms named norm1 (attention) and
//! norm2 (FFN) as WeNet names them. `normalize_before: false` moves each
//! norm after its residual add (post-norm).

use super::convolution::ConvolutionModule;
use super::ffn::FeedForward;
use crate::error::Result;
use crate::nn::{AttentionMask, Dropout, KvCache, LayerNorm, Module, MultiHeadedAttention, RelPositionMultiHeadedAttention};
use crate::ops;
use crate::tensor::Tensor;

/// The self-attention of an encoder block.
#[derive(Clone, Debug)]
pub enum SelfAttention {
    /// Plain scaled dot product.
    Plain(MultiHeadedAttention),
    /// With relative positions.
    Rel(RelPositionMultiHeadedAttention),
}

impl SelfAttention {
    /// Self-attention of x with the positional rows `pos` (ignored by the plain kind).
    pub fn forward(&self, x: &Tensor, mask: Option<&AttentionMask>, pos: &Tensor) -> Result<Tensor> {
        match self {
            SelfAttention::Plain(a) => a.forward(x, x, x, mask),
            SelfAttention::Rel(a) => a.forward(x, x, x, mask, pos),
        }
    }

    /// Streaming self-attention after a key/value cache; `pos` holds the rows of every key.
    pub fn forward_cached(&self, x: &Tensor, pos: &Tensor, cache: Option<&KvCache>) -> Result<(Tensor, KvCache)> {
        match self {
            SelfAttention::Plain(a) => a.forward_cached(x, None, cache),
            SelfAttention::Rel(a) => a.forward_cached(x, None, pos, cache),
        }
    }

    fn module(&self) -> &dyn Module {
        match self {
            SelfAttention::Plain(a) => a,
            SelfAttention::Rel(a) => a,
        }
    }

    fn module_mut(&mut self) -> &mut dyn Module {
        match self {
            SelfAttention::Plain(a) => a,
            SelfAttention::Rel(a) => a,
        }
    }
}

/// One residual branch of a block: the norm before it (pre-norm) or after
/// its add (post-norm), the scale of its add, and the branch itself.
type Branch<'a> = (&'a LayerNorm, f64, Box<dyn Fn(&Tensor) -> Result<Tensor> + 'a>);

/// A conformer or transformer encoder block.
#[derive(Clone, Debug)]
pub struct EncoderLayer {
    /// Self-attention.
    pub self_attn: SelfAttention,
    /// The feed-forward block.
    pub feed_forward: FeedForward,
    /// The macaron feed-forward block (conformer).
    pub feed_forward_macaron: Option<FeedForward>,
    /// The convolution module (conformer).
    pub conv_module: Option<ConvolutionModule>,
    /// Before the FFN (`norm2` in a transformer block).
    pub norm_ff: LayerNorm,
    /// Before the attention (`norm1` in a transformer block).
    pub norm_mha: LayerNorm,
    /// Before the macaron FFN.
    pub norm_ff_macaron: Option<LayerNorm>,
    /// Before the convolution module.
    pub norm_conv: Option<LayerNorm>,
    /// After the block (conformer with a conv module).
    pub norm_final: Option<LayerNorm>,
    /// Residual-branch dropout.
    pub dropout: Dropout,
    /// Pre-norm (true) or post-norm blocks.
    pub normalize_before: bool,
    /// Whether the keys follow TransformerEncoderLayer's names.
    pub transformer_names: bool,
}

impl EncoderLayer {
    fn branch(&self, x: &Tensor, norm: &LayerNorm, scale: f64, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let h = if self.normalize_before { norm.forward(x)? } else { x.clone() };
        let y = self.dropout.forward(&f(&h)?)?;
        // x + scale·y in one launch (the macaron half-step residual).
        let x = if scale != 1.0 { ops::add_scaled(x, &y, scale)? } else { ops::add(x, &y)? };
        if self.normalize_before {
            Ok(x)
        } else {
            norm.forward(&x)
        }
    }

    /// x (B, T, D) with the key mask, the positional rows and the frame padding mask (B, 1, T).
    pub fn forward(&self, x: &Tensor, mask: Option<&AttentionMask>, pos: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
        let ff_scale = if self.feed_forward_macaron.is_some() { 0.5 } else { 1.0 };
        let mut branches: Vec<Branch> = Vec::with_capacity(4);
        if let (Some(ff), Some(n)) = (&self.feed_forward_macaron, &self.norm_ff_macaron) {
            branches.push((n, ff_scale, Box::new(move |h| ff.forward(h))));
        }
        branches.push((&self.norm_mha, 1.0, Box::new(|h| self.self_attn.forward(h, mask, pos))));
        if let (Some(conv), Some(n)) = (&self.conv_module, &self.norm_conv) {
            branches.push((n, 1.0, Box::new(move |h| conv.forward(h, pad))));
        }
        branches.push((&self.norm_ff, ff_scale, Box::new(|h| self.feed_forward.forward(h))));
        if ops::fusion::enabled(ops::fusion::Fusion::Norm) {
            return self.forward_fused_norms(x, &branches);
        }
        let mut x = x.clone();
        for (n, scale, f) in &branches {
            x = self.branch(&x, n, *scale, f)?;
        }
        match &self.norm_final {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }

    /// [`EncoderLayer::forward`] with each residual add fused into the norm
    /// that reads its result (`ops::add_layer_norm`, fusion family `norm`):
    /// pre-norm, the add closing branch i with branch i + 1's norm (the last
    /// with `norm_final`); post-norm, each add with its own norm. The same
    /// values as the composition up to rounding of the gradients' sums.
    fn forward_fused_norms(&self, x: &Tensor, branches: &[Branch]) -> Result<Tensor> {
        if !self.normalize_before {
            let mut x = x.clone();
            for (n, scale, f) in branches {
                let y = self.dropout.forward(&f(&x)?)?;
                x = n.add_forward(&x, &y, *scale)?.1;
            }
            return match &self.norm_final {
                Some(n) => n.forward(&x),
                None => Ok(x),
            };
        }
        let Some((first, _, _)) = branches.first() else { return Ok(x.clone()) };
        let (mut x, mut h) = (x.clone(), first.forward(x)?);
        for (i, (_, scale, f)) in branches.iter().enumerate() {
            let y = self.dropout.forward(&f(&h)?)?;
            let next = branches.get(i + 1).map(|b| b.0).or(self.norm_final.as_ref());
            match next {
                Some(n) => (x, h) = n.add_forward(&x, &y, *scale)?,
                None => return if *scale != 1.0 { ops::add_scaled(&x, &y, *scale) } else { ops::add(&x, &y) },
            }
        }
        // The last add went into norm_final: its output is the block's.
        Ok(h)
    }

    /// One chunk of a stream (WeNet's layer call with `att_cache` and
    /// `cnn_cache`): x (1, T, D) attends to the cached keys and values and
    /// its own, with `pos` the rows of all of them; returns the output, all
    /// keys and values, and the convolution module's next cache.
    pub fn forward_chunk(
        &self,
        x: &Tensor,
        pos: &Tensor,
        att_cache: Option<&KvCache>,
        cnn_cache: Option<&Tensor>,
    ) -> Result<(Tensor, KvCache, Option<Tensor>)> {
        let ff_scale = if self.feed_forward_macaron.is_some() { 0.5 } else { 1.0 };
        let mut x = x.clone();
        if let (Some(ff), Some(n)) = (&self.feed_forward_macaron, &self.norm_ff_macaron) {
            x = self.branch(&x, n, ff_scale, |h| ff.forward(h))?;
        }
        let mut kv = None;
        x = self.branch(&x, &self.norm_mha, 1.0, |h| {
            let (y, c) = self.self_attn.forward_cached(h, pos, att_cache)?;
            kv = Some(c);
            Ok(y)
        })?;
        let kv = kv.ok_or_else(|| crate::error::Error::invalid("EncoderLayer", "self-attention returned no cache"))?;
        let mut next_cnn = None;
        if let (Some(conv), Some(n)) = (&self.conv_module, &self.norm_conv) {
            x = self.branch(&x, n, 1.0, |h| {
                let (y, c) = conv.forward_cached(h, None, cnn_cache)?;
                next_cnn = c;
                Ok(y)
            })?;
        }
        x = self.branch(&x, &self.norm_ff, ff_scale, |h| self.feed_forward.forward(h))?;
        let x = match &self.norm_final {
            Some(n) => n.forward(&x)?,
            None => x,
        };
        Ok((x, kv, next_cnn))
    }
}

impl Module for EncoderLayer {
    fn describe(&self) -> String {
        if self.transformer_names {
            "TransformerEncoderLayer".into()
        } else {
            "ConformerEncoderLayer".into()
        }
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut v: Vec<(String, &dyn Module)> = vec![("self_attn".into(), self.self_attn.module()), ("feed_forward".into(), &self.feed_forward)];
        if self.transformer_names {
            v.push(("norm1".into(), &self.norm_mha));
            v.push(("norm2".into(), &self.norm_ff));
        } else {
            if let Some(m) = &self.feed_forward_macaron {
                v.push(("feed_forward_macaron".into(), m));
            }
            if let Some(c) = &self.conv_module {
                v.push(("conv_module".into(), c));
            }
            v.push(("norm_ff".into(), &self.norm_ff));
            v.push(("norm_mha".into(), &self.norm_mha));
            for (n, m) in [("norm_ff_macaron", &self.norm_ff_macaron), ("norm_conv", &self.norm_conv), ("norm_final", &self.norm_final)] {
                if let Some(m) = m {
                    v.push((n.into(), m));
                }
            }
        }
        v.push(("dropout".into(), &self.dropout));
        v
    }
    /// The children in the order of [`Module::children`], norms included.
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        let EncoderLayer {
            self_attn,
            feed_forward,
            feed_forward_macaron,
            conv_module,
            norm_ff,
            norm_mha,
            norm_ff_macaron,
            norm_conv,
            norm_final,
            dropout,
            transformer_names,
            ..
        } = self;
        let mut v: Vec<&mut dyn Module> = vec![self_attn.module_mut(), feed_forward];
        if *transformer_names {
            v.push(norm_mha);
            v.push(norm_ff);
        } else {
            if let Some(m) = feed_forward_macaron {
                v.push(m);
            }
            if let Some(c) = conv_module {
                v.push(c);
            }
            v.push(norm_ff);
            v.push(norm_mha);
            for m in [norm_ff_macaron, norm_conv, norm_final].into_iter().flatten() {
                v.push(m);
            }
        }
        v.push(dropout);
        v
    }
}
