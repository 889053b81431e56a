//! Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//!
//! Element `i` of a draw made at offset `o` is a pure function of
//! `(seed, o + i/4, i%4)`, so a GPU kernel reproduces the CPU's numbers and a
//! recomputation (activation checkpointing) reproduces the same dropout mask
//! by restoring `(seed, offset)`.

use std::cell::RefCell;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox4x32-10 block: four 32-bit words for counter `ctr` and `key`.
pub fn philox4x32(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for _ in 0..10 {
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        c = [((p1 >> 32) as u32) ^ c[1] ^ k[0], p1 as u32, ((p0 >> 32) as u32) ^ c[3] ^ k[1], p0 as u32];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// Blocks per call of [`philox4x32_lanes`].
const LANES: usize = 16;

/// [`philox4x32`] of the `LANES` consecutive counters `b, b+1, …`: word `j`
/// of block `b + l` is `[j][l]`. Each word is an array over the blocks, so
/// the rounds run as vector instructions instead of one block at a time.
#[inline(always)]
fn philox4x32_lanes(b: u64, key: [u32; 2]) -> [[u32; LANES]; 4] {
    let mut c = [[0u32; LANES]; 4];
    for l in 0..LANES {
        let x = b.wrapping_add(l as u64);
        c[0][l] = x as u32;
        c[1][l] = (x >> 32) as u32;
    }
    let mut k = key;
    for _ in 0..10 {
        let mut n = [[0u32; LANES]; 4];
        for l in 0..LANES {
            let p0 = (M0 as u64) * (c[0][l] as u64);
            let p1 = (M1 as u64) * (c[2][l] as u64);
            n[0][l] = ((p1 >> 32) as u32) ^ c[1][l] ^ k[0];
            n[1][l] = p1 as u32;
            n[2][l] = ((p0 >> 32) as u32) ^ c[3][l] ^ k[1];
            n[3][l] = p0 as u32;
        }
        c = n;
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// Bernoulli picks of the words of consecutive blocks from `b0` into
/// `out`, as a loop compiled for the CPU's widest vectors (the rounds'
/// 32×32→64-bit products run 16 lanes at a time under AVX-512).
struct Fill<'a, T, P> {
    out: &'a mut [T],
    b0: u64,
    key: [u32; 2],
    pick: &'a P,
}

impl<T, P: Fn(u32) -> T> crate::backend::cpu::SimdLoop for Fill<'_, T, P> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        // Whole groups of LANES blocks through the lane-parallel rounds,
        // the rest one block at a time: the same words either way.
        let (b0, key, pick) = (self.b0, self.key, self.pick);
        let done = self.out.len() / (4 * LANES) * LANES;
        let mut groups = self.out.chunks_exact_mut(4 * LANES);
        for (gi, grp) in groups.by_ref().enumerate() {
            let w = philox4x32_lanes(b0 + (gi * LANES) as u64, key);
            for (l, quad) in grp.chunks_exact_mut(4).enumerate() {
                for (j, d) in quad.iter_mut().enumerate() {
                    *d = pick(w[j][l]);
                }
            }
        }
        for (bi, quad) in groups.into_remainder().chunks_mut(4).enumerate() {
            let b = b0 + (done + bi) as u64;
            let w = philox4x32([b as u32, (b >> 32) as u32, 0, 0], key);
            for (d, &wi) in quad.iter_mut().zip(&w) {
                *d = pick(wi);
            }
        }
    }
}

/// A seeded generator: a seed and a running offset (in 4-word blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rng {
    pub seed: u64,
    pub offset: u64,
}

impl Rng {
    /// A generator at offset 0.
    pub fn new(seed: u64) -> Self {
        Rng { seed, offset: 0 }
    }

    fn key(&self) -> [u32; 2] {
        [self.seed as u32, (self.seed >> 32) as u32]
    }

    /// The 32-bit word for element `i` of the draw starting at block `offset`.
    fn word(key: [u32; 2], offset: u64, i: usize) -> u32 {
        let b = offset + (i / 4) as u64;
        philox4x32([b as u32, (b >> 32) as u32, 0, 0], key)[i % 4]
    }

    /// Reserves `n` words and returns the block offset they start at (word
    /// `i` of the draw is word `i%4` of block `offset + i/4`; a GPU kernel
    /// that draws the same words in parallel reserves them here).
    pub fn advance(&mut self, n: usize) -> u64 {
        let o = self.offset;
        self.offset += n.div_ceil(4) as u64;
        o
    }

    /// `n` uniform numbers in the open interval (0, 1).
    pub fn uniform(&mut self, n: usize) -> Vec<f64> {
        let mut v = Vec::with_capacity(n);
        self.uniform_into(n, &mut v);
        v
    }

    /// Appends `n` uniform numbers to `out` (which the caller sized, e.g. with a fallible reserve).
    pub fn uniform_into(&mut self, n: usize, out: &mut Vec<f64>) {
        let key = self.key();
        let o = self.advance(n);
        out.extend((0..n).map(|i| to_unit(Self::word(key, o, i))));
    }

    /// `n` standard normal numbers (Box-Muller on pairs of uniforms).
    pub fn normal(&mut self, n: usize) -> Vec<f64> {
        let mut v = Vec::with_capacity(n);
        self.normal_into(n, &mut v);
        v
    }

    /// Appends `n` standard normal numbers to `out`.
    pub fn normal_into(&mut self, n: usize, out: &mut Vec<f64>) {
        let key = self.key();
        let o = self.advance(2 * n);
        out.extend((0..n).map(|i| {
            let u1 = to_unit(Self::word(key, o, 2 * i));
            let u2 = to_unit(Self::word(key, o, 2 * i + 1));
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        }));
    }

    /// `n` Bernoulli draws mapped to `yes` (probability `p`) or `no`: the
    /// same draws as [`Rng::bernoulli`], one Philox call per 4 words (not
    /// per word), in parallel over fixed chunks (the result never depends on
    /// the thread count). Dropout's mask.
    pub fn bernoulli_map<T: Copy + Send + Sync>(&mut self, n: usize, p: f64, yes: T, no: T) -> Vec<T> {
        let mut out = vec![no; n];
        self.bernoulli_into(&mut out, p, yes, no);
        out
    }

    /// [`Rng::bernoulli_map`] into `out` (every element written), for a
    /// caller that brings its own buffer.
    pub fn bernoulli_into<T: Copy + Send + Sync>(&mut self, out: &mut [T], p: f64, yes: T, no: T) {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 14;
        let key = self.key();
        let o = self.advance(out.len());
        // `to_unit(w) < p` as an integer compare: (w + 0.5)/2³² < p holds
        // exactly when w < p·2³² − 0.5 (both sides exact in f64), i.e. for
        // the `keep` words below ⌈p·2³² − 0.5⌉, so the draws are unchanged.
        let keep = (p * 4_294_967_296.0 - 0.5).ceil().clamp(0.0, 4_294_967_296.0) as u64;
        let pick = |w: u32| if (w as u64) < keep { yes } else { no };
        let fill = |ci: usize, c: &mut [T]| {
            let b0 = o + ((ci * CHUNK) / 4) as u64;
            crate::backend::cpu::simd(Fill { out: c, b0, key, pick: &pick });
        };
        if out.len() > CHUNK {
            out.par_chunks_mut(CHUNK).enumerate().for_each(|(ci, c)| fill(ci, c));
        } else {
            fill(0, out);
        }
    }

    /// `n` Bernoulli draws: true with probability `p`.
    pub fn bernoulli(&mut self, n: usize, p: f64) -> Vec<bool> {
        self.uniform(n).into_iter().map(|u| u < p).collect()
    }

    /// A uniform integer in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.uniform(1)[0] * n as f64) as usize).min(n.saturating_sub(1))
    }
}

fn to_unit(w: u32) -> f64 {
    (w as f64 + 0.5) / 4_294_967_296.0
}

thread_local! {
    static DEFAULT: RefCell<Rng> = const { RefCell::new(Rng { seed: 0, offset: 0 }) };
}

/// Seeds this thread's default generator (used by dropout), as `torch.manual_seed`.
pub fn manual_seed(seed: u64) {
    DEFAULT.with(|r| *r.borrow_mut() = Rng::new(seed));
}

/// The default generator's state, to save in a checkpoint or before a recompute.
pub fn get_state() -> Rng {
    DEFAULT.with(|r| *r.borrow())
}

/// Restores the default generator's state.
pub fn set_state(s: Rng) {
    DEFAULT.with(|r| *r.borrow_mut() = s);
}

/// Runs `f` with this thread's default generator.
pub fn with_default<R>(f: impl FnOnce(&mut Rng) -> R) -> R {
    DEFAULT.with(|r| f(&mut r.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn bernoulli_map_draws_what_bernoulli_draws() {
        // Sizes below, at and across the parallel chunk (16384 words), not multiples of 4.
        for n in [1, 7, 16384, 16385 * 3 + 2] {
            let mut a = Rng { seed: 0x1234_5678_9abc, offset: 5 };
            let mut b = a;
            let want: Vec<f32> = a.bernoulli(n, 0.9).into_iter().map(|k| if k { 2.5 } else { 0.0 }).collect();
            assert_eq!(b.bernoulli_map(n, 0.9, 2.5f32, 0.0), want, "n = {n}");
            assert_eq!(a, b, "both advance the generator alike");
        }
    }
}
