//! The Conformer and Transformer encoders: optional global CMVN → input
//! layer (subsampling + positional encoding) → blocks → `after_norm`.
//! With `gradient_checkpointing` each block runs under the tape's
//! checkpoint: its activations are recomputed in backward instead of kept.
//! Self-attention takes WeNet's optional chunk mask ([`super::mask`]); the
//! convolution module sees only the padding mask, as in WeNet.

use super::cmvn::GlobalCmvn;
use super::config::{EncoderConfig, EncoderType};
use super::encoder_layer::EncoderLayer;
use super::mask::{add_optional_chunk_mask, Chunk, ChunkConfig, ChunkRequest};
use super::residual;
use super::subsampling::Subsampling;
use crate::autograd;
use crate::error::{Error, Result};
use crate::nn::{LayerNorm, Module};
use crate::tensor::{DType, Device, Rng, Tensor};

/// An encoder and its settings.
#[derive(Clone, Debug)]
pub struct Encoder {
    /// Feature normalisation, if configured.
    pub global_cmvn: Option<GlobalCmvn>,
    /// The input layer.
    pub embed: Subsampling,
    /// Final LayerNorm.
    pub after_norm: LayerNorm,
    /// The blocks.
    pub encoders: Vec<EncoderLayer>,
    /// Which encoder.
    pub kind: EncoderType,
    /// Pre-norm (true) or post-norm blocks.
    pub normalize_before: bool,
    /// Whether `after_norm` is applied (with pre-norm).
    pub final_norm: bool,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// Training or eval mode.
    pub training: bool,
    /// The chunk (U2) settings.
    pub chunk: ChunkConfig,
}

/// u8 (B, 1, T): 1 at frames at or beyond each length.
pub fn frame_pad_mask(lens: &[usize], t: usize) -> Result<Tensor> {
    let m: Vec<u8> = lens.iter().flat_map(|&l| (0..t).map(move |j| u8::from(j >= l))).collect();
    Tensor::from_vec(m, [lens.len(), 1, t], &Device::Cpu)
}

impl Encoder {
    /// Builds an encoder of `kind` over `input_dim` features.
    pub fn new(kind: EncoderType, c: &EncoderConfig, input_dim: usize, cmvn: Option<GlobalCmvn>, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let d = c.output_size;
        let embed = Subsampling::new(c.input_layer, input_dim, d, c.dropout_rate, (c.pos_enc_layer_type, c.positional_dropout_rate), dtype, rng)?;
        let after_norm = LayerNorm::new(d, c.norm_eps, dtype)?;
        let conformer = kind == EncoderType::Conformer;
        let mut encoders = Vec::with_capacity(c.num_blocks);
        for _ in 0..c.num_blocks {
            encoders.push(EncoderLayer::new(c, conformer, dtype, rng)?);
        }
        let max_chunk_size = 100 / embed.rate().max(1);
        Ok(Encoder {
            global_cmvn: cmvn,
            embed,
            after_norm,
            encoders,
            kind,
            normalize_before: c.normalize_before,
            final_norm: c.final_norm,
            gradient_checkpointing: c.gradient_checkpointing,
            training: true,
            chunk: ChunkConfig {
                use_dynamic_chunk: c.use_dynamic_chunk,
                use_dynamic_left_chunk: c.use_dynamic_left_chunk,
                static_chunk_size: c.static_chunk_size,
                max_chunk_size,
            },
        })
    }

    /// The model dim.
    pub fn output_size(&self) -> usize {
        self.after_norm.weight.dims()[0]
    }

    /// feats (B, T, F) with lengths → (encoder output (B, T', D), output
    /// lengths), with training's chunk choice (drawn when dynamic).
    pub fn forward(&self, feats: &Tensor, lens: &[usize]) -> Result<(Tensor, Vec<usize>)> {
        self.forward_with(feats, lens, ChunkRequest::TRAIN).map(|(x, l, _)| (x, l))
    }

    /// As [`Encoder::forward`] with WeNet's `decoding_chunk_size` and
    /// `num_decoding_left_chunks`; also returns the chunk the mask used.
    pub fn forward_with(&self, feats: &Tensor, lens: &[usize], req: ChunkRequest) -> Result<(Tensor, Vec<usize>, Option<Chunk>)> {
        if feats.rank() != 3 || feats.dims()[0] != lens.len() {
            return Err(Error::ShapeMismatch {
                op: "Encoder",
                expected: format!("feats (B, T, F) for {} lengths", lens.len()),
                got: format!("{}", feats.shape()),
            });
        }
        if let Some(&l) = lens.iter().find(|&&l| l > feats.dims()[1]) {
            return Err(Error::invalid("Encoder", format!("a length of {l} exceeds the {} frames of the batch", feats.dims()[1])));
        }
        let x = match &self.global_cmvn {
            Some(c) => c.forward(feats)?,
            None => feats.clone(),
        };
        let (x, pos, out_lens) = self.embed.forward(&x, lens)?;
        let t = x.dims()[1];
        let (chunk, mask) = add_optional_chunk_mask(&self.chunk, req, &out_lens, t)?;
        // On the activations' device once: every layer's convolution module
        // reads it there (its masks forward and backward copy nothing).
        let pad = frame_pad_mask(&out_lens, t)?.to_device(&x.device())?;
        let checkpointing = self.gradient_checkpointing && self.training && autograd::is_grad_enabled();
        let final_norm = (self.normalize_before && self.final_norm).then_some(&self.after_norm);
        let x = residual::run_stack(x, &self.encoders, EncoderLayer::first_norm, final_norm, |layer, x, h, next| {
            if checkpointing {
                let (l, m, p, nn) = (layer.clone(), mask.clone(), pad.clone(), next.cloned());
                residual::checkpointed_block(x, &pos, h, move |x, h, pos| l.forward_into(x, h, Some(&m), pos, Some(&p), nn.as_ref()))
            } else {
                layer.forward_into(&x, h.as_ref(), Some(&mask), &pos, Some(&pad), next)
            }
        })?;
        Ok((x, out_lens, chunk))
    }
}

impl Module for Encoder {
    fn describe(&self) -> String {
        match self.kind {
            EncoderType::Conformer => "ConformerEncoder".into(),
            EncoderType::Transformer => "TransformerEncoder".into(),
        }
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut v: Vec<(String, &dyn Module)> = Vec::new();
        if let Some(c) = &self.global_cmvn {
            v.push(("global_cmvn".into(), c));
        }
        v.push(("embed".into(), &self.embed));
        v.push(("after_norm".into(), &self.after_norm));
        for (i, l) in self.encoders.iter().enumerate() {
            v.push((format!("encoders.{i}"), l));
        }
        v
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        let mut v: Vec<&mut dyn Module> = vec![&mut self.embed];
        v.extend(self.encoders.iter_mut().map(|l| l as &mut dyn Module));
        v
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}
