//! What the tests against the stub driver (`stub-driver/null_cuda.c`, built by `build.rs`)
//! share: loading it as this process's driver, and the kernel's launch shape. The stub returns
//! success and made-up handles and runs nothing, so these tests check only what the safe layer
//! decides on the host.
//!
//! The whole binary uses the stub; where it is missing (a suite packed on one machine and run
//! on another), each test prints `SKIPPED ...` and passes.

#![allow(dead_code)] // each test binary uses a part

use std::path::Path;
use std::sync::Once;

use cuda_graph::{Device, Function, LaunchConfig, Module};

pub const STUB: &str = env!("CUDA_GRAPH_TESTS_STUB_DRIVER");
const STUB_ERROR: &str = env!("CUDA_GRAPH_TESTS_STUB_DRIVER_ERROR");
pub const BYTES: usize = 1 << 20;
pub const N: u64 = (BYTES / 4) as u64;

/// The device behind the stub driver, and a kernel; `None` (after saying why) without the stub.
pub fn stub(test: &str) -> Option<(Device, Function, Module)> {
    if !STUB_ERROR.is_empty() || !Path::new(STUB).is_file() {
        let why = if STUB_ERROR.is_empty() {
            format!("{STUB} is not on this machine")
        } else {
            STUB_ERROR.to_string()
        };
        println!("SKIPPED {test}: no stub driver ({why})");
        return None;
    }
    static USE_STUB: Once = Once::new();
    USE_STUB.call_once(|| {
        // SAFETY: set once, before this process's first driver call (which reads it); the
        // test threads read no other environment meanwhile.
        unsafe { std::env::set_var("CUDA_GRAPH_LIBCUDA", STUB) };
    });
    let device = Device::get(0).expect("device 0 of the stub driver");
    let module = Module::from_ptx(&device, cuda_graph::kernels::PTX).expect("stub module");
    let fill = module.function("fill_u32").expect("stub function");
    Some((device, fill, module))
}

/// The launch shape of `fill_u32` over `N` values.
pub fn config() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}
