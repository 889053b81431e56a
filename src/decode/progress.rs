//! The decoding progress bar: utterances done out of the list, utterances/s
//! and ETA, drawn on stderr only when it is a terminal (indicatif hides it
//! otherwise, so logs and pipes stay clean).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `total` utterances.
pub fn decode_bar(total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template("decoding {bar:30} {pos}/{len} utts, {per_sec} ETA {eta}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
