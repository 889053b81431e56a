//! The sentencepiece `.model` file: a `ModelProto` protobuf message, read by
//! a small reader of the wire format (varints and length-delimited fields)
//! that keeps only the fields encoding needs.
//!
//! Schema facts (sentencepiece's `sentencepiece_model.proto`): `ModelProto`
//! has `pieces` = 1 (`piece` = 1 string, `score` = 2 float, `type` = 3 enum,
//! default NORMAL), `trainer_spec` = 2 (`model_type` = 3, default UNIGRAM;
//! `treat_whitespace_as_suffix` = 24; `byte_fallback` = 35),
//! `normalizer_spec` = 3 (`name` = 1, `precompiled_charsmap` = 2,
//! `add_dummy_prefix` = 3, `remove_extra_whitespaces` = 4,
//! `escape_whitespaces` = 5, the last three true by default).

use crate::error::{Error, Result};

/// The kind of a vocabulary entry (`ModelProto.SentencePiece.Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceType {
    /// A piece the encoder may produce.
    Normal,
    /// The `<unk>` piece.
    Unknown,
    /// A control symbol such as `<s>`; never produced from text.
    Control,
    /// A user-defined symbol, always kept whole.
    UserDefined,
    /// A piece the encoder must not produce.
    Unused,
    /// A `<0xNN>` byte piece (byte fallback).
    Byte,
}

/// One vocabulary entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The piece's text.
    pub piece: String,
    /// Its score (log probability for unigram, merge priority for bpe).
    pub score: f32,
    /// Its kind.
    pub kind: PieceType,
}

/// The segmentation algorithm (`TrainerSpec.ModelType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    /// Unigram language model, Viterbi segmentation.
    Unigram,
    /// Byte-pair encoding, merges by score.
    Bpe,
    /// Whitespace-delimited words.
    Word,
    /// Single characters.
    Char,
}

/// `NormalizerSpec`: how text is normalised before segmentation.
#[derive(Clone, Debug, PartialEq)]
pub struct NormalizerSpec {
    /// The rule set's name (`nmt_nfkc`, `identity`, …).
    pub name: String,
    /// The compiled rules: a double-array trie and the replacement strings.
    pub precompiled_charsmap: Vec<u8>,
    /// Put `▁` before the text.
    pub add_dummy_prefix: bool,
    /// Drop leading, trailing and repeated whitespace.
    pub remove_extra_whitespaces: bool,
    /// Write spaces as `▁`.
    pub escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> Self {
        NormalizerSpec {
            name: String::new(),
            precompiled_charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// The fields of a `.model` file that encoding uses.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProto {
    /// The vocabulary, in id order.
    pub pieces: Vec<Piece>,
    /// `trainer_spec.model_type`.
    pub model_type: ModelType,
    /// `trainer_spec.byte_fallback`.
    pub byte_fallback: bool,
    /// `trainer_spec.treat_whitespace_as_suffix`.
    pub treat_whitespace_as_suffix: bool,
    /// `normalizer_spec`.
    pub normalizer: NormalizerSpec,
}

/// A protobuf wire-format reader over one message; errors name the file and the field.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a str,
    what: &'static str,
}

/// One field's value as the wire format carries it.
enum Value<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64,
    Bytes(&'a [u8]),
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], path: &'a str, what: &'static str) -> Self {
        Reader { buf, pos: 0, path, what }
    }

    fn err(&self, msg: String) -> Error {
        Error::Data { path: self.path.into(), msg: format!("sentencepiece model, {} at byte {}: {msg}", self.what, self.pos) }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.err("expected a varint, found the end of the data".into()));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("expected a varint of at most 10 bytes, found a longer one".into()))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(format!("expected {n} more bytes, found {}", self.buf.len() - self.pos))),
        }
    }

    /// The next `(field number, value)`, or `None` at the end.
    fn field(&mut self) -> Result<Option<(u64, Value<'a>)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (field, wire) = (key >> 3, key & 7);
        if field == 0 {
            return Err(self.err("expected a field number >= 1, found 0".into()));
        }
        let value = match wire {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).map_err(|_| self.err(format!("expected a length, found {n}")))?;
                Value::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => return Err(self.err(format!("field {field}: expected wire type 0, 1, 2 or 5, found {w}"))),
        };
        Ok(Some((field, value)))
    }

    fn expect_varint(&self, field: u64, v: &Value) -> Result<u64> {
        match v {
            Value::Varint(x) => Ok(*x),
            _ => Err(self.err(format!("field {field}: expected a varint"))),
        }
    }

    fn expect_bytes(&self, field: u64, v: &Value<'a>) -> Result<&'a [u8]> {
        match v {
            Value::Bytes(b) => Ok(b),
            _ => Err(self.err(format!("field {field}: expected length-delimited bytes"))),
        }
    }

    fn expect_string(&self, field: u64, v: &Value<'a>) -> Result<String> {
        let b = self.expect_bytes(field, v)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err(format!("field {field}: expected UTF-8 text, found invalid bytes")))
    }
}

/// Parses a `.model` file's bytes; `path` names it in errors.
pub fn parse_model(bytes: &[u8], path: &str) -> Result<ModelProto> {
    let mut r = Reader::new(bytes, path, "ModelProto");
    let mut proto = ModelProto {
        pieces: Vec::new(),
        model_type: ModelType::Unigram,
        byte_fallback: false,
        treat_whitespace_as_suffix: false,
        normalizer: NormalizerSpec::default(),
    };
    while let Some((field, v)) = r.field()? {
        match field {
            1 => {
                let b = r.expect_bytes(field, &v)?;
                let piece = parse_piece(b, path, proto.pieces.len())?;
                proto.pieces.push(piece);
            }
            2 => parse_trainer(r.expect_bytes(field, &v)?, path, &mut proto)?,
            3 => proto.normalizer = parse_normalizer(r.expect_bytes(field, &v)?, path)?,
            _ => {}
        }
    }
    if proto.pieces.is_empty() {
        return Err(Error::Data { path: path.into(), msg: "sentencepiece model: expected vocabulary pieces (field 1), found none".into() });
    }
    Ok(proto)
}

fn parse_piece(bytes: &[u8], path: &str, index: usize) -> Result<Piece> {
    let mut r = Reader::new(bytes, path, "SentencePiece");
    let mut p = Piece { piece: String::new(), score: 0.0, kind: PieceType::Normal };
    while let Some((field, v)) = r.field()? {
        match field {
            1 => p.piece = r.expect_string(field, &v)?,
            2 => match v {
                Value::Fixed32(x) => p.score = f32::from_bits(x),
                _ => return Err(r.err(format!("piece {index}: score (field 2): expected a 32-bit float"))),
            },
            3 => {
                p.kind = match r.expect_varint(field, &v)? {
                    1 => PieceType::Normal,
                    2 => PieceType::Unknown,
                    3 => PieceType::Control,
                    4 => PieceType::UserDefined,
                    5 => PieceType::Unused,
                    6 => PieceType::Byte,
                    t => return Err(r.err(format!("piece {index}: type: expected 1..=6, found {t}"))),
                }
            }
            _ => {}
        }
    }
    if p.piece.is_empty() {
        return Err(Error::Data { path: path.into(), msg: format!("sentencepiece model: piece {index}: expected a non-empty piece, found an empty one") });
    }
    Ok(p)
}

fn parse_trainer(bytes: &[u8], path: &str, proto: &mut ModelProto) -> Result<()> {
    let mut r = Reader::new(bytes, path, "TrainerSpec");
    while let Some((field, v)) = r.field()? {
        match field {
            3 => {
                proto.model_type = match r.expect_varint(field, &v)? {
                    1 => ModelType::Unigram,
                    2 => ModelType::Bpe,
                    3 => ModelType::Word,
                    4 => ModelType::Char,
                    t => return Err(r.err(format!("model_type: expected 1 (unigram), 2 (bpe), 3 (word) or 4 (char), found {t}"))),
                }
            }
            24 => proto.treat_whitespace_as_suffix = r.expect_varint(field, &v)? != 0,
            35 => proto.byte_fallback = r.expect_varint(field, &v)? != 0,
            _ => {}
        }
    }
    Ok(())
}

fn parse_normalizer(bytes: &[u8], path: &str) -> Result<NormalizerSpec> {
    let mut r = Reader::new(bytes, path, "NormalizerSpec");
    let mut n = NormalizerSpec::default();
    while let Some((field, v)) = r.field()? {
        match field {
            1 => n.name = r.expect_string(field, &v)?,
            2 => n.precompiled_charsmap = r.expect_bytes(field, &v)?.to_vec(),
            3 => n.add_dummy_prefix = r.expect_varint(field, &v)? != 0,
            4 => n.remove_extra_whitespaces = r.expect_varint(field, &v)? != 0,
            5 => n.escape_whitespaces = r.expect_varint(field, &v)? != 0,
            _ => {}
        }
    }
    Ok(n)
}
