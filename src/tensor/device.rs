//! `Device`: where a tensor's storage lives.

use crate::error::{Error, Result};

/// A device. `Cuda(n)` is the n-th visible GPU (the CUDA backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

impl Device {
    /// The n-th GPU, or an error saying why no GPU can be used.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        crate::backend::cuda::check_available(ordinal)?;
        Ok(Device::Cuda(ordinal))
    }
    /// Parses `cpu`, `cuda`, `cuda:N`.
    pub fn parse(s: &str) -> Result<Device> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Device::cuda(0),
            _ => match s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
                Some(n) => Device::cuda(n),
                None => Err(Error::invalid("device", format!("expected cpu, cuda or cuda:N, got {s:?}"))),
            },
        }
    }
    /// The devices tests run every op on: the CPU, plus GPU 0 when one is usable.
    pub fn available() -> Vec<Device> {
        let mut v = vec![Device::Cpu];
        if crate::backend::cuda::check_available(0).is_ok() {
            v.push(Device::Cuda(0));
        }
        v
    }
}
