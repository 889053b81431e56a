//! TensorBoard event files: a writer of scalar summaries that TensorBoard
//! itself reads, and the project's own reader used to check them.
//!
//! A file is a sequence of TFRecords: u64 little-endian length, u32 masked
//! CRC32C of those 8 bytes, the data, u32 masked CRC32C of the data. Each
//! record's data is a protobuf `Event`, encoded here by hand because only
//! five fields are needed:
//!
//! ```text
//! Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//! Summary { repeated Value value = 1; }
//! Value   { string tag = 1; float simple_value = 2; }
//! ```

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// The version string TensorBoard expects in a file's first event.
pub const FILE_VERSION: &str = "brain.Event:2";

// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// The CRC masking of the TFRecord format (so that CRCs of CRCs stay well distributed).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    // (crc >> 15) | (crc << 17) is a rotation by 15.
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Encodes one `Event`; `file_version` only in the first event, `scalar` as (tag, value).
fn encode_event(wall_time: f64, step: i64, file_version: Option<&str>, scalar: Option<(&str, f32)>) -> Vec<u8> {
    let mut ev = Vec::new();
    put_key(&mut ev, 1, FIXED64);
    ev.extend_from_slice(&wall_time.to_le_bytes());
    put_key(&mut ev, 2, VARINT);
    // int64 is a two's-complement varint, so negative steps take ten bytes, as in protobuf.
    put_varint(&mut ev, step as u64);
    if let Some(v) = file_version {
        put_bytes(&mut ev, 3, v.as_bytes());
    }
    if let Some((tag, value)) = scalar {
        let mut val = Vec::new();
        put_bytes(&mut val, 1, tag.as_bytes());
        put_key(&mut val, 2, FIXED32);
        val.extend_from_slice(&value.to_le_bytes());
        let mut summary = Vec::new();
        put_bytes(&mut summary, 1, &val);
        put_bytes(&mut ev, 5, &summary);
    }
    ev
}

/// Frames `data` as one TFRecord.
fn frame_record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut rec = Vec::with_capacity(data.len() + 16);
    rec.extend_from_slice(&len);
    rec.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    rec.extend_from_slice(data);
    rec.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    rec
}

fn now() -> f64 {
    // A clock before 1970 is a broken machine, not a reason to stop training.
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The host name for the file name, from the kernel or the environment, else `localhost`.
fn hostname() -> String {
    let from_file = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let name = from_file("/proc/sys/kernel/hostname").or_else(|| from_file("/etc/hostname")).or_else(|| std::env::var("HOSTNAME").ok()).unwrap_or_default();
    // Keep the name a single path component.
    let clean: String = name.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).collect();
    if clean.is_empty() {
        "localhost".to_string()
    } else {
        clean
    }
}

/// Writes scalar summaries to `events.out.tfevents.{unix_seconds}.{hostname}` in a directory.
pub struct SummaryWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl SummaryWriter {
    /// Creates the directory if needed and a new event file in it, starting with the version event.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let io = |p: &Path| {
            let path = p.display().to_string();
            move |source| Error::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let wall_time = now();
        let base = format!("events.out.tfevents.{}.{}", wall_time as u64, hostname());
        // Two writers started in the same second must not share (and truncate) one file;
        // TensorBoard loads every file whose name contains "tfevents", so a suffix is fine.
        let mut n = 0u32;
        let (path, file) = loop {
            let name = if n == 0 { base.clone() } else { format!("{base}.{n}") };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(io(&path)(e)),
            }
        };
        let mut w = SummaryWriter { path, out: BufWriter::new(file) };
        w.write_event(&encode_event(wall_time, 0, Some(FILE_VERSION), None))?;
        w.flush()?;
        Ok(w)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, event: &[u8]) -> Result<()> {
        let rec = frame_record(event);
        self.out.write_all(&rec).map_err(|source| Error::Io { path: self.path.display().to_string(), source })
    }

    /// Records `value` under `tag` at `step`, stamped with the current time.
    pub fn add_scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<()> {
        self.write_event(&encode_event(now(), step, None, Some((tag, value))))
    }

    /// Pushes buffered events to the file so that a running TensorBoard sees them.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|source| Error::Io { path: self.path.display().to_string(), source })
    }
}

impl Drop for SummaryWriter {
    fn drop(&mut self) {
        // Drop cannot report; callers that need to know call flush() first.
        let _ = self.out.flush();
    }
}

/// A cursor over protobuf bytes that reports failures against a record's offset.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("expected a varint, found the end of the message")?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("expected a varint of at most 10 bytes, found a longer one".into())
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end =
            self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| format!("expected {n} more bytes, found {}", self.buf.len() - self.pos))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Reads a field key and returns (field number, wire type).
    fn key(&mut self) -> std::result::Result<(u64, u8), String> {
        let k = self.varint()?;
        Ok((k >> 3, (k & 7) as u8))
    }

    /// Skips over a field value of the given wire type.
    fn skip(&mut self, wire: u8) -> std::result::Result<(), String> {
        match wire {
            VARINT => self.varint().map(|_| ()),
            FIXED64 => self.take(8).map(|_| ()),
            LEN => {
                let n = self.varint()? as usize;
                self.take(n).map(|_| ())
            }
            FIXED32 => self.take(4).map(|_| ()),
            w => Err(format!("expected a protobuf wire type 0, 1, 2 or 5, found {w}")),
        }
    }

    fn len_delimited(&mut self) -> std::result::Result<&'a [u8], String> {
        let n = self.varint()? as usize;
        self.take(n)
    }
}

/// One decoded `Event`: its step and the simple-value scalars of its summary.
fn decode_event(data: &[u8]) -> std::result::Result<(i64, Vec<(String, f32)>), String> {
    let mut r = Reader { buf: data, pos: 0 };
    let mut step = 0i64;
    let mut scalars = Vec::new();
    while !r.done() {
        match r.key()? {
            (2, VARINT) => step = r.varint()? as i64,
            (5, LEN) => {
                let mut s = Reader { buf: r.len_delimited()?, pos: 0 };
                while !s.done() {
                    match s.key()? {
                        (1, LEN) => {
                            let mut v = Reader { buf: s.len_delimited()?, pos: 0 };
                            let (mut tag, mut value) = (String::new(), None);
                            while !v.done() {
                                match v.key()? {
                                    (1, LEN) => {
                                        tag = String::from_utf8(v.len_delimited()?.to_vec())
                                            .map_err(|_| "expected a UTF-8 tag, found invalid bytes".to_string())?;
                                    }
                                    (2, FIXED32) => {
                                        let b = v.take(4)?;
                                        value = Some(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                                    }
                                    (_, w) => v.skip(w)?,
                                }
                            }
                            // Values of other kinds (images, histograms, tensors) are not scalars here.
                            if let Some(value) = value {
                                scalars.push((tag, value));
                            }
                        }
                        (_, w) => s.skip(w)?,
                    }
                }
            }
            (_, w) => r.skip(w)?,
        }
    }
    Ok((step, scalars))
}

/// Reads every simple-value scalar of an event file as (tag, step, value), checking both CRCs of every record.
pub fn read_scalars(path: impl AsRef<Path>) -> Result<Vec<(String, i64, f32)>> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: name.clone(), source })?;
    let corrupt = |offset: usize, msg: String| Error::CorruptRecord { path: name.clone(), offset: offset as u64, msg };
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let start = pos;
        if bytes.len() - pos < 12 {
            return Err(corrupt(start, format!("expected a 12-byte record header, found {} bytes", bytes.len() - pos)));
        }
        let len_bytes = &bytes[pos..pos + 8];
        let stored = u32::from_le_bytes([bytes[pos + 8], bytes[pos + 9], bytes[pos + 10], bytes[pos + 11]]);
        let computed = masked_crc32c(len_bytes);
        if stored != computed {
            return Err(corrupt(start, format!("length CRC expected {computed:#010x}, found {stored:#010x}")));
        }
        let len = u64::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3], len_bytes[4], len_bytes[5], len_bytes[6], len_bytes[7]]);
        pos += 12;
        let remaining = (bytes.len() - pos) as u64;
        if len.saturating_add(4) > remaining {
            return Err(corrupt(start, format!("expected {len} data bytes and a 4-byte CRC, found {remaining} bytes")));
        }
        let len = len as usize;
        let data = &bytes[pos..pos + len];
        pos += len;
        let stored = u32::from_le_bytes([bytes[pos], bytes[pos + 1], bytes[pos + 2], bytes[pos + 3]]);
        pos += 4;
        let computed = masked_crc32c(data);
        if stored != computed {
            return Err(corrupt(start, format!("data CRC expected {computed:#010x}, found {stored:#010x}")));
        }
        let (step, scalars) = decode_event(data).map_err(|msg| corrupt(start, format!("bad Event: {msg}")))?;
        out.extend(scalars.into_iter().map(|(tag, v)| (tag, step, v)));
    }
    Ok(out)
}
