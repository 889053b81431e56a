//! WeNet's `wrap_model`: the engine `--train_engine` names, holding the
//! model's parameters and the optimizer built from `init_optimizer_and_scheduler`'s
//! settings, with the optimizer state of a resume restored.

use super::{Distributed, Resume, TrainArgs};
use crate::engine::{Ddp, Engine, SingleProcess, DEFAULT_BUCKET_BYTES};
use crate::error::{Error, Result};
use crate::models::AsrModel;
use crate::nn::Module;
use crate::optim::AdamConfig;

/// The engine for this job: single-process `torch_ddp` on one process,
/// DDP over several. Restores the resume state's optimizer state.
pub fn wrap_model(model: &AsrModel, args: &TrainArgs, dist: &mut Distributed, adam: AdamConfig, resume: &Resume) -> Result<Box<dyn Engine>> {
    let world = dist.info.world_size;
    let grad_sync = super::device::grad_sync_dtype(args)?;
    let mut engine: Box<dyn Engine> = match args.train_engine.as_str() {
        "torch_ddp" if world == 1 => Box::new(SingleProcess::new(model.named_parameters(), adam)?),
        "torch_ddp" => {
            let comm = dist.comm.take().ok_or_else(|| {
                Error::dist(
                    "wrap_model",
                    dist.info.rank,
                    format!("torch_ddp over {world} processes needs the communicator init_distributed opens (was it taken already?)"),
                )
            })?;
            let ddp = Ddp::new(model.named_parameters(), &model.named_buffers(), adam, comm, DEFAULT_BUCKET_BYTES)?.with_half_grad_sync(grad_sync)?;
            if let (Some(d), 0) = (ddp.grad_sync_dtype(), dist.info.rank) {
                eprintln!("torch_ddp: gradient buckets are all-reduced in {} (--fp16_grad_sync)", d.as_str());
            }
            Box::new(ddp)
        }
        "deepspeed" => super::deepspeed::deepspeed_engine(model, args, dist, adam)?,
        other => return Err(Error::config("--train_engine", format!("expected torch_ddp or deepspeed, found {other:?}"))),
    };
    if let Some(s) = &resume.state {
        engine.load_optimizer_state(&s.optimizer)?;
    }
    Ok(engine)
}
