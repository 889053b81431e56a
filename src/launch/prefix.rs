//! Forwards a child's output line by line with a prefix (`[rank3]: `), so
//! the lines of several workers interleave whole and each says who wrote it.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

/// Where forwarded lines go.
#[derive(Clone, Copy, Debug)]
pub enum Sink {
    /// The launcher's standard output.
    Stdout,
    /// The launcher's standard error.
    Stderr,
}

/// Writes one prefixed line (a missing final newline is added) under the
/// stream's lock, then flushes. Errors (a closed terminal) are dropped: the
/// child's output must keep being drained so that it never blocks.
fn emit(sink: Sink, prefix: &[u8], line: &[u8]) {
    let mut buf = Vec::with_capacity(prefix.len() + line.len() + 1);
    buf.extend_from_slice(prefix);
    buf.extend_from_slice(line);
    if !line.ends_with(b"\n") {
        buf.push(b'\n');
    }
    let _ = match sink {
        Sink::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(&buf).and_then(|_| out.flush())
        }
        Sink::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_all(&buf).and_then(|_| err.flush())
        }
    };
}

/// Starts a thread that copies `from` to `sink`, each line prefixed, until
/// end of file (a partial last line is written with a newline), then sends
/// `()` on `done`.
pub fn forward<R: Read + Send + 'static>(from: R, prefix: String, sink: Sink, done: Sender<()>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("output {prefix}")).spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => emit(sink, prefix.as_bytes(), &line),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    if !line.is_empty() {
                        emit(sink, prefix.as_bytes(), &line);
                    }
                    break;
                }
            }
        }
        let _ = done.send(());
    })
}
