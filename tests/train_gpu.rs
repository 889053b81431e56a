//! Training on `Cuda(0)` (the GPU, or the emulated one): a tiny model trains
//! two epochs with a cv pass after each, from the same seed and data as on
//! the CPU, and its step losses and cv losses match the CPU's. The cv pass
//! reads the loader's CPU batches, which must reach the model's device the
//! way the training step's do (`Executor::forward`). Skips, saying why,
//! where no GPU can be used; fails instead where one is required.

mod common;
mod train_common;

use asrforge::models::{AsrModel, ModelConfig};
use asrforge::nn::Module;
use asrforge::tensor::{DType, Device, Rng};
use asrforge::train::bench::synthetic_batch;
use asrforge::train::{
    init_optimizer_and_scheduler, move_model, parse_train_config, run_train, BatchLoss, Executor, ExecutorParts, Resume, SingleProcess, StepReport,
};

/// The cv loss the run saved with `epoch_{e}`.
fn cv_loss(dir: &std::path::Path, e: u64) -> f64 {
    let infos: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join(format!("epoch_{e}.yaml"))).unwrap()).unwrap();
    infos["cv_loss"].as_f64().unwrap_or_else(|| panic!("epoch_{e}.yaml has no cv_loss"))
}

#[test]
fn train_on_the_gpu_runs_its_cv_pass_and_matches_the_cpu() {
    let Some(_) = common::gpu::gpu("train_on_the_gpu_runs_its_cv_pass_and_matches_the_cpu") else { return };
    // The device's counters are process-wide: the tests of this file take turns.
    let _s = common::gpu::serial();
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

/// Mixed precision trains like f32: 50 steps of the tiny config on the GPU.
/// bf16 stays within 1e-2 relative of the f32 run's loss at every step;
/// fp16 holds its initial weights through the steps its loss scaler skips
/// and then learns; both bring the loss down.
#[test]
fn fp16_and_bf16_loss_curves_follow_f32_for_50_steps() {
    use asrforge::train::bench::{run_bench_train, BenchTrainArgs};
    let Some(_) = common::gpu::gpu("fp16_and_bf16_loss_curves_follow_f32_for_50_steps") else { return };
    // The device's counters are process-wide: the tests of this file take turns.
    let _s = common::gpu::serial();
    let curve = |dtype: &str| {
        let a = BenchTrainArgs {
            config: concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml").into(),
            // A short warm-up, so that 50 steps move the weights; no dropout,
            // so a step's loss depends on the weights alone (the synthetic
            // batch is the same every step).
            override_config: [
                "scheduler_conf.warmup_steps 10",
                // Half the config's peak rate: at 0.002 the late steps (loss
                // ~0.75, one batch over-fitted) are chaotic enough that a
                // last-bit change in f32's own sum order moves the f32 curve
                // by ~1 % (seen when reductions changed order), so a 1e-2
                // comparison there measured that chaos, not bf16. At 0.001 the
                // bf16 run stays within 0.5 % (measured max 0.50 % at step 50).
                "optim_conf.lr 0.001",
                "encoder_conf.dropout_rate 0.0",
                "encoder_conf.positional_dropout_rate 0.0",
                "decoder_conf.dropout_rate 0.0",
                "decoder_conf.positional_dropout_rate 0.0",
            ]
            .map(String::from)
            .to_vec(),
            steps: 50,
            device: "cuda".into(),
            dtype: dtype.into(),
            batch_size: 2,
            frames: 64,
            seed: 7,
            warmup: 1,
            profile: false,
            tf32: false,
        };
        run_bench_train(&a).unwrap_or_else(|e| panic!("bench-train --device cuda --dtype {dtype}: {e}"))
    };
    let f32_run = curve("fp32");
    let want = &f32_run.losses;
    assert_eq!(want.len(), 50);
    assert!(want[49] < 0.9 * want[0], "f32 learns: {} -> {}", want[0], want[49]);
    // bf16 has no loss scaler: step by step within 1e-2 of f32.
    let bf16 = curve("bf16");
    let rel: Vec<f64> = bf16.losses.iter().zip(want).map(|(g, w)| (g - w).abs() / w.abs()).collect();
    eprintln!("f32 {want:?}\nbf16 {:?}\nrelative {rel:?}", bf16.losses);
    assert_eq!((bf16.losses.len(), bf16.skipped), (50, 0));
    for (i, (g, w)) in bf16.losses.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-2 * w.abs(), "bf16 step {i}: loss {g} vs f32 {w} (more than 1e-2 relative)");
    }
    assert!(bf16.losses[49] < 0.9 * bf16.losses[0], "bf16 learns: {} -> {}", bf16.losses[0], bf16.losses[49]);
    // fp16's scaler starts at 2^16, as PyTorch's GradScaler, and skips its
    // first steps while it halves to a scale with finite gradients: those
    // steps keep the initial weights (f32's first loss, within 1e-2); the
    // schedule moves on meanwhile, so the later curve is not f32's step for
    // step (with this warm-up it ends a few per cent lower), but it learns.
    let fp16 = curve("fp16");
    let lag = fp16.skipped as usize;
    assert!((1..=5).contains(&lag), "fp16 skips its first few steps, not {lag}");
    for (i, g) in fp16.losses.iter().take(lag + 1).enumerate() {
        assert!((g - want[0]).abs() <= 1e-2 * want[0], "fp16 step {i} (weights not yet updated): loss {g} vs f32's first {}", want[0]);
    }
    assert!(fp16.losses[49] < 0.9 * fp16.losses[0], "fp16 learns: {} -> {}", fp16.losses[0], fp16.losses[49]);
}

/// `steps` optimizer steps of the tiny model (no dropout) on `device`, each
/// over `accum` distinct batches. With `per_batch` the losses are read after
/// every batch (`last_batch`, a wait of its own each); without, only after
/// the step. Returns each step's report, its batches' losses as read and
/// the host synchronisations each step took (on a GPU).
fn accumulated_steps(device: &Device, accum: usize, steps: usize, per_batch: bool) -> Vec<(StepReport, Vec<BatchLoss>, u64)> {
    let yaml = format!("input_dim: 20\noutput_dim: 9\n{}", train_common::tiny_yaml(0.0, 2, 1, ""));
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let mut cfg = parse_train_config(&root).unwrap();
    cfg.accum_grad = accum;
    let (mcfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let model = AsrModel::new(&mcfg, DType::F32, &mut Rng::new(1)).unwrap();
    move_model(&model, device).unwrap();
    let optim = init_optimizer_and_scheduler(&cfg, &Resume::default()).unwrap();
    let engine = Box::new(SingleProcess::new(model.named_parameters(), optim.adam).unwrap());
    let mut e = Executor::new(ExecutorParts { device: *device, ..ExecutorParts::new(model, engine, optim, cfg) });
    let syncs = || match device {
        Device::Cuda(n) => asrforge::backend::cuda::counters(*n).unwrap().host_syncs,
        Device::Cpu => 0,
    };
    let mut out = Vec::new();
    for step in 0..steps {
        let mut read = Vec::new();
        let before = syncs();
        for k in 0..accum {
            // Distinct batches, so a loss read into the wrong batch's place shows.
            e.train_batch(&synthetic_batch(2 + k, 40 + 8 * k, 20, 9, (10 * step + k) as u64).unwrap()).unwrap();
            if per_batch {
                read.push(e.last_batch().unwrap().expect("a batch was trained"));
            }
        }
        assert!(e.step_due(), "{accum} batches make a step");
        let rep = e.optimizer_step().unwrap();
        let took = syncs() - before;
        if !per_batch {
            read.push(e.last_batch().unwrap().expect("a batch was trained"));
        }
        out.push((rep, read, took));
    }
    out
}

/// A training step waits for the GPU once, whatever its accumulation: each
/// batch's losses are queued for the host after its backward and read after
/// the optimizer step's own read-back (before: one wait per batch and one
/// for the step). The values read so are the batches' own: each step's mean
/// loss and its last batch's loss, CTC and attention losses and accuracy
/// match the CPU's, read batch by batch (which also checks that reading a
/// batch's losses early still works on the GPU, a wait of its own).
#[test]
fn a_training_step_waits_for_the_gpu_once_and_reads_its_batches_losses() {
    let Some(dev) = common::gpu::gpu("a_training_step_waits_for_the_gpu_once_and_reads_its_batches_losses") else { return };
    // It counts the device's process-wide host synchronisations: no other test of this file runs meanwhile.
    let _s = common::gpu::serial();
    for accum in [1, 3] {
        let cpu = accumulated_steps(&Device::Cpu, accum, 2, true);
        let gpu = accumulated_steps(&dev, accum, 2, false);
        let early = accumulated_steps(&dev, accum, 1, true);
        for (s, ((g, gl, syncs), (c, cl, _))) in gpu.iter().zip(&cpu).enumerate() {
            assert_eq!(*syncs, 1, "accum_grad {accum} step {s}: host synchronisations in one step");
            let close = |what: &str, a: f64, b: f64| {
                assert!((a - b).abs() <= 1e-4 * b.abs().max(1e-3), "accum_grad {accum} step {s}: {what} on the GPU {a} vs the CPU {b}")
            };
            let cpu_mean = cl.iter().map(|b| b.loss).sum::<f64>() / accum as f64;
            close("step loss", g.loss, c.loss);
            close("step loss vs the CPU's batches' mean", g.loss, cpu_mean);
            let (gb, cb) = (gl[0], cl[accum - 1]);
            assert_eq!((gb.utts, gb.frames), (cb.utts, cb.frames), "accum_grad {accum} step {s}: the last batch");
            close("last batch's loss", gb.loss, cb.loss);
            for (what, a, b) in [("loss_ctc", gb.loss_ctc, cb.loss_ctc), ("loss_att", gb.loss_att, cb.loss_att), ("th_accuracy", gb.acc, cb.acc)] {
                close(what, a.expect("on the GPU"), b.expect("on the CPU"));
            }
        }
        // Reading each batch early gives the same values (the wait that
        // costs while a copy still runs is cuda_emu's read-back test).
        let (rep, read, _) = &early[0];
        let late = gpu[0].0.loss;
        assert!((rep.loss - late).abs() <= 1e-6 * late.abs(), "accum_grad {accum}: the first step's loss read early {} vs late {late}", rep.loss);
        assert_eq!(read.len(), accum);
    }
}
