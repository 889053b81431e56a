//! Finite-difference gradient checks in f64 for every op: one line per case.
//! Each case draws fresh random inputs (the seed is printed on failure; set
//! ASRFORGE_TEST_SEED to replay) and runs on every available backend.

mod common;

use asrforge::ops::{self, BatchNormState, Reduction};
use asrforge::tensor::{rng, Rng};
use asrforge::{DType, Device, Tensor};
use common::{check_grad, draw, fresh_seed, Kind::*};

macro_rules! grad {
    ($name:ident, [$(($shape:expr, $kind:expr, $g:expr)),* $(,)?], |$x:ident| $body:expr) => {
        #[test]
        fn $name() {
            let seed = fresh_seed();
            let mut rng = Rng::new(seed);
            let vals = vec![$((draw(&mut rng, &$shape, $kind), $shape.to_vec())),*];
            let mask = [$($g),*];
            check_grad(stringify!($name), &|$x: &[Tensor]| $body, vals, &mask, seed);
        }
    };
}

fn i64t(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), &Device::Cpu).unwrap()
}
fn u8t(v: &[u8], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), &Device::Cpu).unwrap()
}
fn f64t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), &Device::Cpu).unwrap()
}
/// A 1-D tensor of `v` with `x`'s dtype and device (batch norm's running
/// statistics live with the layer, so on the GPU run they are GPU tensors).
fn like(v: &[f64], x: &Tensor) -> Tensor {
    let t = Tensor::from_cpu(f64t(v, &[v.len()]).to_cpu_storage().unwrap().to_dtype(x.dtype()), [v.len()]).unwrap();
    t.to_device(&x.device()).unwrap()
}

// Broadcasting binary ops.
grad!(add_broadcast, [([3, 4, 5], Normal, true), ([4, 1], Normal, true)], |x| ops::add(&x[0], &x[1]));
grad!(add_same_odd, [([7, 3], Normal, true), ([7, 3], Normal, true)], |x| ops::add(&x[0], &x[1]));
grad!(add_scaled, [([7, 3], Normal, true), ([7, 3], Normal, true)], |x| ops::add_scaled(&x[0], &x[1], 0.5));
grad!(add_scaled_one_side, [([7, 3], Normal, false), ([7, 3], Normal, true)], |x| ops::add_scaled(&x[0], &x[1], -2.25));
grad!(add_scaled_broadcast, [([3, 4, 5], Normal, true), ([4, 1], Normal, true)], |x| ops::add_scaled(&x[0], &x[1], 1.5));
grad!(sub_broadcast, [([2, 3, 4], Normal, true), ([3, 1], Normal, true)], |x| ops::sub(&x[0], &x[1]));
grad!(mul_broadcast, [([5, 1, 3], Normal, true), ([4, 3], Normal, true)], |x| ops::mul(&x[0], &x[1]));
grad!(div_broadcast, [([3, 4], Normal, true), ([4], Positive, true)], |x| ops::div(&x[0], &x[1]));
grad!(div_scalar_tensor, [([3, 5], Positive, true), ([], Positive, true)], |x| ops::div(&x[1], &x[0]));
// Scalar and unary maps.
grad!(add_scalar, [([4, 3], Normal, true)], |x| ops::add_scalar(&x[0], 0.7));
grad!(mul_scalar, [([4, 3], Normal, true)], |x| ops::mul_scalar(&x[0], -1.3));
grad!(affine, [([5], Normal, true)], |x| ops::affine(&x[0], 2.5, -1.0));
grad!(neg, [([3, 3], Normal, true)], |x| ops::neg(&x[0]));
grad!(pow, [([3, 4], Positive, true)], |x| ops::pow(&x[0], 2.5));
grad!(exp, [([3, 5], Normal, true)], |x| ops::exp(&x[0]));
grad!(log, [([3, 5], Positive, true)], |x| ops::log(&x[0]));
grad!(sqrt, [([3, 5], Positive, true)], |x| ops::sqrt(&x[0]));
grad!(rsqrt, [([3, 5], Positive, true)], |x| ops::rsqrt(&x[0]));
grad!(abs, [([4, 5], AwayFromZero, true)], |x| ops::abs(&x[0]));
grad!(relu, [([4, 5], AwayFromZero, true)], |x| ops::relu(&x[0]));
grad!(silu, [([4, 5], Normal, true)], |x| ops::silu(&x[0]));
grad!(gelu, [([4, 5], Normal, true)], |x| ops::gelu(&x[0]));
grad!(sigmoid, [([4, 5], Normal, true)], |x| ops::sigmoid(&x[0]));
grad!(tanh, [([4, 5], Normal, true)], |x| ops::tanh(&x[0]));
grad!(glu_last, [([3, 6], Normal, true)], |x| ops::glu(&x[0], -1));
grad!(glu_channels, [([2, 4, 5], Normal, true)], |x| ops::glu(&x[0], 1));
// Reductions.
grad!(sum_dim, [([3, 4, 5], Normal, true)], |x| ops::sum(&x[0], &[1], false));
grad!(sum_dims_keepdim, [([3, 4, 5], Normal, true)], |x| ops::sum(&x[0], &[0, 2], true));
grad!(mean_last, [([3, 7], Normal, true)], |x| ops::mean(&x[0], &[-1], false));
grad!(sum_all, [([3, 7], Normal, true)], |x| ops::sum_all(&x[0]));
grad!(broadcast_to, [([1, 3, 1, 2], Normal, true)], |x| ops::broadcast_to(&x[0], &[4, 3, 5, 2]));
grad!(mean_all, [([2, 3, 7], Normal, true)], |x| ops::mean_all(&x[0]));
grad!(max_dim, [([3, 5, 4], Distinct, true)], |x| ops::max(&x[0], 1, false));
grad!(max_last_keepdim, [([3, 5], Distinct, true)], |x| ops::max(&x[0], -1, true));
// Softmax family.
grad!(softmax, [([4, 7], Normal, true)], |x| ops::softmax(&x[0]));
grad!(log_softmax, [([3, 2, 9], Normal, true)], |x| ops::log_softmax(&x[0]));
// Masked softmax: a per-query mask (B, 1, T1, T2) whose first row is fully
// masked, and a key-padding mask (B, 1, 1, T2).
grad!(masked_softmax_per_query, [([2, 2, 3, 5], Normal, true)], |x| {
    let m = [1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0];
    ops::masked_softmax(&x[0], &u8t(&m, &[2, 1, 3, 5]))
});
grad!(masked_softmax_key_padding, [([2, 3, 2, 4], Normal, true)], |x| ops::masked_softmax(&x[0], &u8t(&[0, 0, 1, 1, 0, 0, 0, 1], &[2, 1, 1, 4])));
// Flash attention: rel-pos with a shared table, key lengths and a chunk
// with one left chunk; plain causal with a key-padding tensor and dropout
// (the generator reseeded, so every evaluation draws the same mask).
grad!(
    flash_attention_rel_pos,
    [
        ([2, 5, 2, 3], Normal, true),
        ([2, 6, 2, 3], Normal, true),
        ([2, 6, 2, 3], Normal, true),
        ([1, 6, 2, 3], Normal, true),
        ([2, 3], Normal, true),
        ([2, 3], Normal, true)
    ],
    |x| {
        let m = ops::FlashMask { key_lengths: Some(vec![6, 4]), chunk: Some((2, 1)), ..Default::default() };
        ops::flash_attention(&x[0], &x[1], &x[2], Some(ops::RelPos { p: &x[3], u: &x[4], vb: &x[5] }), &m, 0.0, false)
    }
);
grad!(flash_attention_causal_dropout, [([2, 4, 2, 3], Normal, true), ([2, 4, 2, 3], Normal, true), ([2, 4, 2, 3], Normal, true)], |x| {
    rng::manual_seed(11);
    let m = ops::FlashMask { causal: true, mask: Some(u8t(&[0, 0, 0, 1, 0, 0, 1, 1], &[2, 1, 1, 4])), ..Default::default() };
    ops::flash_attention(&x[0], &x[1], &x[2], None, &m, 0.3, true)
});
// The packed operands (the `qkv` fusion's ops): one self-attention
// projection (B, T, 3·H·d) with relative positions and key lengths, and q
// with one key/value projection (B, T2, 2·H·d), causal and dropout.
grad!(flash_attention_qkv_rel_pos, [([2, 5, 18], Normal, true), ([1, 5, 2, 3], Normal, true), ([2, 3], Normal, true), ([2, 3], Normal, true)], |x| {
    let m = ops::FlashMask { key_lengths: Some(vec![5, 3]), ..Default::default() };
    ops::flash_attention_qkv(&x[0], 2, Some(ops::RelPos { p: &x[1], u: &x[2], vb: &x[3] }), &m, 0.0, false)
});
grad!(flash_attention_q_kv_dropout, [([2, 4, 2, 3], Normal, true), ([2, 6, 12], Normal, true)], |x| {
    rng::manual_seed(13);
    let m = ops::FlashMask { key_lengths: Some(vec![6, 2]), ..Default::default() };
    ops::flash_attention_q_kv(&x[0], &x[1], None, &m, 0.3, true)
});
// Concatenations along dim 0 converted in one launch (the packed
// projection weights): two outputs of 2 + 3 rows and of one row, flattened.
grad!(cat_cast_many, [([2, 4], Normal, true), ([3, 4], Normal, true), ([1, 5], Normal, true)], |x| {
    let ys = ops::cat_cast_many(&[vec![x[0].clone(), x[1].clone()], vec![x[2].clone()]], x[0].dtype())?;
    ops::cat(&[&ops::reshape(&ys[0], [20])?, &ops::reshape(&ys[1], [5])?], 0)
});
// Products.
grad!(matmul, [([5, 4], Normal, true), ([4, 3], Normal, true)], |x| ops::matmul(&x[0], &x[1]));
grad!(matmul_ta, [([4, 5], Normal, true), ([4, 3], Normal, true)], |x| ops::matmul_t(&x[0], &x[1], true, false));
grad!(matmul_tb, [([5, 4], Normal, true), ([3, 4], Normal, true)], |x| ops::matmul_t(&x[0], &x[1], false, true));
grad!(matmul_ta_tb, [([4, 5], Normal, true), ([3, 4], Normal, true)], |x| ops::matmul_t(&x[0], &x[1], true, true));
grad!(bmm, [([2, 5, 4], Normal, true), ([2, 4, 3], Normal, true)], |x| ops::matmul(&x[0], &x[1]));
grad!(bmm_4d_tb, [([2, 3, 5, 4], Normal, true), ([2, 3, 6, 4], Normal, true)], |x| ops::matmul_t(&x[0], &x[1], false, true));
grad!(bmm_ta, [([2, 4, 5], Normal, true), ([2, 4, 3], Normal, true)], |x| ops::matmul_t(&x[0], &x[1], true, false));
grad!(matmul_shared_right, [([2, 5, 4], Normal, true), ([4, 3], Normal, true)], |x| ops::matmul(&x[0], &x[1]));
grad!(matmul_shared_right_ta, [([2, 4, 5], Normal, true), ([3, 4], Normal, true)], |x| ops::matmul_t(&x[0], &x[1], true, true));
grad!(matmul_shared_left, [([4, 5], Normal, true), ([2, 5, 3], Normal, true)], |x| ops::matmul(&x[0], &x[1]));
grad!(matmul_scaled, [([5, 4], Normal, true), ([4, 3], Normal, true)], |x| ops::matmul_scaled(&x[0], &x[1], false, false, 0.35));
grad!(matmul_scaled_ta_tb, [([4, 5], Normal, true), ([3, 4], Normal, true)], |x| ops::matmul_scaled(&x[0], &x[1], true, true, -1.7));
grad!(matmul_scaled_4d_tb, [([2, 3, 5, 4], Normal, true), ([2, 3, 6, 4], Normal, true)], |x| ops::matmul_scaled(&x[0], &x[1], false, true, 0.125));
grad!(matmul_scaled_shared_right, [([2, 5, 4], Normal, true), ([3, 4], Normal, true)], |x| ops::matmul_scaled(&x[0], &x[1], false, true, 0.6));
grad!(matmul_scaled_shared_left, [([4, 5], Normal, true), ([2, 5, 3], Normal, true)], |x| ops::matmul_scaled(&x[0], &x[1], false, false, 1.3));
grad!(matmul_pair_scaled, [([2, 3, 5, 4], Normal, true), ([2, 3, 6, 4], Normal, true), ([2, 3, 5, 4], Normal, true), ([2, 3, 6, 4], Normal, true)], |x| {
    ops::matmul_pair_scaled(&x[0], &x[1], &x[2], &x[3], false, true, 0.4)
});
grad!(matmul_pair_scaled_ta, [([4, 5], Normal, true), ([4, 3], Normal, true), ([2, 5], Normal, true), ([2, 3], Normal, false)], |x| ops::matmul_pair_scaled(
    &x[0], &x[1], &x[2], &x[3], true, false, -0.9
));
grad!(linear, [([2, 3, 4], Normal, true), ([5, 4], Normal, true), ([5], Normal, true)], |x| ops::linear(&x[0], &x[1], Some(&x[2])));
// Products reading one activation add their gradients for it into what it
// has gathered (autograd's accumulators: a GEMM with beta 1) as x → q, k, v
// do: `h` feeds a linear, a plain and a scaled product (each either operand)
// and a pair; `s = h + z` hands h and z one shared gradient, which no
// product may write into; `matmul(h, h)` reads h twice in one node.
grad!(
    products_sharing_an_input,
    [([2, 5, 4], Normal, true), ([3, 4], Normal, true), ([3], Normal, true), ([4, 4], Normal, true), ([6, 4], Normal, true), ([2, 5, 4], Normal, true)],
    |x| {
        let (h, z) = (ops::tanh(&x[0])?, ops::tanh(&x[5])?);
        let s = ops::add(&h, &z)?;
        let a = ops::linear(&h, &x[1], Some(&x[2]))?;
        let b = ops::matmul_t(&h, &x[3], false, true)?;
        let c = ops::matmul_scaled(&h, &x[4], false, true, 0.7)?;
        let d = ops::matmul_pair_scaled(&h, &x[3], &s, &x[3], false, true, 0.3)?;
        let e = ops::matmul_t(&x[3], &ops::reshape(&z, [10, 4])?, false, true)?;
        let f = ops::reshape(&ops::matmul_t(&h, &h, false, true)?, [2, 5, 5])?;
        let e = ops::reshape(&ops::matmul_t(&e, &x[3], true, false)?, [2, 5, 4])?;
        ops::cat(&[&a, &b, &c, &d, &e, &f, &s], -1)
    }
);
// Layout.
grad!(reshape, [([2, 3, 4], Normal, true)], |x| ops::reshape(&x[0], [6, 4]));
grad!(permute, [([2, 3, 4], Normal, true)], |x| ops::permute(&x[0], &[2, 0, 1]));
grad!(transpose, [([2, 3, 5], Normal, true)], |x| ops::transpose(&x[0], 1, 2));
grad!(unsqueeze_squeeze_flatten, [([2, 3, 5], Normal, true)], |x| ops::flatten(&ops::squeeze(&ops::unsqueeze(&x[0], 1)?, 1)?, 0, 1));
grad!(narrow, [([3, 7, 2], Normal, true)], |x| ops::narrow(&x[0], 1, 2, 4));
grad!(pad, [([3, 4], Normal, true)], |x| ops::pad(&x[0], 1, 2, 1, 0.5));
grad!(cat, [([2, 3, 4], Normal, true), ([2, 1, 4], Normal, true), ([2, 5, 4], Normal, true)], |x| ops::cat(&[&x[0], &x[1], &x[2]], 1));
grad!(stack, [([3, 4], Normal, true), ([3, 4], Normal, true)], |x| ops::stack(&[&x[0], &x[1]], 1));
// Indexing.
grad!(index_select, [([3, 5, 2], Normal, true)], |x| ops::index_select(&x[0], 1, &i64t(&[4, 0, 4, 2], &[4])));
grad!(gather, [([3, 5], Normal, true)], |x| ops::gather(&x[0], 1, &i64t(&[0, 4, 4, 1, 2, 2, 3, 0, 1], &[3, 3])));
grad!(embedding, [([6, 4], Normal, true)], |x| ops::embedding(&x[0], &i64t(&[1, 5, 1, 0, 3, 1], &[2, 3])));
grad!(masked_fill, [([2, 3, 4], Normal, true)], |x| ops::masked_fill(&x[0], &u8t(&[1, 0, 0, 1, 0, 1, 1, 0], &[2, 1, 4]), -3.0));
grad!(where_cond, [([2, 4], Normal, true), ([2, 4], Normal, true)], |x| ops::where_cond(&u8t(&[1, 0, 1, 1], &[1, 4]), &x[0], &x[1]));
// Normalisation.
grad!(layer_norm_affine, [([3, 7], Normal, true), ([7], Normal, true), ([7], Normal, true)], |x| ops::layer_norm(&x[0], Some(&x[1]), Some(&x[2]), 1e-5));
grad!(layer_norm_plain, [([2, 3, 6], Normal, true)], |x| ops::layer_norm(&x[0], None, None, 1e-5));
// A pre-norm residual `h + linear(layer_norm(h))`: on a GPU the norm's
// backward adds what h gathered through the skip in its own launch.
grad!(layer_norm_pre_norm_residual, [([2, 3, 6], Normal, true), ([6], Normal, true), ([6], Normal, true), ([6, 6], Normal, true)], |x| {
    let h = ops::tanh(&x[0])?;
    ops::add(&h, &ops::linear(&ops::layer_norm(&h, Some(&x[1]), Some(&x[2]), 1e-5)?, &x[3], None)?)
});
// The residual add fused with the next norm: both outputs (the backward adds
// the gradient that reached s directly), the norm's output only, the sum only.
grad!(add_layer_norm_both, [([3, 7], Normal, true), ([3, 7], Normal, true), ([7], Normal, true), ([7], Normal, true)], |x| {
    let (s, h) = ops::add_layer_norm(&x[0], &x[1], 0.5, 0.0, Some(&x[2]), Some(&x[3]), 1e-5)?;
    ops::cat(&[&s, &h], 0)
});
grad!(add_layer_norm_h_only, [([2, 3, 6], Normal, true), ([2, 3, 6], Normal, true)], |x| Ok(ops::add_layer_norm(&x[0], &x[1], 1.0, 0.0, None, None, 1e-5)?.1));
grad!(add_layer_norm_s_only, [([3, 5], Normal, true), ([3, 5], Normal, true), ([5], Normal, false), ([5], Normal, false)], |x| {
    Ok(ops::add_layer_norm(&x[0], &x[1], -1.5, 0.0, Some(&x[2]), Some(&x[3]), 1e-5)?.0)
});
// With the branch's dropout folded in (the mask from the seeded generator).
grad!(add_layer_norm_dropout_both, [([3, 7], Normal, true), ([3, 7], Normal, true), ([7], Normal, true), ([7], Normal, true)], |x| {
    rng::manual_seed(5);
    let (s, h) = ops::add_layer_norm(&x[0], &x[1], 0.5, 0.3, Some(&x[2]), Some(&x[3]), 1e-5)?;
    ops::cat(&[&s, &h], 0)
});
// With rows of the branch masked (a module's padded frames), with and
// without the dropout; the sum only takes the add's own backward.
grad!(add_layer_norm_row_mask_both, [([2, 3, 7], Normal, true), ([2, 3, 7], Normal, true), ([7], Normal, true), ([7], Normal, true)], |x| {
    rng::manual_seed(5);
    let m = u8t(&[1, 0, 0, 0, 1, 1], &[2, 3, 1]);
    let (s, h) = ops::add_layer_norm_masked(&x[0], &x[1], Some(&m), 0.5, 0.3, Some(&x[2]), Some(&x[3]), 1e-5)?;
    ops::cat(&[&s, &h], 0)
});
grad!(add_layer_norm_row_mask_h_only, [([4, 6], Normal, true), ([4, 6], Normal, true)], |x| {
    Ok(ops::add_layer_norm_masked(&x[0], &x[1], Some(&u8t(&[0, 1, 1, 0], &[4, 1])), 1.0, 0.0, None, None, 1e-5)?.1)
});
grad!(add_layer_norm_row_mask_s_only, [([3, 5], Normal, true), ([3, 5], Normal, true), ([5], Normal, false), ([5], Normal, false)], |x| {
    Ok(ops::add_layer_norm_masked(&x[0], &x[1], Some(&u8t(&[0, 1, 0], &[3, 1])), -1.5, 0.0, Some(&x[2]), Some(&x[3]), 1e-5)?.0)
});
grad!(batch_norm_train, [([4, 3, 5], Normal, true), ([3], Normal, true), ([3], Normal, true)], |x| {
    let (rm, rv) = (like(&[0.0; 3], &x[0]), like(&[1.0; 3], &x[0]));
    ops::batch_norm(&x[0], &x[1], &x[2], &BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true })
});
grad!(batch_norm_train_2d, [([6, 3], Normal, true), ([3], Normal, true), ([3], Normal, true)], |x| {
    let (rm, rv) = (like(&[0.0; 3], &x[0]), like(&[1.0; 3], &x[0]));
    ops::batch_norm(&x[0], &x[1], &x[2], &BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true })
});
grad!(batch_norm_eval_2d, [([7, 3], Normal, true), ([3], Normal, true), ([3], Normal, true)], |x| {
    let (rm, rv) = (like(&[0.3, -0.2, 0.1], &x[0]), like(&[1.5, 0.7, 2.0], &x[0]));
    ops::batch_norm(&x[0], &x[1], &x[2], &BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: false })
});
grad!(batch_norm_eval, [([2, 3, 5], Normal, true), ([3], Normal, true), ([3], Normal, true)], |x| {
    let (rm, rv) = (like(&[0.3, -0.2, 0.1], &x[0]), like(&[1.5, 0.7, 2.0], &x[0]));
    ops::batch_norm(&x[0], &x[1], &x[2], &BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: false })
});
// The conformer convolution module between its GEMMs: a (B, T, 2C), the
// GLU frame mask (B, T, 1), depthwise weight and bias, the norm's weight and
// bias. The CPU runs the composition; the fusion switch's convmodule family
// is turned on here so that the Cuda(0) column runs the fused kernels (only
// conv_module_core reads it).
fn conv_core(x: &[Tensor], mask: &[u8], padding: usize, batch: bool) -> asrforge::Result<Tensor> {
    let mut on = ops::fusion::enabled_families();
    on.push(ops::fusion::Fusion::ConvModule);
    ops::fusion::set_enabled(&on);
    let (b, t) = (x[0].dims()[0], x[0].dims()[1]);
    let m = u8t(mask, &[b, t, 1]).to_device(&x[0].device())?;
    let c = x[2].dims()[0];
    let (rm, rv) = (like(&vec![0.1; c], &x[0]), like(&vec![0.9; c], &x[0]));
    let norm = if batch {
        ops::ConvCoreNorm::Batch {
            weight: &x[3],
            bias: &x[4],
            state: BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true },
        }
    } else {
        ops::ConvCoreNorm::Layer { weight: &x[3], bias: &x[4], eps: 1e-5 }
    };
    ops::conv_module_core(&x[0], Some(&m), &x[1], Some(&x[2]), padding, &norm)
}
// Batch norm in training removes any per-channel shift of its input, so the
// depthwise bias's gradient is exactly 0 there: it is not differentiated
// (a relative check of a zero gradient compares rounding noise).
grad!(
    conv_module_core_batch_norm,
    [([2, 6, 6], Normal, true), ([3, 1, 3], Normal, true), ([3], Normal, false), ([3], Normal, true), ([3], Normal, true)],
    |x| conv_core(x, &[0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0], 1, true)
);
// Causal: two left-context frames, a valid conv (To = T − 2).
grad!(
    conv_module_core_layer_norm_causal,
    [([2, 7, 8], Normal, true), ([4, 1, 3], Normal, true), ([4], Normal, true), ([4], Normal, true), ([4], Normal, true)],
    |x| conv_core(x, &[0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0], 0, false)
);
// The feed-forward activation and its dropout (the `ffn` fusion's op).
grad!(activation_dropout_silu, [([4, 6], Normal, true)], |x| {
    rng::manual_seed(9);
    ops::activation_dropout(&x[0], asrforge::backend::cpu::elementwise::Unary::Silu, 0.3, true)
});
// The positional encoding and its dropout (the `posenc` fusion's op): rows
// 2..7 of a table of 9 (a constant), and the scale alone (relative positions).
grad!(pos_enc_dropout_table, [([2, 5, 6], Normal, true), ([1, 9, 6], Normal, false)], |x| {
    rng::manual_seed(11);
    ops::pos_enc_dropout(&x[0], 2.5, Some((&x[1], 2)), x[0].dtype(), 0.3, true)
});
grad!(pos_enc_dropout_scale_only, [([3, 4, 5], Normal, true)], |x| {
    rng::manual_seed(12);
    ops::pos_enc_dropout(&x[0], 8f64.sqrt(), None, x[0].dtype(), 0.2, true)
});
grad!(dropout, [([4, 6], Normal, true)], |x| {
    rng::manual_seed(7);
    ops::dropout(&x[0], 0.3, true)
});
// Convolutions.
// conv1d_depthwise is channels last: x (B, T, C).
grad!(conv1d_depthwise, [([2, 9, 3], Normal, true), ([3, 1, 3], Normal, true), ([3], Normal, true)], |x| ops::conv1d_depthwise(&x[0], &x[1], Some(&x[2]), 1));
grad!(conv1d_depthwise_k5_nobias, [([1, 7, 4], Normal, true), ([4, 1, 5], Normal, true)], |x| ops::conv1d_depthwise(&x[0], &x[1], None, 2));
// Kernel longer than the padded input's interior: taps that never see x.
grad!(conv1d_depthwise_k7_p4, [([2, 3, 2], Normal, true), ([2, 1, 7], Normal, true), ([2], Normal, true)], |x| ops::conv1d_depthwise(
    &x[0],
    &x[1],
    Some(&x[2]),
    4
));
grad!(conv1d_pointwise_channels_last, [([2, 5, 3], Normal, true), ([4, 3, 1], Normal, true), ([4], Normal, true)], |x| {
    ops::conv1d_pointwise_channels_last(&x[0], &x[1], Some(&x[2]))
});
grad!(conv2d_stride2, [([2, 1, 9, 8], Normal, true), ([3, 1, 3, 3], Normal, true), ([3], Normal, true)], |x| ops::conv2d(&x[0], &x[1], Some(&x[2]), 2, 0));
// The subsampling's convolution and ReLU (the `subsampling` fusion's op).
grad!(conv2d_relu_stride2, [([2, 2, 9, 8], Normal, true), ([3, 2, 3, 3], Normal, true), ([3], Normal, true)], |x| ops::conv2d_relu(
    &x[0],
    &x[1],
    Some(&x[2]),
    2,
    0
));
grad!(conv2d_pad1, [([1, 2, 6, 5], Normal, true), ([3, 2, 3, 3], Normal, true)], |x| ops::conv2d(&x[0], &x[1], None, 1, 1));
// Stride and padding together: the padded ends of the strided column walks.
grad!(conv2d_stride2_pad2, [([2, 2, 7, 6], Normal, true), ([2, 2, 3, 3], Normal, true)], |x| ops::conv2d(&x[0], &x[1], None, 2, 2));
grad!(conv1d_pointwise, [([2, 3, 5], Normal, true), ([4, 3, 1], Normal, true), ([4], Normal, true)], |x| ops::conv1d_pointwise(&x[0], &x[1], Some(&x[2])));
// Losses.
grad!(ctc_loss_raw_log_probs, [([2, 6, 4], Normal, true)], |x| {
    ops::ctc_loss(&x[0], &i64t(&[1, 2, 2, 3, 0, 0], &[2, 3]), &[6, 5], &[3, 1], 0, Reduction::None, false)
});
grad!(ctc_loss_after_log_softmax_sum, [([3, 7, 5], Normal, true)], |x| {
    let lp = ops::log_softmax(&x[0])?;
    ops::ctc_loss(&lp, &i64t(&[1, 1, 2, 4, 3, 0, 2, 0, 0], &[3, 3]), &[7, 6, 3], &[3, 2, 1], 0, Reduction::Sum, false)
});
// A label equal to the blank id (PyTorch forbids it; asrforge's kernels
// accept it): β's skips must mirror α's for the gradient to be the derivative.
grad!(ctc_loss_raw_log_probs_blank_label, [([2, 6, 4], Normal, true)], |x| {
    ops::ctc_loss(&x[0], &i64t(&[1, 0, 3, 0, 2, 0], &[2, 3]), &[6, 5], &[3, 2], 0, Reduction::None, false)
});
grad!(ctc_loss_fused_sum, [([3, 7, 5], Normal, true)], |x| {
    ops::ctc_loss_fused(&x[0], &i64t(&[1, 1, 2, 4, 3, 0, 2, 0, 0], &[3, 3]), &[7, 6, 3], &[3, 2, 1], 0, Reduction::Sum, false)
});
grad!(ctc_loss_fused_mean_blank_label, [([2, 5, 3], Normal, true)], |x| {
    ops::ctc_loss_fused(&x[0], &i64t(&[1, 0, 2, 0], &[2, 2]), &[5, 4], &[2, 1], 0, Reduction::Mean, true)
});
grad!(ctc_loss_mean, [([2, 5, 3], Normal, true)], |x| {
    let lp = ops::log_softmax(&x[0])?;
    ops::ctc_loss(&lp, &i64t(&[1, 2, 2, 0], &[2, 2]), &[5, 4], &[2, 1], 0, Reduction::Mean, true)
});
grad!(label_smoothing_by_tokens, [([2, 4, 6], Normal, true)], |x| {
    ops::label_smoothing_loss(&x[0], &i64t(&[1, 5, 0, -1, 2, 2, -1, -1], &[2, 4]), 0.1, -1, true)
});
grad!(label_smoothing_by_batch, [([3, 2, 5], Normal, true)], |x| { ops::label_smoothing_loss(&x[0], &i64t(&[4, -1, 0, 3, 1, 1], &[3, 2]), 0.2, -1, false) });
grad!(label_smoothing_none, [([2, 2, 4], Normal, true)], |x| ops::label_smoothing_loss(&x[0], &i64t(&[3, 0, -1, 2], &[2, 2]), 0.0, -1, true));
grad!(label_smoothing_fused_by_tokens, [([2, 4, 6], Normal, true)], |x| {
    ops::label_smoothing_loss_fused(&x[0], &i64t(&[1, 5, 0, -1, 2, 2, -1, -1], &[2, 4]), 0.1, -1, true)
});
grad!(label_smoothing_fused_by_batch, [([3, 2, 5], Normal, true)], |x| {
    ops::label_smoothing_loss_fused(&x[0], &i64t(&[4, -1, 0, 3, 1, 1], &[3, 2]), 0.2, -1, false)
});
grad!(label_smoothing_fused_none, [([2, 2, 4], Normal, true)], |x| ops::label_smoothing_loss_fused(&x[0], &i64t(&[3, 0, -1, 2], &[2, 2]), 0.0, -1, true));
// Activation checkpointing as an op: the segment's gradient equals the plain one's.
grad!(checkpoint_segment, [([3, 4], Normal, true), ([4, 4], Normal, true)], |x| {
    let w = x[1].clone();
    let outs = asrforge::autograd::checkpoint(move |xs: &[Tensor]| Ok(vec![ops::tanh(&ops::matmul(&xs[0], &w)?)?]), &x[..1])?;
    Ok(outs[0].clone())
});

#[test]
fn f32_inputs_are_accepted_by_every_float_op() {
    // The table above runs in f64; a forward in f32 must agree with it.
    let mut rng = Rng::new(fresh_seed());
    let a = Tensor::randn([3, 5], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let a32 = Tensor::from_cpu(a.to_cpu_storage().unwrap().to_dtype(DType::F32), [3, 5]).unwrap();
    let y64 = ops::log_softmax(&ops::gelu(&a).unwrap()).unwrap().to_f64_vec().unwrap();
    let y32 = ops::log_softmax(&ops::gelu(&a32).unwrap()).unwrap().to_f64_vec().unwrap();
    common::assert_vec("f32 vs f64", &y32, &y64, 1e-5);
}
