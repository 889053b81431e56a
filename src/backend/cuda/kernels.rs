//! The kernel modules build.rs compiled and embedded (none without nvcc or
//! without the `cuda` feature).

#[cfg(feature = "cuda")]
include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

#[cfg(not(feature = "cuda"))]
/// Embedded kernel modules: (file stem, fatbin).
pub static KERNELS: &[(&str, &[u8])] = &[];
#[cfg(not(feature = "cuda"))]
/// The architectures the kernels were compiled for.
pub static ARCHS: &str = "";

/// The fatbin of module `stem`, if embedded.
pub fn fatbin(stem: &str) -> Option<&'static [u8]> {
    KERNELS.iter().find(|(s, _)| *s == stem).map(|(_, b)| *b)
}
