//! `to_dtype`: a differentiable dtype conversion (the gradient is converted
//! back), so a layer can run one step (softmax) in f32 on half inputs.

use super::out_storage;
use crate::autograd::{needs_grad, no_grad, push_node, record};
use crate::backend::{cuda, Storage};
use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// `x` converted to `dtype` (the same handle when it already is).
pub fn to_dtype(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return Ok(x.clone());
    }
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(c.to_dtype(dtype)),
        Storage::Cuda(g) => Storage::Cuda(cuda::cast::to_dtype(g, dtype)?),
    };
    let y = out_storage(y, x.shape().clone());
    let from = x.dtype();
    Ok(record("to_dtype", &[x], y, vec![], move |g, _| Ok(vec![Some(to_dtype(g, from)?)])))
}

/// Every `x` converted to `dtype`, with one tape node for all of them (its
/// backward converts the gradients that reached the outputs back in one
/// go). On the GPU f32 ↔ f16/bf16 runs in a few multi-tensor launches
/// instead of one per tensor: autocast casts a layer's weights this way.
/// Inputs already of `dtype` come back as they are (not recorded).
pub fn to_dtype_many(xs: &[Tensor], dtype: DType) -> Result<Vec<Tensor>> {
    let todo: Vec<usize> = (0..xs.len()).filter(|&i| xs[i].dtype() != dtype).collect();
    let mut out: Vec<Tensor> = xs.to_vec();
    if todo.is_empty() {
        return Ok(out);
    }
    let from: Vec<DType> = todo.iter().map(|&i| xs[i].dtype()).collect();
    let gpu: Vec<_> = todo.iter().map(|&i| xs[i].storage()).collect();
    let cuda_in: Option<Vec<&cuda::CudaStorage>> = gpu.iter().map(|s| if let Storage::Cuda(g) = &**s { Some(g) } else { None }).collect();
    let many = cuda_in.filter(|c| c.len() > 1 && c.iter().all(|g| g.dtype() == c[0].dtype())).map(|c| cuda::cast::to_dtype_many(&c, dtype)).transpose()?;
    drop(gpu);
    let ys: Vec<Tensor> = match many {
        Some(ys) => ys.into_iter().zip(&todo).map(|(y, &i)| out_storage(Storage::Cuda(y), xs[i].shape().clone())).collect(),
        None => todo.iter().map(|&i| no_grad(|| to_dtype(&xs[i], dtype))).collect::<Result<_>>()?,
    };
    let inputs: Vec<&Tensor> = todo.iter().map(|&i| &xs[i]).collect();
    if !needs_grad(&inputs) {
        for (y, &i) in ys.into_iter().zip(&todo) {
            out[i] = y;
        }
        return Ok(out);
    }
    let tracked: Vec<Tensor> = ys.iter().map(|y| y.reshaped(y.shape().clone(), true)).collect();
    crate::autograd::profile_mark("to_dtype_many", tracked.iter().map(|t| t.size_in_bytes() as u64).sum());
    push_node(
        "to_dtype_many",
        &inputs,
        tracked.iter().map(|t| t.id()).collect(),
        vec![],
        Box::new(move |gs: &[Option<Tensor>], needs: &[bool]| {
            // The gradients that arrived and are needed, converted back together
            // (grouped by the dtype each input had).
            let mut grads: Vec<Option<Tensor>> = vec![None; needs.len()];
            let mut kinds: Vec<DType> = from.clone();
            kinds.sort_by_key(|d| d.as_str());
            kinds.dedup();
            for want in kinds {
                let idx: Vec<usize> = (0..needs.len()).filter(|&j| needs[j] && from[j] == want && gs.get(j).is_some_and(|g| g.is_some())).collect();
                let g: Vec<Tensor> = idx.iter().filter_map(|&j| gs[j].clone()).collect();
                for (j, gx) in idx.into_iter().zip(to_dtype_many(&g, want)?) {
                    grads[j] = Some(gx);
                }
            }
            Ok(grads)
        }),
    );
    for (t, &i) in tracked.into_iter().zip(&todo) {
        out[i] = t;
    }
    Ok(out)
}

/// `x` in f32 when it is f16/bf16 (autocast's logits on their way to a
/// loss or a search, which work in f32 as PyTorch's autocast runs
/// log-softmax), else `x` itself.
pub fn widen_half(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => to_dtype(x, DType::F32),
        _ => Ok(x.clone()),
    }
}
