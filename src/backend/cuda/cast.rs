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

/// The by-value table of every chunk of every `(src, dst, len)` range
/// (device addresses, elements): the caller has checked that they fit one
/// ([`CAST_TENSORS`] ranges, [`CAST_CHUNKS`] chunks).
fn cast_table(ranges: &[(u64, u64, usize)], chunk: usize) -> CastTable {
    let mut t = CastTable::new(chunk);
    for &(src, dst, len) in ranges {
        let k = t.add_range(src, dst, len);
        for j in 0..len.div_ceil(chunk) {
            t.add_chunk(k, j as u32);
        }
    }
    t
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

/// Every `x` converted to `dtype` in one launch (a by-value table of up to
/// [`CAST_TENSORS`] tensors and [`CAST_CHUNKS`] chunks, or beyond that a
/// table in device memory, copied up first): f32 to f16/bf16 and back, the
/// conversions autocast makes of a layer's weights and gradients.
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

/// Every piece converted (or copied, for one dtype) in one launch (a
/// by-value table of up to [`CAST_TENSORS`] pieces and [`CAST_CHUNKS`]
/// chunks, or beyond that one in device memory, copied up first): the
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
    // The bytes the table's chunks move (the profile cannot see inside it).
    let elems: u64 = ranges.iter().map(|r| r.2 as u64).sum();
    let moved = (elems * from.size_in_bytes() as u64, elems * dtype.size_in_bytes() as u64);
    let chunks: usize = ranges.iter().map(|r| r.2.div_ceil(chunk)).sum();
    if ranges.len() > CAST_TENSORS || chunks > CAST_CHUNKS {
        // More than one by-value table holds: one launch from a table in device memory.
        return cast_many_dev(dev, from, dtype, &ranges, chunk, moved);
    }
    if chunks == 0 {
        return Ok(());
    }
    let t = cast_table(&ranges, chunk);
    let cfg = LaunchConfig { grid: (t.chunks.min(super::launch::max_grid() as usize) as u32, 1, 1), block: (CAST_THREADS, 1, 1), shared_bytes: 0 };
    k::cast_many(dev, from, dtype, cfg, &t.words, moved)
}

/// 64-bit words of the `CastHead` struct (cuda/cast.cu): the table's device
/// address, its entries, its chunks, the chunk size.
const CAST_HEAD_WORDS: usize = 4;

/// Every `(src, dst, len)` range converted in one `cast_many_dev` launch
/// (moving `moved` bytes, for the profile): its table (a word per chunk,
/// then the sources, destinations and lengths) goes up in one asynchronous
/// copy (`upload_words`).
fn cast_many_dev(dev: &std::sync::Arc<super::CudaDevice>, from: DType, to: DType, ranges: &[(u64, u64, usize)], chunk: usize, moved: (u64, u64)) -> Result<()> {
    let mut words = Vec::new();
    let chunks = super::launch::chunk_words("cast_many", ranges.iter().map(|r| r.2), chunk, &mut words)?;
    words.extend(ranges.iter().map(|r| r.0 as i64));
    words.extend(ranges.iter().map(|r| r.1 as i64));
    words.extend(ranges.iter().map(|r| r.2 as i64));
    let table = super::upload_words(dev, words)?;
    let head: [u64; CAST_HEAD_WORDS] = [table.ptr(), ranges.len() as u64, chunks as u64, chunk as u64];
    let cfg = LaunchConfig { grid: (chunks.min(super::launch::max_grid() as usize) as u32, 1, 1), block: (CAST_THREADS, 1, 1), shared_bytes: 0 };
    k::cast_many_dev(dev, from, to, cfg, &head, moved)
}
