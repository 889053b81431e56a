//! Dtype conversions on the GPU (`cuda/cast.cu`), the twin of
//! `CpuStorage::to_dtype`: any of f32, f64, f16, bf16, i64, u8 to any other.

use super::kernels::cast as k;
use super::{CudaStorage, LaunchConfig};
use crate::error::{Error, Result};
use crate::tensor::DType;

/// `x` converted to `dtype` (a copy when it already is).
pub fn to_dtype(x: &CudaStorage, dtype: DType) -> Result<CudaStorage> {
    if x.dtype() == dtype {
        return x.try_clone();
    }
    let dev = x.device();
    let y = dev.alloc(dtype, x.len())?;
    if x.is_empty() {
        return Ok(y);
    }
    k::cast(dev, x.dtype(), dtype, LaunchConfig::for_elems(x.len()), x, &y, x.len() as i64)?;
    Ok(y)
}

/// Tensors one `cast_many` launch takes (`CAST_TENSORS` in cuda/cast.cu).
pub const CAST_TENSORS: usize = 64;
/// Chunks one `cast_many` launch takes (`CAST_CHUNKS` in cuda/cast.cu).
pub const CAST_CHUNKS: usize = 256;
/// Elements per chunk of `cast_many` (one block each).
pub const CAST_CHUNK: usize = 1 << 14;
/// 64-bit words of the `CastTable` struct: chunk, n_chunks, src/dst/len per
/// tensor, then two u32 per chunk.
const CAST_WORDS: usize = 2 + 3 * CAST_TENSORS + CAST_CHUNKS;
const CAST_THREADS: u32 = 256;

/// One launch's table of tensors and chunks.
struct CastTable {
    words: [u64; CAST_WORDS],
    tensors: usize,
    chunks: usize,
}

impl CastTable {
    fn new(chunk: usize) -> CastTable {
        let mut words = [0u64; CAST_WORDS];
        words[0] = chunk as u64;
        CastTable { words, tensors: 0, chunks: 0 }
    }
    /// A source of `len` elements at `src` converted to `dst` (an address
    /// inside a live buffer of at least `len` elements of the target dtype).
    fn add_range(&mut self, src: u64, dst: u64, len: usize) -> usize {
        let k = self.tensors;
        self.words[2 + k] = src;
        self.words[2 + CAST_TENSORS + k] = dst;
        self.words[2 + 2 * CAST_TENSORS + k] = len as u64;
        self.tensors += 1;
        k
    }
    /// Elements of chunk `c`: its tensor's length past the chunk's start, at most a chunk.
    fn chunk_len(&self, c: usize) -> u64 {
        let base = 2 + 3 * CAST_TENSORS;
        let shift = 32 * (c % 2);
        let slot = ((self.words[base + c / 2] >> shift) & 0xffff_ffff) as usize;
        let index = (self.words[base + CAST_CHUNKS / 2 + c / 2] >> shift) & 0xffff_ffff;
        let (chunk, len) = (self.words[0], self.words[2 + 2 * CAST_TENSORS + slot]);
        len.saturating_sub(index * chunk).min(chunk)
    }
    fn add_chunk(&mut self, slot: usize, index: u32) {
        // Two little-endian u32 arrays packed into words: tensor[], then index[].
        let base = 2 + 3 * CAST_TENSORS;
        let c = self.chunks;
        let shift = 32 * (c % 2);
        self.words[base + c / 2] |= (slot as u64) << shift;
        self.words[base + CAST_CHUNKS / 2 + c / 2] |= (index as u64) << shift;
        self.chunks += 1;
        self.words[1] = self.chunks as u64;
    }
}

/// The tables covering every chunk of every `(src, dst, len)` range (device
/// addresses, elements), each within the launch limits (a range's chunks
/// may span tables).
fn cast_tables(ranges: &[(u64, u64, usize)], chunk: usize) -> Result<Vec<CastTable>> {
    let mut tables: Vec<CastTable> = Vec::new();
    for &(src, dst, len) in ranges {
        let n_chunks = u32::try_from(len.div_ceil(chunk)).map_err(|_| {
            Error::invalid("cast_many", format!("expected at most {} chunks of {chunk} elements per tensor, found {}", u32::MAX, len.div_ceil(chunk)))
        })?;
        let mut slot = None;
        for j in 0..n_chunks {
            let fits = tables.last().is_some_and(|t| t.chunks < CAST_CHUNKS && (slot.is_some() || t.tensors < CAST_TENSORS));
            if !fits {
                tables.push(CastTable::new(chunk));
                slot = None;
            }
            let t = tables.last_mut().ok_or_else(|| Error::Msg("cast_many: no table".into()))?;
            let k = match slot {
                Some(k) => k,
                None => t.add_range(src, dst, len),
            };
            slot = Some(k);
            t.add_chunk(k, j);
        }
    }
    Ok(tables)
}

/// One-element float tensors gathered as f64 into consecutive elements of
/// one new buffer, in one launch per distinct dtype among them
/// (`cast_many_{dt}_f64`, element k of the output as value k's
/// destination): what a step's loss values need to come back with one copy,
/// instead of a cast and a concatenation piece per value. At most
/// [`CAST_TENSORS`] values.
pub fn gather_scalars_f64(xs: &[&CudaStorage]) -> Result<CudaStorage> {
    const OP: &str = "gather_scalars_f64";
    let Some(first) = xs.first() else { return Err(Error::invalid(OP, "expected at least one value, found none")) };
    if xs.len() > CAST_TENSORS {
        return Err(Error::invalid(OP, format!("expected at most {CAST_TENSORS} values, found {}", xs.len())));
    }
    for (i, x) in xs.iter().enumerate() {
        if !x.dtype().is_float() || x.ordinal() != first.ordinal() || x.len() != 1 {
            return Err(Error::invalid(
                OP,
                format!(
                    "expected one f32, f64, f16 or bf16 element on cuda:{}, found {} {:?} on cuda:{} (value {i})",
                    first.ordinal(),
                    x.len(),
                    x.dtype(),
                    x.ordinal()
                ),
            ));
        }
    }
    let dev = first.device();
    let y = dev.alloc(DType::F64, xs.len())?;
    for from in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let mut t = CastTable::new(1);
        for (k, x) in xs.iter().enumerate().filter(|(_, x)| x.dtype() == from) {
            let slot = t.add_range(x.ptr(), y.ptr() + 8 * k as u64, 1);
            t.add_chunk(slot, 0);
        }
        if t.chunks > 0 {
            let n = t.chunks as u64;
            let cfg = LaunchConfig { grid: (t.chunks as u32, 1, 1), block: (32, 1, 1), shared_bytes: 0 };
            k::cast_many(dev, from, DType::F64, cfg, &t.words, (n * from.size_in_bytes() as u64, 8 * n))?;
        }
    }
    Ok(y)
}

/// Every `x` converted to `dtype` in a few launches (one per table of up to
/// [`CAST_TENSORS`] tensors and [`CAST_CHUNKS`] chunks): f32 to f16/bf16 and
/// back, the conversions autocast makes of a layer's weights and gradients.
/// The values equal [`to_dtype`]'s.
pub fn to_dtype_many(xs: &[&CudaStorage], dtype: DType) -> Result<Vec<CudaStorage>> {
    to_dtype_many_chunked(xs, dtype, CAST_CHUNK)
}

/// [`to_dtype_many`] with `chunk` elements per block (tests use small chunks
/// so that tensors span chunks and tables).
pub fn to_dtype_many_chunked(xs: &[&CudaStorage], dtype: DType, chunk: usize) -> Result<Vec<CudaStorage>> {
    let Some(first) = xs.first() else { return Ok(Vec::new()) };
    let dev = first.device();
    let ys = xs.iter().map(|x| dev.alloc(dtype, x.len())).collect::<Result<Vec<_>>>()?;
    let pieces: Vec<CastPiece> = xs.iter().zip(&ys).map(|(x, y)| CastPiece { src: x, src_at: 0, dst: y, dst_at: 0, len: x.len() }).collect();
    cast_pieces_chunked(&pieces, chunk)?;
    Ok(ys)
}

/// `len` elements of `src` from element `src_at`, converted to `dst`'s
/// dtype, written to `dst` from element `dst_at`.
#[derive(Clone, Copy)]
pub struct CastPiece<'a> {
    /// The source buffer.
    pub src: &'a CudaStorage,
    /// The first source element.
    pub src_at: usize,
    /// The destination buffer.
    pub dst: &'a CudaStorage,
    /// The first destination element.
    pub dst_at: usize,
    /// Elements.
    pub len: usize,
}

/// Every piece converted (or copied, for one dtype) in one launch per
/// table of up to [`CAST_TENSORS`] pieces and [`CAST_CHUNKS`] chunks: the
/// pieces of a concatenation into one buffer (a packed projection weight)
/// and of its split back. Every source one dtype, every destination one
/// dtype: f32 to f16/bf16 and back, or a copy of f32, f16 or bf16.
pub fn cast_pieces(pieces: &[CastPiece]) -> Result<()> {
    cast_pieces_chunked(pieces, CAST_CHUNK)
}

/// Whether [`cast_pieces`] converts `from` to `to`: f32 to f16/bf16 and
/// back, or a copy of f32, f16 or bf16.
pub fn many_supported(from: DType, to: DType) -> bool {
    matches!((from, to), (DType::F32, DType::F16 | DType::BF16) | (DType::F16 | DType::BF16, DType::F32))
        || (from == to && matches!(from, DType::F32 | DType::F16 | DType::BF16))
}

fn cast_pieces_chunked(pieces: &[CastPiece], chunk: usize) -> Result<()> {
    let Some(first) = pieces.first() else { return Ok(()) };
    if chunk == 0 {
        return Err(Error::invalid("cast_many", "expected a chunk of at least one element, found 0"));
    }
    let (from, dtype) = (first.src.dtype(), first.dst.dtype());
    if !many_supported(from, dtype) {
        return Err(Error::invalid("cast_many", format!("expected f32 -> f16/bf16, f16/bf16 -> f32 or a copy of f32/f16/bf16, got {from:?} -> {dtype:?}")));
    }
    for p in pieces {
        for (what, b, at, want) in [("source", p.src, p.src_at, from), ("destination", p.dst, p.dst_at, dtype)] {
            if b.dtype() != want || b.ordinal() != first.src.ordinal() {
                return Err(Error::invalid(
                    "cast_many",
                    format!("expected every {what} {want:?} on cuda:{}, found {:?} on cuda:{}", first.src.ordinal(), b.dtype(), b.ordinal()),
                ));
            }
            if at + p.len > b.len() {
                return Err(Error::invalid("cast_many", format!("expected elements {at}..{} inside the {what}'s {}", at + p.len, b.len())));
            }
        }
    }
    let dev = first.src.device();
    let ranges: Vec<(u64, u64, usize)> = pieces
        .iter()
        .filter(|p| p.len > 0)
        .map(|p| (p.src.ptr() + (p.src_at * from.size_in_bytes()) as u64, p.dst.ptr() + (p.dst_at * dtype.size_in_bytes()) as u64, p.len))
        .collect();
    for t in cast_tables(&ranges, chunk)? {
        let cfg = LaunchConfig { grid: (t.chunks.min(super::launch::max_grid() as usize) as u32, 1, 1), block: (CAST_THREADS, 1, 1), shared_bytes: 0 };
        // The bytes of this table's chunks (the profile cannot see inside it).
        let elems: u64 = (0..t.chunks).map(|c| t.chunk_len(c)).sum();
        let moved = (elems * from.size_in_bytes() as u64, elems * dtype.size_in_bytes() as u64);
        k::cast_many(dev, from, dtype, cfg, &t.words, moved)?;
    }
    Ok(())
}
