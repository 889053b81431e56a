//! `asrforge compute-cer` through the binary: char and word mode, WeNet's
//! `--char=1` spelling, and a typed error for a missing file.

#[path = "common/tempdir.rs"]
mod tempdir;

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_asrforge"))
}

/// The reference and hypothesis files, in a directory removed when the
/// returned guard drops.
fn write_texts(tag: &str) -> (PathBuf, PathBuf, tempdir::TempDir) {
    let dir = tempdir::TempDir::new(&format!("cer-cli-{tag}"));
    let r = dir.join("ref");
    let h = dir.join("hyp");
    std::fs::write(&r, "u1 ONE TWO\nu2 THREE\n").unwrap();
    std::fs::write(&h, "u1 ONE TOO\nu2 THREE\n").unwrap();
    (r, h, dir)
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = bin().args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn char_mode_counts_characters() {
    let (r, h, _dir) = write_texts("char");
    let (ok, out, err) = run(&["compute-cer", "--ref", r.to_str().unwrap(), "--hyp", h.to_str().unwrap(), "--char"]);
    assert!(ok, "stderr: {err}");
    // u1: ONETWO vs ONETOO is one substitution of 6; u2 is 5 correct characters.
    assert!(out.contains("utt: u1\nCER: 16.67 % N=6 C=5 S=1 D=0 I=0\n"), "{out}");
    assert!(out.contains("utt: u2\nCER: 0.00 % N=5 C=5 S=0 D=0 I=0\n"), "{out}");
    assert_eq!(out.lines().last().unwrap(), "Overall -> 9.09 % N=11 C=10 S=1 D=0 I=0");
}

#[test]
fn wenet_char_equals_one_spelling() {
    let (r, h, _dir) = write_texts("eq1");
    let (ok, out, _) = run(&["compute-cer", "--char=1", "--ref", r.to_str().unwrap(), "--hyp", h.to_str().unwrap()]);
    assert!(ok);
    assert_eq!(out.lines().last().unwrap(), "Overall -> 9.09 % N=11 C=10 S=1 D=0 I=0");
}

#[test]
fn word_mode_counts_words() {
    let (r, h, _dir) = write_texts("word");
    for extra in [&[][..], &["--char=0"][..]] {
        let mut args = vec!["compute-cer", "--ref", r.to_str().unwrap(), "--hyp", h.to_str().unwrap()];
        args.extend_from_slice(extra);
        let (ok, out, _) = run(&args);
        assert!(ok);
        assert!(out.contains("lab: ONE TWO\nrec: ONE TOO\n"), "{out}");
        assert_eq!(out.lines().last().unwrap(), "Overall -> 33.33 % N=3 C=2 S=1 D=0 I=0");
    }
}

#[test]
fn missing_file_is_an_error_naming_it() {
    let (r, _, _dir) = write_texts("missing");
    let (ok, _, err) = run(&["compute-cer", "--ref", r.to_str().unwrap(), "--hyp", "/nonexistent/hyp.txt", "--char"]);
    assert!(!ok);
    assert!(err.starts_with("error: /nonexistent/hyp.txt"), "{err}");
}

#[test]
fn bad_char_value_is_rejected() {
    let (r, h, _dir) = write_texts("bad");
    let (ok, _, err) = run(&["compute-cer", "--char=maybe", "--ref", r.to_str().unwrap(), "--hyp", h.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("expected 0 or 1, found `maybe`"), "{err}");
}
