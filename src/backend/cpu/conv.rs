//! Convolutions in the two shapes the models need.
//!
//! Depthwise conv1d (the Conformer convolution module), channels last:
//! x (B, T, C), w (C, 1, K), zero padding p on both sides, stride 1:
//!   y[b,t,c] = bias[c] + Σ_k w[c,k]·x[b,t+k−p,c]
//!
//! Conv2d (the subsampling front end), x (B, Ci, H, W), w (Co, Ci, kh, kw),
//! stride s, zero padding p: im2col to (Ci·kh·kw, Ho·Wo) per image, then
//! GEMMs with the weight viewed as (Co, Ci·kh·kw). The backward uses the same
//! columns: gw = Σ_b g_b·colsᵀ, gcols = wᵀ·g_b, then col2im. The images are
//! the parallel tasks (each GEMM single-threaded), and an image's columns
//! are made and used in blocks of output rows small enough to stay in L2.

use super::matmul::{gemm_view, View};
use super::{CpuStorage, Float};
use crate::error::Result;
use crate::float_match;
use rayon::prelude::*;
use std::ops::Range;

/// Geometry of a depthwise conv1d over channels-last x (B, T, C).
#[derive(Clone, Copy, Debug)]
pub struct Dw1d {
    pub b: usize,
    pub c: usize,
    pub t: usize,
    pub k: usize,
    pub pad: usize,
}

impl Dw1d {
    /// Output length.
    pub fn t_out(&self) -> usize {
        (self.t + 2 * self.pad + 1).saturating_sub(self.k)
    }
    /// The input frame tap `k` of output frame `ot` reads, if inside x.
    fn src(&self, ot: usize, k: usize) -> Option<usize> {
        (ot + k).checked_sub(self.pad).filter(|&i| i < self.t)
    }
}

fn is_half(x: &CpuStorage) -> bool {
    matches!(x.dtype(), crate::tensor::DType::F16 | crate::tensor::DType::BF16)
}

/// Depthwise conv1d forward, channels last: x (B, T, C), w (C, 1, K),
/// bias (C) → y (B, To, C), `y[b,t,c] = bias[c] + Σ_k w[c,k]·x[b,t+k−p,c]`
/// summed from the bias in ascending k. Half inputs are computed in f32 and
/// rounded once (as the GPU's half kernels do).
pub fn conv1d_depthwise(x: &CpuStorage, w: &CpuStorage, bias: Option<&CpuStorage>, g: &Dw1d) -> Result<CpuStorage> {
    if is_half(x) {
        let f = |s: &CpuStorage| s.to_dtype(crate::tensor::DType::F32);
        let bf = bias.map(f);
        return Ok(conv1d_depthwise(&f(x), &f(w), bf.as_ref(), g)?.to_dtype(x.dtype()));
    }
    let bs = bias.unwrap_or(w);
    Ok(float_match!("conv1d_depthwise", (x, w, bs), |x, w, bs| {
        let (to, c) = (g.t_out(), g.c);
        let mut y = super::zeros_as(x, g.b * to * c);
        super::par_rows(&mut y, c.max(1), |row, yr| {
            let (bi, ot) = (row / to.max(1), row % to.max(1));
            for (ch, yv) in yr.iter_mut().enumerate() {
                let mut s = if bias.is_some() { bs[ch] } else { super::of_as(x, 0.0) };
                for k in 0..g.k {
                    if let Some(i) = g.src(ot, k) {
                        s = s + w[ch * g.k + k] * x[(bi * g.t + i) * c + ch];
                    }
                }
                *yv = s;
            }
        });
        Float::store(y)
    }))
}

/// Depthwise conv1d backward, channels last: `(gx, gw, gbias)` with
/// `gx[b,i,c] = Σ_k w[c,k]·gy[b,i+p−k,c]` (ascending k),
/// `gw[c,k] = Σ_{b,t} gy[b,t,c]·x[b,t+k−p,c]` and `gbias[c] = Σ_{b,t} gy[b,t,c]`
/// (b, then t ascending). Half inputs are computed in f32, rounded once.
pub fn conv1d_depthwise_backward(x: &CpuStorage, w: &CpuStorage, gy: &CpuStorage, g: &Dw1d) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    if is_half(x) {
        let f = |s: &CpuStorage| s.to_dtype(crate::tensor::DType::F32);
        let (gx, gw, gb) = conv1d_depthwise_backward(&f(x), &f(w), &f(gy), g)?;
        let d = x.dtype();
        return Ok((gx.to_dtype(d), gw.to_dtype(d), gb.to_dtype(d)));
    }
    Ok(float_match!("conv1d_depthwise_backward", (x, w, gy), |x, w, gy| {
        let (to, c) = (g.t_out(), g.c);
        let mut gx = super::zeros_as(x, x.len());
        super::par_rows(&mut gx, c.max(1), |row, gr| {
            let (bi, i) = (row / g.t.max(1), row % g.t.max(1));
            for (ch, gv) in gr.iter_mut().enumerate() {
                let mut s = super::of_as(x, 0.0);
                for k in 0..g.k {
                    let ot = (i + g.pad).checked_sub(k).filter(|&o| o < to);
                    if let Some(ot) = ot {
                        s = s + w[ch * g.k + k] * gy[(bi * to + ot) * c + ch];
                    }
                }
                *gv = s;
            }
        });
        let per_ch: Vec<(Vec<_>, _)> = (0..c)
            .into_par_iter()
            .map(|ch| {
                let mut gw = super::zeros_as(x, g.k);
                for (k, gwk) in gw.iter_mut().enumerate() {
                    let mut s = super::of_as(x, 0.0);
                    for bi in 0..g.b {
                        for ot in 0..to {
                            if let Some(i) = g.src(ot, k) {
                                s = s + gy[(bi * to + ot) * c + ch] * x[(bi * g.t + i) * c + ch];
                            }
                        }
                    }
                    *gwk = s;
                }
                let mut gb = super::of_as(x, 0.0);
                for r in 0..g.b * to {
                    gb = gb + gy[r * c + ch];
                }
                (gw, gb)
            })
            .collect();
        let gb: Vec<_> = per_ch.iter().map(|p| p.1).collect();
        let gw: Vec<_> = per_ch.into_iter().flat_map(|p| p.0).collect();
        (Float::store(gx), Float::store(gw), Float::store(gb))
    }))
}

/// Geometry of a conv2d.
#[derive(Clone, Copy, Debug)]
pub struct Conv2d {
    pub b: usize,
    pub ci: usize,
    pub h: usize,
    pub w: usize,
    pub co: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad: usize,
}

impl Conv2d {
    /// Output height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        let f = |n: usize, k: usize| if n + 2 * self.pad < k { 0 } else { (n + 2 * self.pad - k) / self.stride + 1 };
        (f(self.h, self.kh), f(self.w, self.kw))
    }
    fn ckk(&self) -> usize {
        self.ci * self.kh * self.kw
    }
}

/// The output columns `ox` of tap column `j` that read inside a row of
/// width `w` (`x = ox·s + j − p` in `0..w`): `lo..hi`, and the first `x`.
fn valid_cols(g: &Conv2d, wo: usize, j: usize) -> (usize, usize, usize) {
    let (s, p) = (g.stride, g.pad);
    // x >= 0  <=>  ox >= ceil((p − j)/s).
    let lo = if p > j { (p - j).div_ceil(s) } else { 0 }.min(wo);
    // x <= w − 1  <=>  ox <= (w − 1 + p − j)/s.
    let hi = if g.w + p > j { ((g.w - 1 + p - j) / s + 1).min(wo) } else { 0 }.max(lo);
    (lo, hi, (lo * s + j).saturating_sub(p))
}

/// `out[k] = line[k·s]`. Strides 1 and 2 (the subsampling convs) get loops
/// the compiler vectorises (a copy; pairs of which the first is kept, all
/// but the last element, whose pair may end past the line).
fn gather<T: Float>(out: &mut [T], line: &[T], s: usize) {
    let n = out.len();
    if n == 0 {
        return;
    }
    match s {
        1 => out.copy_from_slice(&line[..n]),
        2 => {
            let (head, last) = out.split_at_mut(n - 1);
            for (o, pair) in head.iter_mut().zip(line.chunks_exact(2)) {
                *o = pair[0];
            }
            last[0] = line[2 * (n - 1)];
        }
        _ => {
            for (o, &v) in out.iter_mut().zip(line.iter().step_by(s)) {
                *o = v;
            }
        }
    }
}

/// `line[k·s] += src[k]`: the adjoint of [`gather`], vectorised alike.
fn scatter_add<T: Float>(src: &[T], line: &mut [T], s: usize) {
    let n = src.len();
    if n == 0 {
        return;
    }
    match s {
        1 => {
            for (d, &v) in line.iter_mut().zip(src) {
                *d = *d + v;
            }
        }
        2 => {
            for (pair, &v) in line.chunks_exact_mut(2).zip(&src[..n - 1]) {
                pair[0] = pair[0] + v;
            }
            let k = 2 * (n - 1);
            line[k] = line[k] + src[n - 1];
        }
        _ => {
            for (d, &v) in line.iter_mut().step_by(s).zip(src) {
                *d = *d + v;
            }
        }
    }
}

/// Writes the columns (Ci·kh·kw, |oys|·Wo) of output rows `oys` of one
/// image `xb` (Ci, H, W) into `cb` (zeros where the kernel reads padding). Each column row is a kernel
/// tap (c, i, j): its output row oy reads input row oy·s+i−p from column
/// j−p with stride s, so the copy walks rows; the padded ends of a row are
/// found once per tap ([`valid_cols`]), leaving a branch-free strided copy.
fn im2col_rows<T: Float>(xb: &[T], g: &Conv2d, oys: Range<usize>, cb: &mut [T]) {
    let (_, wo) = g.out_hw();
    let (s, p) = (g.stride, g.pad as isize);
    for (r, row) in cb.chunks_mut((oys.len() * wo).max(1)).enumerate().take(g.ckk()) {
        let (c, i, j) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
        let plane = &xb[c * g.h * g.w..(c + 1) * g.h * g.w];
        let (lo, hi, x0) = valid_cols(g, wo, j);
        for (oy, out) in oys.clone().zip(row.chunks_mut(wo.max(1))) {
            let y = (oy * s + i) as isize - p;
            if y < 0 || y as usize >= g.h {
                out.fill(T::zero());
                continue;
            }
            out[..lo].fill(T::zero());
            out[hi..].fill(T::zero());
            if lo == hi {
                continue;
            }
            let line = &plane[y as usize * g.w + x0..(y as usize + 1) * g.w];
            gather(&mut out[lo..hi], line, s);
        }
    }
}

/// Adds the columns `cb` (Ci·kh·kw, |oys|·Wo) of output rows `oys` of one
/// image back into its gradient `gxb` (Ci, H, W): the adjoint of
/// [`im2col_rows`], taps in order.
fn col2im_rows<T: Float>(cb: &[T], g: &Conv2d, oys: Range<usize>, gxb: &mut [T]) {
    let (_, wo) = g.out_hw();
    let (s, p) = (g.stride, g.pad as isize);
    for (r, row) in cb.chunks((oys.len() * wo).max(1)).enumerate().take(g.ckk()) {
        let (c, i, j) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
        let plane = &mut gxb[c * g.h * g.w..(c + 1) * g.h * g.w];
        let (lo, hi, x0) = valid_cols(g, wo, j);
        for (oy, src) in oys.clone().zip(row.chunks(wo.max(1))) {
            let y = (oy * s + i) as isize - p;
            if y < 0 || y as usize >= g.h || lo == hi {
                continue;
            }
            let line = &mut plane[y as usize * g.w + x0..(y as usize + 1) * g.w];
            scatter_add(&src[lo..hi], line, s);
        }
    }
}

/// Conv2d forward: y (B, Co, Ho, Wo). One image per task: its columns
/// (Ci·kh·kw · Ho·Wo, a few MiB, never the whole batch's) and one
/// single-threaded GEMM, so the columns stay in cache and the threads never
/// meet inside a GEMM.
pub fn conv2d(x: &CpuStorage, w: &CpuStorage, bias: Option<&CpuStorage>, g: &Conv2d) -> Result<CpuStorage> {
    let bs = bias.unwrap_or(w);
    Ok(float_match!("conv2d", (x, w, bs), |x, w, bs| Float::store(conv2d_t(x, w, bias.map(|_| bs.as_slice()), g))))
}

/// Output rows per block of columns: the block (Ci·kh·kw × rows·Wo) is
/// about [`BLOCK_BYTES`], so im2col writes it and the GEMM reads it in L2
/// instead of through memory (a whole image's columns are several MiB).
fn block_rows<T>(g: &Conv2d) -> usize {
    let (_, wo) = g.out_hw();
    (BLOCK_BYTES / std::mem::size_of::<T>() / (g.ckk() * wo).max(1)).max(1)
}

/// The size a block of columns aims at (L2 holds it with the GEMM's packing).
const BLOCK_BYTES: usize = 3 << 19;

/// The blocks of output rows of one image.
fn row_blocks(ho: usize, rows: usize) -> impl Iterator<Item = Range<usize>> {
    (0..ho).step_by(rows).map(move |r0| r0..(r0 + rows).min(ho))
}

fn conv2d_t<T: Float>(x: &[T], w: &[T], bias: Option<&[T]>, g: &Conv2d) -> Vec<T> {
    let (ho, wo) = g.out_hw();
    let (ckk, hw, img, co) = (g.ckk(), ho * wo, g.ci * g.h * g.w, g.co);
    let rows = block_rows::<T>(g);
    let mut y = super::pool::zeroed(g.b * co * hw);
    // One columns buffer per rayon job, reused by its images and blocks.
    y.par_chunks_mut((co * hw).max(1)).enumerate().for_each_init(
        || vec![T::zero(); ckk * rows.min(ho) * wo],
        |cols, (bi, yb)| {
            let xb = &x[bi * img..(bi + 1) * img];
            for oys in row_blocks(ho, rows) {
                let nc = oys.len() * wo;
                let cb = &mut cols[..ckk * nc];
                im2col_rows(xb, g, oys.clone(), cb);
                // y[:, block] = w (Co, Ci·kh·kw) · cols (Ci·kh·kw, nc), rows of y hw apart.
                gemm_view(co, nc, ckk, View { data: w, rs: ckk, cs: 1 }, View { data: cb, rs: nc, cs: 1 }, &mut yb[oys.start * wo..], hw, false);
            }
            if let Some(bs) = bias {
                for (row, yr) in yb.chunks_mut(hw.max(1)).enumerate() {
                    let b0 = bs[row];
                    for v in yr.iter_mut() {
                        *v = *v + b0;
                    }
                }
            }
        },
    );
    y
}

/// Conv2d backward: `(gx, gw, gbias)`; `gx` is only computed when `need_gx`
/// (zeros otherwise: the first layer's input, the features, needs none).
/// Per image: its columns again, gw_b = g_b·colsᵀ, gcols = wᵀ·g_b and
/// col2im; the gw_b are summed over the batch in order, as before.
pub fn conv2d_backward(x: &CpuStorage, w: &CpuStorage, gy: &CpuStorage, g: &Conv2d, need_gx: bool) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    Ok(float_match!("conv2d_backward", (x, w, gy), |x, w, gy| {
        let (gx, gw, gb) = conv2d_backward_t(x, w, gy, g, need_gx);
        (Float::store(gx), Float::store(gw), Float::store(gb))
    }))
}

/// `Σ x` over eight interleaved partial sums (in a fixed order), so the
/// loop vectorises where a single running sum could not.
fn sum_lanes<T: Float>(x: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder().iter().fold(T::zero(), |a, &v| a + v);
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = *a + v;
        }
    }
    acc.iter().fold(tail, |a, &v| a + v)
}

fn conv2d_backward_t<T: Float>(x: &[T], w: &[T], gy: &[T], g: &Conv2d, need_gx: bool) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (ho, wo) = g.out_hw();
    let (ckk, hw, img, co) = (g.ckk(), ho * wo, g.ci * g.h * g.w, g.co);
    let rows = block_rows::<T>(g);
    let mut gx = super::pool::zeroed(if need_gx { g.b * img } else { 0 });
    // Per image: its weight gradient (Co·Ci·kh·kw) then its bias gradient
    // (Co), summed over the batch in order at the end.
    let per = co * ckk + co;
    let mut gwb = super::pool::zeroed(g.b * per);
    // Per image, per block of output rows: its columns again, then
    // gw_b += g_b[:, block]·colsᵀ, cols = wᵀ·g_b[:, block] and col2im.
    // `cols` is one buffer per rayon job, reused by its images.
    let per_image = |cols: &mut Vec<T>, bi: usize, gwi: &mut [T], mut gxb: Option<&mut [T]>| {
        let gyb = &gy[bi * co * hw..(bi + 1) * co * hw];
        let xb = &x[bi * img..(bi + 1) * img];
        let (gwi, gbi) = gwi.split_at_mut(co * ckk);
        for (b, row) in gbi.iter_mut().zip(gyb.chunks(hw.max(1))) {
            *b = sum_lanes(row);
        }
        for oys in row_blocks(ho, rows) {
            let (nc, first) = (oys.len() * wo, oys.start == 0);
            let gblk = View { data: &gyb[oys.start * wo..], rs: hw, cs: 1 };
            let cb = &mut cols[..ckk * nc];
            im2col_rows(xb, g, oys.clone(), cb);
            gemm_view(co, ckk, nc, gblk, View { data: cb, rs: 1, cs: nc }, gwi, ckk, !first);
            if let Some(gxb) = gxb.as_deref_mut() {
                gemm_view(ckk, nc, co, View { data: w, rs: 1, cs: ckk }, gblk, cb, nc, false);
                col2im_rows(cb, g, oys, gxb);
            }
        }
    };
    let new_cols = || vec![T::zero(); ckk * rows.min(ho) * wo];
    if need_gx {
        gwb.par_chunks_mut(per.max(1))
            .zip(gx.par_chunks_mut(img.max(1)))
            .enumerate()
            .for_each_init(new_cols, |cols, (bi, (gwi, gxb))| per_image(cols, bi, gwi, Some(gxb)));
    } else {
        gwb.par_chunks_mut(per.max(1)).enumerate().for_each_init(new_cols, |cols, (bi, gwi)| per_image(cols, bi, gwi, None));
    }
    let mut sum = vec![T::zero(); per];
    for chunk in gwb.chunks(per.max(1)) {
        for (a, &v) in sum.iter_mut().zip(chunk) {
            *a = *a + v;
        }
    }
    super::pool::give(gwb);
    let gb = sum.split_off(co * ckk);
    (gx, sum, gb)
}
