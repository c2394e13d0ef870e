//! Prints the metadata its build script read and checked, after checking that the version it
//! saw is the one the crate was compiled with.

fn main() {
    let version: u32 = env!("CUDA_GRAPH_DEPENDENT_VERSION").parse().unwrap_or(0);
    if version != cuda_graph_sys::CUDA_VERSION {
        eprintln!(
            "DEP_CUDA_GRAPH_SYS_VERSION={version} but cuda_graph_sys::CUDA_VERSION is {}",
            cuda_graph_sys::CUDA_VERSION
        );
        std::process::exit(1);
    }
    // A use of the safe layer, so that it is built and linked as a dependency (without the
    // `example-kernels` feature, as a user's crate has it).
    let _ = cuda_graph::HEADERS_VERSION;
    println!(
        "cuda-graph-dependent: DEP_CUDA_GRAPH_SYS_* {}",
        env!("CUDA_GRAPH_DEPENDENT_METADATA")
    );
}

/// With the `cudarc` feature, the interop API as a dependent names it (compiled, not run).
#[cfg(feature = "cudarc")]
#[allow(dead_code)]
fn cudarc_interop(
    slice: &cuda_graph::CudarcSlice<u32>,
) -> (usize, cuda_graph::Result<&cuda_graph::Device>) {
    (slice.len(), Ok(slice.device()))
}
