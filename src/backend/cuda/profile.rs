//! The GPU step profile: every launch of one step (kernels, cuBLAS and
//! cuBLASLt calls) with the bytes its buffers hold and the FLOPs of its
//! matrix product, grouped by kernel family, with a MODELLED H200 time and,
//! on a real GPU, the time CUDA events measured around each launch.
//!
//! Recording happens in the driver seam only while [`on`] is true (one
//! relaxed atomic load per launch; no allocation or lock when it is off).
//!
//! The model (a roofline with a launch cost): each launch takes
//! `max(bytes / HBM_BYTES_PER_S, flops / peak(dtype)) + LAUNCH_OVERHEAD_S`,
//! where bytes are those of the buffers it reads (`const T*` parameters,
//! GEMM operands) and writes (`T*` parameters, GEMM outputs). It ignores
//! caches, occupancy and tails: it is a floor for memory-bound kernels and a
//! yardstick for the rest, not a measurement.

use std::sync::atomic::{AtomicBool, Ordering};

/// HBM bandwidth of the model: about 4.3 TB/s, a large device copy measured
/// on an H200 (shared/GPU.md; the datasheet says 4.8 TB/s).
pub const HBM_BYTES_PER_S: f64 = 4.3e12;

/// Cost added to every launch in the model: 2 µs, an assumed figure for the
/// launch gap plus a minimal kernel's ramp on a busy stream (not measured here).
pub const LAUNCH_OVERHEAD_S: f64 = 2.0e-6;

/// Dense matrix-product peak of the model for a GEMM type, FLOP/s:
/// bf16/f16 790e12, measured through PyTorch on an H200 (shared/GPU.md; the
/// datasheet's dense figure is 989e12); tf32 494e12 (H200 datasheet:
/// 989 TFLOPS with sparsity, half of it dense); f32 67e12 (datasheet FP32,
/// no tensor cores); f64 67e12 (datasheet FP64 tensor core).
pub fn peak_flops(gemm_dtype: &str) -> f64 {
    match gemm_dtype {
        "bf16" | "f16" => 790e12,
        "tf32" => 494e12,
        _ => 67e12,
    }
}

static ON: AtomicBool = AtomicBool::new(false);

/// Whether launches are being recorded now (checked once per launch).
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns recording on or off (devices start and stop it; see `CudaDevice::start_profile`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn set_on(v: bool) {
    ON.store(v, Ordering::Relaxed);
}

/// One recorded launch.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRecord {
    /// The kernel name without its dtype suffix (`elementwise/add_bcast`), or the GEMM and its type.
    pub family: String,
    /// Bytes of the buffers it reads.
    pub bytes_read: u64,
    /// Bytes of the buffers it writes.
    pub bytes_written: u64,
    /// Floating-point operations of its matrix product (0 for kernels).
    pub flops: u64,
    /// The product's type for the peak (`bf16`, `f16`, `tf32`, `f32`, `f64`); None for kernels.
    pub gemm_dtype: Option<&'static str>,
    /// False when the kernel's signature was not scanned (its buffers all counted as read).
    pub kinds_known: bool,
}

impl LaunchRecord {
    /// The modelled H200 time of this launch, seconds.
    pub fn model_s(&self) -> f64 {
        let mem = (self.bytes_read + self.bytes_written) as f64 / HBM_BYTES_PER_S;
        let math = self.gemm_dtype.map_or(0.0, |d| self.flops as f64 / peak_flops(d));
        mem.max(math) + LAUNCH_OVERHEAD_S
    }
}

/// The dtype words of kernel names (`add_bcast_bf16`, `cast_f32_bf16`, `sum_cols_bf16_to_f32`).
const DTYPE_WORDS: [&str; 9] = ["bf16", "f16", "f32", "f64", "i64", "i32", "u32", "u16", "u8"];

/// A kernel's family: `module/kernel` without its dtype words
/// (`reduce/sum_cols_bf16_to_f32` is `reduce/sum_cols_to`).
pub fn family_of(module: &str, kernel: &str) -> String {
    let words: Vec<&str> = kernel.split('_').filter(|w| !DTYPE_WORDS.contains(w)).collect();
    let k = if words.is_empty() { kernel.to_string() } else { words.join("_") };
    format!("{module}/{k}")
}

/// One family's totals over the profiled step.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyRow {
    /// `module/kernel` without dtype, or `cublas/gemm bf16`-style for products.
    pub family: String,
    /// Launches.
    pub launches: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// GEMM FLOPs.
    pub flops: u64,
    /// Modelled H200 milliseconds.
    pub model_ms: f64,
    /// Milliseconds measured with CUDA events (a real GPU only).
    pub measured_ms: Option<f64>,
}

/// The per-family profile of one step.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct KernelProfile {
    /// The device it ran on (its name).
    pub device: String,
    /// Whether the device is the emulator (model only; no measured times).
    pub emulated: bool,
    /// Families, the largest modelled time first.
    pub rows: Vec<FamilyRow>,
    /// Launches of kernels whose signature was not scanned.
    pub unknown_kinds: u64,
}

impl KernelProfile {
    /// Groups `records` (each with its measured ms, if any) by family.
    pub fn from_records(device: String, emulated: bool, records: &[(LaunchRecord, Option<f64>)]) -> KernelProfile {
        let mut rows: Vec<FamilyRow> = Vec::new();
        let mut index = std::collections::HashMap::new();
        let mut unknown = 0;
        for (r, ms) in records {
            unknown += u64::from(!r.kinds_known);
            let i = *index.entry(r.family.clone()).or_insert_with(|| {
                rows.push(FamilyRow { family: r.family.clone(), launches: 0, bytes_read: 0, bytes_written: 0, flops: 0, model_ms: 0.0, measured_ms: None });
                rows.len() - 1
            });
            let row = &mut rows[i];
            row.launches += 1;
            row.bytes_read += r.bytes_read;
            row.bytes_written += r.bytes_written;
            row.flops += r.flops;
            row.model_ms += r.model_s() * 1e3;
            if let Some(ms) = ms {
                *row.measured_ms.get_or_insert(0.0) += ms;
            }
        }
        rows.sort_by(|a, b| b.model_ms.total_cmp(&a.model_ms).then_with(|| a.family.cmp(&b.family)));
        KernelProfile { device, emulated, rows, unknown_kinds: unknown }
    }
    /// Launches in the step.
    pub fn launches(&self) -> u64 {
        self.rows.iter().map(|r| r.launches).sum()
    }
    /// The row of `family`, if it ran.
    pub fn row(&self, family: &str) -> Option<&FamilyRow> {
        self.rows.iter().find(|r| r.family == family)
    }
    /// The modelled time of the step, ms.
    pub fn model_ms(&self) -> f64 {
        self.rows.iter().map(|r| r.model_ms).sum()
    }
    /// The table `bench-train --profile` prints.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut s = String::new();
        let _ = writeln!(s, "GPU step profile: one steady-state step on {}", self.device);
        let _ = writeln!(
            s,
            "model_ms is a MODEL of an H200, not a measurement: per launch max(bytes / {:.1} TB/s, FLOPs / peak) + {:.1} us; peaks bf16/f16 {:.0}, tf32 {:.0}, f32 {:.0}, f64 {:.0} TFLOP/s (see src/backend/cuda/profile.rs for sources)",
            HBM_BYTES_PER_S / 1e12,
            LAUNCH_OVERHEAD_S * 1e6,
            peak_flops("bf16") / 1e12,
            peak_flops("tf32") / 1e12,
            peak_flops("f32") / 1e12,
            peak_flops("f64") / 1e12
        );
        let measured = self.rows.iter().any(|r| r.measured_ms.is_some());
        if self.emulated {
            let _ = writeln!(s, "emulated device: the model only (no CUDA events; emulator time says nothing about a GPU)");
        } else if !measured {
            let _ = writeln!(s, "no event timings were recorded");
        }
        let _ =
            writeln!(s, "{:<44} {:>8} {:>11} {:>11} {:>10} {:>10} {:>11}", "family", "launches", "read_MiB", "write_MiB", "GFLOP", "model_ms", "measured_ms");
        let ms = |m: Option<f64>| m.map_or("-".to_string(), |v| format!("{v:.3}"));
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<44} {:>8} {:>11.3} {:>11.3} {:>10.3} {:>10.3} {:>11}",
                r.family,
                r.launches,
                mib(r.bytes_read),
                mib(r.bytes_written),
                r.flops as f64 / 1e9,
                r.model_ms,
                ms(r.measured_ms)
            );
        }
        let total_measured = measured.then(|| self.rows.iter().filter_map(|r| r.measured_ms).sum::<f64>());
        let _ = writeln!(
            s,
            "{:<44} {:>8} {:>11.3} {:>11.3} {:>10.3} {:>10.3} {:>11}",
            "total",
            self.launches(),
            mib(self.rows.iter().map(|r| r.bytes_read).sum()),
            mib(self.rows.iter().map(|r| r.bytes_written).sum()),
            self.rows.iter().map(|r| r.flops).sum::<u64>() as f64 / 1e9,
            self.model_ms(),
            ms(total_measured)
        );
        if self.unknown_kinds > 0 {
            let _ = writeln!(s, "{} launch(es) of kernels with no scanned signature: their buffers are counted as read", self.unknown_kinds);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_drop_every_dtype_suffix() {
        assert_eq!(family_of("elementwise", "add_bcast_bf16"), "elementwise/add_bcast");
        assert_eq!(family_of("cast", "cast_f32_bf16"), "cast/cast");
        assert_eq!(family_of("optim", "sum_partials"), "optim/sum_partials");
        assert_eq!(family_of("reduce", "sum_cols_bf16_to_f32"), "reduce/sum_cols_to");
    }

    #[test]
    fn the_model_is_the_larger_of_memory_and_math_plus_the_launch_cost() {
        let mem = LaunchRecord { family: "x".into(), bytes_read: 43_000_000, bytes_written: 0, flops: 0, gemm_dtype: None, kinds_known: true };
        assert!((mem.model_s() - (1e-5 + LAUNCH_OVERHEAD_S)).abs() < 1e-12);
        let gemm = LaunchRecord { family: "g".into(), bytes_read: 8, bytes_written: 8, flops: 790_000_000, gemm_dtype: Some("bf16"), kinds_known: true };
        assert!((gemm.model_s() - (1e-6 + LAUNCH_OVERHEAD_S)).abs() < 1e-12);
        let p = KernelProfile::from_records("d".into(), true, &[(mem.clone(), None), (gemm, Some(0.5)), (mem, None)]);
        assert_eq!(p.launches(), 3);
        assert_eq!(p.row("x").map(|r| (r.launches, r.bytes_read)), Some((2, 86_000_000)));
        assert_eq!(p.row("g").and_then(|r| r.measured_ms), Some(0.5));
        assert_eq!(p.rows[0].family, "x", "largest modelled time first");
    }
}
