//! `Shape`: the dimensions of a contiguous row-major tensor.

use crate::error::{Error, Result};

/// The dimensions of a tensor, outermost first.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: Vec<usize>) -> Self {
        Shape(dims)
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// The number of elements (1 for a scalar).
    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }
    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut s = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.0[i + 1];
        }
        s
    }
    /// Resolves a possibly negative dim (`-1` is the last) against this rank.
    pub fn dim(&self, op: &'static str, d: isize) -> Result<usize> {
        let r = self.0.len() as isize;
        let dd = if d < 0 { d + r } else { d };
        if dd < 0 || dd >= r {
            return Err(Error::DimOutOfRange { op, dim: d, rank: self.0.len() });
        }
        Ok(dd as usize)
    }
    /// `(outer, size, inner)` around dim `d`: the layout every per-dim kernel uses.
    pub fn split_at_dim(&self, d: usize) -> (usize, usize, usize) {
        let outer = self.0[..d].iter().product();
        let inner = self.0[d + 1..].iter().product();
        (outer, self.0[d], inner)
    }
    /// The shape both operands broadcast to, NumPy rules.
    pub fn broadcast(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
        let r = a.rank().max(b.rank());
        let mut out = vec![0; r];
        for i in 0..r {
            let da = if i + a.rank() >= r { a.0[i + a.rank() - r] } else { 1 };
            let db = if i + b.rank() >= r { b.0[i + b.rank() - r] } else { 1 };
            out[i] = if da == db || db == 1 {
                da
            } else if da == 1 {
                db
            } else {
                return Err(Error::Broadcast { op, lhs: a.clone(), rhs: b.clone() });
            };
        }
        Ok(Shape(out))
    }
    /// Strides of `self` when broadcast to `target` (0 on broadcast dims).
    pub fn broadcast_strides(&self, target: &Shape) -> Vec<usize> {
        let r = target.rank();
        let own = self.strides();
        (0..r)
            .map(|i| {
                if i + self.rank() < r {
                    0
                } else {
                    let j = i + self.rank() - r;
                    if self.0[j] == 1 && target.0[i] != 1 {
                        0
                    } else {
                        own[j]
                    }
                }
            })
            .collect()
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(v)
    }
}
impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(v.to_vec())
    }
}
impl From<&Vec<usize>> for Shape {
    fn from(v: &Vec<usize>) -> Self {
        Shape(v.clone())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(v.to_vec())
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(vec![])
    }
}
