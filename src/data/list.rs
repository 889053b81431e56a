//! WeNet data lists: raw `data.list` lines and shard lists.
//!
//! A raw line is JSON `{"key","wav","txt"}` with optional `start`/`end` in
//! seconds, or WeNet's plain `key wav txt`. A shard line is the path of a tar
//! of `key.wav` + `key.txt` pairs. Lines are kept as text and parsed when an
//! epoch reaches them, so a malformed line is a counted skip, not a failure
//! to start.

use std::path::{Path, PathBuf};

use crate::data::skip::{Skip, SkipReason};
use crate::error::{Error, Result};

/// Whether each line names one utterance or one tar shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListFormat {
    /// One utterance per line (JSON or `key wav txt`).
    Raw,
    /// One tar path per line.
    Shard,
}

impl ListFormat {
    /// Parses WeNet's `--data_type` value (`raw` or `shard`).
    pub fn parse(s: &str) -> Result<ListFormat> {
        match s {
            "raw" => Ok(ListFormat::Raw),
            "shard" => Ok(ListFormat::Shard),
            other => Err(Error::invalid("data_type", format!("expected `raw` or `shard`, found `{other}`"))),
        }
    }
}

/// The non-empty lines of a data list, in file order.
#[derive(Clone, Debug)]
pub struct DataList {
    /// Where the list was read from (for messages).
    pub path: String,
    /// Raw or shard.
    pub format: ListFormat,
    /// The lines, trimmed, blank lines dropped.
    pub lines: Vec<String>,
}

impl DataList {
    /// A list from lines already in memory.
    pub fn from_lines(path: impl Into<String>, format: ListFormat, lines: Vec<String>) -> DataList {
        let lines = lines.into_iter().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
        DataList { path: path.into(), format, lines }
    }

    /// Reads a list file; bytes that are not UTF-8 are replaced so one bad
    /// line cannot make the whole list unreadable.
    pub fn read(path: &Path, format: ListFormat) -> Result<DataList> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        let text = String::from_utf8_lossy(&bytes);
        Ok(DataList::from_lines(path.display().to_string(), format, text.lines().map(str::to_string).collect()))
    }

    /// Number of lines (utterances for raw lists, shards for shard lists).
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether the list has no lines.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Calls `f(sub, utt)` for each utterance of line `index` (one for raw
    /// lists, each tar member pair for shards; `sub` counts them from 0) until
    /// `f` returns false.
    pub fn for_each_utt(&self, index: usize, mut f: impl FnMut(usize, std::result::Result<RawUtt, Skip>) -> bool) {
        let Some(line) = self.lines.get(index) else {
            return;
        };
        match self.format {
            ListFormat::Raw => {
                f(0, parse_raw_line(line, index + 1));
            }
            ListFormat::Shard => {
                let mut sub = 0;
                crate::data::shard::for_each_in_shard(Path::new(line), |r| {
                    let go = f(sub, r);
                    sub += 1;
                    go
                });
            }
        }
    }
}

/// Where an utterance's audio comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum AudioSource {
    /// A WAV file, optionally a segment `[start, end)` in seconds.
    File {
        /// The WAV path.
        path: PathBuf,
        /// Segment start in seconds.
        start: Option<f64>,
        /// Segment end in seconds.
        end: Option<f64>,
    },
    /// WAV bytes read from a shard.
    Bytes(Vec<u8>),
}

/// One utterance before decoding: key, audio and transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct RawUtt {
    /// Utterance key.
    pub key: String,
    /// Audio location.
    pub audio: AudioSource,
    /// Transcript as written in the list (may be empty for wav.scp lines).
    pub txt: String,
}

/// Parses one raw line; `line_no` (1-based) names it in the skip when no key is known.
pub fn parse_raw_line(line: &str, line_no: usize) -> std::result::Result<RawUtt, Skip> {
    let line = line.trim();
    let malformed = |detail: String| Skip::new(SkipReason::MalformedLine, format!("line {line_no}"), detail);
    if line.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| malformed(format!("expected a JSON object, found invalid JSON ({e})")))?;
        let obj = v.as_object().ok_or_else(|| malformed("expected a JSON object".into()))?;
        let field = |name: &str| obj.get(name).and_then(|x| x.as_str()).map(str::to_string);
        let key = field("key").ok_or_else(|| malformed("expected a string field `key`, found none".into()))?;
        let wav = field("wav").ok_or_else(|| malformed(format!("{key}: expected a string field `wav`, found none")))?;
        let txt = field("txt").unwrap_or_default();
        let seconds = |name: &str| -> std::result::Result<Option<f64>, Skip> {
            match obj.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => match x.as_f64() {
                    Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(s)),
                    _ => Err(malformed(format!("{key}: expected `{name}` as seconds >= 0, found {x}"))),
                },
            }
        };
        let (start, end) = (seconds("start")?, seconds("end")?);
        if let (Some(s), Some(e)) = (start, end) {
            if e <= s {
                return Err(malformed(format!("{key}: expected end > start, found start {s} end {e}")));
            }
        }
        return Ok(RawUtt { key, audio: AudioSource::File { path: PathBuf::from(wav), start, end }, txt });
    }
    // WeNet's plain format: key, wav path, then the transcript (which may contain spaces).
    let mut parts = line.splitn(3, char::is_whitespace);
    let key = parts.next().unwrap_or_default().to_string();
    let wav = parts.next().map(str::trim).unwrap_or_default().to_string();
    if key.is_empty() || wav.is_empty() {
        return Err(malformed(format!("expected JSON or `key wav txt`, found `{}`", truncate(line, 80))));
    }
    let txt = parts.next().map(|t| t.trim().to_string()).unwrap_or_default();
    Ok(RawUtt { key, audio: AudioSource::File { path: PathBuf::from(wav), start: None, end: None }, txt })
}

/// At most `n` characters of `s`, for messages.
pub(crate) fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}
