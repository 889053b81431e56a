//! `bench-train` on the CPU: its first two losses equal the ones the
//! trainer's pieces give when called by hand (forward, backward, clipping,
//! Adam at the schedule's rate), its loss decreases, the command prints one
//! parseable line, and `--device cuda` without a usable GPU is a one-line error.

mod train_common;

use asrforge::autograd::backward;
use asrforge::models::{AsrModel, ModelConfig};
use asrforge::nn::Module;
use asrforge::optim::{clip_grad_norm, Adam};
use asrforge::tensor::{DType, Rng};
use asrforge::train::bench::{run_bench_train, synthetic_batch, BenchTrainArgs};
use asrforge::train::{init_optimizer_and_scheduler, parse_train_config, Resume};
use std::path::PathBuf;

fn config(dir: &std::path::Path) -> PathBuf {
    let yaml = format!("input_dim: 20\noutput_dim: 9\n{}", train_common::tiny_yaml(0.0, 2, 1, ""));
    let p = dir.join("train.yaml");
    std::fs::write(&p, yaml).unwrap();
    p
}

fn args(config: PathBuf, steps: u64) -> BenchTrainArgs {
    BenchTrainArgs {
        config,
        override_config: vec![],
        steps,
        device: "cpu".into(),
        dtype: "fp32".into(),
        batch_size: 3,
        frames: 64,
        seed: 9,
        warmup: 1,
        profile: false,
        tf32: false,
    }
}

#[test]
fn first_losses_equal_the_trainers_math_and_loss_decreases() {
    let dir = train_common::tmpdir("bench_train_math");
    let a = args(config(&dir), 6);
    let rep = run_bench_train(&a).unwrap();
    assert_eq!(rep.losses.len(), 6);
    assert_eq!(rep.skipped, 0);
    assert!(rep.frames_per_s > 0.0 && rep.peak_bytes > 0, "{rep:?}");

    // The same two steps by hand.
    let root = asrforge::train::read_config(&a.config, &[]).unwrap();
    let cfg = parse_train_config(&root).unwrap();
    let (mcfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let model = AsrModel::new(&mcfg, DType::F32, &mut Rng::new(a.seed)).unwrap();
    let b = synthetic_batch(a.batch_size, a.frames, 20, 9, a.seed + 1).unwrap();
    let params = model.named_parameters();
    let mut optim = init_optimizer_and_scheduler(&cfg, &Resume::default()).unwrap();
    let mut adam = Adam::new(params.clone(), optim.adam).unwrap();
    let mut losses = vec![];
    for _ in 0..2 {
        let out = model.forward(&b.feats, &b.feats_lengths, &b.target, &b.target_lengths).unwrap();
        losses.push(out.loss.to_scalar().unwrap());
        backward(&out.loss).unwrap();
        clip_grad_norm(&params, cfg.grad_clip).unwrap();
        adam.step(optim.scheduler.lr()).unwrap();
        adam.zero_grad();
        optim.scheduler.step();
    }
    for s in 0..2 {
        let rel = (rep.losses[s] - losses[s]).abs() / losses[s].abs();
        assert!(rel < 1e-6, "step {}: bench {} vs by hand {}", s + 1, rep.losses[s], losses[s]);
    }
    assert!(losses[1] < losses[0], "one step lowers the loss: {losses:?}");
    // Dropout is 0, so the eval-mode loss at initialisation is the first step's.
    assert!((rep.init_loss - losses[0]).abs() / losses[0] < 1e-6, "{} vs {}", rep.init_loss, losses[0]);
    assert!(rep.losses[5] < 0.8 * rep.losses[0], "loss decreases: {:?}", rep.losses);
}

#[test]
fn the_command_prints_one_line_and_refuses_a_missing_gpu() {
    let dir = train_common::tmpdir("bench_train_cli");
    let cfg = config(&dir);
    let bin = env!("CARGO_BIN_EXE_asrforge");
    let out = std::process::Command::new(bin)
        .args(["bench-train", "--config"])
        .arg(&cfg)
        .args(["--steps", "2", "--batch_size", "3", "--frames", "64", "--seed", "9", "--dtype", "bf16"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(line.starts_with("bench-train device=Cpu dtype=bf16 fusion=none steps=2 "), "{line}");
    let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{k}="))).map(|v| v.parse::<f64>().unwrap());
    let lib = run_bench_train(&BenchTrainArgs { dtype: "bf16".into(), ..args(cfg.clone(), 2) }).unwrap();
    assert!((field("first_loss").unwrap() - lib.losses[0]).abs() < 1e-5, "{line} vs {:?}", lib.losses);
    assert!(field("last_loss").unwrap() < field("first_loss").unwrap(), "{line}");

    if asrforge::tensor::Device::cuda(0).is_ok() {
        eprintln!("a GPU is usable here; the missing-GPU error is not checked");
        return;
    }
    let out = std::process::Command::new(bin).args(["bench-train", "--config"]).arg(&cfg).args(["--steps", "1", "--device", "cuda"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--device") && err.contains("cuda"), "{err}");
}
