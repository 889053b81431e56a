//! Scaled dot-product multi-head attention, and its relative-position
//! variant (Transformer-XL style, as WeNet implements it).
//!
//! Layout: x (B, T, D) → heads (B, H, T, d_k) with D = H·d_k.
//! scores = q·kᵀ/√d_k (B, H, T1, T2), the scale inside the GEMM; the
//! softmax over the unmasked keys (accumulated in f32, or f64) gives masked
//! keys exactly 0 (a fully masked row yields zeros, never NaN), dropout, and
//! the weighted values are merged back to (B, T1, D) for `linear_out`.
//!
//! With the attention fusion on (`ops::fusion`), `forward` of both kinds
//! (encoder self-attention, the decoder's causal self-attention and its
//! cross attention) runs `ops::flash_attention` on the (B, T, H, d_k)
//! projections instead: one kernel each way, no T1×T2 scores stored. The
//! cached and streaming paths (`forward_kv`, `forward_cached`) keep the
//! composition.
//!
//! With the `qkv` fusion on as well, self-attention projects q, k and v in
//! one GEMM against the packed weights (B, T, 3·D) and cross-attention k
//! and v in one (B, T2, 2·D), which the kernels read in place
//! (`ops::flash_attention_qkv`, `ops::flash_attention_q_kv`); the packed
//! weights are the layer's own (`linear_q/k/v` keep their names and
//! checkpoints), concatenated per step by the weight conversion of the
//! trainer's region, one launch for every layer
//! ([`MultiHeadedAttention::packs`]), else by one launch per layer.

use super::dropout::Dropout;
use super::init::{uniform_param, xavier_uniform_bound};
use super::linear::Linear;
use super::module::{Module, TensorKind};
use crate::error::{Error, Result};
use crate::ops::{self, fusion, fusion::Fusion};
use crate::tensor::{DType, Device, Rng, Tensor};
use std::sync::{Arc, OnceLock};

/// Which keys a query must not attend to: u8 (B, 1, T1 or 1, T2), 1 =
/// masked. The kinds the fused kernels compute themselves (key lengths,
/// causal, WeNet's chunks) are kept as that rule, so the fused path neither
/// builds, copies nor reads the tensor (whose (B, 1, T, T) kinds are O(T²)
/// on the host at every forward); the composition's tensor is built from
/// the rule on its first use, and copied to the scores' device once for
/// every layer that reads the mask (the clones share both).
#[derive(Clone, Debug)]
pub struct AttentionMask {
    /// The fused kernels' rule (its `mask` is `None`); `None` for a mask given as a tensor.
    rule: Option<ops::FlashMask>,
    /// (B, T1, T2) the rule covers.
    dims: (usize, usize, usize),
    /// The u8 tensor: given, or built from the rule on the host at its first use.
    dense: Arc<OnceLock<Tensor>>,
    /// The tensor on the device the composition first needed it on.
    on_device: Arc<OnceLock<Tensor>>,
    /// The rule's key lengths on the device the fused kernels first needed them on.
    lengths_on_device: Arc<OnceLock<Tensor>>,
}

/// The keys `[start, end)` that query `i` of a chunked mask sees: its own
/// chunk of `size` frames and `left` chunks before it (all when `left` < 0),
/// within `t` keys. WeNet's `subsequent_chunk_mask` row by row.
pub fn chunk_window(i: usize, size: usize, left: i64, t: usize) -> (usize, usize) {
    let c = i / size;
    let start = if left < 0 { 0 } else { c.saturating_sub(left as usize) * size };
    (start, ((c + 1) * size).min(t))
}

impl AttentionMask {
    /// A mask given as a tensor (no rule: the fused kernels read it).
    pub fn new(mask: Tensor) -> Self {
        let dense = Arc::new(OnceLock::new());
        let _ = dense.set(mask);
        AttentionMask { rule: None, dims: (0, 0, 0), dense, on_device: Arc::default(), lengths_on_device: Arc::default() }
    }

    /// The mask of `rule` over `b` sequences of `t` queries and keys.
    fn from_rule(rule: ops::FlashMask, b: usize, t: usize) -> Self {
        let rule = ops::FlashMask { mask: None, key_lengths_on_device: None, ..rule };
        AttentionMask { rule: Some(rule), dims: (b, t, t), dense: Arc::default(), on_device: Arc::default(), lengths_on_device: Arc::default() }
    }

    /// Masks keys at or beyond each sequence's length: (B, 1, 1, T).
    pub fn key_padding(lens: &[usize], t: usize) -> Result<Self> {
        Ok(Self::from_rule(ops::FlashMask { key_lengths: Some(lens.to_vec()), ..Default::default() }, lens.len(), t))
    }

    /// Masks future keys and keys beyond each sequence's length: (B, 1, T, T).
    pub fn causal_padding(lens: &[usize], t: usize) -> Result<Self> {
        Ok(Self::from_rule(ops::FlashMask { key_lengths: Some(lens.to_vec()), causal: true, ..Default::default() }, lens.len(), t))
    }

    /// WeNet's chunk mask (`size` frames per chunk, `left` chunks before
    /// each visible, all when < 0) and the key padding: (B, 1, T, T).
    pub fn chunked(lens: &[usize], t: usize, size: usize, left: i64) -> Result<Self> {
        if size == 0 {
            return Err(Error::invalid("AttentionMask::chunked", "expected a chunk size >= 1, found 0"));
        }
        Ok(Self::from_rule(ops::FlashMask { key_lengths: Some(lens.to_vec()), chunk: Some((size, left)), ..Default::default() }, lens.len(), t))
    }

    /// The fused kernels' rule for this mask, if it is one of their kinds.
    pub fn rule(&self) -> Option<&ops::FlashMask> {
        self.rule.as_ref()
    }

    /// The mask as a u8 tensor, 1 = masked: the given one, or the rule's
    /// built on the host (once; (B, 1, 1, T) for key padding alone).
    pub fn tensor(&self) -> Result<Tensor> {
        if let Some(t) = self.dense.get() {
            return Ok(t.clone());
        }
        let Some(r) = &self.rule else { return Err(Error::invalid("AttentionMask", "a mask with neither a tensor nor a rule")) };
        let (b, t1, t2) = self.dims;
        let lens = r.key_lengths.clone().unwrap_or_else(|| vec![t2; b]);
        let t = if !r.causal && r.chunk.is_none() {
            let m: Vec<u8> = lens.iter().flat_map(|&l| (0..t2).map(move |j| u8::from(j >= l))).collect();
            Tensor::from_vec(m, [b, 1, 1, t2], &Device::Cpu)?
        } else {
            let mut m = Vec::with_capacity(b * t1 * t2);
            for &l in &lens {
                for i in 0..t1 {
                    let (start, end) = match r.chunk {
                        Some((size, left)) => chunk_window(i, size, left, t2),
                        None => (0, t2),
                    };
                    let end = if r.causal { end.min(i + 1) } else { end };
                    m.extend((0..t2).map(|j| u8::from(j < start || j >= end || j >= l)));
                }
            }
            Tensor::from_vec(m, [b, 1, t1, t2], &Device::Cpu)?
        };
        Ok(self.dense.get_or_init(|| t).clone())
    }

    /// The mask tensor on `device` (copied there once and kept, for the
    /// mask and its clones, when it lives elsewhere).
    pub fn tensor_on(&self, device: &Device) -> Result<Tensor> {
        let t = self.tensor()?;
        if t.device() == *device {
            return Ok(t);
        }
        kept_on(&self.on_device, device, || t.to_device(device))
    }

    /// What the fused kernels take on `device`: the rule (with its key
    /// lengths there, copied once and kept), or the tensor there.
    pub fn flash_on(&self, device: &Device) -> Result<ops::FlashMask> {
        let Some(r) = &self.rule else { return Ok(ops::FlashMask { mask: Some(self.tensor_on(device)?), ..Default::default() }) };
        let lens = match (&r.key_lengths, device) {
            (Some(l), Device::Cuda(_)) => {
                Some(kept_on(&self.lengths_on_device, device, || Tensor::from_vec(l.iter().map(|&x| x as i64).collect::<Vec<_>>(), [l.len()], device))?)
            }
            _ => None,
        };
        Ok(ops::FlashMask { key_lengths_on_device: lens, ..r.clone() })
    }
}

/// The tensor kept in `cell` when it is on `device`, else `make()`, kept
/// when the cell is empty (a copy on another device first stays the kept one).
fn kept_on(cell: &OnceLock<Tensor>, device: &Device, make: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    if let Some(t) = cell.get().filter(|t| t.device() == *device) {
        return Ok(t.clone());
    }
    let t = make()?;
    let _ = cell.set(t.clone());
    Ok(t)
}

/// Projected keys and values (B, H, T, d_k) kept between the chunks of a stream.
pub type KvCache = (Tensor, Tensor);

/// Multi-head attention with `linear_q/k/v/out` (all with bias).
#[derive(Clone, Debug)]
pub struct MultiHeadedAttention {
    /// Query projection.
    pub linear_q: Linear,
    /// Key projection.
    pub linear_k: Linear,
    /// Value projection.
    pub linear_v: Linear,
    /// Output projection.
    pub linear_out: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Number of heads.
    pub heads: usize,
}

impl MultiHeadedAttention {
    /// `heads` heads over `d` features (d must divide evenly).
    pub fn new(heads: usize, d: usize, dropout: f64, dtype: DType, rng: &mut Rng) -> Result<Self> {
        if heads == 0 || d % heads != 0 {
            return Err(Error::invalid("MultiHeadedAttention", format!("attention dim {d} must be a multiple of the head count {heads}")));
        }
        Ok(MultiHeadedAttention {
            linear_q: Linear::new(d, d, true, dtype, rng)?,
            linear_k: Linear::new(d, d, true, dtype, rng)?,
            linear_v: Linear::new(d, d, true, dtype, rng)?,
            linear_out: Linear::new(d, d, true, dtype, rng)?,
            dropout: Dropout::new(dropout),
            heads,
        })
    }

    fn d_k(&self) -> usize {
        self.linear_q.out_features() / self.heads
    }

    /// (B, T, D) → (B, T, H, d_k) without moving data.
    fn split(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 {
            return Err(Error::ShapeMismatch { op: "MultiHeadedAttention", expected: "an input (B, T, D)".into(), got: format!("{}", x.shape()) });
        }
        let (b, t) = (x.dims()[0], x.dims()[1]);
        ops::reshape(x, [b, t, self.heads, self.d_k()])
    }

    /// (B, T, H, d_k) → (B, H, T, d_k).
    fn heads_first(x: &Tensor) -> Result<Tensor> {
        ops::permute(x, &[0, 2, 1, 3])
    }

    /// softmax(scores) with the mask, dropout, times v, merged heads, `linear_out`.
    fn attend(&self, scores: &Tensor, v: &Tensor, mask: Option<&AttentionMask>) -> Result<Tensor> {
        // One kernel each way, in the scores' dtype: half scores give half
        // probabilities directly (the kernels accumulate in f32), and masked
        // keys get exactly 0 (a fully masked row gives zeros, never NaN).
        let attn = match mask {
            Some(m) => ops::masked_softmax(scores, &m.tensor_on(&scores.device())?)?,
            None => ops::softmax(scores)?,
        };
        let p = self.dropout.forward(&attn)?;
        let x = ops::matmul(&p, v)?; // (B, H, T1, d_k)
        let x = ops::permute(&x, &[0, 2, 1, 3])?;
        let (b, t1) = (x.dims()[0], x.dims()[1]);
        let x = ops::reshape(&x, [b, t1, self.heads * self.d_k()])?;
        self.linear_out.forward(&x)
    }

    /// Attention of `query` (B, T1, D) over `key`/`value` (B, T2, D): the
    /// fused kernel when the attention fusion is on, else the composition.
    pub fn forward(&self, query: &Tensor, key: &Tensor, value: &Tensor, mask: Option<&AttentionMask>) -> Result<Tensor> {
        if let Some(y) = self.attend_packed(query, key, value, None, mask)? {
            return Ok(y);
        }
        if fusion::enabled(Fusion::Attention) {
            let q = self.split(&self.linear_q.forward(query)?)?;
            let k = self.split(&self.linear_k.forward(key)?)?;
            let v = self.split(&self.linear_v.forward(value)?)?;
            if Self::fusable(&[&q, &k, &v]) {
                return self.attend_fused(&q, &k, &v, None, mask);
            }
        }
        let (k, v) = self.project_kv(key, value)?;
        self.forward_kv(query, &k, &v, mask)
    }

    /// Whether the fused kernel takes these (B, T, H, d_k) operands: one
    /// dtype, a head dim its tiles hold on a GPU.
    fn fusable(xs: &[&Tensor]) -> bool {
        let x = xs[0];
        xs.iter().all(|t| t.dtype() == x.dtype() && t.device() == x.device())
            && (x.device() == Device::Cpu || x.dims()[3] <= crate::backend::cuda::attention::MAX_D_K)
    }

    /// `ops::flash_attention` of (B, T, H, d_k) operands with the mask and
    /// this layer's dropout, merged heads, `linear_out`.
    fn attend_fused(&self, q: &Tensor, k: &Tensor, v: &Tensor, pos: Option<ops::RelPos>, mask: Option<&AttentionMask>) -> Result<Tensor> {
        let m = mask.map(|m| m.flash_on(&q.device())).transpose()?.unwrap_or_default();
        let x = ops::flash_attention(q, k, v, pos, &m, self.dropout.p, self.dropout.training)?;
        let (b, t1) = (x.dims()[0], x.dims()[1]);
        let x = ops::reshape(&x, [b, t1, self.heads * self.d_k()])?;
        self.linear_out.forward(&x)
    }

    /// The parameter lists the `qkv` fusion packs: q, k, v weights and
    /// biases for self-attention (`self_attention`), k and v ones for
    /// cross-attention; none with the fusion off. Declared to autocast
    /// (`ops::autocast_params_packed`), autocast's weight conversion makes
    /// them.
    pub fn packs(&self, self_attention: bool) -> Vec<Vec<Tensor>> {
        if !(fusion::enabled(Fusion::Attention) && fusion::enabled(Fusion::Qkv)) {
            return Vec::new();
        }
        let ls = self.projections(self_attention);
        let ws = ls.iter().map(|l| l.weight.clone()).collect();
        let bs: Option<Vec<Tensor>> = ls.iter().map(|l| l.bias.clone()).collect();
        std::iter::once(ws).chain(bs).collect()
    }

    fn projections(&self, self_attention: bool) -> Vec<&Linear> {
        if self_attention {
            vec![&self.linear_q, &self.linear_k, &self.linear_v]
        } else {
            vec![&self.linear_k, &self.linear_v]
        }
    }

    /// `x` projected by `linears` at once: (B, T, n·D) with their outputs
    /// side by side, in one GEMM against their packed weights (the region's
    /// copy when declared, else one `cat_cast_many`).
    fn project_packed(x: &Tensor, linears: &[&Linear]) -> Result<Tensor> {
        let ws: Vec<&Tensor> = linears.iter().map(|l| &l.weight).collect();
        let bs: Vec<&Tensor> = linears.iter().filter_map(|l| l.bias.as_ref()).collect();
        let biased = bs.len() == ws.len();
        let declared = (ops::packed_params(&ws)?, if biased { ops::packed_params(&bs)? } else { None });
        let (w, b) = match declared {
            (Some(w), Some(b)) if biased => (w, Some(b)),
            (Some(w), None) if !biased => (w, None),
            _ => {
                let mut parts = vec![ws.iter().map(|&t| t.clone()).collect::<Vec<_>>()];
                if biased {
                    parts.push(bs.iter().map(|&t| t.clone()).collect());
                } else if !bs.is_empty() {
                    return Err(Error::invalid("MultiHeadedAttention", "expected every projection with a bias or none"));
                }
                let mut packed = ops::cat_cast_many(&parts, ws[0].dtype())?.into_iter();
                let w = packed.next().ok_or_else(|| Error::invalid("MultiHeadedAttention", "expected a packed weight"))?;
                (w, packed.next())
            }
        };
        ops::linear(x, &w, b.as_ref())
    }

    /// The `qkv` fusion's path (with the attention fusion): one projection
    /// for q, k and v when `query`, `key` and `value` are one tensor, one
    /// for k and v when `key` and `value` are, read in place by the fused
    /// kernel. `None` when the fusion is off or does not apply.
    fn attend_packed(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        pos: Option<(&Tensor, &Tensor, &Tensor)>,
        mask: Option<&AttentionMask>,
    ) -> Result<Option<Tensor>> {
        if !(fusion::enabled(Fusion::Attention) && fusion::enabled(Fusion::Qkv)) || key.id() != value.id() {
            return Ok(None);
        }
        if query.rank() != 3 || key.rank() != 3 {
            return Err(Error::ShapeMismatch {
                op: "MultiHeadedAttention",
                expected: "inputs (B, T, D)".into(),
                got: format!("{} and {}", query.shape(), key.shape()),
            });
        }
        if query.device() != Device::Cpu && self.d_k() > crate::backend::cuda::attention::MAX_D_K {
            return Ok(None);
        }
        let m = mask.map(|m| m.flash_on(&query.device())).transpose()?.unwrap_or_default();
        let p = pos.map(|(table, _, _)| self.split(table)).transpose()?;
        let rel = match (pos, &p) {
            (Some((_, u, vb)), Some(p)) => Some(ops::RelPos { p, u, vb }),
            _ => None,
        };
        // The fused op takes one dtype (the products under one autocast give it).
        let same = |t: &Tensor| p.as_ref().is_none_or(|p| p.dtype() == t.dtype());
        let x = if query.id() == key.id() {
            let qkv = Self::project_packed(query, &self.projections(true))?;
            if !same(&qkv) {
                return Ok(None);
            }
            ops::flash_attention_qkv(&qkv, self.heads, rel, &m, self.dropout.p, self.dropout.training)?
        } else {
            let q = self.split(&self.linear_q.forward(query)?)?;
            let kv = Self::project_packed(key, &self.projections(false))?;
            if !same(&kv) || q.dtype() != kv.dtype() {
                return Ok(None);
            }
            ops::flash_attention_q_kv(&q, &kv, rel, &m, self.dropout.p, self.dropout.training)?
        };
        let (b, t1) = (x.dims()[0], x.dims()[1]);
        let x = ops::reshape(&x, [b, t1, self.heads * self.d_k()])?;
        self.linear_out.forward(&x).map(Some)
    }

    /// The projected keys and values of `key`/`value` (B, T, D), heads first:
    /// (B, H, T, d_k) each. A decoder caches these across steps.
    pub fn project_kv(&self, key: &Tensor, value: &Tensor) -> Result<(Tensor, Tensor)> {
        let k = Self::heads_first(&self.split(&self.linear_k.forward(key)?)?)?;
        let v = Self::heads_first(&self.split(&self.linear_v.forward(value)?)?)?;
        Ok((k, v))
    }

    /// Attention of `query` (B, T1, D) over keys and values already projected
    /// by [`Self::project_kv`] ((B, H, T2, d_k) each).
    pub fn forward_kv(&self, query: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&AttentionMask>) -> Result<Tensor> {
        let q = Self::heads_first(&self.split(&self.linear_q.forward(query)?)?)?;
        let scores = ops::matmul_scaled(&q, k, false, true, 1.0 / (self.d_k() as f64).sqrt())?;
        self.attend(&scores, v, mask)
    }

    /// Keys and values of x (B, T, D), heads first (B, H, T, d_k), after
    /// the cached ones when a cache is given (streaming self-attention).
    fn keys_values(&self, x: &Tensor, cache: Option<&KvCache>) -> Result<KvCache> {
        let k = Self::heads_first(&self.split(&self.linear_k.forward(x)?)?)?;
        let v = Self::heads_first(&self.split(&self.linear_v.forward(x)?)?)?;
        match cache {
            Some((ck, cv)) => Ok((ops::cat(&[ck, &k], 2)?, ops::cat(&[cv, &v], 2)?)),
            None => Ok((k, v)),
        }
    }

    /// Self-attention of x (B, T, D) over the cached keys and values then
    /// x's own (every one visible unless `mask` (B, 1, T, Tc+T) says not);
    /// returns the output and all keys and values, the next cache.
    pub fn forward_cached(&self, x: &Tensor, mask: Option<&AttentionMask>, cache: Option<&KvCache>) -> Result<(Tensor, KvCache)> {
        let q = Self::heads_first(&self.split(&self.linear_q.forward(x)?)?)?;
        let (k, v) = self.keys_values(x, cache)?;
        let scores = ops::matmul_scaled(&q, &k, false, true, 1.0 / (self.d_k() as f64).sqrt())?;
        Ok((self.attend(&scores, &v, mask)?, (k, v)))
    }

    fn children_list(&self) -> Vec<(String, &dyn Module)> {
        vec![
            ("linear_q".into(), &self.linear_q as &dyn Module),
            ("linear_k".into(), &self.linear_k),
            ("linear_v".into(), &self.linear_v),
            ("linear_out".into(), &self.linear_out),
            ("dropout".into(), &self.dropout),
        ]
    }
}

impl Module for MultiHeadedAttention {
    fn describe(&self) -> String {
        format!("MultiHeadedAttention(heads={}, d_k={})", self.heads, self.d_k())
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.children_list()
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        vec![&mut self.linear_q, &mut self.linear_k, &mut self.linear_v, &mut self.linear_out, &mut self.dropout]
    }
}

/// Attention with relative positions: `linear_pos` (no bias) projects the
/// positional table, and the learned biases `pos_bias_u`, `pos_bias_v`
/// [H, d_k] give scores ((q+u)·kᵀ + (q+v)·pᵀ)/√d_k. As in WeNet, the
/// position term is not shifted (no rel_shift).
#[derive(Clone, Debug)]
pub struct RelPositionMultiHeadedAttention {
    /// The plain attention projections.
    pub base: MultiHeadedAttention,
    /// Projection of the positional table [D, D], no bias.
    pub linear_pos: Linear,
    /// Content bias [H, d_k].
    pub pos_bias_u: Tensor,
    /// Position bias [H, d_k].
    pub pos_bias_v: Tensor,
}

impl RelPositionMultiHeadedAttention {
    /// `heads` heads over `d` features; the biases are xavier-uniform.
    pub fn new(heads: usize, d: usize, dropout: f64, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let base = MultiHeadedAttention::new(heads, d, dropout, dtype, rng)?;
        let linear_pos = Linear::new(d, d, false, dtype, rng)?;
        let dk = d / heads;
        let bound = xavier_uniform_bound(dk, heads);
        let pos_bias_u = uniform_param(&[heads, dk], bound, dtype, rng)?;
        let pos_bias_v = uniform_param(&[heads, dk], bound, dtype, rng)?;
        Ok(RelPositionMultiHeadedAttention { base, linear_pos, pos_bias_u, pos_bias_v })
    }

    /// Self-attention of x (B, T, D) with the positional table `pos_emb`
    /// (1, T, D): the fused kernel when the attention fusion is on, else
    /// the composition.
    pub fn forward(&self, query: &Tensor, key: &Tensor, value: &Tensor, mask: Option<&AttentionMask>, pos_emb: &Tensor) -> Result<Tensor> {
        let a = &self.base;
        if fusion::enabled(Fusion::Attention) && fusion::enabled(Fusion::Qkv) && key.id() == value.id() {
            let p = self.linear_pos.forward(pos_emb)?;
            if let Some(y) = a.attend_packed(query, key, value, Some((&p, &self.pos_bias_u, &self.pos_bias_v)), mask)? {
                return Ok(y);
            }
        }
        if fusion::enabled(Fusion::Attention) {
            let q = a.split(&a.linear_q.forward(query)?)?;
            let k = a.split(&a.linear_k.forward(key)?)?;
            let v = a.split(&a.linear_v.forward(value)?)?;
            let p = a.split(&self.linear_pos.forward(pos_emb)?)?;
            if MultiHeadedAttention::fusable(&[&q, &k, &v, &p]) {
                let pos = ops::RelPos { p: &p, u: &self.pos_bias_u, vb: &self.pos_bias_v };
                return a.attend_fused(&q, &k, &v, Some(pos), mask);
            }
        }
        let k = MultiHeadedAttention::heads_first(&a.split(&a.linear_k.forward(key)?)?)?;
        let v = MultiHeadedAttention::heads_first(&a.split(&a.linear_v.forward(value)?)?)?;
        self.attend_kv(query, &k, &v, mask, pos_emb)
    }

    /// Streaming self-attention of x (B, T, D) after the cached keys and
    /// values; `pos_emb` (1, Tc+T, D) holds the rows of every key's position.
    /// Returns the output and the next cache.
    pub fn forward_cached(&self, x: &Tensor, mask: Option<&AttentionMask>, pos_emb: &Tensor, cache: Option<&KvCache>) -> Result<(Tensor, KvCache)> {
        let (k, v) = self.base.keys_values(x, cache)?;
        Ok((self.attend_kv(x, &k, &v, mask, pos_emb)?, (k, v)))
    }

    /// Scores of `query` against heads-first keys and positions, then attention over `v`.
    fn attend_kv(&self, query: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&AttentionMask>, pos_emb: &Tensor) -> Result<Tensor> {
        let a = &self.base;
        let q = a.split(&a.linear_q.forward(query)?)?; // (B, T1, H, d_k)
        let b = q.dims()[0];
        let p = self.linear_pos.forward(pos_emb)?;
        let p = MultiHeadedAttention::heads_first(&a.split(&p)?)?; // (1, H, T2, d_k)
                                                                   // The matmul batches over equal batch dims only, so the one table is
                                                                   // repeated per sequence in one launch; its gradient is summed back.
        let p = if p.dims()[0] == b {
            p
        } else if p.dims()[0] == 1 {
            let mut dims = p.dims().to_vec();
            dims[0] = b;
            ops::broadcast_to(&p, &dims)?
        } else {
            return Err(Error::ShapeMismatch {
                op: "RelPositionMultiHeadedAttention",
                expected: format!("a positional table for 1 or {b} sequences"),
                got: format!("{}", pos_emb.shape()),
            });
        };
        let q_u = MultiHeadedAttention::heads_first(&ops::add(&q, &self.pos_bias_u)?)?;
        let q_v = MultiHeadedAttention::heads_first(&ops::add(&q, &self.pos_bias_v)?)?;
        // Both products and the scale in two GEMMs (the second accumulates).
        let scores = ops::matmul_pair_scaled(&q_u, k, &q_v, &p, false, true, 1.0 / (a.d_k() as f64).sqrt())?;
        a.attend(&scores, v, mask)
    }
}

impl Module for RelPositionMultiHeadedAttention {
    fn describe(&self) -> String {
        format!("RelPositionMultiHeadedAttention(heads={}, d_k={})", self.base.heads, self.base.d_k())
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        vec![("pos_bias_u", self.pos_bias_u.clone(), TensorKind::Param), ("pos_bias_v", self.pos_bias_v.clone(), TensorKind::Param)]
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut v = self.base.children_list();
        v.push(("linear_pos".into(), &self.linear_pos));
        v
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        let a = &mut self.base;
        vec![&mut a.linear_q, &mut a.linear_k, &mut a.linear_v, &mut a.linear_out, &mut a.dropout, &mut self.linear_pos]
    }
}
