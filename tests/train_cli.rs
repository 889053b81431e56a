//! The `train` command line: a WeNet run.sh line parses, hyphenated
//! spellings work, and bad input ends the binary with one error line naming
//! the path or key and the reason, a non-zero exit code and no panic.

mod train_common;

use asrforge::train::TrainArgs;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    train: TrainArgs,
}

fn parse(line: &str) -> TrainArgs {
    Cli::try_parse_from(std::iter::once("train").chain(line.split_whitespace())).expect("parses").train
}

#[test]
fn wenet_run_sh_line_parses() {
    let a = parse("--train_engine torch_ddp --config conf/train.yaml --data_type raw --train_data data/train/data.list --cv_data data/dev/data.list --model_dir exp/x --ddp.dist_backend gloo --num_workers 1 --pin_memory");
    assert_eq!(a.train_engine, "torch_ddp");
    assert_eq!(a.config, PathBuf::from("conf/train.yaml"));
    assert_eq!(a.data_type, "raw");
    assert_eq!(a.train_data, PathBuf::from("data/train/data.list"));
    assert_eq!(a.cv_data, PathBuf::from("data/dev/data.list"));
    assert_eq!(a.model_dir, PathBuf::from("exp/x"));
    assert_eq!(a.dist_backend, "gloo");
    assert_eq!(a.num_workers, 1);
    assert!(a.pin_memory);
    assert!(!a.use_amp);
    assert_eq!(a.checkpoint, None);
    assert_eq!(a.device, "cpu");
}

#[test]
fn hyphenated_and_repeated_arguments() {
    let a = parse("--config c.yaml --model-dir m --train-data t --cv-data v --override-config a.b_1 --override_config c_2 --use-amp --train-engine deepspeed --deepspeed-config ds.json --deepspeed.save_states model+optimizer --enc-init e.safetensors --enc-init-mods encoder.,ctc. --symbol-table u.txt --seed 3");
    assert_eq!(a.model_dir, PathBuf::from("m"));
    assert_eq!(a.override_config, vec!["a.b_1".to_string(), "c_2".to_string()]);
    assert!(a.use_amp);
    assert_eq!(a.train_engine, "deepspeed");
    assert_eq!(a.deepspeed_config, Some(PathBuf::from("ds.json")));
    assert_eq!(a.deepspeed_save_states, "model+optimizer");
    assert_eq!(a.enc_init_mods, vec!["encoder.".to_string(), "ctc.".to_string()]);
    assert_eq!(a.symbol_table, Some(PathBuf::from("u.txt")));
    assert_eq!(a.seed, 3);
    assert!(Cli::try_parse_from(["train", "--config", "c", "--model_dir", "m", "--train_data", "t", "--cv_data", "v", "--data_type", "tar"]).is_err());
}

#[test]
fn fp16_grad_sync_chooses_the_half_type_of_the_ddp_all_reduce() {
    use asrforge::tensor::DType;
    use asrforge::train::grad_sync_dtype;
    let req = "--config c --model_dir m --train_data t --cv_data v";
    let a = parse(req);
    assert!(!a.fp16_grad_sync);
    assert_eq!(grad_sync_dtype(&a).unwrap(), None, "off by default");
    for (extra, want) in [
        ("--fp16_grad_sync", DType::F16),
        ("--fp16-grad-sync --use_amp", DType::F16),
        ("--fp16_grad_sync --dtype fp16", DType::F16),
        ("--fp16_grad_sync --dtype bf16", DType::BF16),
    ] {
        let a = parse(&format!("{req} {extra}"));
        assert!(a.fp16_grad_sync, "{extra}");
        assert_eq!(grad_sync_dtype(&a).unwrap(), Some(want), "{extra}");
    }
}

/// `--fp16_grad_sync` with `--train_engine deepspeed`: the ZeRO
/// reduce-scatter travels in the half type of the JSON's precision (bf16
/// with bf16 enabled, else f16); without the flag DeepSpeed's
/// `communication_data_type` rule decides; the flag and an explicit
/// communication_data_type of another type are a one-line error naming both.
#[test]
fn fp16_grad_sync_with_deepspeed_chooses_the_zero_reduce_scatter_type() {
    use asrforge::engine::deepspeed::parse_deepspeed_config;
    use asrforge::tensor::DType;
    use asrforge::train::deepspeed::zero_grad_sync_dtype;
    let req = "--config c --model_dir m --train_data t --cv_data v --train_engine deepspeed --deepspeed_config ds.json";
    let (plain, flag) = (parse(req), parse(&format!("{req} --fp16_grad_sync")));
    assert!(flag.fp16_grad_sync && !plain.fp16_grad_sync);
    let ds = |text: &str| parse_deepspeed_config(text, "ds.json").unwrap().0;
    for (json, without, with) in [
        (r#"{}"#, None, Some(DType::F16)),
        (r#"{"fp16": {"enabled": true}}"#, Some(DType::F16), Some(DType::F16)),
        (r#"{"bf16": {"enabled": true}}"#, Some(DType::BF16), Some(DType::BF16)),
        (r#"{"communication_data_type": "fp16"}"#, Some(DType::F16), Some(DType::F16)),
        (r#"{"communication_data_type": "bf16", "bf16": {"enabled": true}}"#, Some(DType::BF16), Some(DType::BF16)),
        (r#"{"communication_data_type": "fp32", "bf16": {"enabled": true}}"#, None, None),
    ] {
        let c = ds(json);
        assert_eq!(zero_grad_sync_dtype(&plain, &c).ok(), Some(without), "{json} without the flag");
        match with {
            Some(d) => assert_eq!(zero_grad_sync_dtype(&flag, &c).unwrap(), Some(d), "{json} with the flag"),
            None => {
                let err = zero_grad_sync_dtype(&flag, &c).unwrap_err().to_string();
                assert!(
                    err.contains("--fp16_grad_sync") && err.contains("bf16") && err.contains("communication_data_type to f32") && !err.contains('\n'),
                    "{err}"
                );
            }
        }
    }
    let err = zero_grad_sync_dtype(&flag, &ds(r#"{"communication_data_type": "bf16"}"#)).unwrap_err().to_string();
    assert!(err.contains("in f16") && err.contains("ds.json") && err.contains("to bf16"), "{err}");
}

fn base(dir: &Path) -> Vec<String> {
    let p = |f: &str| dir.join(f).display().to_string();
    [
        "train",
        "--config",
        &p("train.yaml"),
        "--model_dir",
        &p("exp"),
        "--tensorboard_dir",
        &p("tb"),
        "--train_data",
        &p("data.list"),
        "--cv_data",
        &p("data.list"),
        "--symbol_table",
        &p("units.txt"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs the binary; returns (exit code, stderr).
fn run(args: &[String], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_asrforge"))
        .args(args)
        .env_remove("WORLD_SIZE")
        .env_remove("RANK")
        .envs(env.iter().copied())
        .output()
        .expect("run the binary");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_one_line_error(code: i32, err: &str, needles: &[&str]) {
    assert_ne!(code, 0, "non-zero exit: {err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "no panic: {err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("error: "), "ends with one error line: {err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1, "{err}");
    for n in needles {
        assert!(last.contains(n), "error line {last:?} mentions {n:?}");
    }
}

#[test]
fn bad_input_is_one_line_error() {
    let dir = train_common::tmpdir("train-cli");
    train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 4, 1, ""));
    let b = base(&dir);
    let with = |extra: &[&str]| b.iter().cloned().chain(extra.iter().map(|s| s.to_string())).collect::<Vec<_>>();

    let mut missing = b.clone();
    missing[2] = dir.join("nope.yaml").display().to_string();
    let (code, err) = run(&missing, &[]);
    assert_one_line_error(code, &err, &["nope.yaml", "No such file"]);

    let (code, err) = run(&with(&["--override_config", "encoder_conf.num_blockz 6"]), &[]);
    assert_one_line_error(code, &err, &["encoder_conf.num_blockz", "no such key"]);
    let (code, err) = run(&with(&["--override_config", "encoder_conf.num_blocks six"]), &[]);
    assert_one_line_error(code, &err, &["encoder_conf.num_blocks", "cannot replace integer 1 with string"]);

    let mut list = b.clone();
    list[8] = dir.join("missing.list").display().to_string();
    let (code, err) = run(&list, &[]);
    assert_one_line_error(code, &err, &["missing.list", "No such file"]);

    let bad = dir.join("bad.safetensors");
    std::fs::write(&bad, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all").unwrap();
    let (code, err) = run(&with(&["--checkpoint", &bad.display().to_string()]), &[]);
    assert_one_line_error(code, &err, &["bad.safetensors", "not a valid safetensors file"]);

    let (code, err) = run(&with(&["--train_engine", "deepspeed"]), &[]);
    assert_one_line_error(code, &err, &["--deepspeed_config", "--train_engine deepspeed needs a DeepSpeed JSON config, found none"]);
    let ds = dir.join("ds.json");
    std::fs::write(&ds, r#"{"zero_optimization": {"stage": 3}}"#).unwrap();
    let (code, err) = run(&with(&["--train_engine", "deepspeed", "--deepspeed_config", &ds.display().to_string()]), &[]);
    assert_one_line_error(code, &err, &["ds.json", "ZeRO stage 3 is not supported"]);
    // Several processes: nccl (the default backend) needs the GPU; with gloo a
    // rank whose master never appears gives up after --timeout, naming where it looked.
    let (code, err) = run(&b, &[("WORLD_SIZE", "2"), ("RANK", "0")]);
    assert_one_line_error(code, &err, &["--dist_backend", "nccl moves GPU tensors, but this run trains on the CPU", "use --dist_backend gloo"]);
    let t0 = std::time::Instant::now();
    let (code, err) =
        run(&with(&["--dist_backend", "gloo", "--timeout", "1"]), &[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")]);
    assert_one_line_error(code, &err, &["127.0.0.1:1", "rank 1"]);
    assert!(t0.elapsed() < std::time::Duration::from_secs(10), "gave up after the 1 s timeout, took {:?}", t0.elapsed());
    let (code, err) = run(&b, &[("RANK", "x")]);
    assert_one_line_error(code, &err, &["RANK", "\"x\""]);
}

#[test]
fn binary_trains_one_epoch() {
    let dir = train_common::tmpdir("train-cli-ok");
    train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 4, 1, ""));
    let (code, err) = run(&base(&dir), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("the number of model params"), "{err}");
    assert!(err.contains("frames/s"), "{err}");
    assert!(dir.join("exp/epoch_0.safetensors").exists());
}
