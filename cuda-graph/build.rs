//! Turns the CUDA version that cuda-graph-sys found (`DEP_CUDA_GRAPH_SYS_VERSION`) into `cfg`s:
//! `cuda_graph_child_move` where the headers have child-graph ownership transfer (12.9+), and
//! `cuda_graph_cuda13` for CUDA 13 headers, `cuda_graph_cond_switch` where the headers have
//! SWITCH conditional nodes (12.8+). Headers older than CUDA 12.3, which lack entry points
//! the crate calls, stop the build with a message that says so.

/// The oldest headers the crate builds with (`CUDA_VERSION`): 12.3 brought
/// `cuStreamGetCaptureInfo_v3`, `cuGraphGetEdges_v2` and `cuGraphAddDependencies_v2`.
const OLDEST: u32 = 12030;

fn main() {
    println!("cargo::rerun-if-env-changed=DEP_CUDA_GRAPH_SYS_VERSION");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_child_move)");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_cuda13)");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_cond_switch)");
    let version: u32 = std::env::var("DEP_CUDA_GRAPH_SYS_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if version != 0 && version < OLDEST {
        eprintln!(
            "cuda-graph needs CUDA 12.3 headers or newer (cuStreamGetCaptureInfo_v3, cuGraphGetEdges_v2, cuGraphAddDependencies_v2); cuda-graph-sys found CUDA {}.{}: point CUDA_PATH at a newer toolkit, or unset it to build on the pregenerated 13.0 bindings",
            version / 1000,
            version % 1000 / 10
        );
        std::process::exit(1);
    }
    if version >= 12080 {
        println!("cargo::rustc-cfg=cuda_graph_cond_switch");
    }
    if version >= 12090 {
        println!("cargo::rustc-cfg=cuda_graph_child_move");
    }
    if version >= 13000 {
        println!("cargo::rustc-cfg=cuda_graph_cuda13");
    }
    println!("cargo::rustc-env=CUDA_GRAPH_CUDA_VERSION={version}");
}
