//! Build script of cuda-graph-sys: find a toolkit, generate (or pick pregenerated) bindings,
//! generate the run-time loader, link the runtime, and publish the CUDA version to dependents.

mod generate;
mod loader_gen;
mod toolkit;

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The CUDA versions whose bindings ship in `src/pregenerated/`.
const PREGENERATED: [u32; 2] = [13000, 12090];

/// With this variable set to 1, a build that would use the pregenerated bindings fails instead:
/// where a toolkit was given on purpose (CI), a fallback would test other bindings than its own.
const REQUIRE_BINDGEN_VAR: &str = "CUDA_GRAPH_REQUIRE_BINDGEN";

/// Whether `CUDA_GRAPH_REQUIRE_BINDGEN=1` is set.
fn bindgen_required() -> bool {
    env::var(REQUIRE_BINDGEN_VAR).is_ok_and(|v| v.trim() == "1")
}

/// How the CUDA runtime reaches the binary.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cudart {
    /// `libcudart_static.a` from the toolkit (the default).
    Static,
    /// `libcudart.so` from the toolkit (feature `cudart-dynamic` or `CUDA_GRAPH_CUDART=dynamic`).
    Dynamic,
    /// No runtime library to link: runtime functions are resolved from `libcudart.so` at run time.
    Loaded,
}

impl Cudart {
    fn name(self) -> &'static str {
        match self {
            Cudart::Static => "static",
            Cudart::Dynamic => "dynamic",
            Cudart::Loaded => "loaded",
        }
    }
}

fn main() {
    if let Err(message) = run() {
        // A build script reports failure by exiting non-zero; the message is what cargo shows.
        eprintln!("cuda-graph-sys: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("no manifest dir")?);
    println!("cargo::rerun-if-changed=build");
    println!("cargo::rerun-if-changed=wrapper.h");
    println!("cargo::rerun-if-changed=src/pregenerated");
    for var in toolkit::ROOT_VARS.iter().chain(&[
        "PATH",
        "LIBCLANG_PATH",
        "DOCS_RS",
        "CUDA_GRAPH_PREGENERATED",
        "CUDA_GRAPH_CUDART",
        "CUDA_GRAPH_SYS_UPDATE_PREGENERATED",
        REQUIRE_BINDGEN_VAR,
    ]) {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(cuda_graph_sys_runtime_loaded)");

    let forced = env::var("CUDA_GRAPH_PREGENERATED")
        .ok()
        .filter(|v| !v.is_empty());
    let docs_rs = env::var_os("DOCS_RS").is_some();
    let found = if docs_rs {
        Err("building on docs.rs".to_string())
    } else if let Some(v) = &forced {
        Err(format!("CUDA_GRAPH_PREGENERATED={v} is set"))
    } else {
        toolkit::find(bindgen_required())
    };

    let wrapper = manifest.join("wrapper.h");
    let (bindings, version, toolkit, source) = match found {
        Ok(tk) => match generate::bindings(&tk, &wrapper, &out_dir) {
            Ok(text) => (text, tk.version, Some(tk), "bindgen"),
            Err(why) => {
                if bindgen_required() {
                    return Err(format!(
                        "bindgen could not run against {} ({why}), and {REQUIRE_BINDGEN_VAR}=1 forbids falling back to the pregenerated bindings",
                        tk.found_by
                    ));
                }
                let version = pregenerated_version(forced.as_deref())?;
                println!(
                    "cargo::warning=bindgen could not run against {} ({why}); using the pregenerated CUDA {} bindings",
                    tk.found_by,
                    dotted(version)
                );
                // The headers were found; the runtime library can still be linked.
                (
                    read_pregenerated(&manifest, version)?,
                    version,
                    Some(tk),
                    "pregenerated",
                )
            }
        },
        Err(why) => {
            if bindgen_required() {
                return Err(format!(
                    "{why}, and {REQUIRE_BINDGEN_VAR}=1 forbids falling back to the pregenerated bindings"
                ));
            }
            let version = pregenerated_version(forced.as_deref())?;
            if !docs_rs {
                println!(
                    "cargo::warning={why}: using the pregenerated CUDA {} bindings; runtime API functions load libcudart.so at run time",
                    dotted(version)
                );
            }
            (
                read_pregenerated(&manifest, version)?,
                version,
                None,
                "pregenerated",
            )
        }
    };
    write(&out_dir.join("bindings.rs"), &bindings)?;
    if env::var_os("CUDA_GRAPH_SYS_UPDATE_PREGENERATED").is_some() && source == "bindgen" {
        let path = manifest.join(format!("src/pregenerated/cuda_{version}.rs"));
        write(&path, &bindings)?;
        println!("cargo::warning=wrote {}", path.display());
    }

    let cudart = link_runtime(toolkit.as_ref().filter(|tk| tk.version == version), docs_rs)?;
    if cudart == Cudart::Loaded {
        println!("cargo::rustc-cfg=cuda_graph_sys_runtime_loaded");
    }
    let loader = loader_gen::generate(&bindings, cudart == Cudart::Loaded)?;
    write(&out_dir.join("loader.rs"), &loader)?;

    // Metadata for dependents (`links = "cuda_graph_sys"`: DEP_CUDA_GRAPH_SYS_VERSION, ...; the
    // formats are documented in README.md). A variable with nothing to say is left unset, never
    // set to an empty string: ROOT, INCLUDE and EXTRA_INCLUDES name the toolkit whose headers
    // VERSION describes, and are unset without one (pregenerated bindings of another version
    // than the toolkit found have no headers of their own).
    let headers = toolkit.as_ref().filter(|tk| tk.version == version);
    println!("cargo::metadata=version={version}");
    if let Some(tk) = headers {
        println!("cargo::metadata=root={}", absolute(&tk.root).display());
        println!(
            "cargo::metadata=include={}",
            absolute(&tk.include).display()
        );
        // Further include directories, separated by the platform's path separator.
        if !tk.extra_includes.is_empty() {
            let extra = env::join_paths(tk.extra_includes.iter().map(|p| absolute(p)))
                .map_err(|e| format!("joining the extra include directories: {e}"))?;
            println!("cargo::metadata=extra_includes={}", extra.to_string_lossy());
        }
    }
    println!("cargo::metadata=bindings={source}");
    println!("cargo::metadata=cudart={}", cudart.name());
    let include = headers
        .map(|tk| tk.include.display().to_string())
        .unwrap_or_default();
    println!("cargo::rustc-env=CUDA_GRAPH_SYS_CUDA_VERSION={version}");
    println!("cargo::rustc-env=CUDA_GRAPH_SYS_BINDINGS={source}");
    println!("cargo::rustc-env=CUDA_GRAPH_SYS_CUDART={}", cudart.name());
    println!("cargo::rustc-env=CUDA_GRAPH_SYS_INCLUDE={include}");
    Ok(())
}

/// The pregenerated version to use: `CUDA_GRAPH_PREGENERATED`, else the feature, else 13.0.
fn pregenerated_version(forced: Option<&str>) -> Result<u32, String> {
    let version = match forced {
        Some("13.0") | Some("13000") => 13000,
        Some("12.9") | Some("12090") => 12090,
        Some(other) => {
            return Err(format!(
                "CUDA_GRAPH_PREGENERATED={other}: pregenerated bindings exist for 13.0 and 12.9"
            ));
        }
        None if env::var_os("CARGO_FEATURE_PREGENERATED_12").is_some() => 12090,
        None => 13000,
    };
    debug_assert!(PREGENERATED.contains(&version));
    Ok(version)
}

fn read_pregenerated(manifest: &Path, version: u32) -> Result<String, String> {
    let path = manifest.join(format!("src/pregenerated/cuda_{version}.rs"));
    fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Emits the link directives for the runtime and says which way it was linked.
fn link_runtime(toolkit: Option<&toolkit::Toolkit>, docs_rs: bool) -> Result<Cudart, String> {
    let Some(lib) = toolkit.and_then(|tk| tk.lib.as_ref()).filter(|_| !docs_rs) else {
        return Ok(Cudart::Loaded);
    };
    let dynamic = env::var_os("CARGO_FEATURE_CUDART_DYNAMIC").is_some()
        || env::var("CUDA_GRAPH_CUDART").is_ok_and(|v| v == "dynamic");
    println!("cargo::rustc-link-search=native={}", lib.display());
    if dynamic {
        let name = toolkit::shared_cudart(lib).ok_or_else(|| {
            format!(
                "dynamic runtime asked for, but {} has no libcudart.so",
                lib.display()
            )
        })?;
        if name == "libcudart.so" {
            println!("cargo::rustc-link-lib=dylib=cudart");
        } else {
            println!("cargo::rustc-link-lib=dylib:+verbatim={name}");
        }
        Ok(Cudart::Dynamic)
    } else if lib.join("libcudart_static.a").is_file() {
        println!("cargo::rustc-link-lib=static=cudart_static");
        for system in ["rt", "dl", "pthread"] {
            println!("cargo::rustc-link-lib=dylib={system}");
        }
        Ok(Cudart::Static)
    } else {
        Err(format!(
            "{} has no libcudart_static.a; enable the cudart-dynamic feature to link libcudart.so",
            lib.display()
        ))
    }
}

/// `path` made absolute against this script's working directory (the package's directory, where
/// a relative `CUDA_PATH` was resolved), so that dependents' build scripts, which run elsewhere,
/// can use it; symbolic links are kept as they are.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn dotted(version: u32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    // Leave the file alone when unchanged, so dependents are not rebuilt for nothing.
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}
