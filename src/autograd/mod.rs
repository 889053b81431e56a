//! The autograd tape: a Wengert list of recorded ops, per thread.
//!
//! An op whose inputs require grad (while grad mode is on) records a node:
//! the ids of its inputs and outputs, the tensors its backward needs, and a
//! closure that maps output gradients to input gradients. `backward(loss)`
//! walks the tape in reverse, accumulates gradients of intermediate tensors
//! by id and adds leaf gradients into the leaves' slots, then drops the
//! nodes, freeing everything they held. Where an intermediate tensor feeds
//! several nodes, the gradient it has gathered is offered to the next
//! node's backward, which may add its own into it in place (a GEMM with
//! beta 1: q, k and v reading one activation take no add launches; see
//! [`take_accumulator`]). `backward_with_hooks` also reports
//! each leaf the moment its gradient is final (what DDP's bucketed
//! all-reduce needs to overlap communication with the rest of backward).

mod checkpoint;
mod profile;

pub use checkpoint::checkpoint;
pub use profile::{is_profiling, profile_mark, profile_reset_clock, profile_step, start_profile, stop_profile, OpStat, Profile, SyncHook};

use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Maps the gradients of a node's outputs (None where no gradient reached an
/// output) and which inputs need a gradient to the gradients of its inputs.
pub type BackwardFn = Box<dyn FnOnce(&[Option<Tensor>], &[bool]) -> Result<Vec<Option<Tensor>>>>;

struct Input {
    id: TensorId,
    tracked: bool,
    /// The handle of a leaf input, whose slot receives its gradient.
    leaf: Option<Tensor>,
}

struct Node {
    name: &'static str,
    inputs: Vec<Input>,
    outputs: Vec<TensorId>,
    saved: Vec<Tensor>,
    backward: BackwardFn,
}

thread_local! {
    /// A stack of tapes: the bottom one is the training step's; activation
    /// checkpointing pushes one while it recomputes a segment.
    static TAPES: RefCell<Vec<Vec<Node>>> = RefCell::new(vec![Vec::new()]);
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    /// The gradients the inputs of the node whose backward is running have
    /// gathered so far, by input position, offered to its backward to add
    /// into in place ([`take_accumulator`]).
    static OFFERED: RefCell<Vec<Option<Tensor>>> = const { RefCell::new(Vec::new()) };
}

/// The gradient input `i` of the running backward has gathered so far from
/// the nodes walked before it, when autograd offers it and `fits` accepts
/// it. Offered are the gradients of inputs that are not leaves and appear
/// once among the node's inputs, held by no other handle, so the backward
/// may write into them. Taking one is a promise: the gradient the backward
/// returns for input `i` includes it (a GEMM adds its product into it with
/// beta 1, where a product and a separate add took two launches), and
/// autograd does not add it again. What is not taken is added as before.
pub(crate) fn take_accumulator(i: usize, fits: impl FnOnce(&Tensor) -> bool) -> Option<Tensor> {
    OFFERED.with(|o| {
        let mut o = o.borrow_mut();
        let slot = o.get_mut(i)?;
        if slot.as_ref().is_some_and(fits) {
            slot.take()
        } else {
            None
        }
    })
}

/// Moves the gathered gradients `take_accumulator` may hand out for these
/// inputs out of `grads`, by input position.
fn offers(inputs: &[Input], grads: &mut HashMap<TensorId, Tensor>) -> Vec<Option<Tensor>> {
    inputs
        .iter()
        .map(|inp| {
            let once = inputs.iter().filter(|o| o.id == inp.id).count() == 1;
            if !(inp.tracked && inp.leaf.is_none() && once && grads.get(&inp.id).is_some_and(Tensor::is_sole_owner)) {
                return None;
            }
            grads.remove(&inp.id)
        })
        .collect()
}

/// Whether ops record onto the tape.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped.
pub struct GradModeGuard(bool);

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.0));
    }
}

/// Sets grad mode until the guard drops.
pub fn set_grad_enabled(on: bool) -> GradModeGuard {
    GradModeGuard(GRAD_ENABLED.with(|g| g.replace(on)))
}

/// Adds `g` into a leaf's gradient (the first gradient is stored as it is,
/// later ones summed without recording); a tensor that is not a leaf keeps none.
fn accumulate_grad(t: &Tensor, g: Tensor) -> Result<()> {
    t.update_grad(|prev| {
        Ok(Some(match prev {
            None => g,
            Some(prev) => no_grad(|| crate::ops::add(&prev, &g))?,
        }))
    })
}

/// Runs `f` without recording (as `torch.no_grad()`).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = set_grad_enabled(false);
    f()
}

/// Whether an op over `inputs` must record.
pub fn needs_grad(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Records a one-output op. `out` is the untracked result; the returned
/// tensor is the tracked output when recording, else `out` itself.
/// `saved` lists what the closure keeps alive (for memory accounting).
pub fn record(
    name: &'static str,
    inputs: &[&Tensor],
    out: Tensor,
    saved: Vec<Tensor>,
    backward: impl FnOnce(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + 'static,
) -> Tensor {
    if !needs_grad(inputs) {
        return out;
    }
    let tracked = out.reshaped(out.shape().clone(), true);
    profile::profile_mark(name, out.size_in_bytes() as u64);
    push_node(
        name,
        inputs,
        vec![tracked.id()],
        saved,
        Box::new(move |g: &[Option<Tensor>], needs: &[bool]| match &g[0] {
            Some(g0) => backward(g0, needs),
            None => Ok(vec![None; needs.len()]),
        }),
    );
    tracked
}

/// Records a node with several outputs (their ids, already tracked).
pub(crate) fn push_node(name: &'static str, inputs: &[&Tensor], outputs: Vec<TensorId>, saved: Vec<Tensor>, backward: BackwardFn) {
    let inputs = inputs.iter().map(|t| Input { id: t.id(), tracked: t.requires_grad(), leaf: if t.is_leaf() { Some((*t).clone()) } else { None } }).collect();
    let node = Node { name, inputs, outputs, saved, backward };
    TAPES.with(|t| {
        if let Some(top) = t.borrow_mut().last_mut() {
            top.push(node)
        }
    });
}

/// Number of nodes on the current tape.
pub fn tape_len() -> usize {
    TAPES.with(|t| t.borrow().last().map_or(0, |v| v.len()))
}

/// Bytes of distinct storage the current tape keeps alive for backward.
pub fn tape_saved_bytes() -> usize {
    TAPES.with(|t| {
        let t = t.borrow();
        let mut seen: Vec<&Tensor> = Vec::new();
        let mut bytes = 0;
        for n in t.last().into_iter().flatten() {
            for s in &n.saved {
                if !seen.iter().any(|p| p.same_storage(s)) {
                    bytes += s.size_in_bytes();
                    seen.push(s);
                }
            }
        }
        bytes
    })
}

/// Drops every recorded node (a forward whose backward will never run).
pub fn clear_tape() {
    let nodes = TAPES.with(|t| t.borrow_mut().last_mut().map(std::mem::take));
    drop(nodes);
}

/// The op names on the current tape, oldest first (for debugging and tests).
pub fn tape_ops() -> Vec<&'static str> {
    TAPES.with(|t| t.borrow().last().map_or(vec![], |v| v.iter().map(|n| n.name).collect()))
}

/// Back-propagates from a one-element `loss` (seed gradient 1) and empties the tape.
pub fn backward(loss: &Tensor) -> Result<()> {
    if loss.elem_count() != 1 {
        return Err(Error::Autograd(format!("backward needs a one-element loss, got shape {}; use backward_with for others", loss.shape())));
    }
    let seed = loss.ones_like()?;
    backward_with(&[(loss.clone(), seed)])
}

/// Called with a leaf once its gradient is final for this backward.
pub type LeafHook<'a> = &'a mut dyn FnMut(&Tensor) -> Result<()>;

/// [`backward`] that calls `hook` with every leaf on the tape as soon as its
/// gradient is final: right after the last node (in the reverse walk) that
/// takes it as an input has run. A leaf that an activation-checkpointed
/// segment may also use is reported only after the walk passes the
/// earliest checkpoint node (its recompute adds to gradients of leaves the
/// outer tape does not list). Leaves that are not on the tape are never
/// reported; an error from `hook` ends the backward.
pub fn backward_with_hooks(loss: &Tensor, hook: LeafHook) -> Result<()> {
    if loss.elem_count() != 1 {
        clear_tape();
        return Err(Error::Autograd(format!("backward needs a one-element loss, got shape {}", loss.shape())));
    }
    let seed = loss.ones_like()?;
    backward_impl(&[(loss.clone(), seed)], Some(hook))
}

/// Back-propagates from several outputs with the given gradients and empties the tape.
pub fn backward_with(seeds: &[(Tensor, Tensor)]) -> Result<()> {
    backward_impl(seeds, None)
}

fn backward_impl(seeds: &[(Tensor, Tensor)], hook: Option<LeafHook>) -> Result<()> {
    for (t, g) in seeds {
        if !t.requires_grad() {
            clear_tape();
            return Err(Error::Autograd("backward on a tensor that does not require grad (was it computed under no_grad?)".into()));
        }
        if t.shape() != g.shape() {
            clear_tape();
            return Err(Error::ShapeMismatch { op: "backward", expected: t.shape().to_string(), got: g.shape().to_string() });
        }
    }
    let nodes = TAPES.with(|t| t.borrow_mut().last_mut().map(std::mem::take).unwrap_or_default());
    let _g = set_grad_enabled(false);
    let mut grads: HashMap<TensorId, Tensor> = HashMap::new();
    for (t, g) in seeds {
        if t.is_leaf() {
            accumulate_grad(t, g.clone())?;
        } else {
            add_into(&mut grads, t.id(), g.clone())?;
        }
    }
    match hook {
        None => run(nodes, &mut grads, &mut [], &mut |_| Ok(())),
        Some(h) => {
            let mut ready = ready_points(&nodes);
            run(nodes, &mut grads, &mut ready, h)
        }
    }
}

/// For each node index, the leaves whose gradient is final once the reverse
/// walk has passed it (see [`backward_with_hooks`]).
fn ready_points(nodes: &[Node]) -> Vec<Vec<Tensor>> {
    let mut first: HashMap<TensorId, (usize, Tensor)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for inp in &n.inputs {
            if let (true, Some(leaf)) = (inp.tracked, &inp.leaf) {
                first.entry(inp.id).or_insert((i, leaf.clone()));
            }
        }
    }
    let earliest_checkpoint = nodes.iter().position(|n| n.name == "checkpoint").unwrap_or(usize::MAX);
    let mut at: Vec<Vec<Tensor>> = (0..nodes.len()).map(|_| Vec::new()).collect();
    let mut leaves: Vec<(usize, Tensor)> = first.into_values().collect();
    // A stable order within one node: by tensor id (creation order).
    leaves.sort_by_key(|(_, t)| t.id());
    for (i, t) in leaves {
        at[i.min(earliest_checkpoint)].push(t);
    }
    at
}

fn add_into(grads: &mut HashMap<TensorId, Tensor>, id: TensorId, g: Tensor) -> Result<()> {
    let v = match grads.remove(&id) {
        Some(prev) => crate::ops::add(&prev, &g)?,
        None => g,
    };
    grads.insert(id, v);
    Ok(())
}

/// Walks `nodes` in reverse; after node i, calls `hook` with the leaves of `ready[i]` (when given).
fn run(nodes: Vec<Node>, grads: &mut HashMap<TensorId, Tensor>, ready: &mut [Vec<Tensor>], hook: LeafHook) -> Result<()> {
    let mut nodes = nodes;
    while let Some(node) = nodes.pop() {
        let i = nodes.len();
        run_node(node, grads)?;
        if let Some(leaves) = ready.get_mut(i) {
            for leaf in std::mem::take(leaves) {
                hook(&leaf)?;
            }
        }
    }
    Ok(())
}

fn run_node(node: Node, grads: &mut HashMap<TensorId, Tensor>) -> Result<()> {
    let outs: Vec<Option<Tensor>> = node.outputs.iter().map(|id| grads.remove(id)).collect();
    if outs.iter().all(|g| g.is_none()) {
        return Ok(());
    }
    let needs: Vec<bool> = node.inputs.iter().map(|i| i.tracked).collect();
    let Node { name, inputs, backward, saved, .. } = node;
    profile::time_backward(name, || {
        // A nested backward (an activation checkpoint's recompute) offers
        // its own and puts these back after.
        let outer = OFFERED.with(|o| o.replace(offers(&inputs, grads)));
        let gin = backward(&outs, &needs);
        let left = OFFERED.with(|o| o.replace(outer));
        for (inp, g) in inputs.iter().zip(left) {
            if let Some(g) = g {
                grads.insert(inp.id, g);
            }
        }
        let gin = match gin {
            Ok(g) => g,
            Err(e) => return (Err(e), 0),
        };
        drop(saved);
        drop(outs);
        let bytes = gin.iter().flatten().map(|g| g.size_in_bytes() as u64).sum();
        (accumulate(name, inputs, gin, grads), bytes)
    })
}

/// Adds the gradients a node returned into its inputs' gradients.
fn accumulate(name: &'static str, inputs: Vec<Input>, gin: Vec<Option<Tensor>>, grads: &mut HashMap<TensorId, Tensor>) -> Result<()> {
    if gin.len() != inputs.len() {
        return Err(Error::Autograd(format!("{name}: backward returned {} gradients for {} inputs", gin.len(), inputs.len())));
    }
    for (inp, g) in inputs.into_iter().zip(gin) {
        let Some(g) = g else { continue };
        if !inp.tracked {
            continue;
        }
        match &inp.leaf {
            Some(leaf) => {
                if g.shape() != leaf.shape() {
                    return Err(Error::Autograd(format!("{name}: gradient of shape {} for an input of shape {}", g.shape(), leaf.shape())));
                }
                accumulate_grad(leaf, g)?
            }
            None => add_into(grads, inp.id, g)?,
        }
    }
    Ok(())
}

/// Runs a sub-tape built by `f` and back-propagates `seeds` through it
/// (activation checkpointing's recompute).
pub(crate) fn with_sub_tape<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    TAPES.with(|t| t.borrow_mut().push(Vec::new()));
    let r = {
        let _g = set_grad_enabled(true);
        f()
    };
    let rest = TAPES.with(|t| t.borrow_mut().pop());
    drop(rest);
    r
}
