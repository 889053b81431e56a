//! Adam and AdamW over named parameters (`torch.optim.Adam` / `AdamW`).

use crate::backend::cpu::optim::{self as k, AdamStep};
use crate::backend::cuda::optim::{fused_adam, FusedOptions, FusedOutcome, FusedSlot};
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Tensor};

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
    /// Whether two parameters share one storage (the fused step would race).
    tied: bool,
}

impl Adam {
    /// An optimizer over `params` (name, leaf tensor), moments at zero.
    pub fn new(params: Vec<(String, Tensor)>, config: AdamConfig) -> Result<Adam> {
        let m = params.iter().map(|(_, p)| p.zeros_like()).collect::<Result<Vec<_>>>()?;
        let v = params.iter().map(|(_, p)| p.zeros_like()).collect::<Result<Vec<_>>>()?;
        let tied = params.iter().enumerate().any(|(i, (_, a))| params[..i].iter().any(|(_, b)| a.same_storage(b)));
        Ok(Adam { config, params, m, v, step: 0, tied })
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// One step at learning rate `lr` on every parameter that has a gradient.
    pub fn step(&mut self, lr: f64) -> Result<()> {
        self.step += 1;
        let h = self.hyper(lr, self.step);
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

    fn hyper(&self, lr: f64, t: u64) -> AdamStep {
        AdamStep {
            lr,
            beta1: self.config.betas.0,
            beta2: self.config.betas.1,
            eps: self.config.eps,
            weight_decay: self.config.weight_decay,
            decoupled: self.config.decoupled,
            t,
        }
    }

    /// The whole optimizer step on one GPU in a few launches: unscale by
    /// `o.inv_scale` (AMP), check for inf/NaN, take the global gradient
    /// norm, clip it to `o.max_norm`, and step unless a gradient was inf/NaN
    /// or the norm is not finite (the step count only advances on a step),
    /// with one read-back of the outcome. Bit-identical to
    /// [`GradScaler::unscale`](crate::optim::GradScaler::unscale),
    /// [`clip_grad_norm`](crate::optim::clip_grad_norm) and [`Adam::step`]
    /// in turn, but the gradients are left as they were (unscaled, unclipped).
    /// `Ok(None)` (nothing done) unless every parameter with a gradient,
    /// the gradient and both moments live on one CUDA device, at least one
    /// parameter has a gradient and no two parameters share a storage:
    /// then the per-tensor path applies.
    pub fn fused_step(&mut self, lr: f64, o: &FusedOptions) -> Result<Option<FusedOutcome>> {
        if self.tied {
            return Ok(None);
        }
        let with_grad: Vec<(usize, Tensor)> = self.params.iter().enumerate().filter_map(|(i, (_, p))| p.grad().map(|g| (i, g))).collect();
        let Some(&(i0, _)) = with_grad.first() else { return Ok(None) };
        let dev = self.params[i0].1.device();
        if !matches!(dev, Device::Cuda(_)) {
            return Ok(None);
        }
        for (i, g) in &with_grad {
            let (name, p) = &self.params[*i];
            if [p.device(), g.device(), self.m[*i].device(), self.v[*i].device()].iter().any(|d| *d != dev) {
                return Ok(None);
            }
            let dt = p.dtype();
            if !matches!(dt, DType::F32 | DType::F64) || [g.dtype(), self.m[*i].dtype(), self.v[*i].dtype()].iter().any(|d| *d != dt) {
                return Err(Error::invalid(
                    "adam",
                    format!("{name}: expected f32 or f64 parameter, gradient and moments of one dtype, got {dt:?} and a gradient of {:?}", g.dtype()),
                ));
            }
        }
        // Read guards on every buffer while the launches are queued: the
        // kernels write the parameters and moments on the device through
        // their pointers; the host-side storages are neither replaced nor
        // freed until the step's outcome is read back.
        let guards: Vec<_> = with_grad.iter().map(|(i, g)| [self.params[*i].1.storage(), g.storage(), self.m[*i].storage(), self.v[*i].storage()]).collect();
        let mut slots = Vec::with_capacity(guards.len());
        for ([p, g, m, v], (i, _)) in guards.iter().zip(&with_grad) {
            match (&**p, &**g, &**m, &**v) {
                (Storage::Cuda(p), Storage::Cuda(g), Storage::Cuda(m), Storage::Cuda(v)) => slots.push(FusedSlot { p, g, m, v }),
                _ => return Err(Error::Msg(format!("adam step on {}: a storage left its CUDA device during the step", self.params[*i].0))),
            }
        }
        let h = self.hyper(lr, self.step + 1);
        let out = fused_adam(&slots, &h, o).map_err(|e| Error::Msg(format!("fused adam step: {e}")));
        drop(slots);
        drop(guards);
        let out = out?;
        if !out.skipped {
            self.step += 1;
        }
        Ok(Some(out))
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
