//! Training on `Cuda(0)` (the GPU, or the emulated one): a tiny model trains
//! two epochs with a cv pass after each, from the same seed and data as on
//! the CPU, and its step losses and cv losses match the CPU's. The cv pass
//! reads the loader's CPU batches, which must reach the model's device the
//! way the training step's do (`Executor::forward`). Skips, saying why,
//! where no GPU can be used; fails instead where one is required.

mod common;
mod train_common;

use asrforge::train::run_train;

/// The cv loss the run saved with `epoch_{e}`.
fn cv_loss(dir: &std::path::Path, e: u64) -> f64 {
    let infos: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join(format!("epoch_{e}.yaml"))).unwrap()).unwrap();
    infos["cv_loss"].as_f64().unwrap_or_else(|| panic!("epoch_{e}.yaml has no cv_loss"))
}

#[test]
fn train_on_the_gpu_runs_its_cv_pass_and_matches_the_cpu() {
    let Some(_) = common::gpu::gpu("train_on_the_gpu_runs_its_cv_pass_and_matches_the_cpu") else { return };
    let dir = train_common::tmpdir("train-gpu");
    let cpu_args = train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 2, 2, ""));
    let cpu = run_train(&cpu_args).expect("training on the CPU");
    let mut gpu_args = train_common::args(&dir, "exp-gpu");
    gpu_args.device = "cuda".into();
    let gpu = run_train(&gpu_args).expect("training on the GPU, cv passes included");
    assert_eq!(gpu.history.len(), cpu.history.len(), "the same number of steps");
    assert!(!cpu.history.is_empty());
    // f32 on both; only the order of sums differs, and two epochs of Adam
    // move the weights little: 1e-4 relative leaves room for that drift.
    for (i, (g, c)) in gpu.history.iter().zip(&cpu.history).enumerate() {
        assert!((g.loss - c.loss).abs() <= 1e-4 * c.loss.abs(), "step {i}: loss on the GPU {} vs the CPU {}", g.loss, c.loss);
    }
    for e in 0..2 {
        let (g, c) = (cv_loss(&gpu_args.model_dir, e), cv_loss(&cpu_args.model_dir, e));
        assert!(g.is_finite() && (g - c).abs() <= 1e-4 * c.abs(), "epoch {e}: cv loss on the GPU {g} vs the CPU {c}");
    }
}
