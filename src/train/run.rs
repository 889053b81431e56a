//! `asrforge train`: WeNet's training steps, one call each.

use super::*;
use crate::error::Result;
use crate::tensor::rng;

/// Runs a training job to `max_epoch`; returns the executor at its end.
pub fn run_train(args: &TrainArgs) -> Result<Executor> {
    let root = read_config(&args.config, &args.override_config)?;
    let mut dist = init_distributed(args)?;
    let device = init_device(args, &dist.info)?;
    let autocast = amp_dtype(args)?;
    let cfg = check_modify_and_save_config(root, args, &dist.info)?;
    device::init_gemm(args, &cfg);
    device::init_fusion(&cfg)?;
    let (train_loader, cv_loader) = init_dataset_and_dataloader(args, &cfg, &dist.info)?;
    rng::manual_seed(args.seed);
    let (model, resume) = init_model(args, &cfg)?;
    // Checkpoints load to the CPU; the model then moves to its device.
    device::move_model(&model, &device)?;
    print_model(&model, &dist.info);
    let writer = init_summary_writer(args, &dist.info)?;
    let optim = init_optimizer_and_scheduler(&cfg, &resume)?;
    let engine = wrap_model(&model, args, &mut dist, optim.adam, &resume)?;
    let scaler = if deepspeed::is_deepspeed(args) { deepspeed::deepspeed_scaler(args, &resume)? } else { init_scaler(args, &resume) };
    if let Some(s) = &resume.state {
        rng::set_state(s.rng_for(dist.info.rank));
    }
    let mut exec = Executor::new(ExecutorParts {
        model,
        engine,
        optim,
        cfg,
        scaler,
        writer,
        model_dir: args.model_dir.clone(),
        position: resume.position(),
        join: dist.join.take(),
        save_optimizer_state: deepspeed::saves_optimizer_state(args)?,
        device,
        autocast,
    });
    let ran = (|| {
        if args.checkpoint.is_none() {
            exec.save("init", 0, None)?;
        }
        while exec.position.epoch < exec.cfg.max_epoch {
            exec.train_epoch(&train_loader)?;
            let cv = exec.cv(&cv_loader)?;
            exec.finish_epoch(&cv)?;
        }
        exec.save_final()
    })();
    if let Err(e) = ran {
        exec.abort(&e);
        return Err(e);
    }
    Ok(exec)
}
