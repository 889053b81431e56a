//! Chunk-by-chunk (streaming) encoding with WeNet's `forward_chunk` and
//! `forward_chunk_by_chunk` semantics, for one utterance.
//!
//! The features are cut into overlapping windows: with subsampling rate
//! `r`, right context `c` (6 for conv2d) and a chunk of `n` output frames,
//! window `k` starts at input frame `k·n·r` and holds `(n−1)·r + c + 1`
//! frames, so its subsampled frames are exactly frames `k·n .. k·n+n` of the
//! whole utterance's subsampling. Each block attends to its key/value cache
//! (the keys and values of earlier chunks, the last `n·left` of them when
//! `num_decoding_left_chunks = left >= 0`, all of them when < 0) and its own
//! chunk; a causal convolution module continues from its cache of the last
//! `kernel−1` input frames; positions continue from the stream's offset.
//! The result equals the whole utterance encoded under the chunk mask
//! `subsequent_chunk_mask(T', n, left)` when the convolution is causal (a
//! non-causal module sees zero padding at every chunk's edges, as in WeNet).

use super::encoder::Encoder;
use crate::error::{Error, Result};
use crate::nn::KvCache;
use crate::ops;
use crate::tensor::Tensor;

/// What one stream carries from chunk to chunk.
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    /// Output frames emitted so far (the next chunk's first position).
    pub offset: usize,
    /// Per block: the kept keys and values (B, H, Tc, d_k), None when empty.
    pub att: Vec<Option<KvCache>>,
    /// Per block: the convolution module's cache (causal modules).
    pub cnn: Vec<Option<Tensor>>,
}

impl Encoder {
    /// One chunk of features xs (1, T, F) → its encoder output (1, T', D),
    /// updating `state`; `required_cache_size` as WeNet's (< 0 keep every
    /// key, 0 none, else the last that many).
    pub fn forward_chunk(&self, xs: &Tensor, required_cache_size: i64, state: &mut StreamState) -> Result<Tensor> {
        if xs.rank() != 3 || xs.dims()[0] != 1 {
            return Err(Error::ShapeMismatch {
                op: "Encoder::forward_chunk",
                expected: "one chunk of features (1, T, F)".into(),
                got: format!("{}", xs.shape()),
            });
        }
        let n_layers = self.encoders.len();
        if state.att.len() != n_layers {
            state.att = vec![None; n_layers];
            state.cnn = vec![None; n_layers];
        }
        let x = match &self.global_cmvn {
            Some(c) => c.forward(xs)?,
            None => xs.clone(),
        };
        let (mut x, _, _) = self.embed.forward_at(&x, &[xs.dims()[1]], state.offset)?;
        let chunk = x.dims()[1];
        let cache_t = state.att.first().and_then(|c| c.as_ref()).map_or(0, |(k, _)| k.dims()[2]);
        let key_size = cache_t + chunk;
        let pos = self.embed.pos_enc.rows_at(state.offset - cache_t, key_size, &x)?;
        let next_start = match required_cache_size {
            r if r < 0 => 0,
            0 => key_size,
            r => key_size.saturating_sub(r as usize),
        };
        for (i, layer) in self.encoders.iter().enumerate() {
            let (y, (k, v), cnn) = layer.forward_chunk(&x, &pos, state.att[i].as_ref(), state.cnn[i].as_ref())?;
            x = y;
            state.att[i] = if next_start >= key_size {
                None
            } else {
                Some((ops::narrow(&k, 2, next_start, key_size - next_start)?, ops::narrow(&v, 2, next_start, key_size - next_start)?))
            };
            state.cnn[i] = cnn;
        }
        if self.normalize_before && self.final_norm {
            x = self.after_norm.forward(&x)?;
        }
        state.offset += chunk;
        Ok(x)
    }

    /// Encodes one utterance xs (1, T, F) chunk by chunk, `decoding_chunk_size`
    /// output frames at a time with `num_decoding_left_chunks` of history
    /// (< 0: all); returns (1, T', D). The encoder must have been trained
    /// for chunks (`use_dynamic_chunk` or `static_chunk_size`), as WeNet requires.
    pub fn forward_chunk_by_chunk(&self, xs: &Tensor, decoding_chunk_size: usize, num_decoding_left_chunks: i64) -> Result<Tensor> {
        const OP: &str = "Encoder::forward_chunk_by_chunk";
        if decoding_chunk_size == 0 {
            return Err(Error::invalid(OP, "expected a decoding chunk size >= 1, found 0"));
        }
        if !self.chunk.use_dynamic_chunk && self.chunk.static_chunk_size == 0 {
            return Err(Error::invalid(
                OP,
                "streaming needs a model trained with chunks: expected encoder_conf.use_dynamic_chunk: true or static_chunk_size > 0, found neither",
            ));
        }
        if xs.rank() != 3 || xs.dims()[0] != 1 {
            return Err(Error::ShapeMismatch { op: OP, expected: "one utterance of features (1, T, F)".into(), got: format!("{}", xs.shape()) });
        }
        let rate = self.embed.rate();
        let context = self.embed.right_context() + 1;
        let stride = rate * decoding_chunk_size;
        let window = (decoding_chunk_size - 1) * rate + context;
        let frames = xs.dims()[1];
        if frames < context {
            return Err(Error::invalid(OP, format!("an utterance of {frames} frames is shorter than the {context} one output frame reads")));
        }
        let required = if num_decoding_left_chunks < 0 { -1 } else { (decoding_chunk_size as i64) * num_decoding_left_chunks };
        let mut state = StreamState::default();
        let mut outs = Vec::new();
        for cur in (0..=frames - context).step_by(stride) {
            let end = (cur + window).min(frames);
            let chunk = ops::narrow(xs, 1, cur, end - cur)?;
            outs.push(self.forward_chunk(&chunk, required, &mut state)?);
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        ops::cat(&refs, 1)
    }
}
