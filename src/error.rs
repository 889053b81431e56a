//! The crate's typed errors. Every message says what was expected and what was found.

use crate::tensor::{DType, Device, Shape};

/// Every error asrforge returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two shapes that had to agree do not.
    #[error("{op}: shape mismatch, expected {expected}, got {got}")]
    ShapeMismatch { op: &'static str, expected: String, got: String },

    /// Two shapes that cannot be broadcast together.
    #[error("{op}: cannot broadcast shapes {lhs:?} and {rhs:?}")]
    Broadcast { op: &'static str, lhs: Shape, rhs: Shape },

    /// A tensor of the wrong dtype.
    #[error("{op}: expected dtype {expected:?}, got {got:?}")]
    DTypeMismatch { op: &'static str, expected: DType, got: DType },

    /// An op that has no implementation for this dtype.
    #[error("{op}: dtype {dtype:?} is not supported (supported: {supported})")]
    UnsupportedDType { op: &'static str, dtype: DType, supported: &'static str },

    /// Tensors on different devices.
    #[error("{op}: tensors on different devices, {lhs:?} and {rhs:?}")]
    DeviceMismatch { op: &'static str, lhs: Device, rhs: Device },

    /// A dimension index outside the tensor's rank.
    #[error("{op}: dim {dim} is out of range for a tensor of rank {rank}")]
    DimOutOfRange { op: &'static str, dim: isize, rank: usize },

    /// An index outside the valid range.
    #[error("{op}: index {index} is out of range, expected 0 <= index < {size}")]
    IndexOutOfRange { op: &'static str, index: i64, size: usize },

    /// Any other bad argument, with the op and the reason.
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },

    /// A tensor on a GPU reached an op family that has no CUDA kernel yet.
    #[error("{op}: no CUDA kernel yet for a tensor on {device:?}; move it to the CPU with to_device(&Device::Cpu)")]
    NoCudaKernel { op: &'static str, device: Device },

    /// The CUDA backend cannot be used.
    #[error("CUDA backend unavailable: {0}")]
    CudaUnavailable(String),

    /// A CUDA driver call or kernel launch that failed, naming the kernel
    /// (`module/kernel`) or the driver call.
    #[error("CUDA {kernel}: {msg}")]
    Cuda { kernel: String, msg: String },

    /// A GPU allocation the device could not satisfy even after the cache was
    /// emptied, with the size asked and the pool's state.
    #[error("CUDA out of memory on cuda:{ordinal}: tried to allocate {requested} bytes ({requested_mib:.1} MiB); pool: {in_use} bytes in use, {cached} cached, {reserved} reserved, peak {peak}; device: {device_free} of {device_total} bytes free")]
    CudaOutOfMemory {
        ordinal: usize,
        requested: usize,
        requested_mib: f64,
        in_use: usize,
        cached: usize,
        reserved: usize,
        peak: usize,
        device_free: usize,
        device_total: usize,
    },

    /// A host allocation the system refused, with its size and purpose.
    #[error("{op}: out of host memory, cannot allocate {bytes} bytes ({gib:.2} GiB)")]
    HostOutOfMemory { op: &'static str, bytes: usize, gib: f64 },

    /// Autograd misuse (backward on a non-scalar, on a tensor that needs no grad, ...).
    #[error("autograd: {0}")]
    Autograd(String),

    /// An I/O error, with the path.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A configuration value that is missing, has the wrong type or is not supported.
    #[error("config key `{key}`: {msg}")]
    Config { key: String, msg: String },

    /// A checkpoint that cannot be read, or whose tensors do not match the model.
    #[error("checkpoint {path}: {msg}")]
    Checkpoint { path: String, msg: String },

    /// A data file (list, audio, symbol table, CMVN, feature dump) that cannot be used, with the path.
    #[error("{path}: {msg}")]
    Data { path: String, msg: String },

    /// A configuration file or section that cannot be used, with where it came from.
    #[error("config {path}: {msg}")]
    ConfigFile { path: String, msg: String },

    /// A text file line that does not have the expected form.
    #[error("{path}:{line}: {msg}")]
    Parse { path: String, line: usize, msg: String },

    /// A binary record that fails its checks (length, checksum, encoding).
    #[error("{path}: corrupt record at byte offset {offset}: {msg}")]
    CorruptRecord { path: String, offset: u64, msg: String },

    /// A rendezvous or collective that failed: a peer that did not answer
    /// within the timeout (named by rank), a refused connection, ranks that
    /// disagree on a call.
    #[error("distributed {op} on rank {rank}: {msg}")]
    Dist { op: &'static str, rank: usize, msg: String },

    /// A free-form error with context.
    #[error("{0}")]
    Msg(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::Config`].
    pub fn config(key: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Config { key: key.into(), msg: msg.into() }
    }

    /// Shorthand for [`Error::Checkpoint`].
    pub fn checkpoint(path: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Checkpoint { path: path.into(), msg: msg.into() }
    }

    /// Shorthand for [`Error::Dist`].
    pub fn dist(op: &'static str, rank: usize, msg: impl Into<String>) -> Self {
        Error::Dist { op, rank, msg: msg.into() }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument { op, msg: msg.into() }
    }
}
