//! Flash attention: scaled dot-product attention with WeNet's relative
//! positions in one op, forward and backward, on the CPU (the reference)
//! or the GPU (`cuda/attention.cu`, the score matrix never stored).
//!
//! Inputs in the projections' layout: q (B, T1, H, d_k), k and v
//! (B, T2, H, d_k); optionally positions p (1 or B, T2, H, d_k) with the
//! biases u, vb (H, d_k): scores ((q+u)·kᵀ + (q+vb)·pᵀ)/√d_k (WeNet's
//! rel_selfattn, no rel_shift), else q·kᵀ/√d_k. The mask ([`FlashMask`]:
//! key lengths, WeNet's chunk mask, causal, a u8 mask tensor, any
//! together); softmax over the unmasked keys (masked keys exactly 0, a fully
//! masked row all zeros); attention dropout drawn from the thread's
//! counter-based generator over the (B, H, T1, T2) weights, the words
//! `ops::dropout` would draw there, redrawn in backward; output
//! (B, T1, H, d_k). The composition it replaces: `ops::matmul_pair_scaled`
//! + `ops::masked_softmax` + `ops::dropout` + `ops::matmul`.
//!
//! Packed operands ([`flash_attention_qkv`], [`flash_attention_q_kv`]): q, k
//! and v as column blocks of one projection's output, (B, T, 3·H·d_k) for
//! self-attention or (B, T2, 2·H·d_k) for keys and values, which the GPU
//! kernels read in place and whose gradient they write in place (one
//! buffer, no split or concatenation); on the CPU these are the narrows
//! into q, k, v and [`flash_attention`], the reference.

use super::{out_storage, to_dtype};
use crate::autograd::{no_grad, record};
use crate::backend::cpu::attention::{self as cpu, AttentionDims, AttentionDropout, AttentionRule};
use crate::backend::cuda::attention::{self as gpu, MaskGpu, QkvGrads, QkvLayout};
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{rng, DType, Shape, Tensor};

/// Which keys each query must not see; every part given applies.
#[derive(Clone, Debug, Default)]
pub struct FlashMask {
    /// Key `j` of sequence `b` is masked when `j >= key_lengths[b]`.
    pub key_lengths: Option<Vec<usize>>,
    /// WeNet's chunk mask: (frames per chunk, left chunks visible, < 0 all).
    pub chunk: Option<(usize, i64)>,
    /// Query `i` sees no key after `i` (the decoder's self-attention).
    pub causal: bool,
    /// A u8 mask (1 = masked) broadcastable to (B, 1, T1, T2), as
    /// `nn::AttentionMask`'s.
    pub mask: Option<Tensor>,
    /// `key_lengths` as an i64 (B) tensor already on the operands' device,
    /// used instead of a copy up per call (`nn::AttentionMask` keeps one
    /// for every layer it masks); the caller's promise: the same lengths.
    pub key_lengths_on_device: Option<Tensor>,
}

/// WeNet's positional term: p (1 or B, T2, H, d_k) and the biases u, vb (H, d_k).
#[derive(Clone, Copy, Debug)]
pub struct RelPos<'a> {
    /// The projected positions.
    pub p: &'a Tensor,
    /// The content bias (`pos_bias_u`).
    pub u: &'a Tensor,
    /// The position bias (`pos_bias_v`).
    pub vb: &'a Tensor,
}

/// How q, k and v come in: three (B, T, H, d_k) tensors, one packed
/// self-attention projection (B, T, 3·H·d_k), or q and a packed key/value
/// projection (B, T2, 2·H·d_k).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Packing {
    Dense,
    Qkv,
    Kv,
}

impl Packing {
    /// Which of the op's inputs holds q, k and v.
    fn sources(self) -> [usize; 3] {
        match self {
            Packing::Dense => [0, 1, 2],
            Packing::Qkv => [0, 0, 0],
            Packing::Kv => [0, 1, 1],
        }
    }
    fn layout(self, n: &AttentionDims) -> QkvLayout {
        match self {
            Packing::Dense => QkvLayout::dense(n),
            Packing::Qkv => QkvLayout::packed_qkv(n),
            Packing::Kv => QkvLayout::packed_kv(n),
        }
    }
}

fn bad_shape(op: &'static str, what: &str, t: &Tensor, want: String) -> Error {
    Error::ShapeMismatch { op, expected: format!("{what} {want}"), got: format!("{}", t.shape()) }
}

/// (B, T, n·heads·d_k) → (B, T, d_k) of a packed projection of `n` blocks.
fn packed_dims(op: &'static str, what: &str, x: &Tensor, blocks: usize, heads: usize) -> Result<[usize; 3]> {
    let w = x.dims().last().copied().unwrap_or(0);
    if x.rank() != 3 || heads == 0 || w % (blocks * heads) != 0 {
        return Err(bad_shape(op, what, x, format!("(B, T, {blocks}·{heads}·d_k)")));
    }
    Ok([x.dims()[0], x.dims()[1], w / (blocks * heads)])
}

/// The sizes of q, k and v given as `xs` packed as `packing` says.
fn shape_of(op: &'static str, packing: Packing, xs: &[&Tensor], heads: usize) -> Result<[usize; 5]> {
    match packing {
        Packing::Dense => {
            let (q, k, v) = (xs[0], xs[1], xs[2]);
            if q.rank() != 4 {
                return Err(bad_shape(op, "q", q, "(B, T1, H, d_k)".into()));
            }
            let [b, t1, h, d] = [q.dims()[0], q.dims()[1], q.dims()[2], q.dims()[3]];
            if k.rank() != 4 || k.dims()[0] != b || k.dims()[2] != h || k.dims()[3] != d {
                return Err(bad_shape(op, "k", k, format!("({b}, T2, {h}, {d})")));
            }
            if v.dims() != k.dims() {
                return Err(bad_shape(op, "v", v, format!("{}", k.shape())));
            }
            Ok([b, t1, k.dims()[1], h, d])
        }
        Packing::Qkv => {
            let [b, t, d] = packed_dims(op, "qkv", xs[0], 3, heads)?;
            Ok([b, t, t, heads, d])
        }
        Packing::Kv => {
            let q = xs[0];
            if q.rank() != 4 {
                return Err(bad_shape(op, "q", q, "(B, T1, H, d_k)".into()));
            }
            let [b, t1, h, d] = [q.dims()[0], q.dims()[1], q.dims()[2], q.dims()[3]];
            let [kb, t2, kd] = packed_dims(op, "kv", xs[1], 2, h)?;
            if kb != b || kd != d {
                return Err(bad_shape(op, "kv", xs[1], format!("({b}, T2, {})", 2 * h * d)));
            }
            Ok([b, t1, t2, h, d])
        }
    }
}

fn dims_of(op: &'static str, packing: Packing, xs: &[&Tensor], heads: usize, pos: Option<&RelPos>) -> Result<AttentionDims> {
    let bad = |what: &str, t: &Tensor, want: String| bad_shape(op, what, t, want);
    let [b, t1, t2, h, d] = shape_of(op, packing, xs, heads)?;
    let q = xs[0];
    if b * t1 * t2 * h * d == 0 {
        let shapes: Vec<String> = xs.iter().map(|x| format!("{}", x.shape())).collect();
        return Err(Error::invalid(op, format!("expected non-empty operands, found {}", shapes.join(", "))));
    }
    for x in &xs[1..] {
        super::same_kind(op, q, x)?;
    }
    if !q.dtype().is_float() {
        return Err(Error::UnsupportedDType { op, dtype: q.dtype(), supported: "f32, f64, f16, bf16" });
    }
    let mut pos_batch = 0;
    if let Some(r) = pos {
        let pb = r.p.dims().first().copied().unwrap_or(0);
        if r.p.rank() != 4 || (pb != 1 && pb != b) || r.p.dims()[1..] != [t2, h, d] {
            return Err(bad("p", r.p, format!("(1 or {b}, {t2}, {h}, {d})")));
        }
        super::same_kind(op, q, r.p)?;
        for (what, t) in [("u", r.u), ("vb", r.vb)] {
            if t.dims() != [h, d] {
                return Err(bad(what, t, format!("({h}, {d})")));
            }
            if !t.dtype().is_float() {
                return Err(Error::UnsupportedDType { op, dtype: t.dtype(), supported: "f32, f64, f16, bf16" });
            }
            if t.device() != q.device() {
                return Err(Error::DeviceMismatch { op, lhs: q.device(), rhs: t.device() });
            }
        }
        pos_batch = pb;
    }
    Ok(AttentionDims { batch: b, t1, t2, heads: h, d_k: d, pos_batch })
}

/// The rule of `m` and its key lengths (i64) and mask tensor (u8, host).
fn rule_of(op: &'static str, m: &FlashMask, n: &AttentionDims) -> Result<(AttentionRule, Option<Vec<i64>>, Option<Tensor>)> {
    let mut rule = AttentionRule { causal: m.causal, left_chunks: -1, ..Default::default() };
    if let Some((c, l)) = m.chunk {
        if c == 0 {
            return Err(Error::invalid(op, "expected a chunk size >= 1, found 0"));
        }
        rule.chunk = c;
        rule.left_chunks = l.max(-1);
    }
    let lens = match &m.key_lengths {
        Some(l) if l.len() != n.batch => {
            return Err(Error::ShapeMismatch { op, expected: format!("{} key lengths", n.batch), got: format!("{}", l.len()) });
        }
        Some(l) => Some(l.iter().map(|&x| x as i64).collect()),
        None => None,
    };
    let mask = match &m.mask {
        Some(t) => {
            if t.dtype() != DType::U8 {
                return Err(Error::DTypeMismatch { op, expected: DType::U8, got: t.dtype() });
            }
            let target = Shape::from(vec![n.batch, 1, n.t1, n.t2]);
            if Shape::broadcast(op, &target, t.shape())? != target {
                return Err(Error::Broadcast { op, lhs: target.clone(), rhs: t.shape().clone() });
            }
            let s = t.shape().broadcast_strides(&target);
            rule.mask_strides = [s[0], s[2], s[3]];
            Some(t.clone())
        }
        None => None,
    };
    Ok((rule, lens, mask))
}

/// Everything the backward needs, kept on the tape.
struct Saved {
    /// The op's q/k/v inputs, packed as `packing` says.
    xs: Vec<Tensor>,
    packing: Packing,
    pos: Option<(Tensor, Tensor, Tensor)>,
    o: Tensor,
    lse: Option<Tensor>,
    n: AttentionDims,
    rule: AttentionRule,
    lens: Option<Tensor>,
    mask: Option<Tensor>,
    drop: AttentionDropout,
}

/// Attention of q over k and v with the optional relative positions, the
/// mask and attention dropout (probability `dropout` when `training`); see
/// the module comment. Gradients flow to q, k, v, p, u and vb.
pub fn flash_attention(q: &Tensor, k: &Tensor, v: &Tensor, pos: Option<RelPos>, mask: &FlashMask, dropout: f64, training: bool) -> Result<Tensor> {
    attention(Packing::Dense, &[q, k, v], 0, pos, mask, dropout, training)
}

/// [`flash_attention`] of one packed self-attention projection `qkv`
/// (B, T, 3·heads·d_k): q, k and v are its column blocks in that order
/// (heads of d_k columns each), the gradient comes back packed the same way.
/// On the GPU the kernels read q, k, v and write their gradients in place;
/// on the CPU this is the narrows and [`flash_attention`].
pub fn flash_attention_qkv(qkv: &Tensor, heads: usize, pos: Option<RelPos>, mask: &FlashMask, dropout: f64, training: bool) -> Result<Tensor> {
    attention(Packing::Qkv, &[qkv], heads, pos, mask, dropout, training)
}

/// [`flash_attention`] of q (B, T1, H, d_k) over one packed key/value
/// projection `kv` (B, T2, 2·H·d_k): k and v are its two column blocks.
/// On the GPU the kernels read them and write their gradients in place; on
/// the CPU this is the narrows and [`flash_attention`].
pub fn flash_attention_q_kv(q: &Tensor, kv: &Tensor, pos: Option<RelPos>, mask: &FlashMask, dropout: f64, training: bool) -> Result<Tensor> {
    attention(Packing::Kv, &[q, kv], 0, pos, mask, dropout, training)
}

/// Block `i` of `blocks` (B, T, blocks·H·d) → (B, T, H, d): a packed operand
/// as its own tensor (the CPU's composition of the packed ops).
fn unpack(x: &Tensor, blocks: usize, i: usize, h: usize, d: usize) -> Result<Tensor> {
    let (b, t) = (x.dims()[0], x.dims()[1]);
    super::reshape(&super::narrow(&super::reshape(x, [b, t, blocks, h, d])?, 2, i, 1)?, [b, t, h, d])
}

#[allow(clippy::too_many_arguments)]
fn attention(packing: Packing, xs: &[&Tensor], heads: usize, pos: Option<RelPos>, mask: &FlashMask, dropout: f64, training: bool) -> Result<Tensor> {
    let op = "flash_attention";
    let n = dims_of(op, packing, xs, heads, pos.as_ref())?;
    if packing != Packing::Dense && xs[0].device() == crate::tensor::Device::Cpu {
        let (h, d) = (n.heads, n.d_k);
        return match packing {
            Packing::Qkv => {
                let [q, k, v] = [0, 1, 2].map(|i| unpack(xs[0], 3, i, h, d));
                flash_attention(&q?, &k?, &v?, pos, mask, dropout, training)
            }
            _ => flash_attention(xs[0], &unpack(xs[1], 2, 0, h, d)?, &unpack(xs[1], 2, 1, h, d)?, pos, mask, dropout, training),
        };
    }
    let q = xs[0];
    if !(0.0..=1.0).contains(&dropout) {
        return Err(Error::invalid(op, format!("expected 0 <= dropout <= 1, got {dropout}")));
    }
    let (rule, lens, mask_t) = rule_of(op, mask, &n)?;
    let drop = if training && dropout > 0.0 {
        let (seed, offset) = rng::with_default(|r| (r.seed, r.advance(n.batch * n.heads * n.t1 * n.t2)));
        AttentionDropout { p: dropout, seed, offset }
    } else {
        AttentionDropout::NONE
    };
    let dev = q.device();
    let kept = mask.key_lengths_on_device.as_ref().filter(|t| t.device() == dev && t.dtype() == DType::I64 && t.dims() == [n.batch]);
    let lens_t = match (lens, kept) {
        (Some(_), Some(t)) => Some(t.clone()),
        (l, _) => l.map(|l| Tensor::from_vec(l, [n.batch], &dev)).transpose()?,
    };
    let mask_t = mask_t.map(|m| m.detach().to_device(&dev)).transpose()?;
    // The biases in the compute type on the GPU (the kernels read them so).
    let pos_t = match pos {
        Some(r) => {
            let (u, vb) = if matches!(q.device(), crate::tensor::Device::Cuda(_)) {
                let acc = gpu::acc_dtype(q.dtype());
                no_grad(|| Ok::<_, Error>((to_dtype(&r.u.detach(), acc)?, to_dtype(&r.vb.detach(), acc)?)))?
            } else {
                (r.u.detach(), r.vb.detach())
            };
            Some((r.p.detach(), u, vb))
        }
        None => None,
    };
    let (o, lse) = forward(packing, xs, pos_t.as_ref(), &n, &rule, lens_t.as_ref(), mask_t.as_ref(), &drop)?;
    let saved = Saved { xs: xs.iter().map(|x| x.detach()).collect(), packing, pos: pos_t, o: o.detach(), lse, n, rule, lens: lens_t, mask: mask_t, drop };
    let mut inputs = xs.to_vec();
    let mut dtypes = vec![];
    if let Some(r) = &pos {
        inputs.extend([r.p, r.u, r.vb]);
        dtypes = vec![r.u.dtype(), r.vb.dtype()];
    }
    Ok(record(op, &inputs, o, vec![], move |g, _| backward(&saved, g, &dtypes)))
}

#[allow(clippy::too_many_arguments)]
fn forward(
    packing: Packing,
    xs: &[&Tensor],
    pos: Option<&(Tensor, Tensor, Tensor)>,
    n: &AttentionDims,
    rule: &AttentionRule,
    lens: Option<&Tensor>,
    mask: Option<&Tensor>,
    drop: &AttentionDropout,
) -> Result<(Tensor, Option<Tensor>)> {
    let op = "flash_attention";
    let oshape = Shape::from(vec![n.batch, n.t1, n.heads, n.d_k]);
    // One guard per input (a packed input is q, k and v at once).
    let guards: Vec<_> = xs.iter().map(|x| x.storage()).collect();
    let [qi, ki, vi] = packing.sources();
    let ps = pos.map(|(p, u, vb)| (p.storage(), u.storage(), vb.storage()));
    match (&*guards[qi], &*guards[ki], &*guards[vi]) {
        (Storage::Cpu(qc), Storage::Cpu(kc), Storage::Cpu(vc)) if packing == Packing::Dense => {
            let lens_v = lens.map(|l| l.to_vec::<i64>()).transpose()?;
            let mask_v = mask.map(|m| m.to_vec::<u8>()).transpose()?;
            let pc = match &ps {
                Some((p, u, vb)) => Some((cpu_of(op, p)?, cpu_of(op, u)?, cpu_of(op, vb)?)),
                None => None,
            };
            let o = cpu::flash_attention(qc, kc, vc, pc, *n, *rule, lens_v.as_deref(), mask_v.as_deref(), *drop)?;
            Ok((out_storage(Storage::Cpu(o), oshape), None))
        }
        (Storage::Cuda(qg), Storage::Cuda(kg), Storage::Cuda(vg)) => {
            let (ls, ms) = (lens.map(|l| l.storage()), mask.map(|m| m.storage()));
            let m = MaskGpu { lens: ls.as_deref().map(|s| gpu_of(op, s)).transpose()?, mask: ms.as_deref().map(|s| gpu_of(op, s)).transpose()? };
            let pg = match &ps {
                Some((p, u, vb)) => Some((gpu_of(op, p)?, gpu_of(op, u)?, gpu_of(op, vb)?)),
                None => None,
            };
            let (o, lse) = gpu::flash_attention(qg, kg, vg, &packing.layout(n), pg, n, rule, m, drop)?;
            Ok((out_storage(Storage::Cuda(o), oshape), Some(out_storage(Storage::Cuda(lse), [n.batch, n.heads, n.t1]))))
        }
        _ => Err(super::mixed(op)),
    }
}

fn cpu_of<'a>(op: &'static str, s: &'a Storage) -> Result<&'a crate::backend::cpu::CpuStorage> {
    match s {
        Storage::Cpu(c) => Ok(c),
        Storage::Cuda(_) => Err(super::mixed(op)),
    }
}

fn gpu_of<'a>(op: &'static str, s: &'a Storage) -> Result<&'a crate::backend::cuda::CudaStorage> {
    match s {
        Storage::Cuda(c) => Ok(c),
        Storage::Cpu(_) => Err(super::mixed(op)),
    }
}

fn backward(s: &Saved, g: &Tensor, bias_dtypes: &[DType]) -> Result<Vec<Option<Tensor>>> {
    let op = "flash_attention_backward";
    let n = &s.n;
    let g = if g.device() == s.xs[0].device() { g.clone() } else { return Err(super::mixed(op)) };
    let guards: Vec<_> = s.xs.iter().map(|x| x.storage()).collect();
    let [qi, ki, vi] = s.packing.sources();
    let gs = g.storage();
    let ps = s.pos.as_ref().map(|(p, u, vb)| (p.storage(), u.storage(), vb.storage()));
    match (&*guards[qi], &*guards[ki], &*guards[vi], &*gs) {
        (Storage::Cpu(qc), Storage::Cpu(kc), Storage::Cpu(vc), Storage::Cpu(gc)) if s.packing == Packing::Dense => {
            let kshape = s.xs[1].shape().clone();
            let gc = if gc.dtype() == qc.dtype() { gc.clone() } else { gc.to_dtype(qc.dtype()) };
            let lens_v = s.lens.as_ref().map(|l| l.to_vec::<i64>()).transpose()?;
            let mask_v = s.mask.as_ref().map(|m| m.to_vec::<u8>()).transpose()?;
            let pc = match &ps {
                Some((p, u, vb)) => Some((cpu_of(op, p)?, cpu_of(op, u)?, cpu_of(op, vb)?)),
                None => None,
            };
            let gr = cpu::flash_attention_backward(qc, kc, vc, pc, &gc, *n, s.rule, lens_v.as_deref(), mask_v.as_deref(), s.drop)?;
            let mut out = vec![
                Some(out_storage(Storage::Cpu(gr.dq), s.xs[0].shape().clone())),
                Some(out_storage(Storage::Cpu(gr.dk), kshape.clone())),
                Some(out_storage(Storage::Cpu(gr.dv), kshape)),
            ];
            if let (Some((dp, du, dvb)), Some((p, u, vb))) = (gr.pos, &s.pos) {
                out.push(Some(out_storage(Storage::Cpu(dp), p.shape().clone())));
                out.push(Some(out_storage(Storage::Cpu(du), u.shape().clone())));
                out.push(Some(out_storage(Storage::Cpu(dvb), vb.shape().clone())));
            }
            Ok(out)
        }
        (Storage::Cuda(qg), Storage::Cuda(kg), Storage::Cuda(vg), Storage::Cuda(gg)) => {
            let lse = s.lse.as_ref().ok_or_else(|| Error::invalid(op, "expected the forward's log-sum-exp on the GPU"))?;
            let (os, lses) = (s.o.storage(), lse.storage());
            let (ls, ms) = (s.lens.as_ref().map(|l| l.storage()), s.mask.as_ref().map(|m| m.storage()));
            let m = MaskGpu { lens: ls.as_deref().map(|x| gpu_of(op, x)).transpose()?, mask: ms.as_deref().map(|x| gpu_of(op, x)).transpose()? };
            let pg = match &ps {
                Some((p, u, vb)) => Some((gpu_of(op, p)?, gpu_of(op, u)?, gpu_of(op, vb)?)),
                None => None,
            };
            let gg_conv;
            let gg = if gg.dtype() == qg.dtype() {
                gg
            } else {
                gg_conv = crate::backend::cuda::cast::to_dtype(gg, qg.dtype())?;
                &gg_conv
            };
            // One gradient buffer per input, shaped as it: a packed input's
            // column blocks are written by the kernels in place, every element.
            let dev = qg.device();
            let grads = s.xs.iter().map(|x| dev.alloc(qg.dtype(), x.elem_count())).collect::<Result<Vec<_>>>()?;
            let dst = QkvGrads { dq: &grads[qi], dk: &grads[ki], dv: &grads[vi] };
            let layout = s.packing.layout(n);
            let gr = gpu::flash_attention_backward(qg, kg, vg, &layout, dst, pg, gpu_of(op, &os)?, gpu_of(op, &lses)?, gg, n, &s.rule, m, &s.drop)?;
            let mut out: Vec<Option<Tensor>> = grads.into_iter().zip(&s.xs).map(|(d, x)| Some(out_storage(Storage::Cuda(d), x.shape().clone()))).collect();
            if let (Some((dp, du, dvb)), Some((p, _, _))) = (gr, &s.pos) {
                // attention_pos_grads summed dp over the batch for a shared
                // table and gave du = Σ s·k, dvb = Σ s·p in the compute type.
                let hd = [n.heads, n.d_k];
                let (du, dvb) = (out_storage(Storage::Cuda(du), hd), out_storage(Storage::Cuda(dvb), hd));
                let (du, dvb) = no_grad(|| -> Result<_> { Ok((to_dtype(&du, bias_dtypes[0])?, to_dtype(&dvb, bias_dtypes[1])?)) })?;
                out.extend([Some(out_storage(Storage::Cuda(dp), p.shape().clone())), Some(du), Some(dvb)]);
            }
            Ok(out)
        }
        _ => Err(super::mixed(op)),
    }
}
