//! Peak device memory of one relative-position attention, forward and
//! backward, B 8, 4 heads, d_k 64: the fused kernel (`ops::flash_attention`)
//! against the composition (`matmul_pair_scaled` + `masked_softmax` +
//! `matmul`), measured by the device allocator's counters (the emulator's
//! on a CPU), its peak reset before each run. The fused op's memory beyond its inputs, outputs and
//! gradients grows linearly in T (log-sum-exp, D, the per-key sums), the
//! composition's quadratically (the (B, H, T, T) scores, weights and their
//! gradients). Its own process (one test), so no other test allocates on
//! the device meanwhile. `ASRFORGE_ATTENTION_PEAK_T=1500` adds that T.

mod common;

use asrforge::ops::{self, FlashMask, RelPos};
use asrforge::tensor::Rng;
use asrforge::{DType, Device, Result, Tensor};
use common::gpu::gpu;

const B: usize = 8;
const H: usize = 4;
const D: usize = 64;

/// Fused or composed forward and backward at T; returns the device
/// allocator's peak during the run and that peak minus its bytes in use
/// before (the inputs already allocated).
fn peak_extra(dev: &Device, t: usize, fused: bool) -> Result<(usize, usize)> {
    let ord = match dev {
        Device::Cuda(n) => *n,
        Device::Cpu => unreachable!("a GPU test"),
    };
    let cuda = asrforge::backend::cuda::device(ord)?;
    let mut rng = Rng::new(t as u64);
    let mk = |s: &[usize], rng: &mut Rng| {
        Tensor::randn(s.to_vec(), 0.0, 1.0, DType::F32, rng, &Device::Cpu).and_then(|x| x.to_device(dev)).map(|x| x.requires_grad_())
    };
    let (q, k, v) = (mk(&[B, t, H, D], &mut rng)?, mk(&[B, t, H, D], &mut rng)?, mk(&[B, t, H, D], &mut rng)?);
    let (p, u, vb) = (mk(&[1, t, H, D], &mut rng)?, mk(&[H, D], &mut rng)?, mk(&[H, D], &mut rng)?);
    let lens: Vec<usize> = (0..B).map(|b| t - b * t / (2 * B)).collect();
    let w = Tensor::randn([B, t, H, D], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu)?.to_device(dev)?;
    cuda.synchronize()?;
    cuda.reset_peak();
    let before = cuda.pool_stats();
    let o = if fused {
        let m = FlashMask { key_lengths: Some(lens), ..Default::default() };
        ops::flash_attention(&q, &k, &v, Some(RelPos { p: &p, u: &u, vb: &vb }), &m, 0.0, false)?
    } else {
        let mut m = vec![0u8; B * t];
        for (b, &l) in lens.iter().enumerate() {
            m[b * t + l..(b + 1) * t].iter_mut().for_each(|x| *x = 1);
        }
        let mask = Tensor::from_vec(m, [B, 1, 1, t], &Device::Cpu)?;
        let heads = |x: &Tensor| ops::permute(x, &[0, 2, 1, 3]);
        let pb = ops::broadcast_to(&p, &[B, t, H, D])?;
        let scores = ops::matmul_pair_scaled(
            &heads(&ops::add(&q, &u)?)?,
            &heads(&k)?,
            &heads(&ops::add(&q, &vb)?)?,
            &heads(&pb)?,
            false,
            true,
            1.0 / (D as f64).sqrt(),
        )?;
        let a = ops::masked_softmax(&scores, &mask)?;
        heads(&ops::matmul(&a, &heads(&v)?)?)?
    };
    let loss = ops::sum_all(&ops::mul(&o, &w)?)?;
    asrforge::autograd::backward(&loss)?;
    cuda.synchronize()?;
    let after = cuda.pool_stats();
    for x in [&q, &k, &v, &p, &u, &vb] {
        assert!(x.grad().is_some(), "every input has a gradient");
    }
    Ok((after.peak, after.peak.saturating_sub(before.in_use)))
}

#[test]
fn flash_attention_extra_memory_is_linear_in_t() {
    let Some(dev) = gpu("flash_attention_extra_memory_is_linear_in_t") else { return };
    let mut ts = vec![64, 128, 256];
    if let Some(t) = std::env::var("ASRFORGE_ATTENTION_PEAK_T").ok().and_then(|v| v.parse().ok()) {
        ts.push(t);
    }
    // One-time allocations (the GEMM workspace) before any measurement.
    peak_extra(&dev, 16, false).unwrap();
    peak_extra(&dev, 16, true).unwrap();
    let fused: Vec<usize> = ts.iter().map(|&t| peak_extra(&dev, t, true).unwrap().1).collect();
    let comp: Vec<usize> = ts.iter().map(|&t| peak_extra(&dev, t, false).unwrap().1).collect();
    for (i, &t) in ts.iter().enumerate() {
        println!(
            "rel-pos attention fwd+bwd B {B} H {H} d_k {D} T {t}: peak above the inputs: fused {:.2} MiB, composition {:.2} MiB (one (B, T, H, d_k) f32 tensor {:.2} MiB, one (B, H, T, T) f32 score tensor {:.2} MiB)",
            fused[i] as f64 / 1048576.0,
            comp[i] as f64 / 1048576.0,
            (B * t * H * D * 4) as f64 / 1048576.0,
            (B * H * t * t * 4) as f64 / 1048576.0
        );
    }
    // extra(T) = a·T + c·T² (+ a constant): at T, 2T, 4T the second
    // difference extra(4T) − 2·extra(2T) = 8c·T² is 0 without a T² term,
    // and k/2 score tensors of T 4T for k (B, H, T, T) f32 tensors alive
    // at the peak.
    let second = |e: &[usize]| e[2] as f64 - 2.0 * e[1] as f64;
    let score = (B * H * ts[2] * ts[2] * 4) as f64;
    assert_eq!((ts[1], ts[2]), (2 * ts[0], 4 * ts[0]));
    assert!(second(&fused).abs() <= 0.02 * fused[2] as f64, "fused extra memory has a T² term: {fused:?} at T {ts:?}");
    assert!(second(&comp) >= 0.5 * score, "the composition's extra memory {comp:?} at T {ts:?} lacks even one (B, H, T, T) tensor");
    assert!(fused[2] * 2 < comp[2], "at T {} fused {} vs composition {}", ts[2], fused[2], comp[2]);
}
