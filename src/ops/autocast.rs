//! Autocast: mixed precision as a thread-local mode (like `no_grad`), as
//! `torch.autocast`. While it is set to f16 or bf16, matrix products,
//! `linear` and convolutions take f32 or half operands, run in that half
//! type (f32 accumulation) and give **half** results, so the activations
//! between them (elementwise ops, dropout, layer norm, softmax) stay half
//! too; an op mixing a half and an f32 operand promotes to f32, as PyTorch's
//! type promotion does. Losses cast their logits to f32.
//!
//! Weights: [`autocast_params`] names the model's parameters in groups (one
//! per layer). The first product that needs a half copy of a parameter
//! casts every group's parameters in one multi-tensor launch (a few on a
//! large model: a launch's table holds 64 tensors and 4 Mi elements) and
//! keeps the copies for the rest of the region; each group's tape node (one
//! per group, [`super::cat_cast_many`]'s, whose backward converts the
//! group's gradients back to f32 in one launch) is recorded where the group
//! is first used. So every weight is cast once per step, not at every use,
//! and a layer's gradients are final as soon as its backward is done (DDP's
//! bucket hooks still overlap).
//! A tensor outside every group (an activation) is cast where it is first
//! used, and that copy serves its later uses in the region.
//!
//! Packs ([`autocast_params_packed`]): lists of a group's parameters whose
//! half copies the weight conversion writes side by side into one tensor,
//! concatenated along dim 0 ([`super::cat_cast_many`]): an attention
//! layer's q/k/v projection weights and biases, which one GEMM then reads
//! ([`packed_params`]). A packed parameter asked for alone gets a cast of its own.
//! Without autocast a region with packs converts (copies) only the packs,
//! every layer's in one launch, each layer's node recorded at its first use
//! as above: full-precision runs pack their projections that way.
//!
//! The CPU has no half GEMM, so it emulates one: half operands widened to
//! f32, an f32 product, the result rounded through half — the values a half
//! GEMM with f32 accumulation gives, kept in f32 storage because the CPU's
//! elementwise kernels are f32/f64 only (its activations between products
//! are f32 holding half-rounded products). Convolutions do the same on the
//! CPU and run their half kernels on the GPU.

use super::cast::{cat_cast_many_untracked, record_cat_cast};
use super::to_dtype;
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Tensor, TensorId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// The parameter groups of an autocast region and the half copies made so far.
#[derive(Default)]
struct WeightCache {
    /// Parameter id → its group.
    group_of: HashMap<TensorId, usize>,
    /// Each group's parameters.
    groups: Vec<Vec<Tensor>>,
    /// Parameter id → its half copy (recorded on the tape when made).
    halves: HashMap<TensorId, Tensor>,
    /// The packs: parameters cast into one tensor, in order.
    packs: Vec<Vec<Tensor>>,
    /// Parameter id → its pack.
    pack_of: HashMap<TensorId, usize>,
    /// Pack → its half copy, once its group is cast.
    packed: HashMap<usize, Tensor>,
    /// The region's one conversion of every group (`None` until the first
    /// use): each group's parts and untracked copies, until the group's
    /// first use records its node.
    staged: Option<HashMap<usize, Staged>>,
    /// Whether an [`autocast_params`] region installed this cache (outside
    /// one, activations' casts are not kept).
    region: bool,
    /// The region's autocast type (`None`: full precision, packs only).
    half: Option<DType>,
}

/// One group's share of the region's conversion: its parts (each f32
/// parameter alone, then each of its packs) and their half copies, not yet
/// on the tape.
struct Staged {
    parts: Vec<Vec<Tensor>>,
    copies: Vec<Tensor>,
    /// How many of `parts` are single parameters (the rest are `packs`, in order).
    singles: usize,
    packs: Vec<usize>,
}

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
    static WEIGHTS: RefCell<WeightCache> = RefCell::new(WeightCache::default());
}

/// The half type matrix products and convolutions run in, if autocast is on.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// Restores the previous autocast mode when dropped.
pub struct AutocastGuard(Option<DType>);

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        AUTOCAST.with(|a| a.set(self.0));
    }
}

/// Sets the autocast mode (`None`, f16 or bf16) until the guard drops.
pub fn set_autocast(dtype: Option<DType>) -> Result<AutocastGuard> {
    if let Some(d) = dtype {
        if d != DType::F16 && d != DType::BF16 {
            return Err(Error::invalid("autocast", format!("expected f16 or bf16, got {d:?}")));
        }
    }
    Ok(AutocastGuard(AUTOCAST.with(|a| a.replace(dtype))))
}

/// Runs `f` with autocast set to `dtype` (`None`: full precision).
pub fn autocast<R>(dtype: Option<DType>, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let _g = set_autocast(dtype)?;
    f()
}

/// Runs `f` under autocast to `dtype` with the model's parameters in
/// `groups` (one per layer): each group is cast to the half type in one
/// launch the first time one of its parameters is used, and the copies are
/// reused until `f` returns. With `dtype` `None` this is [`autocast`].
pub fn autocast_params<R>(dtype: Option<DType>, groups: &[Vec<Tensor>], f: impl FnOnce() -> Result<R>) -> Result<R> {
    autocast_params_packed(dtype, groups, &[], f)
}

/// [`autocast_params`] with `packs`: lists of parameters of one group (each
/// parameter in at most one list, every list's tensors with equal dims past
/// the first) that the weight conversion casts into one tensor each, which
/// [`packed_params`] hands out (with `dtype` `None`, f32 copies of the
/// packs alone). A list whose parameters are not all f32 and in one group
/// is not packed (its parameters are cast one by one).
pub fn autocast_params_packed<R>(dtype: Option<DType>, groups: &[Vec<Tensor>], packs: &[Vec<Tensor>], f: impl FnOnce() -> Result<R>) -> Result<R> {
    let _g = set_autocast(dtype)?;
    let mut cache = WeightCache { region: true, half: dtype, ..WeightCache::default() };
    if dtype.is_some() || !packs.is_empty() {
        for (gi, g) in groups.iter().enumerate() {
            for t in g {
                cache.group_of.insert(t.id(), gi);
            }
        }
        cache.groups = groups.to_vec();
        for p in packs {
            let group = p.first().and_then(|t| cache.group_of.get(&t.id()).copied());
            let one_group = group.is_some() && p.iter().all(|t| t.dtype() == DType::F32 && cache.group_of.get(&t.id()).copied() == group);
            let fresh = p.iter().all(|t| !cache.pack_of.contains_key(&t.id()));
            if one_group && fresh {
                for t in p {
                    cache.pack_of.insert(t.id(), cache.packs.len());
                }
                cache.packs.push(p.clone());
            }
        }
    }
    let prev = WEIGHTS.with(|w| w.replace(cache));
    // Restored on every exit: the copies (and the parameters) are not kept
    // alive past the region by the cache (the tape holds what backward needs).
    struct Restore(Option<WeightCache>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(c) = self.0.take() {
                WEIGHTS.with(|w| w.replace(c));
            }
        }
    }
    let _r = Restore(Some(prev));
    f()
}

fn in_region() -> bool {
    WEIGHTS.with(|w| w.borrow().region)
}

/// `x` in the half type: as it is when it already is, the region's cached
/// copy for a parameter (casting its whole group on first use), else a
/// recorded cast (kept for the region's later uses of the same tensor).
pub(crate) fn half_of(x: &Tensor, half: DType) -> Result<Tensor> {
    if x.dtype() == half {
        return Ok(x.clone());
    }
    if x.device() == Device::Cpu {
        // The CPU's emulation casts at every use: its copies' gradients come
        // back to f32 one by one (it has no half add to sum them in).
        return to_dtype(x, half);
    }
    let group = WEIGHTS.with(|w| {
        let w = w.borrow();
        if let Some(h) = w.halves.get(&x.id()) {
            return Ok(h.clone());
        }
        Err(w.group_of.get(&x.id()).copied())
    });
    let g = match group {
        Ok(h) => return Ok(h),
        Err(None) => {
            // An activation: cast once however many products read it (the
            // decoder's normalised input feeds q, k and v), for this region.
            let h = to_dtype(x, half)?;
            if in_region() {
                WEIGHTS.with(|w| w.borrow_mut().halves.insert(x.id(), h.clone()));
            }
            return Ok(h);
        }
        Err(Some(g)) => g,
    };
    cast_group(g, half)?;
    match WEIGHTS.with(|w| w.borrow().halves.get(&x.id()).cloned()) {
        Some(h) => Ok(h),
        // A packed parameter asked for alone (or one not f32): its own cast.
        None => to_dtype(x, half),
    }
}

/// Group `g`'s copies in the cache (in `to`): its node recorded from the
/// region's one conversion (made now if this is the region's first).
fn cast_group(g: usize, to: DType) -> Result<()> {
    if WEIGHTS.with(|w| w.borrow().staged.is_none()) {
        stage_all(to)?;
    }
    let Some(st) = WEIGHTS.with(|w| w.borrow_mut().staged.as_mut().and_then(|m| m.remove(&g))) else { return Ok(()) };
    let copies = record_cat_cast("cat_cast_many", &st.parts, st.copies)?;
    WEIGHTS.with(|w| {
        let mut w = w.borrow_mut();
        for (k, (part, c)) in st.parts.iter().zip(copies).enumerate() {
            match k.checked_sub(st.singles) {
                None => {
                    w.halves.insert(part[0].id(), c);
                }
                Some(j) => {
                    w.packed.insert(st.packs[j], c);
                }
            }
        }
    });
    Ok(())
}

/// Converts every group's f32 parameters to `to` at once (each alone under
/// autocast, each pack into one tensor) and stages each group's share for
/// [`cast_group`]. Without autocast only the packs are converted.
fn stage_all(to: DType) -> Result<()> {
    // The region's type, not autocast's mode now (the products turn it off
    // around their operands' conversion).
    let singles_too = WEIGHTS.with(|w| w.borrow().half.is_some());
    let plan: Vec<(usize, Vec<Vec<Tensor>>, usize, Vec<usize>)> = WEIGHTS.with(|w| {
        let w = w.borrow();
        (0..w.groups.len())
            .map(|g| {
                let members: Vec<&Tensor> = w.groups[g].iter().filter(|t| t.dtype() == DType::F32).collect();
                let mut parts: Vec<Vec<Tensor>> =
                    members.iter().filter(|t| singles_too && !w.pack_of.contains_key(&t.id())).map(|&t| vec![t.clone()]).collect();
                let singles = parts.len();
                let mut packs: Vec<usize> = members.iter().filter_map(|t| w.pack_of.get(&t.id()).copied()).collect();
                packs.sort_unstable();
                packs.dedup();
                parts.extend(packs.iter().map(|&p| w.packs[p].clone()));
                (g, parts, singles, packs)
            })
            .filter(|(_, parts, _, _)| !parts.is_empty())
            .collect()
    });
    let all: Vec<Vec<Tensor>> = plan.iter().flat_map(|(_, parts, _, _)| parts.iter().cloned()).collect();
    let mut copies = cat_cast_many_untracked("cat_cast_many", &all, to)?.into_iter();
    let staged: HashMap<usize, Staged> = plan
        .into_iter()
        .map(|(g, parts, singles, packs)| {
            let copies: Vec<Tensor> = copies.by_ref().take(parts.len()).collect();
            (g, Staged { parts, copies, singles, packs })
        })
        .collect();
    WEIGHTS.with(|w| w.borrow_mut().staged = Some(staged));
    Ok(())
}

/// The region's copy of `params` concatenated along dim 0 (in the autocast
/// half type, or f32 without autocast), when they are on a GPU and the
/// region declared them as a pack ([`autocast_params_packed`]): made by the
/// region's weight conversion, its tape node recorded with its group's (at
/// the first use of any of the group's parameters). `None` otherwise.
pub fn packed_params(params: &[&Tensor]) -> Result<Option<Tensor>> {
    let to = WEIGHTS.with(|w| w.borrow().half).unwrap_or(DType::F32);
    if params.first().is_none_or(|t| t.device() == Device::Cpu) {
        return Ok(None);
    }
    let found = WEIGHTS.with(|w| {
        let w = w.borrow();
        let p = w.pack_of.get(&params[0].id()).copied()?;
        let same = w.packs[p].len() == params.len() && w.packs[p].iter().zip(params).all(|(a, b)| a.id() == b.id());
        same.then(|| (p, w.group_of.get(&params[0].id()).copied()))
    });
    let Some((p, Some(g))) = found else { return Ok(None) };
    if !WEIGHTS.with(|w| w.borrow().packed.contains_key(&p)) {
        cast_group(g, to)?;
    }
    Ok(WEIGHTS.with(|w| w.borrow().packed.get(&p).cloned()))
}

/// The region's half copy of `t` when autocast is on and `t` is one of
/// its f32 parameters (an elementwise op meeting a half activation uses it
/// rather than promoting the activation to f32: a weight is cast once per
/// step, like every other).
pub(crate) fn param_half(t: &Tensor) -> Result<Option<Tensor>> {
    let Some(half) = autocast_dtype() else { return Ok(None) };
    let known = t.dtype() == DType::F32
        && WEIGHTS.with(|w| {
            let w = w.borrow();
            w.halves.contains_key(&t.id()) || w.group_of.contains_key(&t.id())
        });
    if known {
        half_of(t, half).map(Some)
    } else {
        Ok(None)
    }
}

/// The half type when autocast applies to these operands: autocast is on,
/// both are f32 or of its half type, and (on a GPU) at least one is f32 —
/// two half operands need nothing from autocast there.
fn applies(a: &Tensor, b: &Tensor) -> Option<DType> {
    let half = autocast_dtype()?;
    let ok = |t: &Tensor| t.dtype() == DType::F32 || t.dtype() == half;
    let some_f32 = a.dtype() == DType::F32 || b.dtype() == DType::F32;
    (ok(a) && ok(b) && (some_f32 || a.device() == Device::Cpu)).then_some(half)
}

/// `y` computed by `f` on f32 copies of half inputs, rounded through `half`
/// and kept in f32: the CPU's stand-in for a half kernel with f32
/// accumulation (the CPU's elementwise kernels are f32/f64 only, so its
/// activations stay f32 holding the half results' values).
fn widened(half: DType, xs: &[&Tensor], f: impl FnOnce(&[Tensor]) -> Result<Tensor>) -> Result<Tensor> {
    let wide = xs.iter().map(|x| to_dtype(x, DType::F32)).collect::<Result<Vec<_>>>()?;
    to_dtype(&to_dtype(&f(&wide)?, half)?, DType::F32)
}

/// `op(a)·op(b)` under autocast (a half result), or `None` when autocast
/// does not apply (off, or operands of other types). Called first by `matmul_t`.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool) -> Result<Option<Tensor>> {
    let Some(half) = applies(a, b) else { return Ok(None) };
    // The inner product must not autocast again.
    let _off = set_autocast(None)?;
    let (a, b) = (half_of(a, half)?, half_of(b, half)?);
    let y = if a.device() == Device::Cpu {
        widened(half, &[&a, &b], |w| super::matmul_t(&w[0], &w[1], trans_a, trans_b))?
    } else {
        super::matmul_t(&a, &b, trans_a, trans_b)?
    };
    Ok(Some(y))
}

/// `x·wᵀ + bias` under autocast (a half result; on the GPU one cuBLASLt call
/// with the bias in its epilogue), or `None` when autocast does not apply.
pub(crate) fn linear(x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Option<Tensor>> {
    let Some(half) = applies(x, w).filter(|&h| bias.dtype() == DType::F32 || bias.dtype() == h) else { return Ok(None) };
    let _off = set_autocast(None)?;
    let (x, w, b) = (half_of(x, half)?, half_of(w, half)?, half_of(bias, half)?);
    if x.device() == Device::Cpu {
        return widened(half, &[&x, &w, &b], |t| super::add(&super::matmul_t(&t[0], &t[1], false, true)?, &t[2])).map(Some);
    }
    super::linear(&x, &w, Some(&b)).map(Some)
}

/// A convolution `f(x, w, bias)` under autocast (half inputs, a half
/// result), or `None` when autocast does not apply. Called first by the conv ops.
pub(crate) fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    f: impl FnOnce(&Tensor, &Tensor, Option<&Tensor>) -> Result<Tensor>,
) -> Result<Option<Tensor>> {
    let Some(half) = applies(x, w).filter(|&h| bias.is_none_or(|b| b.dtype() == DType::F32 || b.dtype() == h)) else { return Ok(None) };
    let _off = set_autocast(None)?;
    let (x, w) = (half_of(x, half)?, half_of(w, half)?);
    let b = bias.map(|b| half_of(b, half)).transpose()?;
    if x.device() == Device::Cpu {
        let mut ins = vec![&x, &w];
        ins.extend(b.as_ref());
        return widened(half, &ins, |t| f(&t[0], &t[1], t.get(2))).map(Some);
    }
    f(&x, &w, b.as_ref()).map(Some)
}
