//! scripts/bench-compare.sh's verdicts on criterion output written by hand:
//! which benches moved beyond their noise band, which regressed past the
//! threshold, and the exit status a merge check relies on.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes `<root>/<bench>/<baseline>/estimates.json` (and benchmark.json)
/// with a mean of `ns` and a 95 % interval of ±`half` ns.
fn estimate(root: &Path, bench: &str, baseline: &str, ns: f64, half: f64) {
    let d = root.join(bench).join(baseline);
    std::fs::create_dir_all(&d).unwrap();
    let est = format!(
        r#"{{"mean":{{"confidence_interval":{{"confidence_level":0.95,"lower_bound":{},"upper_bound":{}}},"point_estimate":{ns},"standard_error":1.0}},"median":{{"confidence_interval":{{"confidence_level":0.95,"lower_bound":0,"upper_bound":0}},"point_estimate":{ns},"standard_error":1.0}}}}"#,
        ns - half,
        ns + half
    );
    std::fs::write(d.join("estimates.json"), est).unwrap();
    std::fs::write(d.join("benchmark.json"), format!(r#"{{"full_id":"{bench}"}}"#)).unwrap();
}

fn run(root: &Path, extra: &[&str]) -> (i32, String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench-compare.sh");
    let out = Command::new("bash").arg(script).args(["diff", "base", "base.new", "--dir"]).arg(root).args(extra).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn fixture(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("asrforge-bench-compare-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // 1 % slower with ±0.5 % intervals: inside the 2 % noise floor.
    estimate(&root, "gpu_kernels/steady", "base", 1000.0, 5.0);
    estimate(&root, "gpu_kernels/steady", "base.new", 1010.0, 5.0);
    // 30 % faster, tight intervals.
    estimate(&root, "gpu_kernels/faster", "base", 2000.0, 10.0);
    estimate(&root, "gpu_kernels/faster", "base.new", 1400.0, 10.0);
    // 25 % slower, tight intervals: a regression past 10 %.
    estimate(&root, "gpu_kernels/slower", "base", 4000.0, 20.0);
    estimate(&root, "gpu_kernels/slower", "base.new", 5000.0, 20.0);
    // 25 % slower but the intervals are ±20 % each: noise, not a move.
    estimate(&root, "gpu_kernels/noisy", "base", 1000.0, 200.0);
    estimate(&root, "gpu_kernels/noisy", "base.new", 1250.0, 250.0);
    // Only in the new run.
    estimate(&root, "gpu_kernels/added", "base.new", 10.0, 0.1);
    root
}

#[test]
fn a_slowdown_past_the_threshold_fails_and_noise_is_not_reported() {
    let root = fixture("fail");
    let (code, out, err) = run(&root, &["--threshold", "10"]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("4 benches compared"), "{out}");
    assert!(out.contains("2 moved"), "{out}");
    let line = |name: &str| out.lines().find(|l| l.starts_with(name)).map(str::to_string);
    let slower = line("gpu_kernels/slower").expect("the regression is listed");
    assert!(slower.contains("+25.0%") && slower.contains("REGRESSION"), "{slower}");
    let faster = line("gpu_kernels/faster").expect("the speed-up is listed");
    assert!(faster.contains("-30.0%") && faster.contains("faster"), "{faster}");
    assert!(line("gpu_kernels/steady").is_none(), "a 1 % move inside the noise floor is not listed:\n{out}");
    assert!(line("gpu_kernels/noisy").is_none(), "a move inside the intervals is not listed:\n{out}");
    assert!(out.contains("gpu_kernels/added has no 'base' result"), "{out}");
    assert!(err.contains("1 regression(s) past 10 %"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_threshold_above_the_slowdown_passes_but_still_lists_it() {
    let root = fixture("pass");
    let (code, out, err) = run(&root, &["--threshold", "30"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.lines().any(|l| l.starts_with("gpu_kernels/slower") && l.contains("slower")), "{out}");
    // A noise floor above every change hides them all.
    let (code, out, _) = run(&root, &["--threshold", "10", "--noise", "40"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 moved"), "{out}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn nothing_to_compare_is_a_usage_error_naming_the_baselines() {
    let root = std::env::temp_dir().join(format!("asrforge-bench-compare-empty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    estimate(&root, "only/base", "base", 1.0, 0.1);
    let (code, _, err) = run(&root, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("'base'") && err.contains("'base.new'"), "{err}");
    let (code, _, err) = run(&root.join("missing"), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no criterion output"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}
