//! The "hostile user" suite: the real binary on bad input. Each case is a
//! row of the table below — how to set up its directory, the command line,
//! the exit code expected, the words its stderr must hold (the file, key,
//! argument or rank at fault) — and one shared runner checks every row the
//! same way: the exit code, the words, no panic or backtrace text, and a
//! model_dir (`dir/exp`) with no temporary files, none of the files the
//! case forbids, all the files it requires, and (where the case says so)
//! byte for byte what it held before the command.
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
    /// Words stderr must contain (the file, key or rank named, the reason);
    /// `{dir}` stands for the case's directory.
    stderr_has: &'static [&'static str],
    /// Words stderr must not contain.
    stderr_lacks: &'static [&'static str],
    /// File-name prefixes that must not be in `dir/exp` afterwards (besides any `.tmp`).
    forbidden_in_model_dir: &'static [&'static str],
    /// Files that must be in `dir/exp` afterwards.
    required_in_model_dir: &'static [&'static str],
    /// Whether `dir/exp` must be left exactly as the setup left it.
    model_dir_unchanged: bool,
    /// A last check of what the command left in `dir`.
    after: Option<fn(&Path)>,
}

fn no_setup(_: &Path) -> Vec<String> {
    Vec::new()
}

/// The fields most rows leave as they are.
const ROW: Case = Case {
    setup: no_setup,
    env: &[],
    rc: 1,
    stderr_has: &[],
    stderr_lacks: &[],
    forbidden_in_model_dir: &[],
    required_in_model_dir: &[],
    model_dir_unchanged: false,
    after: None,
};

/// Text that only a panic, an abort or a backtrace prints.
const CRASH_TEXT: &[&str] = &["panicked at", "stack backtrace", "RUST_BACKTRACE", "memory allocation of", "core dumped", "Aborted"];

/// Every file of `dir` (not below it) with its bytes; empty when `dir` does not exist.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<(String, Vec<u8>)> = rd
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

/// Runs one case in a fresh directory named after it and checks everything.
fn check(name: &str, case: &Case) {
    let dir = train_common::tmpdir(&format!("hostile-{name}"));
    let args = (case.setup)(&dir);
    let model_dir = dir.join("exp");
    let before = snapshot(&model_dir);
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
        let w = w.replace("{dir}", &dir.display().to_string());
        assert!(err.contains(&w), "{name}: stderr lacks {w:?}:\n{err}");
    }
    for w in case.stderr_lacks.iter().chain(CRASH_TEXT) {
        assert!(!err.contains(w), "{name}: stderr has {w:?}:\n{err}");
    }
    let after = snapshot(&model_dir);
    for (f, _) in &after {
        assert!(!f.contains(".tmp"), "{name}: temporary file {f} left in {}", model_dir.display());
        for p in case.forbidden_in_model_dir {
            assert!(!f.starts_with(p), "{name}: {f} left in {}", model_dir.display());
        }
    }
    for f in case.required_in_model_dir {
        assert!(after.iter().any(|(n, _)| n == f), "{name}: no {f} in {}", model_dir.display());
    }
    assert!(!case.model_dir_unchanged || after == before, "{name}: {} changed", model_dir.display());
    if let Some(f) = case.after {
        f(&dir);
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

const HUGE_LR: Case = Case { setup: setup_huge_lr, stderr_has: &["cv loss is NaN", "not saving epoch_0"], forbidden_in_model_dir: &["epoch_0"], ..ROW };

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
    rc: 0,
    stderr_has: &["long_utt (beyond_model)", "at most 5000 encoder frames", "ctc_greedy_search: 3 utterances"],
    stderr_lacks: &["error:"],
    ..ROW
};

// ---- defect 3: training on nothing is an error naming the rank -----------

fn setup_empty_list(dir: &Path) -> Vec<String> {
    train_setup(dir, 4, "");
    std::fs::write(dir.join("empty.list"), "").unwrap();
    train_args(dir, "empty.list")
}

const EMPTY_TRAIN_LIST: Case = Case {
    setup: setup_empty_list,
    stderr_has: &["no training data: rank 0 formed 0 batches", "empty.list"],
    stderr_lacks: &["trained 0 batches"],
    forbidden_in_model_dir: &["epoch_"],
    ..ROW
};

fn setup_raw_as_shard(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--data_type", "shard"]));
    a
}

const RAW_LIST_AS_SHARD: Case = Case {
    setup: setup_raw_as_shard,
    // Each JSON line is taken for a shard path that does not exist.
    stderr_has: &["rank 0 formed 0 batches (skipped 4 (missing_file 4))", "data.list"],
    forbidden_in_model_dir: &["epoch_"],
    ..ROW
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
    stderr_has: &["formed 0 batches (skipped", "missing_file", "holes.list", "data per rank: rank 0 skipped", "; rank 1 skipped"],
    forbidden_in_model_dir: &["epoch_"],
    ..ROW
};

// ---- defect 4: units.txt is validated, naming the file and line ----------

fn setup_duplicate_id(dir: &Path) -> Vec<String> {
    let a = train_setup(dir, 4, "");
    std::fs::write(dir.join("units.txt"), "<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 3\nC 5\nD 6\nE 7\n<sos/eos> 8\n").unwrap();
    a
}

const UNITS_DUPLICATE_ID: Case = Case {
    setup: setup_duplicate_id,
    stderr_has: &["units.txt: line 5: id 3 of `B` is already the id of `A` (line 4)"],
    forbidden_in_model_dir: &["init", "epoch_"],
    ..ROW
};

fn setup_units_gap(dir: &Path) -> Vec<String> {
    let a = train_setup(dir, 4, "");
    std::fs::write(dir.join("units.txt"), "<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 4\nC 5\nD 6\nE 7\n<sos/eos> 19\n").unwrap();
    a
}

const UNITS_GAP: Case = Case {
    setup: setup_units_gap,
    stderr_has: &["units.txt: line 9: expected contiguous ids 0..8", "no id 8"],
    stderr_lacks: &["index 19 is out of range"],
    forbidden_in_model_dir: &["init", "epoch_"],
    ..ROW
};

// ---- defect 5: an absurd config is a clear error, not an abort ------------

fn setup_absurd_model_info(dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("train.yaml"), "input_dim: 80\noutput_dim: 100\nencoder_conf: {output_size: 100000000, attention_heads: 4}\n").unwrap();
    vec!["model-info".into(), "--config".into(), p(dir, "train.yaml")]
}

const ABSURD_MODEL_INFO: Case =
    Case { setup: setup_absurd_model_info, stderr_has: &["config key `encoder_conf.output_size`", "output_size 100000000", "ASRFORGE_MAX_MODEL_BYTES"], ..ROW };

fn setup_absurd_train(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--override_config", "encoder_conf.output_size 100000000"]));
    a
}

const ABSURD_TRAIN: Case =
    Case { setup: setup_absurd_train, stderr_has: &["config key `encoder_conf.output_size`", "GiB"], forbidden_in_model_dir: &["init", "epoch_"], ..ROW };

fn setup_model_over_a_set_limit(dir: &Path) -> Vec<String> {
    train_setup(dir, 4, "")
}

const MODEL_OVER_A_SET_LIMIT: Case = Case {
    setup: setup_model_over_a_set_limit,
    env: &[("ASRFORGE_MAX_MODEL_BYTES", "100000")],
    stderr_has: &["expected at most 0.0 GiB (set ASRFORGE_MAX_MODEL_BYTES"],
    forbidden_in_model_dir: &["init", "epoch_"],
    ..ROW
};

// ---- defect 7: bad values are errors or warnings -------------------------

fn setup_negative_lr(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--override_config", "optim_conf.lr -0.001"]));
    a
}

const NEGATIVE_LR: Case = Case {
    setup: setup_negative_lr,
    stderr_has: &["config key `optim_conf.lr`: expected a finite learning rate >= 0, found -0.001"],
    forbidden_in_model_dir: &["init", "epoch_"],
    ..ROW
};

fn setup_nan_lr(dir: &Path) -> Vec<String> {
    let mut a = train_setup(dir, 4, "");
    a.extend(s(&["--override_config", "optim_conf.lr .nan"]));
    a
}

const NAN_LR: Case = Case { setup: setup_nan_lr, stderr_has: &["optim_conf.lr", "found NaN"], forbidden_in_model_dir: &["init", "epoch_"], ..ROW };

/// compute-cmvn over a list whose only utterance has a 1e30 sample.
fn setup_cmvn_non_finite(dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("train.yaml"), "dataset_conf:\n  fbank_conf: {num_mel_bins: 20}\n").unwrap();
    let mut x = data_common::sine(300.0, 16000, 0.5, 0.3);
    x[100] = 1e30;
    data_common::write_wav(&dir.join("huge.wav"), &x, 16000, 0);
    std::fs::write(dir.join("wav.scp"), format!("huge {}\n", dir.join("huge.wav").display())).unwrap();
    s(&["compute-cmvn", "--train_config", &p(dir, "train.yaml"), "--in_scp", &p(dir, "wav.scp"), "--out_cmvn", &p(dir, "exp_cmvn.json")])
}

const CMVN_NON_FINITE: Case =
    Case { setup: setup_cmvn_non_finite, stderr_has: &["wav.scp", "expected at least one usable utterance", "non_finite_features 1"], ..ROW };

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

const DS_FP16_ON_CPU: Case = Case { setup: setup_ds_fp16_on_cpu, rc: 0, stderr_has: &["ds.json: fp16 is enabled but the CPU backend trains in f32"], ..ROW };

// ---- defect 9: an infeasible CTC target is skipped and counted -----------

/// The corpus of train_common: utt004 (0.6 s at 8 kHz, 38 frames, 8 encoder
/// frames) has 9 tokens ("E ▁ A ▁ B ▁ C ▁ D"), utt013 (18 frames, 3 encoder
/// frames) 7; both pass WeNet's filter (ratio up to 1 token per frame).
fn setup_ctc_infeasible(dir: &Path) -> Vec<String> {
    train_setup(dir, 16, "")
}

const CTC_INFEASIBLE: Case = Case {
    setup: setup_ctc_infeasible,
    rc: 0,
    stderr_has: &["utt004 (ctc_infeasible)", "utt013 (ctc_infeasible)"],
    stderr_lacks: &["CtcTargetTooLong", "is longer than its input", "skipped, "],
    ..ROW
};

// ---- defect 8: runs do not mix -------------------------------------------

/// The corpus, and a first two-epoch run of `train` into `dir/exp`; returns its command line.
fn trained(dir: &Path) -> Vec<String> {
    train_common::setup(dir, 4, &train_common::tiny_yaml(0.0, 4, 2, ""));
    let mut a = train_args(dir, "data.list");
    a.extend(s(&["--seed", "7"]));
    let out = Command::new(env!("CARGO_BIN_EXE_asrforge")).args(&a).output().expect("run the first training");
    assert!(out.status.success(), "the first run trains:\n{}", String::from_utf8_lossy(&out.stderr));
    a
}

/// The overrides that make a run another run.
const OTHER_RUN: [&str; 4] = ["--override_config", "max_epoch 1", "--override_config", "optim_conf.lr 0.002"];

fn setup_other_run(dir: &Path) -> Vec<String> {
    let mut a = trained(dir);
    a.extend(s(&OTHER_RUN));
    a
}

const OTHER_RUN_IN_MODEL_DIR: Case =
    Case { setup: setup_other_run, stderr_has: &["{dir}/exp", "epoch_0.safetensors", "--overwrite", "--checkpoint"], model_dir_unchanged: true, ..ROW };

fn setup_checkpoint_from_elsewhere(dir: &Path) -> Vec<String> {
    let mut a = trained(dir);
    std::fs::copy(dir.join("exp/epoch_0.safetensors"), dir.join("elsewhere.safetensors")).unwrap();
    a.extend(s(&["--checkpoint", &p(dir, "elsewhere.safetensors")]));
    a
}

const CHECKPOINT_FROM_ELSEWHERE: Case =
    Case { setup: setup_checkpoint_from_elsewhere, stderr_has: &["epoch_0.safetensors", "elsewhere.safetensors"], model_dir_unchanged: true, ..ROW };

fn setup_resume_own(dir: &Path) -> Vec<String> {
    let mut a = trained(dir);
    std::fs::write(dir.join("exp/.epoch_1.yaml.tmp.5"), b"x").unwrap();
    a.extend(s(&["--checkpoint", &p(dir, "exp/epoch_0.safetensors")]));
    a
}

/// Resuming from one of its own checkpoints is the same run (the stale temporary goes).
const RESUME_OWN_CHECKPOINT: Case = Case { setup: setup_resume_own, rc: 0, required_in_model_dir: &["epoch_1.safetensors"], ..ROW };

fn setup_overwrite(dir: &Path) -> Vec<String> {
    let mut a = setup_other_run(dir);
    a.push("--overwrite".into());
    a
}

/// Every checkpoint YAML left holds the new run's config.
fn only_the_new_run(dir: &Path) {
    let config = |f: &str| {
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("exp").join(f)).unwrap()).unwrap();
        v["config"].clone()
    };
    let new = config("epoch_0.yaml");
    assert_eq!(new["max_epoch"].as_u64(), Some(1));
    for (n, _) in snapshot(&dir.join("exp")).iter().filter(|(n, _)| n.ends_with(".yaml") && *n != "train.yaml") {
        assert_eq!(config(n), new, "{n} belongs to the new run");
    }
}

const OVERWRITE: Case = Case {
    setup: setup_overwrite,
    rc: 0,
    forbidden_in_model_dir: &["epoch_1"],
    required_in_model_dir: &["epoch_0.yaml"],
    after: Some(only_the_new_run),
    ..ROW
};

fn average_args(dir: &Path) -> Vec<String> {
    s(&["average", "--dst_model", &p(dir, "exp/avg.safetensors"), "--src_path", &p(dir, "exp"), "--num", "2"])
}

fn setup_average_one_run(dir: &Path) -> Vec<String> {
    trained(dir);
    average_args(dir)
}

const AVERAGE_ONE_RUN: Case = Case { setup: setup_average_one_run, rc: 0, required_in_model_dir: &["avg.safetensors"], ..ROW };

/// A checkpoint of another run (its train.yaml differs in one key) slipped in as epoch 7.
fn setup_average_two_runs(dir: &Path) -> Vec<String> {
    trained(dir);
    let exp = dir.join("exp");
    std::fs::copy(exp.join("epoch_0.safetensors"), exp.join("epoch_7.safetensors")).unwrap();
    let mut infos: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(exp.join("epoch_0.yaml")).unwrap()).unwrap();
    infos["epoch"] = 7.into();
    infos["config"]["optim_conf"]["lr"] = 0.5.into();
    std::fs::write(exp.join("epoch_7.yaml"), serde_yaml_ng::to_string(&infos).unwrap()).unwrap();
    average_args(dir)
}

const AVERAGE_TWO_RUNS: Case = Case {
    setup: setup_average_two_runs,
    stderr_has: &["epoch_1.safetensors", "epoch_7", "optim_conf.lr", "different runs"],
    forbidden_in_model_dir: &["avg"],
    model_dir_unchanged: true,
    ..ROW
};

// ---- defect 10: missing arguments are named; stale temporaries go ---------

fn setup_train_bare(_: &Path) -> Vec<String> {
    s(&["train"])
}

const TRAIN_WITHOUT_ARGUMENTS: Case = Case { setup: setup_train_bare, stderr_has: &["--config", "--model_dir", "--train_data", "--cv_data"], ..ROW };

fn setup_average_bare(_: &Path) -> Vec<String> {
    s(&["average"])
}

const AVERAGE_WITHOUT_ARGUMENTS: Case = Case { setup: setup_average_bare, stderr_has: &["--dst_model", "--src_path"], ..ROW };

fn setup_train_half(_: &Path) -> Vec<String> {
    s(&["train", "--config", "c.yaml", "--model_dir", "m"])
}

/// Only the missing ones are named.
const TRAIN_WITH_HALF_THE_ARGUMENTS: Case = Case { setup: setup_train_half, stderr_has: &["--train_data", "--cv_data"], stderr_lacks: &["--config <"], ..ROW };

/// Temporary files a kill -9 during a save leaves behind (write_atomic's names).
fn setup_stale_temporaries(dir: &Path) -> Vec<String> {
    let a = train_setup(dir, 4, "");
    std::fs::create_dir_all(dir.join("exp")).unwrap();
    std::fs::write(dir.join("exp/.epoch_0.safetensors.tmp.4242"), b"half a checkpoint").unwrap();
    std::fs::write(dir.join("exp/.train.yaml.tmp.17"), b"half a yaml").unwrap();
    a
}

/// The removal is reported; the runner checks no temporary is left.
const STALE_TEMPORARIES: Case =
    Case { setup: setup_stale_temporaries, rc: 0, stderr_has: &[".epoch_0.safetensors.tmp.4242"], required_in_model_dir: &["epoch_0.safetensors"], ..ROW };

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
hostile!(a_model_dir_of_another_run_is_refused_untouched, OTHER_RUN_IN_MODEL_DIR);
hostile!(a_checkpoint_from_elsewhere_does_not_make_the_model_dir_ours, CHECKPOINT_FROM_ELSEWHERE);
hostile!(resuming_from_an_own_checkpoint_is_allowed_and_removes_stale_temporaries, RESUME_OWN_CHECKPOINT);
hostile!(overwrite_leaves_only_the_new_runs_files, OVERWRITE);
hostile!(average_over_one_run_succeeds, AVERAGE_ONE_RUN);
hostile!(average_refuses_checkpoints_of_two_runs, AVERAGE_TWO_RUNS);
hostile!(missing_required_arguments_of_train_are_named, TRAIN_WITHOUT_ARGUMENTS);
hostile!(missing_required_arguments_of_average_are_named, AVERAGE_WITHOUT_ARGUMENTS);
hostile!(only_the_missing_arguments_are_named, TRAIN_WITH_HALF_THE_ARGUMENTS);
hostile!(stale_temporaries_of_interrupted_saves_are_removed_at_start, STALE_TEMPORARIES);
