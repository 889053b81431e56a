//! The CLI as a careless user runs it, on the run-management cases: a
//! model_dir holding another run's checkpoints, `average` over two runs,
//! temporary files of interrupted saves, missing required arguments. Each
//! case asserts the exit code, a message naming the file or argument, no
//! backtrace, and what is left in the model_dir.

mod train_common;

use std::path::{Path, PathBuf};
use std::process::Output;

fn asrforge(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_asrforge")).args(args).env("RUST_BACKTRACE", "1").output().expect("run asrforge")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failure: exit code 1, every `needles` in stderr, no panic or backtrace.
fn assert_refused(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "expected exit code 1, got {:?}\nstderr:\n{err}", o.status);
    for n in needles {
        assert!(err.contains(n), "stderr names {n:?}:\n{err}");
    }
    assert!(!err.contains("panicked") && !err.contains("stack backtrace") && !err.contains("RUST_BACKTRACE"), "no panic:\n{err}");
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "expected success, got {:?}\nstderr:\n{}", o.status, stderr(o));
}

/// Every file of `dir` (not below it) with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

fn names(dir: &Path) -> Vec<String> {
    snapshot(dir).into_iter().map(|(n, _)| n).collect()
}

/// `asrforge train` over the corpus in `dir` into `dir/exp`, with `extra` flags.
fn train(dir: &Path, extra: &[&str]) -> Output {
    let d = |f: &str| dir.join(f).display().to_string();
    let mut a: Vec<String> = vec!["train".into(), "--config".into(), d("train.yaml"), "--model_dir".into(), d("exp"), "--tensorboard_dir".into(), d("tb")];
    for (flag, f) in [("--train_data", "data.list"), ("--cv_data", "data.list"), ("--symbol_table", "units.txt")] {
        a.push(flag.into());
        a.push(d(f));
    }
    a.extend(["--num_workers", "1", "--seed", "7"].map(String::from));
    a.extend(extra.iter().map(|s| s.to_string()));
    asrforge(&a.iter().map(String::as_str).collect::<Vec<_>>())
}

fn config_of(yaml: &Path) -> serde_yaml_ng::Value {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(yaml).unwrap()).unwrap();
    v["config"].clone()
}

#[test]
fn missing_required_arguments_are_named() {
    let o = asrforge(&["train"]);
    assert_refused(&o, &["--config", "--model_dir", "--train_data", "--cv_data"]);
    let o = asrforge(&["average"]);
    assert_refused(&o, &["--dst_model", "--src_path"]);
    let o = asrforge(&["train", "--config", "c.yaml", "--model_dir", "m"]);
    let err = stderr(&o);
    assert_refused(&o, &["--train_data", "--cv_data"]);
    assert!(!err.contains("--config <"), "only the missing ones are named:\n{err}");
}

#[test]
fn a_model_dir_of_another_run_is_refused_unless_resumed_or_overwritten_and_stale_temporaries_go() {
    let dir = train_common::tmpdir("hostile-model-dir");
    train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 4, 2, ""));
    let exp = dir.join("exp");
    // Temporary files a kill -9 during a save leaves behind (write_atomic's names).
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join(".epoch_0.safetensors.tmp.4242"), b"half a checkpoint").unwrap();
    std::fs::write(exp.join(".train.yaml.tmp.17"), b"half a yaml").unwrap();
    let o = train(&dir, &[]);
    assert_ok(&o);
    assert!(stderr(&o).contains(".epoch_0.safetensors.tmp.4242"), "the removal is reported:\n{}", stderr(&o));
    let first = names(&exp);
    assert!(first.iter().all(|n| !n.contains(".tmp.")), "stale temporaries removed: {first:?}");
    assert!(first.contains(&"epoch_1.safetensors".to_string()), "{first:?}");

    // A second run with another config into the same directory: refused, nothing touched.
    let before = snapshot(&exp);
    let o = train(&dir, &["--override_config", "max_epoch 1", "--override_config", "optim_conf.lr 0.002"]);
    assert_refused(&o, &[&exp.display().to_string(), "epoch_0.safetensors", "--overwrite", "--checkpoint"]);
    assert!(snapshot(&exp) == before, "a refused run leaves the model_dir as it was");
    // A --checkpoint from elsewhere does not make the directory ours either.
    let other = dir.join("elsewhere.safetensors");
    std::fs::copy(exp.join("epoch_0.safetensors"), &other).unwrap();
    let o = train(&dir, &["--checkpoint", &other.display().to_string()]);
    assert_refused(&o, &["epoch_0.safetensors", "elsewhere.safetensors"]);
    assert!(snapshot(&exp) == before);

    // Resuming from one of its own checkpoints is the same run: allowed.
    std::fs::write(exp.join(".epoch_1.yaml.tmp.5"), b"x").unwrap();
    let o = train(&dir, &["--checkpoint", &exp.join("epoch_0.safetensors").display().to_string()]);
    assert_ok(&o);
    assert!(!exp.join(".epoch_1.yaml.tmp.5").exists(), "stale temporary removed at the resumed start");

    // --overwrite: the old run's files are gone; only the new run's remain.
    let o = train(&dir, &["--overwrite", "--override_config", "max_epoch 1", "--override_config", "optim_conf.lr 0.002"]);
    assert_ok(&o);
    let after = names(&exp);
    assert!(!after.iter().any(|n| n.starts_with("epoch_1")), "the old run's epoch_1 is removed: {after:?}");
    let new = config_of(&exp.join("epoch_0.yaml"));
    assert_eq!(new["max_epoch"].as_u64(), Some(1));
    for n in after.iter().filter(|n| n.ends_with(".yaml") && *n != "train.yaml") {
        assert_eq!(config_of(&exp.join(n)), new, "{n} belongs to the new run");
    }
}

#[test]
fn average_refuses_checkpoints_of_two_runs() {
    let dir = train_common::tmpdir("hostile-average");
    train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 4, 2, ""));
    assert_ok(&train(&dir, &[]));
    let exp = dir.join("exp");
    let dst: PathBuf = dir.join("avg.safetensors");
    // Same run: fine.
    let o = asrforge(&["average", "--dst_model", &dst.display().to_string(), "--src_path", &exp.display().to_string(), "--num", "2"]);
    assert_ok(&o);
    std::fs::remove_file(&dst).unwrap();
    // A checkpoint of another run (its train.yaml differs in one key) slipped in as epoch 7.
    std::fs::copy(exp.join("epoch_0.safetensors"), exp.join("epoch_7.safetensors")).unwrap();
    let mut infos: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(exp.join("epoch_0.yaml")).unwrap()).unwrap();
    infos["epoch"] = 7.into();
    infos["config"]["optim_conf"]["lr"] = 0.5.into();
    std::fs::write(exp.join("epoch_7.yaml"), serde_yaml_ng::to_string(&infos).unwrap()).unwrap();
    let o = asrforge(&["average", "--dst_model", &dst.display().to_string(), "--src_path", &exp.display().to_string(), "--num", "2"]);
    assert_refused(&o, &["epoch_1.safetensors", "epoch_7", "optim_conf.lr", "different runs"]);
    assert!(!dst.exists(), "nothing written");
    let left: Vec<String> = names(&dir).into_iter().filter(|n| n.contains(".tmp.")).collect();
    assert!(left.is_empty(), "{left:?}");
}
