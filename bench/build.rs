//! Build script of cuda-graph-bench: compiles the C baseline (`c/graph_bench.c`, the workloads
//! written with the CUDA runtime API as the Programming Guide writes them) with the `cc` crate
//! against the very headers cuda-graph-sys used (`DEP_CUDA_GRAPH_SYS_INCLUDE`), into a static
//! library that the benchmark links; the runtime it calls is the one cuda-graph-sys links
//! (statically, by default).
//!
//! Nothing is compiled when there are no headers (a build on pregenerated bindings) or no runtime
//! library to link (cuda-graph-sys resolving runtime functions at run time,
//! `DEP_CUDA_GRAPH_SYS_CUDART` = `loaded`): the cfg `cuda_graph_bench_no_c` then makes the
//! benchmark say why it cannot compare.

use std::env;
use std::path::PathBuf;

/// The static library the C baseline is compiled into.
const LIB: &str = "cuda_graph_bench_c";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=c/graph_bench.c");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_bench_no_c)");

    // Published by cuda-graph-sys (`links = "cuda_graph_sys"`); a change there reruns this script.
    let include = env::var("DEP_CUDA_GRAPH_SYS_INCLUDE").unwrap_or_default();
    let root = env::var("DEP_CUDA_GRAPH_SYS_ROOT").unwrap_or_default();
    let extra = env::var_os("DEP_CUDA_GRAPH_SYS_EXTRA_INCLUDES").unwrap_or_default();
    let version = env::var("DEP_CUDA_GRAPH_SYS_VERSION").unwrap_or_default();
    let cudart = env::var("DEP_CUDA_GRAPH_SYS_CUDART").unwrap_or_default();

    let why_not = if include.is_empty() {
        Some(format!(
            "cuda-graph-sys found no CUDA toolkit (it used pregenerated CUDA {version} bindings), so there are no headers to compile the C baseline against"
        ))
    } else if cudart == "loaded" {
        Some(format!(
            "cuda-graph-sys found headers in {include} but no CUDA runtime library to link, so the C baseline could not call the runtime API"
        ))
    } else {
        None
    };
    if let Some(reason) = why_not {
        println!("cargo::rustc-cfg=cuda_graph_bench_no_c");
        println!("cargo::rustc-env=CUDA_GRAPH_BENCH_C={reason}");
        return;
    }

    let mut dirs = vec![PathBuf::from(&include)];
    dirs.extend(env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    // CUDA 12 wheels from PyPI keep the crt/ headers that cuda_runtime.h needs in the nvcc wheel.
    if !root.is_empty() {
        let nvcc_include = PathBuf::from(&root).join("../cuda_nvcc/include");
        if nvcc_include.is_dir() && !dirs.contains(&nvcc_include) {
            dirs.push(nvcc_include);
        }
    }

    let mut build = cc::Build::new();
    build
        .file("c/graph_bench.c")
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        // clock_gettime and CLOCK_MONOTONIC under -std=c11.
        .define("_POSIX_C_SOURCE", "200809L")
        .opt_level(2);
    for dir in &dirs {
        build.include(dir);
    }
    // cc prints the link directives; the library comes before the runtime that cuda-graph-sys
    // links, so its runtime calls resolve there.
    build.compile(LIB);

    println!(
        "cargo::rustc-env=CUDA_GRAPH_BENCH_C=compiled against {} (CUDA {version}, runtime linked {cudart})",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" + "),
    );
}
