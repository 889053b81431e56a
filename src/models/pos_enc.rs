//! Sinusoidal positional encodings. `pe[p, 2i] = sin(p·10000^(−2i/d))`,
//! `pe[p, 2i+1] = cos(…)`, a persistent buffer [1, max_len, d] (WeNet's
//! `pos_enc.pe`). Absolute: `x·√d + pe[:T]`. Relative (WeNet's
//! RelPositionalEncoding): `x·√d`, and the rows `pe[0..T]` are handed to
//! relative attention. Both outputs get dropout. `no_pos` leaves x as is.
//! With the `posenc` fusion on, the output's scale, rows, cast and dropout
//! are one `ops::pos_enc_dropout` (one launch each way on a GPU), and the
//! relative rows' narrow, dropout and cast one `ops::pos_rows_dropout`.

use super::config::PosEncType;
use crate::error::{Error, Result};
use crate::nn::{Dropout, Module, TensorKind};
use crate::ops::{self, fusion, fusion::Fusion};
use crate::tensor::{DType, Device, Tensor};

/// WeNet's default table length.
pub const MAX_LEN: usize = 5000;

/// A positional encoding layer.
#[derive(Clone, Debug)]
pub struct PositionalEncoding {
    /// The table [1, max_len, d] (absent for `no_pos`).
    pub pe: Option<Tensor>,
    /// Which encoding.
    pub kind: PosEncType,
    /// Model dim.
    pub d: usize,
    /// Dropout on the outputs.
    pub dropout: Dropout,
}

/// The sinusoid table [1, max_len, d].
pub fn sinusoid_table(max_len: usize, d: usize, dtype: DType) -> Result<Tensor> {
    let mut v = crate::backend::cpu::try_filled("positional table", 0.0f64, max_len.saturating_mul(d))?;
    for p in 0..max_len {
        for i in (0..d).step_by(2) {
            let a = p as f64 * (-(i as f64) * (10000f64).ln() / d as f64).exp();
            v[p * d + i] = a.sin();
            if i + 1 < d {
                v[p * d + i + 1] = a.cos();
            }
        }
    }
    ops::to_dtype(&Tensor::from_vec(v, [1, max_len, d], &Device::Cpu)?, dtype)
}

impl PositionalEncoding {
    /// A layer of `kind` over `d` features.
    pub fn new(kind: PosEncType, d: usize, dropout: f64, dtype: DType) -> Result<Self> {
        let pe = match kind {
            PosEncType::None => None,
            _ => Some(sinusoid_table(MAX_LEN, d, dtype)?),
        };
        Ok(PositionalEncoding { pe, kind, d, dropout: Dropout::new(dropout) })
    }

    /// Rows 0..t of the table, (1, t, d).
    pub fn rows(&self, t: usize, like: &Tensor) -> Result<Tensor> {
        self.rows_at(0, t, like)
    }

    /// Rows offset..offset+t of the table, (1, t, d) (WeNet's `position_encoding`).
    pub fn rows_at(&self, offset: usize, t: usize, like: &Tensor) -> Result<Tensor> {
        match &self.pe {
            None => Tensor::zeros([1, t, self.d], like.dtype(), &like.device()),
            Some(pe) => {
                self.check_rows(pe, offset, t)?;
                ops::narrow(pe, 1, offset, t)
            }
        }
    }

    fn check_rows(&self, pe: &Tensor, offset: usize, t: usize) -> Result<()> {
        let max = pe.dims()[1];
        if offset + t > max {
            return Err(Error::invalid("PositionalEncoding", format!("frames up to {} exceed the positional table of {max}", offset + t)));
        }
        Ok(())
    }

    /// Encodes x (B, T, D): returns the layer output and the positional rows (1, T, D).
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        self.forward_at(x, 0)
    }

    /// Encodes x (B, T, D) whose first frame is frame `offset` of a stream.
    pub fn forward_at(&self, x: &Tensor, offset: usize) -> Result<(Tensor, Tensor)> {
        let t = Self::frames(x)?;
        // The rows' dropout draws before the output's, as WeNet's forward.
        let pos = match (&self.pe, self.kind) {
            (Some(pe), PosEncType::Rel) if fusion::enabled(Fusion::PosEnc) => {
                self.check_rows(pe, offset, t)?;
                // Under autocast on a GPU the rows come in the half type the
                // first attention layer's projection would cast them to.
                ops::pos_rows_dropout(pe, offset, t, autocast_out(pe), self.dropout.p, self.dropout.training)?
            }
            (_, PosEncType::Rel) => self.dropout.forward(&self.rows_at(offset, t, x)?)?,
            _ => self.rows_at(offset, t, x)?,
        };
        let rows = (self.kind == PosEncType::Abs).then_some(&pos);
        Ok((self.encode(x, offset, rows)?, pos))
    }

    /// The layer output alone for x (B, T, D) whose first frame is frame
    /// `offset`, where the positional rows are not needed (the decoder's
    /// embedding). With the `posenc` fusion on, one `ops::pos_enc_dropout`
    /// (one launch each way on a GPU) replaces the composition below.
    pub fn encode_at(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        self.encode(x, offset, None)
    }

    /// [`Self::encode_at`] with the rows offset..offset+T when the caller
    /// has them (the composition adds them instead of narrowing again).
    fn encode(&self, x: &Tensor, offset: usize, rows: Option<&Tensor>) -> Result<Tensor> {
        let t = Self::frames(x)?;
        let scale = (self.d as f64).sqrt();
        // Under autocast an f32 input (the decoder's token embedding)
        // becomes the half type here, once, so the residual stream it
        // starts is half like the encoder's (whose convolutions give
        // half outputs). A deviation from PyTorch, where this sum stays
        // f32 and every later residual add promotes to f32: here the
        // stream is rounded to half once, and the layers' casts of
        // their f32 input to half (~100 launches a step) disappear.
        // On the CPU half activations are computed widened to f32
        // (its elementwise ops have no half kernels): the stream stays f32.
        let out = if self.kind == PosEncType::Abs { autocast_out(x) } else { x.dtype() };
        if self.kind != PosEncType::None && fusion::enabled(Fusion::PosEnc) {
            let table = match (&self.pe, self.kind) {
                (Some(pe), PosEncType::Abs) => {
                    self.check_rows(pe, offset, t)?;
                    Some((pe, offset))
                }
                _ => None,
            };
            return ops::pos_enc_dropout(x, scale, table, out, self.dropout.p, self.dropout.training);
        }
        let y = match self.kind {
            PosEncType::Abs => {
                let y = match rows {
                    Some(r) => ops::add(&ops::mul_scalar(x, scale)?, r)?,
                    None => ops::add(&ops::mul_scalar(x, scale)?, &self.rows_at(offset, t, x)?)?,
                };
                if y.dtype() == out {
                    y
                } else {
                    ops::to_dtype(&y, out)?
                }
            }
            PosEncType::Rel => ops::mul_scalar(x, scale)?,
            PosEncType::None => x.clone(),
        };
        self.dropout.forward(&y)
    }

    fn frames(x: &Tensor) -> Result<usize> {
        if x.rank() != 3 {
            return Err(Error::ShapeMismatch { op: "PositionalEncoding", expected: "an input (B, T, D)".into(), got: format!("{}", x.shape()) });
        }
        Ok(x.dims()[1])
    }
}

/// The type an f32 tensor on a GPU takes under autocast (the half type),
/// else its own.
fn autocast_out(t: &Tensor) -> DType {
    match ops::autocast_dtype() {
        Some(h) if t.dtype() == DType::F32 && t.device() != Device::Cpu => h,
        _ => t.dtype(),
    }
}

impl Module for PositionalEncoding {
    fn describe(&self) -> String {
        let name = match self.kind {
            PosEncType::Abs => "PositionalEncoding",
            PosEncType::Rel => "RelPositionalEncoding",
            PosEncType::None => "NoPositionalEncoding",
        };
        format!("{name}(d={}, dropout={})", self.d, self.dropout.p)
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        self.pe.iter().map(|t| ("pe", t.clone(), TensorKind::Constant)).collect()
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("dropout".into(), &self.dropout)]
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        vec![&mut self.dropout]
    }
}
