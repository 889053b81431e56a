//! Restoring the ZeRO engine's sharded optimizer state: every saving rank's
//! shard (`exp_avg`, `exp_avg_sq`, `master`) with its metadata (world size,
//! rank, numel, padded numel, the flat layout as `name:numel` items). With
//! the same world size each rank takes its own shard; with another one the
//! saved shards are concatenated in rank order, the old padding dropped, and
//! the new rank's range cut out (padded with zeros to the new shard length).

use super::flat::{parse_layout, FlatLayout};
use super::OptimizerState;
use crate::error::{Error, Result};

/// The tensors each shard holds, in the order [`reshard`] returns them.
pub const SHARD_TENSORS: [&str; 3] = ["exp_avg", "exp_avg_sq", "master"];

fn meta<'a>(s: &'a OptimizerState, i: usize, key: &str) -> Result<&'a str> {
    s.meta
        .get(key)
        .map(String::as_str)
        .ok_or_else(|| Error::checkpoint(format!("optimizer state of rank {i}"), format!("missing metadata key {key} (was it written by the ZeRO engine?)")))
}

fn meta_num(s: &OptimizerState, i: usize, key: &str) -> Result<usize> {
    let v = meta(s, i, key)?;
    v.parse().map_err(|_| Error::checkpoint(format!("optimizer state of rank {i}"), format!("metadata {key}: expected a non-negative integer, found {v:?}")))
}

/// The common Adam step count of the saved shards.
pub fn check_step(saved: &[OptimizerState]) -> Result<u64> {
    let first = saved.first().ok_or_else(|| Error::checkpoint("optimizer state", "expected the shards of every saving rank, found none"))?;
    for (i, s) in saved.iter().enumerate() {
        if s.step != first.step {
            return Err(Error::checkpoint(format!("optimizer state of rank {i}"), format!("Adam step {} differs from rank 0's {}", s.step, first.step)));
        }
    }
    Ok(first.step)
}

/// This rank's `[exp_avg, exp_avg_sq, master]` shards under `layout`, from every saving rank's state in rank order.
pub fn reshard(saved: &[OptimizerState], layout: &FlatLayout, rank: usize) -> Result<[Vec<f32>; 3]> {
    let old_world = saved.len();
    if old_world == 0 {
        return Err(Error::checkpoint("optimizer state", "expected the shards of every saving rank, found none"));
    }
    let want = layout.describe();
    let mut shards: Vec<[Vec<f32>; 3]> = Vec::with_capacity(old_world);
    let mut old_shard = 0usize;
    for (i, s) in saved.iter().enumerate() {
        let who = format!("optimizer state of rank {i}");
        let engine = meta(s, i, "engine")?;
        if engine != "zero" {
            return Err(Error::checkpoint(&who, format!("expected a ZeRO shard, found state of engine {engine:?}")));
        }
        let (w, r, numel, padded) = (meta_num(s, i, "world_size")?, meta_num(s, i, "rank")?, meta_num(s, i, "numel")?, meta_num(s, i, "padded_numel")?);
        if w != old_world || r != i {
            return Err(Error::checkpoint(&who, format!("expected rank {i} of {old_world} saved shards, found rank {r} of world size {w}")));
        }
        if numel != layout.numel || meta(s, i, "layout")? != want {
            let got = parse_layout(meta(s, i, "layout")?)?;
            let here: Vec<(String, usize)> = layout.entries.iter().map(|e| (e.name.clone(), e.numel)).collect();
            let diff = here.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(here.len().min(got.len()));
            let show = |v: &[(String, usize)]| v.get(diff).map_or("nothing".to_string(), |(n, k)| format!("{n} ({k} elements)"));
            return Err(Error::checkpoint(&who, format!("the saved flat layout ({numel} elements, {} parameters) differs from the model's ({} elements, {} parameters): at position {diff} expected {}, found {}", got.len(), layout.numel, here.len(), show(&here), show(&got))));
        }
        if padded % old_world != 0 || padded < numel {
            return Err(Error::checkpoint(&who, format!("padded size {padded} is not a multiple of the world size {old_world} at least numel {numel}")));
        }
        old_shard = padded / old_world;
        let mut parts: [Vec<f32>; 3] = Default::default();
        for (slot, name) in parts.iter_mut().zip(SHARD_TENSORS) {
            let t = s.tensors.iter().find(|(n, _)| n == name).ok_or_else(|| Error::checkpoint(&who, format!("missing tensor {name}")))?;
            let v = t.1.to_vec::<f32>().map_err(|e| Error::checkpoint(&who, format!("tensor {name}: {e}")))?;
            if v.len() != old_shard {
                return Err(Error::checkpoint(
                    &who,
                    format!("tensor {name}: expected {old_shard} elements (padded {padded} / world {old_world}), found {}", v.len()),
                ));
            }
            *slot = v;
        }
        shards.push(parts);
    }
    if old_world == layout.world_size {
        return Ok(std::mem::take(&mut shards[rank]));
    }
    let range = layout.shard_range(rank);
    let mut out: [Vec<f32>; 3] = Default::default();
    for (j, o) in out.iter_mut().enumerate() {
        let mut full: Vec<f32> = Vec::with_capacity(old_shard * old_world);
        shards.iter().for_each(|p| full.extend_from_slice(&p[j]));
        full.truncate(layout.numel);
        full.resize(layout.padded(), 0.0);
        *o = full[range.clone()].to_vec();
    }
    Ok(out)
}
