//! Turns the CUDA version that cuda-graph-sys found (`DEP_CUDA_GRAPH_SYS_VERSION`) into `cfg`s:
//! `cuda_graph_child_move` where the headers have child-graph ownership transfer (12.9+), and
//! `cuda_graph_cuda13` for CUDA 13 headers.

fn main() {
    println!("cargo::rerun-if-env-changed=DEP_CUDA_GRAPH_SYS_VERSION");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_child_move)");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_cuda13)");
    let version: u32 = std::env::var("DEP_CUDA_GRAPH_SYS_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if version >= 12090 {
        println!("cargo::rustc-cfg=cuda_graph_child_move");
    }
    if version >= 13000 {
        println!("cargo::rustc-cfg=cuda_graph_cuda13");
    }
    println!("cargo::rustc-env=CUDA_GRAPH_CUDA_VERSION={version}");
}
