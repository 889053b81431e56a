//! Sentencepiece's text normalisation: the precompiled character map
//! (`nmt_nfkc` and other rule sets) and the whitespace rules.
//!
//! The map is stored as `<u32 LE: trie size><darts-clone double-array
//! trie><NUL-terminated replacement strings>`. A trie unit is a u32: bit 8
//! says the node has a leaf, the low 8 bits (with bit 31) are the label, the
//! offset to the children is `(u >> 10) << ((u & (1 << 9)) >> 6)`, and a
//! leaf unit's low 31 bits are the byte offset of its replacement. The trie
//! is walked once when the model is read and turned into a table of rules,
//! so a broken map is an error at load time and normalising cannot fail.
//!
//! Normalising follows sentencepiece's `Normalizer::Normalize`: at each
//! position the longest user-defined symbol is kept as it is, otherwise the
//! longest rule (among the first 32 prefix matches, as sentencepiece's
//! fixed-size result buffer) replaces its key, otherwise one character is
//! copied; leading spaces are dropped, a space after a space is dropped,
//! trailing `▁` are dropped, spaces become `▁`, and `▁` is put in front.

use std::collections::HashMap;

use super::proto::NormalizerSpec;
use crate::error::{Error, Result};

/// The word-boundary mark.
const SPACE: &str = "\u{2581}";
/// Sentencepiece reads at most this many prefix matches of the rule trie.
const MAX_TRIE_RESULTS: usize = 32;
/// Bounds of the walk over a charsmap trie (nmt_nfkc has a few thousand keys of at most a few dozen bytes).
const MAX_KEY: usize = 256;
const MAX_VISITS: usize = 1 << 21;

/// A normaliser built from a model's `NormalizerSpec`.
#[derive(Clone, Debug)]
pub struct Normalizer {
    spec: NormalizerSpec,
    treat_whitespace_as_suffix: bool,
    /// Key bytes → replacement text.
    rules: HashMap<Vec<u8>, String>,
    longest_rule: usize,
    /// User-defined symbols, matched before the rules and kept whole.
    user_defined: Vec<String>,
}

fn has_leaf(u: u32) -> bool {
    (u >> 8) & 1 == 1
}

fn value(u: u32) -> u32 {
    u & 0x7fff_ffff
}

fn label(u: u32) -> u32 {
    u & (0x8000_0000 | 0xff)
}

fn offset(u: u32) -> usize {
    ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize
}

/// Reads a precompiled charsmap into `key → replacement` rules.
pub fn read_charsmap(blob: &[u8], path: &str) -> Result<HashMap<Vec<u8>, String>> {
    let err = |msg: String| Error::Data { path: path.into(), msg: format!("sentencepiece model, normalizer_spec.precompiled_charsmap: {msg}") };
    if blob.len() <= 4 {
        return Err(err(format!("expected a 4-byte trie size and a trie, found {} bytes", blob.len())));
    }
    let size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
    if size >= blob.len() - 4 + 1 || size % 4 != 0 || size == 0 {
        return Err(err(format!("expected a trie size that is a positive multiple of 4 below {}, found {size}", blob.len() - 4)));
    }
    let units: Vec<u32> = blob[4..4 + size].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let strings = &blob[4 + size..];
    let replacement = |v: u32| -> Result<String> {
        let start = v as usize;
        let Some(rest) = strings.get(start..) else {
            return Err(err(format!("a rule points at byte {start} of the {}-byte replacement strings", strings.len())));
        };
        let Some(end) = rest.iter().position(|&b| b == 0) else {
            return Err(err(format!("the replacement at byte {start} has no terminating NUL")));
        };
        String::from_utf8(rest[..end].to_vec()).map_err(|_| err(format!("the replacement at byte {start} is not UTF-8")))
    };
    let mut rules = HashMap::new();
    // Depth-first walk from the root. darts-clone shares identical subtrees
    // (a DAWG), so a node can be reached by several keys; the key length and
    // the number of visits bound the walk on a broken (cyclic) array.
    let mut stack: Vec<(usize, Vec<u8>)> = vec![(offset(units[0]), Vec::new())];
    let mut visited = 0usize;
    while let Some((pos, key)) = stack.pop() {
        visited += 1;
        if visited > MAX_VISITS || key.len() > MAX_KEY {
            return Err(err(format!("expected a trie of keys up to {MAX_KEY} bytes and {MAX_VISITS} nodes, found a longer walk (a cycle?)")));
        }
        for c in 1..=255u8 {
            let child = pos ^ c as usize;
            let Some(&u) = units.get(child) else { continue };
            if label(u) != u32::from(c) {
                continue;
            }
            let next = child ^ offset(u);
            let mut k = key.clone();
            k.push(c);
            if has_leaf(u) {
                let Some(&leaf) = units.get(next) else {
                    return Err(err(format!("a leaf at unit {next} is outside the {}-unit trie", units.len())));
                };
                if std::str::from_utf8(&k).is_err() {
                    return Err(err(format!("a rule's key {k:?} is not UTF-8")));
                }
                rules.insert(k.clone(), replacement(value(leaf))?);
            }
            stack.push((next, k));
        }
    }
    Ok(rules)
}

impl Normalizer {
    /// A normaliser for `spec`; `user_defined` are the model's user-defined pieces.
    pub fn new(spec: &NormalizerSpec, treat_whitespace_as_suffix: bool, user_defined: Vec<String>, path: &str) -> Result<Normalizer> {
        let rules = if spec.precompiled_charsmap.is_empty() { HashMap::new() } else { read_charsmap(&spec.precompiled_charsmap, path)? };
        let longest_rule = rules.keys().map(Vec::len).max().unwrap_or(0);
        Ok(Normalizer { spec: spec.clone(), treat_whitespace_as_suffix, rules, longest_rule, user_defined })
    }

    /// The number of replacement rules (0 for `identity`).
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// The longest user-defined symbol at the start of `s`, in bytes.
    pub fn user_defined_prefix(&self, s: &str) -> Option<usize> {
        self.user_defined.iter().filter(|u| s.starts_with(u.as_str())).map(|u| u.len()).max()
    }

    /// The replacement of the longest prefix of `s` and the bytes it consumes.
    fn prefix<'a>(&'a self, s: &'a str) -> (&'a str, usize) {
        if let Some(n) = self.user_defined_prefix(s) {
            return (&s[..n], n);
        }
        let bytes = s.as_bytes();
        let mut found = 0;
        let mut best: Option<(&str, usize)> = None;
        for n in 1..=self.longest_rule.min(bytes.len()) {
            if let Some(r) = self.rules.get(&bytes[..n]) {
                found += 1;
                best = Some((r.as_str(), n));
                if found == MAX_TRIE_RESULTS {
                    break;
                }
            }
        }
        match best {
            Some(b) => b,
            None => {
                let n = s.chars().next().map_or(0, char::len_utf8);
                (&s[..n], n)
            }
        }
    }

    /// `input` normalised as sentencepiece does before segmentation.
    pub fn normalize(&self, input: &str) -> String {
        let mut input = input;
        let mut out = String::with_capacity(input.len() * 3);
        if self.spec.remove_extra_whitespaces {
            while !input.is_empty() {
                let (r, n) = self.prefix(input);
                if r != " " {
                    break;
                }
                input = &input[n..];
            }
        }
        if input.is_empty() {
            return out;
        }
        let ws = if self.spec.escape_whitespaces { SPACE } else { " " };
        if !self.treat_whitespace_as_suffix && self.spec.add_dummy_prefix {
            out.push_str(ws);
        }
        let mut prev_space = self.spec.remove_extra_whitespaces;
        while !input.is_empty() {
            let (r, n) = self.prefix(input);
            let mut piece = r;
            while prev_space && piece.starts_with(' ') {
                piece = &piece[1..];
            }
            if !piece.is_empty() {
                if self.spec.escape_whitespaces {
                    out.push_str(&piece.replace(' ', SPACE));
                } else {
                    out.push_str(piece);
                }
                prev_space = piece.ends_with(' ');
            }
            input = &input[n..];
            if !self.spec.remove_extra_whitespaces {
                prev_space = false;
            }
        }
        if self.spec.remove_extra_whitespaces {
            while out.ends_with(ws) {
                out.truncate(out.len() - ws.len());
            }
        }
        if self.treat_whitespace_as_suffix && self.spec.add_dummy_prefix {
            out.push_str(ws);
        }
        out
    }
}
