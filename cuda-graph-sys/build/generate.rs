//! Running bindgen over `wrapper.h` and turning its output into the bindings file that is both
//! compiled and shipped (`src/pregenerated/cuda_<version>.rs`).
//!
//! Besides types, constants and function declarations, the file records which C names the headers
//! map to versioned ABI symbols (`#define cuMemAlloc cuMemAlloc_v2`): the preprocessor itself
//! expands each candidate inside bindgen's run, so conditionals in the headers are honoured.

use std::fs;
use std::path::Path;

use crate::toolkit::Toolkit;

/// Prefix of the probe declarations that carry `name -> symbol` through bindgen.
const ALIAS_PROBE: &str = "cg_alias__";
const ALIAS_SEP: &str = "__to__";

/// Generates the bindings text for `tk` with `wrapper`, using `out_dir` for scratch files.
pub fn bindings(tk: &Toolkit, wrapper: &Path, out_dir: &Path) -> Result<String, String> {
    let mut candidates = Vec::new();
    for header in ["cuda.h", "cuda_runtime_api.h"] {
        let text = fs::read_to_string(tk.include.join(header))
            .map_err(|e| format!("reading {header}: {e}"))?;
        candidates.extend(alias_candidates(&text));
    }
    candidates.sort();
    candidates.dedup();

    let mut probe = format!(
        "#include \"{}\"\n\
         #define CG_PASTE(a, b) a##b\n\
         #define CG_XPASTE(a, b) CG_PASTE(a, b)\n\
         #define CG_ALIAS(name) void CG_XPASTE({ALIAS_PROBE}##name##{ALIAS_SEP}, name)(void);\n",
        wrapper.display()
    );
    for name in &candidates {
        probe.push_str(&format!("CG_ALIAS({name})\n"));
    }
    let probe_path = out_dir.join("wrapper_probe.h");
    fs::write(&probe_path, probe).map_err(|e| format!("writing {}: {e}", probe_path.display()))?;

    let mut builder = bindgen::Builder::default()
        .header(probe_path.to_string_lossy())
        .clang_arg(format!("-I{}", tk.include.display()))
        .allowlist_function("cu.*")
        .allowlist_function(format!("{ALIAS_PROBE}.*"))
        .allowlist_type("CU.*|cu.*")
        .allowlist_var("CU.*|cu.*|CUDA.*")
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .must_use_type("cudaError_enum")
        .must_use_type("cudaError")
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .derive_eq(true)
        .derive_hash(true)
        .layout_tests(true)
        .generate_comments(false)
        .rust_target(bindgen::RustTarget::stable(85, 0).map_err(|e| e.to_string())?)
        .rust_edition(bindgen::RustEdition::Edition2024)
        .use_core()
        .merge_extern_blocks(true)
        .sort_semantically(true);
    for dir in &tk.extra_includes {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    // bindgen panics when libclang cannot be loaded; that is a reason to fall back, not to fail.
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()))
            .map_err(|_| {
                "libclang could not be loaded (install libclang-dev, or set LIBCLANG_PATH)"
                    .to_string()
            })?
            .map_err(|e| format!("bindgen failed: {e}"))?;
    finish(&generated.to_string(), tk.version)
}

/// `#define cuX cuY`, `#define cuX __CUDA_API_PTDS(cuY)` and the like: names the preprocessor may
/// map to another symbol. Object-like macros whose body is one identifier, maybe wrapped.
fn alias_candidates(header: &str) -> Vec<String> {
    header
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('#')?.trim_start();
            let rest = rest.strip_prefix("define")?;
            let mut words = rest.split_whitespace();
            let name = words.next()?;
            let body: String = words.collect();
            let is_ident =
                |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            let target = body
                .strip_suffix(')')
                .and_then(|b| b.split_once('('))
                .filter(|(wrapper, _)| wrapper.starts_with("__CUDA"))
                .map(|(_, inner)| inner)
                .unwrap_or(&body);
            (name.starts_with("cu")
                && is_ident(name)
                && target.starts_with("cu")
                && is_ident(target))
            .then(|| name.to_string())
        })
        .collect()
}

/// Removes the alias probes from bindgen's output, records the aliases, and formats the file.
fn finish(raw: &str, version: u32) -> Result<String, String> {
    let mut file = syn::parse_file(raw).map_err(|e| format!("parsing bindgen output: {e}"))?;
    let mut aliases = Vec::new();
    for item in &mut file.items {
        if let syn::Item::ForeignMod(block) = item {
            block.items.retain(|foreign| {
                let syn::ForeignItem::Fn(f) = foreign else {
                    return true;
                };
                let name = f.sig.ident.to_string();
                let Some(pair) = name.strip_prefix(ALIAS_PROBE) else {
                    return true;
                };
                if let Some((alias, symbol)) = pair.split_once(ALIAS_SEP) {
                    if alias != symbol {
                        aliases.push((alias.to_string(), symbol.to_string()));
                    }
                }
                false
            });
        }
    }
    file.items
        .retain(|item| !matches!(item, syn::Item::ForeignMod(b) if b.items.is_empty()));
    aliases.sort();
    let table: String = aliases
        .iter()
        .map(|(alias, symbol)| format!("(\"{alias}\", \"{symbol}\"),"))
        .collect();
    let table: syn::Item = syn::parse_str(&format!(
        "/// C names that the headers map to versioned ABI symbols, as `(name, symbol)`: \
         `#define cuMemAlloc cuMemAlloc_v2` gives `(\"cuMemAlloc\", \"cuMemAlloc_v2\")`.\n\
         pub const API_ALIASES: &[(&str, &str)] = &[{table}];"
    ))
    .map_err(|e| format!("alias table: {e}"))?;
    file.items.push(table);
    Ok(format!(
        "// Generated by cuda-graph-sys/build/generate.rs with bindgen from wrapper.h and the CUDA {}.{} headers.\n\
         // Do not edit: ci/gen-bindings.sh regenerates it.\n\n{}",
        version / 1000,
        version % 1000 / 10,
        prettyplease::unparse(&file)
    ))
}
