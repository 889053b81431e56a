//! DeepSpeed JSON configs: the shipped stage 1/2 files parse without a
//! warning and agree with the digits recipe's train.yaml; unknown keys are
//! warned about (returned and on stderr); WeNet's consistency checks name
//! both values and both files; stage 3, offloading, fp16+bf16 and wrongly
//! typed values are errors naming the key; fp16's dynamic scale follows
//! DeepSpeed's rules (checked against a hand-worked sequence).

#[path = "common/tempdir.rs"]
mod tempdir;

use asrforge::engine::deepspeed::{load_deepspeed_config, parse_deepspeed_config, Precision, Setting, TrainYamlKeys};
use asrforge::optim::{AdamConfig, GradScaler};
use std::path::Path;

const DIGITS: TrainYamlKeys = TrainYamlKeys { accum_grad: 1, grad_clip: 5.0, log_interval: 20 };

fn parse(text: &str) -> asrforge::Result<(asrforge::engine::deepspeed::DeepSpeedConfig, Vec<String>)> {
    parse_deepspeed_config(text, "conf/x.json")
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("expected an error for {text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn shipped_confs_parse_cleanly_and_match_the_digits_train_yaml() {
    let root = asrforge::train::read_config(Path::new("examples/digits/conf/train.yaml"), &[]).expect("digits train.yaml");
    let tc = asrforge::train::parse_train_config(&root).expect("train config");
    let yaml = TrainYamlKeys { accum_grad: tc.accum_grad, grad_clip: tc.grad_clip, log_interval: tc.log_interval };
    assert_eq!(yaml, DIGITS, "the digits recipe's values these files were written for");
    for stage in [1u8, 2] {
        let path = format!("conf/ds_stage{stage}.json");
        let (c, warnings) = load_deepspeed_config(Path::new(&path)).expect("parse");
        assert!(warnings.is_empty(), "{path}: {warnings:?}");
        assert_eq!(c.zero.stage, stage);
        assert_eq!(c.zero.reduce_bucket_size, 100_000_000);
        assert_eq!(c.zero.allgather_bucket_size, 100_000_000);
        assert_eq!(c.zero.overlap_comm, stage == 2);
        assert_eq!(c.gradient_accumulation_steps, Some(Setting::Value(1)));
        assert_eq!(c.gradient_clipping, Some(Setting::Value(5.0)));
        assert_eq!(c.steps_per_print, Some(20));
        assert_eq!(c.train_micro_batch_size_per_gpu, Some(Setting::Value(1)));
        assert_eq!(c.precision().expect("precision"), Precision::Fp32);
        assert!(c.scaler_config().is_none());
        let z = c.zero_options();
        assert_eq!((z.stage, z.reduce_bucket_size, z.allgather_bucket_size), (stage, 100_000_000, 100_000_000));
        c.check_against(&yaml, "examples/digits/conf/train.yaml").expect("consistent with train.yaml");
    }
}

#[test]
fn unknown_keys_are_warned_one_line_per_path() {
    let (c, w) =
        parse(r#"{"zero_optimization": {"stage": 2, "foo": 1}, "bar": {"x": 1}, "fp16": {"enabled": false, "lossscale": 0}, "wall_clock_breakdown": false}"#)
            .expect("parse");
    assert_eq!(c.zero.stage, 2);
    assert_eq!(
        w,
        vec![
            "deepspeed config conf/x.json: unknown key bar (ignored)".to_string(),
            "deepspeed config conf/x.json: key wall_clock_breakdown has no effect in asrforge (ignored)".to_string(),
            "deepspeed config conf/x.json: unknown key zero_optimization.foo (ignored)".to_string(),
            "deepspeed config conf/x.json: unknown key fp16.lossscale (ignored)".to_string(),
        ]
    );
}

#[test]
fn unknown_key_warning_reaches_stderr() {
    if let Ok(path) = std::env::var("DS_CONFIG_CHILD") {
        load_deepspeed_config(Path::new(&path)).expect("parse in child");
        return;
    }
    let dir = tempdir::TempDir::new("ds-warn");
    let path = dir.join("x.json");
    std::fs::write(&path, r#"{"zero_optimization": {"stage": 1, "foo": true}}"#).expect("write");
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["unknown_key_warning_reaches_stderr", "--exact", "--nocapture", "--test-threads=1"])
        .env("DS_CONFIG_CHILD", &path)
        .output()
        .expect("run child");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!("warning: deepspeed config {}: unknown key zero_optimization.foo (ignored)", path.display());
    assert!(stderr.lines().any(|l| l == want), "stderr lacks {want:?}:\n{stderr}");
}

#[test]
fn each_consistency_mismatch_names_both_values_and_files() {
    let cases = [
        (r#"{"gradient_accumulation_steps": 4}"#, ["gradient_accumulation_steps is 4", "accum_grad is 1"]),
        (r#"{"gradient_clipping": 1.5}"#, ["gradient_clipping is 1.5", "grad_clip is 5"]),
        (r#"{"steps_per_print": 100}"#, ["steps_per_print is 100", "log_interval is 20"]),
    ];
    for (text, parts) in cases {
        let (c, _) = parse(text).expect("parse");
        let e = c.check_against(&DIGITS, "conf/train.yaml").expect_err(text).to_string();
        for p in parts.iter().chain(&["conf/x.json", "conf/train.yaml"]) {
            assert!(e.contains(p), "{text}: error {e:?} lacks {p:?}");
        }
    }
    let (c, _) = parse(r#"{"train_micro_batch_size_per_gpu": 8}"#).expect("parse");
    let e = c.check_against(&DIGITS, "conf/train.yaml").expect_err("micro batch").to_string();
    assert!(e.contains("expected 1") && e.contains("found 8"), "{e}");
    // "auto" takes train.yaml's values, so it never disagrees.
    let (c, _) = parse(r#"{"gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_micro_batch_size_per_gpu": "auto"}"#).expect("parse");
    assert_eq!(c.gradient_accumulation_steps, Some(Setting::Auto));
    c.check_against(&TrainYamlKeys { accum_grad: 7, grad_clip: 0.25, log_interval: 3 }, "t.yaml").expect("auto agrees");
}

#[test]
fn stage_3_offload_and_both_precisions_are_errors() {
    let e = err(r#"{"zero_optimization": {"stage": 3}}"#);
    assert!(e.contains("ZeRO stage 3 is not supported") && e.contains("conf/x.json"), "{e}");
    let e = err(r#"{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}"#);
    assert!(e.contains("zero_optimization.offload_optimizer.device") && e.contains("\"cpu\""), "{e}");
    let (c, _) = parse(r#"{"fp16": {"enabled": true}, "bf16": {"enabled": true}}"#).expect("parse");
    let e = c.check_against(&DIGITS, "t.yaml").expect_err("both").to_string();
    assert!(e.contains("fp16.enabled and bf16.enabled are both true"), "{e}");
    let (c, _) = parse(r#"{"bf16": {"enabled": true}}"#).expect("parse");
    assert_eq!(c.precision().expect("bf16"), Precision::Bf16);
}

#[test]
fn wrong_types_name_the_key_and_file() {
    let cases = [
        (r#"{"zero_optimization": {"stage": "two"}}"#, "key zero_optimization.stage: expected a number, found string \"two\""),
        (r#"{"zero_optimization": {"stage": 1.5}}"#, "key zero_optimization.stage: expected a non-negative integer, found 1.5"),
        (r#"{"fp16": {"hysteresis": true}}"#, "key fp16.hysteresis: expected a number, found boolean true"),
        (r#"{"fp16": {"enabled": "yes"}}"#, "key fp16.enabled: expected true or false, found string \"yes\""),
        (r#"{"gradient_clipping": [1]}"#, "key gradient_clipping: expected a number or \"auto\", found a list"),
        (r#"{"steps_per_print": "auto"}"#, "key steps_per_print: expected a number, found string \"auto\""),
        (r#"{"zero_optimization": 2}"#, "key zero_optimization: expected an object, found number 2"),
        (r#"{"optimizer": {"type": "SGD"}}"#, "key optimizer.type: expected Adam or AdamW, found \"SGD\""),
        (r#"{"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}}"#, "key optimizer.params.betas: expected a list of two numbers"),
        (r#"{"zero_optimization": {"reduce_bucket_size": 0}}"#, "key zero_optimization.reduce_bucket_size: expected at least 1 element, found 0"),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want) && e.starts_with("config conf/x.json:"), "{text}: {e:?} lacks {want:?}");
    }
    let e = err("{not json");
    assert!(e.contains("conf/x.json") && e.contains("not valid JSON"), "{e}");
}

#[test]
fn optimizer_section_overrides_train_yaml_adam() {
    let base = AdamConfig { lr: 0.003, ..Default::default() };
    let (c, w) = parse(r#"{"optimizer": {"type": "Adam", "params": {"lr": 1e-4, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01}}}"#).expect("parse");
    assert!(w.is_empty(), "{w:?}");
    let a = c.adam_config(base);
    assert_eq!((a.lr, a.betas, a.eps, a.weight_decay), (1e-4, (0.8, 0.99), 1e-6, 0.01));
    assert!(a.decoupled, "DeepSpeed's Adam is AdamW unless adam_w_mode is false");
    let (c, _) = parse(r#"{"optimizer": {"type": "Adam", "params": {"lr": "auto", "adam_w_mode": false}}}"#).expect("parse");
    let a = c.adam_config(base);
    assert_eq!(a.lr, 0.003, "auto takes train.yaml's lr");
    assert!(!a.decoupled);
    let (c, _) = parse("{}").expect("parse");
    assert_eq!(c.adam_config(base).lr, 0.003);
    assert!(!c.adam_config(base).decoupled, "no optimizer section: train.yaml's optim decides");
}

fn run_scaler(text: &str, overflows: &[bool]) -> Vec<f64> {
    let (c, _) = parse(text).expect("parse");
    let mut s = GradScaler::new(c.scaler_config().expect("fp16 scaler"));
    overflows
        .iter()
        .map(|&o| {
            s.set_found_inf(o);
            s.update();
            s.scale
        })
        .collect()
}

#[test]
fn fp16_dynamic_scale_follows_deepspeed_rules() {
    // Worked by hand from DeepSpeed's rule: on overflow, halve (floored at
    // min_loss_scale) only when the hysteresis is down to 1, else spend one;
    // double after loss_scale_window clean steps since the last overflow,
    // which also restores the hysteresis.
    let t = r#"{"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 4, "loss_scale_window": 3, "hysteresis": 2, "min_loss_scale": 2}}"#;
    let (o, k) = (true, false);
    assert_eq!(run_scaler(t, &[o, o, o, k, k, k, o, o, o, o]), vec![16.0, 8.0, 4.0, 4.0, 4.0, 8.0, 8.0, 4.0, 2.0, 2.0]);
    // consecutive_hysteresis: one clean step restores the allowance.
    let t = r#"{"fp16": {"enabled": true, "initial_scale_power": 4, "loss_scale_window": 100, "hysteresis": 2, "consecutive_hysteresis": true}}"#;
    assert_eq!(run_scaler(t, &[o, k, o, o]), vec![16.0, 16.0, 16.0, 8.0]);
    // Defaults: 2^16, hysteresis 2, floor 1.
    let (c, _) = parse(r#"{"fp16": {"enabled": true}}"#).expect("parse");
    let sc = c.scaler_config().expect("scaler");
    assert_eq!((sc.init_scale, sc.growth_interval, sc.hysteresis, sc.min_scale), (65536.0, 1000, 2, 1.0));
    // A static scale never moves.
    assert_eq!(run_scaler(r#"{"fp16": {"enabled": true, "loss_scale": 128}}"#, &[o, k, o]), vec![128.0, 128.0, 128.0]);
}

#[test]
fn errors_deep_in_a_section_name_the_whole_key_path() {
    // The section structs hand each key's value to its field type; the path is the JSON's, however deep.
    let cases = [
        (r#"{"zero_optimization": {"offload_param": {"device": 1}}}"#, "key zero_optimization.offload_param.device: expected a string, found number 1"),
        (r#"{"zero_optimization": {"offload_optimizer": "cpu"}}"#, "key zero_optimization.offload_optimizer: expected an object, found string \"cpu\""),
        (
            r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": [1]}}}"#,
            "key scheduler.params.warmup_num_steps: expected a number or \"auto\", found a list",
        ),
        (r#"{"optimizer": {"type": "Adam", "params": {"adam_w_mode": 0}}}"#, "key optimizer.params.adam_w_mode: expected true or false, found number 0"),
        (
            r#"{"bfloat16": {"enabled": null, "check_grad_overflow": 1}, "bf16": {"enabled": "no"}}"#,
            "key bf16.enabled: expected true or false, found string \"no\"",
        ),
        (r#"{"fp16": {"loss_scale_window": -2}}"#, "key fp16.loss_scale_window: expected a non-negative integer, found -2"),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e == format!("config conf/x.json: {want}"), "{text}: {e:?}, expected the message {want:?}");
    }
    // null sections and keys are absent ones; keys DeepSpeed has and asrforge does not read are accepted silently.
    let (c, w) = parse(
        r#"{"fp16": null, "zero_optimization": {"stage": 1, "round_robin_gradients": true, "offload_param": {"device": "none", "pin_memory": true}}, "bf16": {"enabled": null}, "scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": -1, "warmup_type": "linear"}}}"#,
    )
    .expect("parse");
    assert!(w.is_empty(), "{w:?}");
    assert_eq!((c.zero.stage, c.fp16.enabled, c.bf16), (1, false, false));
    assert_eq!(c.scheduler.expect("scheduler").warmup_type.as_deref(), Some("linear"));
    let (_, w) = parse(r#"{"zero_optimization": {"offload_param": {"devise": "none"}}, "optimizer": {"type": "AdamW", "params": {"lr": 1, "beta": 2}}}"#)
        .expect("parse");
    assert_eq!(
        w,
        vec![
            "deepspeed config conf/x.json: unknown key zero_optimization.offload_param.devise (ignored)".to_string(),
            "deepspeed config conf/x.json: unknown key optimizer.params.beta (ignored)".to_string(),
        ]
    );
}

/// `communication_data_type` as DeepSpeed reads it: "fp16", "bf16" or
/// "fp32" in any case; without it the precision decides (fp16 → f16, bf16 →
/// bf16, else f32, DeepSpeed's engine property); anything else is an error
/// naming the key; it is read, so no longer warned about.
#[test]
fn communication_data_type_follows_deepspeed() {
    use asrforge::tensor::DType;
    for (text, want) in [
        (r#"{}"#, None),
        (r#"{"fp16": {"enabled": true}}"#, Some(DType::F16)),
        (r#"{"bf16": {"enabled": true}}"#, Some(DType::BF16)),
        (r#"{"bfloat16": {"enabled": true}}"#, Some(DType::BF16)),
        (r#"{"communication_data_type": "fp16"}"#, Some(DType::F16)),
        (r#"{"communication_data_type": "BF16"}"#, Some(DType::BF16)),
        (r#"{"communication_data_type": "fp32", "fp16": {"enabled": true}}"#, None),
        (r#"{"communication_data_type": "bf16", "fp16": {"enabled": true}}"#, Some(DType::BF16)),
        (r#"{"communication_data_type": null, "bf16": {"enabled": true}}"#, Some(DType::BF16)),
    ] {
        let (c, w) = parse(text).expect(text);
        assert!(w.is_empty(), "{text}: {w:?}");
        assert_eq!(c.grad_comm_dtype().expect(text), want, "{text}");
    }
    let (c, _) = parse(r#"{"communication_data_type": "Fp32"}"#).expect("parse");
    assert_eq!(c.communication_data_type, Some(DType::F32));
    for (text, found) in [(r#"{"communication_data_type": "fp8"}"#, "\"fp8\""), (r#"{"communication_data_type": "bfp16"}"#, "\"bfp16\"")] {
        let e = err(text);
        assert!(e.contains("key communication_data_type") && e.contains("expected \"fp16\", \"bf16\" or \"fp32\"") && e.contains(found), "{e}");
    }
    let e = err(r#"{"communication_data_type": 16}"#);
    assert!(e.contains("communication_data_type") && e.contains("expected a string, found number 16"), "{e}");
    // Both precisions enabled stays the precision's error.
    let (c, _) = parse(r#"{"fp16": {"enabled": true}, "bf16": {"enabled": true}}"#).expect("parse");
    assert!(c.grad_comm_dtype().unwrap_err().to_string().contains("both true"));
}
