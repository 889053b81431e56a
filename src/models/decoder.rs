//! The attention decoders. TransformerDecoder: token embedding + absolute
//! positional encoding (`embed.0`, `embed.1`) → blocks of causal
//! self-attention, cross-attention to the encoder output and a ReLU FFN
//! (norm1/2/3, residual dropout) → `after_norm` → `output_layer` (logits).
//! BiTransformerDecoder: a left-to-right and a right-to-left decoder, the
//! latter fed the reversed targets.

use super::config::{DecoderConfig, DecoderType, PosEncType};
use super::ffn::FeedForward;
use super::pos_enc::PositionalEncoding;
use super::residual::{self, Branch};
use crate::autograd;
use crate::error::{Error, Result};
use crate::nn::{AttentionMask, Dropout, Embedding, LayerNorm, Linear, Module, MultiHeadedAttention};
use crate::ops;
use crate::tensor::{DType, Rng, Tensor};

/// One decoder block.
#[derive(Clone, Debug)]
pub struct DecoderLayer {
    /// Self-attention.
    pub self_attn: MultiHeadedAttention,
    /// Cross-attention to the encoder output.
    pub src_attn: MultiHeadedAttention,
    /// The feed-forward block.
    pub feed_forward: FeedForward,
    /// Before self-attention.
    pub norm1: LayerNorm,
    /// Before cross-attention.
    pub norm2: LayerNorm,
    /// Before the FFN.
    pub norm3: LayerNorm,
    /// Residual-branch dropout.
    pub dropout: Dropout,
    /// Pre-norm (true) or post-norm blocks.
    pub normalize_before: bool,
}

impl DecoderLayer {
    /// x (B, L, D) over `memory` (B, T, D) with the causal and memory masks.
    pub fn forward(&self, x: &Tensor, tgt_mask: &AttentionMask, memory: &Tensor, mem_mask: &AttentionMask) -> Result<Tensor> {
        Ok(self.forward_into(x, None, tgt_mask, memory, mem_mask, None)?.0)
    }

    /// [`DecoderLayer::forward`] in the stack: `h` is `norm1(x)` when the
    /// layer before formed it, and with `next_norm` (the next layer's
    /// `norm1`, or the decoder's `after_norm`) the last residual add may go
    /// into that norm, whose output comes back beside the sum
    /// (`residual::Block::chain_into`).
    pub fn forward_into(
        &self,
        x: &Tensor,
        h: Option<&Tensor>,
        tgt_mask: &AttentionMask,
        memory: &Tensor,
        mem_mask: &AttentionMask,
        next_norm: Option<&LayerNorm>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let branches: [Branch; 3] = [
            Branch::new(&self.norm1, 1.0, Box::new(|h| self.self_attn.forward(h, h, h, Some(tgt_mask)))),
            Branch::new(&self.norm2, 1.0, Box::new(|h| self.src_attn.forward(h, memory, memory, Some(mem_mask)))),
            Branch::new(&self.norm3, 1.0, Box::new(|h| self.feed_forward.forward(h))),
        ];
        let block = residual::Block { branches: &branches, normalize_before: self.normalize_before, dropout: &self.dropout, final_norm: None };
        block.chain_into(x, h, next_norm)
    }
}

impl Module for DecoderLayer {
    fn describe(&self) -> String {
        "DecoderLayer".into()
    }
    fn weight_packs(&self) -> Vec<Vec<Tensor>> {
        let mut v = self.self_attn.packs(true);
        v.extend(self.src_attn.packs(false));
        v
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![
            ("self_attn".into(), &self.self_attn as &dyn Module),
            ("src_attn".into(), &self.src_attn),
            ("feed_forward".into(), &self.feed_forward),
            ("norm1".into(), &self.norm1),
            ("norm2".into(), &self.norm2),
            ("norm3".into(), &self.norm3),
            ("dropout".into(), &self.dropout),
        ]
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        vec![&mut self.self_attn, &mut self.src_attn, &mut self.feed_forward, &mut self.dropout]
    }
}

/// A left-to-right transformer decoder.
#[derive(Clone, Debug)]
pub struct TransformerDecoder {
    /// The input layer.
    pub embed: Embedding,
    /// The positional encoding.
    pub pos_enc: PositionalEncoding,
    /// Final LayerNorm.
    pub after_norm: LayerNorm,
    /// Projection to the vocabulary.
    pub output_layer: Linear,
    /// The blocks.
    pub decoders: Vec<DecoderLayer>,
    /// Pre-norm (true) or post-norm blocks.
    pub normalize_before: bool,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// Training or eval mode.
    pub training: bool,
}

impl TransformerDecoder {
    /// A decoder of `blocks` blocks over `vocab` symbols and model dim `d`.
    pub fn new(vocab: usize, d: usize, blocks: usize, c: &DecoderConfig, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let embed = Embedding::new(vocab, d, dtype, rng)?;
        let pos_enc = PositionalEncoding::new(PosEncType::Abs, d, c.positional_dropout_rate, dtype)?;
        let after_norm = LayerNorm::new(d, c.norm_eps, dtype)?;
        let output_layer = Linear::new(d, vocab, true, dtype, rng)?;
        let mut decoders = Vec::with_capacity(blocks);
        for _ in 0..blocks {
            decoders.push(DecoderLayer {
                self_attn: MultiHeadedAttention::new(c.attention_heads, d, c.self_attention_dropout_rate, dtype, rng)?,
                src_attn: MultiHeadedAttention::new(c.attention_heads, d, c.src_attention_dropout_rate, dtype, rng)?,
                feed_forward: FeedForward::new(d, c.linear_units, c.dropout_rate, c.activation_type, dtype, rng)?,
                norm1: LayerNorm::new(d, c.norm_eps, dtype)?,
                norm2: LayerNorm::new(d, c.norm_eps, dtype)?,
                norm3: LayerNorm::new(d, c.norm_eps, dtype)?,
                dropout: Dropout::new(c.dropout_rate),
                normalize_before: c.normalize_before,
            });
        }
        Ok(TransformerDecoder {
            embed,
            pos_enc,
            after_norm,
            output_layer,
            decoders,
            normalize_before: c.normalize_before,
            gradient_checkpointing: c.gradient_checkpointing,
            training: true,
        })
    }

    /// Logits (B, L, V) for input tokens `ys_in` (B, L) i64 with lengths, over
    /// `memory` (B, T, D) with lengths; f32 under autocast.
    pub fn forward(&self, memory: &Tensor, mem_lens: &[usize], ys_in: &Tensor, ys_lens: &[usize]) -> Result<Tensor> {
        ops::widen_half(&self.forward_raw(memory, mem_lens, ys_in, ys_lens)?)
    }

    /// [`TransformerDecoder::forward`] with the logits in the output layer's
    /// dtype (f16/bf16 under autocast), for a loss that reads them as they
    /// are (the fused label smoothing) instead of through an f32 copy.
    pub fn forward_raw(&self, memory: &Tensor, mem_lens: &[usize], ys_in: &Tensor, ys_lens: &[usize]) -> Result<Tensor> {
        if memory.rank() != 3
            || ys_in.rank() != 2
            || ys_in.dims()[0] != memory.dims()[0]
            || ys_lens.len() != ys_in.dims()[0]
            || mem_lens.len() != memory.dims()[0]
        {
            return Err(Error::ShapeMismatch {
                op: "TransformerDecoder",
                expected: format!("tokens (B, L) and lengths for the {} sequences of memory {}", memory.dims()[0], memory.shape()),
                got: format!("tokens {}, {} token lengths, {} memory lengths", ys_in.shape(), ys_lens.len(), mem_lens.len()),
            });
        }
        let l = ys_in.dims()[1];
        let tgt_mask = AttentionMask::causal_padding(ys_lens, l)?;
        let mem_mask = AttentionMask::key_padding(mem_lens, memory.dims()[1])?;
        let x = self.pos_enc.encode_at(&self.embed.forward(ys_in)?, 0)?;
        let checkpointing = self.gradient_checkpointing && self.training && autograd::is_grad_enabled();
        let final_norm = self.normalize_before.then_some(&self.after_norm);
        let x = residual::run_stack(
            x,
            &self.decoders,
            |l| &l.norm1,
            final_norm,
            |layer, x, h, next| {
                if checkpointing {
                    let (ly, tm, mm, nn) = (layer.clone(), tgt_mask.clone(), mem_mask.clone(), next.cloned());
                    residual::checkpointed_block(x, memory, h, move |x, h, memory| ly.forward_into(x, h, &tm, memory, &mm, nn.as_ref()))
                } else {
                    layer.forward_into(&x, h.as_ref(), &tgt_mask, memory, &mem_mask, next)
                }
            },
        )?;
        self.output_layer.forward(&x)
    }
}

impl Module for TransformerDecoder {
    fn describe(&self) -> String {
        "TransformerDecoder".into()
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut v: Vec<(String, &dyn Module)> = vec![
            ("embed.0".into(), &self.embed),
            ("embed.1".into(), &self.pos_enc),
            ("after_norm".into(), &self.after_norm),
            ("output_layer".into(), &self.output_layer),
        ];
        for (i, l) in self.decoders.iter().enumerate() {
            v.push((format!("decoders.{i}"), l));
        }
        v
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        let mut v: Vec<&mut dyn Module> = vec![&mut self.pos_enc];
        v.extend(self.decoders.iter_mut().map(|l| l as &mut dyn Module));
        v
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// The attention decoder of an `AsrModel`.
#[derive(Clone, Debug)]
pub enum Decoder {
    /// Left to right only.
    Transformer(TransformerDecoder),
    /// Left to right plus right to left.
    Bi {
        /// Left to right.
        left_decoder: TransformerDecoder,
        /// Right to left, on reversed targets.
        right_decoder: TransformerDecoder,
    },
}

impl Decoder {
    /// Builds the decoder `kind` for `vocab` symbols over an encoder of dim `d`.
    pub fn new(kind: DecoderType, vocab: usize, d: usize, c: &DecoderConfig, dtype: DType, rng: &mut Rng) -> Result<Self> {
        Ok(match kind {
            DecoderType::Transformer => Decoder::Transformer(TransformerDecoder::new(vocab, d, c.num_blocks, c, dtype, rng)?),
            DecoderType::BiTransformer => Decoder::Bi {
                left_decoder: TransformerDecoder::new(vocab, d, c.num_blocks, c, dtype, rng)?,
                right_decoder: TransformerDecoder::new(vocab, d, c.r_num_blocks, c, dtype, rng)?,
            },
        })
    }

    /// Left-to-right logits, and right-to-left logits for `r_ys_in` when
    /// given and this is a bidirectional decoder; f32 under autocast.
    pub fn forward(
        &self,
        memory: &Tensor,
        mem_lens: &[usize],
        ys_in: &Tensor,
        ys_lens: &[usize],
        r_ys_in: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (l, r) = self.forward_raw(memory, mem_lens, ys_in, ys_lens, r_ys_in)?;
        Ok((ops::widen_half(&l)?, r.map(|r| ops::widen_half(&r)).transpose()?))
    }

    /// [`Decoder::forward`] with the logits in the output layer's dtype
    /// ([`TransformerDecoder::forward_raw`]).
    pub fn forward_raw(
        &self,
        memory: &Tensor,
        mem_lens: &[usize],
        ys_in: &Tensor,
        ys_lens: &[usize],
        r_ys_in: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        match self {
            Decoder::Transformer(d) => Ok((d.forward_raw(memory, mem_lens, ys_in, ys_lens)?, None)),
            Decoder::Bi { left_decoder, right_decoder } => {
                let l = left_decoder.forward_raw(memory, mem_lens, ys_in, ys_lens)?;
                let r = match r_ys_in {
                    Some(r) => Some(right_decoder.forward_raw(memory, mem_lens, r, ys_lens)?),
                    None => None,
                };
                Ok((l, r))
            }
        }
    }

    /// The left-to-right decoder.
    pub fn left(&self) -> &TransformerDecoder {
        match self {
            Decoder::Transformer(d) => d,
            Decoder::Bi { left_decoder, .. } => left_decoder,
        }
    }

    /// The right-to-left decoder, when this is a bidirectional decoder.
    pub fn right(&self) -> Option<&TransformerDecoder> {
        match self {
            Decoder::Transformer(_) => None,
            Decoder::Bi { right_decoder, .. } => Some(right_decoder),
        }
    }

    /// Whether a right-to-left decoder exists.
    pub fn is_bidirectional(&self) -> bool {
        matches!(self, Decoder::Bi { .. })
    }
}

impl Module for Decoder {
    fn describe(&self) -> String {
        match self {
            Decoder::Transformer(_) => "TransformerDecoder".into(),
            Decoder::Bi { .. } => "BiTransformerDecoder".into(),
        }
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, crate::nn::TensorKind)> {
        match self {
            Decoder::Transformer(d) => d.own_tensors(),
            Decoder::Bi { .. } => vec![],
        }
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        match self {
            Decoder::Transformer(d) => d.children(),
            Decoder::Bi { left_decoder, right_decoder } => vec![("left_decoder".into(), left_decoder as &dyn Module), ("right_decoder".into(), right_decoder)],
        }
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        match self {
            Decoder::Transformer(d) => vec![d as &mut dyn Module],
            Decoder::Bi { left_decoder, right_decoder } => vec![left_decoder as &mut dyn Module, right_decoder],
        }
    }
}
