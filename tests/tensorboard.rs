//! TensorBoard event files: round trip through the project's reader, the
//! record format byte by byte, corruption detection, and (where the
//! `tensorboard` Python package is importable) TensorBoard's own loader.

use std::path::PathBuf;
use std::process::Command;

use asrforge::train::tensorboard::{masked_crc32c, read_scalars, SummaryWriter};
use asrforge::Error;

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("asrforge-tb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Writes a few scalars and returns the file and what was written.
fn write_sample(dir: &PathBuf) -> (PathBuf, Vec<(String, i64, f32)>) {
    let want: Vec<(String, i64, f32)> = vec![
        ("train/loss".into(), 0, 12.5),
        ("train/lr".into(), 0, 0.001),
        ("train/loss".into(), 10, 7.25),
        ("train/lr".into(), 10, 0.002),
        ("train/loss".into(), 300, 3.0625),
        ("cv/loss".into(), 1_000_000, -1.5),
    ];
    let mut w = SummaryWriter::new(dir).unwrap();
    for (tag, step, v) in &want {
        w.add_scalar(tag, *v, *step).unwrap();
    }
    w.flush().unwrap();
    (w.path().to_path_buf(), want)
}

#[test]
fn masked_crc_of_known_input() {
    // CRC32C("123456789") = 0xe3069283 (the standard check value);
    // masked: rotate right by 15, add 0xa282ead8.
    let crc: u32 = 0xe306_9283;
    assert_eq!(masked_crc32c(b"123456789"), crc.rotate_right(15).wrapping_add(0xa282_ead8));
    assert_eq!(crc32c::crc32c(b"123456789"), crc);
}

#[test]
fn round_trip_through_own_reader() {
    let dir = fresh_dir("roundtrip");
    let (path, want) = write_sample(&dir);
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let stamp: u64 = name.strip_prefix("events.out.tfevents.").unwrap().split('.').next().unwrap().parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(now - stamp < 600, "file name time {stamp} vs now {now}");
    assert_eq!(read_scalars(&path).unwrap(), want);

    // A second writer in the same second gets its own file, not the first one truncated.
    let mut w2 = SummaryWriter::new(&dir).unwrap();
    // Negative steps are ten-byte varints in protobuf; they must survive too.
    w2.add_scalar("x", 1.0, -3).unwrap();
    w2.flush().unwrap();
    assert_ne!(w2.path(), path.as_path());
    assert_eq!(read_scalars(&path).unwrap(), want);
    assert_eq!(read_scalars(w2.path()).unwrap(), vec![("x".to_string(), -3, 1.0)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn first_record_is_the_version_event() {
    let dir = fresh_dir("layout");
    let (path, _) = write_sample(&dir);
    let bytes = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(bytes[0..8].try_into().unwrap()) as usize;
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), masked_crc32c(&bytes[0..8]));
    let data = &bytes[12..12 + len];
    assert_eq!(u32::from_le_bytes(bytes[12 + len..16 + len].try_into().unwrap()), masked_crc32c(data));
    // Event{ wall_time (tag 0x09, 8 bytes), step 0 (0x10 0x00), file_version (0x1a, len 13, "brain.Event:2") }.
    assert_eq!(len, 9 + 2 + 2 + 13);
    assert_eq!(data[0], 0x09);
    assert_eq!(&data[9..13], &[0x10, 0x00, 0x1a, 13]);
    assert_eq!(&data[13..], b"brain.Event:2");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupted_bytes_are_reported_with_file_and_offset() {
    let dir = fresh_dir("corrupt");
    let (path, _) = write_sample(&dir);
    let clean = std::fs::read(&path).unwrap();
    let first_len = 12 + u64::from_le_bytes(clean[0..8].try_into().unwrap()) as usize + 4;

    // A flipped byte in the second record's data fails its data CRC.
    let mut bad = clean.clone();
    bad[first_len + 12 + 3] ^= 0x40;
    std::fs::write(&path, &bad).unwrap();
    match read_scalars(&path) {
        Err(Error::CorruptRecord { path: p, offset, msg }) => {
            assert_eq!(p, path.display().to_string());
            assert_eq!(offset, first_len as u64);
            assert!(msg.contains("data CRC"), "{msg}");
        }
        other => panic!("expected CorruptRecord, got {other:?}"),
    }
    let shown = read_scalars(&path).unwrap_err().to_string();
    assert!(shown.contains(&path.display().to_string()) && shown.contains(&format!("offset {first_len}")), "{shown}");

    // A flipped byte in the length fails the length CRC.
    let mut bad = clean.clone();
    bad[first_len + 1] ^= 0x01;
    std::fs::write(&path, &bad).unwrap();
    match read_scalars(&path) {
        Err(Error::CorruptRecord { offset, msg, .. }) => {
            assert_eq!(offset, first_len as u64);
            assert!(msg.contains("length CRC"), "{msg}");
        }
        other => panic!("expected CorruptRecord, got {other:?}"),
    }

    // A file cut short in the last record.
    std::fs::write(&path, &clean[..clean.len() - 2]).unwrap();
    assert!(matches!(read_scalars(&path), Err(Error::CorruptRecord { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Reads the file with TensorBoard's EventAccumulator; None when the package is not importable.
fn read_with_tensorboard(python: &str, dir: &PathBuf) -> Option<Vec<(String, i64, f32)>> {
    let probe = Command::new(python).args(["-c", "import tensorboard"]).output().ok()?;
    if !probe.status.success() {
        return None;
    }
    let script = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print("%s\t%d\t%r" % (tag, e.step, e.value))
"#;
    let out = Command::new(python).args(["-c", script, dir.to_str()?]).output().ok()?;
    assert!(out.status.success(), "EventAccumulator failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).ok()?;
    Some(
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f[0].to_string(), f[1].parse().unwrap(), f[2].parse().unwrap())
            })
            .collect(),
    )
}

#[test]
fn tensorboard_reads_our_files() {
    let dir = fresh_dir("official");
    let (path, want) = write_sample(&dir);
    // The project's reader is checked whether or not Python is available.
    assert_eq!(read_scalars(&path).unwrap(), want);

    let python = std::env::var("ASRFORGE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    match read_with_tensorboard(&python, &dir) {
        Some(got) => {
            let mut expected = want.clone();
            // EventAccumulator groups by tag (sorted here), keeping step order within a tag.
            expected.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(got, expected);
            eprintln!("tensorboard_reads_our_files: EventAccumulator ({python}) read {} scalars", got.len());
        }
        None => eprintln!(
            "tensorboard_reads_our_files: skipping the EventAccumulator check, `{python} -c \"import tensorboard\"` failed; set ASRFORGE_PYTHON to a python with tensorboard installed"
        ),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
