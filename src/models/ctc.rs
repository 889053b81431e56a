//! The CTC head: `ctc_lo` (Linear d → vocab) → log_softmax → CTC loss,
//! summed over the batch and divided by the batch size, with infinite
//! losses (impossible alignments) zeroed and counted, as WeNet's CTC module
//! (`zero_infinity=True`).

use crate::backend::cpu::ctc::{count_infeasible, CtcDims};
use crate::error::Result;
use crate::nn::{Linear, Module};
use crate::ops::{self, Reduction};
use crate::tensor::{DType, Rng, Tensor};

/// The CTC projection and loss.
#[derive(Clone, Debug)]
pub struct Ctc {
    /// The projection to the vocabulary.
    pub ctc_lo: Linear,
    /// The blank id.
    pub blank: usize,
}

impl Ctc {
    /// A head from dim `d` to `vocab` symbols.
    pub fn new(vocab: usize, d: usize, blank: usize, dtype: DType, rng: &mut Rng) -> Result<Self> {
        Ok(Ctc { ctc_lo: Linear::new(d, vocab, true, dtype, rng)?, blank })
    }

    /// Log-probabilities (B, T, V) of the encoder output.
    pub fn log_probs(&self, enc_out: &Tensor) -> Result<Tensor> {
        ops::log_softmax(&ops::widen_half(&self.ctc_lo.forward(enc_out)?)?)
    }

    /// Log-probabilities (B, T, V) with `blank_penalty` subtracted from the
    /// blank logit before the log-softmax (WeNet's `ctc_logprobs`; a penalty
    /// of 0 or less leaves the plain log-softmax).
    pub fn log_probs_with_blank_penalty(&self, enc_out: &Tensor, blank_penalty: f64) -> Result<Tensor> {
        if blank_penalty <= 0.0 {
            return self.log_probs(enc_out);
        }
        let logits = ops::widen_half(&self.ctc_lo.forward(enc_out)?)?;
        let v = logits.dims()[logits.rank() - 1];
        let mut shift = vec![0.0f64; v];
        if let Some(s) = shift.get_mut(self.blank) {
            *s = -blank_penalty;
        }
        let shift = ops::to_dtype(&Tensor::from_vec(shift, [v], &logits.device())?, logits.dtype())?;
        ops::log_softmax(&ops::add(&logits, &shift)?)
    }

    /// The loss (a 0-dim tensor): Σ_b CTC_b / B.
    pub fn loss(&self, enc_out: &Tensor, enc_lens: &[usize], target: &Tensor, target_lens: &[usize]) -> Result<Tensor> {
        Ok(self.loss_counted(enc_out, enc_lens, target, target_lens)?.0)
    }

    /// The loss and how many sequences had no alignment (their loss and
    /// gradient zeroed, as WeNet's `zero_infinity=True`): the rest of the
    /// batch trains.
    pub fn loss_counted(&self, enc_out: &Tensor, enc_lens: &[usize], target: &Tensor, target_lens: &[usize]) -> Result<(Tensor, usize)> {
        // Fused (the fusion switch's `loss` family): the log-softmax inside
        // the CTC kernels, half logits read as they are (no f32 copy).
        let fused = ops::fusion::enabled(ops::fusion::Fusion::Loss);
        let lp = if fused { self.ctc_lo.forward(enc_out)? } else { self.log_probs(enc_out)? };
        let b = enc_out.dims()[0].max(1);
        let ctc = if fused { ops::ctc_loss_fused } else { ops::ctc_loss };
        let sum = ctc(&lp, target, enc_lens, target_lens, self.blank, Reduction::Sum, true)?;
        let infeasible = if target.rank() == 2 && target.dtype() == DType::I64 {
            let d = CtcDims { b: target.dims()[0], t: lp.dims()[1], v: lp.dims()[2], s: target.dims()[1], blank: self.blank };
            count_infeasible(&d, &target.to_vec::<i64>()?, enc_lens, target_lens)
        } else {
            0
        };
        Ok((ops::mul_scalar(&sum, 1.0 / b as f64)?, infeasible))
    }
}

impl Module for Ctc {
    fn describe(&self) -> String {
        format!("CTC(blank={})", self.blank)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("ctc_lo".into(), &self.ctc_lo)]
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        vec![&mut self.ctc_lo]
    }
}
