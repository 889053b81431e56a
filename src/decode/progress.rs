//! The decoding progress bar: utterances done out of the list, utterances/s
//! and ETA, drawn on stderr only when it is a terminal (indicatif hides it
//! otherwise, so logs and pipes stay clean). A shard list does not say how
//! many utterances it holds, so its bar counts utterances and their rate
//! without a total.

use indicatif::{ProgressBar, ProgressStyle};

/// The template of a bar over a known number of utterances.
pub const TEMPLATE: &str = "decoding {bar:30} {pos}/{len} utts, {per_sec} ETA {eta}";

/// The template when the number of utterances is not known (shard lists).
pub const OPEN_TEMPLATE: &str = "decoding {spinner} {pos} utts, {per_sec}";

/// A bar over `total` utterances, or an open-ended counter when `total` is `None`.
pub fn decode_bar(total: Option<usize>) -> ProgressBar {
    let (bar, template) = match total {
        Some(n) => (ProgressBar::new(n as u64), TEMPLATE),
        None => (ProgressBar::no_length(), OPEN_TEMPLATE),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
