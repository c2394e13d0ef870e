//! Build script of cuda-graph-tests: compiles the C side of the ABI cross-check (`abi/probe.c`)
//! against the very headers cuda-graph-sys used, which it publishes as
//! `DEP_CUDA_GRAPH_SYS_INCLUDE` (and `DEP_CUDA_GRAPH_SYS_ROOT`; both unset without a toolkit).
//!
//! Without toolkit headers (a build on pregenerated bindings), nothing is compiled and the cfg
//! `cuda_graph_tests_no_abi_probe` tells `tests/abi.rs` to print why it skips (or to fail, under
//! `CUDA_GRAPH_REQUIRE_ABI=1`).

use std::env;
use std::path::PathBuf;

/// The static library the probe is compiled into; `tests/abi.rs` links it by this name.
const PROBE_LIB: &str = "cuda_graph_abi_probe";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=abi/probe.c");
    println!("cargo::rerun-if-changed=stub-driver/null_cuda.c");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_tests_no_abi_probe)");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_tests_pool_usage)");
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_tests_runtime_library)");
    // cc prints these itself only with its cargo metadata, which is off below.
    let target = env::var("TARGET").unwrap_or_default();
    for var in ["CC", "CFLAGS", "CRATE_CC_NO_DEFAULTS"] {
        println!("cargo::rerun-if-env-changed={var}");
        println!("cargo::rerun-if-env-changed=TARGET_{var}");
        println!("cargo::rerun-if-env-changed={var}_{target}");
        println!(
            "cargo::rerun-if-env-changed={var}_{}",
            target.replace('-', "_")
        );
    }

    build_stub_driver();

    // Published by cuda-graph-sys (`links = "cuda_graph_sys"`); a change there reruns this script.
    let include = env::var("DEP_CUDA_GRAPH_SYS_INCLUDE").unwrap_or_default();
    let root = env::var("DEP_CUDA_GRAPH_SYS_ROOT").unwrap_or_default();
    let version = env::var("DEP_CUDA_GRAPH_SYS_VERSION").unwrap_or_default();
    let bindings = env::var("DEP_CUDA_GRAPH_SYS_BINDINGS").unwrap_or_default();

    // The safe_ GPU tests use `cfg(cuda_graph_child_move)` as cuda-graph derives it: headers of
    // CUDA 12.9 or newer have child-graph ownership transfer.
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_child_move)");
    if version.parse::<u32>().is_ok_and(|v| v >= 12090) {
        println!("cargo::rustc-cfg=cuda_graph_child_move");
    }
    // ... and `cfg(cuda_graph_cond_switch)`: headers of CUDA 12.8 or newer have SWITCH
    // conditional nodes.
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_cond_switch)");
    if version.parse::<u32>().is_ok_and(|v| v >= 12080) {
        println!("cargo::rustc-cfg=cuda_graph_cond_switch");
    }

    // The runtime-API seed tests load their kernels with `cudaLibraryLoadData`, which the
    // oldest supported headers (12.3) lack: without it they are not built.
    let runtime_library = if include.is_empty() {
        version.parse::<u32>().is_ok_and(|v| v >= 12050)
    } else {
        std::fs::read_to_string(PathBuf::from(&include).join("cuda_runtime_api.h"))
            .is_ok_and(|text| text.contains("cudaLibraryLoadData("))
    };
    if runtime_library {
        println!("cargo::rustc-cfg=cuda_graph_tests_runtime_library");
    }

    // The checking stub driver of tests/hunt_stub.rs, compiled against these headers. It is
    // written against the CUDA 13.0 driver API (its entry points' signatures): the tests exist
    // only in builds on 13.0 headers or newer.
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_tests_hunt_stub)");
    if !include.is_empty() && version.parse::<u32>().is_ok_and(|v| v >= 13000) {
        println!("cargo::rustc-cfg=cuda_graph_tests_hunt_stub");
        let include = format!("-I{include}");
        build_stub(
            "hunt_cuda.c",
            "libhuntcuda.so",
            &["-O1", "-g", &include],
            "CUDA_GRAPH_TESTS_HUNT_STUB",
        );
    }

    if include.is_empty() {
        println!("cargo::rustc-cfg=cuda_graph_tests_no_abi_probe");
        println!(
            "cargo::rustc-env=CUDA_GRAPH_TESTS_ABI_PROBE=cuda-graph-sys found no CUDA toolkit and used its {} CUDA {} bindings, so there are no headers to compile the C probe against",
            if bindings.is_empty() {
                "pregenerated"
            } else {
                &bindings
            },
            version
        );
        return;
    }

    let mut dirs = vec![PathBuf::from(&include)];
    // CUDA 12 wheels from PyPI keep the crt/ headers that cuda_runtime.h needs in the nvcc wheel.
    if !root.is_empty() {
        let nvcc_include = PathBuf::from(&root).join("../cuda_nvcc/include");
        if nvcc_include.is_dir() {
            dirs.push(nvcc_include);
        }
    }

    let mut build = cc::Build::new();
    // `usage` in the pool properties came with CUDA 12.x headers after 12.3 (the oldest the
    // crates support): both tables list it where the headers have it.
    if pool_props_have_usage(&dirs) {
        println!("cargo::rustc-cfg=cuda_graph_tests_pool_usage");
        build.define("CUDA_GRAPH_POOL_USAGE", "1");
    }
    build
        .file("abi/probe.c")
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        // Link directives are ours: the library goes to the ABI test only (see tests/abi.rs).
        .cargo_metadata(false);
    for dir in &dirs {
        build.include(dir);
    }
    build.compile(PROBE_LIB);

    let out_dir = env::var("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    println!("cargo::rustc-link-search=native={out_dir}");
    println!(
        "cargo::rustc-env=CUDA_GRAPH_TESTS_ABI_PROBE=probe compiled against {} (CUDA {version}, cuda-graph-sys bindings: {bindings})",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" + "),
    );
}

/// Whether the headers' `CUmemPoolProps` and `cudaMemPoolProps` have the member `usage`: the
/// text of `cuda.h` and `driver_types.h` between each struct's opening and its closing brace.
fn pool_props_have_usage(dirs: &[PathBuf]) -> bool {
    let member_in = |file: &str, opening: &str| -> bool {
        dirs.iter()
            .filter_map(|d| std::fs::read_to_string(d.join(file)).ok())
            .any(|text| {
                text.find(opening).is_some_and(|start| {
                    let body = &text[start..];
                    let end = body.find("}").unwrap_or(body.len());
                    body[..end]
                        .lines()
                        .any(|l| l.split_whitespace().any(|w| w == "usage;"))
                })
            })
    };
    let driver = member_in("cuda.h", "typedef struct CUmemPoolProps_st {");
    let runtime = member_in(
        "driver_types.h",
        "struct __device_builtin__ cudaMemPoolProps {",
    );
    println!(
        "cargo::rerun-if-changed={}",
        dirs[0].join("cuda.h").display()
    );
    driver && runtime
}

/// Compiles `stub-driver/null_cuda.c` into a shared library for the stub tests, and tells them
/// where it is (`CUDA_GRAPH_TESTS_STUB_DRIVER`), or, when it could not be built, why
/// (`CUDA_GRAPH_TESTS_STUB_DRIVER_ERROR`).
fn build_stub_driver() {
    build_stub(
        "null_cuda.c",
        "libnullcuda.so",
        &["-O2"],
        "CUDA_GRAPH_TESTS_STUB_DRIVER",
    );
}

/// Compiles the C file `stub-driver/<source>` into the shared library `<lib>` with `args`, and
/// sets `<var>` to its path and `<var>_ERROR` to why it could not be built (empty when it was).
/// It goes directly into `OUT_DIR`, the one level of it that a nextest archive carries, so that
/// a packed suite finds it through `OUT_DIR` at run time on a machine without a C compiler or
/// the headers.
fn build_stub(source: &str, lib: &str, args: &[&str], var: &str) {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join(lib);
    let path = format!("stub-driver/{source}");
    println!("cargo::rerun-if-changed={path}");
    let mut command = cc::Build::new().get_compiler().to_command();
    command
        .args(args)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&path)
        .arg("-lpthread");
    let error = match command.output() {
        Ok(o) if o.status.success() => String::new(),
        Ok(o) => format!(
            "the C compiler failed on {path}: {}",
            String::from_utf8_lossy(&o.stderr).replace('\n', " ")
        ),
        Err(e) => format!("no C compiler to build {path}: {e}"),
    };
    println!("cargo::rustc-env={var}={}", out.display());
    println!("cargo::rustc-env={var}_ERROR={error}");
}
