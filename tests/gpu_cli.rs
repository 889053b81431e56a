//! The command line on `Cuda(0)` (a GPU, or the emulated one in CI):
//! `train --device cuda` with cv passes and checkpoints, `recognize --device
//! cuda` decoding its checkpoint exactly as the CPU does (and in fp16/bf16),
//! a resume on the GPU, and `bench-train --device cuda` in fp32, fp16 and
//! bf16 with its losses against the CPU's. Each run is the real binary, with
//! fresh device allocations poisoned (`ASRFORGE_CUDA_POISON=1`: a buffer a
//! kernel never writes reads NaN) and the grid capped, as the kernel tests.
//! Skips, saying why, where no GPU can be used; fails instead where one is
//! required (`ASRFORGE_CUDA_EMU=1`).

mod common;
mod train_common;

use asrforge::train::run_train;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Runs the binary with `args`; returns stdout and stderr, panicking with both unless it succeeded.
fn run(args: &[String]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_asrforge"))
        .args(args)
        .env("ASRFORGE_CUDA_POISON", "1")
        .env("ASRFORGE_CUDA_MAX_GRID", common::gpu::TEST_MAX_GRID.to_string())
        .output()
        .expect("run asrforge");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "asrforge {} failed ({}):\n{stderr}\n{stdout}", args.join(" "), out.status);
    assert!(!stderr.contains("panicked"), "asrforge {} panicked:\n{stderr}", args.join(" "));
    (stdout, stderr)
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn p(dir: &Path, f: &str) -> String {
    dir.join(f).display().to_string()
}

/// `key text` lines of a result file, by key.
fn hyps(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| l.split_once(' ').map_or((l.to_string(), String::new()), |(k, t)| (k.to_string(), t.to_string()))).collect()
}

/// Decodes `checkpoint` in every mode into `dir/sub`, on `device` in `dtype`.
fn recognize(dir: &Path, checkpoint: &Path, sub: &str, device: &str, dtype: &str) -> Vec<BTreeMap<String, String>> {
    let mut a = s(&["recognize", "--device", device, "--dtype", dtype, "--beam_size", "3", "--batch_size", "2", "--ctc_weight", "0.3"]);
    // The train.yaml that training wrote next to its checkpoints (input_dim, output_dim and CMVN resolved).
    let config = checkpoint.parent().expect("a checkpoint folder").join("train.yaml");
    a.extend(s(&["--config", &config.display().to_string(), "--test_data", &p(dir, "data.list"), "--symbol_table", &p(dir, "units.txt")]));
    a.extend(s(&["--checkpoint", &checkpoint.display().to_string(), "--result_dir", &p(dir, sub), "--modes"]));
    a.extend(asrforge::decode::recognize::MODES.iter().map(|m| m.to_string()));
    run(&a);
    asrforge::decode::recognize::MODES.iter().map(|m| hyps(&dir.join(sub).join(m).join("text"))).collect()
}

/// The cv loss an epoch's yaml holds.
fn cv_loss(dir: &Path, e: u64) -> f64 {
    let y: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join(format!("epoch_{e}.yaml"))).expect("epoch yaml")).expect("yaml");
    y["cv_loss"].as_f64().unwrap_or_else(|| panic!("epoch_{e}.yaml has no cv_loss"))
}

/// Characters that differ between two hypothesis sets (edit distance over
/// the concatenated texts per key), and the reference's length.
fn char_errors(got: &BTreeMap<String, String>, want: &BTreeMap<String, String>) -> (usize, usize) {
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "the same utterances decoded");
    let mut errs = 0;
    let mut total = 0;
    for (k, w) in want {
        let (g, w): (Vec<char>, Vec<char>) = (got[k].chars().collect(), w.chars().collect());
        let mut row: Vec<usize> = (0..=g.len()).collect();
        for (i, wc) in w.iter().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, gc) in g.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(wc != gc)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        errs += row[g.len()];
        total += w.len();
    }
    (errs, total)
}

#[test]
fn train_then_recognize_on_the_gpu_decodes_as_the_cpu_does_and_resumes() {
    let test = "train_then_recognize_on_the_gpu_decodes_as_the_cpu_does_and_resumes";
    let Some(_) = common::gpu::gpu(test) else { return };
    let dir = train_common::tmpdir("gpu-cli");
    train_common::setup(&dir, 6, &train_common::tiny_yaml(0.0, 3, 2, ""));

    // 60 epochs on the CPU (a few seconds) fit the six utterances, so the
    // decoded hypotheses are real, varied transcripts; then train --device
    // cuda continues from that checkpoint for two epochs, each with a cv pass
    // and a checkpoint, and writes final.safetensors.
    let common_args = |model_dir: &str| {
        let mut a = s(&["train", "--num_workers", "1", "--seed", "7", "--config", &p(&dir, "train.yaml"), "--override_config", "optim_conf.lr 0.01"]);
        a.extend(s(&["--model_dir", &p(&dir, model_dir), "--tensorboard_dir", &p(&dir, "tb"), "--train_data", &p(&dir, "data.list")]));
        a.extend(s(&["--cv_data", &p(&dir, "data.list"), "--symbol_table", &p(&dir, "units.txt")]));
        a
    };
    let mut a = common_args("cpu");
    a.extend(s(&["--override_config", "max_epoch 60"]));
    run(&a);
    for (model_dir, device) in [("exp", "cuda"), ("cpu-more", "cpu")] {
        let mut a = common_args(model_dir);
        a.extend(s(&["--device", device, "--override_config", "max_epoch 62", "--checkpoint", &p(&dir, "cpu/epoch_59.safetensors")]));
        run(&a);
    }
    let exp = dir.join("exp");
    for e in 60..62 {
        // The same two epochs continued on the CPU: f32 on both, only the
        // order of sums differs (1e-4 relative, as tests/train_gpu.rs).
        let (g, c) = (cv_loss(&exp, e), cv_loss(&dir.join("cpu-more"), e));
        assert!(g.is_finite() && (g - c).abs() <= 1e-4 * c.abs(), "epoch {e}: cv loss on the GPU {g} vs the CPU {c}");
    }
    let final_ckpt = exp.join("final.safetensors");
    assert!(final_ckpt.is_file(), "train --device cuda writes final.safetensors");

    // recognize --device cuda equals recognize --device cpu on that checkpoint, in every mode
    // (f32 on both: the logits differ by reordered sums, ≈1e-6 relative).
    let cpu = recognize(&dir, &final_ckpt, "dec-cpu", "cpu", "fp32");
    let gpu = recognize(&dir, &final_ckpt, "dec-gpu", "cuda", "fp32");
    for (m, mode) in asrforge::decode::recognize::MODES.iter().enumerate() {
        assert_eq!(gpu[m], cpu[m], "{mode}: the GPU's hypotheses equal the CPU's");
    }
    for (m, mode) in asrforge::decode::recognize::MODES.iter().enumerate() {
        let distinct: std::collections::BTreeSet<&String> = cpu[m].values().collect();
        assert!(distinct.len() >= 3, "{mode}: the hypotheses differ between utterances, so the comparison means something: {:?}", cpu[m]);
    }

    // Half-precision decoding: the same model rounded to fp16/bf16 per op. A
    // token flips only where two logits are within the half type's rounding
    // of each other; bound the character differences to the fp32 result.
    for (dtype, bound) in [("fp16", 0.05), ("bf16", 0.15)] {
        let half = recognize(&dir, &final_ckpt, &format!("dec-{dtype}"), "cuda", dtype);
        for (m, mode) in asrforge::decode::recognize::MODES.iter().enumerate() {
            let (errs, total) = char_errors(&half[m], &gpu[m]);
            assert!(errs as f64 <= bound * total.max(1) as f64, "{mode} in {dtype}: {errs} of {total} characters differ from fp32 (bound {bound})");
        }
    }

    // A resume on the GPU from epoch_0 reproduces the uninterrupted run's second epoch.
    let mut full = train_common::args(&dir, "full");
    full.device = "cuda".into();
    let full_run = run_train(&full).expect("uninterrupted run on the GPU");
    let mut resumed = train_common::args(&dir, "resumed");
    resumed.device = "cuda".into();
    resumed.checkpoint = Some(full.model_dir.join("epoch_0.safetensors"));
    let resumed_run = run_train(&resumed).expect("resumed run on the GPU");
    let n = resumed_run.history.len();
    assert!(n >= 1 && n < full_run.history.len(), "the resumed run trains only the second epoch ({n} of {} steps)", full_run.history.len());
    let tail = &full_run.history[full_run.history.len() - n..];
    for (i, (r, f)) in resumed_run.history.iter().zip(tail).enumerate() {
        // The same kernels on the same inputs in the same order: bitwise.
        assert_eq!(r.loss.to_bits(), f.loss.to_bits(), "resumed step {i}: loss {} vs the uninterrupted {}", r.loss, f.loss);
    }
    assert_eq!(cv_loss(&resumed.model_dir, 1).to_bits(), cv_loss(&full.model_dir, 1).to_bits(), "epoch 1's cv loss after a resume");
}

/// `key=value` fields of bench-train's result line.
fn bench(device: &str, dtype: &str) -> BTreeMap<String, String> {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml");
    let (out, err) = run(&s(&["bench-train", "--config", cfg, "--steps", "3", "--batch_size", "2", "--frames", "64", "--device", device, "--dtype", dtype]));
    let line = out.lines().chain(err.lines()).find(|l| l.starts_with("bench-train ")).unwrap_or_else(|| panic!("no bench-train line in:\n{out}\n{err}"));
    line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn num(f: &BTreeMap<String, String>, k: &str) -> f64 {
    f.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bench-train printed no number {k}: {f:?}"))
}

#[test]
fn bench_train_on_the_gpu_matches_the_cpu_losses_in_fp32_fp16_and_bf16() {
    let Some(_) = common::gpu::gpu("bench_train_on_the_gpu_matches_the_cpu_losses_in_fp32_fp16_and_bf16") else { return };
    let cpu = bench("cpu", "fp32");
    // Relative tolerances on a loss that is a sum over ~10³ terms: fp32 sums
    // reordered (≈1e-6); under autocast every matmul input and activation is
    // rounded once to the half type (fp16 2⁻¹¹, bf16 2⁻⁸ relative), and the
    // errors of independent roundings average out in the sum, so the loss
    // moves by a small multiple of that over √terms; the bounds below are
    // the half ulp of each type divided by 5.
    for (dtype, tol) in [("fp32", 1e-5), ("fp16", 1e-4), ("bf16", 8e-4)] {
        let gpu = bench("cuda", dtype);
        assert_eq!(gpu["device"], "Cuda(0)");
        assert!(gpu.contains_key("launches"), "bench-train --device cuda prints the per-step counters: {gpu:?}");
        assert_eq!(num(&gpu, "driver_allocs"), 0.0, "{dtype}: no driver allocation in a steady step");
        // The host waits for the device once a step: the fused optimizer
        // step's outcome (the gradient norm and, under fp16, the loss
        // scaler's inf flag, in one read-back); the losses' copy, queued
        // after the backward, has run by then.
        let syncs = 1.0;
        assert!(num(&gpu, "host_syncs") <= syncs, "{dtype}: {} host synchronisations in a steady step, expected at most {syncs}", num(&gpu, "host_syncs"));
        for k in ["init_loss", "first_loss"] {
            let (g, c) = (num(&gpu, k), num(&cpu, k));
            assert!((g - c).abs() <= tol * c.abs(), "{dtype} {k}: GPU {g} vs CPU fp32 {c} (tolerance {tol:e} relative)");
        }
        // fp16 skips its first steps while the loss scaler comes down from 2^16,
        // as PyTorch's GradScaler does; fp32 and bf16 update every step.
        if dtype != "fp16" {
            assert_eq!(num(&gpu, "skipped"), 0.0, "{dtype}: no skipped step");
            let (g, c) = (num(&gpu, "last_loss"), num(&cpu, "last_loss"));
            assert!((g - c).abs() <= tol * c.abs(), "{dtype} last_loss after two updates: GPU {g} vs CPU fp32 {c}");
        }
    }
}
