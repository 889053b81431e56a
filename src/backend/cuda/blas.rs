//! cuBLAS matrix products (filled in by the matmul commit).

/// The per-device cuBLAS handles.
pub(crate) struct Blas {}
