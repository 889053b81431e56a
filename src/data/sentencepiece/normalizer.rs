//! Sentencepiece's text normalisation: the precompiled character map
//! (`nmt_nfkc` and other rule sets) and the whitespace rules.
//!
//! The map is stored as `<u32 LE: trie size><darts-clone double-array
//! trie><NUL-terminated replacement strings>`. A trie unit is a u32: bit 8
//! says the node has a leaf, the low 8 bits (with bit 31) are the label, the
//! offset to the children is `(u >> 10) << ((u & (1 << 9)) >> 6)`, and a
//! leaf unit's low 31 bits are the byte offset of its replacement. The trie
//! is checked once when the model is read (every reachable node and leaf in
//! range, every replacement NUL-terminated UTF-8), so a broken map is an
//! error at load time and normalising cannot fail; lookups are
//! sentencepiece's common-prefix search on the array itself.
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

/// A normaliser built from a model's `NormalizerSpec`.
#[derive(Clone, Debug)]
pub struct Normalizer {
    spec: NormalizerSpec,
    treat_whitespace_as_suffix: bool,
    charsmap: Option<CharsMap>,
    /// User-defined symbols, matched before the rules and kept whole.
    user_defined: Vec<String>,
}

/// A checked precompiled charsmap: the double array and its replacements by offset.
#[derive(Clone, Debug)]
pub struct CharsMap {
    units: Vec<u32>,
    replacements: HashMap<u32, String>,
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

impl CharsMap {
    /// Reads and checks a precompiled charsmap.
    pub fn read(blob: &[u8], path: &str) -> Result<CharsMap> {
        let err = |msg: String| Error::Data { path: path.into(), msg: format!("sentencepiece model, normalizer_spec.precompiled_charsmap: {msg}") };
        if blob.len() <= 4 {
            return Err(err(format!("expected a 4-byte trie size and a trie, found {} bytes", blob.len())));
        }
        let size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        if size > blob.len() - 4 || size % 4 != 0 || size == 0 {
            return Err(err(format!("expected a trie size that is a positive multiple of 4 up to {}, found {size}", blob.len() - 4)));
        }
        let units: Vec<u32> = blob[4..4 + size].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let strings = &blob[4 + size..];
        let mut replacements = HashMap::new();
        // darts-clone shares identical subtrees (a DAWG), so the walk visits
        // each node once by its position; that also ends it on a cyclic array.
        let mut seen = vec![false; units.len()];
        let mut stack = vec![offset(units[0])];
        while let Some(pos) = stack.pop() {
            if let Some(s) = seen.get_mut(pos) {
                if *s {
                    continue;
                }
                *s = true;
            }
            for c in 1..=255u8 {
                let child = pos ^ c as usize;
                let Some(&u) = units.get(child) else { continue };
                if label(u) != u32::from(c) {
                    continue;
                }
                let next = child ^ offset(u);
                if has_leaf(u) {
                    let Some(&leaf) = units.get(next) else {
                        return Err(err(format!("a leaf at unit {next} is outside the {}-unit trie", units.len())));
                    };
                    let v = value(leaf);
                    if let std::collections::hash_map::Entry::Vacant(e) = replacements.entry(v) {
                        let Some(rest) = strings.get(v as usize..) else {
                            return Err(err(format!("a rule points at byte {v} of the {}-byte replacement strings", strings.len())));
                        };
                        let Some(end) = rest.iter().position(|&b| b == 0) else {
                            return Err(err(format!("the replacement at byte {v} has no terminating NUL")));
                        };
                        let text = String::from_utf8(rest[..end].to_vec()).map_err(|_| err(format!("the replacement at byte {v} is not UTF-8")))?;
                        e.insert(text);
                    }
                }
                if next < units.len() && !seen[next] {
                    stack.push(next);
                }
            }
        }
        Ok(CharsMap { units, replacements })
    }

    /// The longest rule matching a prefix of `s` (among the first 32 matches,
    /// as sentencepiece's fixed-size result buffer): its replacement and length.
    fn longest_prefix<'a>(&'a self, s: &str) -> Option<(&'a str, usize)> {
        let mut pos = offset(self.units[0]);
        let (mut found, mut best) = (0, None);
        for (i, &b) in s.as_bytes().iter().enumerate() {
            pos ^= b as usize;
            let Some(&u) = self.units.get(pos) else { break };
            if label(u) != u32::from(b) {
                break;
            }
            pos ^= offset(u);
            if has_leaf(u) {
                if found < MAX_TRIE_RESULTS && s.is_char_boundary(i + 1) {
                    if let Some(r) = self.units.get(pos).and_then(|&v| self.replacements.get(&value(v))) {
                        best = Some((r.as_str(), i + 1));
                    }
                }
                found += 1;
            }
        }
        best
    }
}

impl Normalizer {
    /// A normaliser for `spec`; `user_defined` are the model's user-defined pieces.
    pub fn new(spec: &NormalizerSpec, treat_whitespace_as_suffix: bool, user_defined: Vec<String>, path: &str) -> Result<Normalizer> {
        let charsmap = if spec.precompiled_charsmap.is_empty() { None } else { Some(CharsMap::read(&spec.precompiled_charsmap, path)?) };
        Ok(Normalizer { spec: spec.clone(), treat_whitespace_as_suffix, charsmap, user_defined })
    }

    /// The distinct replacement strings of the rules (0 for `identity`).
    pub fn replacement_count(&self) -> usize {
        self.charsmap.as_ref().map_or(0, |m| m.replacements.len())
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
        let best = self.charsmap.as_ref().and_then(|m| m.longest_prefix(s));
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
