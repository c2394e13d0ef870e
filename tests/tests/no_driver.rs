//! What a binary sees on a machine without the NVIDIA driver: the first driver call and the first
//! runtime call return the documented codes (never a loader failure, a panic or an abort), and
//! `cuda_graph_sys::loader` explains why.
//!
//! Where a driver is installed, the driver half still runs: the test re-runs itself in a child
//! process with `CUDA_GRAPH_LIBCUDA` pointing at a file that does not exist. The runtime half needs
//! a machine that really lacks `libcuda.so.1` (cudart opens it itself, ignoring that variable), so
//! it is skipped there, with the reason printed. Likewise the missing-symbol path runs in a child
//! whose "driver" is a library that exports no `cu*` function at all.

use std::process::Command;

use cuda_graph_sys::loader::{self, LoadError};
use cuda_graph_sys::{CUDART_LINKAGE, CUresult, cudaError_t};

/// Set in a child process to the name of the test it runs.
const CHILD_VAR: &str = "CUDA_GRAPH_TESTS_CHILD";
/// The loader's override of the driver library.
const LIBCUDA_VAR: &str = "CUDA_GRAPH_LIBCUDA";
/// A driver library that cannot be there.
const MISSING_LIBCUDA: &str = "/nonexistent/libcuda.so.1";
/// A library every glibc system has, which exports no CUDA driver function.
const NOT_A_DRIVER: &str = "libm.so.6";

/// Printed by the driver half when it has run; the parent looks for it in the child's output.
const DRIVER_PART_RAN: &str = "driver part: ran";
/// Printed by the missing-symbol child when it has run.
const SYMBOL_PART_RAN: &str = "missing-symbol part: ran";

fn is_child(test: &str) -> bool {
    std::env::var(CHILD_VAR).is_ok_and(|v| v == test)
}

/// Runs `test` alone in a child copy of this test binary with `CUDA_GRAPH_LIBCUDA=libcuda`,
/// echoes its output, asserts that it passed, and returns its output.
fn run_child(test: &str, libcuda: &str) -> String {
    let exe = std::env::current_exe().expect("the path of this test binary");
    let output = Command::new(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(LIBCUDA_VAR, libcuda)
        .env(CHILD_VAR, test)
        .output()
        .unwrap_or_else(|e| panic!("could not run {} as a child: {e}", exe.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("--- child: {test} with {LIBCUDA_VAR}={libcuda} ---");
    for line in text.lines() {
        println!("  | {line}");
    }
    println!("--- end of child ---");
    assert!(
        output.status.success(),
        "the child run of {test} failed ({})",
        output.status
    );
    assert!(
        text.contains("1 passed"),
        "the child run of {test} did not run exactly that test"
    );
    text
}

/// The driver half: the first call returns `CUDA_ERROR_NO_DEVICE` and the loader says the library
/// is missing. `first` is the result of the process's first driver call.
fn driver_part(first: CUresult) {
    assert_eq!(
        first,
        CUresult::CUDA_ERROR_NO_DEVICE,
        "the first driver call (cuInit) without libcuda.so.1"
    );
    let error = loader::driver_load_error();
    let Some(LoadError::LibraryNotFound { library, reason }) = &error else {
        panic!("driver_load_error() should be LibraryNotFound, is {error:?}");
    };
    let message = error.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(
        message.contains("libcuda.so.1"),
        "the explanation should name libcuda.so.1: {message}"
    );
    // Every other driver function answers the same, graph-memory ones included; none of them
    // reaches a driver, so the null arguments are never read.
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    let second = unsafe { cuda_graph_sys::cuDriverGetVersion(&mut version) };
    assert_eq!(second, CUresult::CUDA_ERROR_NO_DEVICE, "cuDriverGetVersion");
    // The safe layer's version query names the call and carries the loader's explanation.
    match cuda_graph::driver_version() {
        Err(cuda_graph::Error::Driver(e)) => {
            assert_eq!(e.call, "cuDriverGetVersion");
            assert!(
                e.load.is_some(),
                "the loader's error should come with it: {e:?}"
            );
        }
        other => panic!("driver_version() without a driver: {other:?}"),
    }
    // SAFETY: without a driver library the call returns before it could touch its arguments
    // (asserted just above: the library is not loaded).
    let alloc_node = unsafe {
        cuda_graph_sys::cuGraphAddMemAllocNode(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(
        alloc_node,
        CUresult::CUDA_ERROR_NO_DEVICE,
        "cuGraphAddMemAllocNode"
    );
    println!(
        "{DRIVER_PART_RAN}: cuInit(0) = {} (CUDA_ERROR_NO_DEVICE), and so do cuDriverGetVersion and cuGraphAddMemAllocNode",
        first.0
    );
    println!(
        "  driver_load_error() = LibraryNotFound {{ library: {library:?}, reason: {reason:?} }}"
    );
    println!("  which reads: {message}");
}

/// The runtime half, on a machine without `libcuda.so.1`: the first runtime call.
fn runtime_part() {
    let mut count = -1;
    // SAFETY: `count` is a valid out-pointer.
    let result = unsafe { cuda_graph_sys::cudaGetDeviceCount(&mut count) };
    let runtime_error = loader::runtime_load_error();
    let name = code_name(result);
    match (CUDART_LINKAGE, &runtime_error) {
        ("loaded", Some(LoadError::LibraryNotFound { .. })) => {
            // No libcudart.so either: our loader answers for the runtime.
            assert_eq!(
                result,
                cudaError_t::cudaErrorSharedObjectInitFailed,
                "the first runtime call (cudaGetDeviceCount) of a loaded build without libcudart.so"
            );
            println!(
                "runtime part: ran: cudart is loaded at run time and was not found: cudaGetDeviceCount = {name} ({})",
                result.0
            );
            println!(
                "  runtime_load_error() = {}",
                runtime_error
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
        }
        (linkage, _) => {
            // cudart itself answers: it finds no libcuda.so.1. CUDA documents
            // cudaErrorInsufficientDriver for this; cudaErrorNoDevice is accepted too.
            assert!(
                result == cudaError_t::cudaErrorInsufficientDriver
                    || result == cudaError_t::cudaErrorNoDevice,
                "the first runtime call (cudaGetDeviceCount) without a driver returned {name} ({}), \
                 expected cudaErrorInsufficientDriver (35) or cudaErrorNoDevice (100); cudart {linkage}",
                result.0
            );
            println!(
                "runtime part: ran: cudart ({linkage}) without libcuda.so.1: cudaGetDeviceCount = {name} ({}), count = {count}",
                result.0
            );
            if let Some(error) = &runtime_error {
                println!("  runtime_load_error() = {error}");
            }
        }
    }
}

fn code_name(result: cudaError_t) -> String {
    match result {
        cudaError_t::cudaErrorInsufficientDriver => "cudaErrorInsufficientDriver".into(),
        cudaError_t::cudaErrorNoDevice => "cudaErrorNoDevice".into(),
        cudaError_t::cudaErrorSharedObjectInitFailed => "cudaErrorSharedObjectInitFailed".into(),
        cudaError_t::cudaSuccess => "cudaSuccess".into(),
        other => format!("{other:?}"),
    }
}

#[test]
fn first_calls_without_a_driver() {
    // SAFETY: cuInit takes its flags by value.
    let first = unsafe { cuda_graph_sys::cuInit(0) };
    let override_set = std::env::var_os(LIBCUDA_VAR).is_some();
    match loader::load_driver() {
        Err(_) => {
            driver_part(first);
            if override_set {
                println!(
                    "runtime part: skipped: {LIBCUDA_VAR} is set, and cudart opens libcuda.so.1 itself, so its answer would not show a missing driver"
                );
            } else {
                runtime_part();
            }
        }
        Ok(()) => {
            assert!(
                !is_child("first_calls_without_a_driver"),
                "{LIBCUDA_VAR}={MISSING_LIBCUDA} was set, yet a driver library was loaded"
            );
            println!(
                "a driver library is installed (cuInit(0) = {}); the driver part runs in a child process",
                first.0
            );
            let output = run_child("first_calls_without_a_driver", MISSING_LIBCUDA);
            assert!(
                output.contains(DRIVER_PART_RAN),
                "the child did not run the driver part"
            );
            println!(
                "runtime part: skipped: a driver is installed, and cudart finds libcuda.so.1 itself ({LIBCUDA_VAR} does not apply to it)"
            );
        }
    }
}

#[test]
fn missing_symbol_is_not_found() {
    if is_child("missing_symbol_is_not_found") {
        // The "driver" is a library without a single cu* export.
        loader::load_driver().unwrap_or_else(|e| panic!("{NOT_A_DRIVER} should load: {e}"));
        // SAFETY: cuInit takes its flags by value; the symbol is missing, so nothing is called.
        let result = unsafe { cuda_graph_sys::cuInit(0) };
        assert_eq!(
            result,
            CUresult::CUDA_ERROR_NOT_FOUND,
            "cuInit from a library that lacks it"
        );
        let error = loader::driver_load_error();
        let Some(LoadError::SymbolNotFound {
            library,
            symbol,
            driver_version,
        }) = &error
        else {
            panic!("driver_load_error() should be SymbolNotFound, is {error:?}");
        };
        assert_eq!(symbol, "cuInit");
        assert!(
            library.contains(NOT_A_DRIVER),
            "the library should be named: {library}"
        );
        assert_eq!(
            *driver_version, None,
            "this library cannot tell a driver version"
        );
        let message = error.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(
            message.contains("cuInit"),
            "the explanation should name the symbol: {message}"
        );
        assert!(!loader::driver_has_symbol(c"cuInit"));
        println!(
            "{SYMBOL_PART_RAN}: cuInit(0) = {} (CUDA_ERROR_NOT_FOUND)",
            result.0
        );
        println!("  driver_load_error() = {error:?}");
        println!("  which reads: {message}");
        println!(
            "  driver_load_error() asked again = {:?}",
            loader::driver_load_error()
        );
        return;
    }

    let output = run_child("missing_symbol_is_not_found", NOT_A_DRIVER);
    assert!(
        output.contains(SYMBOL_PART_RAN),
        "the child did not run the missing-symbol part"
    );

    match loader::load_driver() {
        Ok(()) => {
            // A real driver: its exports are looked up one by one; a name it lacks is reported as
            // missing. An unknown function cannot be called through the bindings, so the call
            // itself is what the child above showed.
            for symbol in [
                c"cuInit",
                c"cuGraphAddMemAllocNode",
                c"cuDeviceGetGraphMemAttribute",
            ] {
                assert!(
                    loader::driver_has_symbol(symbol),
                    "the driver should export {symbol:?}"
                );
            }
            assert!(!loader::driver_has_symbol(
                c"cuCudaGraphTestsNoSuchFunction"
            ));
            println!(
                "real-driver part: ran: the driver exports cuInit, cuGraphAddMemAllocNode, cuDeviceGetGraphMemAttribute and not cuCudaGraphTestsNoSuchFunction"
            );
        }
        Err(e) => println!("real-driver part: skipped: no driver library here ({e})"),
    }
}
