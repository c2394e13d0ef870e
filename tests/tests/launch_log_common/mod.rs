//! What the tests against the launch-log variant of the stub driver share: the variant itself,
//! reading its log, its switches and counters, and running a test body in a child process that
//! loads it as its driver. Included with `mod launch_log_common;` by `attack_keep_stub.rs` and
//! `attack_update_stub.rs`.
//!
//! The variant is `stub-driver/null_cuda.c` with a log of graph launches, event records, event
//! waits and frees outside captures (the order the GPU would see them in: [`log`]), with
//! conditional, host, event record, child graph and memset nodes, and with these switches and
//! counters (their C functions are named `launch_log_...`):
//! - [`fault_after_next_launch`]: after the next captured kernel launch, the next
//!   `cuStreamGetCaptureInfo` fails, or reports no node;
//! - [`refuse_update`]: `cuGraphExecUpdate` refuses; [`updates`] counts the updates it made;
//! - [`not_ready`]: `cuEventQuery` answers "not ready" (the launches events follow still run);
//! - [`set_params`]: counts `cuGraphExecKernelNodeSetParams` calls.
//!
//! Off, the switches change nothing the stub does.

#![allow(dead_code)] // each test binary uses a part

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::OnceLock;

use cuda_graph::{
    AllocParams, Device, ExecGraph, Function, Graph, GraphAllocation, InstantiateFlags, KernelArgs,
    LaunchConfig, Module, Stream,
};

pub const BYTES: usize = 1 << 20;
pub const N: u64 = (BYTES / 4) as u64;

/// The variable that names the test a child process runs.
const CHILD_VAR: &str = "LAUNCH_LOG_CHILD";

/// What the variant gets before `null_cuda.c`; the functions it wraps are renamed away.
const PREFIX: &str = r#"
#define cuStreamGetCaptureInfo_v3 null_orig_cuStreamGetCaptureInfo_v3
#define cuMemFreeAsync null_orig_cuMemFreeAsync
#define cuLaunchKernel null_orig_cuLaunchKernel
#define cuGraphExecUpdate_v2 null_orig_cuGraphExecUpdate_v2
"#;

/// What the variant gets after `null_cuda.c`.
const EXTRAS: &str = r#"
#undef cuStreamGetCaptureInfo_v3
#undef cuMemFreeAsync
#undef cuLaunchKernel
#undef cuGraphExecUpdate_v2

/* The log: 1 launch (exec, stream), 2 event record (event, stream), 3 event wait (stream,
 * event), 4 free outside a capture (address, stream). */
enum { LOG_MAX = 1 << 16 };
static struct { int kind; unsigned long long a, b; } entries[LOG_MAX];
static int entry_count;
static int log_lock;
static void note(int kind, const void *a, const void *b)
{
    while (__atomic_exchange_n(&log_lock, 1, __ATOMIC_ACQUIRE)) {}
    if (entry_count < LOG_MAX) {
        entries[entry_count].kind = kind;
        entries[entry_count].a = (unsigned long long)(uintptr_t)a;
        entries[entry_count].b = (unsigned long long)(uintptr_t)b;
        entry_count++;
    }
    __atomic_store_n(&log_lock, 0, __ATOMIC_RELEASE);
}
int launch_log_len(void) { return __atomic_load_n(&entry_count, __ATOMIC_SEQ_CST); }
void launch_log_at(int i, unsigned long long *out)
{
    out[0] = (unsigned long long)entries[i].kind;
    out[1] = entries[i].a;
    out[2] = entries[i].b;
}

CUresult cuGraphLaunch(void *e, void *s) { note(1, e, s); return 0; }
CUresult cuEventRecord(void *e, void *s) { note(2, e, s); return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { (void)f; note(3, s, e); return 0; }
CUresult cuMemFreeAsync(unsigned long long p, void *s)
{
    if (!(s && s == capture_stream))
        note(4, (void *)(uintptr_t)p, s);
    return null_orig_cuMemFreeAsync(p, s);
}

/* Set: events are not complete (the launches they follow still run). */
static int not_ready;
void launch_log_not_ready(int r) { __atomic_store_n(&not_ready, r, __ATOMIC_SEQ_CST); }
CUresult cuEventQuery(void *e) { (void)e; return __atomic_load_n(&not_ready, __ATOMIC_SEQ_CST) ? 600 : 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }

/* Set: cuGraphExecUpdate refuses (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, topology changed).
 * Otherwise it succeeds, changes nothing, and is counted. */
static int refuse_update;
void launch_log_refuse_update(int r) { __atomic_store_n(&refuse_update, r, __ATOMIC_SEQ_CST); }
static int updates;
int launch_log_updates(void) { return __atomic_load_n(&updates, __ATOMIC_SEQ_CST); }
CUresult cuGraphExecUpdate_v2(void *e, void *g, void *info)
{
    (void)e; (void)g;
    struct { int result; void *error_node, *error_from_node; } *out = info;
    out->error_node = out->error_from_node = NULL;
    if (__atomic_load_n(&refuse_update, __ATOMIC_SEQ_CST)) {
        out->result = 2;
        return 910;
    }
    __atomic_add_fetch(&updates, 1, __ATOMIC_SEQ_CST);
    out->result = 0;
    return 0;
}

CUresult cuGraphUpload(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = handle(); return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAlloc_v2(unsigned long long *p, size_t b)
{ (void)b; *p = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED); return 0; }
CUresult cuMemFree_v2(unsigned long long p) { (void)p; return 0; }
CUresult cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n) { (void)p; (void)v; (void)n; return 0; }
CUresult cuGraphAddHostNode(void **n, void *g, void *deps, size_t count, const void *p)
{ (void)g; (void)deps; (void)count; (void)p; *n = handle(); return 0; }
CUresult cuGraphAddChildGraphNode(void **n, void *g, void *deps, size_t count, void *child)
{ (void)g; (void)deps; (void)count; (void)child; *n = handle(); return 0; }
CUresult cuGraphAddMemsetNode(void **n, void *g, void *deps, size_t count, const void *p, void *c)
{ (void)g; (void)deps; (void)count; (void)p; (void)c; *n = handle(); return 0; }
CUresult cuGraphAddEventRecordNode(void **n, void *g, void *deps, size_t count, void *e)
{ (void)g; (void)deps; (void)count; (void)e; *n = handle(); return 0; }
static int set_params;
int launch_log_set_params(void) { return __atomic_load_n(&set_params, __ATOMIC_SEQ_CST); }
CUresult cuGraphExecKernelNodeSetParams_v2(void *e, void *n, const void *p)
{ (void)e; (void)n; (void)p; __atomic_add_fetch(&set_params, 1, __ATOMIC_SEQ_CST); return 0; }

/* Conditional nodes: cuda_graph_tests::CONDITIONAL_NODE_STUB, after this. */
#define STUB_NODE_HOOK ((void)0)

/* Faults: after the next captured kernel launch, the next cuStreamGetCaptureInfo fails (1) or
 * reports no dependency (2). */
static int armed, pending;
void launch_log_fault_after_next_launch(int fault) { __atomic_store_n(&armed, fault, __ATOMIC_SEQ_CST); }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *s, void **params, void **extra)
{
    CUresult r = null_orig_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
    if (s && s == capture_stream)
        pending = __atomic_exchange_n(&armed, 0, __ATOMIC_SEQ_CST);
    return r;
}
CUresult cuStreamGetCaptureInfo_v3(void *s, int *status, unsigned long long *id, void **graph,
                                   void *const **deps, const void **edge_data, size_t *count)
{
    int fault = pending;
    pending = 0;
    if (fault == 1)
        return 999; /* CUDA_ERROR_UNKNOWN */
    CUresult r = null_orig_cuStreamGetCaptureInfo_v3(s, status, id, graph, deps, edge_data, count);
    if (fault == 2 && count) {
        *count = 0;
        if (deps) *deps = NULL;
    }
    return r;
}
"#;

/// The variant, built once per machine (the parent test builds it before its child runs).
pub fn stub_path() -> Result<PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("launch-log-stub");
        let extras = format!("{EXTRAS}{}", cuda_graph_tests::CONDITIONAL_NODE_STUB);
        cuda_graph_tests::build_stub_variant(&dir, "null_launch_log", PREFIX, &extras)
    })
    .clone()
}

/// The variant's function `name`, of type `F` (a C function pointer type).
fn stub_fn<F: Copy>(name: &str) -> F {
    // SAFETY: this module names the variant's functions with their C types.
    unsafe { cuda_graph_tests::stub_variant_fn(&stub_path().expect("the stub was built"), name) }
}

/// Runs `body` in a child process of this test binary (the test `name`, with `CHILD_VAR`
/// naming it), failing when it fails or runs past 60 s (a deadlock).
pub fn isolated(name: &str, body: fn()) {
    cuda_graph_tests::isolated_on_stub_variant(name, CHILD_VAR, stub_path(), body);
}

/// The device of the variant, a module and its `fill_u32(p, n, v)`.
pub fn stub() -> (Device, Module, Function) {
    cuda_graph_tests::stub_variant_device(&stub_path().expect("the stub was built"))
}

pub fn config() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}

/// One entry of the variant's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Launch { exec: u64, stream: u64 },
    Record { event: u64, stream: u64 },
    Wait { stream: u64, event: u64 },
    Free { ptr: u64, stream: u64 },
}

/// The log so far, oldest first.
pub fn log() -> Vec<Entry> {
    let len: extern "C" fn() -> c_int = stub_fn("launch_log_len");
    let at: extern "C" fn(c_int, *mut u64) = stub_fn("launch_log_at");
    (0..len())
        .map(|i| {
            let mut e = [0u64; 3];
            at(i, e.as_mut_ptr());
            match e[0] {
                1 => Entry::Launch {
                    exec: e[1],
                    stream: e[2],
                },
                2 => Entry::Record {
                    event: e[1],
                    stream: e[2],
                },
                3 => Entry::Wait {
                    stream: e[1],
                    event: e[2],
                },
                4 => Entry::Free {
                    ptr: e[1],
                    stream: e[2],
                },
                k => panic!("unknown log entry {k}"),
            }
        })
        .collect()
}

fn set(name: &str, v: c_int) {
    let f: extern "C" fn(c_int) = stub_fn(name);
    f(v);
}

fn get(name: &str) -> c_int {
    let f: extern "C" fn() -> c_int = stub_fn(name);
    f()
}

/// Faults the next `cuStreamGetCaptureInfo` after the next captured kernel launch: 1, it fails;
/// 2, it reports no dependency; 0, neither.
pub fn fault_after_next_launch(fault: c_int) {
    set("launch_log_fault_after_next_launch", fault);
}

/// Set: `cuGraphExecUpdate` refuses (topology changed).
pub fn refuse_update(refuse: bool) {
    set("launch_log_refuse_update", c_int::from(refuse));
}

/// How many updates `cuGraphExecUpdate` made (refused ones not counted).
pub fn updates() -> c_int {
    get("launch_log_updates")
}

/// Set: `cuEventQuery` answers "not ready".
pub fn not_ready(not_ready: bool) {
    set("launch_log_not_ready", c_int::from(not_ready));
}

/// How many times `cuGraphExecKernelNodeSetParams` was called.
pub fn set_params() -> c_int {
    get("launch_log_set_params")
}

/// A graph that allocates an allocation it does not free (G.3.3), instantiated and launched
/// on `stream`: the allocation is live.
pub fn launched_owner(device: &Device, stream: &Stream) -> (Graph, ExecGraph, GraphAllocation) {
    let mut owner = Graph::new(device).unwrap();
    let (_, a) = owner
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    let exec = owner.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(stream).unwrap();
    assert!(a.is_live());
    (owner, exec, a)
}

/// A graph whose one kernel node fills `target`.
pub fn filling(device: &Device, fill: &Function, target: &impl cuda_graph::DeviceAddress) -> Graph {
    let mut graph = Graph::new(device).unwrap();
    let args = KernelArgs::new().ptr(target).value(N).value(1u32);
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over N words of the
    // target; the stub runs nothing.
    unsafe { graph.add_kernel_node(&[], fill, config(), &args) }.unwrap();
    graph
}
