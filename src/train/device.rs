//! Where and in what precision a run trains: `--device cpu|cuda` (the GPU
//! numbered LOCAL_RANK, as torchrun's one process per GPU) and `--dtype` /
//! `--use_amp` (autocast to f16 with the loss scaler, or to bf16 without).

use super::{DistInfo, TrainArgs};
use crate::error::{Error, Result};
use crate::models::AsrModel;
use crate::nn::Module;
use crate::tensor::{DType, Device};

/// The autocast half type of a run: f16 for `--use_amp` or `--dtype fp16`,
/// bf16 for `--dtype bf16`, none for fp32.
pub fn amp_dtype(args: &TrainArgs) -> Result<Option<DType>> {
    match (args.use_amp, args.dtype.as_str()) {
        (true, "bf16") => Err(Error::config("--dtype", "bf16 trains without the loss scaler; drop --use_amp (which means fp16)")),
        (true, _) | (false, "fp16") => Ok(Some(DType::F16)),
        (false, "bf16") => Ok(Some(DType::BF16)),
        (false, "fp32" | "") => Ok(None),
        (false, other) => Err(Error::config("--dtype", format!("expected fp32, fp16 or bf16, found {other:?}"))),
    }
}

/// The half type DDP's gradient buckets travel in with `--fp16_grad_sync`:
/// bf16 when the run trains in bf16 (`--dtype bf16`, PyTorch's
/// bf16_compress_hook), f16 otherwise (fp16_compress_hook, WeNet's choice);
/// none without the flag. For `--train_engine deepspeed` the JSON decides
/// the precision: see `deepspeed::zero_grad_sync_dtype`.
pub fn grad_sync_dtype(args: &TrainArgs) -> Result<Option<DType>> {
    if !args.fp16_grad_sync {
        return Ok(None);
    }
    Ok(Some(if amp_dtype(args)? == Some(DType::BF16) { DType::BF16 } else { DType::F16 }))
}

/// Sets how the GPU's matrix products run: TF32 for f32 products when
/// `--tf32` or the config's `tf32: true` asks (off otherwise, as in
/// PyTorch), and cuBLASLt's workspace from `cublaslt_workspace_mib`.
pub fn init_gemm(args: &TrainArgs, cfg: &super::TrainConfig) {
    crate::backend::cuda::blas::set_allow_tf32(args.tf32 || cfg.tf32);
    if let Some(mib) = cfg.cublaslt_workspace_mib {
        crate::backend::cuda::blaslt::set_workspace_mib(mib as usize);
    }
}

/// Sets the fusion switch from `ASRFORGE_FUSION` or the config's `fusion:`
/// (see [`crate::ops::fusion`]); a word it does not know is an error.
pub fn init_fusion(cfg: &super::TrainConfig) -> Result<()> {
    crate::ops::fusion::configure(cfg.fusion.as_deref())
}

/// The device of a run: the CPU, or `cuda:LOCAL_RANK` (a clean error when
/// that GPU cannot be used).
pub fn init_device(args: &TrainArgs, dist: &DistInfo) -> Result<Device> {
    match args.device.as_str() {
        "cpu" | "" => Ok(Device::Cpu),
        "cuda" => Device::cuda(dist.local_rank).map_err(|e| Error::config("--device", format!("cuda (LOCAL_RANK {}): {e}", dist.local_rank))),
        other => Err(Error::config("--device", format!("expected cpu or cuda, found {other:?}"))),
    }
}

/// Moves every float parameter and buffer of `model` to `device` in place
/// (the handles the optimizer and engine hold see the moved storage).
/// Integer buffers (BatchNorm's `num_batches_tracked`) are host counters and
/// stay on the CPU.
pub fn move_model(model: &AsrModel, device: &Device) -> Result<()> {
    for t in model.state_dict() {
        if !matches!(t.tensor.dtype(), DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
            continue;
        }
        t.tensor.move_to_device(device).map_err(|e| Error::Msg(format!("moving {} to {device:?}: {e}", t.name)))?;
    }
    Ok(())
}
