//! Finding a CUDA toolkit: the environment variables, `nvcc` on `PATH`, the usual prefixes, and
//! roots assembled from NVIDIA's PyPI wheels (`include/` and `lib/` side by side).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Environment variables that name a toolkit root, in the order they are tried.
pub const ROOT_VARS: [&str; 4] = [
    "CUDA_PATH",
    "CUDA_HOME",
    "CUDA_ROOT",
    "CUDA_TOOLKIT_ROOT_DIR",
];

/// Prefixes tried after the variables and `nvcc`.
const DEFAULT_ROOTS: [&str; 2] = ["/usr/local/cuda", "/opt/cuda"];

/// A toolkit the build can use: headers always, a runtime library where one is shipped.
#[derive(Debug)]
pub struct Toolkit {
    pub root: PathBuf,
    /// The directory holding `cuda.h`.
    pub include: PathBuf,
    /// Further include directories (the `crt/` headers of a wheel-assembled CUDA 12 root).
    pub extra_includes: Vec<PathBuf>,
    /// The directory holding `libcudart_static.a` or `libcudart.so*`, if any.
    pub lib: Option<PathBuf>,
    /// How the toolkit was found, for the build's messages.
    pub found_by: String,
    /// `CUDA_VERSION` from `cuda.h`, e.g. 13000.
    pub version: u32,
}

/// Finds a toolkit, or says where it looked. With `strict`, a root variable that is set but
/// unusable is an error instead of a reason to look further: the toolkit found elsewhere would
/// not be the one that was asked for.
pub fn find(strict: bool) -> Result<Toolkit, String> {
    let mut tried = Vec::new();
    for var in ROOT_VARS {
        if let Some(value) = env::var_os(var).filter(|v| !v.is_empty()) {
            let root = PathBuf::from(value);
            match probe(&root, format!("{var}={}", root.display())) {
                Ok(tk) => return Ok(tk),
                Err(why) if strict => return Err(format!("{var} is set but unusable: {why}")),
                Err(why) => {
                    println!("cargo::warning={var} is set but unusable: {why}");
                    tried.push(why);
                }
            }
        }
    }
    if let Some(nvcc) = find_on_path("nvcc") {
        let nvcc = fs::canonicalize(&nvcc).unwrap_or(nvcc);
        if let Some(root) = nvcc.parent().and_then(Path::parent) {
            match probe(root, format!("nvcc at {}", nvcc.display())) {
                Ok(tk) => return Ok(tk),
                Err(why) => tried.push(why),
            }
        }
    }
    for root in DEFAULT_ROOTS {
        match probe(Path::new(root), root.to_string()) {
            Ok(tk) => return Ok(tk),
            Err(why) => tried.push(why),
        }
    }
    Err(format!(
        "no CUDA toolkit found ({}; none of {} set)",
        tried.join("; "),
        ROOT_VARS.join(", ")
    ))
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// Checks one candidate root.
fn probe(root: &Path, found_by: String) -> Result<Toolkit, String> {
    let include = [
        "include",
        "targets/x86_64-linux/include",
        "targets/sbsa-linux/include",
    ]
    .iter()
    .map(|sub| root.join(sub))
    .find(|dir| dir.join("cuda.h").is_file() && dir.join("cuda_runtime.h").is_file())
    .ok_or_else(|| {
        format!(
            "{} has no include/cuda.h with cuda_runtime.h",
            root.display()
        )
    })?;
    let mut extra_includes = Vec::new();
    if !include.join("crt/host_config.h").is_file() {
        // PyPI's CUDA 12 wheels keep the crt/ headers in the nvcc wheel, beside the runtime one.
        let nvcc_include = root.join("../cuda_nvcc/include");
        if nvcc_include.join("crt/host_config.h").is_file() {
            extra_includes.push(nvcc_include);
        } else {
            return Err(format!(
                "{} lacks crt/host_config.h (for wheels, install nvidia-cuda-crt or nvidia-cuda-nvcc)",
                include.display()
            ));
        }
    }
    let version = read_cuda_version(&include.join("cuda.h"))?;
    let lib = [
        "lib64",
        "lib",
        "targets/x86_64-linux/lib",
        "targets/sbsa-linux/lib",
    ]
    .iter()
    .map(|sub| root.join(sub))
    .find(|dir| dir.join("libcudart_static.a").is_file() || has_shared_cudart(dir));
    Ok(Toolkit {
        root: root.to_path_buf(),
        include,
        extra_includes,
        lib,
        found_by,
        version,
    })
}

/// The file name of the shared runtime in `dir`: `libcudart.so`, else a versioned one.
pub fn shared_cudart(dir: &Path) -> Option<String> {
    if dir.join("libcudart.so").exists() {
        return Some("libcudart.so".into());
    }
    let mut names: Vec<String> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("libcudart.so."))
        .collect();
    names.sort();
    names.into_iter().next()
}

fn has_shared_cudart(dir: &Path) -> bool {
    shared_cudart(dir).is_some()
}

/// Reads `#define CUDA_VERSION N` from `cuda.h`.
pub fn read_cuda_version(cuda_h: &Path) -> Result<u32, String> {
    let text = fs::read_to_string(cuda_h).map_err(|e| format!("{}: {e}", cuda_h.display()))?;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("#define CUDA_VERSION"))
        .find_map(|rest| rest.trim().parse().ok())
        .ok_or_else(|| format!("{} defines no CUDA_VERSION", cuda_h.display()))
}
