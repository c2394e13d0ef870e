//! What the tests against the checking stub driver (`stub-driver/hunt_cuda.c`) share: finding
//! the stub, calling its hooks, and running a test body in a child process that loads it as its
//! driver. Included with `mod hunt_common;` by each such test file.
#![allow(dead_code)]

use std::ffi::{CStr, CString, c_void};
use std::path::PathBuf;
use std::time::Duration;

pub fn stub_path() -> Result<PathBuf, String> {
    if let Ok(lib) = std::env::var("HUNT_LIB") {
        return Ok(PathBuf::from(lib));
    }
    cuda_graph_tests::built_library(
        env!("CUDA_GRAPH_TESTS_HUNT_STUB"),
        env!("CUDA_GRAPH_TESTS_HUNT_STUB_ERROR"),
    )
}

/// The address of the loaded stub's symbol `name`.
pub fn stub_symbol(name: &CStr) -> *mut c_void {
    let path = CString::new(stub_path().unwrap().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: `path` is NUL-terminated and outlives the call; RTLD_NOLOAD only takes a reference
    // to the library if it is already loaded (as this process's driver).
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!lib.is_null(), "the hunt stub is loaded");
    // SAFETY: `lib` is live; the name is NUL-terminated.
    let f = unsafe { libc::dlsym(lib, name.as_ptr()) };
    assert!(!f.is_null(), "the stub exports {name:?}");
    // SAFETY: the handle of the dlopen above, closed once; the driver's own reference keeps the
    // library, and so the symbol, loaded.
    unsafe { libc::dlclose(lib) };
    f
}

/// The number of `HUNT ERROR`s the stub reported.
pub fn hunt_errors() -> i32 {
    // SAFETY: the stub's `int hunt_errors(void)`.
    let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(stub_symbol(c"hunt_errors")) };
    f()
}

/// The calling thread's next call of `call` sleeps `ms` ms on entry.
pub fn stall(call: &'static CStr, ms: i32) {
    // SAFETY: the stub's `void hunt_stall(const char *, int)`; it keeps the pointer, which is
    // static.
    let f: extern "C" fn(*const libc::c_char, i32) =
        unsafe { std::mem::transmute(stub_symbol(c"hunt_stall")) };
    f(call.as_ptr(), ms);
}

/// The calling thread's next call of `call` fails with `CUDA_ERROR_OUT_OF_MEMORY`.
pub fn fail_next(call: &'static CStr) {
    // SAFETY: the stub's `void hunt_fail_next(const char *)`; it keeps the pointer, which is
    // static.
    let f: extern "C" fn(*const libc::c_char) =
        unsafe { std::mem::transmute(stub_symbol(c"hunt_fail_next")) };
    f(call.as_ptr());
}

/// Runs `body` in a child process with the stub as its driver and `env` set; asserts that it
/// succeeded. In the child, runs `body`.
pub fn isolated(name: &str, env: &[(&str, &str)], body: fn()) {
    if std::env::var("HUNT_CHILD").as_deref() == Ok(name) {
        let path = stub_path().expect("the stub was built by the parent");
        // SAFETY: before this process's first driver call; no other thread reads the
        // environment meanwhile.
        unsafe { std::env::set_var("CUDA_GRAPH_LIBCUDA", &path) };
        body();
        return;
    }
    if let Err(why) = stub_path() {
        let why = format!("the checking stub driver could not be built ({why})");
        if cuda_graph_tests::stub_required() {
            panic!("{name}: {why}, and CI=true or CUDA_GRAPH_REQUIRE_GPU=1 is set");
        }
        println!("SKIPPED {name}: {why}");
        return;
    }
    let (status, out) =
        cuda_graph_tests::run_test_in_child(name, "HUNT_CHILD", env, Duration::from_secs(120));
    assert!(status.is_some_and(|s| s.success()), "{out}");
}

/// Works through the crate's deferred releases until `done` holds (the release thread frees
/// what waited for the GPU); panics after 10 s.
#[track_caller]
pub fn settle(what: &str, done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        cuda_graph::flush_deferred();
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every GPU work item of the stub runs 100 ms after the one before: work queued by a test is
/// still queued when its next line runs.
pub const SLOW: &[(&str, &str)] = &[("HUNT_DELAY_US", "100000"), ("HUNT_DELAY_FIXED", "1")];

/// Whether `e` is `InUseByHost` naming `expected`.
pub fn is_in_use_by_host(e: &cuda_graph::Error, expected: &str) -> bool {
    matches!(e, cuda_graph::Error::InUseByHost { call } if *call == expected)
}

/// Whether `e` is `InvalidArgument` naming `expected`.
pub fn is_invalid(e: &cuda_graph::Error, expected: &str) -> bool {
    matches!(e, cuda_graph::Error::InvalidArgument { call, .. } if *call == expected)
}
