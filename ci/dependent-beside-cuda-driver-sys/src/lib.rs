//! Both bindings in one crate: the driver API's result type of each, and the CUDA version the
//! cuda-graph-sys build found.

/// `CUDA_SUCCESS` as both crates spell it.
pub fn success_codes() -> (cuda_graph_sys::CUresult, cuda_driver_sys::cudaError_enum) {
    (
        cuda_graph_sys::CUresult::CUDA_SUCCESS,
        cuda_driver_sys::cudaError_enum::CUDA_SUCCESS,
    )
}

/// The headers' `CUDA_VERSION` that cuda-graph-sys was built from.
pub const CUDA_VERSION: u32 = cuda_graph_sys::CUDA_VERSION;

/// The safe layer is usable beside cuda-driver-sys too: the headers' version it was built with.
pub fn safe_layer_headers_version() -> i32 {
    cuda_graph::HEADERS_VERSION
}
