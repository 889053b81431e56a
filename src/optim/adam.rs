//! Adam and AdamW over named parameters (`torch.optim.Adam` / `AdamW`).

use crate::backend::cpu::optim::{self as k, AdamStep};
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Hyper-parameters (`optim_conf`): PyTorch's defaults.
#[derive(Clone, Copy, Debug)]
pub struct AdamConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW's decoupled weight decay.
    pub decoupled: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig { lr: 1e-3, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0, decoupled: false }
    }
}

/// Adam state: first and second moments per parameter, and the step count.
pub struct Adam {
    pub config: AdamConfig,
    params: Vec<(String, Tensor)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Optimizer steps taken.
    pub step: u64,
}

impl Adam {
    /// An optimizer over `params` (name, leaf tensor), moments at zero.
    pub fn new(params: Vec<(String, Tensor)>, config: AdamConfig) -> Result<Adam> {
        let m = params.iter().map(|(_, p)| p.zeros_like()).collect::<Result<Vec<_>>>()?;
        let v = params.iter().map(|(_, p)| p.zeros_like()).collect::<Result<Vec<_>>>()?;
        Ok(Adam { config, params, m, v, step: 0 })
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// One step at learning rate `lr` on every parameter that has a gradient.
    pub fn step(&mut self, lr: f64) -> Result<()> {
        self.step += 1;
        let h = AdamStep {
            lr,
            beta1: self.config.betas.0,
            beta2: self.config.betas.1,
            eps: self.config.eps,
            weight_decay: self.config.weight_decay,
            decoupled: self.config.decoupled,
            t: self.step,
        };
        for (i, (name, p)) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            // In place: the parameter and its moments are updated under their
            // storages' write locks, with no copy of any buffer.
            let gs = g.storage();
            let gdev = g.device();
            p.with_storage_mut(|ps| {
                self.m[i].with_storage_mut(|ms| {
                    self.v[i].with_storage_mut(|vs| match (ps, &*gs, ms, vs) {
                        (Storage::Cpu(ps), Storage::Cpu(gs), Storage::Cpu(ms), Storage::Cpu(vs)) => k::adam(ps, gs, ms, vs, &h),
                        (Storage::Cuda(ps), Storage::Cuda(gs), Storage::Cuda(ms), Storage::Cuda(vs)) => crate::backend::cuda::optim::adam(ps, gs, ms, vs, &h),
                        _ => Err(Error::invalid(
                            "adam",
                            format!("expected the parameter, its gradient and moments on one device, found the gradient on {gdev:?}"),
                        )),
                    })
                })
            })
            .map_err(|e| Error::Msg(format!("adam step on {name}: {e}")))?;
        }
        Ok(())
    }

    /// Clears every parameter's gradient.
    pub fn zero_grad(&self) {
        self.params.iter().for_each(|(_, p)| p.zero_grad());
    }

    /// The moments by name (`{name}.exp_avg`, `{name}.exp_avg_sq`), for checkpoints.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len());
        for (i, (n, _)) in self.params.iter().enumerate() {
            out.push((format!("{n}.exp_avg"), self.m[i].clone()));
            out.push((format!("{n}.exp_avg_sq"), self.v[i].clone()));
        }
        out
    }

    /// Restores moments saved by [`Adam::state`] and the step count; every key must be present.
    pub fn load_state(&mut self, state: &[(String, Tensor)], step: u64) -> Result<()> {
        for (i, (n, _)) in self.params.iter().enumerate() {
            for (suffix, dst) in [("exp_avg", &self.m[i]), ("exp_avg_sq", &self.v[i])] {
                let key = format!("{n}.{suffix}");
                let src = state.iter().find(|(k, _)| *k == key).ok_or_else(|| Error::Msg(format!("optimizer state: missing key {key}")))?;
                // Saved states load to the CPU; the moments live with their parameter.
                let src = src.1.clone().to_device(&dst.device())?;
                dst.assign(&src).map_err(|e| Error::Msg(format!("optimizer state {key}: {e}")))?;
            }
        }
        self.step = step;
        Ok(())
    }
}
