//! DDP's gradient buckets: parameters grouped, in reverse parameter order
//! (gradients become ready roughly in reverse, as PyTorch assumes), into
//! buckets of at most `cap` bytes (a larger parameter gets a bucket of its
//! own). A bucket travels as one flat buffer of the parameters' dtype (or
//! of f16/bf16 with `--fp16_grad_sync`, see [`compress`]): every parameter's gradient
//! (zeros where it has none) followed by one "used" flag per parameter, so
//! after the average a parameter no rank computed a gradient for keeps no
//! gradient, and one some ranks did gets the average over all ranks (the
//! others counting as zero, as `find_unused_parameters` does).

use crate::backend::cpu::WithDType;
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Tensor};

/// One bucket: indices into the engine's parameter list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Parameter indices, in the order their gradients are packed.
    pub params: Vec<usize>,
    /// Gradient elements in the bucket.
    pub numel: usize,
}

/// Groups parameters of `sizes` elements of `elem_bytes` each into buckets of at most `cap_bytes`.
pub fn assign_buckets(sizes: &[usize], elem_bytes: usize, cap_bytes: usize) -> Vec<Bucket> {
    let cap = (cap_bytes / elem_bytes.max(1)).max(1);
    let mut out: Vec<Bucket> = Vec::new();
    let mut cur = Bucket { params: Vec::new(), numel: 0 };
    for i in (0..sizes.len()).rev() {
        if !cur.params.is_empty() && cur.numel + sizes[i] > cap {
            out.push(std::mem::replace(&mut cur, Bucket { params: Vec::new(), numel: 0 }));
        }
        cur.params.push(i);
        cur.numel += sizes[i];
    }
    if !cur.params.is_empty() {
        out.push(cur);
    }
    out
}

/// Packs a bucket's gradients and used flags into one flat host tensor of
/// the parameters' dtype (f32 for training, f64 for exact checks). On a GPU
/// the gradients are concatenated there (one kernel) and the bucket comes
/// to the host in one copy: one host synchronisation per bucket, on the
/// calling thread, once backward has produced every gradient in it.
/// A used parameter's flag is `flag` (1, or the world size for [`compress`]).
pub fn flatten(bucket: &Bucket, params: &[(String, Tensor)], flag: f64) -> Result<Tensor> {
    let dev = params[bucket.params[0]].1.device();
    match (bucket_dtype(bucket, params)?, dev) {
        (DType::F64, Device::Cpu) => flatten_as::<f64>(bucket, params, flag),
        (_, Device::Cpu) => flatten_as::<f32>(bucket, params, flag as f32),
        (DType::F64, dev) => flatten_device::<f64>(bucket, params, &dev, flag),
        (_, dev) => flatten_device::<f32>(bucket, params, &dev, flag as f32),
    }
}

fn flatten_device<T: WithDType + Default>(bucket: &Bucket, params: &[(String, Tensor)], dev: &Device, one: T) -> Result<Tensor> {
    let dtype = T::DTYPE;
    let mut parts = Vec::with_capacity(bucket.params.len());
    let mut used = Vec::with_capacity(bucket.params.len());
    crate::autograd::no_grad(|| -> Result<()> {
        for &i in &bucket.params {
            let (name, p) = &params[i];
            if p.device() != *dev {
                return Err(Error::Msg(format!("ddp: parameter {name} is on {:?}; a bucket's parameters share one device ({dev:?})", p.device())));
            }
            match p.grad() {
                Some(g) if g.dtype() != dtype || g.device() != *dev => {
                    return Err(Error::Msg(format!(
                        "ddp: gradient of {name} is {:?} on {:?}; expected {dtype:?} on {dev:?} like its bucket",
                        g.dtype(),
                        g.device()
                    )))
                }
                Some(g) => {
                    parts.push(crate::ops::reshape(&g, [g.elem_count()])?);
                    used.push(one);
                }
                None => {
                    parts.push(Tensor::zeros([p.elem_count()], dtype, dev)?);
                    used.push(T::default());
                }
            }
        }
        Ok(())
    })?;
    let refs: Vec<&Tensor> = parts.iter().collect();
    let flat = crate::autograd::no_grad(|| crate::ops::cat(&refs, 0))?;
    drop(parts);
    let mut v = flat.to_vec::<T>()?;
    v.extend_from_slice(&used);
    let n = v.len();
    Tensor::from_vec(v, vec![n], &Device::Cpu)
}

fn bucket_dtype(bucket: &Bucket, params: &[(String, Tensor)]) -> Result<DType> {
    let (name, first) = &params[bucket.params[0]];
    match first.dtype() {
        d @ (DType::F32 | DType::F64) => Ok(d),
        d => Err(Error::Msg(format!("ddp: parameter {name} is {d:?}; expected f32 or f64"))),
    }
}

fn flatten_as<T: WithDType + Default>(bucket: &Bucket, params: &[(String, Tensor)], one: T) -> Result<Tensor> {
    let mut flat: Vec<T> = Vec::with_capacity(bucket.numel + bucket.params.len());
    let mut used = Vec::with_capacity(bucket.params.len());
    for &i in &bucket.params {
        let (name, p) = &params[i];
        match p.grad() {
            Some(g) => {
                let v = g.to_vec::<T>().map_err(|e| Error::Msg(format!("ddp: gradient of {name} (a bucket holds one dtype): {e}")))?;
                flat.extend_from_slice(&v);
                used.push(one);
            }
            None => {
                flat.resize(flat.len() + p.elem_count(), T::default());
                used.push(T::default());
            }
        }
    }
    flat.extend_from_slice(&used);
    let n = flat.len();
    Tensor::from_vec(flat, vec![n], &Device::Cpu)
}

/// Writes an averaged flat buffer back as the bucket's parameters' gradients.
pub fn unflatten(bucket: &Bucket, params: &[(String, Tensor)], flat: &Tensor) -> Result<()> {
    match bucket_dtype(bucket, params)? {
        DType::F64 => unflatten_as::<f64>(bucket, params, flat),
        _ => unflatten_as::<f32>(bucket, params, flat),
    }
}

fn unflatten_as<T: WithDType + Default + PartialOrd>(bucket: &Bucket, params: &[(String, Tensor)], flat: &Tensor) -> Result<()> {
    let v = flat.to_vec::<T>()?;
    if v.len() != bucket.numel + bucket.params.len() {
        return Err(Error::Msg(format!("ddp: a reduced bucket has {} elements, expected {}", v.len(), bucket.numel + bucket.params.len())));
    }
    let dev = params[bucket.params[0]].1.device();
    if dev != Device::Cpu {
        return unflatten_device(bucket, params, v, &dev);
    }
    let (grads, used) = v.split_at(bucket.numel);
    let mut off = 0;
    for (k, &i) in bucket.params.iter().enumerate() {
        let p = &params[i].1;
        let n = p.elem_count();
        let g = if used[k] > T::default() { Some(Tensor::from_vec(grads[off..off + n].to_vec(), p.dims().to_vec(), &Device::Cpu)?) } else { None };
        p.set_grad(g)?;
        off += n;
    }
    Ok(())
}

/// The device half of [`unflatten`]: the averaged gradients go back to the
/// GPU in one copy (no host wait) and each parameter's gradient is cut from
/// that buffer there.
fn unflatten_device<T: WithDType + Default + PartialOrd>(bucket: &Bucket, params: &[(String, Tensor)], mut v: Vec<T>, dev: &Device) -> Result<()> {
    let used = v.split_off(bucket.numel);
    let n = v.len();
    let flat = Tensor::from_vec(v, vec![n], &Device::Cpu)?.to_device(dev)?;
    let mut off = 0;
    crate::autograd::no_grad(|| -> Result<()> {
        for (k, &i) in bucket.params.iter().enumerate() {
            let p = &params[i].1;
            let n = p.elem_count();
            let g = if used[k] > T::default() { Some(crate::ops::reshape(&crate::ops::narrow(&flat, 0, off, n)?, p.dims().to_vec())?) } else { None };
            p.set_grad(g)?;
            off += n;
        }
        Ok(())
    })
}

/// A bucket packed on its parameters' GPU (gradients, zeros where none,
/// then the used flags, uploaded without a host wait), for a communicator
/// that reduces device buffers where they are (NCCL): nothing crosses to
/// the host. A used parameter's flag is `flag`, as in [`flatten`].
pub fn flatten_on_device(bucket: &Bucket, params: &[(String, Tensor)], flag: f64) -> Result<Tensor> {
    let dev = params[bucket.params[0]].1.device();
    let dtype = bucket_dtype(bucket, params)?;
    crate::autograd::no_grad(|| {
        let mut parts = Vec::with_capacity(bucket.params.len() + 1);
        let mut used = Vec::with_capacity(bucket.params.len());
        for &i in &bucket.params {
            let (name, p) = &params[i];
            match p.grad() {
                Some(g) if g.dtype() != dtype || g.device() != dev => {
                    return Err(Error::Msg(format!("ddp: gradient of {name} is {:?} on {:?}; expected {dtype:?} on {dev:?}", g.dtype(), g.device())))
                }
                Some(g) => {
                    parts.push(crate::ops::reshape(&g, [g.elem_count()])?);
                    used.push(flag);
                }
                None => {
                    parts.push(Tensor::zeros([p.elem_count()], dtype, &dev)?);
                    used.push(0.0);
                }
            }
        }
        let n = used.len();
        parts.push(crate::ops::to_dtype(&Tensor::from_vec(used, vec![n], &Device::Cpu)?, dtype)?.to_device(&dev)?);
        let refs: Vec<&Tensor> = parts.iter().collect();
        crate::ops::cat(&refs, 0)
    })
}

/// The used flags of reduced device buckets, all read in one copy to the
/// host: for each bucket, whether each parameter got a gradient on any rank.
pub fn used_flags_on_device(buckets: &[(&Bucket, &Tensor)]) -> Result<Vec<Vec<bool>>> {
    if buckets.is_empty() {
        return Ok(Vec::new());
    }
    let flags = crate::autograd::no_grad(|| -> Result<Vec<f64>> {
        let parts = buckets
            .iter()
            .map(|(b, flat)| crate::ops::to_dtype(&crate::ops::narrow(flat, 0, b.numel, b.params.len())?, DType::F64))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        crate::ops::cat(&refs, 0)?.to_vec::<f64>()
    })?;
    let mut out = Vec::with_capacity(buckets.len());
    let mut off = 0;
    for (b, _) in buckets {
        out.push(flags[off..off + b.params.len()].iter().map(|&f| f > 0.0).collect());
        off += b.params.len();
    }
    Ok(out)
}

/// Writes a reduced device bucket back as its parameters' gradients, cut on
/// the device; `used` from [`used_flags_on_device`].
pub fn unflatten_on_device(bucket: &Bucket, params: &[(String, Tensor)], flat: &Tensor, used: &[bool]) -> Result<()> {
    if flat.elem_count() != bucket.numel + bucket.params.len() || used.len() != bucket.params.len() {
        return Err(Error::Msg(format!(
            "ddp: a reduced bucket has {} elements and {} flags, expected {} and {}",
            flat.elem_count(),
            used.len(),
            bucket.numel + bucket.params.len(),
            bucket.params.len()
        )));
    }
    let mut off = 0;
    crate::autograd::no_grad(|| -> Result<()> {
        for (k, &i) in bucket.params.iter().enumerate() {
            let p = &params[i].1;
            let n = p.elem_count();
            let g = if used[k] { Some(crate::ops::reshape(&crate::ops::narrow(flat, 0, off, n)?, p.dims().to_vec())?) } else { None };
            p.set_grad(g)?;
            off += n;
        }
        Ok(())
    })
}

/// A reduced-precision copy of a packed bucket for the all-reduce of
/// `--fp16_grad_sync` (PyTorch's `fp16_compress_hook`, or
/// `bf16_compress_hook` for `half` = bf16), packed with the world size as
/// its used flags (`flatten(.., world)`): the whole buffer divided by
/// `world` in the bucket's dtype, then rounded once to `half` (two
/// launches on a GPU). The gradients become their shares of the average
/// (dividing before the cast keeps the sum of the shares as large as one
/// rank's gradient, so it overflows f16 no sooner than a gradient does, and
/// the average comes out of a plain sum); a flag becomes w·fl(1/w), within
/// an ulp of 1, which rounds to exactly 1 in either half type. Reduce it
/// with `ReduceOp::Sum`: each flag then counts the ranks that used the
/// parameter, an integer f16 holds exactly up to 2048 ranks and bf16 up to
/// 256 (a positive sum stays positive beyond), and only `> 0` is read.
pub fn compress(bucket: &Bucket, flat: &Tensor, world: usize, half: DType) -> Result<Tensor> {
    if !matches!(half, DType::F16 | DType::BF16) {
        return Err(Error::Msg(format!("ddp: gradient buckets can travel in f16 or bf16, not {half:?}")));
    }
    if flat.elem_count() != bucket.numel + bucket.params.len() {
        return Err(Error::Msg(format!("ddp: a packed bucket has {} elements, expected {}", flat.elem_count(), bucket.numel + bucket.params.len())));
    }
    crate::autograd::no_grad(|| crate::ops::to_dtype(&crate::ops::mul_scalar(flat, 1.0 / world.max(1) as f64)?, half))
}

/// A bucket reduced in half precision, back in its parameters' dtype
/// (exact: every f16 and bf16 value is an f32 value).
pub fn decompress(bucket: &Bucket, params: &[(String, Tensor)], flat: &Tensor) -> Result<Tensor> {
    let dtype = bucket_dtype(bucket, params)?;
    crate::autograd::no_grad(|| crate::ops::to_dtype(flat, dtype))
}
