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

#[cfg(not(feature = "cuda"))]
/// Where the emulated modules lib<stem>.so are (none without the `cuda` feature).
pub const EMU_DIR: &str = "";
#[cfg(not(feature = "cuda"))]
/// The stems of the emulated modules built.
pub const EMU_MODULES: &[&str] = &[];
#[cfg(not(feature = "cuda"))]
/// Why no emulated module was built.
pub const EMU_PROBLEM: &str = "built without the `cuda` feature";
#[cfg(not(feature = "cuda"))]
/// Every kernel's parameter kinds (none without the `cuda` feature).
pub static SIGNATURES: &[(&str, &str, &str)] = &[];

/// The fatbin of module `stem`, if embedded.
pub fn fatbin(stem: &str) -> Option<&'static [u8]> {
    KERNELS.iter().find(|(s, _)| *s == stem).map(|(_, b)| *b)
}

/// The parameter codes of `module/kernel` from its C signature (see
/// [`crate::backend::cuda::launch::ParamKind`]), if the build scanned it.
pub fn signature(module: &str, kernel: &str) -> Option<&'static str> {
    SIGNATURES.binary_search_by(|(m, k, _)| (*m, *k).cmp(&(module, kernel))).ok().map(|i| SIGNATURES[i].2)
}
