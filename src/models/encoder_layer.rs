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

use super::config::{EncoderConfig, SelfAttnType};
use super::convolution::ConvolutionModule;
use super::ffn::FeedForward;
use super::residual::{self, Branch};
use crate::error::Result;
use crate::nn::{AttentionMask, Dropout, KvCache, LayerNorm, Module, MultiHeadedAttention, RelPositionMultiHeadedAttention};
use crate::tensor::{DType, Rng, Tensor};

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
    /// A block of an encoder with options `c` (`conformer`: a conformer
    /// block, with the macaron FFN and the convolution module as `c` asks;
    /// else a transformer block), its parameters drawn from `rng` in the
    /// order [`super::Encoder::new`] draws them. Blocks for tests and
    /// benches start from [`EncoderConfig::defaults`].
    pub fn new(c: &EncoderConfig, conformer: bool, dtype: DType, rng: &mut Rng) -> Result<EncoderLayer> {
        let d = c.output_size;
        let self_attn = match c.selfattention_layer_type {
            SelfAttnType::Plain => SelfAttention::Plain(MultiHeadedAttention::new(c.attention_heads, d, c.attention_dropout_rate, dtype, rng)?),
            SelfAttnType::Rel => SelfAttention::Rel(RelPositionMultiHeadedAttention::new(c.attention_heads, d, c.attention_dropout_rate, dtype, rng)?),
        };
        let feed_forward = FeedForward::new(d, c.linear_units, c.dropout_rate, c.activation_type, dtype, rng)?;
        let macaron = conformer && c.macaron_style;
        let feed_forward_macaron = if macaron { Some(FeedForward::new(d, c.linear_units, c.dropout_rate, c.activation_type, dtype, rng)?) } else { None };
        let conv = conformer && c.use_cnn_module;
        let conv_module = if conv {
            let mut m = ConvolutionModule::new(d, c.cnn_module_kernel, c.activation_type, c.cnn_module_norm, c.causal, c.conv_norm_eps, dtype, rng)?;
            m.wenet_masking = c.wenet_conv_masking;
            Some(m)
        } else {
            None
        };
        let ln = || LayerNorm::new(d, c.norm_eps, dtype);
        Ok(EncoderLayer {
            self_attn,
            feed_forward,
            feed_forward_macaron,
            conv_module,
            norm_ff: ln()?,
            norm_mha: ln()?,
            norm_ff_macaron: if macaron { Some(ln()?) } else { None },
            norm_conv: if conv { Some(ln()?) } else { None },
            norm_final: if conv { Some(ln()?) } else { None },
            dropout: Dropout::new(c.dropout_rate),
            normalize_before: c.normalize_before,
            transformer_names: !conformer,
        })
    }

    /// x (B, T, D) with the key mask, the positional rows and the frame padding mask (B, 1, T).
    pub fn forward(&self, x: &Tensor, mask: Option<&AttentionMask>, pos: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.forward_into(x, None, mask, pos, pad, None)?.0)
    }

    /// The norm the layer's first branch reads its input through.
    pub fn first_norm(&self) -> &LayerNorm {
        self.norm_ff_macaron.as_ref().filter(|_| self.feed_forward_macaron.is_some()).unwrap_or(&self.norm_mha)
    }

    /// [`EncoderLayer::forward`] in the stack: `h` is `first_norm()(x)` when
    /// the layer before formed it, and with `next_norm` (the next layer's
    /// first norm, or the encoder's `after_norm`) a layer without a final
    /// norm may put its last residual add into that norm, whose output
    /// comes back beside the sum (`residual::Block::chain_into`).
    pub fn forward_into(
        &self,
        x: &Tensor,
        h: Option<&Tensor>,
        mask: Option<&AttentionMask>,
        pos: &Tensor,
        pad: Option<&Tensor>,
        next_norm: Option<&LayerNorm>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let ff_scale = if self.feed_forward_macaron.is_some() { 0.5 } else { 1.0 };
        let mut branches: Vec<Branch> = Vec::with_capacity(4);
        if let (Some(ff), Some(n)) = (&self.feed_forward_macaron, &self.norm_ff_macaron) {
            branches.push(Branch::new(n, ff_scale, Box::new(move |h| ff.forward(h))));
        }
        branches.push(Branch::new(&self.norm_mha, 1.0, Box::new(|h| self.self_attn.forward(h, mask, pos))));
        if let (Some(conv), Some(n)) = (&self.conv_module, &self.norm_conv) {
            // The module's output mask goes into the residual add after it.
            let (rows, f) = conv.forward_for_residual(pad)?;
            branches.push(Branch { norm: n, scale: 1.0, rows, f });
        }
        branches.push(Branch::new(&self.norm_ff, ff_scale, Box::new(|h| self.feed_forward.forward(h))));
        let block =
            residual::Block { branches: &branches, normalize_before: self.normalize_before, dropout: &self.dropout, final_norm: self.norm_final.as_ref() };
        block.chain_into(x, h, next_norm)
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
        let (kv, next_cnn) = (std::cell::RefCell::new(None), std::cell::RefCell::new(None));
        let mut branches: Vec<Branch> = Vec::with_capacity(4);
        if let (Some(ff), Some(n)) = (&self.feed_forward_macaron, &self.norm_ff_macaron) {
            branches.push(Branch::new(n, ff_scale, Box::new(move |h| ff.forward(h))));
        }
        branches.push(Branch::new(
            &self.norm_mha,
            1.0,
            Box::new(|h| {
                let (y, c) = self.self_attn.forward_cached(h, pos, att_cache)?;
                *kv.borrow_mut() = Some(c);
                Ok(y)
            }),
        ));
        if let (Some(conv), Some(n)) = (&self.conv_module, &self.norm_conv) {
            branches.push(Branch::new(
                n,
                1.0,
                Box::new(|h| {
                    let (y, c) = conv.forward_cached(h, None, cnn_cache)?;
                    *next_cnn.borrow_mut() = c;
                    Ok(y)
                }),
            ));
        }
        branches.push(Branch::new(&self.norm_ff, ff_scale, Box::new(|h| self.feed_forward.forward(h))));
        let block =
            residual::Block { branches: &branches, normalize_before: self.normalize_before, dropout: &self.dropout, final_norm: self.norm_final.as_ref() };
        let x = block.chain(x)?;
        drop(branches);
        let kv = kv.into_inner().ok_or_else(|| crate::error::Error::invalid("EncoderLayer", "self-attention returned no cache"))?;
        let next_cnn = next_cnn.into_inner();
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
    fn weight_packs(&self) -> Vec<Vec<Tensor>> {
        match &self.self_attn {
            SelfAttention::Plain(a) => a.packs(true),
            SelfAttention::Rel(a) => a.base.packs(true),
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
