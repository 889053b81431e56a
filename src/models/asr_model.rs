//! The hybrid CTC/attention model: encoder → CTC head and attention
//! decoder. `loss = ctc_weight·loss_ctc + (1 − ctc_weight)·loss_att`; with
//! ctc_weight 0 or 1 the unused branch is not run. The decoder is fed
//! `<sos> y` and trained to emit `y <eos>` (WeNet's `add_sos_eos`), with
//! label smoothing; a bidirectional decoder adds the reversed targets with
//! `reverse_weight`.

use super::cmvn::GlobalCmvn;
use super::config::ModelConfig;
use super::ctc::Ctc;
use super::decoder::Decoder;
use super::encoder::Encoder;
use super::mask::ChunkRequest;
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::ops;
use crate::tensor::{DType, Device, Rng, Tensor};

/// The losses of one forward pass (WeNet's loss dict).
#[derive(Clone, Debug)]
pub struct LossDict {
    /// The weighted total (0-dim).
    pub loss: Tensor,
    /// The attention decoder's loss, when run.
    pub loss_att: Option<Tensor>,
    /// The CTC loss, when run.
    pub loss_ctc: Option<Tensor>,
    /// Token accuracy of the left-to-right decoder on non-ignored targets.
    pub th_accuracy: Option<Tensor>,
    /// Sequences whose CTC target has no alignment to their encoder frames
    /// (loss and gradient zeroed; the rest of the batch trains).
    pub ctc_infeasible: usize,
}

/// Encoder, decoder and CTC head with the loss settings.
#[derive(Clone, Debug)]
pub struct AsrModel {
    /// The encoder.
    pub encoder: Encoder,
    /// The decoder.
    pub decoder: Decoder,
    /// The CTC head.
    pub ctc: Ctc,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Start-of-sentence id.
    pub sos: usize,
    /// End-of-sentence id.
    pub eos: usize,
    /// Target padding id (−1).
    pub ignore_id: i64,
    /// Weight of the CTC loss (the attention loss gets 1 − ctc_weight).
    pub ctc_weight: f64,
    /// Weight of the right-to-left decoder loss.
    pub reverse_weight: f64,
    /// Label smoothing of the attention loss.
    pub lsm_weight: f64,
    /// Divide the attention loss by the token count instead of the batch size.
    pub length_normalized_loss: bool,
}

/// Padded decoder inputs and outputs built from token sequences.
pub struct SosEos {
    /// `<sos> y`, padded with `<eos>` (B, L+1).
    pub ys_in: Tensor,
    /// `y <eos>`, padded with the ignore id (B, L+1).
    pub ys_out: Tensor,
    /// Lengths of `ys_in` (len + 1).
    pub lens: Vec<usize>,
}

/// WeNet's `add_sos_eos` over plain token sequences.
pub fn add_sos_eos(seqs: &[Vec<i64>], sos: i64, eos: i64, ignore_id: i64) -> Result<SosEos> {
    let l = seqs.iter().map(Vec::len).max().unwrap_or(0) + 1;
    let (mut yi, mut yo) = (Vec::with_capacity(seqs.len() * l), Vec::with_capacity(seqs.len() * l));
    for s in seqs {
        yi.push(sos);
        yi.extend_from_slice(s);
        yi.extend(std::iter::repeat_n(eos, l - 1 - s.len()));
        yo.extend_from_slice(s);
        yo.push(eos);
        yo.extend(std::iter::repeat_n(ignore_id, l - 1 - s.len()));
    }
    let cpu = Device::Cpu;
    Ok(SosEos {
        ys_in: Tensor::from_vec(yi, [seqs.len(), l], &cpu)?,
        ys_out: Tensor::from_vec(yo, [seqs.len(), l], &cpu)?,
        lens: seqs.iter().map(|s| s.len() + 1).collect(),
    })
}

impl LossDict {
    /// The loss, and loss_ctc, loss_att and th_accuracy where present, on
    /// their way to the host together: on a GPU their copy is queued
    /// ([`Tensor::scalars_to_host_later`]: one wait at most, not one per
    /// value) and [`LossValues::get`] waits only if it has not run by then.
    pub fn values_later(&self) -> Result<LossValues> {
        let opts = [&self.loss_ctc, &self.loss_att, &self.th_accuracy];
        let mut ts = vec![&self.loss];
        ts.extend(opts.iter().filter_map(|t| t.as_ref()));
        Ok(LossValues { scalars: Tensor::scalars_to_host_later(&ts)?, present: opts.map(|t| t.is_some()) })
    }
}

/// A [`LossDict`]'s values on their way to the host ([`LossDict::values_later`]).
pub struct LossValues {
    scalars: crate::tensor::HostScalars,
    /// Whether loss_ctc, loss_att and th_accuracy were there.
    present: [bool; 3],
}

impl LossValues {
    /// The loss, and loss_ctc, loss_att and th_accuracy where present.
    pub fn get(self) -> Result<(f64, [Option<f64>; 3])> {
        let mut vals = self.scalars.values()?.into_iter();
        let loss = vals.next().ok_or_else(|| Error::invalid("LossDict", "no loss value was read"))?;
        let parts = self.present.map(|p| if p { vals.next() } else { None });
        Ok((loss, parts))
    }
}

/// The first `lens[b]` tokens of each row of a padded (B, L) i64 target.
pub fn unpad_targets(target: &Tensor, lens: &[usize]) -> Result<Vec<Vec<i64>>> {
    if target.rank() != 2 || target.dims()[0] != lens.len() || target.dtype() != DType::I64 {
        return Err(Error::ShapeMismatch {
            op: "AsrModel",
            expected: format!("an i64 target (B, L) for {} lengths", lens.len()),
            got: format!("{} {:?}", target.shape(), target.dtype()),
        });
    }
    let l = target.dims()[1];
    let v = target.to_vec::<i64>()?;
    lens.iter()
        .enumerate()
        .map(|(b, &n)| {
            if n > l {
                return Err(Error::invalid("AsrModel", format!("target length {n} of sequence {b} exceeds the padded width {l}")));
            }
            Ok(v[b * l..b * l + n].to_vec())
        })
        .collect()
}

impl AsrModel {
    /// Builds the model, reading the CMVN statistics file the config names.
    pub fn new(cfg: &ModelConfig, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let cmvn = match &cfg.cmvn {
            None => None,
            Some(c) if c.is_json_cmvn => Some(GlobalCmvn::from_json_file(&c.cmvn_file, dtype)?),
            Some(_) => return Err(Error::config("cmvn_conf.is_json_cmvn", "only JSON CMVN statistics are supported, found false")),
        };
        Self::with_cmvn(cfg, cmvn, dtype, rng)
    }

    /// Builds the model with identity CMVN buffers of the right shape (for
    /// shape-only tools, or when a checkpoint will provide the statistics).
    pub fn without_cmvn_stats(cfg: &ModelConfig, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let cmvn = match &cfg.cmvn {
            None => None,
            Some(_) => Some(GlobalCmvn::identity(cfg.input_dim, dtype)?),
        };
        Self::with_cmvn(cfg, cmvn, dtype, rng)
    }

    /// Builds the model with the given CMVN layer.
    pub fn with_cmvn(cfg: &ModelConfig, cmvn: Option<GlobalCmvn>, dtype: DType, rng: &mut Rng) -> Result<Self> {
        if let Some(c) = &cmvn {
            if c.mean.elem_count() != cfg.input_dim {
                return Err(Error::config(
                    "cmvn_conf.cmvn_file",
                    format!("statistics for {} features, but input_dim is {}", c.mean.elem_count(), cfg.input_dim),
                ));
            }
        }
        // Before any tensor is allocated: an absurd config is a clear error, not an allocation abort.
        super::limits::check_model_size(cfg, super::limits::max_model_bytes()?)?;
        let encoder = Encoder::new(cfg.encoder, &cfg.encoder_conf, cfg.input_dim, cmvn, dtype, rng)?;
        let d = encoder.output_size();
        let decoder = Decoder::new(cfg.decoder, cfg.output_dim, d, &cfg.decoder_conf, dtype, rng)?;
        let ctc = Ctc::new(cfg.output_dim, d, cfg.ctc_blank_id, dtype, rng)?;
        let m = &cfg.model_conf;
        Ok(AsrModel {
            encoder,
            decoder,
            ctc,
            vocab_size: cfg.output_dim,
            sos: cfg.sos,
            eos: cfg.eos,
            ignore_id: m.ignore_id,
            ctc_weight: m.ctc_weight,
            reverse_weight: m.reverse_weight,
            lsm_weight: m.lsm_weight,
            length_normalized_loss: m.length_normalized_loss,
        })
    }

    /// Whether the decoder recomputes its layers in backward.
    pub fn decoder_gradient_checkpointing(&self) -> bool {
        match &self.decoder {
            Decoder::Transformer(d) => d.gradient_checkpointing,
            Decoder::Bi { left_decoder, .. } => left_decoder.gradient_checkpointing,
        }
    }

    /// Encoder output (B, T', D) and its lengths.
    pub fn encode(&self, feats: &Tensor, feats_lengths: &[usize]) -> Result<(Tensor, Vec<usize>)> {
        self.encoder.forward(feats, feats_lengths)
    }

    /// Encoder output and lengths for decoding with WeNet's
    /// `decoding_chunk_size` / `num_decoding_left_chunks`: the whole batch
    /// under the chunk mask, or, with `simulate_streaming` and a chunk size
    /// > 0, each utterance chunk by chunk with its caches (the rows padded
    /// with zeros to the longest).
    pub fn encode_with(&self, feats: &Tensor, feats_lengths: &[usize], req: ChunkRequest, simulate_streaming: bool) -> Result<(Tensor, Vec<usize>)> {
        if !(simulate_streaming && req.decoding_chunk_size > 0) {
            return self.encoder.forward_with(feats, feats_lengths, req).map(|(x, l, _)| (x, l));
        }
        if feats.rank() != 3 || feats.dims()[0] != feats_lengths.len() {
            return Err(Error::ShapeMismatch {
                op: "AsrModel::encode_with",
                expected: format!("feats (B, T, F) for {} lengths", feats_lengths.len()),
                got: format!("{}", feats.shape()),
            });
        }
        let mut outs = Vec::with_capacity(feats_lengths.len());
        for (b, &len) in feats_lengths.iter().enumerate() {
            let x = ops::narrow(&ops::narrow(feats, 0, b, 1)?, 1, 0, len)?;
            outs.push(self.encoder.forward_chunk_by_chunk(&x, req.decoding_chunk_size as usize, req.num_decoding_left_chunks)?);
        }
        let lens: Vec<usize> = outs.iter().map(|o| o.dims()[1]).collect();
        let t = lens.iter().copied().max().unwrap_or(0);
        let padded = outs.iter().map(|o| if o.dims()[1] < t { ops::pad(o, 1, 0, t - o.dims()[1], 0.0) } else { Ok(o.clone()) }).collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = padded.iter().collect();
        Ok((ops::cat(&refs, 0)?, lens))
    }

    /// CTC log-probabilities (B, T', V) of an encoder output.
    pub fn ctc_log_probs(&self, enc_out: &Tensor) -> Result<Tensor> {
        self.ctc.log_probs(enc_out)
    }

    /// CTC log-probabilities with WeNet's blank penalty (see [`Ctc::log_probs_with_blank_penalty`]).
    pub fn ctc_log_probs_with_blank_penalty(&self, enc_out: &Tensor, blank_penalty: f64) -> Result<Tensor> {
        self.ctc.log_probs_with_blank_penalty(enc_out, blank_penalty)
    }

    /// Decoder logits for hypotheses (one per row of `enc_out`): `<sos> hyp`
    /// through the left-to-right decoder, and the reversed hypotheses through
    /// the right-to-left one when it exists (attention rescoring).
    pub fn decoder_logits(&self, enc_out: &Tensor, enc_lens: &[usize], hyps: &[Vec<i64>]) -> Result<(Tensor, Option<Tensor>)> {
        let (sos, eos) = (self.sos as i64, self.eos as i64);
        let fwd = add_sos_eos(hyps, sos, eos, self.ignore_id)?;
        let rev = if self.decoder.is_bidirectional() {
            let r: Vec<Vec<i64>> = hyps.iter().map(|h| h.iter().rev().copied().collect()).collect();
            Some(add_sos_eos(&r, sos, eos, self.ignore_id)?)
        } else {
            None
        };
        self.decoder.forward(enc_out, enc_lens, &fwd.ys_in, &fwd.lens, rev.as_ref().map(|r| &r.ys_in))
    }

    /// Features → losses. `feats` (B, T, F), `target` (B, L) i64 padded with −1.
    pub fn forward(&self, feats: &Tensor, feats_lengths: &[usize], target: &Tensor, target_lengths: &[usize]) -> Result<LossDict> {
        if feats_lengths.len() != target_lengths.len() {
            return Err(Error::ShapeMismatch {
                op: "AsrModel",
                expected: format!("{} target lengths", feats_lengths.len()),
                got: format!("{}", target_lengths.len()),
            });
        }
        let (enc, enc_lens) = self.encode(feats, feats_lengths)?;
        let (loss_ctc, ctc_infeasible) = if self.ctc_weight != 0.0 {
            let (l, n) = self.ctc.loss_counted(&enc, &enc_lens, target, target_lengths)?;
            (Some(l), n)
        } else {
            (None, 0)
        };
        let (loss_att, acc) = if self.ctc_weight != 1.0 {
            let (l, a) = self.att_loss(&enc, &enc_lens, target, target_lengths)?;
            (Some(l), Some(a))
        } else {
            (None, None)
        };
        let loss = match (&loss_ctc, &loss_att) {
            (Some(c), Some(a)) => ops::add_scaled(&ops::mul_scalar(c, self.ctc_weight)?, a, 1.0 - self.ctc_weight)?,
            (Some(c), None) => c.clone(),
            (None, Some(a)) => a.clone(),
            (None, None) => return Err(Error::invalid("AsrModel", "neither the CTC nor the attention branch ran")),
        };
        Ok(LossDict { loss, loss_att, loss_ctc, th_accuracy: acc, ctc_infeasible })
    }

    fn att_loss(&self, enc: &Tensor, enc_lens: &[usize], target: &Tensor, target_lengths: &[usize]) -> Result<(Tensor, Tensor)> {
        let seqs = unpad_targets(target, target_lengths)?;
        let (sos, eos) = (self.sos as i64, self.eos as i64);
        let fwd = add_sos_eos(&seqs, sos, eos, self.ignore_id)?;
        let rev = if self.reverse_weight > 0.0 && self.decoder.is_bidirectional() {
            let r: Vec<Vec<i64>> = seqs.iter().map(|s| s.iter().rev().copied().collect()).collect();
            Some(add_sos_eos(&r, sos, eos, self.ignore_id)?)
        } else {
            None
        };
        // The fused loss reads half logits as they are (no f32 copy of B·L·V,
        // no cast either way); the reference reads the f32 logits.
        let (out, r_out) = if ops::fusion::enabled(ops::fusion::Fusion::Loss) {
            self.decoder.forward_raw(enc, enc_lens, &fwd.ys_in, &fwd.lens, rev.as_ref().map(|r| &r.ys_in))?
        } else {
            self.decoder.forward(enc, enc_lens, &fwd.ys_in, &fwd.lens, rev.as_ref().map(|r| &r.ys_in))?
        };
        let crit = |x: &Tensor, y: &Tensor| ops::label_smoothing_loss(x, y, self.lsm_weight, self.ignore_id, self.length_normalized_loss);
        let mut loss = crit(&out, &fwd.ys_out)?;
        if let (Some(r_out), Some(rev)) = (r_out, &rev) {
            let r_loss = crit(&r_out, &rev.ys_out)?;
            loss = ops::add_scaled(&ops::mul_scalar(&loss, 1.0 - self.reverse_weight)?, &r_loss, self.reverse_weight)?;
        }
        let acc = ops::token_accuracy(&out, &fwd.ys_out, self.ignore_id)?;
        Ok((loss, acc))
    }
}

impl Module for AsrModel {
    fn describe(&self) -> String {
        "ASRModel".into()
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("encoder".into(), &self.encoder as &dyn Module), ("decoder".into(), &self.decoder), ("ctc".into(), &self.ctc)]
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        vec![&mut self.encoder, &mut self.decoder, &mut self.ctc]
    }
}
