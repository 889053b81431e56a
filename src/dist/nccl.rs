//! `NcclComm`: the `Communicator` for GPU tensors over NCCL
//! (`--dist_backend nccl`), NCCL loaded at run time (`backend::cuda::nccl`).
//!
//! Set-up: rank 0 creates NCCL's unique id and publishes it in the
//! rendezvous store under `{prefix}/nccl_id`; every rank reads it (within
//! the timeout) and initialises its communicator on its own device.
//! Collectives run on device tensors of f32, f16, bf16 (and f64, i64) in
//! place or into caller-allocated outputs, on a communication stream
//! ordered against the compute stream by events; host tensors (the engines'
//! scalar sums, DDP's host-staged buckets) are copied to the device and
//! back. Each call waits by polling NCCL's asynchronous error, so a dead or
//! stopped peer fails the call within the timeout, named; the communicator
//! is then aborted (the peers' calls fail too) and never used again. A
//! clean communicator is destroyed on drop.
//!
//! This code runs only where a GPU and NCCL are present; nothing in the
//! tests pretends to run it (the emulated device has no CUDA stream).

use super::comm::{Communicator, ReduceOp};
use super::store::Store;
use crate::backend::cuda::nccl::{unique_id, NcclHandle, RedOp};
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Tensor};
use std::time::Duration;

/// A group of processes running collectives over NCCL on one GPU each.
pub struct NcclComm {
    rank: usize,
    world: usize,
    timeout: Duration,
    device: Device,
    handle: Option<NcclHandle>,
    /// Why the communicator is unusable (after an error or an abort).
    broken: Option<String>,
}

fn red(op: ReduceOp) -> RedOp {
    match op {
        ReduceOp::Sum => RedOp::Sum,
        ReduceOp::Avg => RedOp::Avg,
        ReduceOp::Max => RedOp::Max,
        ReduceOp::Min => RedOp::Min,
    }
}

impl NcclComm {
    /// Rank `rank` of `world` on `device` (a GPU): the unique id through
    /// `store` under `{prefix}/nccl_id`, then NCCL's initialisation.
    pub fn new(store: &Store, prefix: &str, rank: usize, world: usize, device: &Device, timeout: Duration) -> Result<NcclComm> {
        const OP: &str = "nccl init";
        let Device::Cuda(ordinal) = *device else {
            return Err(Error::invalid(OP, format!("NCCL runs on a GPU; found {device:?}")));
        };
        let dev = crate::backend::cuda::device(ordinal)?;
        let key = format!("{prefix}/nccl_id");
        let id = if rank == 0 {
            let id = unique_id()?;
            store.set(&key, &id)?;
            id
        } else {
            store.get_timeout(&key, timeout).map_err(|e| Error::dist(OP, rank, format!("rank 0 did not publish NCCL's unique id under '{key}': {e}")))?
        };
        let handle = NcclHandle::init(&dev, &id, world, rank, true, timeout).map_err(|e| Error::dist(OP, rank, format!("{e}")))?;
        Ok(NcclComm { rank, world, timeout, device: *device, handle: Some(handle), broken: None })
    }

    fn handle(&mut self, op: &'static str) -> Result<&mut NcclHandle> {
        if let Some(why) = &self.broken {
            return Err(Error::dist(op, self.rank, format!("the NCCL communicator was aborted earlier: {why}")));
        }
        let rank = self.rank;
        self.handle.as_mut().ok_or_else(|| Error::dist(op, rank, "the NCCL communicator is closed"))
    }

    /// Takes the handle out for one call (put it back after).
    fn take(&mut self, op: &'static str) -> Result<NcclHandle> {
        self.handle(op)?;
        let rank = self.rank;
        self.handle.take().ok_or_else(|| Error::dist(op, rank, "the NCCL communicator is closed"))
    }

    /// After an error: abort (so the peers fail too) and keep the reason.
    fn fail(&mut self, op: &'static str, e: Error) -> Error {
        let msg = format!("{e} (rank {} of {}; the communicator was aborted)", self.rank, self.world);
        if let Some(h) = &mut self.handle {
            h.abort();
        }
        self.broken = Some(msg.clone());
        Error::dist(op, self.rank, msg)
    }

    /// `t` itself when on this communicator's device, else a device copy.
    fn on_device(&self, t: &Tensor) -> Result<(Tensor, bool)> {
        if t.device() == self.device {
            return Ok((t.clone(), false));
        }
        if t.device() != Device::Cpu {
            return Err(Error::DeviceMismatch { op: "nccl", lhs: self.device, rhs: t.device() });
        }
        Ok((t.detach().to_device(&self.device)?, true))
    }

    fn copy_back(t: &Tensor, d: &Tensor, staged: bool) -> Result<()> {
        if staged {
            t.assign(&d.detach().to_device(&Device::Cpu)?)?;
        }
        Ok(())
    }

    fn check_dtype(op: &'static str, t: &Tensor) -> Result<()> {
        match t.dtype() {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 | DType::I64 => Ok(()),
            d => Err(Error::UnsupportedDType { op, dtype: d, supported: "f32, f16, bf16, f64, i64" }),
        }
    }

    /// All-reduces several tensors in one NCCL group (one launch, one wait).
    pub fn all_reduce_many(&mut self, ts: &[&Tensor], op: ReduceOp) -> Result<()> {
        const OP: &str = "all_reduce";
        let mut dev = Vec::with_capacity(ts.len());
        for t in ts {
            Self::check_dtype(OP, t)?;
            dev.push(self.on_device(t)?);
        }
        let timeout = self.timeout;
        let guards: Vec<_> = dev.iter().map(|(d, _)| d.storage()).collect();
        let mut bufs = Vec::with_capacity(guards.len());
        for g in &guards {
            match &**g {
                Storage::Cuda(c) => bufs.push(c),
                #[allow(unreachable_patterns)]
                _ => return Err(Error::invalid(OP, "expected device storage")),
            }
        }
        let r = self.handle(OP)?.all_reduce(&bufs, red(op), timeout);
        drop(bufs);
        drop(guards);
        r.map_err(|e| self.fail(OP, e))?;
        for (t, (d, staged)) in ts.iter().zip(&dev) {
            Self::copy_back(t, d, *staged)?;
        }
        Ok(())
    }
}

/// Runs `f` on the device storages of `a` and `b`.
fn with_two<R>(a: &Tensor, b: &Tensor, f: impl FnOnce(&crate::backend::cuda::CudaStorage, &crate::backend::cuda::CudaStorage) -> Result<R>) -> Result<R> {
    let (ga, gb) = (a.storage(), b.storage());
    match (&*ga, &*gb) {
        (Storage::Cuda(x), Storage::Cuda(y)) => f(x, y),
        #[allow(unreachable_patterns)]
        _ => Err(Error::invalid("nccl", "expected device storages")),
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn all_reduce(&mut self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_many(&[t], op)
    }

    fn broadcast(&mut self, t: &Tensor, root: usize) -> Result<()> {
        const OP: &str = "broadcast";
        if root >= self.world {
            return Err(Error::invalid(OP, format!("root {root} is not a rank of a group of {}", self.world)));
        }
        let (d, staged) = self.on_device(t)?;
        let timeout = self.timeout;
        let r = {
            let g = d.storage();
            match &*g {
                Storage::Cuda(c) => self.handle(OP)?.broadcast(c, root, timeout),
                #[allow(unreachable_patterns)]
                _ => Err(Error::invalid(OP, "expected device storage")),
            }
        };
        r.map_err(|e| self.fail(OP, e))?;
        Self::copy_back(t, &d, staged)
    }

    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<()> {
        const OP: &str = "all_gather";
        let n = input.elem_count();
        if output.elem_count() != self.world * n || output.dtype() != input.dtype() {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("an output of {} x {n} = {} {} elements", self.world, self.world * n, input.dtype().as_str()),
                got: format!("{} {} elements", output.elem_count(), output.dtype().as_str()),
            });
        }
        Self::check_dtype(OP, input)?;
        let (i, _) = self.on_device(input)?;
        let (o, staged) = self.on_device(output)?;
        let timeout = self.timeout;
        let mut h = self.take(OP)?;
        let r = with_two(&i, &o, |x, y| h.all_gather(x, y, timeout));
        self.handle = Some(h);
        r.map_err(|e| self.fail(OP, e))?;
        Self::copy_back(output, &o, staged)
    }

    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()> {
        const OP: &str = "reduce_scatter";
        let n = output.elem_count();
        if input.elem_count() != self.world * n || output.dtype() != input.dtype() {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("an input of {} x {n} = {} {} elements", self.world, self.world * n, output.dtype().as_str()),
                got: format!("{} {} elements", input.elem_count(), input.dtype().as_str()),
            });
        }
        Self::check_dtype(OP, input)?;
        let (i, _) = self.on_device(input)?;
        let (o, staged) = self.on_device(output)?;
        let timeout = self.timeout;
        let mut h = self.take(OP)?;
        let r = with_two(&i, &o, |x, y| h.reduce_scatter(x, y, red(op), timeout));
        self.handle = Some(h);
        r.map_err(|e| self.fail(OP, e))?;
        Self::copy_back(output, &o, staged)
    }

    fn device_collectives(&self) -> bool {
        true
    }

    fn barrier(&mut self) -> Result<()> {
        let t = Tensor::zeros([1], DType::F32, &self.device)?;
        self.all_reduce(&t, ReduceOp::Sum)
    }

    fn abort(&mut self, reason: &str) {
        if self.broken.is_some() {
            return;
        }
        if let Some(h) = &mut self.handle {
            h.abort();
        }
        self.broken = Some(reason.to_string());
    }
}
