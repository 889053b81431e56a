//! Step-by-step decoding with a per-layer cache, so each step computes only
//! the new position (WeNet's `forward_one_step`, with keys and values cached
//! instead of layer outputs).
//!
//! A decoder block's self-attention at position i reads the keys and values
//! of positions 0..=i, which depend only on those positions (the mask is
//! causal). So after feeding position i, each layer keeps its keys/values
//! (N, H, i+1, d_k) and the next step projects only the new token's. The
//! cross-attention's keys/values over the encoder output never change and
//! are projected once. A step costs O(i·D) attention plus O(D²) projections
//! per layer instead of recomputing the whole prefix (O(i·D²)).
//!
//! Rows are hypotheses. [`DecoderCache::select`] reorders them (a beam keeps
//! the rows of the parents of its survivors). The cache works for any
//! [`TransformerDecoder`]: a right-to-left decoder (`Decoder::Bi`'s
//! `right_decoder`) is fed the reversed hypothesis the same way.

use super::decoder::{DecoderLayer, TransformerDecoder};
use crate::error::{Error, Result};
use crate::nn::{AttentionMask, LayerNorm};
use crate::ops;
use crate::tensor::{Device, Tensor};

/// One block's cached keys and values, (N, H, len, d_k) each.
#[derive(Clone, Debug)]
struct KeysValues {
    k: Tensor,
    v: Tensor,
}

/// The state of one decoder's step-by-step run over a fixed encoder output.
#[derive(Clone, Debug)]
pub struct DecoderCache {
    /// Per block: self-attention keys/values of the positions fed so far (None before the first step).
    self_kv: Vec<Option<KeysValues>>,
    /// Per block: cross-attention keys/values of the memory, (N, H, T, d_k).
    src_kv: Vec<KeysValues>,
    /// Padded memory frames, (N, 1, 1, T).
    mem_mask: AttentionMask,
    /// Positions fed so far (the next token's position).
    len: usize,
    /// Rows (hypotheses).
    rows: usize,
}

impl DecoderCache {
    /// Positions fed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of rows (hypotheses).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// A cache whose row r is this cache's row `rows[r]` (rows may repeat or be dropped).
    pub fn select(&self, rows: &[usize]) -> Result<DecoderCache> {
        if rows.is_empty() || rows.iter().any(|&r| r >= self.rows) {
            return Err(Error::invalid("DecoderCache::select", format!("expected 1 or more row indices below {}, found {rows:?}", self.rows)));
        }
        let idx = Tensor::from_vec(rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [rows.len()], &Device::Cpu)?;
        let pick = |kv: &KeysValues| -> Result<KeysValues> { Ok(KeysValues { k: ops::index_select(&kv.k, 0, &idx)?, v: ops::index_select(&kv.v, 0, &idx)? }) };
        // Memory rows are identical copies of one utterance when the cache was
        // built for beam search, but not in general, so they are selected too.
        Ok(DecoderCache {
            self_kv: self.self_kv.iter().map(|kv| kv.as_ref().map(pick).transpose()).collect::<Result<_>>()?,
            src_kv: self.src_kv.iter().map(pick).collect::<Result<_>>()?,
            mem_mask: AttentionMask::new(ops::index_select(&self.mem_mask.tensor()?, 0, &idx)?),
            len: self.len,
            rows: rows.len(),
        })
    }
}

/// `x + f(norm(x))` (pre-norm) or `norm(x + f(x))` (post-norm), as `DecoderLayer` does.
fn branch(layer: &DecoderLayer, x: &Tensor, norm: &LayerNorm, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let h = if layer.normalize_before { norm.forward(x)? } else { x.clone() };
    let x = ops::add(x, &layer.dropout.forward(&f(&h)?)?)?;
    if layer.normalize_before {
        Ok(x)
    } else {
        norm.forward(&x)
    }
}

impl DecoderLayer {
    /// One new position x (N, 1, D): attends to the cached keys/values plus its own, which it appends.
    fn forward_step(&self, x: &Tensor, cache: &mut Option<KeysValues>, src: &KeysValues, mem_mask: &AttentionMask) -> Result<Tensor> {
        let x = branch(self, x, &self.norm1, |h| {
            let (k_new, v_new) = self.self_attn.project_kv(h, h)?;
            let kv = match cache.take() {
                None => KeysValues { k: k_new, v: v_new },
                Some(c) => KeysValues { k: ops::cat(&[&c.k, &k_new], 2)?, v: ops::cat(&[&c.v, &v_new], 2)? },
            };
            // Every cached key is at or before this position: no mask.
            let y = self.self_attn.forward_kv(h, &kv.k, &kv.v, None)?;
            *cache = Some(kv);
            Ok(y)
        })?;
        let x = branch(self, &x, &self.norm2, |h| self.src_attn.forward_kv(h, &src.k, &src.v, Some(mem_mask)))?;
        branch(self, &x, &self.norm3, |h| self.feed_forward.forward(h))
    }
}

impl TransformerDecoder {
    /// An empty cache over `memory` (N, T, D) with `mem_lens` valid frames per row.
    pub fn init_cache(&self, memory: &Tensor, mem_lens: &[usize]) -> Result<DecoderCache> {
        if memory.rank() != 3 || mem_lens.len() != memory.dims()[0] || mem_lens.iter().any(|&l| l > memory.dims()[1]) {
            return Err(Error::ShapeMismatch {
                op: "TransformerDecoder::init_cache",
                expected: format!("memory (N, T, D) and N lengths <= T, found {} lengths", mem_lens.len()),
                got: format!("{}", memory.shape()),
            });
        }
        let src_kv = self.decoders.iter().map(|l| l.src_attn.project_kv(memory, memory).map(|(k, v)| KeysValues { k, v })).collect::<Result<Vec<_>>>()?;
        Ok(DecoderCache {
            self_kv: vec![None; self.decoders.len()],
            src_kv,
            mem_mask: AttentionMask::key_padding(mem_lens, memory.dims()[1])?,
            len: 0,
            rows: mem_lens.len(),
        })
    }

    /// Feeds one token per row at position `cache.len()` and returns the
    /// logits (N, V) of the token after it; equals the last position of
    /// [`TransformerDecoder::forward`] over the whole prefix.
    pub fn forward_step(&self, tokens: &[i64], cache: &mut DecoderCache) -> Result<Tensor> {
        if tokens.len() != cache.rows || cache.self_kv.len() != self.decoders.len() {
            return Err(Error::ShapeMismatch {
                op: "TransformerDecoder::forward_step",
                expected: format!("{} tokens (one per cache row) and a cache of {} blocks", cache.rows, self.decoders.len()),
                got: format!("{} tokens, a cache of {} blocks", tokens.len(), cache.self_kv.len()),
            });
        }
        let n = tokens.len();
        let ys = Tensor::from_vec(tokens.to_vec(), [n, 1], &Device::Cpu)?;
        let mut x = self.pos_enc.encode_at(&self.embed.forward(&ys)?, cache.len)?;
        for (i, layer) in self.decoders.iter().enumerate() {
            x = layer.forward_step(&x, &mut cache.self_kv[i], &cache.src_kv[i], &cache.mem_mask)?;
        }
        cache.len += 1;
        if self.normalize_before {
            x = self.after_norm.forward(&x)?;
        }
        let logits = ops::widen_half(&self.output_layer.forward(&x)?)?;
        let v = logits.dims()[2];
        ops::reshape(&logits, [n, v])
    }
}
