//! Convolutions in the two shapes the models need.
//!
//! Depthwise conv1d (the Conformer convolution module), x (B, C, T),
//! w (C, 1, K), zero padding p on both sides, stride 1:
//!   y[b,c,t] = bias[c] + Σ_k w[c,k]·x[b,c,t+k−p]
//!
//! Conv2d (the subsampling front end), x (B, Ci, H, W), w (Co, Ci, kh, kw),
//! stride s, zero padding p: im2col to (Ci·kh·kw, Ho·Wo) per image, then one
//! GEMM with the weight viewed as (Co, Ci·kh·kw). The backward uses the same
//! columns: gw = Σ_b g_b·colsᵀ, gcols = wᵀ·g_b, then col2im.

use super::matmul::{matmul_t, MatmulDims};
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

/// Source pixel of column row `r` (ci, i, j) at output position (oy, ox), if inside the image.
#[inline]
fn src(g: &Conv2d, r: usize, oy: usize, ox: usize) -> Option<usize> {
    let (c, rem) = (r / (g.kh * g.kw), r % (g.kh * g.kw));
    let (i, j) = (rem / g.kw, rem % g.kw);
    let (y, x) = ((oy * g.stride + i) as isize - g.pad as isize, (ox * g.stride + j) as isize - g.pad as isize);
    if y < 0 || x < 0 || y as usize >= g.h || x as usize >= g.w {
        None
    } else {
        Some((c * g.h + y as usize) * g.w + x as usize)
    }
}

fn im2col<T: Float>(x: &[T], g: &Conv2d) -> Vec<T> {
    let (ho, wo) = g.out_hw();
    let per = g.ckk() * ho * wo;
    let mut cols = vec![T::zero(); g.b * per];
    cols.par_chunks_mut(per.max(1)).enumerate().for_each(|(bi, cb)| {
        let xb = &x[bi * g.ci * g.h * g.w..(bi + 1) * g.ci * g.h * g.w];
        for r in 0..g.ckk() {
            for oy in 0..ho {
                for ox in 0..wo {
                    if let Some(s) = src(g, r, oy, ox) {
                        cb[(r * ho + oy) * wo + ox] = xb[s];
                    }
                }
            }
        }
    });
    cols
}

/// Conv2d forward: y (B, Co, Ho, Wo).
pub fn conv2d(x: &CpuStorage, w: &CpuStorage, bias: Option<&CpuStorage>, g: &Conv2d) -> Result<CpuStorage> {
    let bs = bias.unwrap_or(w);
    Ok(float_match!("conv2d", (x, w, bs), |x, w, bs| {
        let (ho, wo) = g.out_hw();
        let cols = im2col(x, g);
        let d = MatmulDims { batch: g.b, m: g.co, n: ho * wo, k: g.ckk(), trans_a: false, trans_b: false, a_stride: 0, b_stride: g.ckk() * ho * wo };
        let mut y = matmul_t(&d, w, &cols);
        if bias.is_some() {
            super::par_rows(&mut y, (ho * wo).max(1), |row, yr| {
                let b0 = bs[row % g.co];
                for v in yr.iter_mut() {
                    *v = *v + b0;
                }
            });
        }
        Float::store(y)
    }))
}

/// Conv2d backward: `(gx, gw, gbias)`.
pub fn conv2d_backward(x: &CpuStorage, w: &CpuStorage, gy: &CpuStorage, g: &Conv2d) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    Ok(float_match!("conv2d_backward", (x, w, gy), |x, w, gy| {
        let (ho, wo) = g.out_hw();
        let (ckk, hw) = (g.ckk(), ho * wo);
        let cols = im2col(x, g);
        // gw[b] = g_b (Co, HW) · cols_bᵀ (HW, CKK), summed over b in order.
        let dw = MatmulDims { batch: g.b, m: g.co, n: ckk, k: hw, trans_a: false, trans_b: true, a_stride: g.co * hw, b_stride: ckk * hw };
        let gwb = matmul_t(&dw, gy, &cols);
        let mut gw = super::zeros_as(x, g.co * ckk);
        for chunk in gwb.chunks(g.co * ckk) {
            for (a, &v) in gw.iter_mut().zip(chunk) {
                *a = *a + v;
            }
        }
        let mut gb = super::zeros_as(x, g.co);
        for (row, gr) in gy.chunks(hw.max(1)).enumerate() {
            gb[row % g.co] = gb[row % g.co] + gr.iter().fold(super::of_as(x, 0.0), |a, &v| a + v);
        }
        // gcols_b = wᵀ (CKK, Co) · g_b (Co, HW); then col2im.
        let dc = MatmulDims { batch: g.b, m: ckk, n: hw, k: g.co, trans_a: true, trans_b: false, a_stride: 0, b_stride: g.co * hw };
        let gcols = matmul_t(&dc, w, gy);
        let img = g.ci * g.h * g.w;
        let mut gx = super::zeros_as(x, g.b * img);
        gx.par_chunks_mut(img.max(1)).enumerate().for_each(|(bi, gxb)| {
            let cb = &gcols[bi * ckk * hw..(bi + 1) * ckk * hw];
            for r in 0..ckk {
                for oy in 0..ho {
                    for ox in 0..wo {
                        if let Some(s) = src(g, r, oy, ox) {
                            gxb[s] = gxb[s] + cb[(r * ho + oy) * wo + ox];
                        }
                    }
                }
            }
        });
        (Float::store(gx), Float::store(gw), Float::store(gb))
    }))
}
