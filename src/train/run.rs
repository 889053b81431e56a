//! `asrforge train`: WeNet's training steps, one call each.

use super::*;
use crate::error::Result;
use crate::tensor::rng;

/// Runs a training job to `max_epoch`; returns the executor at its end.
pub fn run_train(args: &TrainArgs) -> Result<Executor> {
    let root = read_config(&args.config, &args.override_config)?;
    let dist = init_distributed(args)?;
    let device = init_device(args, &dist)?;
    let autocast = amp_dtype(args)?;
    let cfg = check_modify_and_save_config(root, args)?;
    let (train_loader, cv_loader) = init_dataset_and_dataloader(args, &cfg, &dist)?;
    rng::manual_seed(args.seed);
    let (model, resume) = init_model(args, &cfg)?;
    // Checkpoints load to the CPU; the model then moves to its device.
    device::move_model(&model, &device)?;
    print_model(&model, &dist);
    let writer = init_summary_writer(args, &dist)?;
    let engine = wrap_model(&model, args, &dist)?;
    let optim = init_optimizer_and_scheduler(&cfg, engine.parameters(), &resume)?;
    let scaler = init_scaler(args, &resume);
    if let Some(s) = &resume.state {
        rng::set_state(s.rng);
    }
    let mut exec = Executor::new(model, engine, optim, scaler, writer, cfg, args.model_dir.clone(), resume.position());
    exec.device = device;
    exec.autocast = autocast;
    if args.checkpoint.is_none() {
        exec.save("init", 0, None)?;
    }
    while exec.position.epoch < exec.cfg.max_epoch {
        exec.train_epoch(&train_loader)?;
        let cv = exec.cv(&cv_loader)?;
        exec.finish_epoch(&cv)?;
    }
    Ok(exec)
}
