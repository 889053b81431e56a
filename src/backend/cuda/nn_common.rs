//! Launch helpers shared by the nn kernel families (softmax, norm, conv,
//! index, layout, dropout); their kernel side is `cuda/nn_common.cuh`.

use super::{CudaDevice, CudaStorage, LaunchConfig};
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::sync::Arc;

/// Threads per block of every nn kernel (`NN_BLOCK` in `nn_common.cuh`;
/// the block reductions need a power of two no larger than it).
pub(crate) const NN_BLOCK: u32 = 256;

/// The most blocks one launch uses; the kernels grid-stride over the rest
/// (lower when tests cap the grid, see `launch::max_grid`).
fn max_blocks() -> usize {
    (super::launch::max_grid() as usize).min(65_535)
}

/// The float dtypes of the f32/f64 kernels, for error messages.
/// The float dtypes of the kernels mixed precision also needs.
pub(crate) const FLOATS: (&[DType], &str) = (&[DType::F32, DType::F64, DType::F16, DType::BF16], "f32, f64, f16, bf16 on the GPU");

/// A 1-D grid-stride launch over `n` elements.
pub(crate) fn elems(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(NN_BLOCK as usize).clamp(1, max_blocks());
    LaunchConfig { grid: (blocks as u32, 1, 1), block: (NN_BLOCK, 1, 1), shared_bytes: 0 }
}

/// One block per row (grid-stride over rows past `max_blocks()`).
pub(crate) fn rows(rows: usize) -> LaunchConfig {
    LaunchConfig { grid: (rows.clamp(1, max_blocks()) as u32, 1, 1), block: (NN_BLOCK, 1, 1), shared_bytes: 0 }
}

/// Checks that `s` has one of the dtypes in `supported`.
pub(crate) fn expect_dtype(op: &'static str, s: &CudaStorage, supported: (&[DType], &'static str)) -> Result<()> {
    if supported.0.contains(&s.dtype()) {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: s.dtype(), supported: supported.1 })
    }
}

/// Checks that `b` has `a`'s dtype and sits on `a`'s GPU.
pub(crate) fn same(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op, expected: a.dtype(), got: b.dtype() });
    }
    if a.ordinal() != b.ordinal() {
        return Err(Error::invalid(op, format!("expected every operand on cuda:{}, got one on cuda:{}", a.ordinal(), b.ordinal())));
    }
    Ok(())
}

/// Checks that `s` holds `len` elements (the shapes the op layer computed).
pub(crate) fn expect_len(op: &'static str, what: &str, s: &CudaStorage, len: usize) -> Result<()> {
    if s.len() != len {
        return Err(Error::ShapeMismatch { op, expected: format!("{what} of {len} elements"), got: format!("{} elements", s.len()) });
    }
    Ok(())
}

/// `v` as a kernel's 32-bit size argument.
pub(crate) fn u32_arg(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::invalid(op, format!("{what} of {v} is above the kernel's limit of {}", u32::MAX)))
}

/// Host i64 values (indices, offsets, shapes) copied to `dev`.
pub(crate) fn upload_i64(dev: &Arc<CudaDevice>, v: &[i64]) -> Result<CudaStorage> {
    // A zero-length buffer is never read; keep one element so the
    // allocation is a real pointer.
    if v.is_empty() {
        return CudaStorage::from_cpu(dev, &crate::backend::cpu::CpuStorage::I64(vec![0]));
    }
    CudaStorage::from_cpu(dev, &crate::backend::cpu::CpuStorage::I64(v.to_vec()))
}

/// Dims of the `Strided` struct of `cuda/common.cuh`.
pub(crate) const MAX_DIMS: usize = 8;

/// The `Strided` struct of `cuda/common.cuh` as 64-bit words (rank,
/// dims[8], strides[8]), passed to a kernel by value (`&[u64; 17]`): no
/// upload, no allocation, no wait for the copy.
pub(crate) fn strided_words(op: &'static str, dims: &[usize], strides: &[usize]) -> Result<[u64; 1 + 2 * MAX_DIMS]> {
    let r = dims.len();
    if r > MAX_DIMS || strides.len() != r {
        return Err(Error::invalid(
            op,
            format!("expected at most {MAX_DIMS} dims with one stride each (the CUDA kernel's limit), found {r} dims and {} strides", strides.len()),
        ));
    }
    let mut w = [0u64; 1 + 2 * MAX_DIMS];
    w[0] = r as u64;
    for d in 0..r {
        w[1 + d] = dims[d] as u64;
        w[1 + MAX_DIMS + d] = strides[d] as u64;
    }
    Ok(w)
}

/// The bits of `v` converted to `dtype` as the CPU converts it (round to
/// nearest for floats, truncation toward zero for integers), in the low
/// bytes of a u64: the kernels' `value_bits`.
pub(crate) fn value_bits(dtype: DType, v: f64) -> u64 {
    match dtype {
        DType::F32 => (v as f32).to_bits() as u64,
        DType::F64 => v.to_bits(),
        DType::F16 => crate::tensor::halfconv::f16_from_f64(v).to_bits() as u64,
        DType::BF16 => crate::tensor::halfconv::bf16_from_f64(v).to_bits() as u64,
        DType::I64 => (v as i64) as u64,
        DType::U8 => (v as u8) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuStorage;

    #[test]
    fn fill_bits_are_the_cpu_conversion_of_the_value() {
        for v in [1.5, -2.0, 0.1, 1e-4, 300.7] {
            let CpuStorage::F32(f) = CpuStorage::full(DType::F32, 1, v) else { unreachable!() };
            assert_eq!(value_bits(DType::F32, v), f[0].to_bits() as u64);
            let CpuStorage::F16(h) = CpuStorage::full(DType::F16, 1, v) else { unreachable!() };
            assert_eq!(value_bits(DType::F16, v), h[0].to_bits() as u64);
            let CpuStorage::BF16(h) = CpuStorage::full(DType::BF16, 1, v) else { unreachable!() };
            assert_eq!(value_bits(DType::BF16, v), h[0].to_bits() as u64);
            assert_eq!(value_bits(DType::F64, v), v.to_bits());
        }
        assert_eq!(value_bits(DType::I64, -3.7), (-3i64) as u64);
        assert_eq!(value_bits(DType::U8, 200.9), 200);
    }

    #[test]
    fn launches_cover_every_element_within_the_grid_limit() {
        for n in [1usize, 255, 256, 257, 4097, 1 << 40] {
            let c = elems(n);
            assert_eq!(c.block, (NN_BLOCK, 1, 1));
            assert!(c.grid.0 >= 1 && c.grid.0 as usize <= max_blocks(), "n {n}: grid {:?}", c.grid);
            // Grid-stride kernels need no more blocks than elements / threads.
            assert!(c.grid.0 as usize <= n.div_ceil(NN_BLOCK as usize));
        }
        assert_eq!(rows(1).grid.0, 1);
        assert_eq!(rows(70_000).grid.0 as usize, max_blocks());
        assert_eq!(NN_BLOCK.count_ones(), 1, "the block reductions need a power of two");
    }
}
