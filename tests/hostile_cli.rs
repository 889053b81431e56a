//! The "hostile user" suite: the real binary on bad input. Each case is a
//! row of the table below — how to set up its directory, the command line,
//! the exit code expected, the words its stderr must hold (the file, key or
//! rank at fault) — and one shared runner checks every row the same way:
//! the exit code, the words, no panic or backtrace text, and a model_dir
//! with no temporary files and none of the files the case forbids.
//!
//! To add a case: write a `fn setup_x(dir) -> Vec<String>` that prepares
//! `dir` and returns the arguments, add a `Case` row, and a `hostile!` line.

#[path = "data_common/mod.rs"]
mod data_common;
#[path = "dist_common/mod.rs"]
mod dist_common;
mod train_common;

use std::path::Path;
use std::process::Command;

/// One bad input and what the binary must do with it.
struct Case {
    /// Prepares the directory; returns the command line (without the binary).
    setup: fn(&Path) -> Vec<String>,
    /// Extra environment variables.
    env: &'static [(&'static str, &'static str)],
    /// The exit code expected.
    rc: i32,
    /// Words stderr must contain (the file, key or rank named, the reason).
    stderr_has: &'static [&'static str],
    /// Words stderr must not contain.
    stderr_lacks: &'static [&'static str],
    /// File-name prefixes that must not be in `dir/exp` afterwards (besides any `.tmp`).
    forbidden_in_model_dir: &'static [&'static str],
}

/// Text that only a panic, an abort or a backtrace prints.
const CRASH_TEXT: &[&str] = &["panicked at", "stack backtrace", "RUST_BACKTRACE", "memory allocation of", "core dumped", "Aborted"];

/// Runs one case in a fresh directory named after it and checks everything.
fn check(name: &str, case: &Case) {
    let dir = train_common::tmpdir(&format!("hostile-{name}"));
    let args = (case.setup)(&dir);
    // ASRFORGE_HOSTILE_BIN runs the table against another build (a before/after comparison).
    let bin = std::env::var("ASRFORGE_HOSTILE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_asrforge").to_string());
    let out = Command::new(bin)
        .args(&args)
        .envs(case.env.iter().copied())
        .env("RUST_BACKTRACE", "1")
        .env_remove("WORLD_SIZE")
        .env_remove("RANK")
        .env_remove("ASRFORGE_RDZV_TOKEN")
        .output()
        .expect("run the binary");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let code = out.status.code().unwrap_or(-1);
    assert_eq!(code, case.rc, "{name}: exit code {code} (expected {}); stderr:\n{err}", case.rc);
    for w in case.stderr_has {
        assert!(err.contains(w), "{name}: stderr lacks {w:?}:\n{err}");
    }
    for w in case.stderr_lacks.iter().chain(CRASH_TEXT) {
        assert!(!err.contains(w), "{name}: stderr has {w:?}:\n{err}");
    }
    let model_dir = dir.join("exp");
    if let Ok(rd) = std::fs::read_dir(&model_dir) {
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().to_string();
            assert!(!f.contains(".tmp"), "{name}: temporary file {f} left in {}", model_dir.display());
            for p in case.forbidden_in_model_dir {
                assert!(!f.starts_with(p), "{name}: {f} left in {} after a failed run", model_dir.display());
            }
        }
    }
}

macro_rules! hostile {
    ($name:ident, $case:expr) => {
        #[test]
        fn $name() {
            check(stringify!($name), &$case);
        }
    };
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn p(dir: &Path, f: &str) -> String {
    dir.join(f).display().to_string()
}

/// A tiny corpus of `n` utterances, units.txt and train.yaml (with `extra`
/// YAML); returns a `train` command line over it writing into `dir/exp`.
fn train_setup(dir: &Path, n: usize, extra: &str) -> Vec<String> {
    train_common::setup(dir, n, &train_common::tiny_yaml(0.0, 2, 1, extra));
    train_args(dir, "data.list")
}

fn train_args(dir: &Path, train_list: &str) -> Vec<String> {
    let mut a = s(&["train", "--num_workers", "1", "--config"]);
    a.push(p(dir, "train.yaml"));
    for (flag, f) in
        [("--model_dir", "exp"), ("--tensorboard_dir", "tb"), ("--train_data", train_list), ("--cv_data", "data.list"), ("--symbol_table", "units.txt")]
    {
        a.push(flag.into());
        a.push(p(dir, f));
    }
    a
}

// ---- defect 1: a run whose cv loss is non-finite says so and fails --------

fn setup_huge_lr(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 6, "");
    a.extend(s(&["--override_config", "optim_conf.lr 1e30", "--override_config", "scheduler_conf.warmup_steps 1"]));
    a
}

const HUGE_LR: Case = Case {
    setup: setup_huge_lr,
    env: &[],
    rc: 1,
    stderr_has: &["cv loss is NaN", "not saving epoch_0"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &["epoch_0"],
};

// ---- defect 2: recognize skips an utterance past the positional table ----

const RECOGNIZE_CONFIG: &str = "input_dim: 20
output_dim: 9
encoder: conformer
encoder_conf: {output_size: 16, attention_heads: 2, linear_units: 16, num_blocks: 1, input_layer: conv2d, cnn_module_kernel: 3}
decoder: transformer
decoder_conf: {attention_heads: 2, linear_units: 16, num_blocks: 1}
dataset_conf:
  resample_conf: {resample_rate: 8000}
  fbank_conf: {num_mel_bins: 20, frame_shift: 10, frame_length: 25, dither: 0.0}
  batch_conf: {batch_type: static, batch_size: 2}
tokenizer: char
";

fn setup_recognize_long(dir: &Path) -> Vec<String> {
    let lines = train_common::setup(dir, 3, RECOGNIZE_CONFIG).train_data;
    let mut list = std::fs::read_to_string(&lines).unwrap();
    // 205 s at 8 kHz: 20 499 frames, 5 123 encoder frames after 1/4 subsampling; the table holds 5 000.
    let long = dir.join("long.wav");
    data_common::write_wav(&long, &data_common::sine(300.0, 8000, 205.0, 0.3), 8000, 16);
    list.push_str(&format!("{{\"key\": \"long_utt\", \"wav\": \"{}\", \"txt\": \"A\"}}\n", long.display()));
    std::fs::write(&lines, list).unwrap();
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(RECOGNIZE_CONFIG).unwrap();
    let (cfg, _) = asrforge::models::ModelConfig::from_yaml(&root).unwrap();
    let model = asrforge::models::AsrModel::without_cmvn_stats(&cfg, asrforge::DType::F32, &mut asrforge::tensor::Rng::new(3)).unwrap();
    asrforge::models::save_checkpoint(&model, &dir.join("final.safetensors"), &serde_yaml_ng::Value::Null).unwrap();
    let mut a = s(&["recognize", "--modes", "ctc_greedy_search", "--batch_size", "2"]);
    for (flag, f) in [
        ("--config", "train.yaml"),
        ("--test_data", "data.list"),
        ("--checkpoint", "final.safetensors"),
        ("--result_dir", "exp"),
        ("--symbol_table", "units.txt"),
    ] {
        a.push(flag.into());
        a.push(p(dir, f));
    }
    a
}

const RECOGNIZE_LONG: Case = Case {
    setup: setup_recognize_long,
    env: &[],
    rc: 0,
    stderr_has: &["long_utt (beyond_model)", "at most 5000 encoder frames", "ctc_greedy_search: 3 utterances"],
    stderr_lacks: &["error:"],
    forbidden_in_model_dir: &[],
};

// ---- defect 3: training on nothing is an error naming the rank -----------

fn setup_empty_list(dir: &Path) -> Vec<String> {
    train_setup(dir, 4, "");
    std::fs::write(dir.join("empty.list"), "").unwrap();
    train_args(dir, "empty.list")
}

const EMPTY_TRAIN_LIST: Case = Case {
    setup: setup_empty_list,
    env: &[],
    rc: 1,
    stderr_has: &["no training data: rank 0 formed 0 batches", "empty.list"],
    stderr_lacks: &["trained 0 batches"],
    forbidden_in_model_dir: &["epoch_"],
};

fn setup_raw_as_shard(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--data_type", "shard"]));
    a
}

const RAW_LIST_AS_SHARD: Case = Case {
    setup: setup_raw_as_shard,
    env: &[],
    rc: 1,
    // Each JSON line is taken for a shard path that does not exist.
    stderr_has: &["rank 0 formed 0 batches (skipped 4 (missing_file 4))", "data.list"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &["epoch_"],
};

/// Two ranks over a list of one good line and seven missing files: the
/// (shuffled) partition leaves one rank with nothing but missing files.
fn setup_rank_without_files(dir: &Path) -> Vec<String> {
    train_setup(dir, 4, "");
    let good = std::fs::read_to_string(dir.join("data.list")).unwrap().lines().next().unwrap().to_string();
    let mut lines = vec![good];
    for i in 0..7 {
        lines.push(format!("{{\"key\": \"gone{i}\", \"wav\": \"{}\", \"txt\": \"A\"}}", dir.join(format!("gone{i}.wav")).display()));
    }
    std::fs::write(dir.join("holes.list"), lines.join("\n") + "\n").unwrap();
    let port = dist_common::free_port().to_string();
    let mut a = s(&["launch", "--nproc_per_node", "2", "--master_port", &port]);
    a.extend(train_args(dir, "holes.list"));
    a.extend(s(&["--timeout", "20", "--dist_backend", "gloo"]));
    a
}

const RANK_WITHOUT_FILES: Case = Case {
    setup: setup_rank_without_files,
    env: &[],
    rc: 1,
    stderr_has: &["formed 0 batches (skipped", "missing_file", "holes.list", "data per rank: rank 0 skipped", "; rank 1 skipped"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &["epoch_"],
};

// ---- defect 4: units.txt is validated, naming the file and line ----------

fn setup_duplicate_id(dir: &Path) -> Vec<String> {
    let a = train_setup(dir, 4, "");
    std::fs::write(dir.join("units.txt"), "<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 3\nC 5\nD 6\nE 7\n<sos/eos> 8\n").unwrap();
    a
}

const UNITS_DUPLICATE_ID: Case = Case {
    setup: setup_duplicate_id,
    env: &[],
    rc: 1,
    stderr_has: &["units.txt: line 5: id 3 of `B` is already the id of `A` (line 4)"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &["init", "epoch_"],
};

fn setup_units_gap(dir: &Path) -> Vec<String> {
    let a = train_setup(dir, 4, "");
    std::fs::write(dir.join("units.txt"), "<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 4\nC 5\nD 6\nE 7\n<sos/eos> 19\n").unwrap();
    a
}

const UNITS_GAP: Case = Case {
    setup: setup_units_gap,
    env: &[],
    rc: 1,
    stderr_has: &["units.txt: line 9: expected contiguous ids 0..8", "no id 8"],
    stderr_lacks: &["index 19 is out of range"],
    forbidden_in_model_dir: &["init", "epoch_"],
};

// ---- defect 5: an absurd config is a clear error, not an abort ------------

fn setup_absurd_model_info(dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("train.yaml"), "input_dim: 80\noutput_dim: 100\nencoder_conf: {output_size: 100000000, attention_heads: 4}\n").unwrap();
    vec!["model-info".into(), "--config".into(), p(dir, "train.yaml")]
}

const ABSURD_MODEL_INFO: Case = Case {
    setup: setup_absurd_model_info,
    env: &[],
    rc: 1,
    stderr_has: &["config key `encoder_conf.output_size`", "output_size 100000000", "ASRFORGE_MAX_MODEL_BYTES"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &[],
};

fn setup_absurd_train(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--override_config", "encoder_conf.output_size 100000000"]));
    a
}

const ABSURD_TRAIN: Case = Case {
    setup: setup_absurd_train,
    env: &[],
    rc: 1,
    stderr_has: &["config key `encoder_conf.output_size`", "GiB"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &["init", "epoch_"],
};

fn setup_model_over_a_set_limit(dir: &Path) -> Vec<String> {
    train_setup(dir, 4, "")
}

const MODEL_OVER_A_SET_LIMIT: Case = Case {
    setup: setup_model_over_a_set_limit,
    env: &[("ASRFORGE_MAX_MODEL_BYTES", "100000")],
    rc: 1,
    stderr_has: &["expected at most 0.0 GiB (set ASRFORGE_MAX_MODEL_BYTES"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &["init", "epoch_"],
};

// ---- defect 7: bad values are errors or warnings -------------------------

fn setup_negative_lr(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--override_config", "optim_conf.lr -0.001"]));
    a
}

const NEGATIVE_LR: Case = Case {
    setup: setup_negative_lr,
    env: &[],
    rc: 1,
    stderr_has: &["config key `optim_conf.lr`: expected a finite learning rate >= 0, found -0.001"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &["init", "epoch_"],
};

fn setup_nan_lr(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--override_config", "optim_conf.lr .nan"]));
    a
}

const NAN_LR: Case =
    Case { setup: setup_nan_lr, env: &[], rc: 1, stderr_has: &["optim_conf.lr", "found NaN"], stderr_lacks: &[], forbidden_in_model_dir: &["init", "epoch_"] };

/// compute-cmvn over a list whose only utterance has a 1e30 sample.
fn setup_cmvn_non_finite(dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("train.yaml"), "dataset_conf:\n  fbank_conf: {num_mel_bins: 20}\n").unwrap();
    let mut x = data_common::sine(300.0, 16000, 0.5, 0.3);
    x[100] = 1e30;
    data_common::write_wav(&dir.join("huge.wav"), &x, 16000, 0);
    std::fs::write(dir.join("wav.scp"), format!("huge {}\n", dir.join("huge.wav").display())).unwrap();
    s(&["compute-cmvn", "--train_config", &p(dir, "train.yaml"), "--in_scp", &p(dir, "wav.scp"), "--out_cmvn", &p(dir, "exp_cmvn.json")])
}

const CMVN_NON_FINITE: Case = Case {
    setup: setup_cmvn_non_finite,
    env: &[],
    rc: 1,
    stderr_has: &["wav.scp", "expected at least one usable utterance", "non_finite_features 1"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &[],
};

fn setup_ds_fp16_on_cpu(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    std::fs::write(
        dir.join("ds.json"),
        r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 5, "steps_per_print": 1000,
            "fp16": {"enabled": true}, "zero_optimization": {"stage": 1}}"#,
    )
    .unwrap();
    a.extend(s(&["--train_engine", "deepspeed", "--deepspeed_config", &p(dir, "ds.json")]));
    a
}

const DS_FP16_ON_CPU: Case = Case {
    setup: setup_ds_fp16_on_cpu,
    env: &[],
    rc: 0,
    stderr_has: &["ds.json: fp16 is enabled but the CPU backend trains in f32"],
    stderr_lacks: &[],
    forbidden_in_model_dir: &[],
};

// ---- defect 9: an infeasible CTC target is skipped and counted -----------

/// The corpus of train_common: utt004 (0.6 s at 8 kHz, 38 frames, 8 encoder
/// frames) has 9 tokens ("E ▁ A ▁ B ▁ C ▁ D"), utt013 (18 frames, 3 encoder
/// frames) 7; both pass WeNet's filter (ratio up to 1 token per frame).
fn setup_ctc_infeasible(dir: &Path) -> Vec<String> {
    train_setup(dir, 16, "")
}

const CTC_INFEASIBLE: Case = Case {
    setup: setup_ctc_infeasible,
    env: &[],
    rc: 0,
    stderr_has: &["utt004 (ctc_infeasible)", "utt013 (ctc_infeasible)"],
    stderr_lacks: &["CtcTargetTooLong", "is longer than its input", "skipped, "],
    forbidden_in_model_dir: &[],
};

hostile!(huge_learning_rate_makes_cv_nan_and_fails, HUGE_LR);
hostile!(recognize_skips_an_utterance_past_the_positional_table, RECOGNIZE_LONG);
hostile!(empty_train_list_is_an_error, EMPTY_TRAIN_LIST);
hostile!(raw_list_read_as_shard_is_an_error, RAW_LIST_AS_SHARD);
hostile!(a_rank_whose_files_are_all_missing_fails_the_job_naming_it, RANK_WITHOUT_FILES);
hostile!(units_with_a_duplicate_id_name_file_and_line, UNITS_DUPLICATE_ID);
hostile!(units_with_a_gap_name_file_and_line, UNITS_GAP);
hostile!(model_info_on_an_absurd_config_is_an_error, ABSURD_MODEL_INFO);
hostile!(train_on_an_absurd_config_is_an_error, ABSURD_TRAIN);
hostile!(a_model_over_a_set_size_limit_is_an_error, MODEL_OVER_A_SET_LIMIT);
hostile!(a_negative_learning_rate_is_an_error, NEGATIVE_LR);
hostile!(a_nan_learning_rate_is_an_error, NAN_LR);
hostile!(compute_cmvn_on_non_finite_audio_is_an_error, CMVN_NON_FINITE);
hostile!(deepspeed_fp16_on_the_cpu_warns, DS_FP16_ON_CPU);
hostile!(an_infeasible_ctc_target_is_skipped_and_counted, CTC_INFEASIBLE);
