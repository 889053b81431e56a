//! Optimizer, schedulers, clipping and the loss scaler against their definitions.

use asrforge::optim::{clip_grad_norm, grad_norm, Adam, AdamConfig, GradScaler, NoamHoldAnnealing, ScalerConfig, Scheduler, WarmupLR};
use asrforge::{Device, Tensor};

fn param(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), [v.len()], &Device::Cpu).unwrap().requires_grad_()
}
fn grad(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), [v.len()], &Device::Cpu).unwrap()
}
fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * b.abs().max(1e-300)
}

/// Adam by its definition, on one scalar parameter.
fn adam_ref(p0: f64, grads: &[f64], lr: f64, wd: f64, decoupled: bool) -> f64 {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
    let (mut p, mut m, mut v) = (p0, 0.0, 0.0);
    for (i, &g0) in grads.iter().enumerate() {
        let t = (i + 1) as i32;
        let g = if decoupled { g0 } else { g0 + wd * p };
        if decoupled {
            p -= lr * wd * p;
        }
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        p -= lr * (m / (1.0 - b1.powi(t))) / ((v / (1.0 - b2.powi(t))).sqrt() + eps);
    }
    p
}

#[test]
fn adam_and_adamw_follow_their_update_rules() {
    for (wd, decoupled) in [(0.0, false), (0.01, false), (0.1, true)] {
        let p = param(&[0.5, -1.5]);
        let cfg = AdamConfig { lr: 0.01, weight_decay: wd, decoupled, ..Default::default() };
        let mut opt = Adam::new(vec![("w".into(), p.clone())], cfg).unwrap();
        let gs = [[0.3, -2.0], [0.1, 0.5], [-0.4, 1.0]];
        for g in gs {
            p.set_grad(Some(grad(&g))).unwrap();
            opt.step(0.01).unwrap();
        }
        let got = p.to_vec::<f64>().unwrap();
        for j in 0..2 {
            let want = adam_ref([0.5, -1.5][j], &gs.iter().map(|g| g[j]).collect::<Vec<_>>(), 0.01, wd, decoupled);
            assert!(close(got[j], want, 1e-12), "wd {wd} decoupled {decoupled}: got {} want {want}", got[j]);
        }
        // The first step moves each parameter by about lr, whatever the gradient's size.
        assert_eq!(opt.step, 3);
        let st = opt.state();
        assert_eq!(st[0].0, "w.exp_avg");
        assert_eq!(st[1].0, "w.exp_avg_sq");
    }
}

#[test]
fn adam_state_round_trips() {
    let p = param(&[1.0]);
    let mut a = Adam::new(vec![("p".into(), p.clone())], AdamConfig::default()).unwrap();
    p.set_grad(Some(grad(&[0.5]))).unwrap();
    a.step(1e-3).unwrap();
    let q = param(&[1.0]);
    let mut b = Adam::new(vec![("p".into(), q.clone())], AdamConfig::default()).unwrap();
    let saved: Vec<(String, Tensor)> = a.state().into_iter().map(|(k, t)| (k, t.detach())).collect();
    b.load_state(&saved, a.step).unwrap();
    q.assign(&p).unwrap();
    for opt in [&mut a, &mut b] {
        opt.params()[0].1.set_grad(Some(grad(&[-0.25]))).unwrap();
        opt.step(1e-3).unwrap();
    }
    assert_eq!(p.to_vec::<f64>().unwrap(), q.to_vec::<f64>().unwrap(), "resumed optimizer steps identically");
    assert!(b.load_state(&[], 1).unwrap_err().to_string().contains("missing key p.exp_avg"));
}

#[test]
fn warmup_lr_values() {
    let mut s = WarmupLR { base_lr: 0.002, warmup_steps: 25000.0, min_lr: 0.0, steps: 0 };
    // n = 1: base·w^0.5·w^−1.5 = base / w
    assert!(close(s.lr(), 0.002 / 25000.0, 1e-12), "{}", s.lr());
    s.set_steps(24999); // n = w: the peak, base
    assert!(close(s.lr(), 0.002, 1e-12), "{}", s.lr());
    s.set_steps(99999); // n = 4w: base·(w/n)^0.5 = base/2
    assert!(close(s.lr(), 0.001, 1e-12), "{}", s.lr());
    s.step();
    assert_eq!(s.steps(), 100000);
    let s0 = WarmupLR { base_lr: 1.0, warmup_steps: 0.0, min_lr: 0.3, steps: 3 };
    assert!(close(s0.lr(), 0.5, 1e-12));
    let floor = WarmupLR { base_lr: 1.0, warmup_steps: 4.0, min_lr: 0.9, steps: 15 };
    assert_eq!(floor.lr(), 0.9, "min_lr applies after warmup");
}

#[test]
fn noam_hold_annealing_values() {
    let mut s = NoamHoldAnnealing::new(1e-3, 1000, None, 0.1, None, 0.2, 0.5, 1e-5);
    assert_eq!((s.warmup_steps, s.hold_until), (100, 300));
    assert!(close(s.lr(), 1e-3 / 101.0, 1e-12));
    s.set_steps(100);
    assert!(close(s.lr(), 1e-3, 1e-12));
    s.set_steps(250);
    assert_eq!(s.lr(), 1e-3, "held");
    s.set_steps(400); // base·100^0.5/100^0.5
    assert!(close(s.lr(), 1e-3, 1e-12));
    s.set_steps(700); // base·10/20
    assert!(close(s.lr(), 5e-4, 1e-12));
    s.set_steps(1001);
    assert_eq!(s.lr(), 1e-5);
}

#[test]
fn clipping_scales_to_the_max_norm() {
    let (a, b) = (param(&[0.0, 0.0]), param(&[0.0]));
    a.set_grad(Some(grad(&[3.0, 0.0]))).unwrap();
    b.set_grad(Some(grad(&[4.0]))).unwrap();
    let ps = vec![("a".to_string(), a.clone()), ("b".to_string(), b.clone())];
    assert_eq!(grad_norm(&ps).unwrap(), 5.0);
    let n = clip_grad_norm(&ps, 1.0).unwrap();
    assert_eq!(n, 5.0, "the norm before clipping is returned");
    let c = 1.0 / (5.0 + 1e-6);
    assert_eq!(a.grad().unwrap().to_vec::<f64>().unwrap(), vec![3.0 * c, 0.0]);
    assert_eq!(b.grad().unwrap().to_vec::<f64>().unwrap(), vec![4.0 * c]);
    // Below the max nothing changes; a NaN norm is reported and left alone.
    assert!(close(clip_grad_norm(&ps, 10.0).unwrap(), 1.0, 1e-6));
    b.set_grad(Some(grad(&[f64::NAN]))).unwrap();
    assert!(clip_grad_norm(&ps, 1.0).unwrap().is_nan());
}

#[test]
fn loss_scaler_skips_inf_steps_backs_off_and_grows() {
    let p = param(&[1.0, 2.0]);
    let ps = vec![("p".to_string(), p.clone())];
    let mut s = GradScaler::new(ScalerConfig::default());
    assert_eq!(s.scale, 65536.0);
    let loss = Tensor::from_vec(vec![0.5f64], [1], &Device::Cpu).unwrap();
    assert_eq!(s.scale_loss(&loss).unwrap().to_scalar().unwrap(), 32768.0);
    // Clean step: gradients unscaled, nothing skipped.
    p.set_grad(Some(grad(&[65536.0, -131072.0]))).unwrap();
    assert!(!s.unscale(&ps).unwrap());
    assert_eq!(p.grad().unwrap().to_vec::<f64>().unwrap(), vec![1.0, -2.0]);
    assert!(!s.should_skip());
    s.update();
    assert_eq!((s.scale, s.growth_tracker), (65536.0, 1));
    // Injected inf: skip, back off by half, tracker reset, counted.
    p.set_grad(Some(grad(&[f64::INFINITY, 1.0]))).unwrap();
    assert!(s.unscale(&ps).unwrap());
    assert!(s.should_skip());
    s.update();
    assert_eq!((s.scale, s.growth_tracker, s.skipped), (32768.0, 0, 1));
    p.set_grad(Some(grad(&[f64::NAN, 1.0]))).unwrap();
    assert!(s.unscale(&ps).unwrap());
    s.update();
    assert_eq!((s.scale, s.skipped), (16384.0, 2));
    // 2000 clean steps in a row double the scale; 1999 do not.
    for i in 0..2000 {
        p.set_grad(Some(grad(&[1.0, 1.0]))).unwrap();
        assert!(!s.unscale(&ps).unwrap());
        s.update();
        if i == 1998 {
            assert_eq!(s.scale, 16384.0);
        }
    }
    assert_eq!((s.scale, s.growth_tracker), (32768.0, 0));
}
