//! Sentencepiece models (`.model` files) read and applied without the C++
//! library: [`SentencePiece::encode`] gives the pieces and ids that
//! sentencepiece's `encode_as_pieces` / `encode_as_ids` give, for
//! `model_type` unigram (Viterbi over piece scores) and bpe (merges by
//! score), with the model's normalisation rules, user-defined symbols,
//! `<unk>` and byte fallback. Word and char models are refused.
//!
//! The algorithms follow sentencepiece's `unigram_model.cc`
//! (`EncodeOptimized`), `bpe_model.cc` (`SampleEncode` without dropout) and
//! `sentencepiece_processor.cc` (consecutive unknown pieces merged into one,
//! unknown pieces split into `<0xNN>` byte pieces under byte fallback);
//! tests/sentencepiece.rs checks the output against sentencepiece's own.

pub mod normalizer;
pub mod proto;

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

use crate::error::{Error, Result};
use normalizer::Normalizer;
use proto::{ModelProto, ModelType, PieceType};

/// Sentencepiece's penalty below the lowest piece score for an unknown character.
const UNK_PENALTY: f32 = 10.0;

/// A loaded sentencepiece model.
#[derive(Clone, Debug)]
pub struct SentencePiece {
    proto: ModelProto,
    /// Normal, user-defined and unused pieces → id.
    pieces: HashMap<String, usize>,
    /// Unknown, control and byte pieces → id.
    reserved: HashMap<String, usize>,
    longest_piece: usize,
    unk_id: usize,
    min_score: f32,
    max_score: f32,
    normalizer: Normalizer,
    path: String,
}

/// One output piece and its id in the sentencepiece vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedPiece {
    /// The piece's text (for an unknown piece, the text it covers).
    pub piece: String,
    /// Its id in the model.
    pub id: usize,
}

impl SentencePiece {
    /// Reads a `.model` file.
    pub fn read(path: &Path) -> Result<SentencePiece> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        SentencePiece::from_bytes(&bytes, &path.display().to_string())
    }

    /// Parses a `.model` file's bytes; `path` names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<SentencePiece> {
        let proto = proto::parse_model(bytes, path)?;
        SentencePiece::from_proto(proto, path)
    }

    /// Checks a parsed model and prepares it for encoding.
    pub fn from_proto(proto: ModelProto, path: &str) -> Result<SentencePiece> {
        let err = |msg: String| Error::Data { path: path.into(), msg: format!("sentencepiece model: {msg}") };
        match proto.model_type {
            ModelType::Unigram | ModelType::Bpe => {}
            other => return Err(err(format!("model_type: expected unigram or bpe, found {other:?} (not supported by asrforge)"))),
        }
        let mut pieces = HashMap::new();
        let mut reserved = HashMap::new();
        let mut unk_id = None;
        let mut user_defined = Vec::new();
        let mut bytes_found = [false; 256];
        let (mut min_score, mut max_score) = (f32::MAX, f32::MIN_POSITIVE);
        for (id, p) in proto.pieces.iter().enumerate() {
            let normal = matches!(p.kind, PieceType::Normal | PieceType::UserDefined | PieceType::Unused);
            let table = if normal { &mut pieces } else { &mut reserved };
            if table.insert(p.piece.clone(), id).is_some() {
                return Err(err(format!("piece {id} `{}`: expected every piece once, found it twice", p.piece)));
            }
            match p.kind {
                PieceType::Normal => {
                    min_score = min_score.min(p.score);
                    max_score = max_score.max(p.score);
                }
                PieceType::UserDefined => user_defined.push(p.piece.clone()),
                PieceType::Unknown if unk_id.is_some() => return Err(err(format!("piece {id}: expected one unknown piece, found a second"))),
                PieceType::Unknown => unk_id = Some(id),
                PieceType::Byte => {
                    if !proto.byte_fallback {
                        return Err(err(format!("piece {id} `{}`: a byte piece, but trainer_spec.byte_fallback is false", p.piece)));
                    }
                    match byte_of_piece(&p.piece) {
                        Some(b) => bytes_found[b as usize] = true,
                        None => return Err(err(format!("piece {id}: expected a byte piece `<0xNN>`, found `{}`", p.piece))),
                    }
                }
                _ => {}
            }
        }
        let Some(unk_id) = unk_id else {
            return Err(err("expected an unknown piece (type UNKNOWN), found none".into()));
        };
        if proto.byte_fallback {
            if let Some(b) = bytes_found.iter().position(|f| !f) {
                return Err(err(format!("byte_fallback is true: expected 256 byte pieces, found no <0x{b:02X}>")));
            }
        }
        let normalizer = Normalizer::new(&proto.normalizer, proto.treat_whitespace_as_suffix, user_defined, path)?;
        let longest_piece = pieces.keys().map(String::len).max().unwrap_or(1);
        Ok(SentencePiece { proto, pieces, reserved, longest_piece, unk_id, min_score, max_score, normalizer, path: path.to_string() })
    }

    /// Where the model was read from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The parsed model.
    pub fn proto(&self) -> &ModelProto {
        &self.proto
    }

    /// The number of pieces.
    pub fn len(&self) -> usize {
        self.proto.pieces.len()
    }

    /// Whether the model has no pieces (never true for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.proto.pieces.is_empty()
    }

    /// The piece of `id`, if any.
    pub fn id_to_piece(&self, id: usize) -> Option<&str> {
        self.proto.pieces.get(id).map(|p| p.piece.as_str())
    }

    /// The id of `piece` (`<unk>`'s id when it is not in the vocabulary), as sentencepiece's `PieceToId`.
    pub fn piece_to_id(&self, piece: &str) -> usize {
        self.reserved.get(piece).or_else(|| self.pieces.get(piece)).copied().unwrap_or(self.unk_id)
    }

    fn kind(&self, id: usize) -> PieceType {
        self.proto.pieces.get(id).map_or(PieceType::Unknown, |p| p.kind)
    }

    /// `text` normalised as the model's normalizer_spec says.
    pub fn normalize(&self, text: &str) -> String {
        self.normalizer.normalize(text)
    }

    /// The pieces of `text`, as sentencepiece's `encode_as_pieces` (with their ids).
    pub fn encode(&self, text: &str) -> Vec<EncodedPiece> {
        let normalized = self.normalize(text);
        let raw = match self.proto.model_type {
            ModelType::Bpe => self.encode_bpe(&normalized),
            _ => self.encode_unigram(&normalized),
        };
        let mut out: Vec<EncodedPiece> = Vec::with_capacity(raw.len());
        let mut prev_unk = false;
        for (piece, id) in raw {
            let unk = self.kind(id) == PieceType::Unknown;
            if unk && self.proto.byte_fallback {
                for b in piece.bytes() {
                    let p = format!("<0x{b:02X}>");
                    let id = self.piece_to_id(&p);
                    out.push(EncodedPiece { piece: p, id });
                }
            } else if unk && prev_unk {
                if let Some(last) = out.last_mut() {
                    last.piece.push_str(piece);
                }
            } else {
                out.push(EncodedPiece { piece: piece.to_string(), id });
            }
            prev_unk = unk;
        }
        out
    }

    /// Viterbi segmentation by piece scores over byte positions of `s`.
    fn encode_unigram<'a>(&self, s: &'a str) -> Vec<(&'a str, usize)> {
        #[derive(Clone, Copy)]
        struct Best {
            id: usize,
            score: f32,
            start: Option<usize>,
        }
        let size = s.len();
        let unk_score = self.min_score - UNK_PENALTY;
        let mut best = vec![Best { id: self.unk_id, score: 0.0, start: None }; size + 1];
        let mut start = 0;
        while start < size {
            let till_here = best[start].score;
            let char_len = s[start..].chars().next().map_or(1, char::len_utf8);
            let mut single = false;
            let limit = (start + self.longest_piece).min(size);
            for end in start + 1..=limit {
                if !s.is_char_boundary(end) {
                    continue;
                }
                let Some(&id) = self.pieces.get(&s[start..end]) else { continue };
                let kind = self.kind(id);
                if kind == PieceType::Unused {
                    continue;
                }
                let len = end - start;
                // sentencepiece computes this sum in double and keeps it as float.
                let score = if kind == PieceType::UserDefined { f64::from(len as f32 * self.max_score) - 0.1 } else { f64::from(self.proto.pieces[id].score) };
                let candidate = score + f64::from(till_here);
                let target = &mut best[end];
                if target.start.is_none() || candidate > f64::from(target.score) {
                    *target = Best { id, score: candidate as f32, start: Some(start) };
                }
                if len == char_len {
                    single = true;
                }
            }
            if !single {
                let candidate = unk_score + till_here;
                let target = &mut best[start + char_len];
                if target.start.is_none() || candidate > target.score {
                    *target = Best { id: self.unk_id, score: candidate, start: Some(start) };
                }
            }
            start += char_len;
        }
        let mut out = Vec::new();
        let mut end = size;
        while end > 0 {
            let node = best[end];
            let from = node.start.unwrap_or(0);
            out.push((&s[from..end], node.id));
            end = from;
        }
        out.reverse();
        out
    }

    /// Byte-pair merges by score (ties: the leftmost pair) over the characters of `s`.
    fn encode_bpe<'a>(&self, s: &'a str) -> Vec<(&'a str, usize)> {
        #[derive(Clone, Copy)]
        struct Symbol {
            prev: Option<usize>,
            next: Option<usize>,
            freeze: bool,
            start: usize,
            end: usize,
        }
        #[derive(PartialEq)]
        struct Pair {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Pair {}
        impl Ord for Pair {
            fn cmp(&self, o: &Self) -> Ordering {
                self.score.partial_cmp(&o.score).unwrap_or(Ordering::Equal).then_with(|| o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Pair {
            fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
                Some(self.cmp(o))
            }
        }
        let mut symbols: Vec<Symbol> = Vec::new();
        let mut at = 0;
        while at < s.len() {
            let (n, freeze) = match self.normalizer.user_defined_prefix(&s[at..]) {
                Some(n) => (n, true),
                None => (s[at..].chars().next().map_or(1, char::len_utf8), false),
            };
            let i = symbols.len();
            symbols.push(Symbol { prev: i.checked_sub(1), next: Some(i + 1), freeze, start: at, end: at + n });
            at += n;
        }
        if let Some(last) = symbols.last_mut() {
            last.next = None;
        } else {
            return Vec::new();
        }
        let mut agenda = BinaryHeap::new();
        let mut rev_merge: HashMap<&'a str, (&'a str, &'a str)> = HashMap::new();
        let add = |l: Option<usize>, r: Option<usize>, symbols: &[Symbol], agenda: &mut BinaryHeap<Pair>, rev: &mut HashMap<&'a str, (&'a str, &'a str)>| {
            let (Some(l), Some(r)) = (l, r) else { return };
            let (a, b) = (symbols[l], symbols[r]);
            if a.freeze || b.freeze {
                return;
            }
            let piece = &s[a.start..b.end];
            let Some(&id) = self.pieces.get(piece) else { return };
            agenda.push(Pair { score: self.proto.pieces[id].score, left: l, right: r, size: piece.len() });
            if self.kind(id) == PieceType::Unused {
                rev.insert(piece, (&s[a.start..a.end], &s[b.start..b.end]));
            }
        };
        for i in 1..symbols.len() {
            add(Some(i - 1), Some(i), &symbols, &mut agenda, &mut rev_merge);
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (symbols[top.left], symbols[top.right]);
            let (ln, rn) = (l.end - l.start, r.end - r.start);
            if ln == 0 || rn == 0 || ln + rn != top.size {
                continue;
            }
            symbols[top.left].end = r.end;
            symbols[top.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(top.left);
            }
            symbols[top.right].end = symbols[top.right].start;
            add(symbols[top.left].prev, Some(top.left), &symbols, &mut agenda, &mut rev_merge);
            add(Some(top.left), symbols[top.left].next, &symbols, &mut agenda, &mut rev_merge);
        }
        let mut out = Vec::new();
        let mut index = Some(0);
        while let Some(i) = index {
            self.resegment(&s[symbols[i].start..symbols[i].end], &rev_merge, &mut out, 0);
            index = symbols[i].next;
        }
        out
    }

    /// Splits an unused merged piece back into the pieces it was made of.
    fn resegment<'a>(&self, w: &'a str, rev: &HashMap<&'a str, (&'a str, &'a str)>, out: &mut Vec<(&'a str, usize)>, depth: usize) {
        let id = self.piece_to_id(w);
        match rev.get(w) {
            Some(&(a, b)) if self.kind(id) == PieceType::Unused && depth < 256 => {
                self.resegment(a, rev, out, depth + 1);
                self.resegment(b, rev, out, depth + 1);
            }
            _ => out.push((w, id)),
        }
    }
}

/// The byte of a `<0xNN>` piece.
fn byte_of_piece(p: &str) -> Option<u8> {
    let hex = p.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
