//! The encoder's chunk masks (U2 dynamic chunk training), as WeNet's
//! `wenet/utils/mask.py` defines them.
//!
//! `subsequent_chunk_mask(size, c, l)`: query frame `i` may attend to keys
//! `start..end` with `end = min((i/c + 1)·c, size)` and `start = 0` when
//! `l < 0`, else `max((i/c − l)·c, 0)`: its own chunk, every earlier frame
//! (or the `l` chunks before its own) and nothing later.
//!
//! `add_optional_chunk_mask` picks the chunk:
//! - `use_dynamic_chunk`: `decoding_chunk_size < 0` is full context,
//!   `> 0` that size with `num_decoding_left_chunks`; `0` (training, and
//!   WeNet's cv too) draws `r` uniform in `1..max_len` (torch's
//!   `randint(1, max_len)`): full context when `r > max_len/2`, else the
//!   chunk `r % max_chunk_size + 1` (`max_chunk_size = 100 / subsampling
//!   rate`, 25 for conv2d), with all left chunks, or with
//!   `use_dynamic_left_chunk` a number drawn uniform in
//!   `0..(max_len − 1)/chunk`. So full context has probability about ½.
//! - else `static_chunk_size > 0`: that chunk with `num_decoding_left_chunks`.
//! - else only the padding mask.
//!
//! The chunk mask is AND-ed with the key padding mask (WeNet's masks are
//! true where attention is allowed; asrforge's [`AttentionMask`] is true
//! where it is not, so the result here is the complement).
//!
//! WeNet cannot draw when `max_len` is 1 (`randint(1, 1)` raises); here a
//! one-frame batch is full context.

use crate::error::{Error, Result};
use crate::nn::chunk_window;
use crate::nn::AttentionMask;
use crate::tensor::{rng, Rng};

/// The chunk settings of an encoder (its `encoder_conf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ChunkConfig {
    /// Draw a chunk size per batch.
    pub use_dynamic_chunk: bool,
    /// Draw the number of left chunks too.
    pub use_dynamic_left_chunk: bool,
    /// A fixed chunk size (0: none).
    pub static_chunk_size: usize,
    /// The largest drawn chunk (100 / subsampling rate in WeNet).
    pub max_chunk_size: usize,
}

/// How one forward pass chooses its mask: WeNet's `decoding_chunk_size` and `num_decoding_left_chunks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRequest {
    /// 0: draw (training); < 0: full context; > 0: this chunk size.
    pub decoding_chunk_size: i64,
    /// < 0: all left chunks; else this many.
    pub num_decoding_left_chunks: i64,
}

impl ChunkRequest {
    /// Training's request: draw when the encoder is dynamic.
    pub const TRAIN: ChunkRequest = ChunkRequest { decoding_chunk_size: 0, num_decoding_left_chunks: -1 };
}

/// The chosen chunk: `None` is full context (padding only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Frames per chunk.
    pub size: usize,
    /// Left chunks visible (< 0: all).
    pub num_left_chunks: i64,
}

/// WeNet's `subsequent_chunk_mask`: (size × size) row-major, true where query `i` may attend to key `j`.
pub fn subsequent_chunk_mask(size: usize, chunk_size: usize, num_left_chunks: i64) -> Result<Vec<bool>> {
    if chunk_size == 0 {
        return Err(Error::invalid("subsequent_chunk_mask", "expected a chunk size >= 1, found 0"));
    }
    let mut m = vec![false; size * size];
    for i in 0..size {
        let (start, end) = chunk_window(i, chunk_size, num_left_chunks, size);
        m[i * size + start..i * size + end].iter_mut().for_each(|x| *x = true);
    }
    Ok(m)
}

/// The chunk a dynamic encoder uses for a batch of `max_len` frames, given
/// draws `r` in `1..max_len` and (with dynamic left chunks) `u` in (0, 1).
pub fn dynamic_chunk_from_draws(max_len: usize, max_chunk_size: usize, r: usize, left_draw: Option<f64>) -> Option<Chunk> {
    if max_len <= 1 || r > max_len / 2 {
        return None;
    }
    let size = r % max_chunk_size.max(1) + 1;
    let num_left_chunks = match left_draw {
        None => -1,
        Some(u) => {
            let max_left = (max_len - 1) / size;
            // torch.randint(0, max_left) raises for max_left == 0; no left chunk then.
            if max_left == 0 {
                0
            } else {
                ((u * max_left as f64) as usize).min(max_left - 1) as i64
            }
        }
    };
    Some(Chunk { size, num_left_chunks })
}

/// Chooses the chunk for a batch of `max_len` frames, drawing from `rng` when WeNet draws.
pub fn choose_chunk(cfg: &ChunkConfig, req: ChunkRequest, max_len: usize, rng: &mut Rng) -> Option<Chunk> {
    if cfg.use_dynamic_chunk {
        match req.decoding_chunk_size {
            d if d < 0 => None,
            d if d > 0 => Some(Chunk { size: d as usize, num_left_chunks: req.num_decoding_left_chunks }),
            _ => {
                if max_len <= 1 {
                    return None;
                }
                let r = 1 + rng.below(max_len - 1);
                let left = if cfg.use_dynamic_left_chunk { Some(rng.uniform(1)[0]) } else { None };
                dynamic_chunk_from_draws(max_len, cfg.max_chunk_size, r, left)
            }
        }
    } else if cfg.static_chunk_size > 0 {
        Some(Chunk { size: cfg.static_chunk_size, num_left_chunks: req.num_decoding_left_chunks })
    } else {
        None
    }
}

/// The attention mask of a batch with key lengths `lens` over `t` frames and
/// an optional chunk: (B, 1, 1, T) padding only, or (B, 1, T, T), true where masked.
pub fn chunk_attention_mask(lens: &[usize], t: usize, chunk: Option<Chunk>) -> Result<AttentionMask> {
    match chunk {
        None => AttentionMask::key_padding(lens, t),
        Some(c) => AttentionMask::chunked(lens, t, c.size, c.num_left_chunks),
    }
}

/// WeNet's `add_optional_chunk_mask` for a batch: the chunk chosen (drawn
/// from the thread's default generator when dynamic) and its mask.
pub fn add_optional_chunk_mask(cfg: &ChunkConfig, req: ChunkRequest, lens: &[usize], t: usize) -> Result<(Option<Chunk>, AttentionMask)> {
    let chunk = rng::with_default(|r| choose_chunk(cfg, req, t, r));
    Ok((chunk, chunk_attention_mask(lens, t, chunk)?))
}
