//! `to_dtype`: a differentiable dtype conversion (the gradient is converted
//! back), so a layer can run one step (softmax) in f32 on half inputs.

use super::out_storage;
use crate::autograd::{needs_grad, no_grad, push_node, record};
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{DType, Shape, Tensor};

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
    let parts: Vec<Vec<Tensor>> = todo.iter().map(|&i| vec![xs[i].clone()]).collect();
    for (y, &i) in cast_parts("to_dtype_many", &parts, dtype)?.into_iter().zip(&todo) {
        out[i] = y;
    }
    Ok(out)
}

/// Concatenations along dim 0, each converted to `dtype`: output `o` is
/// `to_dtype(cat(parts[o], 0), dtype)` (the parts of one output share their
/// dtype and their dims past the first). One tape node for all of them, whose
/// backward hands each part its rows of the output's gradient converted
/// back to the part's dtype. On a GPU the whole forward is one launch
/// (`cast_many`, a copy when the dtype does not change) and so is the
/// backward: the packed q/k/v projection weights and biases of every
/// attention layer are made this way (`nn::attention`), and autocast
/// makes them with a layer's other half weights.
pub fn cat_cast_many(parts: &[Vec<Tensor>], dtype: DType) -> Result<Vec<Tensor>> {
    cast_parts("cat_cast_many", parts, dtype)
}

fn cast_parts(name: &'static str, parts: &[Vec<Tensor>], dtype: DType) -> Result<Vec<Tensor>> {
    let ys = cat_cast_many_untracked(name, parts, dtype)?;
    record_cat_cast(name, parts, ys)
}

/// [`cat_cast_many`]'s outputs without its tape node: autocast converts
/// every layer's weights in one launch this way and records each layer's
/// node ([`record_cat_cast`]) where the layer first uses them, so that each
/// layer's gradients are final as soon as its backward is done.
pub(crate) fn cat_cast_many_untracked(name: &'static str, parts: &[Vec<Tensor>], dtype: DType) -> Result<Vec<Tensor>> {
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    let first = parts.iter().flatten().next().ok_or_else(|| Error::invalid(name, "expected at least one tensor in part 0, found none"))?;
    for (o, part) in parts.iter().enumerate() {
        let Some(p0) = part.first() else { return Err(Error::invalid(name, format!("expected at least one tensor in part {o}, found none"))) };
        for t in part {
            super::same_kind(name, first, t)?;
            if t.dtype() != p0.dtype() || t.rank() == 0 || t.rank() != p0.rank() || t.dims()[1..] != p0.dims()[1..] {
                return Err(Error::ShapeMismatch {
                    op: name,
                    expected: format!("part {o}: {:?} tensors shaped (·, {:?})", p0.dtype(), p0.dims().get(1..).unwrap_or(&[])),
                    got: format!("{:?} {}", t.dtype(), t.shape()),
                });
            }
        }
    }
    let shapes: Vec<Shape> = parts
        .iter()
        .map(|p| {
            let mut d = p[0].dims().to_vec();
            d[0] = p.iter().map(|t| t.dims()[0]).sum();
            Shape::from(d)
        })
        .collect();
    no_grad(|| pack(parts, &shapes, dtype))
}

/// The tape node of [`cat_cast_many`] for `parts` and their untracked
/// outputs `ys` (from [`cat_cast_many_untracked`]): the tracked outputs,
/// or `ys` themselves when no part needs a gradient.
pub(crate) fn record_cat_cast(name: &'static str, parts: &[Vec<Tensor>], ys: Vec<Tensor>) -> Result<Vec<Tensor>> {
    let members: Vec<&Tensor> = parts.iter().flatten().collect();
    if ys.len() != parts.len() {
        return Err(Error::invalid(name, format!("expected {} outputs, found {}", parts.len(), ys.len())));
    }
    if !needs_grad(&members) {
        return Ok(ys);
    }
    let tracked: Vec<Tensor> = ys.iter().map(|y| y.reshaped(y.shape().clone(), true)).collect();
    crate::autograd::profile_mark(name, tracked.iter().map(|t| t.size_in_bytes() as u64).sum());
    // Per member: its output and its first row there.
    let mut places: Vec<(usize, usize, Shape, DType)> = Vec::with_capacity(members.len());
    for (o, part) in parts.iter().enumerate() {
        let mut row = 0;
        for t in part {
            places.push((o, row, t.shape().clone(), t.dtype()));
            row += t.dims()[0];
        }
    }
    push_node(
        name,
        &members,
        tracked.iter().map(|t| t.id()).collect(),
        vec![],
        Box::new(move |gs: &[Option<Tensor>], needs: &[bool]| unpack(gs, needs, &places)),
    );
    Ok(tracked)
}

/// The outputs of [`cat_cast_many`]: one `cast_many` launch when every
/// tensor is on one GPU in one dtype with a kernel for the conversion,
/// else a conversion (and concatenation) per output.
fn pack(parts: &[Vec<Tensor>], shapes: &[Shape], dtype: DType) -> Result<Vec<Tensor>> {
    let single = parts.len() == 1 && parts[0].len() == 1;
    let guards: Vec<Vec<_>> = parts.iter().map(|p| p.iter().map(|t| t.storage()).collect()).collect();
    let gpu: Option<Vec<Vec<&cuda::CudaStorage>>> =
        guards.iter().map(|p| p.iter().map(|g| if let Storage::Cuda(c) = &**g { Some(c) } else { None }).collect()).collect();
    let fits = |g: &Vec<Vec<&cuda::CudaStorage>>| {
        let f = g[0][0];
        !single && cuda::cast::many_supported(f.dtype(), dtype) && g.iter().flatten().all(|c| c.dtype() == f.dtype() && c.ordinal() == f.ordinal())
    };
    if let Some(gpu) = gpu.filter(fits) {
        let dev = gpu[0][0].device();
        let ys = shapes.iter().map(|s| dev.alloc(dtype, s.elem_count())).collect::<Result<Vec<_>>>()?;
        let mut pieces = Vec::new();
        for (p, y) in gpu.iter().zip(&ys) {
            let mut at = 0;
            for x in p {
                pieces.push(cuda::cast::CastPiece { src: x, src_at: 0, dst: y, dst_at: at, len: x.len() });
                at += x.len();
            }
        }
        cuda::cast::cast_pieces(&pieces)?;
        return Ok(ys.into_iter().zip(shapes).map(|(y, s)| out_storage(Storage::Cuda(y), s.clone())).collect());
    }
    drop(guards);
    parts
        .iter()
        .map(|p| {
            let x = if p.len() == 1 { p[0].clone() } else { super::cat(&p.iter().collect::<Vec<_>>(), 0)? };
            to_dtype(&x, dtype)
        })
        .collect()
}

/// The backward of [`cat_cast_many`]: each needed member's rows of its
/// output's gradient, in the member's dtype; on a GPU one launch per dtype
/// among the members.
fn unpack(gs: &[Option<Tensor>], needs: &[bool], places: &[(usize, usize, Shape, DType)]) -> Result<Vec<Option<Tensor>>> {
    let want: Vec<usize> = (0..places.len()).filter(|&j| needs[j] && gs.get(places[j].0).is_some_and(|g| g.is_some())).collect();
    let mut grads: Vec<Option<Tensor>> = vec![None; places.len()];
    let mut kinds: Vec<DType> = want.iter().map(|&j| places[j].3).collect();
    kinds.sort_by_key(|d| d.as_str());
    kinds.dedup();
    for kind in kinds {
        let idx: Vec<usize> = want.iter().copied().filter(|&j| places[j].3 == kind).collect();
        let guards: Vec<_> = idx.iter().map(|&j| gs[places[j].0].as_ref().map(|g| g.storage())).collect();
        let on_gpu: Option<Vec<&cuda::CudaStorage>> =
            guards.iter().map(|g| g.as_ref().and_then(|g| if let Storage::Cuda(c) = &**g { Some(c) } else { None })).collect();
        // One piece that is a whole gradient is a plain conversion (below).
        let whole = idx.len() == 1 && gs[places[idx[0]].0].as_ref().is_some_and(|g| g.dims()[0] == places[idx[0]].2.dims()[0]);
        if let Some(srcs) = on_gpu.filter(|s| !whole && cuda::cast::many_supported(s[0].dtype(), kind) && s.iter().all(|c| c.dtype() == s[0].dtype())) {
            let dev = srcs[0].device();
            let outs = idx.iter().map(|&j| dev.alloc(kind, places[j].2.elem_count())).collect::<Result<Vec<_>>>()?;
            let pieces: Vec<_> = idx
                .iter()
                .zip(&srcs)
                .zip(&outs)
                .map(|((&j, src), dst)| {
                    let (_, row, shape, _) = &places[j];
                    let n = shape.elem_count();
                    let per_row = if shape.dims()[0] == 0 { 0 } else { n / shape.dims()[0] };
                    cuda::cast::CastPiece { src, src_at: row * per_row, dst, dst_at: 0, len: n }
                })
                .collect();
            cuda::cast::cast_pieces(&pieces)?;
            for (&j, y) in idx.iter().zip(outs) {
                grads[j] = Some(out_storage(Storage::Cuda(y), places[j].2.clone()));
            }
            continue;
        }
        drop(guards);
        for &j in &idx {
            let (o, row, shape, _) = &places[j];
            let g = gs[*o].as_ref().ok_or_else(|| Error::invalid("cat_cast_many", "expected a gradient"))?;
            let rows = if g.dims()[0] == shape.dims()[0] { g.clone() } else { super::narrow(g, 0, *row, shape.dims()[0])? };
            grads[j] = Some(no_grad(|| to_dtype(&rows, kind))?);
        }
    }
    Ok(grads)
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
