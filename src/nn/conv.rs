//! Convolutions with PyTorch's weight layouts and default initialisation:
//! `Conv1d` pointwise (kernel 1, [out, in, 1]) or depthwise (groups = C,
//! [C, 1, K]), and `Conv2d` ([out, in, kh, kw], square stride and padding).

use super::init::{kaiming_uniform_bound, uniform_param};
use super::module::{Module, TensorKind};
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::{DType, Rng, Tensor};

/// Which of the two 1-D convolutions the models need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conv1dKind {
    /// Kernel 1 across channels: a product per frame.
    Pointwise,
    /// One kernel per channel (groups = channels), zero padding on both sides.
    Depthwise {
        /// Kernel size.
        kernel: usize,
        /// Zero padding on each side.
        padding: usize,
    },
}

/// A 1-D convolution over (B, C, T).
#[derive(Clone, Debug)]
pub struct Conv1d {
    /// Weight [out, in, 1] (pointwise) or [C, 1, K] (depthwise).
    pub weight: Tensor,
    /// Bias [out], if any.
    pub bias: Option<Tensor>,
    /// Pointwise or depthwise.
    pub kind: Conv1dKind,
}

impl Conv1d {
    /// A pointwise convolution `in → out` channels.
    pub fn pointwise(cin: usize, cout: usize, bias: bool, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let bound = kaiming_uniform_bound(cin);
        let weight = uniform_param(&[cout, cin, 1], bound, dtype, rng)?;
        let bias = if bias { Some(uniform_param(&[cout], bound, dtype, rng)?) } else { None };
        Ok(Conv1d { weight, bias, kind: Conv1dKind::Pointwise })
    }

    /// A depthwise convolution over `c` channels with kernel `kernel` and zero `padding`.
    pub fn depthwise(c: usize, kernel: usize, padding: usize, bias: bool, dtype: DType, rng: &mut Rng) -> Result<Self> {
        if kernel == 0 {
            return Err(Error::invalid("Conv1d", "kernel size must be at least 1, got 0"));
        }
        // fan_in of a grouped conv is (in / groups) · k = k.
        let bound = kaiming_uniform_bound(kernel);
        let weight = uniform_param(&[c, 1, kernel], bound, dtype, rng)?;
        let bias = if bias { Some(uniform_param(&[c], bound, dtype, rng)?) } else { None };
        Ok(Conv1d { weight, bias, kind: Conv1dKind::Depthwise { kernel, padding } })
    }

    /// Applies the convolution to x (B, C, T) (PyTorch's layout; the
    /// depthwise kernels are channels last, so that case transposes around them).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.kind {
            Conv1dKind::Pointwise => ops::conv1d_pointwise(x, &self.weight, self.bias.as_ref()),
            Conv1dKind::Depthwise { padding, .. } => {
                if x.rank() != 3 {
                    return Err(Error::ShapeMismatch { op: "Conv1d", expected: "an input (B, C, T)".into(), got: format!("{}", x.shape()) });
                }
                let y = ops::conv1d_depthwise(&ops::transpose(x, 1, 2)?, &self.weight, self.bias.as_ref(), padding)?;
                ops::transpose(&y, 1, 2)
            }
        }
    }

    /// Applies the convolution to channels-last x (B, T, C) → (B, T', C'),
    /// without transposes (the Conformer convolution module).
    pub fn forward_channels_last(&self, x: &Tensor) -> Result<Tensor> {
        match self.kind {
            Conv1dKind::Pointwise => ops::conv1d_pointwise_channels_last(x, &self.weight, self.bias.as_ref()),
            Conv1dKind::Depthwise { padding, .. } => ops::conv1d_depthwise(x, &self.weight, self.bias.as_ref(), padding),
        }
    }
}

impl Module for Conv1d {
    fn describe(&self) -> String {
        let (o, i) = (self.weight.dims()[0], self.weight.dims()[1]);
        match self.kind {
            Conv1dKind::Pointwise => format!("Conv1d({i}, {o}, kernel_size=(1,), stride=(1,))"),
            Conv1dKind::Depthwise { kernel, padding } => {
                format!("Conv1d({o}, {o}, kernel_size=({kernel},), stride=(1,), padding=({padding},), groups={o})")
            }
        }
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        let mut v = vec![("weight", self.weight.clone(), TensorKind::Param)];
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone(), TensorKind::Param));
        }
        v
    }
}

/// A 2-D convolution over (B, Ci, H, W).
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// Weight [out, in, k, k].
    pub weight: Tensor,
    /// Bias [out].
    pub bias: Option<Tensor>,
    /// Stride on both axes.
    pub stride: usize,
    /// Zero padding on both axes.
    pub padding: usize,
}

impl Conv2d {
    /// A new `cin → cout` convolution with a square `kernel`.
    pub fn new(cin: usize, cout: usize, kernel: usize, stride: usize, padding: usize, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let bound = kaiming_uniform_bound(cin * kernel * kernel);
        let weight = uniform_param(&[cout, cin, kernel, kernel], bound, dtype, rng)?;
        let bias = Some(uniform_param(&[cout], bound, dtype, rng)?);
        Ok(Conv2d { weight, bias, stride, padding })
    }

    /// Applies the convolution.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::conv2d(x, &self.weight, self.bias.as_ref(), self.stride, self.padding)
    }

    /// `relu(self.forward(x))`: with the `subsampling` fusion on, the bias and
    /// the ReLU after the product in one launch each way (`ops::conv2d_relu`).
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        if ops::fusion::enabled(ops::fusion::Fusion::Subsampling) {
            ops::conv2d_relu(x, &self.weight, self.bias.as_ref(), self.stride, self.padding)
        } else {
            ops::relu(&self.forward(x)?)
        }
    }

    /// The kernel size.
    pub fn kernel(&self) -> usize {
        self.weight.dims()[2]
    }
}

impl Module for Conv2d {
    fn describe(&self) -> String {
        let d = self.weight.dims();
        format!("Conv2d({}, {}, kernel_size=({}, {}), stride=({s}, {s}))", d[1], d[0], d[2], d[3], s = self.stride)
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        let mut v = vec![("weight", self.weight.clone(), TensorKind::Param)];
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone(), TensorKind::Param));
        }
        v
    }
}
