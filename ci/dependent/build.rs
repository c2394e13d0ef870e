//! Reads the metadata cuda-graph-sys publishes to the build scripts of the crates that depend on
//! it directly (`links = "cuda_graph_sys"`), checks each value's documented format, and passes
//! them on to the binary. Any violation fails the build with a message that names the variable.

use std::env;
use std::path::Path;

const PREFIX: &str = "DEP_CUDA_GRAPH_SYS_";

/// The variable `DEP_CUDA_GRAPH_SYS_<name>`: `None` when unset; an error when set but empty or
/// not Unicode (a variable with nothing to say must be unset).
fn var(name: &str) -> Result<Option<String>, String> {
    let key = format!("{PREFIX}{name}");
    println!("cargo::rerun-if-env-changed={key}");
    match env::var(&key) {
        Ok(v) if v.is_empty() => Err(format!("{key} is set but empty (it must be unset instead)")),
        Ok(v) => Ok(Some(v)),
        Err(env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(format!("{key}: {e}")),
    }
}

fn check() -> Result<String, String> {
    let version = var("VERSION")?.ok_or(format!("{PREFIX}VERSION is not set"))?;
    let number: u32 = version
        .parse()
        .ok()
        .filter(|_| version.bytes().all(|b| b.is_ascii_digit()))
        .ok_or(format!(
            "{PREFIX}VERSION={version:?} is not a decimal CUDA_VERSION"
        ))?;
    // major * 1000 + minor * 10: CUDA 12.0 is 12000; the last digit is always 0.
    if !(12000..100_000).contains(&number) || number % 10 != 0 {
        return Err(format!(
            "{PREFIX}VERSION={version} is not a CUDA_VERSION of CUDA 12 or newer (e.g. 13000)"
        ));
    }
    let bindings = var("BINDINGS")?.ok_or(format!("{PREFIX}BINDINGS is not set"))?;
    if !["bindgen", "pregenerated"].contains(&bindings.as_str()) {
        return Err(format!(
            "{PREFIX}BINDINGS={bindings:?}: expected bindgen or pregenerated"
        ));
    }
    let cudart = var("CUDART")?.ok_or(format!("{PREFIX}CUDART is not set"))?;
    if !["static", "dynamic", "loaded"].contains(&cudart.as_str()) {
        return Err(format!(
            "{PREFIX}CUDART={cudart:?}: expected static, dynamic or loaded"
        ));
    }
    let root = var("ROOT")?;
    let include = var("INCLUDE")?;
    let extra = var("EXTRA_INCLUDES")?;
    match (&root, &include) {
        (Some(root), Some(include)) => {
            for (name, dir) in [("ROOT", root), ("INCLUDE", include)] {
                if !Path::new(dir).is_absolute() || !Path::new(dir).is_dir() {
                    return Err(format!("{PREFIX}{name}={dir}: not an absolute directory"));
                }
            }
            let cuda_h = Path::new(include).join("cuda.h");
            if !cuda_h.is_file() {
                return Err(format!("{PREFIX}INCLUDE={include} has no cuda.h"));
            }
            // The headers are the ones VERSION describes.
            let text = std::fs::read_to_string(&cuda_h).map_err(|e| format!("{cuda_h:?}: {e}"))?;
            let defined = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("#define CUDA_VERSION"))
                .find_map(|rest| rest.trim().parse::<u32>().ok());
            if defined != Some(number) {
                return Err(format!(
                    "{PREFIX}VERSION={version} but {} defines CUDA_VERSION {defined:?}",
                    cuda_h.display()
                ));
            }
        }
        (None, None) => {
            if bindings == "bindgen" {
                return Err(format!(
                    "{PREFIX}BINDINGS=bindgen but neither {PREFIX}ROOT nor {PREFIX}INCLUDE is set"
                ));
            }
            if extra.is_some() {
                return Err(format!(
                    "{PREFIX}EXTRA_INCLUDES is set without {PREFIX}INCLUDE"
                ));
            }
            if cudart != "loaded" {
                return Err(format!(
                    "{PREFIX}CUDART={cudart} without a toolkit (expected loaded)"
                ));
            }
        }
        _ => {
            return Err(format!(
                "{PREFIX}ROOT ({root:?}) and {PREFIX}INCLUDE ({include:?}) must be both set or both unset"
            ));
        }
    }
    if let Some(extra) = &extra {
        for dir in env::split_paths(extra) {
            if !dir.is_absolute() || !dir.is_dir() {
                return Err(format!(
                    "{PREFIX}EXTRA_INCLUDES={extra}: {} is not an absolute directory",
                    dir.display()
                ));
            }
        }
    }
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "unset".into());
    Ok(format!(
        "VERSION={version} BINDINGS={bindings} CUDART={cudart} ROOT={} INCLUDE={} EXTRA_INCLUDES={}",
        show(&root),
        show(&include),
        show(&extra)
    ))
}

fn main() {
    match check() {
        Ok(summary) => {
            println!("cargo::rustc-env=CUDA_GRAPH_DEPENDENT_METADATA={summary}");
            let version = env::var(format!("{PREFIX}VERSION")).unwrap_or_default();
            println!("cargo::rustc-env=CUDA_GRAPH_DEPENDENT_VERSION={version}");
        }
        Err(message) => {
            eprintln!("cuda-graph-dependent: {message}");
            std::process::exit(1);
        }
    }
}
