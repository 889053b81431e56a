//! What the trainer prints about a model at start-up: the module tree with
//! shapes and WeNet's parameter-count line, and the `state_dict` key list
//! (`key 256x1x15`, one per line) for comparing with WeNet's by `diff`.

use crate::nn::{format_shape, Module};

/// `1234567` as `1,234,567`.
pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The module tree followed by "the number of model params: N".
pub fn model_summary(model: &dyn Module) -> String {
    format!("{}the number of model params: {}\n", model.format_tree(), thousands(model.num_parameters()))
}

/// Every state-dict key with its shape, one per line, in state-dict order.
pub fn state_dict_keys(model: &dyn Module) -> String {
    model.state_dict().iter().map(|e| format!("{} {}\n", e.name, format_shape(e.tensor.dims()))).collect()
}
