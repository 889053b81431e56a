//! Transcripts to token ids with a WeNet symbol table (`units.txt` /
//! `lang_char.txt`: one `token id` per line, `<blank> 0`, `<unk> 1`, …,
//! `<sos/eos> N`).
//!
//! Modes, following WeNet's CharTokenizer: `char` (one token per character,
//! space → `▁`), `word` (`split_with_space`: one token per space-separated
//! word) and `wordpiece` (greedy longest match of the table's pieces inside
//! `▁`-prefixed words, for tables whose units are multi-character pieces).
//! Out-of-vocabulary tokens map to `<unk>`. Non-language symbols such as
//! `<noise>` are kept whole.
//!
//! `tokenizer: bpe` follows WeNet's BpeTokenizer: the line is upper-cased,
//! non-language symbols (bracketed as `<…>`, `[…]` or `{…}` and listed in
//! `non_lang_syms_path`) are kept whole, CJK ideographs (U+4E00–U+9FFF) are
//! single tokens, and the rest goes through the sentencepiece model of
//! `bpe_path` (read by [`crate::data::sentencepiece`]); pieces become ids
//! through units.txt, `<unk>` where missing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::data::config::TokenizerConf;
use crate::data::sentencepiece::SentencePiece;
use crate::error::{Error, Result};

/// The word-boundary mark of WeNet and sentencepiece.
pub const SPACE: &str = "\u{2581}";

/// A `token id` table.
#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    ids: HashMap<String, i64>,
    longest: usize,
    path: String,
}

/// The CTC blank, which WeNet's tables put at id 0.
pub const BLANK: &str = "<blank>";

impl SymbolTable {
    /// Parses `token id` lines; `path` names the source in errors. The table
    /// must be what a model's output layer can mean: every token and every id
    /// once, ids `0..n` without gaps (the model has `n` outputs), and
    /// `<blank>` at 0 (the CTC blank). Errors name the file and the line.
    pub fn parse(text: &str, path: &str) -> Result<SymbolTable> {
        let err = |line: usize, msg: String| Error::Data { path: path.into(), msg: format!("line {line}: {msg}") };
        let mut ids = HashMap::new();
        // id → (token, line), to name the first holder of a repeated id.
        let mut by_id: HashMap<i64, (String, usize)> = HashMap::new();
        let mut token_line: HashMap<String, usize> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let no = n + 1;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(tok), Some(id), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(err(no, format!("expected `token id`, found `{line}`")));
            };
            let id: i64 = id.parse().map_err(|_| err(no, format!("expected an integer id, found `{id}`")))?;
            if id < 0 {
                return Err(err(no, format!("expected an id >= 0 for `{tok}`, found {id}")));
            }
            if let Some(first) = token_line.get(tok) {
                return Err(err(no, format!("token `{tok}` appears twice (first at line {first}); expected every token once")));
            }
            if let Some((other, first)) = by_id.get(&id) {
                return Err(err(no, format!("id {id} of `{tok}` is already the id of `{other}` (line {first}); expected every id once")));
            }
            token_line.insert(tok.to_string(), no);
            by_id.insert(id, (tok.to_string(), no));
            ids.insert(tok.to_string(), id);
        }
        if ids.is_empty() {
            return Err(Error::Data { path: path.into(), msg: "expected `token id` lines, found none".into() });
        }
        match by_id.get(&0) {
            Some((tok, _)) if tok == BLANK => {}
            Some((tok, line)) => return Err(err(*line, format!("expected `{BLANK}` at id 0 (the CTC blank), found `{tok}`"))),
            None => {
                let line = token_line.get(BLANK).copied().unwrap_or(1);
                return Err(err(line, format!("expected `{BLANK} 0` (the CTC blank at id 0), found no id 0")));
            }
        }
        let n = ids.len() as i64;
        if let Some((&max, (tok, line))) = by_id.iter().max_by_key(|(id, _)| **id) {
            if max != n - 1 {
                let missing = (0..n).find(|i| !by_id.contains_key(i)).unwrap_or(n - 1);
                return Err(err(*line, format!("expected contiguous ids 0..{} for {n} tokens, found id {max} for `{tok}` and no id {missing}", n - 1)));
            }
        }
        let longest = ids.keys().map(|k| k.chars().count()).max().unwrap_or(1);
        Ok(SymbolTable { ids, longest, path: path.to_string() })
    }

    /// Where the table was read from (for messages).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Reads a symbol table file.
    pub fn read(path: &Path) -> Result<SymbolTable> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        SymbolTable::parse(&text, &path.display().to_string())
    }

    /// The id of `token`, if present.
    pub fn get(&self, token: &str) -> Option<i64> {
        self.ids.get(token).copied()
    }

    /// Number of entries (the model's vocabulary size).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every `(token, id)` entry, in no particular order (e.g. to map ids back to tokens).
    pub fn entries(&self) -> impl Iterator<Item = (&str, i64)> + '_ {
        self.ids.iter().map(|(t, &i)| (t.as_str(), i))
    }
}

/// How a transcript is split before lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizeMode {
    /// One token per character; spaces become `▁`.
    Char,
    /// One token per space-separated word.
    Word,
    /// Greedy longest match of table entries within `▁`-prefixed words.
    WordPiece,
    /// WeNet's BpeTokenizer over a sentencepiece model.
    Bpe,
}

/// Symbol table + split mode + non-language symbols.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    table: SymbolTable,
    mode: TokenizeMode,
    non_lang: Vec<String>,
    unk: Option<i64>,
    spm: Option<Arc<SentencePiece>>,
    /// Whether a non-language symbol file was given: WeNet then splits the
    /// line around every bracketed part, listed or not.
    split_brackets: bool,
}

impl Tokenizer {
    /// A tokenizer over `table`; `non_lang` symbols are matched whole before
    /// splitting. `TokenizeMode::Bpe` needs a model: use [`Tokenizer::bpe`]
    /// (without one it splits as `Char`).
    pub fn new(table: SymbolTable, mode: TokenizeMode, non_lang: Vec<String>) -> Tokenizer {
        let unk = table.get("<unk>");
        let mode = if mode == TokenizeMode::Bpe { TokenizeMode::Char } else { mode };
        Tokenizer { table, mode, non_lang, unk, spm: None, split_brackets: false }
    }

    /// WeNet's BpeTokenizer: `spm` splits the text, `table` gives the ids;
    /// `non_lang` is the content of `non_lang_syms_path` (`None`: no file).
    pub fn bpe(table: SymbolTable, spm: Arc<SentencePiece>, non_lang: Option<Vec<String>>) -> Tokenizer {
        let unk = table.get("<unk>");
        let split_brackets = non_lang.is_some();
        Tokenizer { table, mode: TokenizeMode::Bpe, non_lang: non_lang.unwrap_or_default(), unk, spm: Some(spm), split_brackets }
    }

    /// The split mode.
    pub fn mode(&self) -> TokenizeMode {
        self.mode
    }

    /// Builds the tokenizer a train.yaml describes; `symbol_table` overrides
    /// `tokenizer_conf.symbol_table_path` (WeNet's `--symbol_table`).
    pub fn from_conf(kind: Option<&str>, conf: &TokenizerConf, symbol_table: Option<&Path>) -> Result<Tokenizer> {
        let bad = |msg: String| Error::ConfigFile { path: "tokenizer_conf".into(), msg };
        let spm = match (kind, conf.bpe_path.as_deref()) {
            (Some("bpe"), Some(p)) => Some(Arc::new(SentencePiece::read(Path::new(p)).map_err(|e| {
                Error::config(
                    "tokenizer_conf.bpe_path",
                    format!("`{p}` read from the config: {e}; relative paths are taken from the current folder, pass --override_config 'tokenizer_conf.bpe_path PATH' to name the model"),
                )
            })?)),
            (Some("bpe"), None) => return Err(bad("tokenizer: bpe: expected `tokenizer_conf.bpe_path` (a sentencepiece .model), found none".into())),
            (None, Some(p)) => {
                return Err(bad(format!("`bpe_path: {p}` is set but `tokenizer` is not: expected `tokenizer: bpe` to use the sentencepiece model (or no bpe_path)")))
            }
            (Some("char") | None, _) => None,
            (Some(other), _) => return Err(bad(format!("tokenizer: expected `char` or `bpe`, found `{other}`"))),
        };
        let path = match (symbol_table, conf.symbol_table_path.as_deref()) {
            (Some(p), _) => p.to_path_buf(),
            (None, Some(p)) => Path::new(p).to_path_buf(),
            (None, None) => return Err(bad("expected `symbol_table_path` (or --symbol_table), found none".into())),
        };
        let table = SymbolTable::read(&path)?;
        let mode = match (conf.mode.as_deref(), conf.split_with_space) {
            (Some("word"), _) | (None, true) => TokenizeMode::Word,
            (Some("wordpiece"), _) => TokenizeMode::WordPiece,
            (Some("char"), _) | (None, false) => TokenizeMode::Char,
            (Some(other), _) => return Err(bad(format!("mode: expected `char`, `word` or `wordpiece`, found `{other}`"))),
        };
        let non_lang = match &conf.non_lang_syms_path {
            Some(p) => Some(read_non_lang_syms(Path::new(p))?),
            None => None,
        };
        match spm {
            Some(spm) => Ok(Tokenizer::bpe(table, spm, non_lang)),
            None => Ok(Tokenizer::new(table, mode, non_lang.unwrap_or_default())),
        }
    }

    /// The symbol table.
    pub fn table(&self) -> &SymbolTable {
        &self.table
    }

    /// Splits `text` into tokens (before id lookup).
    pub fn tokens(&self, text: &str) -> Vec<String> {
        if let Some(spm) = &self.spm {
            return bpe_tokens(spm, self.split_brackets.then_some(self.non_lang.as_slice()), text);
        }
        let mut out = Vec::new();
        for (part, is_sym) in split_non_lang(text.trim(), &self.non_lang) {
            if is_sym {
                out.push(part.to_string());
                continue;
            }
            match self.mode {
                TokenizeMode::Char => out.extend(part.chars().map(|c| if c == ' ' { SPACE.to_string() } else { c.to_string() })),
                TokenizeMode::Word => out.extend(part.split(' ').filter(|w| !w.is_empty()).map(str::to_string)),
                TokenizeMode::WordPiece | TokenizeMode::Bpe => {
                    for word in part.split_whitespace() {
                        self.pieces(&format!("{SPACE}{word}"), &mut out);
                    }
                }
            }
        }
        out
    }

    /// Greedy longest-match pieces of one `▁word`; an unmatched character is its own token.
    fn pieces(&self, word: &str, out: &mut Vec<String>) {
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        let mut i = 0;
        while i < chars.len() {
            let mut taken = 1;
            for n in (1..=self.table.longest.min(chars.len() - i)).rev() {
                let end = chars.get(i + n).map_or(word.len(), |c| c.0);
                if self.table.get(&word[chars[i].0..end]).is_some() {
                    taken = n;
                    break;
                }
            }
            let end = chars.get(i + taken).map_or(word.len(), |c| c.0);
            out.push(word[chars[i].0..end].to_string());
            i += taken;
        }
    }

    /// Token ids for `text`; unknown tokens become `<unk>`, or are dropped when the table has none (as WeNet).
    pub fn encode(&self, text: &str) -> Vec<i64> {
        self.tokens(text).iter().filter_map(|t| self.table.get(t).or(self.unk)).collect()
    }
}

/// Whitespace as Python's `str.strip` sees it (WeNet trims with it).
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Whether `c` is a CJK unified ideograph, which WeNet keeps as one token.
fn is_cjk(c: char) -> bool {
    ('\u{4e00}'..='\u{9fff}').contains(&c)
}

/// The end (exclusive) of a bracketed symbol `<…>`, `[…]` or `{…}` starting
/// at byte `i` of `s`: an opening bracket, one or more characters that are
/// neither bracket of its kind, the closing bracket (WeNet's non-language
/// symbol pattern).
fn bracketed_at(s: &str, i: usize) -> Option<usize> {
    let mut chars = s[i..].char_indices();
    let (_, open) = chars.next()?;
    let close = match open {
        '<' => '>',
        '[' => ']',
        '{' => '}',
        _ => return None,
    };
    let mut inner = 0;
    for (j, c) in chars {
        if c == close {
            return if inner > 0 { Some(i + j + c.len_utf8()) } else { None };
        }
        if c == open {
            return None;
        }
        inner += 1;
    }
    None
}

/// Tokens of `text` by WeNet's BpeTokenizer rules (see the module doc);
/// `non_lang` is the symbol file's content, `None` when there is no file.
pub fn bpe_tokens(spm: &SentencePiece, non_lang: Option<&[String]>, text: &str) -> Vec<String> {
    let line = text.trim_matches(py_space).to_uppercase();
    let mut parts: Vec<&str> = Vec::new();
    let split = non_lang.is_some();
    let non_lang = non_lang.unwrap_or_default();
    if !split {
        parts.push(&line);
    } else {
        let (mut start, mut i) = (0, 0);
        while i < line.len() {
            match bracketed_at(&line, i) {
                Some(end) => {
                    parts.push(&line[start..i]);
                    parts.push(&line[i..end]);
                    start = end;
                    i = end;
                }
                None => i += line[i..].chars().next().map_or(1, char::len_utf8),
            }
        }
        parts.push(&line[start..]);
    }
    let mut out = Vec::new();
    for part in parts.into_iter().filter(|p| !p.trim_matches(py_space).is_empty()) {
        if non_lang.iter().any(|s| s == part) {
            out.push(part.to_string());
            continue;
        }
        // The part is upper-cased already, as WeNet upper-cases it again.
        let mut rest = part;
        while !rest.is_empty() {
            let cut = rest.char_indices().find(|&(_, c)| is_cjk(c)).map(|(j, _)| j);
            let (latin, cjk) = match cut {
                Some(j) => {
                    let n = rest[j..].chars().next().map_or(0, char::len_utf8);
                    (&rest[..j], Some(&rest[j..j + n]))
                }
                None => (rest, None),
            };
            if !latin.trim_matches(py_space).is_empty() {
                out.extend(spm.encode(latin).into_iter().map(|p| p.piece));
            }
            match cjk {
                Some(c) => {
                    out.push(c.to_string());
                    rest = &rest[latin.len() + c.len()..];
                }
                None => rest = "",
            }
        }
    }
    out
}

/// Text of BPE pieces as WeNet's BpeTokenizer writes it: pieces joined, `▁` → space, trimmed.
pub fn bpe_text(pieces: &[&str]) -> String {
    pieces.concat().replace(SPACE, " ").trim_matches(py_space).to_string()
}

/// Splits `text` around whole occurrences of the `syms`; yields `(part, is_symbol)`.
fn split_non_lang<'a>(text: &'a str, syms: &[String]) -> Vec<(&'a str, bool)> {
    if syms.is_empty() {
        return vec![(text, false)];
    }
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let hit = syms.iter().filter_map(|s| rest.find(s.as_str()).map(|i| (i, s.len()))).min();
        match hit {
            Some((i, len)) if len > 0 => {
                let before = rest[..i].trim();
                if !before.is_empty() {
                    out.push((before, false));
                }
                out.push((&rest[i..i + len], true));
                rest = &rest[i + len..];
            }
            _ => {
                let part = rest.trim();
                if !part.is_empty() {
                    out.push((part, false));
                }
                break;
            }
        }
    }
    out
}

/// Reads a non-language symbol file (one symbol per line).
pub fn read_non_lang_syms(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    Ok(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
}
