//! Flash attention's reference on the CPU: the straightforward
//! computation, one query row at a time, in f64 (every dtype is read as its
//! values and the results rounded once to it). Layouts and math as
//! `cuda/attention.cu`:
//!
//! s_ij = ((q_i+u)·k_j + (q_i+vb)·p_j)/√d_k (or q_i·k_j/√d_k without
//! positions), softmax over the unmasked keys (masked: 0; a fully masked
//! row: 0), times dropout's scaled keep mask Z, times v. The backward
//! recomputes P and applies dS_ij = P_ij (Z_ij dP̃_ij − D_i),
//! D_i = Σ_j P_ij Z_ij dP̃_ij, dP̃_ij = dout_i·v_j.

use super::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::{rng, DType};
use rayon::prelude::*;

/// The sizes of one attention: q (batch, t1, heads, d_k), k and v
/// (batch, t2, heads, d_k), positions (pos_batch, t2, heads, d_k) where
/// `pos_batch` is 1 or `batch` (0: no positions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Sequences.
    pub batch: usize,
    /// Queries per sequence.
    pub t1: usize,
    /// Keys per sequence.
    pub t2: usize,
    /// Heads.
    pub heads: usize,
    /// Features per head.
    pub d_k: usize,
    /// Sequences of the positional table: 0 (none), 1 (shared) or `batch`.
    pub pos_batch: usize,
}

impl AttentionDims {
    /// Elements of q (and of the output).
    pub fn q_len(&self) -> usize {
        self.batch * self.t1 * self.heads * self.d_k
    }
    /// Elements of k (and of v).
    pub fn k_len(&self) -> usize {
        self.batch * self.t2 * self.heads * self.d_k
    }
}

/// Which keys each query must not see, besides key lengths and a mask
/// tensor: WeNet's chunk mask (`chunk` > 0 frames per chunk, with
/// `left_chunks` chunks of left context, < 0 all) and the causal mask.
/// `mask_strides` lay a u8 mask out over (b, i, j) (0 along broadcast dims).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AttentionRule {
    /// Frames per chunk (0: no chunk mask).
    pub chunk: usize,
    /// Left chunks visible (< 0: all).
    pub left_chunks: i64,
    /// Query i sees no key j > i.
    pub causal: bool,
    /// Strides of the mask tensor over (b, i, j), when one is given.
    pub mask_strides: [usize; 3],
}

impl AttentionRule {
    /// Whether query `i` of sequence `b` must not see key `j`.
    pub fn masked(&self, lens: Option<&[i64]>, mask: Option<&[u8]>, b: usize, i: usize, j: usize) -> bool {
        if lens.is_some_and(|l| j as i64 >= l[b]) || (self.causal && j > i) {
            return true;
        }
        if let Some(c) = i.checked_div(self.chunk) {
            let start = if self.left_chunks < 0 { 0 } else { c.saturating_sub(self.left_chunks as usize) * self.chunk };
            if j >= (c + 1) * self.chunk || j < start {
                return true;
            }
        }
        let [sb, si, sj] = self.mask_strides;
        mask.is_some_and(|m| m[b * sb + i * si + j * sj] != 0)
    }
}

/// Attention dropout: probability `p` (0: none) and the (seed, offset) of
/// the generator's words reserved for the (batch, heads, t1, t2) weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDropout {
    /// Drop probability.
    pub p: f64,
    /// The generator's seed.
    pub seed: u64,
    /// The block offset of the draw.
    pub offset: u64,
}

impl AttentionDropout {
    /// No dropout.
    pub const NONE: AttentionDropout = AttentionDropout { p: 0.0, seed: 0, offset: 0 };

    /// The scale 1/(1−p) rounded to `dtype` (0 when p = 1), as dropout's mask.
    pub fn scale(&self, dtype: DType) -> f64 {
        let s = if self.p < 1.0 { 1.0 / (1.0 - self.p) } else { 0.0 };
        CpuStorage::F64(vec![s]).to_dtype(dtype).to_f64_vec()[0]
    }

    /// The factor of element `e` of the (batch, heads, t1, t2) weights: `z`
    /// (the rounded scale) where its uniform draw is below 1 − p, else 0.
    fn factor(&self, z: f64, e: usize) -> f64 {
        if self.p == 0.0 {
            return 1.0;
        }
        let b = self.offset + (e / 4) as u64;
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        let w = rng::philox4x32([b as u32, (b >> 32) as u32, 0, 0], key)[e % 4];
        if (w as f64 + 0.5) / 4_294_967_296.0 < 1.0 - self.p {
            z
        } else {
            0.0
        }
    }
}

/// The inputs of one attention, as f64 values.
struct Ctx<'a> {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    p: Option<Vec<f64>>,
    u: Vec<f64>,
    vb: Vec<f64>,
    n: AttentionDims,
    rule: AttentionRule,
    lens: Option<&'a [i64]>,
    mask: Option<&'a [u8]>,
    drop: AttentionDropout,
    z: f64,
    scale: f64,
}

impl Ctx<'_> {
    fn at_q(&self, b: usize, i: usize, h: usize) -> usize {
        ((b * self.n.t1 + i) * self.n.heads + h) * self.n.d_k
    }
    fn at_k(&self, b: usize, j: usize, h: usize) -> usize {
        ((b * self.n.t2 + j) * self.n.heads + h) * self.n.d_k
    }
    fn at_p(&self, b: usize, j: usize, h: usize) -> usize {
        self.at_k(if self.n.pos_batch == 1 { 0 } else { b }, j, h)
    }
    fn elem(&self, b: usize, h: usize, i: usize, j: usize) -> usize {
        ((b * self.n.heads + h) * self.n.t1 + i) * self.n.t2 + j
    }

    /// The softmax row P_i· of (b, h) (masked keys 0, all 0 if every key is).
    fn probs(&self, b: usize, h: usize, i: usize) -> Vec<f64> {
        let d = self.n.d_k;
        let (qi, ub, vbb) = (self.at_q(b, i, h), h * d, h * d);
        let s: Vec<Option<f64>> = (0..self.n.t2)
            .map(|j| {
                if self.rule.masked(self.lens, self.mask, b, i, j) {
                    return None;
                }
                let kj = self.at_k(b, j, h);
                let mut acc = 0.0;
                for c in 0..d {
                    match &self.p {
                        Some(p) => acc += (self.q[qi + c] + self.u[ub + c]) * self.k[kj + c] + (self.q[qi + c] + self.vb[vbb + c]) * p[self.at_p(b, j, h) + c],
                        None => acc += self.q[qi + c] * self.k[kj + c],
                    }
                }
                Some(acc * self.scale)
            })
            .collect();
        let m = s.iter().flatten().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        if m == f64::NEG_INFINITY {
            return vec![0.0; self.n.t2];
        }
        let e: Vec<f64> = s.iter().map(|x| x.map_or(0.0, |x| (x - m).exp())).collect();
        let sum: f64 = e.iter().sum();
        e.into_iter().map(|x| x / sum).collect()
    }
}

/// The gradients of one attention: dq, dk, dv in the inputs' dtype; with
/// positions dp (in p's dtype and batch), du and dvb (in u's dtype).
pub struct AttentionGrads {
    /// Gradient of q.
    pub dq: CpuStorage,
    /// Gradient of k.
    pub dk: CpuStorage,
    /// Gradient of v.
    pub dv: CpuStorage,
    /// Gradients of p, u and vb, with positions.
    pub pos: Option<(CpuStorage, CpuStorage, CpuStorage)>,
}

/// The positional inputs: p (pos_batch, t2, heads, d_k), u and vb (heads, d_k).
pub type RelPosStorage<'a> = (&'a CpuStorage, &'a CpuStorage, &'a CpuStorage);

#[allow(clippy::too_many_arguments)]
fn ctx<'a>(
    q: &CpuStorage,
    k: &CpuStorage,
    v: &CpuStorage,
    pos: Option<RelPosStorage>,
    n: AttentionDims,
    rule: AttentionRule,
    lens: Option<&'a [i64]>,
    mask: Option<&'a [u8]>,
    drop: AttentionDropout,
) -> Result<Ctx<'a>> {
    let op = "flash_attention";
    for (what, s, len) in [("q", q, n.q_len()), ("k", k, n.k_len()), ("v", v, n.k_len())] {
        if s.len() != len {
            return Err(Error::ShapeMismatch { op, expected: format!("{what} of {len} elements"), got: format!("{} elements", s.len()) });
        }
    }
    let (p, u, vb) = match pos {
        Some((p, u, vb)) => (Some(p.to_f64_vec()), u.to_f64_vec(), vb.to_f64_vec()),
        None => (None, vec![], vec![]),
    };
    Ok(Ctx {
        q: q.to_f64_vec(),
        k: k.to_f64_vec(),
        v: v.to_f64_vec(),
        p,
        u,
        vb,
        n,
        rule,
        lens,
        mask,
        drop,
        z: drop.scale(q.dtype()),
        scale: 1.0 / (n.d_k as f64).sqrt(),
    })
}

/// The attention output (batch, t1, heads, d_k) in q's dtype.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(
    q: &CpuStorage,
    k: &CpuStorage,
    v: &CpuStorage,
    pos: Option<RelPosStorage>,
    n: AttentionDims,
    rule: AttentionRule,
    lens: Option<&[i64]>,
    mask: Option<&[u8]>,
    drop: AttentionDropout,
) -> Result<CpuStorage> {
    let cx = ctx(q, k, v, pos, n, rule, lens, mask, drop)?;
    let d = n.d_k;
    let mut o = vec![0.0f64; n.q_len()];
    let per_b = n.t1 * n.heads * d;
    if per_b > 0 {
        o.par_chunks_mut(per_b).enumerate().for_each(|(b, ob)| {
            for i in 0..n.t1 {
                for h in 0..n.heads {
                    let pr = cx.probs(b, h, i);
                    let at = cx.at_q(b, i, h) - b * per_b;
                    for (j, &pj) in pr.iter().enumerate() {
                        let w = pj * cx.drop.factor(cx.z, cx.elem(b, h, i, j));
                        if w != 0.0 {
                            let vj = cx.at_k(b, j, h);
                            for c in 0..d {
                                ob[at + c] += w * cx.v[vj + c];
                            }
                        }
                    }
                }
            }
        });
    }
    Ok(CpuStorage::F64(o).to_dtype(q.dtype()))
}

/// The gradients of [`flash_attention`] for the output gradient `dout`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward(
    q: &CpuStorage,
    k: &CpuStorage,
    v: &CpuStorage,
    pos: Option<RelPosStorage>,
    dout: &CpuStorage,
    n: AttentionDims,
    rule: AttentionRule,
    lens: Option<&[i64]>,
    mask: Option<&[u8]>,
    drop: AttentionDropout,
) -> Result<AttentionGrads> {
    let cx = ctx(q, k, v, pos, n, rule, lens, mask, drop)?;
    if dout.len() != n.q_len() {
        return Err(Error::ShapeMismatch {
            op: "flash_attention_backward",
            expected: format!("an output gradient of {} elements", n.q_len()),
            got: format!("{} elements", dout.len()),
        });
    }
    let g = dout.to_f64_vec();
    let (d, hd) = (n.d_k, n.heads * n.d_k);
    let scale = cx.scale;
    // Per sequence: dq, dk, dv, dp of b, and du, dvb partial sums.
    let parts: Vec<[Vec<f64>; 6]> = (0..n.batch)
        .into_par_iter()
        .map(|b| {
            let mut dq = vec![0.0; n.t1 * hd];
            let (mut dk, mut dv, mut dp) = (vec![0.0; n.t2 * hd], vec![0.0; n.t2 * hd], vec![0.0; n.t2 * hd]);
            let (mut du, mut dvb) = (vec![0.0; hd], vec![0.0; hd]);
            for h in 0..n.heads {
                for i in 0..n.t1 {
                    let pr = cx.probs(b, h, i);
                    let qi = cx.at_q(b, i, h);
                    let z: Vec<f64> = (0..n.t2).map(|j| cx.drop.factor(cx.z, cx.elem(b, h, i, j))).collect();
                    let dpd: Vec<f64> = (0..n.t2).map(|j| (0..d).map(|c| g[qi + c] * cx.v[cx.at_k(b, j, h) + c]).sum()).collect();
                    let dsum: f64 = (0..n.t2).map(|j| pr[j] * z[j] * dpd[j]).sum();
                    for j in 0..n.t2 {
                        let ds = pr[j] * (z[j] * dpd[j] - dsum);
                        let (kj, lj) = (cx.at_k(b, j, h), (j * n.heads + h) * d);
                        let li = (i * n.heads + h) * d;
                        for c in 0..d {
                            dv[lj + c] += pr[j] * z[j] * g[qi + c];
                            match &cx.p {
                                Some(p) => {
                                    let pj = p[cx.at_p(b, j, h) + c];
                                    dq[li + c] += scale * ds * (cx.k[kj + c] + pj);
                                    dk[lj + c] += scale * ds * (cx.q[qi + c] + cx.u[h * d + c]);
                                    dp[lj + c] += scale * ds * (cx.q[qi + c] + cx.vb[h * d + c]);
                                    du[h * d + c] += scale * ds * cx.k[kj + c];
                                    dvb[h * d + c] += scale * ds * pj;
                                }
                                None => {
                                    dq[li + c] += scale * ds * cx.k[kj + c];
                                    dk[lj + c] += scale * ds * cx.q[qi + c];
                                }
                            }
                        }
                    }
                }
            }
            [dq, dk, dv, dp, du, dvb]
        })
        .collect();
    let dt = q.dtype();
    let cat = |w: usize| CpuStorage::F64(parts.iter().flat_map(|p| p[w].iter().copied()).collect()).to_dtype(dt);
    let sum = |w: usize, len: usize| {
        let mut s = vec![0.0; len];
        for p in &parts {
            s.iter_mut().zip(&p[w]).for_each(|(a, b)| *a += b);
        }
        s
    };
    let pos_grads = pos.map(|(p, u, vb)| {
        let dp = if n.pos_batch == 1 { CpuStorage::F64(sum(3, n.t2 * hd)) } else { CpuStorage::F64(parts.iter().flat_map(|x| x[3].iter().copied()).collect()) };
        (dp.to_dtype(p.dtype()), CpuStorage::F64(sum(4, hd)).to_dtype(u.dtype()), CpuStorage::F64(sum(5, hd)).to_dtype(vb.dtype()))
    });
    Ok(AttentionGrads { dq: cat(0), dk: cat(1), dv: cat(2), pos: pos_grads })
}
