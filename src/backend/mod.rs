//! One implementation of every op per device. The CPU backend is the
//! reference; the CUDA backend (feature `cuda`) is checked against it.

pub mod cpu;
pub mod cuda;

use crate::tensor::DType;

/// A tensor's storage on one device.
#[derive(Debug)]
pub enum Storage {
    Cpu(cpu::CpuStorage),
    Cuda(cuda::CudaStorage),
}

impl Storage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }
    /// Bytes held.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len() * s.dtype().size_in_bytes(),
            Storage::Cuda(s) => s.size_in_bytes(),
        }
    }
}
