//! The threaded loader: list partitioning, worker threads, ordered
//! reassembly, shuffle → sort → batch → pad, bounded prefetch, resume.
//!
//! ```text
//!  list lines ──(shuffle per epoch, rank::world_size)──► units 0,1,2,…
//!  worker w decodes units w, w+N, w+2N, … ──► its own bounded queue
//!  assembler reads queue (u mod N) for unit u = 0,1,2,… ──► shuffle ► sort ► batch ► pad
//!                                                        ──► prefetch queue ──► EpochIter
//! ```
//! Units are split among workers as WeNet splits them among its DataLoader
//! workers (`worker_id::num_workers`), but the assembler takes them back in
//! unit order and each utterance has its own generator, so an epoch is the
//! same batch for batch whatever `num_workers` is. That also makes resume
//! exact: skipping the first `k` batches of a rerun reproduces the rest.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::data::batch::{pad, shuffle, Batch, BatchMode, Batcher, ShuffleBuffer, SortBuffer};
use crate::data::bucket::BucketBatcher;
use crate::data::list::DataList;
use crate::data::process::{stage_rng, utt_rng, Processor, Sample};
use crate::data::skip::{Skip, SkipReason, SkipStats};
use crate::error::{Error, Result};

/// Samples a worker may run ahead of the assembler.
const WORKER_QUEUE: usize = 16;

/// Loader options that are not part of `dataset_conf`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoaderConf {
    /// Decoding / feature threads (0 is treated as 1).
    pub num_workers: usize,
    /// Batches buffered ahead of the consumer.
    pub prefetch: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Split the list across ranks (train); false gives every rank the whole list (cv).
    pub partition: bool,
    /// Print the first skips and the end-of-epoch summary to stderr.
    pub log: bool,
}

impl Default for LoaderConf {
    fn default() -> Self {
        LoaderConf { num_workers: 2, prefetch: 4, seed: 777, rank: 0, world_size: 1, partition: true, log: true }
    }
}

/// What an epoch produced, available when its iterator is exhausted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpochSummary {
    /// Utterances that reached a batch (including batches skipped on resume).
    pub utterances: usize,
    /// Batches formed (including batches skipped on resume).
    pub batches: usize,
    /// Feature frames in those batches.
    pub frames: usize,
    /// Frames after padding (each batch: utterances × its longest).
    pub padded_frames: usize,
    /// Dropped utterances by reason.
    pub skips: SkipStats,
}

impl EpochSummary {
    /// The share of padded frames that are padding, 0 when nothing was batched.
    pub fn padding_fraction(&self) -> f64 {
        if self.padded_frames == 0 {
            0.0
        } else {
            1.0 - self.frames as f64 / self.padded_frames as f64
        }
    }
}

/// One unit of work: a list line in a given pass over the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Index of the list line.
    pub line: usize,
    /// Which pass (`0..cycle`) over the list.
    pub pass: usize,
}

/// A reusable loader over one list; each call to [`DataLoader::epoch`] starts fresh threads.
#[derive(Clone, Debug)]
pub struct DataLoader {
    list: Arc<DataList>,
    processor: Arc<Processor>,
    conf: LoaderConf,
}

enum WorkerMsg {
    Item(std::result::Result<Sample, Skip>),
    Done,
}

enum OutMsg {
    Batch(Box<Batch>),
    End(EpochSummary),
}

impl DataLoader {
    /// A loader; fails only on inconsistent rank settings.
    pub fn new(list: DataList, processor: Processor, conf: LoaderConf) -> Result<DataLoader> {
        if conf.world_size == 0 || conf.rank >= conf.world_size {
            return Err(Error::invalid("DataLoader", format!("expected 0 <= rank < world_size, found rank {} of world_size {}", conf.rank, conf.world_size)));
        }
        Ok(DataLoader { list: Arc::new(list), processor: Arc::new(processor), conf })
    }

    /// The path of the list this loader reads (for messages).
    pub fn list_path(&self) -> &str {
        &self.list.path
    }

    /// The units this rank processes in `epoch`, in order.
    pub fn units(&self, epoch: u64) -> Vec<Unit> {
        let dconf = self.processor.conf();
        let mut units = Vec::new();
        for pass in 0..dconf.cycle.max(1) {
            let mut order: Vec<usize> = (0..self.list.len()).collect();
            if dconf.list_shuffle {
                shuffle(&mut order, &mut stage_rng(self.conf.seed, epoch, 1 + pass as u64));
            }
            let mine = order.into_iter().enumerate().filter(|(i, _)| !self.conf.partition || i % self.conf.world_size == self.conf.rank);
            units.extend(mine.map(|(_, line)| Unit { line, pass }));
        }
        units
    }

    /// Starts `epoch` from its beginning.
    pub fn epoch(&self, epoch: u64) -> EpochIter {
        self.resume(epoch, 0)
    }

    /// Starts `epoch` after its first `position` batches (a position reported by [`EpochIter::position`]).
    pub fn resume(&self, epoch: u64, position: usize) -> EpochIter {
        let units = Arc::new(self.units(epoch));
        let n_workers = self.conf.num_workers.max(1);
        let mut threads = Vec::with_capacity(n_workers + 1);
        let mut queues = Vec::with_capacity(n_workers);
        for w in 0..n_workers {
            let (tx, rx) = sync_channel::<WorkerMsg>(WORKER_QUEUE);
            queues.push(rx);
            let (list, proc, units, seed) = (self.list.clone(), self.processor.clone(), units.clone(), self.conf.seed);
            threads.push(std::thread::spawn(move || worker(&list, &proc, &units, w, n_workers, seed, epoch, &tx)));
        }
        let (out_tx, out_rx) = sync_channel::<OutMsg>(self.conf.prefetch.max(1));
        let (proc, conf, n_units) = (self.processor.clone(), self.conf.clone(), units.len());
        threads.push(std::thread::spawn(move || assemble(&proc, &conf, epoch, n_units, queues, position, &out_tx)));
        EpochIter { rx: Some(out_rx), threads, position, summary: None }
    }
}

/// Worker `w` of `n`: decodes and featurises units `w, w+n, …`.
#[allow(clippy::too_many_arguments)]
fn worker(list: &DataList, proc: &Processor, units: &[Unit], w: usize, n: usize, seed: u64, epoch: u64, tx: &SyncSender<WorkerMsg>) {
    for unit in units.iter().skip(w).step_by(n) {
        let coord = unit.pass * list.len() + unit.line;
        let mut alive = true;
        list.for_each_utt(unit.line, |sub, utt| {
            let item = utt.and_then(|u| proc.process(u, &mut utt_rng(seed, epoch, coord, sub)));
            alive = tx.send(WorkerMsg::Item(item)).is_ok();
            alive
        });
        if !alive || tx.send(WorkerMsg::Done).is_err() {
            return;
        }
    }
}

/// The single-threaded tail: ordered reassembly, buffers, batching, padding.
struct Stages<'a> {
    shuffle: Option<ShuffleBuffer>,
    sort: Option<SortBuffer>,
    batcher: Batcher,
    bucket: Option<BucketBatcher>,
    summary: EpochSummary,
    skip_batches: usize,
    out: &'a SyncSender<OutMsg>,
    consumer_gone: bool,
}

impl Stages<'_> {
    fn push(&mut self, s: Sample) {
        match self.shuffle.as_mut() {
            Some(b) => {
                if let Some(out) = b.push(s) {
                    out.into_iter().for_each(|s| self.sort_stage(s));
                }
            }
            None => self.sort_stage(s),
        }
    }

    fn sort_stage(&mut self, s: Sample) {
        match self.sort.as_mut() {
            Some(b) => {
                if let Some(out) = b.push(s) {
                    out.into_iter().for_each(|s| self.batch_stage(s));
                }
            }
            None => self.batch_stage(s),
        }
    }

    fn batch_stage(&mut self, s: Sample) {
        if let Some(bucket) = self.bucket.as_mut() {
            if !bucket.fits(&s) {
                let detail = format!("{} frames exceed max_frames_in_batch", s.frames);
                self.summary.skips.record(Skip::new(SkipReason::OverBatchBudget, s.key, detail));
                return;
            }
            for b in bucket.push(s) {
                self.emit(b);
            }
            return;
        }
        if !self.batcher.fits(&s) {
            let detail = format!("{} frames exceed max_frames_in_batch", s.frames);
            self.summary.skips.record(Skip::new(SkipReason::OverBatchBudget, s.key, detail));
            return;
        }
        if let Some(b) = self.batcher.push(s) {
            self.emit(b);
        }
    }

    fn emit(&mut self, samples: Vec<Sample>) {
        self.summary.batches += 1;
        self.summary.utterances += samples.len();
        self.summary.frames += samples.iter().map(|s| s.frames).sum::<usize>();
        self.summary.padded_frames += samples.len() * samples.iter().map(|s| s.frames).max().unwrap_or(0);
        if self.summary.batches <= self.skip_batches || self.consumer_gone {
            return;
        }
        match pad(samples) {
            Ok(b) => self.consumer_gone = self.out.send(OutMsg::Batch(Box::new(b))).is_err(),
            // Samples of one Processor always share a dim, so this is unreachable in practice.
            Err(e) => eprintln!("data: dropped a batch: {e}"),
        }
    }

    fn finish(&mut self) {
        if let Some(out) = self.shuffle.as_mut().map(|b| b.flush()) {
            out.into_iter().for_each(|s| self.sort_stage(s));
        }
        if let Some(out) = self.sort.as_mut().map(|b| b.flush()) {
            out.into_iter().for_each(|s| self.batch_stage(s));
        }
        if let Some(b) = self.batcher.flush() {
            self.emit(b);
        }
        let rest = self.bucket.as_mut().map(BucketBatcher::flush).unwrap_or_default();
        for b in rest {
            self.emit(b);
        }
    }
}

fn assemble(proc: &Processor, conf: &LoaderConf, epoch: u64, n_units: usize, queues: Vec<Receiver<WorkerMsg>>, skip_batches: usize, out: &SyncSender<OutMsg>) {
    let dconf = proc.conf();
    let mut stages = Stages {
        shuffle: dconf.shuffle.then(|| ShuffleBuffer::new(dconf.shuffle_conf.shuffle_size, stage_rng(conf.seed, epoch, 1_000_000 + conf.rank as u64))),
        sort: dconf.sort.then(|| SortBuffer::new(dconf.sort_conf.sort_size)),
        batcher: Batcher::new(BatchMode::from_conf(&dconf.batch_conf)),
        bucket: (dconf.batch_conf.batch_type == "bucket").then(|| {
            let c = &dconf.batch_conf;
            if c.bucket_boundaries.is_empty() {
                BucketBatcher::auto(c.max_frames_in_batch, c.num_buckets, c.bucket_warmup)
            } else {
                BucketBatcher::new(c.bucket_boundaries.clone(), c.bucket_batch_sizes.clone())
            }
        }),
        summary: EpochSummary { skips: SkipStats::with_log(conf.log), ..Default::default() },
        skip_batches,
        out,
        consumer_gone: false,
    };
    let n = queues.len().max(1);
    'units: for u in 0..n_units {
        loop {
            match queues[u % n].recv() {
                Ok(WorkerMsg::Item(Ok(s))) => stages.push(s),
                Ok(WorkerMsg::Item(Err(skip))) => stages.summary.skips.record(skip),
                Ok(WorkerMsg::Done) => break,
                // A worker that is gone cannot deliver its remaining units; end the epoch with what we have.
                Err(_) => break 'units,
            }
            if stages.consumer_gone {
                return;
            }
        }
    }
    stages.finish();
    if conf.log {
        eprintln!(
            "data: epoch {epoch} rank {}: {} utterances in {} batches, padding {:.1}% of {} padded frames, {}",
            conf.rank,
            stages.summary.utterances,
            stages.summary.batches,
            100.0 * stages.summary.padding_fraction(),
            stages.summary.padded_frames,
            stages.summary.skips.summary()
        );
    }
    let _ = out.send(OutMsg::End(stages.summary));
}

/// The batches of one epoch, in order; stops its threads when dropped.
pub struct EpochIter {
    rx: Option<Receiver<OutMsg>>,
    threads: Vec<JoinHandle<()>>,
    position: usize,
    summary: Option<EpochSummary>,
}

impl EpochIter {
    /// Batches of this epoch consumed so far, counting those skipped on resume: pass it to [`DataLoader::resume`].
    pub fn position(&self) -> usize {
        self.position
    }

    /// Counts and skips of the epoch, once the iterator has returned `None`.
    pub fn summary(&self) -> Option<&EpochSummary> {
        self.summary.as_ref()
    }
}

impl Iterator for EpochIter {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let msg = self.rx.as_ref()?.recv();
        match msg {
            Ok(OutMsg::Batch(b)) => {
                self.position += 1;
                Some(*b)
            }
            Ok(OutMsg::End(s)) => {
                self.summary = Some(s);
                self.rx = None;
                None
            }
            Err(_) => {
                self.rx = None;
                None
            }
        }
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        // Closing the queue first makes every blocked sender fail, so the joins cannot hang.
        self.rx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
