//! The executor: train and cv epochs. Per batch: forward, loss/accum_grad
//! (times the loss scale with AMP), `engine.backward` (told to synchronise
//! on the accumulation's last batch); every `accum_grad` batches
//! `engine.step` (reduce, unscale, clip the global norm, step unless inf/NaN,
//! zero the gradients), then the scaler's update and the schedule's step.
//! Logs every `log_interval` batches and writes TensorBoard scalars per step
//! (rank 0 only; every rank waits at a barrier after a save).

use super::checkpoint::{checkpoint_path, save_model, save_optimizer_shard, Position, TrainState};
use super::setup::Optim;
use super::TrainConfig;
use crate::autograd;
use crate::data::loader::DataLoader;
use crate::data::{Batch, SkipReason, SkipStats};
use crate::dist::JoinGroup;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::models::{AsrModel, LossDict, LossValues};
use crate::nn::Module;
use crate::optim::GradScaler;
use crate::tensor::rng::{self, Rng};
use crate::tensor::{DType, Device, Tensor};
use crate::train::tensorboard::SummaryWriter;
use serde_yaml_ng::{Mapping, Value};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

/// The losses of one batch (as plain numbers).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchLoss {
    /// The weighted total.
    pub loss: f64,
    /// CTC loss, when run.
    pub loss_ctc: Option<f64>,
    /// Attention loss, when run.
    pub loss_att: Option<f64>,
    /// Decoder token accuracy, when run.
    pub acc: Option<f64>,
    /// Utterances in the batch.
    pub utts: usize,
    /// Feature frames in the batch.
    pub frames: usize,
    /// Sequences whose CTC target had no alignment (loss and gradient zeroed).
    pub ctc_infeasible: usize,
}

/// The size of a batch [`Executor::train_batch`] has queued (its losses
/// are read at the optimizer step: [`Executor::last_batch`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchSize {
    /// Utterances in the batch.
    pub utts: usize,
    /// Feature frames in the batch.
    pub frames: usize,
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// The step number (1-based, counting skipped ones).
    pub step: u64,
    /// Mean loss of the batches of this step.
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// The learning rate used.
    pub lr: f64,
    /// Whether the update was skipped (inf/NaN gradient).
    pub skipped: bool,
}

/// Cross-validation results, weighted by utterances.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CvResult {
    /// Mean total loss.
    pub loss: f64,
    /// Mean CTC loss.
    pub loss_ctc: Option<f64>,
    /// Mean attention loss.
    pub loss_att: Option<f64>,
    /// Mean accuracy.
    pub acc: Option<f64>,
    /// Utterances seen.
    pub utts: usize,
}

/// Runs epochs over a model with its engine, optimizer and scaler.
pub struct Executor {
    /// The model.
    pub model: AsrModel,
    /// The engine: parameters, optimizer, gradient reduction.
    pub engine: Box<dyn Engine>,
    /// The optimizer's settings and the schedule.
    pub optim: Optim,
    /// The `--use_amp` loss scaler.
    pub scaler: Option<GradScaler>,
    /// TensorBoard (rank 0).
    pub writer: Option<SummaryWriter>,
    /// Training settings.
    pub cfg: TrainConfig,
    /// Where checkpoints go.
    pub model_dir: PathBuf,
    /// Where training stands.
    pub position: Position,
    /// Steps skipped for a non-finite gradient norm.
    pub skipped_steps: u64,
    /// Every step's report, in order.
    pub history: Vec<StepReport>,
    /// Whether checkpoints carry the optimizer state and resume state
    /// (false for `--deepspeed.save_states model_only`: the model file only).
    pub save_optimizer_state: bool,
    /// The join group (several processes): before each batch every rank
    /// says whether it has one, and all stop when any has run out.
    pub join: Option<JoinGroup>,
    /// The batches since the last step; the losses of those listed in
    /// `unread` are still on their way from the GPU.
    pending: Vec<BatchLoss>,
    /// The loss read-backs of pending batches (by index), queued after each
    /// backward and read after the step's own wait for the device.
    unread: Vec<(usize, LossValues)>,
    /// The latest batch's losses, for the log line.
    last_batch: Option<BatchLoss>,
    /// Batches of the last finished epoch: the progress bar's total for the next one.
    last_epoch_batches: Option<usize>,
    /// Where batches are moved before the forward (the model's device).
    pub device: Device,
    /// The half type of autocast for the forward (fp16 / bf16 training), if any.
    pub autocast: Option<DType>,
    /// Sequences trained with a zeroed CTC loss (no alignment fits), over the run.
    pub ctc_zeroed: u64,
    /// The buffers the forward updates (BatchNorm statistics), as they were
    /// before the current accumulation: a skipped step puts them back.
    buffer_snapshot: Option<Vec<(Tensor, Tensor)>>,
}

/// The buffers a training forward changes: BatchNorm's running statistics
/// and its counter (the positional tables and CMVN statistics are constant).
fn is_running_stat(name: &str) -> bool {
    ["running_mean", "running_var", "num_batches_tracked"].iter().any(|s| name.ends_with(s))
}

fn mean(xs: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = xs.flatten().collect();
    if v.is_empty() {
        None
    } else {
        Some(v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// Everything an executor is built from, named: [`Executor::new`] takes it
/// in one call. [`ExecutorParts::new`] fills the optional parts with their
/// defaults (no scaler, writer or join group; the CPU; f32; the start of
/// training; the optimizer state saved), for struct-update syntax.
pub struct ExecutorParts {
    /// The model.
    pub model: AsrModel,
    /// The engine: parameters, optimizer, gradient reduction.
    pub engine: Box<dyn Engine>,
    /// The optimizer's settings and the schedule.
    pub optim: Optim,
    /// Training settings.
    pub cfg: TrainConfig,
    /// The `--use_amp` loss scaler.
    pub scaler: Option<GradScaler>,
    /// TensorBoard (rank 0).
    pub writer: Option<SummaryWriter>,
    /// Where checkpoints go.
    pub model_dir: PathBuf,
    /// Where training stands.
    pub position: Position,
    /// The join group (several processes).
    pub join: Option<JoinGroup>,
    /// Whether checkpoints carry the optimizer and resume state.
    pub save_optimizer_state: bool,
    /// Where batches are moved before the forward.
    pub device: Device,
    /// The half type of autocast for the forward, if any.
    pub autocast: Option<DType>,
}

impl ExecutorParts {
    /// The required parts; every other part at its default.
    pub fn new(model: AsrModel, engine: Box<dyn Engine>, optim: Optim, cfg: TrainConfig) -> Self {
        ExecutorParts {
            model,
            engine,
            optim,
            cfg,
            scaler: None,
            writer: None,
            model_dir: std::env::temp_dir(),
            position: Position::default(),
            join: None,
            save_optimizer_state: true,
            device: Device::Cpu,
            autocast: None,
        }
    }
}

impl Executor {
    /// An executor from its parts, continuing from `parts.position`.
    pub fn new(parts: ExecutorParts) -> Self {
        let ExecutorParts { model, engine, optim, cfg, scaler, writer, model_dir, position, join, save_optimizer_state, device, autocast } = parts;
        Executor {
            model,
            engine,
            optim,
            scaler,
            writer,
            cfg,
            model_dir,
            position,
            skipped_steps: 0,
            history: Vec::new(),
            join,
            save_optimizer_state,
            pending: Vec::new(),
            unread: Vec::new(),
            last_batch: None,
            last_epoch_batches: None,
            device,
            autocast,
            ctc_zeroed: 0,
            buffer_snapshot: None,
        }
    }

    /// Copies the running statistics before the first batch of an accumulation.
    fn snapshot_buffers(&mut self) -> Result<()> {
        let mut snap = Vec::new();
        for (name, t) in self.model.named_buffers() {
            if is_running_stat(&name) {
                let copy = t.copy_of()?;
                snap.push((t, copy));
            }
        }
        self.buffer_snapshot = Some(snap);
        Ok(())
    }

    /// Puts the running statistics back as they were before the accumulation
    /// (a skipped step or a failed batch must leave the model as it was).
    fn restore_buffers(&mut self) -> Result<()> {
        if let Some(snap) = self.buffer_snapshot.take() {
            for (t, copy) in &snap {
                t.assign(copy)?;
            }
        }
        Ok(())
    }

    /// Forward and backward of one batch; gradients accumulate. Clears the
    /// tape on error. The batch's losses are queued for the host, not
    /// waited for: the optimizer step reads them ([`Executor::last_batch`]).
    pub fn train_batch(&mut self, batch: &Batch) -> Result<BatchSize> {
        if self.pending.is_empty() {
            self.snapshot_buffers()?;
        }
        let r = self.forward_backward(batch);
        if r.is_err() {
            autograd::clear_tape();
        }
        r
    }

    /// The model's forward on one batch, as train and cv both run it: the
    /// batch moved to the model's device (`self.device`) when it is not
    /// there already, under the run's autocast. Gradients are recorded
    /// unless the caller is inside `no_grad`.
    pub fn forward(&self, b: &Batch) -> Result<LossDict> {
        let moved;
        let b = if b.feats.device() == self.device {
            b
        } else {
            moved = b.to_device(&self.device)?;
            &moved
        };
        // Full precision too: the region packs the qkv fusion's projections.
        let packs = self.model.weight_packs();
        let groups = if self.autocast.is_some() || !packs.is_empty() { self.model.layer_groups() } else { Vec::new() };
        crate::ops::autocast_params_packed(self.autocast, &groups, &packs, || self.model.forward(&b.feats, &b.feats_lengths, &b.target, &b.target_lengths))
    }

    fn forward_backward(&mut self, b: &Batch) -> Result<BatchSize> {
        let out = self.forward(b)?;
        let mut loss = crate::ops::mul_scalar(&out.loss, 1.0 / self.cfg.accum_grad as f64)?;
        if let Some(s) = &self.scaler {
            loss = s.scale_loss(&loss)?;
        }
        let sync = self.pending.len() + 1 >= self.cfg.accum_grad;
        self.engine.backward(&loss, sync)?;
        // On a GPU the values come back without a wait here: the step's
        // read-back waits for the device once for both.
        let values = out.values_later()?;
        let size = BatchSize { utts: b.len(), frames: b.feats_lengths.iter().sum() };
        self.ctc_zeroed += out.ctc_infeasible as u64;
        self.unread.push((self.pending.len(), values));
        self.pending.push(BatchLoss { utts: size.utts, frames: size.frames, ctc_infeasible: out.ctc_infeasible, ..Default::default() });
        Ok(size)
    }

    /// Reads the losses of the pending batches still on their way (waits
    /// for the device only if no step has waited since they were queued).
    fn read_losses(&mut self) -> Result<()> {
        for (i, v) in self.unread.drain(..) {
            let (loss, [loss_ctc, loss_att, acc]) = v.get()?;
            let b = self.pending.get_mut(i).ok_or_else(|| Error::invalid("train_batch", format!("no pending batch {i} for a loss read-back")))?;
            (b.loss, b.loss_ctc, b.loss_att, b.acc) = (loss, loss_ctc, loss_att, acc);
            self.last_batch = Some(*b);
        }
        Ok(())
    }

    /// The latest batch's losses (read now if still on their way).
    pub fn last_batch(&mut self) -> Result<Option<BatchLoss>> {
        self.read_losses()?;
        Ok(self.last_batch)
    }

    /// Forgets the batches since the last step (their gradients are the caller's).
    fn drop_pending(&mut self) {
        self.pending.clear();
        self.unread.clear();
    }

    /// Whether enough batches have accumulated for a step.
    pub fn step_due(&self) -> bool {
        self.pending.len() >= self.cfg.accum_grad
    }

    /// The engine's step (reduce, unscale, clip, update unless inf/NaN, zero
    /// the gradients), then the scaler's update and the schedule's step.
    pub fn optimizer_step(&mut self) -> Result<StepReport> {
        let lr = self.optim.scheduler.lr();
        let out = self.engine.step(lr, self.cfg.grad_clip, self.scaler.as_mut())?;
        self.read_losses()?;
        let (grad_norm, skipped) = (out.grad_norm, out.skipped);
        if skipped {
            self.skipped_steps += 1;
            // The parameters were not updated; the statistics the forward moved go back too.
            self.restore_buffers()?;
        }
        self.buffer_snapshot = None;
        if let Some(s) = self.scaler.as_mut() {
            s.update();
        }
        self.optim.scheduler.step();
        self.position.step += 1;
        let loss = self.pending.iter().map(|b| b.loss).sum::<f64>() / self.pending.len().max(1) as f64;
        let rep = StepReport { step: self.position.step, loss, grad_norm, lr, skipped };
        self.write_step(&rep)?;
        self.drop_pending();
        self.history.push(rep);
        Ok(rep)
    }

    fn write_step(&mut self, r: &StepReport) -> Result<()> {
        let Some(w) = self.writer.as_mut() else { return Ok(()) };
        let s = r.step as i64;
        // WeNet's tags (train_utils.log_per_step): train/train_loss, train/<name> of
        // each loss_dict entry (loss_ctc, loss_att, th_accuracy), train/grad_norm, train/lr_<group>.
        w.add_scalar("train/train_loss", r.loss as f32, s)?;
        if let Some(v) = mean(self.pending.iter().map(|b| b.loss_ctc)) {
            w.add_scalar("train/loss_ctc", v as f32, s)?;
        }
        if let Some(v) = mean(self.pending.iter().map(|b| b.loss_att)) {
            w.add_scalar("train/loss_att", v as f32, s)?;
        }
        if let Some(v) = mean(self.pending.iter().map(|b| b.acc)) {
            w.add_scalar("train/th_accuracy", v as f32, s)?;
        }
        w.add_scalar("train/grad_norm", r.grad_norm as f32, s)?;
        w.add_scalar("train/lr_0", r.lr as f32, s)?;
        w.add_scalar("train/loss_scale", self.scaler.as_ref().map_or(1.0, |x| x.scale) as f32, s)?;
        Ok(())
    }

    /// The resume state at the current position (for a sharded engine,
    /// without its shards); `rank_rngs` is every rank's generator, from
    /// [`Executor::gather_rngs`].
    pub fn train_state(&self, rank_rngs: Vec<Rng>) -> Result<TrainState> {
        let sharded = self.engine.sharded_state();
        Ok(TrainState {
            position: self.position,
            optimizer: if sharded { Vec::new() } else { vec![self.engine.optimizer_state()?] },
            optimizer_shards: sharded.then(|| self.engine.world_size()),
            scheduler_steps: self.optim.scheduler.steps(),
            scaler: self.scaler.as_ref().map(|s| (s.scale, s.growth_tracker)),
            rng: rng::get_state(),
            rank_rngs,
        })
    }

    /// Whether this process logs and writes the shared files (rank 0).
    pub fn is_main(&self) -> bool {
        self.engine.rank() == 0
    }

    /// After `err` ends this rank's run, tells the other ranks why on both
    /// the engine's communicator and the join group, so that the ones waiting
    /// in either fail naming the cause (a dead rank) rather than this rank's
    /// closed connection: a collective can complete on some ranks and not on
    /// others (rank 2 killed after sending its part of a join to rank 1 but
    /// not to rank 0), leaving the ranks in different communicators.
    pub fn abort(&mut self, err: &Error) {
        if self.engine.world_size() < 2 {
            return;
        }
        let reason = format!("rank {} stopped: {err}", self.engine.rank());
        self.engine.abort(&reason);
        if let Some(j) = self.join.as_mut() {
            j.abort(&reason);
        }
    }

    /// Returns once every rank got here (a no-op on one process).
    pub fn barrier(&mut self) -> Result<()> {
        if self.engine.world_size() > 1 {
            self.engine.all_reduce_sum(&mut [0.0])?;
        }
        Ok(())
    }

    /// Saves `model_dir/{tag}` with infos and the resume state: rank 0
    /// writes the model, its YAML and the state file; with a sharded engine
    /// every rank writes its optimizer shard. Every rank then waits for the
    /// others, so none races ahead of a checkpoint.
    pub fn save(&mut self, tag: &str, epoch: u64, cv_loss: Option<f64>) -> Result<PathBuf> {
        let rank_rngs = self.gather_rngs()?;
        if self.engine.sharded_state() && self.save_optimizer_state {
            let shard = self.engine.optimizer_state()?;
            save_optimizer_shard(&checkpoint_path(&self.model_dir, tag), self.engine.rank(), &shard)?;
        }
        let path = if self.is_main() { self.save_main(tag, epoch, cv_loss, rank_rngs)? } else { checkpoint_path(&self.model_dir, tag) };
        self.barrier()?;
        Ok(path)
    }

    /// Saves the trained model as `final.safetensors` with its YAML (WeNet's
    /// `final.pt`): the weights only, no resume state.
    pub fn save_final(&mut self) -> Result<PathBuf> {
        let path = if self.is_main() {
            let mut infos = Mapping::new();
            infos.insert("epoch".into(), Value::from(self.position.epoch));
            infos.insert("step".into(), Value::from(self.position.step));
            infos.insert("lr".into(), Value::from(self.optim.scheduler.lr()));
            save_model(&self.model, &self.model_dir, "final", infos, &self.cfg.root, None)?
        } else {
            checkpoint_path(&self.model_dir, "final")
        };
        self.barrier()?;
        Ok(path)
    }

    /// Every rank's default generator, in rank order (empty on one
    /// process): each rank puts its seed and offset, as 32-bit halves (exact
    /// in f64), into its own slot of a sum over ranks.
    pub fn gather_rngs(&mut self) -> Result<Vec<Rng>> {
        let world = self.engine.world_size();
        if world == 1 {
            return Ok(Vec::new());
        }
        let g = rng::get_state();
        let mut v = vec![0.0; 4 * world];
        let r = self.engine.rank();
        v[4 * r..4 * r + 4].copy_from_slice(&[(g.seed >> 32) as f64, (g.seed & 0xffff_ffff) as f64, (g.offset >> 32) as f64, (g.offset & 0xffff_ffff) as f64]);
        self.engine.all_reduce_sum(&mut v)?;
        Ok(v.chunks_exact(4).map(|c| Rng { seed: ((c[0] as u64) << 32) | c[1] as u64, offset: ((c[2] as u64) << 32) | c[3] as u64 }).collect())
    }

    fn save_main(&self, tag: &str, epoch: u64, cv_loss: Option<f64>, rank_rngs: Vec<Rng>) -> Result<PathBuf> {
        let mut infos = Mapping::new();
        infos.insert("epoch".into(), Value::from(epoch));
        infos.insert("step".into(), Value::from(self.position.step));
        infos.insert("lr".into(), Value::from(self.optim.scheduler.lr()));
        if let Some(c) = cv_loss {
            infos.insert("cv_loss".into(), Value::from(c));
        }
        let state = if self.save_optimizer_state { Some(self.train_state(rank_rngs)?) } else { None };
        save_model(&self.model, &self.model_dir, tag, infos, &self.cfg.root, state.as_ref())
    }

    /// Trains the epoch at `self.position` from its current batch to its
    /// end — with a join group, to the step where the first rank runs out:
    /// every rank ends there, and an accumulation left incomplete is dropped
    /// on every rank alike.
    pub fn train_epoch(&mut self, loader: &DataLoader) -> Result<()> {
        let epoch = self.position.epoch;
        self.model.train(true);
        self.engine.zero_grad();
        self.drop_pending();
        let bar = progress_bar(epoch, self.last_epoch_batches);
        let (start, mut frames, mut ok, mut failed) = (Instant::now(), 0usize, 0usize, 0usize);
        let mut last_err = None;
        let mut it = loader.resume(epoch, self.position.batches);
        let mut window = (Instant::now(), 0usize, 0u64);
        loop {
            let next = it.next();
            if let Some(j) = self.join.as_mut() {
                if !j.all_have_batch(next.is_some())? {
                    break;
                }
            }
            let Some(batch) = next else { break };
            self.position.batches = it.position();
            match self.train_batch(&batch) {
                Ok(bl) => {
                    ok += 1;
                    frames += bl.frames;
                    window.1 += bl.frames;
                }
                Err(e) if self.engine.world_size() > 1 => {
                    // The other ranks are already in this batch's collectives: skipping it here would desynchronise them.
                    return Err(Error::dist(
                        "train_batch",
                        self.engine.rank(),
                        format!("epoch {epoch} batch {}: {e} (a failed batch ends a distributed run)", it.position()),
                    ));
                }
                Err(e) => {
                    eprintln!("warning: epoch {epoch} batch {}: skipped, {e}", it.position());
                    self.restore_buffers()?;
                    self.engine.zero_grad();
                    self.drop_pending();
                    failed += 1;
                    last_err = Some(e);
                    continue;
                }
            }
            if self.step_due() {
                let rep = self.optimizer_step()?;
                window.2 += 1;
                if let Some(n) = self.cfg.save_interval {
                    if rep.step % n == 0 {
                        self.save(&format!("step_{}", rep.step), epoch, None)?;
                    }
                }
            }
            if let Some(b) = &bar {
                b.inc(1);
                b.set_message(format!("{:.0} frames/s", frames as f64 / start.elapsed().as_secs_f64().max(1e-9)));
            }
            if it.position() % self.cfg.log_interval == 0 && self.is_main() {
                // Read already when a step ended with this batch; else the one wait of a log line.
                self.read_losses()?;
                let secs = window.0.elapsed().as_secs_f64().max(1e-9);
                let line = self.log_line(epoch, it.position(), window.2 as f64 / secs, window.1 as f64 / secs);
                let line = match self.last_epoch_batches {
                    // Batches done out of the epoch's (the last epoch's count) and the time left at this epoch's rate.
                    Some(total) => {
                        let done = it.position().max(1);
                        let eta = start.elapsed().as_secs_f64() / done as f64 * total.saturating_sub(done) as f64;
                        format!("{line} [{done}/{total} batches, ETA {eta:.0} s]")
                    }
                    None => line,
                };
                match &bar {
                    Some(b) => b.println(line),
                    None => eprintln!("{line}"),
                }
                window = (Instant::now(), 0, 0);
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if let Some(s) = it.summary() {
            self.last_epoch_batches = Some(s.batches);
            if let Some(w) = self.writer.as_mut() {
                w.add_scalar("epoch/padding_fraction", s.padding_fraction() as f32, epoch as i64)?;
            }
        }
        if !self.pending.is_empty() {
            // An incomplete accumulation at the epoch's end is dropped (as WeNet does).
            self.engine.zero_grad();
            self.drop_pending();
        }
        self.buffer_snapshot = None;
        if ok == 0 && failed > 0 {
            return Err(last_err.unwrap_or_else(|| Error::Msg("every batch failed".into())));
        }
        let ranks = self.gather_epoch_data(it.position(), it.summary().map(|s| &s.skips))?;
        let per_rank: Vec<String> = ranks.iter().enumerate().map(|(r, (_, s))| format!("rank {r} {}", s.summary())).collect();
        let empty: Vec<String> = ranks
            .iter()
            .enumerate()
            .filter(|(_, (batches, _))| *batches == 0)
            .map(|(r, (_, s))| format!("rank {r} formed 0 batches ({})", s.summary()))
            .collect();
        if !empty.is_empty() {
            return Err(Error::Msg(format!(
                "epoch {epoch}: no training data: {} from {}; expected at least one batch on every rank (check the list, --data_type and the files it names); data per rank: {}",
                empty.join(", "),
                loader.list_path(),
                per_rank.join("; ")
            )));
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        if self.is_main() {
            eprintln!(
                "epoch {epoch}: trained {ok} batches ({failed} failed, {} steps skipped so far, {} sequences with an infeasible CTC target zeroed so far) in {secs:.1} s, {:.0} frames/s",
                self.skipped_steps,
                self.ctc_zeroed,
                frames as f64 / secs
            );
            if ranks.len() > 1 {
                eprintln!("epoch {epoch}: data per rank: {}", per_rank.join("; "));
            }
        }
        Ok(())
    }

    /// Every rank's batch count for the epoch (counting batches skipped on
    /// resume) and its data skips, in rank order: each rank puts its numbers
    /// into its own slots of a sum over ranks, so rank 0 can report them all.
    /// A rank stopped early by the join reports the skips it has seen so far.
    fn gather_epoch_data(&mut self, batches: usize, skips: Option<&SkipStats>) -> Result<Vec<(usize, SkipStats)>> {
        let (world, rank) = (self.engine.world_size(), self.engine.rank());
        let per = 1 + SkipReason::ALL.len();
        let mut v = vec![0.0; per * world];
        v[per * rank] = batches as f64;
        for (i, r) in SkipReason::ALL.iter().enumerate() {
            v[per * rank + 1 + i] = skips.map_or(0, |s| s.count(*r)) as f64;
        }
        if world > 1 {
            self.engine.all_reduce_sum(&mut v)?;
        }
        Ok(v.chunks_exact(per)
            .map(|c| {
                let mut s = SkipStats::with_log(false);
                for (i, r) in SkipReason::ALL.iter().enumerate() {
                    s.add_count(*r, c[1 + i].round() as usize);
                }
                (c[0].round() as usize, s)
            })
            .collect())
    }

    fn log_line(&self, epoch: u64, batch: usize, steps_s: f64, frames_s: f64) -> String {
        let last = self.history.last();
        let b = self.last_batch.unwrap_or_default();
        let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.6}"));
        format!(
            "train epoch {epoch} batch {batch} step {}: loss {:.6} loss_ctc {} loss_att {} acc {} lr {:.3e} grad_norm {:.3}, {steps_s:.2} steps/s, {frames_s:.0} frames/s",
            self.position.step,
            b.loss,
            f(b.loss_ctc),
            f(b.loss_att),
            f(b.acc),
            last.map_or(self.optim.scheduler.lr(), |r| r.lr),
            last.map_or(0.0, |r| r.grad_norm)
        )
    }

    /// Cross-validation over `loader` (this rank's part of the cv list),
    /// without gradients; the sums are reduced over every rank, so the
    /// losses are means over the whole list weighted by utterances.
    pub fn cv(&mut self, loader: &DataLoader) -> Result<CvResult> {
        self.model.train(false);
        let r = self.cv_sums(loader);
        self.model.train(true);
        // [loss·n, ctc·n, att·n, acc·n, n, batches with ctc, with att, with acc]
        let mut sums = r?;
        self.engine.all_reduce_sum(&mut sums)?;
        let utts = sums[4].round() as usize;
        if utts == 0 {
            return Err(Error::Msg("cv: the cv data produced no batch".into()));
        }
        let n = sums[4];
        if !sums[0].is_finite() {
            return Err(Error::Msg(format!(
                "epoch {}: cv loss is {} over {utts} utterances (ctc {}, att {}): the model holds non-finite values; \
                 not saving epoch_{}: resume from an earlier checkpoint with a smaller learning rate",
                self.position.epoch,
                sums[0] / n,
                sums[1] / n,
                sums[2] / n,
                self.position.epoch
            )));
        }
        let r = CvResult {
            loss: sums[0] / n,
            loss_ctc: (sums[5] > 0.0).then_some(sums[1] / n),
            loss_att: (sums[6] > 0.0).then_some(sums[2] / n),
            acc: (sums[7] > 0.0).then_some(sums[3] / n),
            utts,
        };
        if let Some(w) = self.writer.as_mut() {
            // WeNet's tags (train_utils.log_per_epoch): epoch/cv_<name> and epoch/lr_<group> per epoch.
            let e = self.position.epoch as i64;
            w.add_scalar("epoch/cv_loss", r.loss as f32, e)?;
            w.add_scalar("epoch/lr_0", self.optim.scheduler.lr() as f32, e)?;
            for (tag, v) in [("epoch/cv_loss_ctc", r.loss_ctc), ("epoch/cv_loss_att", r.loss_att), ("epoch/cv_acc", r.acc)] {
                if let Some(v) = v {
                    w.add_scalar(tag, v as f32, e)?;
                }
            }
            w.flush()?;
        }
        Ok(r)
    }

    fn cv_sums(&mut self, loader: &DataLoader) -> Result<Vec<f64>> {
        let mut sums = vec![0.0; 8];
        let mut add = |n: f64, v: LossValues| -> Result<()> {
            let (loss, parts) = v.get()?;
            sums[0] += loss * n;
            for (i, v) in parts.into_iter().enumerate() {
                if let Some(v) = v {
                    sums[1 + i] += v * n;
                    sums[5 + i] += 1.0;
                }
            }
            sums[4] += n;
            Ok(())
        };
        // A batch's values are read after the next batch's forward is
        // queued: on a GPU the host waits while that forward runs, so the
        // device does not idle while the host loads and queues a batch.
        let mut queued = None;
        for b in loader.epoch(self.position.epoch) {
            let out = autograd::no_grad(|| self.forward(&b))?;
            if let Some((n, v)) = queued.replace((b.len() as f64, out.values_later()?)) {
                add(n, v)?;
            }
        }
        if let Some((n, v)) = queued {
            add(n, v)?;
        }
        Ok(sums)
    }

    /// After the cv of an epoch: save `epoch_N` positioned at the next epoch's start.
    pub fn finish_epoch(&mut self, cv: &CvResult) -> Result<PathBuf> {
        let done = self.position.epoch;
        self.position = Position { epoch: done + 1, batches: 0, step: self.position.step };
        let path = self.save(&format!("epoch_{done}"), done, Some(cv.loss))?;
        if self.is_main() {
            eprintln!("epoch {done}: cv loss {:.6} over {} utterances, saved {}", cv.loss, cv.utts, path.display());
        }
        Ok(path)
    }
}

/// The epoch's bar on a terminal: batches done out of `total` (the last
/// epoch's count; a counter without a total in the first epoch), frames/s and ETA.
fn progress_bar(epoch: u64, total: Option<usize>) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let (b, template) = match total {
        Some(n) => (indicatif::ProgressBar::new(n as u64), "epoch {prefix} [{bar:30}] {pos}/{len} batches, {msg}, ETA {eta}"),
        None => (indicatif::ProgressBar::new_spinner(), "epoch {prefix} {spinner} {pos} batches, {msg}"),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        b.set_style(style.progress_chars("=> "));
    }
    b.set_prefix(epoch.to_string());
    Some(b)
}
