//! The flat parameter layout of the ZeRO engine: every parameter, in a fixed
//! order, laid end to end in one logical f32 buffer of `numel` elements,
//! padded with zeros to `padded = world_size · shard_len` so that rank r owns
//! the equal contiguous shard `[r · shard_len, (r + 1) · shard_len)`.
//! A parameter may straddle shard boundaries; one smaller than the world
//! size lies inside one or two shards. The padding never holds a parameter,
//! so it never reaches the model and never enters the gradient norm.

use crate::backend::cpu::CpuStorage;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::ops::Range;

/// One parameter's place in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatEntry {
    /// The parameter's name.
    pub name: String,
    /// Its first element in the flat buffer.
    pub offset: usize,
    /// Its element count.
    pub numel: usize,
}

/// Where every parameter lies in the flat buffer and which part each rank owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatLayout {
    /// The parameters in flat order.
    pub entries: Vec<FlatEntry>,
    /// Elements of all parameters together.
    pub numel: usize,
    /// Ranks sharing the buffer.
    pub world_size: usize,
    /// Elements each rank owns (`ceil(numel / world_size)`, at least 1).
    pub shard_len: usize,
}

impl FlatLayout {
    /// The layout of `(name, numel)` pairs over `world_size` ranks.
    pub fn new(sizes: &[(String, usize)], world_size: usize) -> Result<FlatLayout> {
        if world_size == 0 {
            return Err(Error::invalid("zero layout", "expected a world size >= 1, found 0"));
        }
        let mut entries = Vec::with_capacity(sizes.len());
        let mut offset = 0usize;
        for (name, n) in sizes {
            entries.push(FlatEntry { name: name.clone(), offset, numel: *n });
            offset += n;
        }
        let shard_len = offset.div_ceil(world_size).max(1);
        Ok(FlatLayout { entries, numel: offset, world_size, shard_len })
    }

    /// The layout of the named tensors.
    pub fn of_params(params: &[(String, Tensor)], world_size: usize) -> Result<FlatLayout> {
        let sizes: Vec<(String, usize)> = params.iter().map(|(n, t)| (n.clone(), t.elem_count())).collect();
        FlatLayout::new(&sizes, world_size)
    }

    /// The padded length: `world_size · shard_len`, a multiple of the world size.
    pub fn padded(&self) -> usize {
        self.world_size * self.shard_len
    }

    /// Rank `r`'s shard in flat coordinates.
    pub fn shard_range(&self, r: usize) -> Range<usize> {
        r * self.shard_len..(r + 1) * self.shard_len
    }

    /// How many of rank `r`'s shard elements hold parameters (the rest is padding).
    pub fn valid_in_shard(&self, r: usize) -> usize {
        self.numel.saturating_sub(r * self.shard_len).min(self.shard_len)
    }

    /// The layout as `name:numel` items joined by commas (saved with the shards, checked on load).
    pub fn describe(&self) -> String {
        self.entries.iter().map(|e| format!("{}:{}", e.name, e.numel)).collect::<Vec<_>>().join(",")
    }

    /// Index of the first entry whose range ends after flat position `pos`.
    fn first_entry_from(&self, pos: usize) -> usize {
        self.entries.partition_point(|e| e.offset + e.numel <= pos)
    }

    /// Copies flat elements `range` of the tensors' gradients into `out`
    /// (zeros where a parameter has no gradient and in the padding).
    pub fn read_grads(&self, params: &[(String, Tensor)], range: Range<usize>, out: &mut [f32]) -> Result<()> {
        self.read(params, range, out, true)
    }

    /// Copies flat elements `range` of the tensors' values into `out` (zeros in the padding).
    pub fn read_values(&self, params: &[(String, Tensor)], range: Range<usize>, out: &mut [f32]) -> Result<()> {
        self.read(params, range, out, false)
    }

    fn read(&self, params: &[(String, Tensor)], range: Range<usize>, out: &mut [f32], grads: bool) -> Result<()> {
        debug_assert_eq!(out.len(), range.len());
        out.iter_mut().for_each(|x| *x = 0.0);
        for i in self.first_entry_from(range.start)..self.entries.len() {
            let e = &self.entries[i];
            if e.offset >= range.end {
                break;
            }
            let (lo, hi) = (range.start.max(e.offset), range.end.min(e.offset + e.numel));
            if lo >= hi {
                continue;
            }
            let t = if grads {
                match params[i].1.grad() {
                    Some(g) => g,
                    None => continue,
                }
            } else {
                params[i].1.clone()
            };
            let dst = &mut out[lo - range.start..hi - range.start];
            with_f32(&t, &e.name, |src| dst.copy_from_slice(&src[lo - e.offset..hi - e.offset]))?;
        }
        Ok(())
    }

    /// Writes `flat` (the whole padded buffer) into the parameters' storages in place.
    pub fn write_values(&self, params: &[(String, Tensor)], flat: &[f32]) -> Result<()> {
        for (e, (_, p)) in self.entries.iter().zip(params) {
            let src = &flat[e.offset..e.offset + e.numel];
            p.with_storage_mut(|s| match s {
                Storage::Cpu(CpuStorage::F32(v)) if v.len() == src.len() => {
                    v.copy_from_slice(src);
                    Ok(())
                }
                Storage::Cpu(other) => Err(Error::invalid(
                    "zero all-gather",
                    format!("parameter {}: expected f32 storage of {} elements, found {:?} of {}", e.name, e.numel, other.dtype(), other.len()),
                )),
                Storage::Cuda(_) => Err(Error::invalid(
                    "zero all-gather",
                    format!("parameter {}: these host-side layout helpers read CPU tensors (the ZeRO engine stages a GPU shard through flat device buffers instead)", e.name),
                )),
            })?;
        }
        Ok(())
    }

    /// For each parameter, the buckets (chunks of `chunk` elements of every
    /// shard, bucket k being in-shard elements `[k·chunk, (k+1)·chunk)` of
    /// all shards) that read any of its elements, ascending: the buckets
    /// that must wait for its gradient.
    pub fn buckets_reading(&self, chunk: usize) -> Vec<Vec<usize>> {
        let s = self.shard_len;
        self.entries
            .iter()
            .map(|e| {
                let mut ks = Vec::new();
                let end = e.offset + e.numel;
                let mut pos = e.offset;
                // One shard's part of the parameter at a time.
                while pos < end {
                    let r = pos / s;
                    let hi = end.min((r + 1) * s);
                    ks.extend((pos - r * s) / chunk..=(hi - 1 - r * s) / chunk);
                    pos = hi;
                }
                ks.sort_unstable();
                ks.dedup();
                ks
            })
            .collect()
    }

    /// For each parameter, the index of the last bucket (chunks of `chunk`
    /// elements of every shard) that reads any of its elements: after that
    /// bucket's reduce-scatter its full gradient is no longer needed.
    pub fn last_bucket(&self, chunk: usize) -> Vec<usize> {
        let s = self.shard_len;
        self.entries
            .iter()
            .map(|e| {
                if e.numel == 0 {
                    return 0;
                }
                let (first, last) = (e.offset, e.offset + e.numel - 1);
                // The largest in-shard offset any of its elements has.
                let max_in_shard = if first / s != last / s { s - 1 } else { last % s };
                max_in_shard / chunk
            })
            .collect()
    }
}

/// Runs `f` on the f32 elements of a CPU tensor.
pub fn with_f32<R>(t: &Tensor, name: &str, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    match &*t.storage() {
        Storage::Cpu(CpuStorage::F32(v)) => Ok(f(v)),
        Storage::Cpu(other) => Err(Error::invalid("zero", format!("parameter {name}: expected f32 data, found {:?}", other.dtype()))),
        Storage::Cuda(_) => Err(Error::invalid(
            "zero",
            format!(
                "parameter {name}: these host-side layout helpers read CPU tensors (the ZeRO engine stages a GPU shard through flat device buffers instead)"
            ),
        )),
    }
}

/// Parses a layout written by [`FlatLayout::describe`] into `(name, numel)` pairs.
pub fn parse_layout(s: &str) -> Result<Vec<(String, usize)>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|item| {
            let (name, n) = item.rsplit_once(':').ok_or_else(|| Error::Msg(format!("zero layout: expected name:numel, found {item:?}")))?;
            let n = n.parse().map_err(|_| Error::Msg(format!("zero layout: expected an element count after {name}:, found {n:?}")))?;
            Ok((name.to_string(), n))
        })
        .collect()
}
