//! Flash attention on the GPU (`cuda/attention.cu`): one forward kernel
//! (output and log-sum-exp, the score matrix never stored) and two backward
//! kernels (dq, then dk/dv/dp, each recomputing the scores per tile);
//! mirrors `backend::cpu::attention`. f16 and bf16 are read and written in
//! half and computed in f32. The kernels' blocks grid-stride over
//! (sequence, head, tile), so any grid covers them.
//!
//! Three kernel sets: scalar tiles (every dtype, any head dim up to
//! [`MAX_D_K`]) and tensor-core tiles in two widths (f16 and bf16, head
//! dims a multiple of 16): `*_wmma64` for head dims up to 64, `*_wmma` up
//! to 128. [`kernel_for`] picks: the narrowest wmma set that applies,
//! unless `ASRFORGE_ATTENTION_KERNEL` (read once per process) or
//! [`set_kernel_override`] on the calling thread says otherwise.

use super::nn_common::{expect_dtype, expect_len, same, FLOATS};
use super::{kernels, CudaStorage, LaunchConfig};
use crate::backend::cpu::attention::{AttentionDims, AttentionDropout, AttentionRule};
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Threads per block (`ATT_THREADS`).
const THREADS: u32 = 128;
/// The largest head dim (`ATT_DMAX`).
pub const MAX_D_K: usize = 128;

/// The largest head dim of the 64-wide wmma set (`attention_*_wmma64`).
pub const WMMA64_MAX_D_K: usize = 64;

/// Query rows per block of the wmma kernels (`ATW_QT`).
const WMMA_QUERY_TILE: usize = 64;
/// Key rows per block of the wmma backward's dk/dv kernel (`ATW_KT`).
const WMMA_KEY_TILE: usize = 32;

/// The kernel sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Scalar tiles (`attention_fwd`...): every dtype and head dim.
    Scalar,
    /// Tensor-core tiles 128 columns wide (`attention_fwd_wmma`...): f16 and
    /// bf16 with a head dim a multiple of 16 up to [`MAX_D_K`]; elsewhere
    /// the scalar set runs.
    Wmma,
    /// Tensor-core tiles 64 columns wide (`attention_fwd_wmma64`...): the
    /// `Wmma` kernels with their fragments and shared tiles sized for head
    /// dims up to [`WMMA64_MAX_D_K`] (the same bits as `Wmma` there, with
    /// about half its registers; ptxas, sm_90); for wider heads `Wmma` runs.
    Wmma64,
}

thread_local! {
    static OVERRIDE: std::cell::Cell<Option<AttentionKernel>> = const { std::cell::Cell::new(None) };
}

/// Forces (`Some`) or stops forcing (`None`) a kernel set for the attention
/// launches of the calling thread, over `ASRFORGE_ATTENTION_KERNEL` (tests
/// and benches compare the two sets in one process this way).
pub fn set_kernel_override(k: Option<AttentionKernel>) {
    OVERRIDE.with(|o| o.set(k));
}

/// `ASRFORGE_ATTENTION_KERNEL`: `scalar`, `wmma`, `wmma64` or `auto` (unset: auto).
fn env_kernel() -> Option<AttentionKernel> {
    static K: std::sync::OnceLock<Option<AttentionKernel>> = std::sync::OnceLock::new();
    *K.get_or_init(|| match std::env::var("ASRFORGE_ATTENTION_KERNEL").as_deref().map(str::trim) {
        Err(_) | Ok("auto") | Ok("") => None,
        Ok("scalar") => Some(AttentionKernel::Scalar),
        Ok("wmma") => Some(AttentionKernel::Wmma),
        Ok("wmma64") => Some(AttentionKernel::Wmma64),
        Ok(v) => {
            eprintln!("warning: ASRFORGE_ATTENTION_KERNEL={v:?} is not scalar, wmma, wmma64 or auto; using auto");
            None
        }
    })
}

/// The kernel set that runs for `dt` and head dim `d_k`. For f16/bf16 with
/// `d_k % 16 == 0`: `Wmma64` up to [`WMMA64_MAX_D_K`], `Wmma` above, unless
/// the thread's override or the environment asks for `Scalar` or `Wmma`
/// (forcing `Wmma64` on a wider head runs `Wmma`). Scalar otherwise (also
/// when a wmma set is forced).
pub fn kernel_for(dt: DType, d_k: usize) -> AttentionKernel {
    let fits = matches!(dt, DType::F16 | DType::BF16) && d_k % 16 == 0 && d_k > 0 && d_k <= MAX_D_K;
    let want = OVERRIDE.with(|o| o.get()).or_else(env_kernel).unwrap_or(AttentionKernel::Wmma64);
    match want {
        _ if !fits => AttentionKernel::Scalar,
        AttentionKernel::Wmma64 if d_k <= WMMA64_MAX_D_K => AttentionKernel::Wmma64,
        AttentionKernel::Wmma | AttentionKernel::Wmma64 => AttentionKernel::Wmma,
        AttentionKernel::Scalar => AttentionKernel::Scalar,
    }
}

/// Rows per tile (`AttTile`): 8 in f64, else 16.
fn tile(dt: DType) -> usize {
    if dt == DType::F64 {
        8
    } else {
        16
    }
}

/// The compute type of `dt` (the log-sum-exp's, the biases', dp's).
pub fn acc_dtype(dt: DType) -> DType {
    if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The positional inputs on the GPU: p (pos_batch, t2, heads, d_k) in q's
/// dtype, u and vb (heads, d_k) in the compute type.
pub type RelPosGpu<'a> = (&'a CudaStorage, &'a CudaStorage, &'a CudaStorage);

/// Key lengths (i64, batch) and a u8 mask laid out by the rule's strides.
#[derive(Clone, Copy, Default)]
pub struct MaskGpu<'a> {
    /// Key lengths per sequence.
    pub lens: Option<&'a CudaStorage>,
    /// A u8 mask, 1 = masked.
    pub mask: Option<&'a CudaStorage>,
}

/// Where q, k and v sit in their buffers (`cuda/attention.cu`'s operand
/// layouts, in elements): row (b, i) of q at `(b·T1 + i)·q_ld + q_off`, row
/// (b, j) of k at `(b·T2 + j)·kv_ld + k_off` and of v at `... + v_off`; the
/// gradients dq, dk, dv are written with the same layouts. The buffers may
/// be one: a packed projection (B, T, 3·H·d) holds q, k and v side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvLayout {
    /// Row stride of q (and dq).
    pub q_ld: usize,
    /// Row stride of k and v (and dk, dv).
    pub kv_ld: usize,
    /// Column offset of q in its rows.
    pub q_off: usize,
    /// Column offset of k in its rows.
    pub k_off: usize,
    /// Column offset of v in its rows.
    pub v_off: usize,
}

impl QkvLayout {
    /// Separate (B, T, H, d) buffers: rows of H·d, no offsets.
    pub fn dense(n: &AttentionDims) -> QkvLayout {
        let hd = n.heads * n.d_k;
        QkvLayout { q_ld: hd, kv_ld: hd, q_off: 0, k_off: 0, v_off: 0 }
    }
    /// One self-attention projection (B, T, 3·H·d): q, k, v side by side.
    pub fn packed_qkv(n: &AttentionDims) -> QkvLayout {
        let hd = n.heads * n.d_k;
        QkvLayout { q_ld: 3 * hd, kv_ld: 3 * hd, q_off: 0, k_off: hd, v_off: 2 * hd }
    }
    /// q (B, T1, H·d) alone and one key/value projection (B, T2, 2·H·d).
    pub fn packed_kv(n: &AttentionDims) -> QkvLayout {
        let hd = n.heads * n.d_k;
        QkvLayout { q_ld: hd, kv_ld: 2 * hd, q_off: 0, k_off: 0, v_off: hd }
    }
    /// Checks that each operand's H·d columns fit its row and that its
    /// buffer holds exactly its rows.
    fn check(&self, op: &'static str, n: &AttentionDims, q: &CudaStorage, k: &CudaStorage, v: &CudaStorage) -> Result<()> {
        let hd = n.heads * n.d_k;
        let (qr, kr) = (n.batch * n.t1, n.batch * n.t2);
        for (what, buf, rows, ld, off) in [("q", q, qr, self.q_ld, self.q_off), ("k", k, kr, self.kv_ld, self.k_off), ("v", v, kr, self.kv_ld, self.v_off)] {
            if off + hd > ld {
                return Err(Error::invalid(op, format!("expected {what}'s {hd} columns at offset {off} to fit its row stride {ld}")));
            }
            expect_len(op, what, buf, rows * ld)?;
        }
        Ok(())
    }
}

fn units(n: &AttentionDims, rows: usize, dt: DType) -> usize {
    n.batch * n.heads * rows.div_ceil(tile(dt))
}

fn units_of(n: &AttentionDims, rows: usize, tile: usize) -> usize {
    n.batch * n.heads * rows.div_ceil(tile)
}

fn cfg(units: usize) -> LaunchConfig {
    LaunchConfig { grid: (units.clamp(1, super::launch::max_grid() as usize) as u32, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 }
}

/// The leading parameters every attention kernel takes (ATT_PARAMS), checked
/// and resolved: absent optional inputs are replaced by valid buffers of
/// the parameter's type that the kernel never reads (as `flags` says).
struct Common<'a> {
    q: &'a CudaStorage,
    k: &'a CudaStorage,
    v: &'a CudaStorage,
    p: &'a CudaStorage,
    flags: u32,
    u: &'a CudaStorage,
    vb: &'a CudaStorage,
    dims: [u32; 5],
    scale: f64,
    lens: &'a CudaStorage,
    chunk: u32,
    left: i32,
    causal: u32,
    mask: &'a CudaStorage,
    strides: [u64; 3],
    seed: u64,
    offset: u64,
    keep: f64,
    dscale: f64,
    layout: [u64; 5],
}

/// Stand-ins for absent optional inputs: one element of the compute type
/// (for u and vb), of i64 (the key lengths) and of u8 (the mask).
struct Dummies {
    acc: CudaStorage,
    lens: CudaStorage,
    mask: CudaStorage,
}

impl Dummies {
    fn new(q: &CudaStorage) -> Result<Dummies> {
        let dev = q.device();
        Ok(Dummies { acc: dev.alloc(acc_dtype(q.dtype()), 1)?, lens: dev.alloc(DType::I64, 1)?, mask: dev.alloc(DType::U8, 1)? })
    }
}

/// Checks the operands and resolves the parameters every kernel starts with.
#[allow(clippy::too_many_arguments)]
fn common<'a>(
    op: &'static str,
    q: &'a CudaStorage,
    k: &'a CudaStorage,
    v: &'a CudaStorage,
    layout: &QkvLayout,
    pos: Option<RelPosGpu<'a>>,
    n: &AttentionDims,
    rule: &AttentionRule,
    m: MaskGpu<'a>,
    drop: &AttentionDropout,
    dummies: &'a Dummies,
) -> Result<Common<'a>> {
    expect_dtype(op, q, FLOATS)?;
    same(op, q, k)?;
    same(op, q, v)?;
    layout.check(op, n, q, k, v)?;
    if n.d_k == 0 || n.d_k > MAX_D_K {
        return Err(Error::invalid(op, format!("expected a head dim in 1..={MAX_D_K} (the CUDA kernel's tiles), found {}", n.d_k)));
    }
    let acc = acc_dtype(q.dtype());
    if let Some((p, u, vb)) = pos {
        same(op, q, p)?;
        expect_len(op, "p", p, n.pos_batch * n.t2 * n.heads * n.d_k)?;
        for (what, b) in [("u", u), ("vb", vb)] {
            if b.dtype() != acc {
                return Err(Error::DTypeMismatch { op, expected: acc, got: b.dtype() });
            }
            expect_len(op, what, b, n.heads * n.d_k)?;
        }
    }
    if let Some(l) = m.lens {
        if l.dtype() != DType::I64 {
            return Err(Error::DTypeMismatch { op, expected: DType::I64, got: l.dtype() });
        }
        expect_len(op, "the key lengths", l, n.batch)?;
    }
    if let Some(mk) = m.mask {
        if mk.dtype() != DType::U8 {
            return Err(Error::DTypeMismatch { op, expected: DType::U8, got: mk.dtype() });
        }
        let [sb, si, sj] = rule.mask_strides;
        let last = n.batch.saturating_sub(1) * sb + n.t1.saturating_sub(1) * si + n.t2.saturating_sub(1) * sj;
        if n.batch * n.t1 * n.t2 > 0 && last >= mk.len() {
            return Err(Error::ShapeMismatch { op, expected: format!("a mask of more than {last} bytes"), got: format!("{} bytes", mk.len()) });
        }
    }
    let u32a = |what: &str, x: usize| super::nn_common::u32_arg(op, what, x);
    let flags = u32::from(pos.is_some())
        | (u32::from(pos.is_some() && n.pos_batch == n.batch && n.batch > 1) << 1)
        | (u32::from(m.lens.is_some()) << 2)
        | (u32::from(m.mask.is_some()) << 3);
    let (p, u, vb) = match pos {
        Some((p, u, vb)) => (p, u, vb),
        None => (q, &dummies.acc, &dummies.acc),
    };
    Ok(Common {
        q,
        k,
        v,
        p,
        flags,
        u,
        vb,
        dims: [u32a("batch", n.batch)?, u32a("t1", n.t1)?, u32a("t2", n.t2)?, u32a("heads", n.heads)?, u32a("d_k", n.d_k)?],
        scale: 1.0 / (n.d_k as f64).sqrt(),
        lens: m.lens.unwrap_or(&dummies.lens),
        chunk: u32a("chunk size", rule.chunk)?,
        left: rule.left_chunks.clamp(-1, i32::MAX as i64) as i32,
        causal: u32::from(rule.causal),
        mask: m.mask.unwrap_or(&dummies.mask),
        strides: [rule.mask_strides[0] as u64, rule.mask_strides[1] as u64, rule.mask_strides[2] as u64],
        seed: drop.seed,
        offset: drop.offset,
        keep: 1.0 - drop.p,
        dscale: if drop.p < 1.0 { 1.0 / (1.0 - drop.p) } else { 0.0 },
        layout: [layout.q_ld as u64, layout.kv_ld as u64, layout.q_off as u64, layout.k_off as u64, layout.v_off as u64],
    })
}

/// Launches `kernels::attention::$kernel` with the resolved leading
/// parameters of [`Common`] (ATT_PARAMS) followed by the kernel's own.
macro_rules! launch_att {
    ($kernel:ident, $dev:expr, $dt:expr, $cfg:expr, $c:expr, $($rest:expr),+ $(,)?) => {{
        let c = &$c;
        let [b, t1, t2, h, d] = c.dims;
        let [mb, mi, mj] = c.strides;
        let [q_ld, kv_ld, q_off, k_off, v_off] = c.layout;
        kernels::attention::$kernel(
            $dev, $dt, $cfg, c.q, c.k, c.v, c.p, c.flags, c.u, c.vb, b, t1, t2, h, d, c.scale, c.lens, c.chunk, c.left, c.causal, c.mask, mb, mi, mj,
            c.seed, c.offset, c.keep, c.dscale, q_ld, kv_ld, q_off, k_off, v_off, $($rest),+
        )
    }};
}

/// The output (batch, t1, heads, d_k) in q's dtype and the log-sum-exp
/// (batch, heads, t1) in the compute type (+inf for a fully masked row);
/// q, k and v are read where `layout` says.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(
    q: &CudaStorage,
    k: &CudaStorage,
    v: &CudaStorage,
    layout: &QkvLayout,
    pos: Option<RelPosGpu>,
    n: &AttentionDims,
    rule: &AttentionRule,
    m: MaskGpu,
    drop: &AttentionDropout,
) -> Result<(CudaStorage, CudaStorage)> {
    let op = "flash_attention";
    let dummies = Dummies::new(q)?;
    let c = common(op, q, k, v, layout, pos, n, rule, m, drop, &dummies)?;
    let dev = q.device();
    let dt = q.dtype();
    let o = dev.alloc(dt, n.q_len())?;
    let lse = dev.alloc(acc_dtype(dt), n.batch * n.heads * n.t1)?;
    if n.q_len() > 0 {
        if n.t2 == 0 {
            return Err(Error::invalid(op, "expected at least one key, found none"));
        }
        match kernel_for(dt, n.d_k) {
            AttentionKernel::Wmma => launch_att!(attention_fwd_wmma, dev, dt, cfg(units_of(n, n.t1, WMMA_QUERY_TILE)), c, &o, &lse)?,
            AttentionKernel::Wmma64 => launch_att!(attention_fwd_wmma64, dev, dt, cfg(units_of(n, n.t1, WMMA_QUERY_TILE)), c, &o, &lse)?,
            AttentionKernel::Scalar => launch_att!(attention_fwd, dev, dt, cfg(units(n, n.t1, dt)), c, &o, &lse)?,
        }
    }
    Ok((o, lse))
}

/// Where the backward writes dq, dk and dv: buffers shaped as q's, k's and
/// v's (with the forward's [`QkvLayout`]); for a packed projection they are
/// one buffer, every element of which the kernels write (no fill needed).
#[derive(Clone, Copy)]
pub struct QkvGrads<'a> {
    /// Receives dq.
    pub dq: &'a CudaStorage,
    /// Receives dk.
    pub dk: &'a CudaStorage,
    /// Receives dv.
    pub dv: &'a CudaStorage,
}

/// The gradients of p (p's shape, q's dtype), u and vb ((heads, d_k) each,
/// in the compute type) that the backward gives with positions.
pub type PosGradsGpu = (CudaStorage, CudaStorage, CudaStorage);

/// The gradients of [`flash_attention`] from its output `o`, log-sum-exp
/// `lse` and output gradient `dout`: dq, dk, dv into `out` (q's dtype,
/// `layout`'s places), and with positions those of p, u and vb.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward(
    q: &CudaStorage,
    k: &CudaStorage,
    v: &CudaStorage,
    layout: &QkvLayout,
    out: QkvGrads,
    pos: Option<RelPosGpu>,
    o: &CudaStorage,
    lse: &CudaStorage,
    dout: &CudaStorage,
    n: &AttentionDims,
    rule: &AttentionRule,
    m: MaskGpu,
    drop: &AttentionDropout,
) -> Result<Option<PosGradsGpu>> {
    let op = "flash_attention_backward";
    let dummies = Dummies::new(q)?;
    let c = common(op, q, k, v, layout, pos, n, rule, m, drop, &dummies)?;
    same(op, q, o)?;
    same(op, q, dout)?;
    same(op, q, out.dq)?;
    same(op, q, out.dk)?;
    same(op, q, out.dv)?;
    layout.check(op, n, out.dq, out.dk, out.dv)?;
    expect_len(op, "the output", o, n.q_len())?;
    expect_len(op, "the output gradient", dout, n.q_len())?;
    let dev = q.device();
    let (dt, acc) = (q.dtype(), acc_dtype(q.dtype()));
    expect_len(op, "the log-sum-exp", lse, n.batch * n.heads * n.t1)?;
    let dsum = dev.alloc(acc, n.batch * n.heads * n.t1)?;
    let QkvGrads { dq, dk, dv } = out;
    let extra = if pos.is_some() { Some((dev.alloc(acc, n.k_len())?, dev.alloc(acc, n.batch * n.t2 * n.heads)?)) } else { None };
    if n.q_len() > 0 && n.t2 > 0 {
        // Never written without positions: any buffer of the compute type.
        let (dp, sk) = match &extra {
            Some((dp, sk)) => (dp, sk),
            None => (&dsum, &dsum),
        };
        // The same set as the forward that gave `lse` (its scores' roundings).
        match kernel_for(dt, n.d_k) {
            AttentionKernel::Wmma => {
                launch_att!(attention_bwd_dq_wmma, dev, dt, cfg(units_of(n, n.t1, WMMA_QUERY_TILE)), c, dout, lse, &dsum, dq)?;
                launch_att!(attention_bwd_dkv_wmma, dev, dt, cfg(units_of(n, n.t2, WMMA_KEY_TILE)), c, dout, lse, &dsum, dk, dv, dp, sk)?;
            }
            AttentionKernel::Wmma64 => {
                launch_att!(attention_bwd_dq_wmma64, dev, dt, cfg(units_of(n, n.t1, WMMA_QUERY_TILE)), c, dout, lse, &dsum, dq)?;
                launch_att!(attention_bwd_dkv_wmma64, dev, dt, cfg(units_of(n, n.t2, WMMA_KEY_TILE)), c, dout, lse, &dsum, dk, dv, dp, sk)?;
            }
            AttentionKernel::Scalar => {
                launch_att!(attention_bwd_dq, dev, dt, cfg(units(n, n.t1, dt)), c, o, dout, lse, &dsum, dq)?;
                launch_att!(attention_bwd_dkv, dev, dt, cfg(units(n, n.t2, dt)), c, dout, lse, &dsum, dk, dv, dp, sk)?;
            }
        }
    }
    match (pos, extra) {
        (Some((p, _, _)), Some((dp, sk))) => Ok(Some(pos_grads(&dp, &sk, k, layout, p, n)?)),
        _ => Ok(None),
    }
}

/// Rows of (b, key) per block of [`pos_grads`]: the B·T2 rows in at most
/// about 256 chunks, so the last block folds at most that many partial rows.
fn pos_grads_chunk(rows: usize) -> usize {
    rows.div_ceil(256).max(1)
}

/// The gradients of the positional table p, of u and of vb from the dk/dv
/// kernel's per-sequence dp and sk (`attention_pos_grads`, one launch): dp
/// summed over the batch for a shared table and rounded to q's dtype, and
/// du = Σ sk·k, dvb = Σ sk·p over sequences and keys in the compute type.
fn pos_grads(dp: &CudaStorage, sk: &CudaStorage, k: &CudaStorage, layout: &QkvLayout, p: &CudaStorage, n: &AttentionDims) -> Result<PosGradsGpu> {
    let dev = k.device();
    let acc = acc_dtype(k.dtype());
    let rows = n.batch * n.t2;
    let hd = n.heads * n.d_k;
    let dpo = dev.alloc(k.dtype(), n.pos_batch * n.t2 * hd)?;
    if rows == 0 || hd == 0 {
        return Ok((dev.zeros(k.dtype(), n.pos_batch * n.t2 * hd)?, dev.zeros(acc, hd)?, dev.zeros(acc, hd)?));
    }
    let chunk = pos_grads_chunk(rows);
    let chunks = rows.div_ceil(chunk);
    let part = dev.alloc(acc, chunks * 2 * hd)?;
    let (du, dvb) = (dev.alloc(acc, hd)?, dev.alloc(acc, hd)?);
    let arrivals = dev.arrivals(1)?;
    let shared = u32::from(n.pos_batch == 1 && n.batch > 1);
    kernels::attention::attention_pos_grads(
        dev,
        k.dtype(),
        super::nn_common::rows(chunks),
        dp,
        sk,
        k,
        p,
        &dpo,
        &part,
        &du,
        &dvb,
        &arrivals,
        n.batch as u64,
        n.t2 as u64,
        n.heads as u32,
        n.d_k as u32,
        shared,
        chunk as u64,
        layout.kv_ld as u64,
        layout.k_off as u64,
    )?;
    Ok((dpo, du, dvb))
}
