//! CER/WER against hand-computed alignments, WeNet's tie-breaking and its
//! report format, and the file-level rules (missing and extra keys).

use asrforge::decode::cer::{align, compute_cer, compute_cer_str, tokenize, Counts, Edit};
use asrforge::Error;

fn chars(s: &str) -> Vec<String> {
    tokenize(s, true)
}

fn counts(r: &str, h: &str) -> Counts {
    align(&chars(r), &chars(h)).counts
}

fn c(n: u64, c: u64, s: u64, d: u64, i: u64) -> Counts {
    Counts { n, c, s, d, i }
}

#[test]
fn single_edits() {
    assert_eq!(counts("abcd", "abxd"), c(4, 3, 1, 0, 0));
    assert_eq!(counts("abc", "ab"), c(3, 2, 0, 1, 0));
    assert_eq!(counts("ab", "abc"), c(2, 2, 0, 0, 1));
    assert_eq!(counts("abc", "abc"), c(3, 3, 0, 0, 0));
    assert_eq!(counts("abc", "xyz"), c(3, 0, 3, 0, 0));
    // "kitten" -> "sitting": k/s and e/i substituted, g inserted.
    assert_eq!(counts("kitten", "sitting"), c(6, 4, 2, 0, 1));
}

#[test]
fn empty_sides() {
    assert_eq!(counts("", ""), c(0, 0, 0, 0, 0));
    assert_eq!(counts("abc", ""), c(3, 0, 0, 3, 0));
    assert_eq!(counts("", "ab"), c(0, 0, 0, 0, 2));
    // N = 0 reports 0 %, not a division by zero.
    assert_eq!(counts("", "ab").error_rate(), 0.0);
    assert_eq!(counts("abc", "").error_rate(), 100.0);
}

#[test]
fn ties_prefer_deletion_then_insertion_over_substitution() {
    // "ab" vs "ba" costs 2 either as two substitutions or as insertion +
    // deletion; WeNet tries deletion first and keeps it unless strictly beaten,
    // which yields I=1 D=1 S=0 traced as: insert b, match a, delete b.
    let a = align(&chars("ab"), &chars("ba"));
    assert_eq!(a.counts, c(2, 1, 0, 1, 1));
    assert_eq!(a.edits, vec![Edit::Insertion { h: 0 }, Edit::Correct { r: 0, h: 1 }, Edit::Deletion { r: 1 }]);
    // A substitution that is strictly cheaper still wins.
    let a = align(&chars("a"), &chars("b"));
    assert_eq!(a.edits, vec![Edit::Substitution { r: 0, h: 0 }]);
}

#[test]
fn char_and_word_tokenizing() {
    assert_eq!(tokenize(" 你好 世界 ", true), vec!["你", "好", "世", "界"]);
    assert_eq!(tokenize("the  cat\tsat", false), vec!["the", "cat", "sat"]);
    assert_eq!(tokenize("the cat", true).len(), 6);
}

#[test]
fn word_mode_counts_words() {
    let a = align(&tokenize("the cat sat on the mat", false), &tokenize("the cat sit on mat", false));
    assert_eq!(a.counts, c(6, 4, 1, 1, 0));
}

#[test]
fn format_matches_wenet() {
    let k = c(104765, 98565, 6042, 158, 158);
    // (6042 + 158 + 158) / 104765 = 6.0688...%
    assert_eq!(format!("{k}"), "6.07 % N=104765 C=98565 S=6042 D=158 I=158");
    assert_eq!(format!("{}", c(0, 0, 0, 0, 3)), "0.00 % N=0 C=0 S=0 D=0 I=3");
    assert_eq!(format!("{}", c(3, 0, 0, 3, 2)), "166.67 % N=3 C=0 S=0 D=3 I=2");
}

#[test]
fn files_with_missing_and_extra_keys() {
    let dir = std::env::temp_dir().join(format!("asrforge-cer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (r, h) = (dir.join("text"), dir.join("hyp"));
    // u1: one substitution; u2: no hypothesis (3 deletions); u3: one insertion;
    // u4: hypothesis has the key only (2 deletions); extra: not in the reference.
    std::fs::write(&r, "u1 abcd\nu2 xyz\n\nu3 ab\nu4 pq\n").unwrap();
    std::fs::write(&h, "u1 abxd\nu3 a b c\nextra zzz\nu4\n").unwrap();
    let rep = compute_cer(&r, &h, true).unwrap();
    assert_eq!(rep.utterances.len(), 4);
    assert_eq!(rep.utterances[0].alignment.counts, c(4, 3, 1, 0, 0));
    assert_eq!(rep.utterances[0].line(), "WER: 25.00 % N=4 C=3 S=1 D=0 I=0");
    assert!(rep.utterances[1].missing_hyp);
    assert_eq!(rep.utterances[1].alignment.counts, c(3, 0, 0, 3, 0));
    assert_eq!(rep.utterances[2].alignment.counts, c(2, 2, 0, 0, 1));
    assert!(!rep.utterances[3].missing_hyp);
    assert_eq!(rep.utterances[3].alignment.counts, c(2, 0, 0, 2, 0));
    assert_eq!(rep.missing_hyp, 1);
    assert_eq!(rep.skipped_hyp_keys, vec!["extra".to_string()]);
    assert_eq!(rep.overall, c(11, 5, 1, 5, 1));
    // (1 + 5 + 1) / 11 = 63.636...%
    assert_eq!(rep.overall_line(), "Overall -> 63.64 % N=11 C=5 S=1 D=5 I=1");

    // Word mode on the same files: "a b c" is three words against the one word "ab".
    let rep = compute_cer(&r, &h, false).unwrap();
    assert_eq!(rep.utterances[2].alignment.counts, c(1, 0, 1, 0, 2));
    assert_eq!(rep.overall, c(4, 0, 2, 2, 2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_inputs_are_typed_errors() {
    let missing = std::env::temp_dir().join("asrforge-cer-no-such-file");
    match compute_cer(&missing, &missing, true) {
        Err(Error::Io { path, .. }) => assert!(path.contains("asrforge-cer-no-such-file")),
        other => panic!("expected an Io error naming the file, got {other:?}"),
    }
    match compute_cer_str("a x\nb y\na z\n", "ref.txt", "", "hyp.txt", true) {
        Err(Error::Parse { path, line, msg }) => {
            assert_eq!((path.as_str(), line), ("ref.txt", 3));
            assert!(msg.contains("`a`") && msg.contains("line 1"), "{msg}");
        }
        other => panic!("expected a Parse error, got {other:?}"),
    }
    // An empty reference scores nothing and prints 0.00 %.
    let rep = compute_cer_str("", "r", "u1 abc\n", "h", true).unwrap();
    assert_eq!(rep.overall_line(), "Overall -> 0.00 % N=0 C=0 S=0 D=0 I=0");
    assert_eq!(rep.skipped_hyp_keys.len(), 1);
}

#[test]
fn counts_agree_with_compute_wer_output() {
    // Expected counts are what WeNet's tools/compute-wer.py --char=1 printed for
    // these pairs (random strings where several equal-cost alignments exist, so
    // the split into S, D and I depends on the tie-breaking).
    let cases: [(&str, &str, [u64; 5]); 8] = [
        ("甲丁乙丁甲戊乙丁", "戊乙丙乙乙丁丙", [8, 3, 3, 2, 1]),
        ("乙戊戊乙丁甲丁丙", "乙戊丁丁丙丁丙甲", [8, 5, 2, 1, 1]),
        ("甲丙乙丙甲戊乙", "丙甲乙乙丙", [7, 3, 1, 3, 1]),
        ("甲甲甲丙戊", "丁丁丙丁甲", [5, 1, 3, 1, 1]),
        ("乙戊乙丙丙", "戊丙乙丁", [5, 2, 1, 2, 1]),
        ("丙乙甲戊丙戊丙丁", "丙戊丙甲甲丁丁丙", [8, 3, 4, 1, 1]),
        ("丙丁乙丁戊甲丙", "甲戊丁甲丙甲丁甲", [7, 3, 2, 2, 3]),
        ("戊乙乙乙丁丙丙", "乙甲乙丙甲甲", [7, 3, 2, 2, 1]),
    ];
    for (r, h, [n, cc, s, d, i]) in cases {
        assert_eq!(counts(r, h), c(n, cc, s, d, i), "{r} vs {h}");
    }
}
