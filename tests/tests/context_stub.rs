//! Graph calls made on a thread where no context is current: the crate makes the device's
//! context current where the driver needs one. Safe code gets there by making a graph on one
//! thread and adding nodes to it on another (`Graph` is `Send`).
//!
//! The driver is `stub-driver/null_cuda.c` with the current context kept per thread, as CUDA
//! keeps it, and a kernel node refused (`CUDA_ERROR_INVALID_CONTEXT`) where no context is
//! current: there the H200's driver 580 killed the process with SIGSEGV
//! (`safe_explicit.rs`: `graph_built_where_no_context_is_current`). Each test runs in a process
//! of its own, under a watchdog that fails it after 60 s.

use std::path::PathBuf;
use std::sync::OnceLock;

use cuda_graph::{
    AllocParams, Device, Function, Graph, InstantiateFlags, KernelArgs, LaunchConfig, Module,
};

const BYTES: usize = 1 << 20;
const N: u64 = (BYTES / 4) as u64;

/// What the stub gets on top of `null_cuda.c`; the functions it wraps are renamed away.
const PREFIX: &str = r#"
#define cuCtxGetCurrent null_orig_cuCtxGetCurrent
#define cuCtxSetCurrent null_orig_cuCtxSetCurrent
#define cuGraphAddKernelNode_v2 null_orig_cuGraphAddKernelNode_v2
"#;

const EXTRAS: &str = r#"
#undef cuCtxGetCurrent
#undef cuCtxSetCurrent
#undef cuGraphAddKernelNode_v2

/* The current context, per thread. */
static __thread void *thread_current;
CUresult cuCtxGetCurrent(void **c) { *c = thread_current; return 0; }
CUresult cuCtxSetCurrent(void *c) { thread_current = c; return 0; }
CUresult cuGraphAddKernelNode_v2(void **n, void *g, void *deps, size_t count, const void *p)
{
    if (!thread_current)
        return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    return null_orig_cuGraphAddKernelNode_v2(n, g, deps, count, p);
}
"#;

/// The extended stub, built once per machine (the parent test builds it before its child runs).
fn stub_path() -> Result<PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("context-stub");
        cuda_graph_tests::build_stub_variant(&dir, "null_context", PREFIX, EXTRAS)
    })
    .clone()
}

/// The device of the stub, a module and its `fill_u32(p, n, v)`.
fn stub() -> (Device, Module, Function) {
    cuda_graph_tests::stub_variant_device(&stub_path().expect("the stub was built"))
}

/// Runs `body` in a child process of this test binary (the test `name`, with `CONTEXT_CHILD`
/// naming it), failing when it fails or runs past 60 s.
fn isolated(name: &str, body: fn()) {
    cuda_graph_tests::isolated_on_stub_variant(name, "CONTEXT_CHILD", stub_path(), body);
}

/// A graph made on this thread gets its kernel and free nodes on a new thread, where nothing
/// made a context current, and is instantiated back here.
#[test]
fn kernel_node_added_on_a_thread_where_no_context_is_current() {
    isolated(
        "kernel_node_added_on_a_thread_where_no_context_is_current",
        || {
            let (device, _module, fill) = stub();
            let mut graph = Graph::new(&device).unwrap();
            let (alloc, buf) = graph
                .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
                .unwrap();
            let graph = std::thread::scope(|s| {
                s.spawn(|| {
                    let mut graph = graph;
                    // SAFETY: fill_u32(u32*, u64, u32) on the N values of `buf`, after its
                    // alloc node (the stub runs nothing).
                    let kernel = unsafe {
                        graph.add_kernel_node(
                            &[alloc],
                            &fill,
                            LaunchConfig::for_elements(N, 256),
                            &KernelArgs::new().ptr(&buf).value(N).value(1u32),
                        )
                    }
                    .expect("a kernel node added on a thread where no context was current");
                    graph.add_mem_free_node(&[kernel], &buf).unwrap();
                    graph
                })
                .join()
                .unwrap()
            });
            drop(graph.instantiate(InstantiateFlags::NONE).unwrap());
        },
    );
}
