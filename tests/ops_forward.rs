//! Forward values of every op against hand-computed or definitional
//! references, and the errors bad arguments give.

mod common;

use asrforge::ops::{self, BatchNormState, Reduction};
use asrforge::tensor::{rng, Rng};
use asrforge::{DType, Device, Error, Tensor};
use common::assert_vec;

fn t(v: &[f64], s: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), s.to_vec(), &Device::Cpu).unwrap()
}
fn ids(v: &[i64], s: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), s.to_vec(), &Device::Cpu).unwrap()
}
fn mask(v: &[u8], s: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), s.to_vec(), &Device::Cpu).unwrap()
}
fn v(x: asrforge::Result<Tensor>) -> Vec<f64> {
    x.unwrap().to_f64_vec().unwrap()
}

#[test]
fn constructors() {
    let d = Device::Cpu;
    assert_eq!(Tensor::arange(0.0, 5.0, 2.0, DType::F32, &d).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 2.0, 4.0]);
    assert_eq!(Tensor::full([2], 3.5, DType::F64, &d).unwrap().to_vec::<f64>().unwrap(), vec![3.5, 3.5]);
    assert_eq!(Tensor::ones([2, 2], DType::I64, &d).unwrap().to_vec::<i64>().unwrap(), vec![1; 4]);
    let mut r1 = Rng::new(9);
    let mut r2 = Rng::new(9);
    let a = Tensor::randn([1000], 0.0, 1.0, DType::F64, &mut r1, &d).unwrap().to_vec::<f64>().unwrap();
    let b = Tensor::randn([1000], 0.0, 1.0, DType::F64, &mut r2, &d).unwrap().to_vec::<f64>().unwrap();
    assert_eq!(a, b, "same seed, same numbers");
    let mean = a.iter().sum::<f64>() / 1000.0;
    let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 1000.0;
    assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "mean {mean} var {var}");
    let u = Tensor::rand([1000], 2.0, 3.0, DType::F32, &mut r1, &d).unwrap().to_vec::<f32>().unwrap();
    assert!(u.iter().all(|&x| x > 2.0 && x < 3.0));
    let h = Tensor::from_cpu(t(&[1.5, -2.25], &[2]).to_cpu_storage().unwrap().to_dtype(DType::BF16), [2]).unwrap();
    assert_eq!(h.to_f64_vec().unwrap(), vec![1.5, -2.25]);
    assert!(matches!(Tensor::from_vec(vec![1.0f32; 5], [2, 3], &d), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(t(&[1.0], &[1]).to_vec::<f32>(), Err(Error::DTypeMismatch { .. })));
}

#[test]
fn philox_matches_the_published_known_answer() {
    // Random123's known-answer test for philox4x32-10 with all-ones inputs.
    assert_eq!(rng::philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
    assert_eq!(rng::philox4x32([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
}

#[test]
fn bernoulli_map_draws_the_philox_words() {
    // Word i of a draw at block offset o is word i%4 of Philox block o + i/4,
    // kept when (w + 0.5)/2^32 < p: sizes across the 32-word groups, the
    // 16384-word parallel chunks and their tails, from odd offsets.
    for (n, off) in [(1usize, 0u64), (31, 3), (32, 5), (33, 7), (16384 + 37, 11), (3 * 16384 + 5, (1 << 32) - 2)] {
        let mut r = Rng { seed: 0x0123_4567_89ab_cdef, offset: off };
        let got = r.bernoulli_map(n, 0.7, 2.0f32, 0.0);
        let key = [0x89ab_cdefu32, 0x0123_4567];
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let b = off + (i / 4) as u64;
                let w = rng::philox4x32([b as u32, (b >> 32) as u32, 0, 0], key)[i % 4];
                if (w as f64 + 0.5) / 4_294_967_296.0 < 0.7 {
                    2.0
                } else {
                    0.0
                }
            })
            .collect();
        assert_eq!(got, want, "n = {n}, offset = {off}");
        assert_eq!(r.offset, off + n.div_ceil(4) as u64);
    }
}

#[test]
fn elementwise_and_broadcast() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[10.0, 20.0, 30.0], &[3]);
    let c = t(&[100.0, 200.0], &[2, 1]);
    assert_vec("add row", &v(ops::add(&a, &b)), &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0], 0.0);
    assert_vec("add col", &v(ops::add(&a, &c)), &[101.0, 102.0, 103.0, 204.0, 205.0, 206.0], 0.0);
    assert_vec("sub", &v(ops::sub(&b, &a)), &[9.0, 18.0, 27.0, 6.0, 15.0, 24.0], 0.0);
    assert_vec("mul", &v(ops::mul(&a, &c)), &[100.0, 200.0, 300.0, 800.0, 1000.0, 1200.0], 0.0);
    assert_vec("div", &v(ops::div(&b, &a)), &[10.0, 10.0, 10.0, 2.5, 4.0, 5.0], 1e-15);
    let outer = ops::mul(&t(&[1.0, 2.0], &[2, 1]), &t(&[3.0, 4.0, 5.0], &[1, 3])).unwrap();
    assert_eq!(outer.dims(), &[2, 3]);
    assert_vec("outer", &outer.to_f64_vec().unwrap(), &[3.0, 4.0, 5.0, 6.0, 8.0, 10.0], 0.0);
    assert_vec("affine", &v(ops::affine(&b, 0.5, 1.0)), &[6.0, 11.0, 16.0], 0.0);
    assert_vec("pow", &v(ops::pow(&t(&[4.0, 9.0], &[2]), 1.5)), &[8.0, 27.0], 1e-12);
    let x = t(&[-1.0, 0.0, 2.0], &[3]);
    assert_vec("neg", &v(ops::neg(&x)), &[1.0, 0.0, -2.0], 0.0);
    assert_vec("abs", &v(ops::abs(&x)), &[1.0, 0.0, 2.0], 0.0);
    assert_vec("relu", &v(ops::relu(&x)), &[0.0, 0.0, 2.0], 0.0);
    assert_vec("exp", &v(ops::exp(&x)), &[(-1f64).exp(), 1.0, 2f64.exp()], 1e-15);
    assert_vec("log", &v(ops::log(&t(&[1.0, std::f64::consts::E], &[2]))), &[0.0, 1.0], 1e-15);
    assert_vec("sqrt", &v(ops::sqrt(&t(&[4.0, 2.25], &[2]))), &[2.0, 1.5], 0.0);
    assert_vec("rsqrt", &v(ops::rsqrt(&t(&[4.0, 0.25], &[2]))), &[0.5, 2.0], 1e-15);
    let s = |z: f64| 1.0 / (1.0 + (-z).exp());
    assert_vec("sigmoid", &v(ops::sigmoid(&x)), &[s(-1.0), 0.5, s(2.0)], 1e-15);
    assert_vec("silu", &v(ops::silu(&x)), &[-s(-1.0), 0.0, 2.0 * s(2.0)], 1e-15);
    assert_vec("tanh", &v(ops::tanh(&x)), &[(-1f64).tanh(), 0.0, 2f64.tanh()], 1e-15);
    // GELU(x) = x·Φ(x); Φ(1) = 0.8413447460685429, Φ(-1) = 0.15865525393145707.
    assert_vec("gelu", &v(ops::gelu(&t(&[1.0, -1.0, 0.0], &[3]))), &[0.8413447460685429, -0.15865525393145707, 0.0], 1e-12);
    // glu([a, b]) = a·σ(b)
    assert_vec("glu", &v(ops::glu(&t(&[1.0, 2.0, 0.0, 1.0], &[1, 4]), -1)), &[0.5, 2.0 * s(1.0)], 1e-15);
}

#[test]
fn reductions_and_softmax() {
    let a = t(&[1.0, 5.0, 3.0, 4.0, 2.0, 6.0], &[2, 3]);
    assert_vec("sum rows", &v(ops::sum(&a, &[1], false)), &[9.0, 12.0], 0.0);
    let k = ops::sum(&a, &[0], true).unwrap();
    assert_eq!(k.dims(), &[1, 3]);
    assert_vec("sum cols", &k.to_f64_vec().unwrap(), &[5.0, 7.0, 9.0], 0.0);
    assert_vec("sum all", &v(ops::sum_all(&a)), &[21.0], 0.0);
    assert_vec("mean", &v(ops::mean(&a, &[-1], false)), &[3.0, 4.0], 0.0);
    assert_vec("mean all", &v(ops::mean_all(&a)), &[3.5], 0.0);
    assert_vec("max", &v(ops::max(&a, 1, false)), &[5.0, 6.0], 0.0);
    assert_vec("max dim0", &v(ops::max(&a, 0, false)), &[4.0, 5.0, 6.0], 0.0);
    // A large sum is deterministic and exact on integers.
    let big = Tensor::ones([1 << 17], DType::F32, &Device::Cpu).unwrap();
    assert_eq!(ops::sum_all(&big).unwrap().to_scalar().unwrap(), (1 << 17) as f64);
    let x = t(&[1.0, 2.0, 3.0, 1000.0, 1000.0, 1000.0], &[2, 3]);
    let e: Vec<f64> = [1f64, 2.0, 3.0].iter().map(|z| z.exp()).collect();
    let z: f64 = e.iter().sum();
    let want = [e[0] / z, e[1] / z, e[2] / z, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
    assert_vec("softmax (stable at 1000)", &v(ops::softmax(&x)), &want, 1e-15);
    let lwant: Vec<f64> = want.iter().map(|p| p.ln()).collect();
    assert_vec("log_softmax", &v(ops::log_softmax(&x)), &lwant, 1e-13);
}

#[test]
fn matmul_and_linear() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]);
    assert_vec("ab", &v(ops::matmul(&a, &b)), &[58.0, 64.0, 139.0, 154.0], 0.0);
    // aᵀ (3x2) · aᵀᵀ... op(a)=aᵀ: (3,2)·(2,3)
    assert_vec("ata", &v(ops::matmul_t(&a, &a, true, false)), &[17.0, 22.0, 27.0, 22.0, 29.0, 36.0, 27.0, 36.0, 45.0], 0.0);
    assert_vec("aat", &v(ops::matmul_t(&a, &a, false, true)), &[14.0, 32.0, 32.0, 77.0], 0.0);
    assert_vec("atbt", &v(ops::matmul_t(&b, &a, true, true)), &[58.0, 139.0, 64.0, 154.0], 0.0);
    let ab = ops::stack(&[&a, &a], 0).unwrap();
    let y = ops::matmul(&ab, &b).unwrap();
    assert_eq!(y.dims(), &[2, 2, 2]);
    assert_vec("batched shared", &y.to_f64_vec().unwrap(), &[58.0, 64.0, 139.0, 154.0, 58.0, 64.0, 139.0, 154.0], 0.0);
    let w = t(&[1.0, 0.0, -1.0, 0.5, 0.5, 0.5], &[2, 3]);
    assert_vec("linear", &v(ops::linear(&a, &w, Some(&t(&[1.0, -1.0], &[2])))), &[-1.0, 2.0, -1.0, 6.5], 1e-15);
    // A large product (parallel path) against a naive triple loop.
    let mut rng = Rng::new(common::fresh_seed());
    let (m, k, n) = (130, 70, 110);
    let x = Tensor::randn([m, k], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let z = Tensor::randn([k, n], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let (xv, zv) = (x.to_f64_vec().unwrap(), z.to_f64_vec().unwrap());
    let mut want = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|p| xv[i * k + p] * zv[p * n + j]).sum();
        }
    }
    assert_vec("large", &v(ops::matmul(&x, &z)), &want, 1e-11);
}

#[test]
fn layout_ops() {
    let a = t(&(0..24).map(|x| x as f64).collect::<Vec<_>>(), &[2, 3, 4]);
    let p = ops::permute(&a, &[2, 0, 1]).unwrap();
    assert_eq!(p.dims(), &[4, 2, 3]);
    let pv = p.to_f64_vec().unwrap();
    // p[i, j, k] = a[j, k, i] = 12j + 4k + i
    for i in 0..4 {
        for j in 0..2 {
            for k in 0..3 {
                assert_eq!(pv[(i * 2 + j) * 3 + k], (12 * j + 4 * k + i) as f64);
            }
        }
    }
    let tr = ops::transpose(&t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]), 0, 1).unwrap();
    assert_vec("transpose", &tr.to_f64_vec().unwrap(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0], 0.0);
    assert_vec("narrow", &v(ops::narrow(&a, 2, 1, 2)), &[1.0, 2.0, 5.0, 6.0, 9.0, 10.0, 13.0, 14.0, 17.0, 18.0, 21.0, 22.0], 0.0);
    let m = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    assert_vec("pad", &v(ops::pad(&m, 1, 1, 2, -1.0)), &[-1.0, 1.0, 2.0, -1.0, -1.0, -1.0, 3.0, 4.0, -1.0, -1.0], 0.0);
    assert_vec("cat0", &v(ops::cat(&[&m, &t(&[5.0, 6.0], &[1, 2])], 0)), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.0);
    assert_vec("cat1", &v(ops::cat(&[&m, &t(&[5.0, 6.0], &[2, 1])], 1)), &[1.0, 2.0, 5.0, 3.0, 4.0, 6.0], 0.0);
    let s = ops::stack(&[&t(&[1.0, 2.0], &[2]), &t(&[3.0, 4.0], &[2])], 1).unwrap();
    assert_eq!(s.dims(), &[2, 2]);
    assert_vec("stack", &s.to_f64_vec().unwrap(), &[1.0, 3.0, 2.0, 4.0], 0.0);
    let r = ops::reshape(&a, [6, 4]).unwrap();
    assert!(r.same_storage(&a), "reshape shares storage");
    assert_eq!(ops::flatten(&a, 1, 2).unwrap().dims(), &[2, 12]);
    assert_eq!(ops::unsqueeze(&a, -1).unwrap().dims(), &[2, 3, 4, 1]);
    // Layout ops move i64 and u8 too.
    assert_eq!(ops::transpose(&ids(&[1, 2, 3, 4], &[2, 2]), 0, 1).unwrap().to_vec::<i64>().unwrap(), vec![1, 3, 2, 4]);
}

#[test]
fn indexing_ops() {
    let w = t(&[0.0, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2]);
    let e = ops::embedding(&w, &ids(&[2, 0, 2], &[1, 3])).unwrap();
    assert_eq!(e.dims(), &[1, 3, 2]);
    assert_vec("embedding", &e.to_f64_vec().unwrap(), &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0], 0.0);
    assert_vec("index_select", &v(ops::index_select(&w, 1, &ids(&[1, 1, 0], &[3]))), &[1.0, 1.0, 0.0, 11.0, 11.0, 10.0, 21.0, 21.0, 20.0], 0.0);
    assert_vec("gather", &v(ops::gather(&w, 1, &ids(&[1, 0, 0], &[3, 1]))), &[1.0, 10.0, 20.0], 0.0);
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    assert_vec(
        "masked_fill",
        &v(ops::masked_fill(&x, &mask(&[0, 1, 1], &[1, 3]), f64::NEG_INFINITY)),
        &[1.0, f64::NEG_INFINITY, f64::NEG_INFINITY, 4.0, f64::NEG_INFINITY, f64::NEG_INFINITY],
        0.0,
    );
    let y = t(&[-1.0; 6], &[2, 3]);
    assert_vec("where", &v(ops::where_cond(&mask(&[1, 0], &[2, 1]), &x, &y)), &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0], 0.0);
}

#[test]
fn normalisation_and_dropout() {
    let x = t(&[1.0, 2.0, 3.0, 4.0, -1.0, 1.0], &[2, 3]);
    // Row [1,2,3]: mean 2, var 2/3; row [4,-1,1]: mean 4/3, var 38/9.
    let r1 = 1.0 / (2.0f64 / 3.0 + 1e-5).sqrt();
    let r2 = 1.0 / (38.0f64 / 9.0 + 1e-5).sqrt();
    let want = [-r1, 0.0, r1, (4.0 - 4.0 / 3.0) * r2, (-1.0 - 4.0 / 3.0) * r2, (1.0 - 4.0 / 3.0) * r2];
    assert_vec("layer_norm", &v(ops::layer_norm(&x, None, None, 1e-5)), &want, 1e-12);
    let wa = t(&[2.0, 1.0, 0.5], &[3]);
    let ba = t(&[0.0, 1.0, -1.0], &[3]);
    let wantw: Vec<f64> = want.iter().enumerate().map(|(i, y)| y * [2.0, 1.0, 0.5][i % 3] + [0.0, 1.0, -1.0][i % 3]).collect();
    assert_vec("layer_norm affine", &v(ops::layer_norm(&x, Some(&wa), Some(&ba), 1e-5)), &wantw, 1e-12);
    // batch_norm over (B=2, C=1, T=2): values 1, 3, 5, 7: mean 4, biased var 5, unbiased 20/3.
    let xb = t(&[1.0, 3.0, 5.0, 7.0], &[2, 1, 2]);
    let (rm, rv) = (t(&[0.0], &[1]), t(&[1.0], &[1]));
    let (w1, b1) = (t(&[1.0], &[1]), t(&[0.0], &[1]));
    let st = BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 0.0, training: true };
    let r = 1.0 / 5f64.sqrt();
    assert_vec("batch_norm train", &v(ops::batch_norm(&xb, &w1, &b1, &st)), &[-3.0 * r, -r, r, 3.0 * r], 1e-12);
    assert_vec("running_mean", &rm.to_f64_vec().unwrap(), &[0.4], 1e-12);
    assert_vec("running_var", &rv.to_f64_vec().unwrap(), &[0.9 + 0.1 * 20.0 / 3.0], 1e-12);
    let st = BatchNormState { training: false, ..st };
    let want_eval: Vec<f64> = [1.0, 3.0, 5.0, 7.0].iter().map(|z| (z - 0.4) / (0.9f64 + 2.0 / 3.0).sqrt()).collect();
    assert_vec("batch_norm eval", &v(ops::batch_norm(&xb, &w1, &b1, &st)), &want_eval, 1e-12);
    // Dropout: kept elements scaled by 1/(1-p), about p dropped, the same mask for the same seed.
    let ones = Tensor::ones([10000], DType::F32, &Device::Cpu).unwrap();
    rng::manual_seed(3);
    let d1 = v(ops::dropout(&ones, 0.2, true));
    rng::manual_seed(3);
    let d2 = v(ops::dropout(&ones, 0.2, true));
    assert_eq!(d1, d2);
    let dropped = d1.iter().filter(|&&z| z == 0.0).count();
    assert!((1800..2200).contains(&dropped), "dropped {dropped} of 10000 at p=0.2");
    assert!(d1.iter().all(|&z| z == 0.0 || (z - 1.25).abs() < 1e-6));
    assert_eq!(v(ops::dropout(&ones, 0.2, false)), vec![1.0; 10000]);
}

#[test]
fn convolutions_against_direct_sums() {
    // Depthwise: channel 0 kernel [1, 2, 3] over [1, 2, 3, 4] with padding 1.
    let x = t(&[1.0, 2.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0], &[1, 2, 4]);
    let w = t(&[1.0, 2.0, 3.0, 0.0, 1.0, 0.0], &[2, 1, 3]);
    let b = t(&[0.5, -0.5], &[2]);
    // y0[t] = 1·x[t-1] + 2·x[t] + 3·x[t+1] + 0.5
    // conv1d_depthwise is channels last: run it on x (1, 4, 2) and read the result back as (1, 2, 4).
    let y = ops::conv1d_depthwise(&ops::transpose(&x, 1, 2).unwrap(), &w, Some(&b), 1).unwrap();
    assert_eq!(y.dims(), &[1, 4, 2]);
    assert_vec("depthwise", &v(ops::transpose(&y, 1, 2)), &[8.5, 14.5, 20.5, 11.5, 0.5, 0.5, 0.5, 0.5], 1e-12);
    // Conv2d stride 2, kernel 3 on a 5x5 ramp: out 2x2, each a 3x3 window sum times 1.
    let img = t(&(0..25).map(|z| z as f64).collect::<Vec<_>>(), &[1, 1, 5, 5]);
    let k = t(&[1.0; 9], &[1, 1, 3, 3]);
    let win = |r: usize, c: usize| -> f64 { (0..3).flat_map(|i| (0..3).map(move |j| ((r + i) * 5 + c + j) as f64)).sum() };
    assert_vec("conv2d", &v(ops::conv2d(&img, &k, None, 2, 0)), &[win(0, 0), win(0, 2), win(2, 0), win(2, 2)], 1e-12);
    let y = ops::conv2d(&img, &k, Some(&t(&[1.0], &[1])), 1, 1).unwrap();
    assert_eq!(y.dims(), &[1, 1, 5, 5]);
    assert_eq!(y.to_f64_vec().unwrap()[0], 1.0 + 0.0 + 1.0 + 5.0 + 6.0);
    // Pointwise conv1d: a per-frame linear map over channels.
    let pw = t(&[1.0, -1.0, 2.0, 0.0], &[2, 2, 1]);
    assert_vec("pointwise", &v(ops::conv1d_pointwise(&x, &pw, None)), &[0.0, 1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 8.0], 0.0);
}

#[test]
fn conv2d_strided_and_padded_against_direct_sums() {
    // Every stride/padding pair the im2col walks distinguish, on odd shapes.
    let mut rng = Rng::new(common::fresh_seed());
    for (s, p) in [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 1)] {
        let (b, ci, h, w, co, kh, kw) = (2, 3, 7, 6, 2, 3, 2);
        let xv = common::draw(&mut rng, &[b, ci, h, w], common::Kind::Normal);
        let wv = common::draw(&mut rng, &[co, ci, kh, kw], common::Kind::Normal);
        let y = ops::conv2d(&t(&xv, &[b, ci, h, w]), &t(&wv, &[co, ci, kh, kw]), None, s, p).unwrap();
        let (ho, wo) = ((h + 2 * p - kh) / s + 1, (w + 2 * p - kw) / s + 1);
        assert_eq!(y.dims(), &[b, co, ho, wo], "stride {s} pad {p}");
        let mut want = vec![0.0; b * co * ho * wo];
        for (n, o, oy, ox) in (0..b).flat_map(|n| (0..co).flat_map(move |o| (0..ho).flat_map(move |oy| (0..wo).map(move |ox| (n, o, oy, ox))))) {
            let mut acc = 0.0;
            for (c, i, j) in (0..ci).flat_map(|c| (0..kh).flat_map(move |i| (0..kw).map(move |j| (c, i, j)))) {
                let (yy, xx) = ((oy * s + i) as isize - p as isize, (ox * s + j) as isize - p as isize);
                if yy >= 0 && (yy as usize) < h && xx >= 0 && (xx as usize) < w {
                    acc += wv[((o * ci + c) * kh + i) * kw + j] * xv[((n * ci + c) * h + yy as usize) * w + xx as usize];
                }
            }
            want[((n * co + o) * ho + oy) * wo + ox] = acc;
        }
        assert_vec(&format!("conv2d s{s} p{p}"), &y.to_f64_vec().unwrap(), &want, 1e-12);
    }
}

#[test]
fn exp_f32_within_two_ulp_of_the_rounded_exp() {
    // A dense sweep of the whole finite range, then the ends and specials.
    let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
    let mut worst = (0, 0.0f32);
    for i in 0..=400_000 {
        let x = -104.0 + 193.0 * (i as f32 / 400_000.0);
        let (got, want) = (asrforge::backend::cpu::exp_f32(x), (x as f64).exp() as f32);
        if ulps(got, want) > worst.0 {
            worst = (ulps(got, want), x);
        }
    }
    assert!(worst.0 <= 2, "exp_f32 is {} ulp off at x = {}", worst.0, worst.1);
    let e = asrforge::backend::cpu::exp_f32;
    assert_eq!((e(0.0), e(1.0), e(-1.0)), (1.0, std::f32::consts::E, (-1.0f64).exp() as f32));
    assert_eq!((e(100.0), e(f32::INFINITY), e(-120.0), e(f32::NEG_INFINITY)), (f32::INFINITY, f32::INFINITY, 0.0, 0.0));
    assert!(e(f32::NAN).is_nan());
    // silu in f32 through it, against f64.
    let xs: Vec<f64> = (0..2001).map(|i| -30.0 + 0.03 * i as f64).collect();
    let got = ops::silu(&ops::to_dtype(&t(&xs, &[xs.len()]), DType::F32).unwrap()).unwrap().to_f64_vec().unwrap();
    for (x, g) in xs.iter().zip(got) {
        // The f32 input exactly, so that only the kernel's rounding is measured.
        let x = *x as f32 as f64;
        let want = x / (1.0 + (-x).exp());
        assert!((g - want).abs() <= 8.0 * f32::EPSILON as f64 * want.abs(), "silu({x}) = {g}, want {want}");
    }
}

#[test]
fn label_smoothing_matches_its_formula() {
    let x = t(&[1.0, 2.0, 0.5, 0.0, 0.0, 0.0], &[1, 2, 3]);
    let tg = ids(&[1, -1], &[1, 2]);
    let eps: f64 = 0.1;
    let lp: Vec<f64> = {
        let l = (1f64.exp() + 2f64.exp() + 0.5f64.exp()).ln();
        vec![1.0 - l, 2.0 - l, 0.5 - l]
    };
    let q: [f64; 3] = [eps / 2.0, 1.0 - eps, eps / 2.0];
    let kl: f64 = (0..3).map(|k| q[k] * (q[k].ln() - lp[k])).sum();
    // The op as the fusion switch picks it, the reference and the fused kernel.
    type Loss = fn(&Tensor, &Tensor, f64, i64, bool) -> asrforge::Result<Tensor>;
    let impls: [(&str, Loss); 3] =
        [("switch", ops::label_smoothing_loss), ("reference", ops::label_smoothing_loss_reference), ("fused", ops::label_smoothing_loss_fused)];
    for (name, loss) in impls {
        assert_vec(&format!("{name} by tokens"), &v(loss(&x, &tg, eps, -1, true)), &[kl], 1e-12);
        assert_vec(&format!("{name} by batch"), &v(loss(&x, &tg, eps, -1, false)), &[kl], 1e-12);
        let x2 = ops::cat(&[&x, &x], 0).unwrap();
        let tg2 = ids(&[1, -1, 1, -1], &[2, 2]);
        assert_vec(&format!("{name} 2 tokens, by tokens"), &v(loss(&x2, &tg2, eps, -1, true)), &[kl], 1e-12);
        assert_vec(&format!("{name} no smoothing is cross-entropy"), &v(loss(&x, &tg, 0.0, -1, true)), &[-lp[1]], 1e-12);
    }
}

#[test]
fn ctc_single_frame_definition() {
    // One frame, target [1]: the only path is "1", so nll = −lp[0,1].
    let lp = t(&[-2.0, -0.5, -1.5], &[1, 1, 3]);
    let l = ops::ctc_loss(&lp, &ids(&[1], &[1, 1]), &[1], &[1], 0, Reduction::Sum, false).unwrap();
    assert_vec("ctc", &l.to_f64_vec().unwrap(), &[0.5], 1e-15);
}

#[test]
fn bad_arguments_are_errors_that_say_what_was_expected() {
    let a = t(&[1.0; 6], &[2, 3]);
    let b = t(&[1.0; 4], &[4]);
    let e = ops::add(&a, &b).unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.contains("[4]"), "{e}");
    let f = Tensor::ones([3], DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(ops::add(&f, &t(&[1.0; 3], &[3])), Err(Error::DTypeMismatch { expected: DType::F32, got: DType::F64, .. })));
    let e = ops::matmul(&a, &a).unwrap_err().to_string();
    assert!(e.contains("inner dims"), "{e}");
    assert!(matches!(ops::softmax(&ids(&[1, 2], &[2])), Err(Error::UnsupportedDType { .. })));
    assert!(matches!(ops::sum(&a, &[2], false), Err(Error::DimOutOfRange { dim: 2, rank: 2, .. })));
    assert!(matches!(ops::embedding(&a, &ids(&[0, 2], &[2])), Err(Error::IndexOutOfRange { index: 2, size: 2, .. })));
    assert!(matches!(ops::index_select(&a, 1, &ids(&[-1], &[1])), Err(Error::IndexOutOfRange { index: -1, .. })));
    assert!(ops::narrow(&a, 1, 2, 2).unwrap_err().to_string().contains("outside dim 1 of size 3"));
    assert!(ops::reshape(&a, [4, 2]).is_err());
    assert!(ops::permute(&a, &[0, 0]).is_err());
    assert!(ops::masked_fill(&a, &t(&[1.0; 3], &[3]), 0.0).is_err(), "a float mask is refused");
    assert!(ops::glu(&a, 1).unwrap_err().to_string().contains("even"));
    assert!(ops::cat(&[&a, &t(&[1.0; 4], &[2, 2])], 0).is_err());
    assert!(ops::conv2d(&t(&[1.0; 4], &[1, 1, 2, 2]), &t(&[1.0; 9], &[1, 1, 3, 3]), None, 1, 0).is_err());
    assert!(ops::dropout(&a, 1.5, true).is_err());
    assert!(ops::label_smoothing_loss(&t(&[0.0; 6], &[1, 2, 3]), &ids(&[5, 0], &[1, 2]), 0.1, -1, true).is_err());
    assert!(matches!(Device::parse("cuda:0"), Err(Error::CudaUnavailable(_))) || Device::available().len() > 1);
    assert!(Device::parse("tpu").is_err());
}

/// `op(x)` of a row-major (r, c) matrix as nested rows.
fn op_rows(x: &[f64], r: usize, c: usize, t: bool) -> Vec<Vec<f64>> {
    if t {
        (0..c).map(|j| (0..r).map(|i| x[i * c + j]).collect()).collect()
    } else {
        (0..r).map(|i| x[i * c..(i + 1) * c].to_vec()).collect()
    }
}

/// alpha·Σ_l op(a)[i, l]·op(b)[l, j] by its definition, one matrix.
fn scaled_product(a: &[f64], ad: (usize, usize), ta: bool, b: &[f64], bd: (usize, usize), tb: bool, alpha: f64) -> Vec<f64> {
    let (oa, ob) = (op_rows(a, ad.0, ad.1, ta), op_rows(b, bd.0, bd.1, tb));
    let (m, k, n) = (oa.len(), ob.len(), ob[0].len());
    let mut y = Vec::with_capacity(m * n);
    for row in &oa {
        for j in 0..n {
            y.push(alpha * (0..k).map(|l| row[l] * ob[l][j]).sum::<f64>());
        }
    }
    y
}

#[test]
fn scaled_products_follow_their_definition() {
    // By hand: 0.5·[[1, 2], [3, 4]]·[[5], [6]] = [8.5, 19.5].
    assert_vec(
        "matmul_scaled by hand",
        &v(ops::matmul_scaled(&t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]), &t(&[5.0, 6.0], &[2, 1]), false, false, 0.5)),
        &[8.5, 19.5],
        1e-12,
    );
    let mut rng = Rng::new(common::fresh_seed());
    let mut draw = |n: usize| rng.normal(n);
    // Batched (2, 3) heads with transposes, the scale 1/√8 as attention's.
    for (ta, tb) in [(false, true), (true, false), (true, true), (false, false)] {
        let (m, k, n, batch, alpha) = (5, 7, 4, 6, 1.0 / 8f64.sqrt());
        let ad = if ta { (k, m) } else { (m, k) };
        let bd = if tb { (n, k) } else { (k, n) };
        let (a, b, a2, b2) = (draw(batch * m * k), draw(batch * k * n), draw(batch * m * k), draw(batch * k * n));
        let (sa, sb) = ([2, 3, ad.0, ad.1], [2, 3, bd.0, bd.1]);
        let one = v(ops::matmul_scaled(&t(&a, &sa), &t(&b, &sb), ta, tb, alpha));
        let pair = v(ops::matmul_pair_scaled(&t(&a, &sa), &t(&b, &sb), &t(&a2, &sa), &t(&b2, &sb), ta, tb, alpha));
        let (mut want1, mut want2) = (Vec::new(), Vec::new());
        for i in 0..batch {
            let (ai, bi) = (i * m * k..(i + 1) * m * k, i * k * n..(i + 1) * k * n);
            let p1 = scaled_product(&a[ai.clone()], ad, ta, &b[bi.clone()], bd, tb, alpha);
            let p2 = scaled_product(&a2[ai], ad, ta, &b2[bi], bd, tb, alpha);
            want2.extend(p1.iter().zip(&p2).map(|(x, y)| x + y));
            want1.extend(p1);
        }
        assert_vec(&format!("matmul_scaled trans {ta}/{tb}"), &one, &want1, 1e-12);
        assert_vec(&format!("matmul_pair_scaled trans {ta}/{tb}"), &pair, &want2, 1e-12);
    }
    // A shared right operand (2-D) under a batched left one.
    let (a, b) = (draw(2 * 3 * 4), draw(5 * 4));
    let got = v(ops::matmul_scaled(&t(&a, &[2, 3, 4]), &t(&b, &[5, 4]), false, true, -0.75));
    let want: Vec<f64> = (0..2).flat_map(|i| scaled_product(&a[i * 12..(i + 1) * 12], (3, 4), false, &b, (5, 4), true, -0.75)).collect();
    assert_vec("matmul_scaled shared right", &got, &want, 1e-12);
    // Products of different shapes cannot be summed.
    let e = ops::matmul_pair_scaled(&t(&a, &[2, 3, 4]), &t(&b, &[5, 4]), &t(&a[..12], &[3, 4]), &t(&b, &[5, 4]), false, true, 1.0);
    assert!(matches!(e, Err(Error::ShapeMismatch { .. })), "{e:?}");
}

#[test]
fn add_scaled_is_a_plus_c_times_b() {
    assert_vec("add_scaled by hand", &v(ops::add_scaled(&t(&[1.0, -2.0, 3.0], &[3]), &t(&[4.0, 0.5, -6.0], &[3]), 0.5)), &[3.0, -1.75, 0.0], 1e-15);
    let mut rng = Rng::new(common::fresh_seed());
    let (a, b) = (rng.normal(70_003), rng.normal(70_003));
    let got = v(ops::add_scaled(&t(&a, &[70_003]), &t(&b, &[70_003]), -1.25));
    let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x - 1.25 * y).collect();
    assert_vec("add_scaled", &got, &want, 1e-15);
    // Broadcasting goes through add and mul_scalar: b (4, 1) over a (2, 4, 3).
    let (a, b) = (rng.normal(24), rng.normal(4));
    let got = v(ops::add_scaled(&t(&a, &[2, 4, 3]), &t(&b, &[4, 1]), 2.0));
    let want: Vec<f64> = (0..24).map(|i| a[i] + 2.0 * b[(i / 3) % 4]).collect();
    assert_vec("add_scaled broadcast", &got, &want, 1e-15);
}
