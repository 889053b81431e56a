//! Convolutions in the two shapes the models need.
//!
//! Depthwise conv1d (the Conformer convolution module), x (B, C, T),
//! w (C, 1, K), zero padding p on both sides, stride 1:
//!   y[b,c,t] = bias[c] + Σ_k w[c,k]·x[b,c,t+k−p]
//!
//! Conv2d (the subsampling front end), x (B, Ci, H, W), w (Co, Ci, kh, kw),
//! stride s, zero padding p: im2col to (Ci·kh·kw, Ho·Wo) per image, then one
//! GEMM with the weight viewed as (Co, Ci·kh·kw). The backward uses the same
//! columns: gw = Σ_b g_b·colsᵀ, gcols = wᵀ·g_b, then col2im. The images are
//! the parallel tasks (each GEMM single-threaded), so a batch's columns are
//! never all alive at once.

use super::matmul::{gemm_into, MatmulDims};
use super::{CpuStorage, Float};
use crate::error::Result;
use crate::float_match;
use rayon::prelude::*;

/// Geometry of a depthwise conv1d.
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
}

/// Depthwise conv1d forward.
pub fn depthwise_conv1d(x: &CpuStorage, w: &CpuStorage, bias: Option<&CpuStorage>, g: &Dw1d) -> Result<CpuStorage> {
    let bs = bias.unwrap_or(w);
    Ok(float_match!("depthwise_conv1d", (x, w, bs), |x, w, bs| {
        let to = g.t_out();
        let mut y = super::zeros_as(x, g.b * g.c * to);
        super::par_rows(&mut y, to.max(1), |row, yr| {
            let ch = row % g.c;
            let xr = &x[row * g.t..(row + 1) * g.t];
            let wr = &w[ch * g.k..(ch + 1) * g.k];
            let b0 = if bias.is_some() { bs[ch] } else { super::of_as(x, 0.0) };
            for (t, y) in yr.iter_mut().enumerate() {
                let mut s = b0;
                for k in 0..g.k {
                    let i = t + k;
                    if i >= g.pad && i - g.pad < g.t {
                        s = s + wr[k] * xr[i - g.pad];
                    }
                }
                *y = s;
            }
        });
        Float::store(y)
    }))
}

/// Depthwise conv1d backward: `(gx, gw, gbias)`.
pub fn depthwise_conv1d_backward(x: &CpuStorage, w: &CpuStorage, gy: &CpuStorage, g: &Dw1d) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    Ok(float_match!("depthwise_conv1d_backward", (x, w, gy), |x, w, gy| {
        let to = g.t_out();
        let mut gx = super::zeros_as(x, x.len());
        super::par_rows(&mut gx, g.t.max(1), |row, gr| {
            let ch = row % g.c;
            let go = &gy[row * to..(row + 1) * to];
            let wr = &w[ch * g.k..(ch + 1) * g.k];
            for (t, gv) in go.iter().enumerate() {
                for k in 0..g.k {
                    let i = t + k;
                    if i >= g.pad && i - g.pad < g.t {
                        gr[i - g.pad] = gr[i - g.pad] + wr[k] * *gv;
                    }
                }
            }
        });
        let per_ch: Vec<(Vec<_>, _)> = (0..g.c)
            .into_par_iter()
            .map(|ch| {
                let mut gw = super::zeros_as(x, g.k);
                let mut gb = super::of_as(x, 0.0);
                for bi in 0..g.b {
                    let row = bi * g.c + ch;
                    let xr = &x[row * g.t..(row + 1) * g.t];
                    for (t, &gv) in gy[row * to..(row + 1) * to].iter().enumerate() {
                        gb = gb + gv;
                        for k in 0..g.k {
                            let i = t + k;
                            if i >= g.pad && i - g.pad < g.t {
                                gw[k] = gw[k] + gv * xr[i - g.pad];
                            }
                        }
                    }
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

/// Writes the columns (Ci·kh·kw, Ho·Wo) of one image `xb` (Ci, H, W) into
/// `cb` (zeros where the kernel reads padding). Each column row is a kernel
/// tap (c, i, j): its output row oy reads input row oy·s+i−p from column
/// j−p with stride s, so the copy walks rows, never dividing per element.
fn im2col_one<T: Float>(xb: &[T], g: &Conv2d, cb: &mut [T]) {
    let (ho, wo) = g.out_hw();
    let (s, p) = (g.stride, g.pad as isize);
    for (r, row) in cb.chunks_mut((ho * wo).max(1)).enumerate().take(g.ckk()) {
        let (c, i, j) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
        let plane = &xb[c * g.h * g.w..(c + 1) * g.h * g.w];
        for (oy, out) in row.chunks_mut(wo.max(1)).enumerate() {
            let y = (oy * s + i) as isize - p;
            if y < 0 || y as usize >= g.h {
                out.fill(T::zero());
                continue;
            }
            let line = &plane[y as usize * g.w..(y as usize + 1) * g.w];
            for (ox, o) in out.iter_mut().enumerate() {
                let x = (ox * s + j) as isize - p;
                *o = if x < 0 || x as usize >= g.w { T::zero() } else { line[x as usize] };
            }
        }
    }
}

/// Adds the columns `cb` (Ci·kh·kw, Ho·Wo) of one image back into its
/// gradient `gxb` (Ci, H, W): the adjoint of [`im2col_one`], taps in order.
fn col2im_one<T: Float>(cb: &[T], g: &Conv2d, gxb: &mut [T]) {
    let (ho, wo) = g.out_hw();
    let (s, p) = (g.stride, g.pad as isize);
    for (r, row) in cb.chunks((ho * wo).max(1)).enumerate().take(g.ckk()) {
        let (c, i, j) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
        let plane = &mut gxb[c * g.h * g.w..(c + 1) * g.h * g.w];
        for (oy, src) in row.chunks(wo.max(1)).enumerate() {
            let y = (oy * s + i) as isize - p;
            if y < 0 || y as usize >= g.h {
                continue;
            }
            let line = &mut plane[y as usize * g.w..(y as usize + 1) * g.w];
            for (ox, &v) in src.iter().enumerate() {
                let x = (ox * s + j) as isize - p;
                if x >= 0 && (x as usize) < g.w {
                    line[x as usize] = line[x as usize] + v;
                }
            }
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

fn conv2d_t<T: Float>(x: &[T], w: &[T], bias: Option<&[T]>, g: &Conv2d) -> Vec<T> {
    {
        let (ho, wo) = g.out_hw();
        let (ckk, hw, img) = (g.ckk(), ho * wo, g.ci * g.h * g.w);
        let d = MatmulDims { batch: 1, m: g.co, n: hw, k: ckk, trans_a: false, trans_b: false, a_stride: 0, b_stride: 0 };
        let mut y = vec![T::zero(); g.b * g.co * hw];
        y.par_chunks_mut((g.co * hw).max(1)).enumerate().for_each(|(bi, yb)| {
            let mut cols = vec![T::zero(); ckk * hw];
            im2col_one(&x[bi * img..(bi + 1) * img], g, &mut cols);
            gemm_into(&d, w, &cols, yb);
            if let Some(bs) = bias {
                for (row, yr) in yb.chunks_mut(hw.max(1)).enumerate() {
                    let b0 = bs[row];
                    for v in yr.iter_mut() {
                        *v = *v + b0;
                    }
                }
            }
        });
        y
    }
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

fn conv2d_backward_t<T: Float>(x: &[T], w: &[T], gy: &[T], g: &Conv2d, need_gx: bool) -> (Vec<T>, Vec<T>, Vec<T>) {
    {
        let (ho, wo) = g.out_hw();
        let (ckk, hw, img) = (g.ckk(), ho * wo, g.ci * g.h * g.w);
        let dw = MatmulDims { batch: 1, m: g.co, n: ckk, k: hw, trans_a: false, trans_b: true, a_stride: 0, b_stride: 0 };
        let dc = MatmulDims { batch: 1, m: ckk, n: hw, k: g.co, trans_a: true, trans_b: false, a_stride: 0, b_stride: 0 };
        let mut gx = vec![T::zero(); if need_gx { g.b * img } else { 0 }];
        let mut gwb = vec![T::zero(); g.b * g.co * ckk];
        let per_image = |bi: usize, gwi: &mut [T], gxb: Option<&mut [T]>| {
            let gyb = &gy[bi * g.co * hw..(bi + 1) * g.co * hw];
            let mut cols = vec![T::zero(); ckk * hw];
            im2col_one(&x[bi * img..(bi + 1) * img], g, &mut cols);
            gemm_into(&dw, gyb, &cols, gwi);
            if let Some(gxb) = gxb {
                gemm_into(&dc, w, gyb, &mut cols);
                col2im_one(&cols, g, gxb);
            }
        };
        if need_gx {
            gwb.par_chunks_mut((g.co * ckk).max(1)).zip(gx.par_chunks_mut(img.max(1))).enumerate().for_each(|(bi, (gwi, gxb))| per_image(bi, gwi, Some(gxb)));
        } else {
            gwb.par_chunks_mut((g.co * ckk).max(1)).enumerate().for_each(|(bi, gwi)| per_image(bi, gwi, None));
        }
        let mut gw = vec![T::zero(); g.co * ckk];
        for chunk in gwb.chunks(g.co * ckk) {
            for (a, &v) in gw.iter_mut().zip(chunk) {
                *a = *a + v;
            }
        }
        let mut gb = vec![T::zero(); g.co];
        for (row, gr) in gy.chunks(hw.max(1)).enumerate() {
            gb[row % g.co] = gb[row % g.co] + gr.iter().fold(T::zero(), |a, &v| a + v);
        }
        (gx, gw, gb)
    }
}
