//! The `Module` trait: a layer lists its own tensors and its children, and
//! everything else (named parameters, buffers, state dict, train/eval,
//! parameter count, the printed tree) is derived from that, in the order
//! PyTorch's `state_dict` uses: a module's own tensors first, then its
//! children in registration order.

use crate::tensor::Tensor;

/// What role a named tensor plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// A trainable leaf (receives gradients, updated by the optimizer).
    Param,
    /// Persistent state that is not trained (running statistics, CMVN stats).
    Buffer,
    /// A persistent buffer that is a pure function of the config (positional
    /// tables): saved like a buffer, but a checkpoint may lack it.
    Constant,
}

/// One entry of a state dict.
#[derive(Clone, Debug)]
pub struct NamedTensor {
    /// The dotted key, as in WeNet's `state_dict`.
    pub name: String,
    /// The tensor handle (shares storage with the module).
    pub tensor: Tensor,
    /// Its role.
    pub kind: TensorKind,
}

/// A layer or a model: a tree of named tensors.
pub trait Module {
    /// One line describing this module (its type and settings).
    fn describe(&self) -> String;

    /// This module's own tensors (not its children's), in registration order.
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        Vec::new()
    }

    /// The child modules with their names, in registration order.
    fn children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }

    /// The child modules, mutably, in the same order as [`Module::children`].
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        Vec::new()
    }

    /// Sets this module's own training flag (children are handled by [`Module::train`]).
    fn set_own_training(&mut self, _training: bool) {}

    /// Switches this module and all its descendants to training (`true`) or eval mode.
    fn train(&mut self, training: bool) {
        self.set_own_training(training);
        for c in self.children_mut() {
            c.train(training);
        }
    }

    /// Every tensor of the tree under `prefix`, own tensors before children's.
    fn state_dict_with_prefix(&self, prefix: &str) -> Vec<NamedTensor> {
        let mut out: Vec<NamedTensor> = self.own_tensors().into_iter().map(|(n, tensor, kind)| NamedTensor { name: join(prefix, n), tensor, kind }).collect();
        for (name, child) in self.children() {
            out.extend(child.state_dict_with_prefix(&join(prefix, &name)));
        }
        out
    }

    /// Every parameter and buffer, keyed as WeNet's `state_dict`.
    fn state_dict(&self) -> Vec<NamedTensor> {
        self.state_dict_with_prefix("")
    }

    /// The trainable leaves in a stable order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.state_dict().into_iter().filter(|e| e.kind == TensorKind::Param).map(|e| (e.name, e.tensor)).collect()
    }

    /// The non-trained state (running statistics, `num_batches_tracked`, CMVN, positional tables).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.state_dict().into_iter().filter(|e| e.kind != TensorKind::Param).map(|e| (e.name, e.tensor)).collect()
    }

    /// Lists of parameters that autocast casts into one tensor each
    /// ([`crate::ops::autocast_params_packed`]): the `qkv` fusion's packed
    /// attention projections, empty with it off. By default the children's;
    /// a layer holding attention says which projections it packs.
    fn weight_packs(&self) -> Vec<Vec<Tensor>> {
        self.children().into_iter().flat_map(|(_, c)| c.weight_packs()).collect()
    }

    /// The trainable leaves in groups of one layer each, for autocast's
    /// weight casts ([`crate::ops::autocast_params`]): a parameter belongs
    /// to the path up to its first numbered component (`encoder.encoders.3`),
    /// or to its module when its name has none (`decoder.output_layer`).
    fn layer_groups(&self) -> Vec<Vec<Tensor>> {
        let mut keys: Vec<String> = Vec::new();
        let mut groups: Vec<Vec<Tensor>> = Vec::new();
        for (name, t) in self.named_parameters() {
            let parts: Vec<&str> = name.split('.').collect();
            let end = parts.iter().position(|p| p.parse::<usize>().is_ok()).map_or(parts.len().saturating_sub(1), |i| i + 1);
            let key = parts[..end].join(".");
            match keys.iter().position(|k| *k == key) {
                Some(i) => groups[i].push(t),
                None => {
                    keys.push(key);
                    groups.push(vec![t]);
                }
            }
        }
        groups
    }

    /// The trainable leaves without their names.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// The number of trainable scalars (what WeNet prints as "the number of model params").
    fn num_parameters(&self) -> usize {
        self.named_parameters().iter().map(|(_, t)| t.elem_count()).sum()
    }

    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        for (_, p) in self.named_parameters() {
            p.zero_grad();
        }
    }

    /// The module tree with shapes, indented as PyTorch prints a module.
    fn format_tree(&self) -> String {
        let mut s = String::new();
        write_tree(self, "", 0, &mut s);
        s
    }
}

fn write_tree<M: Module + ?Sized>(m: &M, name: &str, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    let head = if name.is_empty() { String::new() } else { format!("({name}): ") };
    let kids = m.children();
    let own = m.own_tensors();
    if kids.is_empty() && own.is_empty() {
        out.push_str(&format!("{pad}{head}{}\n", m.describe()));
        return;
    }
    out.push_str(&format!("{pad}{head}{} (\n", m.describe()));
    for (n, t, kind) in own {
        let tag = match kind {
            TensorKind::Param => "param",
            TensorKind::Buffer => "buffer",
            TensorKind::Constant => "constant",
        };
        out.push_str(&format!("{pad}  {n}: {tag} {}\n", format_shape(t.dims())));
    }
    for (n, c) in kids {
        write_tree(c, &n, depth + 1, out);
    }
    out.push_str(&format!("{pad})\n"));
}

/// A shape as `256x1x15`, and a 0-dim shape as `scalar`.
pub fn format_shape(dims: &[usize]) -> String {
    if dims.is_empty() {
        return "scalar".into();
    }
    dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}
