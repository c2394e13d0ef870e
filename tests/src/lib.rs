//! Helpers shared by the integration tests: the GPU gate, result-code checks, the test kernels in
//! both APIs, kernel arguments, and small RAII holders for the buffers tests read results from.
//!
//! GPU tests start with [`require_gpu`]: with no usable GPU it prints one line
//! `SKIPPED <test>: no GPU (<reason>)` and returns `None`, and the test returns early. With
//! `CUDA_GRAPH_REQUIRE_GPU=1` in the environment it panics instead, so a GPU run that passes has
//! really run every test. The same holds for every other reason a test cannot run ([`cannot_run`]):
//! too few GPUs ([`require_gpus`]), peers that cannot map each other's memory. What a machine
//! cannot run, the GPU runner (`ci/gpu-run.sh`) excludes by name and reports as not run.
//!
//! ```no_run
//! use cuda_graph_sys::*;
//! use cuda_graph_tests::{require_gpu, rt};
//!
//! let Some(_gpu) = require_gpu("example") else { return };
//! let mut p = std::ptr::null_mut();
//! // SAFETY: `p` is a valid out-pointer; the allocation is freed below.
//! unsafe {
//!     rt!(cudaMalloc(&mut p, 1024));
//!     rt!(cudaFree(p));
//! }
//! ```

use std::ffi::{CStr, c_void};
use std::sync::{Mutex, MutexGuard};

use cuda_graph_sys::*;

/// The name of the variable that turns a missing GPU from a skip into a failure.
pub const REQUIRE_GPU_VAR: &str = "CUDA_GRAPH_REQUIRE_GPU";

/// What [`require_gpu`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gpu {
    /// Devices the driver API sees (`cuDeviceGetCount`).
    pub driver_devices: i32,
    /// Devices the runtime API sees (`cudaGetDeviceCount`).
    pub runtime_devices: i32,
    /// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. 13000.
    pub driver_version: i32,
}

/// Whether `CUDA_GRAPH_REQUIRE_GPU=1` is set: GPU tests must run, and fail where they would skip.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| v.trim() == "1")
}

/// Whether a test that cannot run for want of a stub driver (it could not be built) must fail
/// rather than skip: in CI (`CI=true`) and under `CUDA_GRAPH_REQUIRE_GPU=1`, runs whose passes
/// must mean the tests ran.
pub fn stub_required() -> bool {
    std::env::var("CI").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) || gpu_required()
}

/// A library that the tests' `build.rs` wrote to `built` (or could not build, for the reason `error`), on
/// this machine: at `built`, else under the same name in the `OUT_DIR` the test runner names at
/// run time.
pub fn built_library(built: &str, error: &str) -> Result<std::path::PathBuf, String> {
    if !error.is_empty() {
        return Err(error.to_string());
    }
    let path = std::path::PathBuf::from(built);
    if path.is_file() {
        return Ok(path);
    }
    let name = path.file_name().expect("a library's path names a file");
    let at_run_time =
        std::env::var_os("OUT_DIR").map(|dir| std::path::PathBuf::from(dir).join(name));
    match at_run_time {
        Some(path) if path.is_file() => Ok(path),
        Some(path) => Err(format!(
            "neither {built} nor {} is on this machine",
            path.display()
        )),
        None => Err(format!(
            "{built} is not on this machine and OUT_DIR is not set"
        )),
    }
}

/// The stub driver's source (`stub-driver/null_cuda.c`), for tests that build a variant of it.
pub const STUB_DRIVER_SOURCE: &str = include_str!("../stub-driver/null_cuda.c");

/// C for a stub variant's `extras`: conditional nodes, which `null_cuda.c` lacks.
/// `cuGraphAddNode_v2` hands out a node and, for a conditional node, the handles of its bodies;
/// `cuGraphConditionalHandleCreate` a handle. Each opens with `STUB_NODE_HOOK;`, which the
/// variant defines (a log of the call, or `(void)0`) before it.
pub const CONDITIONAL_NODE_STUB: &str = r#"
/* CUgraphNodeParams: the type, 12 reserved bytes, then the union; for a conditional node
 * (type 13), CUDA_CONDITIONAL_NODE_PARAMS: handle (8), type (4), size (4), phGraph_out. */
CUresult cuGraphAddNode_v2(void **n, void *g, const void *deps, const void *data, size_t count, void *p)
{
    STUB_NODE_HOOK;
    (void)g; (void)deps; (void)data; (void)count;
    if (*(int *)p == 13) {
        unsigned size = *(unsigned *)((char *)p + 28);
        void **bodies = malloc(size * sizeof *bodies);
        for (unsigned i = 0; i < size; i++)
            bodies[i] = handle();
        *(void ***)((char *)p + 32) = bodies;
    }
    *n = handle();
    return 0;
}
CUresult cuGraphConditionalHandleCreate(unsigned long long *h, void *g, void *ctx, unsigned v, unsigned flags)
{ STUB_NODE_HOOK; (void)g; (void)ctx; (void)v; (void)flags; *h = (unsigned long long)(uintptr_t)handle(); return 0; }
"#;

/// Builds a variant of the stub driver: `prefix`, the stub's source, then `extras`, compiled
/// with `cc` (or `$CC`) into a shared library in `dir`, named `lib<name>_<hash of the source>.so`.
/// Built once per content: a library already there is returned as it is. Written under a
/// temporary name first, so that concurrent test processes never load half a file.
pub fn build_stub_variant(
    dir: &std::path::Path,
    name: &str,
    prefix: &str,
    extras: &str,
) -> Result<std::path::PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let source = format!("{prefix}\n{STUB_DRIVER_SOURCE}\n{extras}");
    let hash = source.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    let lib = dir.join(format!("lib{name}_{hash:016x}.so"));
    if lib.is_file() {
        return Ok(lib);
    }
    let src = dir.join(format!("{name}_{}.c", std::process::id()));
    std::fs::write(&src, source).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!("lib{name}.{}.so", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-lpthread")
        .output()
        .map_err(|e| format!("{cc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cc} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::rename(&tmp, &lib).map_err(|e| e.to_string())?;
    Ok(lib)
}

/// Runs the test `name`'s `body` alone in a child process of this test binary (with
/// `child_var` naming it), against a stub driver variant that `stub` built or could not build:
/// fails when the body fails or runs past 60 s (a deadlock); without the stub, prints
/// `SKIPPED` and returns, except where [`stub_required`] (then it fails).
pub fn isolated_on_stub_variant(
    name: &str,
    child_var: &str,
    stub: Result<std::path::PathBuf, String>,
    body: fn(),
) {
    if std::env::var(child_var).as_deref() == Ok(name) {
        body();
        return;
    }
    if let Err(why) = stub {
        assert!(
            !stub_required(),
            "{name}: the extended stub driver could not be built ({why})"
        );
        println!("SKIPPED {name}: the extended stub driver could not be built ({why})");
        return;
    }
    let limit = std::time::Duration::from_secs(60);
    let (status, text) = run_test_in_child(name, child_var, &[], limit);
    match status {
        None => panic!("{name}: no result after 60 s (deadlock)\n{text}"),
        Some(s) if !s.success() => panic!("{name} failed:\n{text}"),
        Some(_) => {}
    }
}

/// Loads the stub driver variant at `path` (once per process, before the first driver call:
/// `CUDA_GRAPH_LIBCUDA`), and returns its device 0, the test kernels' module and its
/// `fill_u32(p, n, v)`. For tests that run each case in a child process of its own.
pub fn stub_variant_device(
    path: &std::path::Path,
) -> (cuda_graph::Device, cuda_graph::Module, cuda_graph::Function) {
    static USE_STUB: std::sync::Once = std::sync::Once::new();
    USE_STUB.call_once(|| {
        // SAFETY: set once, before this process's first driver call.
        unsafe { std::env::set_var("CUDA_GRAPH_LIBCUDA", path) };
    });
    let device = cuda_graph::Device::get(0).expect("device 0 of the stub");
    let module = cuda_graph::Module::from_ptx(&device, cuda_graph::kernels::PTX).expect("module");
    let fill = module.function("fill_u32").expect("fill_u32");
    (device, module, fill)
}

/// The C function `name` of the loaded stub driver variant at `path` (a test's own hooks, such
/// as a log it reads back), as `F`, a C function pointer type.
///
/// # Panics
///
/// When `F` is not pointer-sized, the variant is not loaded, or it does not export `name`.
///
/// # Safety
///
/// `name` is a C function of the variant whose type `F` is.
pub unsafe fn stub_variant_fn<F: Copy>(path: &std::path::Path, name: &str) -> F {
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
    let name = std::ffi::CString::new(name).expect("a name");
    // SAFETY: RTLD_NOLOAD only finds a library already loaded, which the driver keeps loaded;
    // the handle is closed again at once (the driver's reference stays).
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!lib.is_null(), "the stub driver variant is loaded");
    // SAFETY: a live handle and a NUL-terminated name.
    let f = unsafe { libc::dlsym(lib, name.as_ptr()) };
    // SAFETY: the handle came from dlopen above.
    unsafe { libc::dlclose(lib) };
    assert!(!f.is_null(), "the stub exports {name:?}");
    // SAFETY: `F` is pointer-sized, and the caller vouches that the symbol has type `F`.
    unsafe { std::mem::transmute_copy(&f) }
}

/// Runs the test `name` of the current test binary again, alone, in a child process, with
/// `child_var` set to `name` (so that the child runs the test's body) and `env` set; kills it
/// after `limit`. Returns its exit status (`None`: killed at the limit) and its output (stdout,
/// then stderr).
pub fn run_test_in_child(
    name: &str,
    child_var: &str,
    env: &[(&str, &str)],
    limit: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String) {
    use std::process::{Command, Stdio};
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    command
        .args([
            name,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(child_var, name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("the child test process");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("the child's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (status, text)
}

/// Detects a usable GPU: `cuInit` succeeds and `cuDeviceGetCount` and `cudaGetDeviceCount` both
/// report at least one device.
///
/// When there is none, prints `SKIPPED <test>: no GPU (<reason>)` and returns `None`; the reason is
/// [`cuda_graph_sys::loader::driver_load_error`] when the driver could not be reached, otherwise
/// the failing call and its error code.
///
/// # Panics
/// When no GPU is usable and `CUDA_GRAPH_REQUIRE_GPU=1` is set.
#[track_caller]
pub fn require_gpu(test: &str) -> Option<Gpu> {
    match probe_gpu() {
        Ok(gpu) => Some(gpu),
        Err(reason) => {
            if gpu_required() {
                panic!("{test}: {REQUIRE_GPU_VAR}=1 but no GPU is usable: {reason}");
            }
            println!("SKIPPED {test}: no GPU ({reason})");
            None
        }
    }
}

/// As [`require_gpu`], and also needs `count` devices. With fewer it prints
/// `SKIPPED <test>: needs <count> GPUs, found <n>` and returns `None`, or, under
/// `CUDA_GRAPH_REQUIRE_GPU=1`, panics (see [`cannot_run`]).
///
/// # Panics
/// Whatever the machine, when `count` is 2 and `test` is not listed in `ci/needs-two-gpus.txt`
/// (see [`assert_listed_two_gpu_test`]); with too few GPUs under `CUDA_GRAPH_REQUIRE_GPU=1`.
#[track_caller]
pub fn require_gpus(test: &str, count: i32) -> Option<Gpu> {
    // Before the probe, so that a run without a GPU (CI) already catches an unlisted test.
    let count = usize::try_from(count).unwrap_or(0);
    assert_listed_two_gpu_test(test, count);
    let gpu = require_gpu(test)?;
    let found = usize::try_from(gpu.runtime_devices).unwrap_or(0);
    enough_gpus(test, count, found).then_some(gpu)
}

/// The tests that need two GPUs, one `<nextest binary id> <test name>` per line (`#` starts a
/// comment): `ci/gpu-run.sh` excludes exactly these, by name, on a machine with fewer GPUs.
pub const TWO_GPU_TESTS: &str = include_str!("../../ci/needs-two-gpus.txt");

/// Whether `test` is a test name listed in [`TWO_GPU_TESTS`].
pub fn listed_two_gpu_test(test: &str) -> bool {
    TWO_GPU_TESTS
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .any(|line| line.split_whitespace().nth(1) == Some(test))
}

/// Checks that a test needing `count` GPUs is one the GPU runner knows to exclude by name.
///
/// A test that needs two GPUs fails a one-GPU run under `CUDA_GRAPH_REQUIRE_GPU=1`; the runner
/// avoids that by excluding the tests of `ci/needs-two-gpus.txt` and reporting them as not run.
/// This check keeps the list complete for every test that declares its GPU count here.
///
/// # Panics
/// When `count` is 2 and `test` is not listed, or when `count` is above 2 (no runner list
/// covers more than two GPUs).
#[track_caller]
pub fn assert_listed_two_gpu_test(test: &str, count: usize) {
    assert!(
        count <= 2,
        "{test} needs {count} GPUs: ci/gpu-run.sh only knows how to exclude tests that need two"
    );
    assert!(
        count < 2 || listed_two_gpu_test(test),
        "{test} needs {count} GPUs but is not listed in ci/needs-two-gpus.txt, by which \
         ci/gpu-run.sh excludes it on machines with fewer GPUs"
    );
}

/// Whether the `found` devices are enough for `test`, which needs `count`; when they are not,
/// reports it through [`cannot_run`] (a skip, or a panic under `CUDA_GRAPH_REQUIRE_GPU=1`).
///
/// # Panics
/// As [`assert_listed_two_gpu_test`], and as [`cannot_run`].
#[track_caller]
pub fn enough_gpus(test: &str, count: usize, found: usize) -> bool {
    assert_listed_two_gpu_test(test, count);
    if found < count {
        cannot_run(test, &format!("needs {count} GPUs, found {found}"));
        return false;
    }
    true
}

/// Reports that `test` cannot run on this machine, for `why`: prints `SKIPPED <test>: <why>`,
/// after which the caller returns. Under `CUDA_GRAPH_REQUIRE_GPU=1` it panics instead: a GPU run
/// counts only tests that ran as passed, and the runner excludes by name, with the reason
/// printed, what the machine cannot run.
///
/// # Panics
/// Under `CUDA_GRAPH_REQUIRE_GPU=1`.
#[track_caller]
pub fn cannot_run(test: &str, why: &str) {
    if gpu_required() {
        panic!("{test}: {REQUIRE_GPU_VAR}=1 but the test cannot run here: {why}");
    }
    println!("SKIPPED {test}: {why}");
}

/// The checks behind [`require_gpu`]; `Err` holds the reason in words.
pub fn probe_gpu() -> Result<Gpu, String> {
    let load_reason = |what: String| match loader::driver_load_error() {
        Some(e) => e.to_string(),
        None => what,
    };
    // SAFETY: cuInit takes flags by value; 0 is the only valid value.
    let r = unsafe { cuInit(0) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(load_reason(format!(
            "cuInit(0) returned {}",
            driver_error_name(r)
        )));
    }
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    let r = unsafe { cuDeviceGetCount(&mut count) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(load_reason(format!(
            "cuDeviceGetCount returned {}",
            driver_error_name(r)
        )));
    }
    if count <= 0 {
        return Err("cuDeviceGetCount reports 0 devices".into());
    }
    let mut runtime_count = 0;
    // SAFETY: `runtime_count` is a valid out-pointer.
    let r = unsafe { cudaGetDeviceCount(&mut runtime_count) };
    if r != cudaError_t::cudaSuccess {
        let mut reason = format!("cudaGetDeviceCount returned {}", runtime_error_name(r));
        if let Some(e) = loader::runtime_load_error() {
            reason = format!("{reason}: {e}");
        }
        return Err(reason);
    }
    if runtime_count <= 0 {
        return Err("cudaGetDeviceCount reports 0 devices".into());
    }
    Ok(Gpu {
        driver_devices: count,
        runtime_devices: runtime_count,
        driver_version: loader::driver_version().unwrap_or(0),
    })
}

/// A lock that GPU tests of one binary hold for their whole run.
///
/// `cargo test` runs the tests of a binary as threads of one process; graph-memory footprint
/// (`cudaDeviceGetGraphMemAttribute`) is process-wide, and a capture in
/// `cudaStreamCaptureModeGlobal` forbids unsafe calls from other threads, so such tests must not
/// overlap. (`cargo nextest` runs each test in its own process, where the lock costs nothing.)
/// A test that panicked while holding the lock does not poison it for the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn c_str_or(p: *const std::ffi::c_char, fallback: &str) -> String {
    if p.is_null() {
        fallback.to_owned()
    } else {
        // SAFETY: CUDA returns NUL-terminated static strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// A runtime error code in words: `cudaErrorInvalidValue (1): invalid argument`.
pub fn runtime_error_name(r: cudaError_t) -> String {
    // SAFETY: both functions accept any value and return static strings (or null).
    let (name, text) = unsafe { (cudaGetErrorName(r), cudaGetErrorString(r)) };
    format!(
        "{} ({}): {}",
        c_str_or(name, "unknown cudaError_t"),
        r.0,
        c_str_or(text, "no description")
    )
}

/// A driver error code in words: `CUDA_ERROR_INVALID_VALUE (1): invalid argument`. Falls back to
/// the number alone when the driver cannot be reached.
pub fn driver_error_name(r: CUresult) -> String {
    let mut name = std::ptr::null();
    let mut text = std::ptr::null();
    // SAFETY: valid out-pointers; on failure they stay null.
    let (rn, rt) = unsafe { (cuGetErrorName(r, &mut name), cuGetErrorString(r, &mut text)) };
    let name = if rn == CUresult::CUDA_SUCCESS {
        c_str_or(name, "")
    } else {
        String::new()
    };
    let text = if rt == CUresult::CUDA_SUCCESS {
        c_str_or(text, "")
    } else {
        String::new()
    };
    match (name.is_empty(), text.is_empty()) {
        (false, false) => format!("{name} ({}): {text}", r.0),
        (false, true) => format!("{name} ({})", r.0),
        _ => format!("CUresult {}", r.0),
    }
}

/// Panics with the call's text and the code in words unless `r` is `cudaSuccess`; used by [`rt!`].
#[track_caller]
pub fn check_runtime(r: cudaError_t, call: &str) {
    if r != cudaError_t::cudaSuccess {
        panic!("`{call}` failed: {}", runtime_error_name(r));
    }
}

/// Panics with the call's text and the code in words unless `r` is `CUDA_SUCCESS`; used by
/// [`drv!`]. Adds the loader's explanation when the driver or a symbol is missing.
#[track_caller]
pub fn check_driver(r: CUresult, call: &str) {
    if r != CUresult::CUDA_SUCCESS {
        match loader::driver_load_error() {
            Some(e) => panic!("`{call}` failed: {} ({e})", driver_error_name(r)),
            None => panic!("`{call}` failed: {}", driver_error_name(r)),
        }
    }
}

/// Evaluates a runtime-API call (a `cudaError_t` expression) and panics unless it returns
/// `cudaSuccess`; the message holds the call's source text and the error's name and description.
/// The call itself is not wrapped in `unsafe`: write the macro inside the caller's documented
/// `unsafe` block.
#[macro_export]
macro_rules! rt {
    ($call:expr) => {
        $crate::check_runtime($call, stringify!($call))
    };
}

/// As [`rt!`], for driver-API calls (`CUresult`).
#[macro_export]
macro_rules! drv {
    ($call:expr) => {
        $crate::check_driver($call, stringify!($call))
    };
}

/// Evaluates a runtime-API call that must fail with `expected` (a `cudaError_t`), prints
/// `<call> -> <code>`, asserts the code, and clears the runtime's last error.
#[macro_export]
macro_rules! rt_expect {
    ($call:expr, $expected:expr) => {{
        let got: $crate::sys::cudaError_t = $call;
        let expected: $crate::sys::cudaError_t = $expected;
        println!(
            "{} -> {}",
            stringify!($call),
            $crate::runtime_error_name(got)
        );
        // Expected failures must not linger as the thread's last error.
        let _ = $crate::sys::cudaGetLastError();
        assert_eq!(
            got,
            expected,
            "`{}` returned {}, expected {}",
            stringify!($call),
            $crate::runtime_error_name(got),
            $crate::runtime_error_name(expected)
        );
    }};
}

/// Evaluates a driver-API call that must fail with `expected` (a `CUresult`), prints
/// `<call> -> <code>` and asserts the code.
#[macro_export]
macro_rules! drv_expect {
    ($call:expr, $expected:expr) => {{
        let got: $crate::sys::CUresult = $call;
        let expected: $crate::sys::CUresult = $expected;
        println!(
            "{} -> {}",
            stringify!($call),
            $crate::driver_error_name(got)
        );
        assert_eq!(
            got,
            expected,
            "`{}` returned {}, expected {}",
            stringify!($call),
            $crate::driver_error_name(got),
            $crate::driver_error_name(expected)
        );
    }};
}

/// The raw bindings, re-exported for the macros.
pub use cuda_graph_sys as sys;

/// The test kernels (`cuda-graph/kernels/graph_kernels.cu`) as PTX, NUL-terminated for the loaders.
pub const KERNELS_PTX: &str = concat!(
    include_str!("../../cuda-graph/kernels/graph_kernels.ptx"),
    "\0"
);

/// One MiB.
pub const MIB: usize = 1 << 20;

/// Threads per block of every test launch.
pub const BLOCK: u32 = 256;

/// Blocks for a grid-stride kernel over `n` elements: enough to cover them, at most 1024.
pub fn grid_for(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize).clamp(1, 1024) as u32
}

/// The kernels of `cuda-graph/kernels/graph_kernels.ptx`, loaded through the runtime API
/// (`cudaLibraryLoadData` + `cudaLibraryGetKernel`). A `cudaKernel_t` is passed as the `func` of
/// `cudaLaunchKernel` and `cudaKernelNodeParams`. Dropping it unloads the library: destroy the
/// graphs that launch these kernels and synchronize first.
#[cfg(cuda_graph_tests_runtime_library)]
#[derive(Debug)]
pub struct RuntimeKernels {
    /// The library handle.
    pub library: cudaLibrary_t,
    /// `fill_u32(p, n, v)`: `p[i] = v`.
    pub fill_u32: cudaKernel_t,
    /// `iota_u32(p, n, base)`: `p[i] = base + i`.
    pub iota_u32: cudaKernel_t,
    /// `add_u32(p, n, v)`: `p[i] += v`.
    pub add_u32: cudaKernel_t,
    /// `copy_u32(dst, src, n)`: `dst[i] = src[i]`.
    pub copy_u32: cudaKernel_t,
    /// `axpy_u32(dst, src, n, a)`: `dst[i] += a * src[i]`.
    pub axpy_u32: cudaKernel_t,
    /// `sum_u32(p, n, out)`: `*out += Σ p[i]` (64-bit; zero `*out` first).
    pub sum_u32: cudaKernel_t,
    /// `spin_then_fill_u32(p, n, v, spins)`: busy-waits, then `p[i] = v`.
    pub spin_then_fill_u32: cudaKernel_t,
}

#[cfg(cuda_graph_tests_runtime_library)]
impl RuntimeKernels {
    /// Loads the PTX (JIT-compiled for the current device) and looks up the seven kernels.
    ///
    /// # Panics
    /// When loading or a lookup fails, with the call and the error.
    #[track_caller]
    pub fn load() -> Self {
        let mut library: cudaLibrary_t = std::ptr::null_mut();
        // SAFETY: KERNELS_PTX is a NUL-terminated PTX image; no JIT or library options are given.
        unsafe {
            rt!(cudaLibraryLoadData(
                &mut library,
                KERNELS_PTX.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            ));
        }
        let get = |name: &CStr| {
            let mut k: cudaKernel_t = std::ptr::null_mut();
            // SAFETY: `library` was loaded above; `name` is NUL-terminated.
            unsafe { rt!(cudaLibraryGetKernel(&mut k, library, name.as_ptr())) };
            k
        };
        RuntimeKernels {
            library,
            fill_u32: get(c"fill_u32"),
            iota_u32: get(c"iota_u32"),
            add_u32: get(c"add_u32"),
            copy_u32: get(c"copy_u32"),
            axpy_u32: get(c"axpy_u32"),
            sum_u32: get(c"sum_u32"),
            spin_then_fill_u32: get(c"spin_then_fill_u32"),
        }
    }
}

#[cfg(cuda_graph_tests_runtime_library)]
impl Drop for RuntimeKernels {
    fn drop(&mut self) {
        // SAFETY: the library was loaded by `load` and is unloaded once.
        let r = unsafe { cudaLibraryUnload(self.library) };
        if r != cudaError_t::cudaSuccess && !std::thread::panicking() {
            panic!("cudaLibraryUnload failed: {}", runtime_error_name(r));
        }
    }
}

/// The kernels of `cuda-graph/kernels/graph_kernels.ptx`, loaded through the driver API
/// (`cuModuleLoadData` + `cuModuleGetFunction`) into the current context. Dropping it unloads
/// the module (the context must still be current).
#[derive(Debug)]
pub struct DriverKernels {
    /// The module handle.
    pub module: CUmodule,
    /// `fill_u32(p, n, v)`: `p[i] = v`.
    pub fill_u32: CUfunction,
    /// `iota_u32(p, n, base)`: `p[i] = base + i`.
    pub iota_u32: CUfunction,
    /// `add_u32(p, n, v)`: `p[i] += v`.
    pub add_u32: CUfunction,
    /// `copy_u32(dst, src, n)`: `dst[i] = src[i]`.
    pub copy_u32: CUfunction,
    /// `axpy_u32(dst, src, n, a)`: `dst[i] += a * src[i]`.
    pub axpy_u32: CUfunction,
    /// `sum_u32(p, n, out)`: `*out += Σ p[i]` (64-bit; zero `*out` first).
    pub sum_u32: CUfunction,
    /// `spin_then_fill_u32(p, n, v, spins)`: busy-waits, then `p[i] = v`.
    pub spin_then_fill_u32: CUfunction,
}

impl DriverKernels {
    /// Loads the PTX into the current context and looks up the seven kernels.
    ///
    /// # Panics
    /// When there is no current context, or loading or a lookup fails.
    #[track_caller]
    pub fn load() -> Self {
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: KERNELS_PTX is a NUL-terminated PTX image.
        unsafe { drv!(cuModuleLoadData(&mut module, KERNELS_PTX.as_ptr().cast())) };
        let get = |name: &CStr| {
            let mut f: CUfunction = std::ptr::null_mut();
            // SAFETY: `module` was loaded above; `name` is NUL-terminated.
            unsafe { drv!(cuModuleGetFunction(&mut f, module, name.as_ptr())) };
            f
        };
        DriverKernels {
            module,
            fill_u32: get(c"fill_u32"),
            iota_u32: get(c"iota_u32"),
            add_u32: get(c"add_u32"),
            copy_u32: get(c"copy_u32"),
            axpy_u32: get(c"axpy_u32"),
            sum_u32: get(c"sum_u32"),
            spin_then_fill_u32: get(c"spin_then_fill_u32"),
        }
    }
}

impl Drop for DriverKernels {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `load` and is unloaded once.
        let r = unsafe { cuModuleUnload(self.module) };
        if r != CUresult::CUDA_SUCCESS && !std::thread::panicking() {
            panic!("cuModuleUnload failed: {}", driver_error_name(r));
        }
    }
}

/// The primary context of a device, retained and made current on this thread for the driver
/// API; released on drop.
#[derive(Debug)]
pub struct DriverContext {
    /// The device.
    pub device: CUdevice,
    /// Its primary context.
    pub context: CUcontext,
}

impl DriverContext {
    /// Retains the primary context of device `ordinal` and makes it current.
    ///
    /// # Panics
    /// When a driver call fails (call [`require_gpu`] first).
    #[track_caller]
    pub fn primary(ordinal: i32) -> Self {
        let mut device: CUdevice = 0;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointers; the context is released in Drop.
        unsafe {
            drv!(cuInit(0));
            drv!(cuDeviceGet(&mut device, ordinal));
            drv!(cuDevicePrimaryCtxRetain(&mut context, device));
            drv!(cuCtxSetCurrent(context));
        }
        DriverContext { device, context }
    }
}

impl Drop for DriverContext {
    fn drop(&mut self) {
        // SAFETY: the context was retained by `primary`; it is released once.
        unsafe {
            let _ = cuCtxSetCurrent(std::ptr::null_mut());
            let _ = cuDevicePrimaryCtxRelease(self.device);
        }
    }
}

/// A kernel's argument list: each value boxed at a stable address, and the array of pointers to
/// them that `cudaLaunchKernel`, `cuLaunchKernel` and kernel-node parameters take. Build it in
/// the kernel's parameter order with the typed pushers. The values must outlive the call that
/// reads the array (node creation copies them).
#[derive(Debug, Default)]
pub struct Args {
    values: Vec<ArgValue>,
    pointers: Vec<*mut c_void>,
}

#[derive(Debug)]
enum ArgValue {
    Ptr(Box<*mut c_void>),
    U64(Box<u64>),
    U32(Box<u32>),
}

impl Args {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(mut self, value: ArgValue) -> Self {
        let p: *mut c_void = match &value {
            ArgValue::Ptr(b) => (&raw const **b).cast_mut().cast(),
            ArgValue::U64(b) => (&raw const **b).cast_mut().cast(),
            ArgValue::U32(b) => (&raw const **b).cast_mut().cast(),
        };
        self.values.push(value);
        self.pointers.push(p);
        self
    }

    /// Adds a device pointer (runtime API: `void*`).
    pub fn ptr(self, p: *mut c_void) -> Self {
        self.push(ArgValue::Ptr(Box::new(p)))
    }

    /// Adds a device pointer (driver API: `CUdeviceptr`).
    pub fn dptr(self, p: CUdeviceptr) -> Self {
        self.push(ArgValue::U64(Box::new(p)))
    }

    /// Adds an `unsigned long long`.
    pub fn u64(self, v: u64) -> Self {
        self.push(ArgValue::U64(Box::new(v)))
    }

    /// Adds an `unsigned int`.
    pub fn u32(self, v: u32) -> Self {
        self.push(ArgValue::U32(Box::new(v)))
    }

    /// The `void**` array the launch APIs take; valid while `self` lives and is not pushed to.
    pub fn as_params(&mut self) -> *mut *mut c_void {
        self.pointers.as_mut_ptr()
    }
}

/// Runtime kernel-node parameters for a grid-stride launch of `kernel` over `n` elements.
/// `args` must outlive the `cudaGraphAddKernelNode` call that reads them.
pub fn kernel_node(kernel: cudaKernel_t, n: usize, args: &mut Args) -> cudaKernelNodeParams {
    cudaKernelNodeParams {
        func: kernel.cast(),
        gridDim: dim3 {
            x: grid_for(n),
            y: 1,
            z: 1,
        },
        blockDim: dim3 {
            x: BLOCK,
            y: 1,
            z: 1,
        },
        sharedMemBytes: 0,
        kernelParams: args.as_params(),
        extra: std::ptr::null_mut(),
    }
}

/// Driver kernel-node parameters for a grid-stride launch of `func` over `n` elements.
/// `args` must outlive the `cuGraphAddKernelNode` call that reads them.
pub fn driver_kernel_node(func: CUfunction, n: usize, args: &mut Args) -> CUDA_KERNEL_NODE_PARAMS {
    CUDA_KERNEL_NODE_PARAMS {
        func,
        gridDimX: grid_for(n),
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: BLOCK,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: args.as_params(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// Launches `kernel` over `n` elements into `stream` with `cudaLaunchKernel` (also inside a
/// stream capture, where it becomes a kernel node).
///
/// # Safety
/// `args` must match the kernel's parameters, and every pointer in them must be valid for the
/// kernel's accesses when it runs.
#[track_caller]
pub unsafe fn launch(kernel: cudaKernel_t, n: usize, mut args: Args, stream: cudaStream_t) {
    // SAFETY: the caller guarantees the arguments; the grid covers `n` by grid-stride.
    unsafe {
        rt!(cudaLaunchKernel(
            kernel.cast_const().cast(),
            dim3 {
                x: grid_for(n),
                y: 1,
                z: 1
            },
            dim3 {
                x: BLOCK,
                y: 1,
                z: 1
            },
            args.as_params(),
            0,
            stream,
        ));
    }
}

/// Launches `func` over `n` elements into `stream` with `cuLaunchKernel`.
///
/// # Safety
/// As [`launch`]; a context must be current.
#[track_caller]
pub unsafe fn driver_launch(func: CUfunction, n: usize, mut args: Args, stream: CUstream) {
    // SAFETY: the caller guarantees the arguments; the grid covers `n` by grid-stride.
    unsafe {
        drv!(cuLaunchKernel(
            func,
            grid_for(n),
            1,
            1,
            BLOCK,
            1,
            1,
            0,
            stream,
            args.as_params(),
            std::ptr::null_mut(),
        ));
    }
}

/// Runtime memory-allocation node parameters as the guide writes them: pinned device memory
/// resident on `device`, `bytesize` bytes, no extra access descriptors.
pub fn alloc_node_params(device: i32, bytesize: usize) -> cudaMemAllocNodeParams {
    let mut params = cudaMemAllocNodeParams::default();
    params.poolProps.allocType = cudaMemAllocationType::cudaMemAllocationTypePinned;
    params.poolProps.location.type_ = cudaMemLocationType::cudaMemLocationTypeDevice;
    params.poolProps.location.id = device;
    params.bytesize = bytesize;
    params
}

/// Driver memory-allocation node parameters: pinned device memory resident on `device`.
pub fn driver_alloc_node_params(device: CUdevice, bytesize: usize) -> CUDA_MEM_ALLOC_NODE_PARAMS {
    let mut params = CUDA_MEM_ALLOC_NODE_PARAMS::default();
    params.poolProps.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    params.poolProps.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    params.poolProps.location.id = device;
    params.bytesize = bytesize;
    params
}

/// Copies `n` `u32` from device memory to the host with `cudaMemcpy` (synchronous, on the legacy
/// stream). Order it after the work that wrote them (synchronize the stream first).
///
/// # Panics
/// When the copy fails.
///
/// # Safety
/// `src` must be device memory (or another address `cudaMemcpy` accepts) of at least `n` `u32`.
#[track_caller]
pub unsafe fn read_u32(src: *const c_void, n: usize) -> Vec<u32> {
    let mut host = vec![0u32; n];
    // SAFETY: `host` holds `n` elements; the caller guarantees `src`.
    unsafe {
        rt!(cudaMemcpy(
            host.as_mut_ptr().cast(),
            src,
            n * 4,
            cudaMemcpyKind::cudaMemcpyDeviceToHost,
        ));
    }
    host
}

/// Copies `n` `u64` from device memory to the host with `cudaMemcpy`.
///
/// # Panics
/// When the copy fails.
///
/// # Safety
/// As [`read_u32`], for `n` `u64`.
#[track_caller]
pub unsafe fn read_u64(src: *const c_void, n: usize) -> Vec<u64> {
    let mut host = vec![0u64; n];
    // SAFETY: `host` holds `n` elements; the caller guarantees `src`.
    unsafe {
        rt!(cudaMemcpy(
            host.as_mut_ptr().cast(),
            src,
            n * 8,
            cudaMemcpyKind::cudaMemcpyDeviceToHost,
        ));
    }
    host
}

/// Copies `n` `u32` from device memory with the driver API (`cuMemcpyDtoH`).
///
/// # Panics
/// When the copy fails.
///
/// # Safety
/// `src` must be device memory of at least `n` `u32`; a context must be current.
#[track_caller]
pub unsafe fn driver_read_u32(src: CUdeviceptr, n: usize) -> Vec<u32> {
    let mut host = vec![0u32; n];
    // SAFETY: `host` holds `n` elements; the caller guarantees `src`.
    unsafe { drv!(cuMemcpyDtoH(host.as_mut_ptr().cast(), src, n * 4)) };
    host
}

/// Checks `got[i] == base + i` (wrapping), naming the first mismatch.
#[track_caller]
pub fn assert_iota(got: &[u32], base: u32, what: &str) {
    if let Some((i, v)) = got
        .iter()
        .enumerate()
        .find(|&(i, &v)| v != base.wrapping_add(i as u32))
    {
        panic!(
            "{what}: element {i} is {v}, expected {} (iota from {base}, {} elements)",
            base.wrapping_add(i as u32),
            got.len()
        );
    }
}

/// Checks that every element is `value`, naming the first mismatch.
#[track_caller]
pub fn assert_all(got: &[u32], value: u32, what: &str) {
    if let Some((i, v)) = got.iter().enumerate().find(|&(_, &v)| v != value) {
        panic!(
            "{what}: element {i} is {v}, expected {value} ({} elements)",
            got.len()
        );
    }
}

/// Σ (base + i) for i in 0..n, as `sum_u32` computes it (each element wrapped to 32 bits).
pub fn iota_sum(base: u32, n: usize) -> u64 {
    (0..n as u64)
        .map(|i| u64::from(base.wrapping_add(i as u32)))
        .sum()
}

/// Device memory from `cudaMalloc` that tests copy results into; freed on drop (`cudaFree`
/// synchronizes the device first).
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: *mut c_void,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` on the current device and zeroes them.
    ///
    /// # Panics
    /// When allocation fails.
    #[track_caller]
    pub fn zeroed(bytes: usize) -> Self {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the memory is freed in Drop.
        unsafe {
            rt!(cudaMalloc(&mut ptr, bytes));
            rt!(cudaMemset(ptr, 0, bytes));
        }
        DeviceBuffer { ptr, bytes }
    }

    /// The device address.
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sets every byte to 0 (`cudaMemset`, ordered on the legacy stream).
    #[track_caller]
    pub fn zero(&self) {
        // SAFETY: the buffer is live and `bytes` long.
        unsafe { rt!(cudaMemset(self.ptr, 0, self.bytes)) };
    }

    /// Reads the buffer as `u32`.
    #[track_caller]
    pub fn read_u32(&self) -> Vec<u32> {
        // SAFETY: the buffer is live device memory of `bytes` bytes.
        unsafe { read_u32(self.ptr, self.bytes / 4) }
    }

    /// Reads the buffer as `u64`.
    #[track_caller]
    pub fn read_u64(&self) -> Vec<u64> {
        // SAFETY: the buffer is live device memory of `bytes` bytes.
        unsafe { read_u64(self.ptr, self.bytes / 8) }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed`, freed once.
        let r = unsafe { cudaFree(self.ptr) };
        if r != cudaError_t::cudaSuccess && !std::thread::panicking() {
            panic!("cudaFree failed: {}", runtime_error_name(r));
        }
    }
}

/// The four graph-memory attributes of a device (`cudaDeviceGetGraphMemAttribute`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphMem {
    /// `cudaGraphMemAttrUsedMemCurrent`: physical memory mapped by at least one graph now.
    pub used_current: u64,
    /// `cudaGraphMemAttrUsedMemHigh`: high-water mark of `used_current`.
    pub used_high: u64,
    /// `cudaGraphMemAttrReservedMemCurrent`: physical memory reserved for graph allocations now.
    pub reserved_current: u64,
    /// `cudaGraphMemAttrReservedMemHigh`: high-water mark of `reserved_current`.
    pub reserved_high: u64,
}

impl GraphMem {
    /// Reads the four attributes of `device`.
    ///
    /// # Panics
    /// When a query fails.
    #[track_caller]
    pub fn query(device: i32) -> Self {
        let get = |attr: cudaGraphMemAttributeType| {
            let mut v: u64 = 0;
            // SAFETY: every graph-memory attribute is a cuuint64_t written to `v`.
            unsafe {
                rt!(cudaDeviceGetGraphMemAttribute(
                    device,
                    attr,
                    (&raw mut v).cast()
                ));
            }
            v
        };
        GraphMem {
            used_current: get(cudaGraphMemAttributeType::cudaGraphMemAttrUsedMemCurrent),
            used_high: get(cudaGraphMemAttributeType::cudaGraphMemAttrUsedMemHigh),
            reserved_current: get(cudaGraphMemAttributeType::cudaGraphMemAttrReservedMemCurrent),
            reserved_high: get(cudaGraphMemAttributeType::cudaGraphMemAttrReservedMemHigh),
        }
    }
}

impl std::fmt::Display for GraphMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = |b: u64| b as f64 / MIB as f64;
        write!(
            f,
            "used {:.1} MiB (high {:.1} MiB), reserved {:.1} MiB (high {:.1} MiB)",
            m(self.used_current),
            m(self.used_high),
            m(self.reserved_current),
            m(self.reserved_high)
        )
    }
}
