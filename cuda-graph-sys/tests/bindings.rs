//! The shipped bindings are bindgen's current output, and the generated extras hold together.

use cuda_graph_sys::{API_ALIASES, BINDINGS_SOURCE, CUDA_VERSION, CUresult, cudaError_t};

/// Whether `CUDA_GRAPH_REQUIRE_BINDGEN=1` is set: a build on the pregenerated bindings fails (the
/// build script refuses it), and so do the tests below if such a build reaches them anyway.
fn bindgen_required() -> bool {
    std::env::var("CUDA_GRAPH_REQUIRE_BINDGEN").is_ok_and(|v| v.trim() == "1")
}

/// Prints which headers and bindings this build used, as one line CI checks:
/// `cuda-graph-sys build: CUDA_VERSION <n>, bindings <bindgen|pregenerated>, headers <dir>`.
/// Under `CUDA_GRAPH_REQUIRE_BINDGEN=1`, fails unless the bindings came from bindgen.
#[test]
fn build_reports_its_headers_and_bindings() {
    let include = env!("CUDA_GRAPH_SYS_INCLUDE");
    let headers = if include.is_empty() { "none" } else { include };
    println!(
        "cuda-graph-sys build: CUDA_VERSION {CUDA_VERSION}, bindings {BINDINGS_SOURCE}, headers {headers}"
    );
    assert!(
        !bindgen_required() || BINDINGS_SOURCE == "bindgen",
        "CUDA_GRAPH_REQUIRE_BINDGEN=1 but this build used the {BINDINGS_SOURCE} bindings"
    );
}

/// Where a toolkit is present, the build generated fresh bindings; the shipped file for the same
/// version must be byte-for-byte the same (ci/gen-bindings.sh regenerates it). Without fresh
/// bindings it prints `SKIPPED`, except under `CUDA_GRAPH_REQUIRE_BINDGEN=1`, where it fails;
/// for a version that ships no bindings it prints `SKIPPED` with that reason.
#[test]
fn shipped_bindings_match_fresh_output() {
    let fresh = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    if BINDINGS_SOURCE != "bindgen" {
        assert!(
            !bindgen_required(),
            "CUDA_GRAPH_REQUIRE_BINDGEN=1 but this build used the {BINDINGS_SOURCE} bindings"
        );
        println!(
            "SKIPPED shipped_bindings_match_fresh_output: this build used the pregenerated bindings (no toolkit or no libclang)"
        );
        return;
    }
    // The runner's CARGO_MANIFEST_DIR first: a suite packed on one machine runs from a checkout
    // of the same revision elsewhere (nextest remaps it), where the build's path does not exist.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let path = format!("{manifest_dir}/src/pregenerated/cuda_{CUDA_VERSION}.rs");
    // Headers of a version without shipped bindings (12.3, the oldest supported) have nothing
    // to compare with; .ci/run asserts this line for them and the comparison for the others.
    let Ok(shipped) = std::fs::read_to_string(&path) else {
        println!(
            "SKIPPED shipped_bindings_match_fresh_output: no bindings ship for CUDA {CUDA_VERSION}"
        );
        return;
    };
    if shipped != fresh {
        let (line, (old, new)) = shipped
            .lines()
            .zip(fresh.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((
                shipped.lines().count().min(fresh.lines().count()),
                ("<end>", "<end>"),
            ));
        panic!(
            "{path} differs from bindgen's output for CUDA {CUDA_VERSION} at line {}:\n  shipped: {old}\n  fresh:   {new}\nrun ci/gen-bindings.sh",
            line + 1
        );
    }
    println!(
        "shipped_bindings_match_fresh_output: {path} equals bindgen's output ({} lines)",
        fresh.lines().count()
    );
}

#[test]
fn header_aliases_are_exported_under_the_c_name() {
    for (alias, symbol) in [
        ("cuMemAlloc", "cuMemAlloc_v2"),
        ("cuMemFree", "cuMemFree_v2"),
        ("cuGraphInstantiate", "cuGraphInstantiateWithFlags"),
        ("cuStreamBeginCapture", "cuStreamBeginCapture_v2"),
    ] {
        assert!(
            API_ALIASES.contains(&(alias, symbol)),
            "{alias} -> {symbol} missing from API_ALIASES"
        );
    }
    // The alias is the loading function itself, not a second declaration.
    assert_eq!(
        cuda_graph_sys::cuMemAlloc as *const () as usize,
        cuda_graph_sys::cuMemAlloc_v2 as *const () as usize
    );
    assert!(API_ALIASES.iter().all(|(a, s)| a != s && s.starts_with(a)));
}

#[test]
fn error_codes_have_their_c_names() {
    assert_eq!(CUresult::CUDA_SUCCESS.name(), Some("CUDA_SUCCESS"));
    assert_eq!(
        CUresult::CUDA_ERROR_INVALID_VALUE.name(),
        Some("CUDA_ERROR_INVALID_VALUE")
    );
    assert_eq!(
        cudaError_t::cudaErrorMemoryAllocation.name(),
        Some("cudaErrorMemoryAllocation")
    );
    // A value no header defines, as a newer driver might return, is representable and unnamed.
    assert_eq!(CUresult(123_456).name(), None);
}

#[test]
fn version_matches_the_metadata() {
    assert_eq!(
        env!("CUDA_GRAPH_SYS_CUDA_VERSION").parse::<u32>().unwrap(),
        CUDA_VERSION
    );
    const {
        assert!(
            CUDA_VERSION >= 12000,
            "these bindings support CUDA 12.x and newer"
        )
    };
}
