//! Whole-list passes in parallel (CMVN statistics, feature dumps): rayon
//! over list lines with an indicatif progress bar, results in list order.

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use crate::data::list::DataList;
use crate::error::{Error, Result};

/// Runs `f(line_index)` for every line of `list` on `num_workers` threads
/// (0 means 1) and returns the results in line order, so what the caller
/// folds them into does not depend on the thread count. `label` titles the bar.
pub fn map_lines<T, F>(list: &DataList, num_workers: usize, label: &str, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(usize) -> T + Sync,
{
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(num_workers.max(1))
        .build()
        .map_err(|e| Error::Msg(format!("cannot start {} worker threads: {e}", num_workers.max(1))))?;
    // Drawn only on a terminal: indicatif hides the bar when stderr is redirected.
    let bar = ProgressBar::new(list.len() as u64);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})") {
        bar.set_style(style);
    }
    bar.set_message(label.to_string());
    let out = pool.install(|| {
        (0..list.len())
            .into_par_iter()
            .map(|i| {
                let r = f(i);
                bar.inc(1);
                r
            })
            .collect()
    });
    bar.finish_and_clear();
    Ok(out)
}
