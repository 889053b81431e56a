//! `Tensor`: a cheap handle (`Arc`) to contiguous row-major storage with a
//! shape, a dtype and a device. There are no strided views: permutes and
//! slices are explicit copies.

mod device;
mod dtype;
pub mod halfconv;
pub mod rng;
mod shape;

pub use device::Device;
pub use dtype::DType;
pub use rng::Rng;
pub use shape::Shape;

use crate::backend::cpu::{pool, CpuStorage, WithDType};
use crate::backend::cuda::CudaStorage;
use crate::backend::Storage;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

/// A tensor's unique id (the tape refers to tensors by id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);

impl TensorId {
    fn fresh() -> Self {
        TensorId(NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }
}

static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes held by all live tensor storages of this process.
pub fn live_bytes() -> u64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// The most bytes [`live_bytes`] has reached since the last [`reset_peak_bytes`].
pub fn peak_bytes() -> u64 {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// Restarts the peak of [`peak_bytes`] from the bytes live now.
pub fn reset_peak_bytes() {
    PEAK_BYTES.store(live_bytes(), Ordering::Relaxed);
}

/// Storage shared by the handles that view it whole (reshape, detach).
struct Cell {
    storage: RwLock<Storage>,
    bytes: u64,
    /// Where the storage lives (`DEVICE_CPU` or a GPU ordinal), kept beside
    /// it so a move in place is seen by every handle, read without the lock.
    device: AtomicUsize,
}

/// `Cell::device` of host storage.
const DEVICE_CPU: usize = usize::MAX;

fn storage_device(s: &Storage) -> Device {
    match s {
        Storage::Cpu(_) => Device::Cpu,
        Storage::Cuda(c) => Device::Cuda(c.ordinal()),
    }
}

fn device_code(d: Device) -> usize {
    match d {
        Device::Cpu => DEVICE_CPU,
        Device::Cuda(n) => n,
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
        // Large float buffers go back to the CPU buffer pool for the next op.
        let s = self.storage.get_mut().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(s, Storage::Cpu(CpuStorage::U8(Vec::new()))) {
            Storage::Cpu(CpuStorage::F32(v)) => pool::give(v),
            Storage::Cpu(CpuStorage::F64(v)) => pool::give(v),
            _ => {}
        }
    }
}

pub(crate) struct Inner {
    id: TensorId,
    cell: Arc<Cell>,
    shape: Shape,
    dtype: DType,
    /// Whether gradients flow through this tensor (a leaf that requires grad,
    /// or the output of a recorded op).
    tracked: bool,
    /// A leaf's gradient slot (`Some` for leaves that require grad).
    grad: Option<Mutex<Option<Tensor>>>,
}

/// A tensor: an `Arc` handle, so `clone` is cheap and shares the storage.
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?}, {:?}", self.0.shape, self.0.dtype, self.device())?;
        if self.0.tracked {
            write!(f, ", requires_grad")?;
        }
        if self.elem_count() <= 16 {
            if let Ok(v) = self.to_f64_vec() {
                write!(f, ", {v:?}")?;
            }
        }
        write!(f, ")")
    }
}

impl Tensor {
    fn build(storage: Storage, shape: Shape, tracked: bool, leaf: bool) -> Tensor {
        let bytes = storage.size_in_bytes() as u64;
        let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        let device = AtomicUsize::new(device_code(storage_device(&storage)));
        Tensor::view(Arc::new(Cell { storage: RwLock::new(storage), bytes, device }), shape, tracked, leaf)
    }

    fn view(cell: Arc<Cell>, shape: Shape, tracked: bool, leaf: bool) -> Tensor {
        let dtype = cell.storage.read().unwrap_or_else(|e| e.into_inner()).dtype();
        Tensor(Arc::new(Inner { id: TensorId::fresh(), cell, shape, dtype, tracked, grad: if leaf { Some(Mutex::new(None)) } else { None } }))
    }

    /// A tensor over CPU storage; the element count must match the shape.
    pub fn from_cpu(storage: CpuStorage, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if storage.len() != shape.elem_count() {
            return Err(Error::ShapeMismatch {
                op: "from_storage",
                expected: format!("{} elements for shape {shape}", shape.elem_count()),
                got: format!("{} elements", storage.len()),
            });
        }
        Ok(Tensor::build(Storage::Cpu(storage), shape, false, false))
    }

    /// Output of a kernel on `device` (internal: the element count is the kernel's contract).
    pub(crate) fn from_storage(storage: Storage, shape: Shape) -> Tensor {
        Tensor::build(storage, shape, false, false)
    }

    /// A tensor from a vector of any supported element type, on `device`.
    pub fn from_vec<T: WithDType>(data: Vec<T>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::from_cpu(T::into_storage(data), shape)?.to_device(device)
    }

    /// A 0-dim tensor.
    pub fn scalar(v: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full((), v, dtype, device)
    }

    /// A tensor filled with `v`.
    pub fn full(shape: impl Into<Shape>, v: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        // Zeros on a GPU are a memset on the stream: no host buffer, no
        // upload, no wait (+0.0 is all-zero bytes in every dtype).
        if let (Device::Cuda(n), true) = (device, v == 0.0 && v.is_sign_positive()) {
            let g = crate::backend::cuda::device(*n)?.zeros(dtype, shape.elem_count())?;
            return Ok(Tensor::build(Storage::Cuda(g), shape, false, false));
        }
        Tensor::from_cpu(CpuStorage::try_full(dtype, shape.elem_count(), v)?, shape)?.to_device(device)
    }

    /// Zeros.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// Ones.
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype(), &self.device())
    }

    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.dtype(), &self.device())
    }

    /// `start, start+step, ...` below `end` (1-D).
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || ((end - start) / step) < 0.0 {
            return Err(Error::invalid("arange", format!("cannot step from {start} to {end} by {step}")));
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let v: Vec<f64> = (0..n).map(|i| start + step * i as f64).collect();
        Tensor::from_cpu(CpuStorage::F64(v).to_dtype(dtype), [n])?.to_device(device)
    }

    /// Standard normal samples scaled by `std` and shifted by `mean`.
    pub fn randn(shape: impl Into<Shape>, mean: f64, std: f64, dtype: DType, rng: &mut Rng, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let mut v = crate::backend::cpu::try_with_capacity::<f64>("randn", shape.elem_count())?;
        rng.normal_into(shape.elem_count(), &mut v);
        v.iter_mut().for_each(|x| *x = mean + std * *x);
        Tensor::from_cpu(CpuStorage::F64(v).to_dtype(dtype), shape)?.to_device(device)
    }

    /// Uniform samples in `(lo, hi)`.
    pub fn rand(shape: impl Into<Shape>, lo: f64, hi: f64, dtype: DType, rng: &mut Rng, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let mut v = crate::backend::cpu::try_with_capacity::<f64>("rand", shape.elem_count())?;
        rng.uniform_into(shape.elem_count(), &mut v);
        v.iter_mut().for_each(|u| *u = lo + (hi - lo) * *u);
        Tensor::from_cpu(CpuStorage::F64(v).to_dtype(dtype), shape)?.to_device(device)
    }

    /// The unique id.
    pub fn id(&self) -> TensorId {
        self.0.id
    }
    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.0.shape.dims()
    }
    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.shape.rank()
    }
    /// The size of dim `d` (negative counts from the end).
    pub fn dim(&self, d: isize) -> Result<usize> {
        Ok(self.dims()[self.0.shape.dim("dim", d)?])
    }
    /// The number of elements.
    pub fn elem_count(&self) -> usize {
        self.0.shape.elem_count()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The device.
    pub fn device(&self) -> Device {
        match self.0.cell.device.load(Ordering::Acquire) {
            DEVICE_CPU => Device::Cpu,
            n => Device::Cuda(n),
        }
    }
    /// Bytes of storage.
    pub fn size_in_bytes(&self) -> usize {
        self.0.cell.bytes as usize
    }
    /// Read access to the storage.
    pub fn storage(&self) -> RwLockReadGuard<'_, Storage> {
        // A poisoned lock only means a panic elsewhere while writing; the
        // storage itself is still a valid buffer.
        self.0.cell.storage.read().unwrap_or_else(|e| e.into_inner())
    }
    /// A copy of the CPU storage (copies from the device when needed).
    pub fn to_cpu_storage(&self) -> Result<CpuStorage> {
        match &*self.storage() {
            Storage::Cpu(s) => Ok(s.clone()),
            Storage::Cuda(s) => s.to_cpu(),
        }
    }
    /// The elements as a vector of `T`; the dtype must be `T`'s.
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        let s = self.to_cpu_storage()?;
        T::slice(&s).map(|v| v.to_vec()).ok_or(Error::DTypeMismatch { op: "to_vec", expected: T::DTYPE, got: self.dtype() })
    }
    /// The elements widened to f64, whatever the dtype.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_cpu_storage()?.to_f64_vec())
    }
    /// The single element of a one-element tensor, as f64.
    pub fn to_scalar(&self) -> Result<f64> {
        if self.elem_count() != 1 {
            return Err(Error::ShapeMismatch { op: "to_scalar", expected: "one element".into(), got: format!("shape {}", self.shape()) });
        }
        Ok(self.to_f64_vec()?[0])
    }
    /// The values of several one-element tensors, in order, with one copy to
    /// the host: on a GPU they are gathered into one f64 buffer there first
    /// (float values: one launch per dtype among them, `cast::gather_scalars_f64`),
    /// so the step waits for the device once, not once per value.
    pub fn scalars_to_host(ts: &[&Tensor]) -> Result<Vec<f64>> {
        if let [t] = ts {
            return Ok(vec![t.to_scalar()?]);
        }
        Self::scalars_to_host_later(ts)?.values()
    }
    /// [`Tensor::scalars_to_host`] without the wait: float values of one
    /// GPU are gathered there and their copy to page-locked host memory is
    /// queued ([`ScalarReadback`](crate::backend::cuda::ScalarReadback));
    /// [`HostScalars::values`] waits for it only if it has not run by then.
    /// Other values (the CPU, several devices, integers) are read now.
    pub fn scalars_to_host_later(ts: &[&Tensor]) -> Result<HostScalars> {
        if let Some(bad) = ts.iter().find(|t| t.elem_count() != 1) {
            return Err(Error::ShapeMismatch { op: "scalars_to_host", expected: "one element".into(), got: format!("shape {}", bad.shape()) });
        }
        let Some(first) = ts.first() else { return Ok(HostScalars::Ready(Vec::new())) };
        let dev = first.device();
        if dev == Device::Cpu || ts.iter().any(|t| t.device() != dev) {
            return Ok(HostScalars::Ready(ts.iter().map(|t| t.to_scalar()).collect::<Result<_>>()?));
        }
        // Float values on one GPU: gathered as f64, one launch per dtype, and copied without a wait.
        if ts.len() <= crate::backend::cuda::cast::CAST_TENSORS && ts.iter().all(|t| t.dtype().is_float()) {
            let guards: Vec<_> = ts.iter().map(|t| t.storage()).collect();
            let cs: Option<Vec<&CudaStorage>> = guards
                .iter()
                .map(|g| match &**g {
                    Storage::Cuda(c) => Some(c),
                    _ => None,
                })
                .collect();
            if let Some(cs) = cs {
                return Ok(HostScalars::Copying(crate::backend::cuda::ScalarReadback::start(&cs)?));
            }
        }
        crate::autograd::no_grad(|| {
            let parts = ts.iter().map(|t| crate::ops::reshape(&crate::ops::to_dtype(t, DType::F64)?, [1])).collect::<Result<Vec<_>>>()?;
            Ok(HostScalars::Ready(crate::ops::cat(&parts.iter().collect::<Vec<_>>(), 0)?.to_f64_vec()?))
        })
    }
    /// A copy on `device` (the same handle if already there).
    pub fn to_device(self, device: &Device) -> Result<Tensor> {
        if self.device() == *device {
            return Ok(self);
        }
        let storage = match device {
            Device::Cpu => Storage::Cpu(self.to_cpu_storage()?),
            Device::Cuda(n) => {
                let dev = crate::backend::cuda::device(*n)?;
                let g = match &*self.storage() {
                    Storage::Cpu(c) => CudaStorage::from_cpu(&dev, c)?,
                    // Another GPU: through the host (peer copies come with multi-GPU work).
                    Storage::Cuda(c) => CudaStorage::from_cpu(&dev, &c.to_cpu()?)?,
                };
                Storage::Cuda(g)
            }
        };
        Ok(Tensor::build(storage, self.shape().clone(), false, false))
    }

    /// Like [`Tensor::to_device`], but a host tensor goes to a GPU through a
    /// reused pinned staging buffer (for the data loader's batches, which
    /// are fresh every step).
    pub fn to_device_staged(self, device: &Device) -> Result<Tensor> {
        let Device::Cuda(n) = *device else { return self.to_device(device) };
        let g = match &*self.storage() {
            Storage::Cpu(c) => crate::backend::cuda::upload_staged(&crate::backend::cuda::device(n)?, c)?,
            Storage::Cuda(_) => return self.clone().to_device(device),
        };
        Ok(Tensor::build(Storage::Cuda(g), self.shape().clone(), false, false))
    }

    /// Moves the storage to `device` in place, for every handle that shares
    /// it (a model's parameters after loading, with the optimizer's and the
    /// engine's handles to them).
    pub fn move_to_device(&self, device: &Device) -> Result<()> {
        if self.device() == *device {
            return Ok(());
        }
        let moved = self.detach().to_device(device)?;
        // `moved` is the only handle to its copy: take the storage out of it.
        let new = std::mem::replace(&mut *moved.0.cell.storage.write().unwrap_or_else(|e| e.into_inner()), Storage::Cpu(CpuStorage::F32(Vec::new())));
        // Under the write lock: no reader sees the new device with the old storage.
        let mut s = self.0.cell.storage.write().unwrap_or_else(|e| e.into_inner());
        *s = new;
        self.0.cell.device.store(device_code(*device), Ordering::Release);
        Ok(())
    }

    // ---- autograd state ----

    /// Whether gradients flow through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.tracked
    }
    /// Whether this is a leaf with a gradient slot (a parameter or an input that requires grad).
    pub fn is_leaf(&self) -> bool {
        self.0.grad.is_some()
    }
    /// A leaf that requires grad, sharing this storage, with an empty gradient slot.
    pub fn requires_grad_(&self) -> Tensor {
        Tensor::view(self.0.cell.clone(), self.shape().clone(), true, true)
    }
    /// The same storage cut off from the tape (no gradient flows back).
    pub fn detach(&self) -> Tensor {
        Tensor::view(self.0.cell.clone(), self.shape().clone(), false, false)
    }
    /// The same storage under another shape with the same element count
    /// (internal: `ops::reshape` checks and records it).
    pub(crate) fn reshaped(&self, shape: Shape, tracked: bool) -> Tensor {
        Tensor::view(self.0.cell.clone(), shape, tracked, false)
    }
    /// The accumulated gradient of a leaf, if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad.as_ref().and_then(|g| g.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    /// Clears a leaf's gradient (sets it to None, as `zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        if let Some(g) = &self.0.grad {
            *g.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
    /// Replaces a leaf's gradient (used by engines and clipping).
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        match &self.0.grad {
            Some(g) => {
                if let Some(t) = &grad {
                    if t.shape() != self.shape() {
                        return Err(Error::ShapeMismatch { op: "set_grad", expected: self.shape().to_string(), got: t.shape().to_string() });
                    }
                }
                *g.lock().unwrap_or_else(|e| e.into_inner()) = grad;
                Ok(())
            }
            None => Err(Error::Autograd("set_grad on a tensor that is not a leaf requiring grad".into())),
        }
    }
    /// Replaces a leaf's gradient with `f(previous)` under the slot's lock
    /// (a no-op on a tensor without a slot); autograd accumulates through it.
    pub(crate) fn update_grad(&self, f: impl FnOnce(Option<Tensor>) -> Result<Option<Tensor>>) -> Result<()> {
        if let Some(slot) = &self.0.grad {
            let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
            *s = f(s.take())?;
        }
        Ok(())
    }
    /// Replaces the data of this tensor in place (optimizer updates; never
    /// while the tape holds it for backward). The shape and dtype must match.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        if src.device() != self.device() {
            return Err(Error::DeviceMismatch { op: "assign", lhs: self.device(), rhs: src.device() });
        }
        if src.shape() != self.shape() || src.dtype() != self.dtype() {
            return Err(Error::ShapeMismatch {
                op: "assign",
                expected: format!("{} {:?}", self.shape(), self.dtype()),
                got: format!("{} {:?}", src.shape(), src.dtype()),
            });
        }
        let new = src.storage_copy()?;
        *self.0.cell.storage.write().unwrap_or_else(|e| e.into_inner()) = new;
        Ok(())
    }
    /// A copy of this tensor's storage (one device-to-device copy on a GPU).
    fn storage_copy(&self) -> Result<Storage> {
        Ok(match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(s.clone()),
            Storage::Cuda(s) => Storage::Cuda(s.try_clone()?),
        })
    }
    /// A new untracked tensor holding a copy of this one's storage (no zero
    /// fill first).
    pub(crate) fn copy_of(&self) -> Result<Tensor> {
        Ok(Tensor::build(self.storage_copy()?, self.shape().clone(), false, false))
    }
    /// Runs `f` on this tensor's storage with write access (in-place
    /// optimizer updates, without copying the buffer out and back).
    pub(crate) fn with_storage_mut<R>(&self, f: impl FnOnce(&mut Storage) -> R) -> R {
        f(&mut self.0.cell.storage.write().unwrap_or_else(|e| e.into_inner()))
    }
    /// Whether this handle is the only one to its storage: no clone, view,
    /// detached copy or saved handle shares it, so writing to it in place
    /// changes no value anyone else can read.
    pub(crate) fn is_sole_owner(&self) -> bool {
        Arc::strong_count(&self.0) == 1 && Arc::weak_count(&self.0) == 0 && Arc::strong_count(&self.0.cell) == 1 && Arc::weak_count(&self.0.cell) == 0
    }
    /// The storage of a tensor that is its sole owner ([`Tensor::is_sole_owner`]),
    /// taken out for an op to write into and return as its result (autograd's
    /// gradient accumulators); the tensor itself when it is not. Its bytes
    /// leave [`live_bytes`] here and come back with the tensor built on the result.
    pub(crate) fn into_sole_storage(self) -> std::result::Result<Storage, Tensor> {
        if !self.is_sole_owner() {
            return Err(self);
        }
        let taken = std::mem::replace(&mut *self.0.cell.storage.write().unwrap_or_else(|e| e.into_inner()), Storage::Cpu(CpuStorage::U8(Vec::new())));
        Ok(taken)
    }
    /// Whether two handles share one storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.cell, &other.0.cell)
    }
}

/// Values of one-element tensors read to the host
/// ([`Tensor::scalars_to_host_later`]): known already, or on their way from a GPU.
pub enum HostScalars {
    /// Read when asked for.
    Ready(Vec<f64>),
    /// Their copy from the GPU is queued.
    Copying(crate::backend::cuda::ScalarReadback),
}

impl HostScalars {
    /// The values, in order (waits for a queued copy that has not run yet).
    pub fn values(self) -> Result<Vec<f64>> {
        match self {
            HostScalars::Ready(v) => Ok(v),
            HostScalars::Copying(r) => r.values(),
        }
    }
}
