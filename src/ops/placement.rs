//! Reaching an operand's storage on the device an op runs on: the CPU or
//! GPU storage behind a guard (a typed error if it is elsewhere), and a GPU
//! copy of a small host operand (an index list or a mask built on the CPU).

use crate::backend::cpu::CpuStorage;
use crate::backend::cuda::CudaStorage;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::Device;

fn device_of(s: &Storage) -> Device {
    match s {
        Storage::Cpu(_) => Device::Cpu,
        Storage::Cuda(g) => Device::Cuda(g.ordinal()),
    }
}

/// The CPU storage of an operand of an op running on the CPU.
pub(crate) fn as_cpu<'a>(op: &'static str, s: &'a Storage) -> Result<&'a CpuStorage> {
    match s {
        Storage::Cpu(c) => Ok(c),
        other => Err(Error::DeviceMismatch { op, lhs: Device::Cpu, rhs: device_of(other) }),
    }
}

/// The GPU storage of an operand of an op running on `like`'s GPU.
pub(crate) fn as_gpu<'a>(op: &'static str, s: &'a Storage, like: &CudaStorage) -> Result<&'a CudaStorage> {
    match s {
        Storage::Cuda(g) if g.ordinal() == like.ordinal() => Ok(g),
        other => Err(Error::DeviceMismatch { op, lhs: Device::Cuda(like.ordinal()), rhs: device_of(other) }),
    }
}

/// A GPU operand, borrowed when it already is on the GPU, else copied there.
pub(crate) enum OnGpu<'a> {
    Borrowed(&'a CudaStorage),
    Owned(CudaStorage),
}

impl std::ops::Deref for OnGpu<'_> {
    type Target = CudaStorage;
    fn deref(&self) -> &CudaStorage {
        match self {
            OnGpu::Borrowed(g) => g,
            OnGpu::Owned(g) => g,
        }
    }
}

/// `s` on `like`'s GPU: borrowed if there, copied from the host if on the CPU.
pub(crate) fn to_gpu<'a>(op: &'static str, s: &'a Storage, like: &CudaStorage) -> Result<OnGpu<'a>> {
    match s {
        Storage::Cpu(c) => Ok(OnGpu::Owned(CudaStorage::from_cpu(like.device(), c)?)),
        other => as_gpu(op, other, like).map(OnGpu::Borrowed),
    }
}
