//! Reading WeNet shards: tar files of `key.wav` + `key.txt` pairs.
//!
//! As in WeNet's `tar_file_and_group`, consecutive members that share a
//! prefix (the name up to its last `.`) form one utterance. A corrupt or
//! truncated tar ends that shard with one [`SkipReason::BadShard`]; the
//! utterances read before the damage are kept.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::data::list::{AudioSource, RawUtt};
use crate::data::skip::{Skip, SkipReason};

/// A group of members with one prefix, being filled.
struct Group {
    key: String,
    wav: Option<Vec<u8>>,
    txt: Option<String>,
}

impl Group {
    fn finish(self) -> std::result::Result<RawUtt, Skip> {
        match (self.wav, self.txt) {
            (Some(wav), Some(txt)) => Ok(RawUtt { key: self.key, audio: AudioSource::Bytes(wav), txt }),
            (None, _) => Err(Skip::new(SkipReason::CorruptAudio, self.key, "expected a .wav member in the shard, found none")),
            (Some(_), None) => Err(Skip::new(SkipReason::EmptyTranscript, self.key, "expected a .txt member in the shard, found none")),
        }
    }
}

/// Calls `f` for every utterance (or skip) in the shard at `path`, in tar
/// order, until `f` returns false.
pub fn for_each_in_shard(path: &Path, mut f: impl FnMut(std::result::Result<RawUtt, Skip>) -> bool) {
    let shown = path.display().to_string();
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) => {
            let reason = if e.kind() == std::io::ErrorKind::NotFound { SkipReason::MissingFile } else { SkipReason::UnreadableFile };
            f(Err(Skip::new(reason, shown, format!("cannot open shard: {e}"))));
            return;
        }
    };
    read_tar(BufReader::new(file), &shown, &mut f);
}

/// Reads a tar stream; `name` labels skips; stops when `f` returns false.
pub fn read_tar<R: Read>(reader: R, name: &str, f: &mut dyn FnMut(std::result::Result<RawUtt, Skip>) -> bool) {
    let bad = |detail: String| Skip::new(SkipReason::BadShard, name.to_string(), detail);
    let mut archive = tar::Archive::new(reader);
    let entries = match archive.entries() {
        Ok(entries) => entries,
        Err(e) => {
            f(Err(bad(format!("expected a tar archive: {e}"))));
            return;
        }
    };
    let mut group: Option<Group> = None;
    for entry in entries {
        let mut entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                // Whatever was half-read belongs to the damaged part: drop it.
                f(Err(bad(format!("corrupt or truncated tar: {e}"))));
                return;
            }
        };
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let member = match entry.path() {
            Ok(p) => p.to_string_lossy().to_string(),
            Err(e) => {
                f(Err(bad(format!("member with an unreadable name: {e}"))));
                return;
            }
        };
        let Some(dot) = member.rfind('.') else {
            continue;
        };
        let (prefix, ext) = (&member[..dot], &member[dot + 1..]);
        let mut data = Vec::with_capacity(entry.size() as usize);
        if let Err(e) = entry.read_to_end(&mut data) {
            f(Err(bad(format!("{member}: truncated member: {e}"))));
            return;
        }
        if group.as_ref().is_none_or(|g| g.key != prefix) {
            if let Some(done) = group.take() {
                if !f(done.finish()) {
                    return;
                }
            }
            group = Some(Group { key: prefix.to_string(), wav: None, txt: None });
        }
        if let Some(g) = group.as_mut() {
            match ext {
                "wav" => g.wav = Some(data),
                "txt" => g.txt = Some(String::from_utf8_lossy(&data).trim().to_string()),
                _ => {}
            }
        }
    }
    if let Some(done) = group.take() {
        f(done.finish());
    }
}
