//! The gradient-ready hook of `backward_with_hooks` (what DDP's bucketed
//! all-reduce relies on): every leaf on the tape is reported exactly once,
//! after the last node that adds to its gradient, so the gradient seen at
//! report time is already the final one; leaves are reported in the order
//! the reverse walk finishes them; a leaf an activation-checkpointed segment
//! may touch waits for the checkpoint node.

use asrforge::autograd::{self, backward_with_hooks, checkpoint};
use asrforge::ops;
use asrforge::{Device, Tensor};

fn leaf(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), [v.len()], &Device::Cpu).unwrap().requires_grad_()
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-12 * (1.0 + y.abs()))
}

#[test]
fn each_leaf_is_reported_once_with_its_final_gradient_in_reverse_readiness_order() {
    let (av, bv, cv) = ([0.5, -1.5], [2.0, 3.0], [-1.0, 0.25]);
    let (a, b, c) = (leaf(&av), leaf(&bv), leaf(&cv));
    // loss = Σ (a·a·b + a)·c: a is used by the first and the third node, b by the second, c by the fourth.
    let h1 = ops::mul(&a, &a).unwrap();
    let h2 = ops::mul(&h1, &b).unwrap();
    let h3 = ops::add(&h2, &a).unwrap();
    let loss = ops::sum_all(&ops::mul(&h3, &c).unwrap()).unwrap();
    let mut seen: Vec<(String, Vec<f64>)> = Vec::new();
    let name = |t: &Tensor| {
        if t.same_storage(&a) {
            "a"
        } else if t.same_storage(&b) {
            "b"
        } else {
            "c"
        }
    };
    backward_with_hooks(&loss, &mut |t: &Tensor| {
        seen.push((name(t).to_string(), t.grad().expect("a reported leaf has its gradient").to_vec::<f64>().unwrap()));
        Ok(())
    })
    .unwrap();
    let order: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order, ["c", "b", "a"], "c finishes first, a (also used by the first node) last");
    // The analytic gradients: dc = a²b + a, db = a²c, da = (2ab + 1)c.
    let want_c: Vec<f64> = (0..2).map(|i| av[i] * av[i] * bv[i] + av[i]).collect();
    let want_b: Vec<f64> = (0..2).map(|i| av[i] * av[i] * cv[i]).collect();
    let want_a: Vec<f64> = (0..2).map(|i| (2.0 * av[i] * bv[i] + 1.0) * cv[i]).collect();
    for ((n, at_hook), (t, want)) in seen.iter().zip([(&c, &want_c), (&b, &want_b), (&a, &want_a)]) {
        assert!(close(at_hook, want), "{n} at report time {at_hook:?}, analytic {want:?}");
        assert!(close(&t.grad().unwrap().to_vec::<f64>().unwrap(), want), "{n} after backward");
    }
    assert_eq!(autograd::tape_len(), 0, "the tape is emptied");
}

#[test]
fn a_leaf_a_checkpointed_segment_may_use_waits_for_the_checkpoint_node() {
    let (xv, uv, wv) = ([1.5, -2.0, 0.5], [0.5, 2.0, -1.0], [3.0, -0.5, 2.0]);
    let x = Tensor::from_vec(xv.to_vec(), [3], &Device::Cpu).unwrap();
    let (u, w) = (leaf(&uv), leaf(&wv));
    let (uc, wc) = (u.clone(), w.clone());
    // The segment computes x·u·w; u is also used outside it, later: loss = Σ (x·u·w)·u.
    let seg = checkpoint(move |xs: &[Tensor]| Ok(vec![ops::mul(&ops::mul(&xs[0], &uc)?, &wc)?]), &[x]).unwrap();
    let loss = ops::sum_all(&ops::mul(&seg[0], &u).unwrap()).unwrap();
    let mut seen: Vec<(bool, Vec<f64>)> = Vec::new();
    backward_with_hooks(&loss, &mut |t: &Tensor| {
        seen.push((t.same_storage(&u), t.grad().unwrap().to_vec::<f64>().unwrap()));
        Ok(())
    })
    .unwrap();
    // Only u is on the outer tape; w lives only inside the segment and is never reported.
    assert_eq!(seen.len(), 1, "one report: {seen:?}");
    assert!(seen[0].0);
    let want_u: Vec<f64> = (0..3).map(|i| 2.0 * xv[i] * uv[i] * wv[i]).collect();
    let want_w: Vec<f64> = (0..3).map(|i| xv[i] * uv[i] * uv[i]).collect();
    assert!(close(&seen[0].1, &want_u), "u at report time {:?} vs {want_u:?}: the segment's share was already in", seen[0].1);
    assert!(close(&w.grad().unwrap().to_vec::<f64>().unwrap(), &want_w));
}

#[test]
fn an_error_from_the_hook_ends_backward_and_clears_the_tape() {
    let a = leaf(&[1.0, 2.0]);
    let loss = ops::sum_all(&ops::mul(&a, &a).unwrap()).unwrap();
    let e = backward_with_hooks(&loss, &mut |_| Err(asrforge::Error::Msg("peer gone".into()))).unwrap_err();
    assert_eq!(e.to_string(), "peer gone");
    assert_eq!(autograd::tape_len(), 0);
}
