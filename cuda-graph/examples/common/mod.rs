//! Shared by the examples: getting a device or explaining in one line why there is none, the test
//! kernels with typed argument lists, checks of kernel output, and a footprint table.
//!
//! Not an example itself: cargo builds `examples/*.rs` and `examples/*/main.rs` as examples, and
//! each example includes this file with `mod common;`. Each example uses only part of it.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::process::exit;

use anyhow::{Context, bail};
use cuda_graph::{
    Bytes, Device, DeviceAddress, Function, GraphMemInfo, KernelArgs, LaunchConfig, Module,
};

/// The example's name (`tour`, `explicit_graph`, ...), for its messages.
pub const NAME: &str = env!("CARGO_CRATE_NAME");

/// Exit status when the example cannot run on this machine (no device, too few devices).
pub const CANNOT_RUN: i32 = 2;
/// Exit status when the example ran and something failed (a CUDA error, a wrong result).
pub const FAILED: i32 = 1;

/// Runs `body` with device 0.
///
/// Without a usable device, prints one line to stderr saying why (`tour: no CUDA device:
/// cuInit failed: ...`) and exits with status 2. When `body` fails, prints its error with its
/// causes on one line (`tour: failed: ...`) and exits with status 1. No panic, no backtrace.
pub fn run(body: impl FnOnce(&Device) -> anyhow::Result<()>) {
    let device = match usable_device(0) {
        Ok(device) => device,
        Err(why) => cannot_run(&why),
    };
    if let Err(error) = body(&device) {
        eprintln!("{NAME}: failed: {}", one_line(&format!("{error:#}")));
        exit(FAILED);
    }
}

/// Prints `NAME: why` as one line to stderr and exits with status 2.
pub fn cannot_run(why: &str) -> ! {
    eprintln!("{NAME}: {}", one_line(why));
    exit(CANNOT_RUN)
}

/// Device `ordinal`, if it exists and supports memory pools (graph memory nodes need them);
/// otherwise the reason, in words.
pub fn usable_device(ordinal: usize) -> Result<Device, String> {
    let device = Device::get(ordinal).map_err(|e| format!("no CUDA device: {e}"))?;
    match device.supports_memory_pools() {
        Ok(true) => Ok(device),
        Ok(false) => Err(format!(
            "device {ordinal} ({}) does not support memory pools, which graph memory nodes need",
            device.name().unwrap_or_else(|_| "unnamed".into())
        )),
        Err(e) => Err(format!(
            "cannot ask device {ordinal} whether it supports memory pools: {e}"
        )),
    }
}

/// `text` with line breaks turned into "; ", so that a message stays on one line.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A one-line description of the device: `NVIDIA H200 (device 0, compute 9.0, 139.8 GiB)`.
pub fn describe(device: &Device) -> anyhow::Result<String> {
    let (major, minor) = device.compute_capability()?;
    Ok(format!(
        "{} (device {}, compute {major}.{minor}, {})",
        device.name()?,
        device.ordinal(),
        Bytes(device.total_memory()? as u64)
    ))
}

/// The project's test kernels (`kernels/graph_kernels.cu`), loaded from the checked-in PTX.
pub struct Kernels {
    /// `fill_u32(u32* p, u64 n, u32 v)`: `p[i] = v`.
    pub fill: Function,
    /// `iota_u32(u32* p, u64 n, u32 base)`: `p[i] = base + i`.
    pub iota: Function,
    /// `add_u32(u32* p, u64 n, u32 v)`: `p[i] += v`.
    pub add: Function,
    /// `copy_u32(u32* dst, const u32* src, u64 n)`: `dst[i] = src[i]`.
    pub copy: Function,
    /// `axpy_u32(u32* dst, const u32* src, u64 n, u32 a)`: `dst[i] += a * src[i]`.
    pub axpy: Function,
    /// `sum_u32(const u32* p, u64 n, u64* out)`: `*out += Σ p[i]`.
    pub sum: Function,
}

impl Kernels {
    /// Loads the module on `device` and looks the kernels up.
    pub fn load(device: &Device) -> anyhow::Result<Kernels> {
        let module = Module::from_ptx(device, cuda_graph::kernels::PTX)
            .context("loading the test kernels' PTX")?;
        Ok(Kernels {
            fill: module.function("fill_u32")?,
            iota: module.function("iota_u32")?,
            add: module.function("add_u32")?,
            copy: module.function("copy_u32")?,
            axpy: module.function("axpy_u32")?,
            sum: module.function("sum_u32")?,
        })
    }
}

/// Argument lists that match the kernels' signatures exactly (pointer, `u64` count, `u32`
/// value), so that the `unsafe` launches only have to vouch for sizes and ordering. Each checks
/// that `n` elements fit the buffers.
pub mod args {
    use super::*;

    fn fits(target: &impl DeviceAddress, n: u64, elem: u64) {
        assert!(
            n * elem <= target.byte_len() as u64,
            "{n} elements of {elem} bytes do not fit a buffer of {} bytes",
            target.byte_len()
        );
    }

    /// For `fill_u32`, `iota_u32` and `add_u32`: `(p, n, v)`.
    pub fn pnv(p: &impl DeviceAddress, n: u64, v: u32) -> KernelArgs<'_> {
        fits(p, n, 4);
        KernelArgs::new().ptr(p).value(n).value(v)
    }

    /// For `copy_u32`: `(dst, src, n)`.
    pub fn copy<'a>(
        dst: &'a impl DeviceAddress,
        src: &'a impl DeviceAddress,
        n: u64,
    ) -> KernelArgs<'a> {
        fits(dst, n, 4);
        fits(src, n, 4);
        KernelArgs::new().ptr(dst).ptr(src).value(n)
    }

    /// For `axpy_u32`: `(dst, src, n, a)`.
    pub fn axpy<'a>(
        dst: &'a impl DeviceAddress,
        src: &'a impl DeviceAddress,
        n: u64,
        a: u32,
    ) -> KernelArgs<'a> {
        fits(dst, n, 4);
        fits(src, n, 4);
        KernelArgs::new().ptr(dst).ptr(src).value(n).value(a)
    }

    /// For `sum_u32`: `(p, n, out)`, `out` one `u64`.
    pub fn sum<'a>(
        p: &'a impl DeviceAddress,
        n: u64,
        out: &'a impl DeviceAddress,
    ) -> KernelArgs<'a> {
        fits(p, n, 4);
        fits(out, 1, 8);
        KernelArgs::new().ptr(p).value(n).ptr(out)
    }
}

/// The launch shape used throughout: 256 threads a block, enough blocks for `n` elements.
pub fn config(n: u64) -> LaunchConfig {
    LaunchConfig::for_elements(n, 256)
}

/// The launch shape for `sum_u32`: 1,024 blocks of 256 threads, whatever the size. The kernel is a
/// grid-stride loop that ends with one atomic add a thread into a single counter, so fewer
/// threads mean fewer contended atomics.
pub fn sum_config() -> LaunchConfig {
    LaunchConfig::new((1024, 1, 1), (256, 1, 1))
}

/// Checks every element of `got` against `expected(i)`; the error names the first wrong element
/// and how many are wrong.
pub fn verify_u32(what: &str, got: &[u32], expected: impl Fn(u64) -> u32) -> anyhow::Result<()> {
    let mut wrong = got
        .iter()
        .enumerate()
        .filter(|&(i, &v)| v != expected(i as u64));
    if let Some((i, v)) = wrong.next() {
        bail!(
            "{what}: element {i} is {v}, expected {}; {} of {} elements are wrong",
            expected(i as u64),
            1 + wrong.count(),
            got.len()
        );
    }
    Ok(())
}

/// Checks one value.
pub fn verify_eq<T: PartialEq + std::fmt::Display>(
    what: &str,
    got: T,
    expected: T,
) -> anyhow::Result<()> {
    if got != expected {
        bail!("{what}: got {got}, expected {expected}");
    }
    Ok(())
}

/// Σ (base + i) for i in 0..n, as `sum_u32` computes it over `iota_u32(p, n, base)` (no
/// element wraps for the sizes used here).
pub fn iota_sum(n: u64, base: u32) -> u64 {
    n * base as u64 + n * (n - 1) / 2
}

/// `1048576` as `1,048,576`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in MiB, one decimal.
pub fn mib(bytes: Bytes) -> String {
    format!("{:.1}", bytes.0 as f64 / (1024.0 * 1024.0))
}

/// `n` MiB in bytes.
pub const fn mib_bytes(n: usize) -> usize {
    n << 20
}

/// The device's graph-memory footprint after each step, printed as a table in MiB.
#[derive(Default)]
pub struct Footprint {
    rows: Vec<(String, GraphMemInfo)>,
}

impl Footprint {
    /// Reads the four attributes after `step`, keeps them as a row and returns them.
    pub fn record(&mut self, device: &Device, step: &str) -> anyhow::Result<GraphMemInfo> {
        let info = device
            .graph_mem_info()
            .with_context(|| format!("reading the footprint after '{step}'"))?;
        self.rows.push((step.to_string(), info));
        Ok(info)
    }

    /// The table: one row per step, used and reserved, current and high-water, in MiB.
    pub fn table(&self, indent: &str) -> String {
        let width = self
            .rows
            .iter()
            .map(|(s, _)| s.chars().count())
            .max()
            .unwrap_or(0)
            .max(4);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{indent}{:<width$}  {:>9}  {:>9}  {:>9}  {:>13}",
            "step", "used", "used high", "reserved", "reserved high"
        );
        for (step, info) in &self.rows {
            let _ = writeln!(
                out,
                "{indent}{step:<width$}  {:>9}  {:>9}  {:>9}  {:>13}",
                mib(info.used_current),
                mib(info.used_high),
                mib(info.reserved_current),
                mib(info.reserved_high)
            );
        }
        out
    }
}
