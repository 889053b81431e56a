//! Character / word error rate with the semantics of WeNet's `compute-wer.py`:
//! a Levenshtein alignment (every edit costs 1) of reference against
//! hypothesis, counted as substitutions, deletions and insertions, per
//! utterance and over a whole test set.
//!
//! Where several alignments have the same cost, the one WeNet reports is
//! kept, so S/D/I match its output and not only their sum: at every cell the
//! candidates are tried in the order deletion, insertion, diagonal (match or
//! substitution), and a later candidate replaces an earlier one only when it
//! is strictly cheaper. The trace-back then runs from the end.
//!
//! Text is compared as given. Unlike compute-wer.py's defaults there is no
//! upper-casing and no removal of `<tags>` or punctuation, and char mode
//! splits every non-space character (compute-wer.py keeps runs of ASCII
//! letters together). A reference key with no hypothesis counts as all
//! deletions, where compute-wer.py leaves it out: a decoder that drops
//! utterances must not look better for it.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use crate::error::{Error, Result};

/// Counts of one alignment or a sum of alignments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Reference tokens (C + S + D).
    pub n: u64,
    /// Correct tokens.
    pub c: u64,
    /// Substitutions.
    pub s: u64,
    /// Deletions (reference tokens missing from the hypothesis).
    pub d: u64,
    /// Insertions (hypothesis tokens with no reference token).
    pub i: u64,
}

impl Counts {
    /// The error rate in percent, (S + D + I) / N · 100; 0 when N = 0, as WeNet reports it.
    pub fn error_rate(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            (self.s + self.d + self.i) as f64 * 100.0 / self.n as f64
        }
    }

    /// Adds another set of counts to this one.
    pub fn add(&mut self, other: &Counts) {
        self.n += other.n;
        self.c += other.c;
        self.s += other.s;
        self.d += other.d;
        self.i += other.i;
    }
}

impl fmt::Display for Counts {
    /// `6.07 % N=104765 C=98565 S=6042 D=158 I=158`, the tail of WeNet's lines.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:4.2} % N={} C={} S={} D={} I={}", self.error_rate(), self.n, self.c, self.s, self.d, self.i)
    }
}

/// One step of an alignment, holding indices into the reference / hypothesis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// Reference token `r` equals hypothesis token `h`.
    Correct { r: usize, h: usize },
    /// Reference token `r` was recognised as hypothesis token `h`.
    Substitution { r: usize, h: usize },
    /// Reference token `r` has no counterpart.
    Deletion { r: usize },
    /// Hypothesis token `h` has no counterpart.
    Insertion { h: usize },
}

/// The alignment of one reference against one hypothesis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alignment {
    /// The edits from the first tokens to the last.
    pub edits: Vec<Edit>,
    /// Their counts.
    pub counts: Counts,
}

// Back-pointers of the dynamic programme, one byte per cell.
const START: u8 = 0;
const DEL: u8 = 1;
const INS: u8 = 2;
const DIAG: u8 = 3;

/// Aligns `reference` against `hypothesis` at minimum edit cost, breaking ties as WeNet does.
pub fn align<T: PartialEq>(reference: &[T], hypothesis: &[T]) -> Alignment {
    let (n, m) = (reference.len(), hypothesis.len());
    let w = m + 1;
    let mut dist = vec![0u64; (n + 1) * w];
    let mut back = vec![START; (n + 1) * w];
    for i in 1..=n {
        dist[i * w] = i as u64;
        back[i * w] = DEL;
    }
    for j in 1..=m {
        dist[j] = j as u64;
        back[j] = INS;
    }
    for i in 1..=n {
        for j in 1..=m {
            let mut best = dist[(i - 1) * w + j] + 1;
            let mut op = DEL;
            let ins = dist[i * w + j - 1] + 1;
            if ins < best {
                best = ins;
                op = INS;
            }
            let diag = dist[(i - 1) * w + j - 1] + u64::from(reference[i - 1] != hypothesis[j - 1]);
            if diag < best {
                best = diag;
                op = DIAG;
            }
            dist[i * w + j] = best;
            back[i * w + j] = op;
        }
    }

    let mut edits = Vec::with_capacity(n.max(m));
    let mut counts = Counts::default();
    let (mut i, mut j) = (n, m);
    loop {
        match back[i * w + j] {
            DIAG => {
                let (r, h) = (i - 1, j - 1);
                if reference[r] == hypothesis[h] {
                    counts.c += 1;
                    edits.push(Edit::Correct { r, h });
                } else {
                    counts.s += 1;
                    edits.push(Edit::Substitution { r, h });
                }
                i -= 1;
                j -= 1;
            }
            DEL => {
                counts.d += 1;
                edits.push(Edit::Deletion { r: i - 1 });
                i -= 1;
            }
            INS => {
                counts.i += 1;
                edits.push(Edit::Insertion { h: j - 1 });
                j -= 1;
            }
            _ => break,
        }
    }
    edits.reverse();
    counts.n = counts.c + counts.s + counts.d;
    Alignment { edits, counts }
}

/// Splits a transcript into tokens: characters without whitespace in char mode, else whitespace-separated words.
pub fn tokenize(text: &str, char_mode: bool) -> Vec<String> {
    if char_mode {
        text.chars().filter(|c| !c.is_whitespace()).map(String::from).collect()
    } else {
        text.split_whitespace().map(String::from).collect()
    }
}

/// The result for one utterance of the reference file.
#[derive(Clone, Debug, PartialEq)]
pub struct UttResult {
    /// The utterance key.
    pub key: String,
    /// Reference tokens.
    pub reference: Vec<String>,
    /// Hypothesis tokens (empty when the hypothesis file has no line for the key).
    pub hypothesis: Vec<String>,
    /// The alignment between them.
    pub alignment: Alignment,
    /// Whether the hypothesis file had no line for this key.
    pub missing_hyp: bool,
}

impl UttResult {
    /// `WER: 25.00 % N=4 C=3 S=1 D=0 I=0`, WeNet's per-utterance line.
    pub fn line(&self) -> String {
        self.line_as(false)
    }

    /// The per-utterance line labelled `CER:` when `char_mode` scores characters, else `WER:`.
    pub fn line_as(&self, char_mode: bool) -> String {
        format!("{}: {}", if char_mode { "CER" } else { "WER" }, self.alignment.counts)
    }
}

/// The scores of a whole hypothesis file against a reference file.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// One entry per reference utterance, in reference-file order.
    pub utterances: Vec<UttResult>,
    /// The sum over all utterances.
    pub overall: Counts,
    /// Keys of the hypothesis file that the reference file lacks; they are not scored.
    pub skipped_hyp_keys: Vec<String>,
    /// How many reference utterances had no hypothesis (scored as all deletions).
    pub missing_hyp: usize,
}

impl Report {
    /// `Overall -> 6.07 % N=104765 C=98565 S=6042 D=158 I=158`, WeNet's summary line.
    pub fn overall_line(&self) -> String {
        format!("Overall -> {}", self.overall)
    }
}

/// One parsed `key text…` line.
struct Entry {
    key: String,
    tokens: Vec<String>,
}

/// Parses Kaldi-style `key text…` lines; blank lines are skipped, a repeated key is an error.
fn parse_text(contents: &str, path: &str, char_mode: bool) -> Result<Vec<Entry>> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (idx, raw) in contents.lines().enumerate() {
        let line = idx + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        let (key, text) = match trimmed.find(char::is_whitespace) {
            Some(pos) => (&trimmed[..pos], &trimmed[pos..]),
            None => (trimmed, ""),
        };
        if let Some(first) = seen.insert(key.to_string(), line) {
            // Scoring a key twice would silently double its weight in the total.
            return Err(Error::Parse { path: path.to_string(), line, msg: format!("expected each key once, found `{key}` again (first on line {first})") });
        }
        out.push(Entry { key: key.to_string(), tokens: tokenize(text, char_mode) });
    }
    Ok(out)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })
}

/// Scores texts already in memory (`key text…` lines); `ref_name` / `hyp_name` name them in errors.
pub fn compute_cer_str(reference: &str, ref_name: &str, hypothesis: &str, hyp_name: &str, char_mode: bool) -> Result<Report> {
    let refs = parse_text(reference, ref_name, char_mode)?;
    let hyps = parse_text(hypothesis, hyp_name, char_mode)?;
    let ref_keys: std::collections::HashSet<&str> = refs.iter().map(|e| e.key.as_str()).collect();
    let skipped_hyp_keys: Vec<String> = hyps.iter().filter(|h| !ref_keys.contains(h.key.as_str())).map(|h| h.key.clone()).collect();
    let mut hyp_map: HashMap<String, Entry> = hyps.into_iter().map(|h| (h.key.clone(), h)).collect();

    let mut utterances = Vec::with_capacity(refs.len());
    let mut overall = Counts::default();
    let mut missing_hyp = 0;
    for r in refs {
        let (hypothesis, missing) = match hyp_map.remove(&r.key) {
            Some(h) => (h.tokens, false),
            None => (Vec::new(), true),
        };
        missing_hyp += usize::from(missing);
        let alignment = align(&r.tokens, &hypothesis);
        overall.add(&alignment.counts);
        utterances.push(UttResult { key: r.key, reference: r.tokens, hypothesis, alignment, missing_hyp: missing });
    }
    Ok(Report { utterances, overall, skipped_hyp_keys, missing_hyp })
}

/// Scores a Kaldi-style hypothesis file against a reference file, in char mode or word mode.
pub fn compute_cer(ref_file: impl AsRef<Path>, hyp_file: impl AsRef<Path>, char_mode: bool) -> Result<Report> {
    let (rp, hp) = (ref_file.as_ref(), hyp_file.as_ref());
    let reference = read(rp)?;
    let hypothesis = read(hp)?;
    compute_cer_str(&reference, &rp.display().to_string(), &hypothesis, &hp.display().to_string(), char_mode)
}
