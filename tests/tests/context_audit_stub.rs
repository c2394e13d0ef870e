//! Which driver calls does the crate make on a thread where no CUDA context is current? Only
//! those on a graph's topology (`TOPOLOGY`): every other call makes the device's context
//! current first.
//!
//! On an H200 (driver 580), `cuGraphAddKernelNode` without a current context killed the
//! process (see `context_stub.rs`). Safe code reaches "no context current" by making a value on
//! one thread and using or dropping it on a new one (the crate's handles are `Send`), and the
//! crate's deferred releases run on whatever thread flushes them, or on its own release thread.
//!
//! The driver is `stub-driver/null_cuda.c` with the current context kept per thread, and every
//! driver function other than the init, device and context queries wrapped: a call made while
//! no context is current on the calling thread is logged (function and thread name), and the
//! log is read back through `audit_len`/`audit_name`/`audit_thread`/`audit_clear`. The wrappers
//! of the stub's own functions are generated from `null_cuda.c` at test time; what the stub
//! lacks (memset, memcpy, host, event and child nodes, launches, pools, host memory, ...) is
//! added below, doing nothing but hand out handles. Stream capture is simulated as in the stub,
//! plus fork/join: a stream that waits for an event recorded in the capture joins it.
//!
//! Each scenario runs a value made on the main thread (where the context is current) through
//! one API call or drop on a new thread named `fresh`, and prints `AUDIT <step>: <calls>`: the
//! calls made with no context current, as `function@thread` (`cuda-graph-rele` is the crate's
//! release thread), and fails when one of them is not in `TOPOLOGY` (`--nocapture` shows the
//! lists).

#![allow(clippy::undocumented_unsafe_blocks, clippy::missing_panics_doc)]

use std::ffi::{CStr, c_char, c_int};
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::OnceLock;

use cuda_graph::{
    Access, AllocParams, AsStream, BorrowedStream, CaptureMode, ConditionalKind, Device,
    DeviceBuffer, Event, Function, Graph, InstantiateFlags, KernelArgs, LaunchConfig,
    ManagedBuffer, MemPool, Module, PinnedBuffer, Stream, StreamAllocation, StreamMemOps, capture,
    flush_deferred,
};

const BYTES: usize = 1 << 20;
const N: u64 = (BYTES / 4) as u64;
const CHILD_VAR: &str = "CONTEXT_AUDIT_CHILD";

/// Functions of `null_cuda.c` that are not wrapped: init, device and context queries.
const NOT_LOGGED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// The calls allowed where no context is current: a graph and its topology belong to no
/// context. `bench/probe/no_context.cu` found `cuGraphCreate`, `cuGraphAddMemAllocNode`,
/// `cuGraphAddMemFreeNode`, `cuGraphAddEmptyNode` and `cuGraphAddDependencies` succeeding on the
/// H200 (driver 580) with no context current; the others only read the graph's nodes and edges.
/// A kernel node is not among them: `cuGraphAddKernelNode` killed the process there.
const TOPOLOGY: &[&str] = &[
    "cuGraphCreate",
    "cuGraphAddMemAllocNode",
    "cuGraphAddMemFreeNode",
    "cuGraphAddEmptyNode",
    "cuGraphAddDependencies_v2",
    "cuGraphGetNodes",
    "cuGraphGetEdges_v2",
    "cuGraphGetRootNodes",
    "cuGraphNodeGetType",
    "cuGraphNodeGetDependencies_v2",
    "cuGraphNodeGetDependentNodes_v2",
];

/// Functions of `null_cuda.c` whose wrappers are written by hand in `EXTRAS` (fork/join
/// simulation, the not-ready switch).
const HAND_WRAPPED: &[&str] = &[
    "cuStreamQuery",
    "cuStreamIsCapturing",
    "cuStreamGetCaptureInfo_v3",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuLaunchKernel",
    "cuStreamEndCapture",
];

/// The head of the variant: feature macros and the renames of wrapped functions come first.
const HEAD: &str = r#"
#define _GNU_SOURCE
#define cuCtxGetCurrent null_orig_cuCtxGetCurrent
#define cuCtxSetCurrent null_orig_cuCtxSetCurrent
"#;

/// What the stub gets on top of `null_cuda.c` (before the generated wrappers).
const EXTRAS: &str = r#"
#undef cuCtxGetCurrent
#undef cuCtxSetCurrent
#include <pthread.h>
#include <stdio.h>

/* The current context, per thread, as the driver keeps it. */
static __thread void *thread_current;
CUresult cuCtxGetCurrent(void **c) { *c = thread_current; return 0; }
CUresult cuCtxSetCurrent(void *c) { thread_current = c; return 0; }

/* The audit log: calls made while no context is current on the calling thread. */
enum { AUDIT_MAX = 1 << 16 };
static struct { const char *name; char thread[32]; } audit_entries[AUDIT_MAX];
static int audit_count, audit_lock;
static void audit(const char *name)
{
    if (thread_current)
        return;
    char t[32] = "?";
    pthread_getname_np(pthread_self(), t, sizeof t);
    while (__atomic_exchange_n(&audit_lock, 1, __ATOMIC_ACQUIRE)) {}
    if (audit_count < AUDIT_MAX) {
        audit_entries[audit_count].name = name;
        memcpy(audit_entries[audit_count].thread, t, sizeof t);
        audit_count++;
    }
    __atomic_store_n(&audit_lock, 0, __ATOMIC_RELEASE);
}
int audit_len(void) { return __atomic_load_n(&audit_count, __ATOMIC_SEQ_CST); }
const char *audit_name(int i) { return audit_entries[i].name; }
const char *audit_thread(int i) { return audit_entries[i].thread; }
void audit_clear(void)
{
    while (__atomic_exchange_n(&audit_lock, 1, __ATOMIC_ACQUIRE)) {}
    audit_count = 0;
    __atomic_store_n(&audit_lock, 0, __ATOMIC_RELEASE);
}
#define AUDIT audit(__func__)

/* While set, cuEventQuery and cuStreamQuery report CUDA_ERROR_NOT_READY (work in flight). */
static int not_ready;
void audit_not_ready(int on) { __atomic_store_n(&not_ready, on, __ATOMIC_SEQ_CST); }

/* Fork/join: a stream that waits for an event recorded in the capture joins it; calls on it
 * then act on the capturing stream. */
enum { JOIN_MAX = 64 };
static void *joined[JOIN_MAX], *capture_events[JOIN_MAX];
static int joined_count, capture_event_count;
static int is_joined(void *s)
{
    for (int i = 0; i < joined_count; i++)
        if (joined[i] == s) return 1;
    return 0;
}
static void *audit_map(void *s) { return s && capture_stream && is_joined(s) ? capture_stream : s; }

CUresult cuStreamQuery(void *s)
{
    AUDIT;
    if (__atomic_load_n(&not_ready, __ATOMIC_SEQ_CST)) return 600;
    return null_orig_cuStreamQuery(s);
}
CUresult cuStreamIsCapturing(void *s, int *status) { AUDIT; return null_orig_cuStreamIsCapturing(audit_map(s), status); }
CUresult cuStreamGetCaptureInfo_v3(void *s, int *status, unsigned long long *id, void **graph,
                                   void *const **deps, const void **edge_data, size_t *count)
{
    AUDIT;
    return null_orig_cuStreamGetCaptureInfo_v3(audit_map(s), status, id, graph, deps, edge_data, count);
}
CUresult cuMemAllocAsync(unsigned long long *p, size_t bytes, void *s) { AUDIT; return null_orig_cuMemAllocAsync(p, bytes, audit_map(s)); }
CUresult cuMemFreeAsync(unsigned long long p, void *s) { AUDIT; return null_orig_cuMemFreeAsync(p, audit_map(s)); }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *s, void **params, void **extra)
{
    AUDIT;
    return null_orig_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, audit_map(s), params, extra);
}
CUresult cuStreamEndCapture(void *s, void **g)
{
    AUDIT;
    CUresult r = null_orig_cuStreamEndCapture(s, g);
    joined_count = capture_event_count = 0;
    return r;
}

/* What null_cuda.c lacks. */
CUresult cuCtxGetDevice(int *d) { AUDIT; *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { AUDIT; return 0; }
CUresult cuDeviceCanAccessPeer(int *can, int a, int b) { (void)a; (void)b; *can = 1; return 0; }
CUresult cuDeviceGetGraphMemAttribute(int d, int attr, void *value)
{ AUDIT; (void)d; (void)attr; *(unsigned long long *)value = 0; return 0; }
CUresult cuDeviceSetGraphMemAttribute(int d, int attr, void *value)
{ AUDIT; (void)d; (void)attr; (void)value; return 0; }
CUresult cuDeviceGraphMemTrim(int d) { AUDIT; (void)d; return 0; }

CUresult cuEventRecord(void *e, void *s)
{
    AUDIT;
    if (s && (s == capture_stream || is_joined(s)) && capture_event_count < JOIN_MAX)
        capture_events[capture_event_count++] = e;
    return 0;
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags)
{
    AUDIT;
    (void)flags;
    for (int i = 0; i < capture_event_count; i++)
        if (capture_events[i] == e && s != capture_stream && !is_joined(s) && joined_count < JOIN_MAX)
            joined[joined_count++] = s;
    return 0;
}
CUresult cuEventQuery(void *e) { AUDIT; (void)e; return __atomic_load_n(&not_ready, __ATOMIC_SEQ_CST) ? 600 : 0; }
CUresult cuEventSynchronize(void *e) { AUDIT; (void)e; return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { AUDIT; (void)a; (void)b; *ms = 1.0f; return 0; }
CUresult cuStreamCreate(void **s, unsigned flags) { AUDIT; (void)flags; *s = handle(); return 0; }

CUresult cuGraphAddChildGraphNode(void **n, void *g, const void *deps, size_t count, void *child)
{ AUDIT; (void)g; (void)deps; (void)count; (void)child; *n = handle(); return 0; }
CUresult cuGraphAddEventRecordNode(void **n, void *g, const void *deps, size_t count, void *e)
{ AUDIT; (void)g; (void)deps; (void)count; (void)e; *n = handle(); return 0; }
CUresult cuGraphAddEventWaitNode(void **n, void *g, const void *deps, size_t count, void *e)
{ AUDIT; (void)g; (void)deps; (void)count; (void)e; *n = handle(); return 0; }
CUresult cuGraphAddHostNode(void **n, void *g, const void *deps, size_t count, const void *p)
{ AUDIT; (void)g; (void)deps; (void)count; (void)p; *n = handle(); return 0; }
CUresult cuGraphAddMemcpyNode(void **n, void *g, const void *deps, size_t count, const void *p, void *c)
{ AUDIT; (void)g; (void)deps; (void)count; (void)p; (void)c; *n = handle(); return 0; }
CUresult cuGraphAddMemsetNode(void **n, void *g, const void *deps, size_t count, const void *p, void *c)
{ AUDIT; (void)g; (void)deps; (void)count; (void)p; (void)c; *n = handle(); return 0; }
/* CUgraphNodeParams: the type, 12 reserved bytes, then the union; for a conditional node
 * (type 13), CUDA_CONDITIONAL_NODE_PARAMS: handle (8), type (4), size (4), phGraph_out. */
CUresult cuGraphAddNode_v2(void **n, void *g, const void *deps, const void *data, size_t count, void *p)
{
    AUDIT;
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
{ AUDIT; (void)g; (void)ctx; (void)v; (void)flags; *h = (unsigned long long)(uintptr_t)handle(); return 0; }
CUresult cuGraphDebugDotPrint(void *g, const char *path, unsigned flags)
{
    AUDIT;
    (void)g; (void)flags;
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fputs("digraph audit {}\n", f);
    fclose(f);
    return 0;
}
CUresult cuGraphExecKernelNodeSetParams_v2(void *e, void *node, const void *p)
{ AUDIT; (void)e; (void)node; (void)p; return 0; }
CUresult cuGraphInstantiateWithParams(void **e, void *g, void *params)
{ AUDIT; (void)params; return null_orig_cuGraphInstantiateWithFlags(e, g, 0); }
CUresult cuGraphLaunch(void *e, void *s) { AUDIT; (void)e; (void)s; return 0; }
CUresult cuGraphUpload(void *e, void *s) { AUDIT; (void)e; (void)s; return 0; }
CUresult cuGraphGetRootNodes(void *g, void **nodes, size_t *count) { AUDIT; (void)g; (void)nodes; *count = 0; return 0; }
CUresult cuGraphNodeGetDependencies_v2(void *node, void **deps, void *data, size_t *count)
{ AUDIT; (void)node; (void)deps; (void)data; *count = 0; return 0; }
CUresult cuGraphNodeGetDependentNodes_v2(void *node, void **deps, void *data, size_t *count)
{ AUDIT; (void)node; (void)deps; (void)data; *count = 0; return 0; }
/* Node parameters are not kept: CUDA_ERROR_INVALID_VALUE (the call is logged all the same). */
CUresult cuGraphKernelNodeGetParams_v2(void *node, void *p) { AUDIT; (void)node; (void)p; return 1; }
CUresult cuGraphMemsetNodeGetParams(void *node, void *p) { AUDIT; (void)node; (void)p; return 1; }
CUresult cuGraphMemcpyNodeGetParams(void *node, void *p) { AUDIT; (void)node; (void)p; return 1; }

CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes)
{ AUDIT; (void)bytes; *p = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED); return 0; }
CUresult cuMemFree_v2(unsigned long long p) { AUDIT; (void)p; return 0; }
CUresult cuMemAllocManaged(unsigned long long *p, size_t bytes, unsigned flags)
{ AUDIT; (void)flags; *p = (unsigned long long)(uintptr_t)calloc(1, bytes ? bytes : 1); return 0; }
CUresult cuMemAllocFromPoolAsync(unsigned long long *p, size_t bytes, void *pool, void *s)
{ AUDIT; (void)pool; return null_orig_cuMemAllocAsync(p, bytes, audit_map(s)); }
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags)
{ AUDIT; (void)flags; *pp = calloc(1, bytes ? bytes : 1); return *pp ? 0 : 2; }
CUresult cuMemFreeHost(void *p) { AUDIT; free(p); return 0; }
CUresult cuMemPoolCreate(void **pool, const void *props) { AUDIT; (void)props; *pool = handle(); return 0; }
CUresult cuMemPoolDestroy(void *pool) { AUDIT; (void)pool; return 0; }
CUresult cuMemPoolGetAccess(int *flags, void *pool, void *location)
{ AUDIT; (void)pool; (void)location; *flags = 3; return 0; }
CUresult cuMemPoolSetAccess(void *pool, const void *map, size_t count)
{ AUDIT; (void)pool; (void)map; (void)count; return 0; }
/* Captured copies and memsets become nodes of the simulated capture (1: memcpy, 2: memset). */
CUresult cuMemcpyAsync(unsigned long long d, unsigned long long src, size_t n, void *s)
{ AUDIT; (void)d; (void)src; return capture_node(audit_map(s), 1, 0, n); }
CUresult cuMemcpyHtoDAsync_v2(unsigned long long d, const void *src, size_t n, void *s)
{ AUDIT; (void)d; (void)src; return capture_node(audit_map(s), 1, 0, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, unsigned long long src, size_t n, void *s)
{ AUDIT; (void)d; (void)src; return capture_node(audit_map(s), 1, 0, n); }
CUresult cuMemcpyHtoD_v2(unsigned long long d, const void *src, size_t n)
{ AUDIT; (void)d; (void)src; (void)n; return 0; }
CUresult cuMemcpyDtoH_v2(void *d, unsigned long long src, size_t n)
{ AUDIT; (void)src; memset(d, 0, n); return 0; }
CUresult cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n)
{ AUDIT; (void)p; (void)v; (void)n; return 0; }
CUresult cuMemsetD8Async(unsigned long long p, unsigned char v, size_t n, void *s)
{ AUDIT; (void)v; return capture_node(audit_map(s), 2, p, n); }
CUresult cuMemsetD16Async(unsigned long long p, unsigned short v, size_t n, void *s)
{ AUDIT; (void)v; return capture_node(audit_map(s), 2, p, n * 2); }
CUresult cuMemsetD32Async(unsigned long long p, unsigned v, size_t n, void *s)
{ AUDIT; (void)v; return capture_node(audit_map(s), 2, p, n * 4); }
"#;

/// A function of `null_cuda.c`: its name, parameter list and argument names.
struct CFunction {
    name: String,
    params: String,
    args: Vec<String>,
}

/// The stub's exported `CUresult cu*(...)` functions, parsed from its source.
fn stub_functions() -> Vec<CFunction> {
    let src = cuda_graph_tests::STUB_DRIVER_SOURCE;
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find("\nCUresult cu") {
        let start = at + "\nCUresult ".len();
        let open = start + rest[start..].find('(').unwrap();
        let close = open + rest[open..].find(')').unwrap();
        let name = rest[start..open].trim().to_string();
        let params = rest[open + 1..close]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let args = if params == "void" {
            Vec::new()
        } else {
            params
                .split(',')
                .map(|p| {
                    let p = p.trim();
                    let begin = p
                        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .map_or(0, |i| i + 1);
                    p[begin..].to_string()
                })
                .collect()
        };
        out.push(CFunction { name, params, args });
        rest = &rest[close..];
    }
    out
}

/// The audit variant of the stub, built once per machine.
fn stub_path() -> Result<PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let functions: Vec<CFunction> = stub_functions()
            .into_iter()
            .filter(|f| !NOT_LOGGED.contains(&f.name.as_str()))
            .collect();
        let mut prefix = String::from(HEAD);
        let mut extras = String::new();
        for f in &functions {
            prefix += &format!("#define {0} null_orig_{0}\n", f.name);
            extras += &format!("#undef {}\n", f.name);
        }
        extras += EXTRAS;
        for f in &functions {
            if HAND_WRAPPED.contains(&f.name.as_str()) {
                continue;
            }
            extras += &format!(
                "CUresult {0}({1}) {{ AUDIT; return null_orig_{0}({2}); }}\n",
                f.name,
                f.params,
                f.args.join(", ")
            );
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("context-audit-stub");
        cuda_graph_tests::build_stub_variant(&dir, "null_context_audit", &prefix, &extras)
    })
    .clone()
}

/// The stub's function `name`, of type `F` (a C function pointer type).
fn stub_fn<F: Copy>(name: &str) -> F {
    // SAFETY: this file names the stub's functions with their C types.
    unsafe { cuda_graph_tests::stub_variant_fn(&stub_path().expect("the stub was built"), name) }
}

/// The log so far, as (function, thread), and clears it.
fn take_log() -> Vec<(String, String)> {
    let len: extern "C" fn() -> c_int = stub_fn("audit_len");
    let name: extern "C" fn(c_int) -> *const c_char = stub_fn("audit_name");
    let thread: extern "C" fn(c_int) -> *const c_char = stub_fn("audit_thread");
    let clear: extern "C" fn() = stub_fn("audit_clear");
    let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    let log = (0..len())
        .map(|i| (text(name(i)), text(thread(i))))
        .collect();
    clear();
    log
}

/// Makes cuEventQuery and cuStreamQuery report work in flight (`true`) or done.
fn not_ready(on: bool) {
    let f: extern "C" fn(c_int) = stub_fn("audit_not_ready");
    f(c_int::from(on));
}

/// Prints `AUDIT <label>: <calls>`, the log deduplicated in order, with counts, and notes
/// the calls outside `TOPOLOGY` (`assert_all_bound` fails on them). The test's own raw
/// `cuGraphDestroy` (a handed-over graph) is not the crate's.
fn report(label: &str) {
    let log = take_log();
    for (function, _) in &log {
        let own =
            label.starts_with("cuGraphDestroy of the raw graph") && function == "cuGraphDestroy";
        if !TOPOLOGY.contains(&function.as_str()) && !own {
            UNBOUND.lock().unwrap().push(format!("{label}: {function}"));
        }
    }
    let mut seen: Vec<((String, String), usize)> = Vec::new();
    for entry in log {
        match seen.iter_mut().find(|(e, _)| *e == entry) {
            Some((_, n)) => *n += 1,
            None => seen.push((entry, 1)),
        }
    }
    let calls: Vec<String> = seen
        .iter()
        .map(|((f, t), n)| {
            if *n > 1 {
                format!("{f}@{t} x{n}")
            } else {
                format!("{f}@{t}")
            }
        })
        .collect();
    let calls = if calls.is_empty() {
        "-".to_string()
    } else {
        calls.join(", ")
    };
    let notes = std::mem::take(&mut *NOTES.lock().unwrap());
    if notes.is_empty() {
        println!("AUDIT {label}: {calls}");
    } else {
        println!("AUDIT {label}: {calls}   [{}]", notes.join("; "));
    }
}

/// Runs `f` on a new thread named `fresh` (no context current), then reports the calls made
/// with no context current since the step began. `None` when `f` panicked.
fn step<T: Send>(label: &str, f: impl FnOnce() -> T + Send) -> Option<T> {
    let _ = take_log();
    let out = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("fresh".into())
            .spawn_scoped(s, f)
            .unwrap()
            .join()
    });
    // Let the crate's release thread finish what the step woke it for.
    std::thread::sleep(std::time::Duration::from_millis(30));
    if out.is_err() {
        note("the step panicked".into());
    }
    report(label);
    out.ok()
}

/// The calls outside `TOPOLOGY` made with no context current, by step.
static UNBOUND: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Fails when a step made a call outside `TOPOLOGY` with no context current.
fn assert_all_bound() {
    let unbound = std::mem::take(&mut *UNBOUND.lock().unwrap());
    assert!(
        unbound.is_empty(),
        "driver calls made where no context is current:\n{}",
        unbound.join("\n")
    );
}

/// Remarks on the current step, printed with its report.
static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note(text: String) {
    NOTES.lock().unwrap().push(text);
}

/// `r`'s value, or `None` after noting its error.
fn ok<T, E: Debug>(what: &str, r: Result<T, E>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            note(format!("{what}: error {e:?}"));
            None
        }
    }
}

/// The device of the stub, a module and its `fill_u32(p, n, v)` (on the main thread, where
/// loading the module made the context current).
fn stub() -> (Device, Module, Function) {
    cuda_graph_tests::stub_variant_device(&stub_path().expect("the stub was built"))
}

fn cfg() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}

/// Runs the test `name`'s `body` in a child process against the audit stub and prints its
/// `AUDIT` lines; fails when the child fails (a step made a call outside `TOPOLOGY` with no
/// context current, among others) or runs past 60 s.
fn isolated(name: &str, body: fn()) {
    if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
        body();
        assert_all_bound();
        return;
    }
    if let Err(why) = stub_path() {
        assert!(
            !cuda_graph_tests::stub_required(),
            "{name}: the audit stub could not be built ({why})"
        );
        println!("SKIPPED {name}: the audit stub could not be built ({why})");
        return;
    }
    let (status, text) = cuda_graph_tests::run_test_in_child(
        name,
        CHILD_VAR,
        &[],
        std::time::Duration::from_secs(60),
    );
    println!("==== {name}");
    for line in text
        .lines()
        .filter_map(|l| l.find("AUDIT ").map(|at| &l[at..]))
    {
        println!("{line}");
    }
    match status {
        None => panic!("{name}: no result after 60 s (deadlock)\n{text}"),
        Some(s) if !s.success() => panic!("{name} failed:\n{text}"),
        Some(_) => {}
    }
}

// ------------------------------------------------------------------ explicit graphs

fn explicit_graph_body() {
    let (device, _module, fill) = stub();
    let out = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let event = Event::new(&device).unwrap();
    let mut child = Graph::new(&device).unwrap();
    child.add_empty_node(&[]).unwrap();
    let mut moved = Graph::new(&device).unwrap();
    let (ca, cbuf) = moved
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    moved.add_mem_free_node(&[ca], &cbuf).unwrap();
    let stream = Stream::new(&device).unwrap();

    let mut graph = step("Graph::new", || Graph::new(&device).unwrap()).unwrap();
    let g = &mut graph;
    let (alloc, buf) = step("Graph::add_mem_alloc_node", || {
        g.add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap()
    })
    .unwrap();
    let kernel = step("Graph::add_kernel_node", || unsafe {
        g.add_kernel_node(
            &[alloc],
            &fill,
            cfg(),
            &KernelArgs::new().ptr(&buf).value(N).value(1u32),
        )
        .unwrap()
    })
    .unwrap();
    let memset = step("Graph::add_memset_node", || {
        g.add_memset_node(&[kernel], &buf, 7, N as usize).unwrap()
    })
    .unwrap();
    let memset2 = step("Graph::add_memset_node_2d", || {
        g.add_memset_node_2d(&[memset], &buf, 3u16, 16, 4, 64)
            .unwrap()
    })
    .unwrap();
    let copy = step("Graph::add_memcpy_node", || {
        g.add_memcpy_node(&[memset2], &out, &buf, BYTES).unwrap()
    })
    .unwrap();
    let htod = step("Graph::add_memcpy_node_htod", || {
        g.add_memcpy_node_htod(&[copy], &buf, &pinned, BYTES)
            .unwrap()
    })
    .unwrap();
    let dtoh = step("Graph::add_memcpy_node_dtoh", || {
        g.add_memcpy_node_dtoh(&[htod], &pinned, &buf, BYTES)
            .unwrap()
    })
    .unwrap();
    let empty = step("Graph::add_empty_node", || {
        g.add_empty_node(&[dtoh]).unwrap()
    })
    .unwrap();
    let host = step("Graph::add_host_node", || {
        g.add_host_node(&[empty], || {}).unwrap()
    })
    .unwrap();
    let rec = step("Graph::add_event_record_node", || {
        g.add_event_record_node(&[host], &event).unwrap()
    })
    .unwrap();
    let wait = step("Graph::add_event_wait_node", || {
        g.add_event_wait_node(&[rec], &event).unwrap()
    })
    .unwrap();
    let ch = step("Graph::add_child_graph_node", || {
        let child = child;
        let n = g.add_child_graph_node(&[wait], &child).unwrap();
        drop(child);
        n
    })
    .unwrap();
    #[cfg(cuda_graph_child_move)]
    let ch = step("Graph::add_child_graph_node_moved", || {
        g.add_child_graph_node_moved(&[ch], moved).unwrap()
    })
    .unwrap();
    #[cfg(not(cuda_graph_child_move))]
    drop(moved);
    let cond = step("Graph::add_condition", || g.add_condition(Some(1)).unwrap()).unwrap();
    let fill_ref = &fill;
    let out_ref = &out;
    let conditional = step(
        "Graph::add_conditional_node (If; body: empty + kernel node)",
        || {
            g.add_conditional_node(&[ch], &cond, ConditionalKind::If, |bodies| {
                let e = bodies[0].add_empty_node(&[])?;
                // SAFETY: fill_u32 over `out`; the stub runs nothing.
                unsafe {
                    bodies[0].add_kernel_node(
                        &[e],
                        fill_ref,
                        cfg(),
                        &KernelArgs::new().ptr(out_ref).value(N).value(2u32),
                    )
                }?;
                Ok(())
            })
            .unwrap()
        },
    )
    .unwrap();
    let free = step("Graph::add_mem_free_node", || {
        g.add_mem_free_node(&[conditional], &buf).unwrap()
    })
    .unwrap();
    step("Graph::add_dependency", || {
        g.add_dependency(alloc, free).unwrap();
    });
    step("Graph::set_label / check / to_dot / record", || {
        let g: &mut Graph = &mut *g;
        g.set_label(alloc, "a").unwrap();
        g.check().unwrap();
        let _ = g.to_dot();
        let _ = g.record().nodes().len();
    });
    let dot = std::env::temp_dir().join(format!("context-audit-{}.dot", std::process::id()));
    step("Graph::debug_dot_print", || {
        let g: &mut Graph = &mut *g;
        ok("debug_dot_print", g.debug_dot_print(&dot));
    });
    let _ = std::fs::remove_file(&dot);
    step("Graph::node_type", || {
        let g: &mut Graph = &mut *g;
        ok("node_type", g.node_type(kernel));
    });
    step("Graph::node_params (kernel node)", || {
        let g: &mut Graph = &mut *g;
        ok("node_params", g.node_params(kernel));
    });
    step("Graph::node_params (alloc node)", || {
        let g: &mut Graph = &mut *g;
        ok("node_params", g.node_params(alloc));
    });
    step("Graph::dependencies / dependents", || {
        let g: &mut Graph = &mut *g;
        ok("dependencies", g.dependencies(kernel));
        ok("dependents", g.dependents(kernel));
    });
    step("Graph::root_nodes / driver_nodes", || {
        let g: &mut Graph = &mut *g;
        ok("root_nodes", g.root_nodes());
        ok("driver_nodes", g.driver_nodes());
    });
    let exec = step("Graph::instantiate", || {
        let g: &mut Graph = &mut *g;
        g.instantiate(InstantiateFlags::NONE).unwrap()
    })
    .unwrap();
    drop(exec);
    flush_deferred();
    let s = &stream;
    let exec = step("Graph::instantiate_and_upload", || {
        let g: &mut Graph = &mut *g;
        ok(
            "instantiate_and_upload",
            g.instantiate_and_upload(InstantiateFlags::NONE, s),
        )
    })
    .unwrap();
    drop(exec);
    flush_deferred();
    step("drop Graph (explicit, all node kinds)", move || drop(graph));

    // into_raw and from_raw.
    let mut handed = Graph::new(&device).unwrap();
    let (a, b) = handed
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    // SAFETY: fill_u32 over `b`; the stub runs nothing.
    let k = unsafe {
        handed.add_kernel_node(
            &[a],
            &fill,
            cfg(),
            &KernelArgs::new().ptr(&b).value(N).value(1u32),
        )
    }
    .unwrap();
    handed.add_mem_free_node(&[k], &b).unwrap();
    drop(b);
    let raw = step("Graph::into_raw", move || handed.into_raw() as usize).unwrap();
    step(
        "cuGraphDestroy of the raw graph on a fresh thread (user object destructor)",
        || {
            let _ = unsafe { cuda_graph::sys::cuGraphDestroy(raw as cuda_graph::sys::CUgraph) };
        },
    );
    let mut raw2 = std::ptr::null_mut();
    let _ = unsafe { cuda_graph::sys::cuGraphCreate(&mut raw2, 0) };
    let raw2 = raw2 as usize;
    let from = step("Graph::from_raw", || unsafe {
        Graph::from_raw(raw2 as cuda_graph::sys::CUgraph, &device).unwrap()
    })
    .unwrap();
    step("drop Graph (from_raw)", move || drop(from));
}

#[test]
fn explicit_graphs() {
    isolated("explicit_graphs", explicit_graph_body);
}

// ------------------------------------------------------------------ executable graphs

/// alloc → kernel → free.
fn alloc_kernel_free(device: &Device, fill: &Function) -> (Graph, cuda_graph::Node) {
    let mut graph = Graph::new(device).unwrap();
    let (a, b) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    // SAFETY: fill_u32 over `b`; the stub runs nothing.
    let k = unsafe {
        graph.add_kernel_node(
            &[a],
            fill,
            cfg(),
            &KernelArgs::new().ptr(&b).value(N).value(1u32),
        )
    }
    .unwrap();
    graph.add_mem_free_node(&[k], &b).unwrap();
    (graph, k)
}

/// One kernel node on `buf` (no memory nodes: updatable).
fn kernel_on(
    device: &Device,
    fill: &Function,
    buf: &DeviceBuffer<u32>,
    v: u32,
) -> (Graph, cuda_graph::Node) {
    let mut graph = Graph::new(device).unwrap();
    // SAFETY: fill_u32 over `buf`; the stub runs nothing.
    let k = unsafe {
        graph.add_kernel_node(
            &[],
            fill,
            cfg(),
            &KernelArgs::new().ptr(buf).value(N).value(v),
        )
    }
    .unwrap();
    (graph, k)
}

fn exec_graph_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let s = &stream;
    let buf = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();

    // Memory nodes, alloc and free in the graph: the fast launch path.
    let (graph, _) = alloc_kernel_free(&device, &fill);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    let exec = step("ExecGraph::launch (owned Stream)", move || {
        ok("launch", exec.launch(s));
        exec
    })
    .unwrap();
    let exec = step("ExecGraph::launch (BorrowedStream::legacy)", || {
        ok("launch", exec.launch(&BorrowedStream::legacy(&device)));
        exec
    })
    .unwrap();
    let exec = step("ExecGraph::upload", move || {
        ok("upload", exec.upload(s));
        exec
    })
    .unwrap();
    step("drop ExecGraph (after launches)", move || drop(exec));
    step("drop Graph (instantiated, launched)", move || drop(graph));

    // Update and kernel parameters.
    let (g1, k1) = kernel_on(&device, &fill, &buf, 1);
    let (g2, _) = kernel_on(&device, &fill, &buf, 2);
    let mut exec = g1.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    let (bufr, fillr) = (&buf, &fill);
    let (exec, g2) = step("ExecGraph::update", move || {
        ok("update", exec.update(&g2));
        (exec, g2)
    })
    .unwrap();
    let (exec, g1) = step("ExecGraph::set_kernel_node_params", move || {
        let mut exec = exec;
        ok("set_kernel_node_params", unsafe {
            exec.set_kernel_node_params(
                &g1,
                k1,
                fillr,
                cfg(),
                &KernelArgs::new().ptr(bufr).value(N).value(3u32),
            )
        });
        (exec, g1)
    })
    .unwrap();
    exec.launch(&stream).unwrap();
    step("drop ExecGraph (updated, launched)", move || drop(exec));
    drop((g1, g2));

    // An allocation that outlives its graph's launch: the checked launch path, and its frees.
    let mut producer = Graph::new(&device).unwrap();
    let (_, live) = producer
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
    pexec.launch(&stream).unwrap();
    let mut consumer = Graph::new(&device).unwrap();
    // SAFETY: fill_u32 over `live`; the stub runs nothing.
    unsafe {
        consumer.add_kernel_node(
            &[],
            &fill,
            cfg(),
            &KernelArgs::new().ptr(&live).value(N).value(4u32),
        )
    }
    .unwrap();
    let cexec = consumer.instantiate(InstantiateFlags::NONE).unwrap();
    let cexec = step(
        "ExecGraph::launch (uses a live allocation of another graph)",
        move || {
            ok("launch", cexec.launch(s));
            cexec
        },
    )
    .unwrap();
    let pexec = step(
        "ExecGraph::launch (relaunch refused: allocation live)",
        move || {
            ok("launch", pexec.launch(s));
            pexec
        },
    )
    .unwrap();
    let live2 = live.clone();
    step("GraphAllocation::free_async", || {
        ok("free_async", live2.free_async(s));
    });
    step("drop ExecGraph (consumer)", move || drop(cexec));
    step("drop ExecGraph (producer)", move || drop(pexec));
    drop((consumer, producer, live, live2));
    flush_deferred();

    // GraphAllocation::free (on the device's private stream), and a drop of a live one.
    let mut producer = Graph::new(&device).unwrap();
    let (_, live) = producer
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
    pexec.launch(&stream).unwrap();
    let lr = &live;
    step(
        "GraphAllocation::free (first use of the reaper stream)",
        || {
            ok("free", lr.free());
        },
    );
    pexec.launch(&stream).unwrap();
    drop(pexec);
    drop(producer);
    flush_deferred();
    step("drop GraphAllocation (live, last handle)", move || {
        drop(live)
    });

    // AUTO_FREE_ON_LAUNCH relaunch, on a fresh thread.
    let mut producer = Graph::new(&device).unwrap();
    let (_, live) = producer
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let pexec = producer
        .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
        .unwrap();
    pexec.launch(&stream).unwrap();
    let pexec = step(
        "ExecGraph::launch (AUTO_FREE_ON_LAUNCH relaunch)",
        move || {
            ok("launch", pexec.launch(s));
            pexec
        },
    )
    .unwrap();
    drop((pexec, producer));
    flush_deferred();
    step(
        "drop GraphAllocation (live, last handle, reaper exists)",
        move || drop(live),
    );

    // A stream allocation whose last holder is a graph (its handle let go first): the
    // graph's drop frees it on the device's private stream.
    {
        let sa = StreamAllocation::new(&stream, BYTES).unwrap();
        let mut g = Graph::new(&device).unwrap();
        // SAFETY: fill_u32 over `sa`; the stub runs nothing.
        unsafe {
            g.add_kernel_node(
                &[],
                &fill,
                cfg(),
                &KernelArgs::new().ptr(&sa).value(N).value(1u32),
            )
        }
        .unwrap();
        let x = g.instantiate(InstantiateFlags::NONE).unwrap();
        x.launch(&stream).unwrap();
        drop(sa);
        drop(x);
        flush_deferred();
        step(
            "drop Graph (last holder of a StreamAllocation; reaper exists)",
            move || drop(g),
        );
    }

    // Releases that wait for the GPU: run by the crate's release thread.
    let (graph, _) = alloc_kernel_free(&device, &fill);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&BorrowedStream::legacy(&device)).unwrap();
    not_ready(true);
    let _ = take_log();
    drop(exec);
    std::thread::sleep(std::time::Duration::from_millis(50));
    report("drop ExecGraph on main while its launch runs (release thread polls)");
    not_ready(false);
    std::thread::sleep(std::time::Duration::from_millis(100));
    report("... the launch completes (release thread releases)");
    drop(graph);

    let (graph, _) = alloc_kernel_free(&device, &fill);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    let stream2 = Stream::new(&device).unwrap();
    exec.launch(&stream2).unwrap();
    not_ready(true);
    let _ = take_log();
    drop(exec);
    std::thread::sleep(std::time::Duration::from_millis(50));
    report("drop ExecGraph on main, launched on an owned Stream still busy");
    not_ready(false);
    std::thread::sleep(std::time::Duration::from_millis(100));
    report("... the stream's work completes (release thread releases)");
    drop(graph);
    drop(stream2);
    flush_deferred();
}

#[test]
fn exec_graphs() {
    isolated("exec_graphs", exec_graph_body);
}

// ------------------------------------------------------------------ streams, events, memory

fn objects_body() {
    let (device, module, fill) = stub();
    let d = &device;
    let stream = step("Stream::new", || Stream::new(d).unwrap()).unwrap();
    let s = &stream;
    step("AsStream::synchronize", || {
        ok("synchronize", s.synchronize());
    });
    step("AsStream::stream_id", || {
        ok("stream_id", s.stream_id());
    });
    step("AsStream::capture_status", || {
        ok("capture_status", s.capture_status());
    });
    let event = step("Event::new", || Event::new(d).unwrap()).unwrap();
    let e = &event;
    step("Event::record", || {
        ok("record", e.record(s));
    });
    step("AsStream::wait_event", || {
        ok("wait_event", s.wait_event(e));
    });
    step("Event::synchronize", || {
        ok("synchronize", e.synchronize());
    });
    step("Event::is_complete", || {
        ok("is_complete", e.is_complete());
    });
    let later = Event::new(d).unwrap();
    step("Event::elapsed_since", || {
        ok("elapsed_since", later.elapsed_since(e));
    });
    step("Event::into_raw", move || {
        let _ = later.into_raw();
    });
    step("drop Event", move || drop(event));

    let buf = step("DeviceBuffer::zeroed", || {
        DeviceBuffer::<u32>::zeroed(d, N as usize).unwrap()
    })
    .unwrap();
    let b = &buf;
    let data = vec![5u32; N as usize];
    let other = step("DeviceBuffer::from_slice", || {
        DeviceBuffer::<u32>::from_slice(d, &data).unwrap()
    })
    .unwrap();
    step("DeviceBuffer::copy_from", || {
        ok("copy_from", b.copy_from(&data));
    });
    step("DeviceBuffer::to_vec", || {
        ok("to_vec", b.to_vec());
    });
    step("DeviceBuffer::to_vec_after", || {
        ok("to_vec_after", b.to_vec_after(s));
    });
    let o = &other;
    step("StreamMemOps::memset_async", || {
        ok("memset_async", s.memset_async(b, 1u32, N as usize));
    });
    step("StreamMemOps::memcpy_async", || {
        ok("memcpy_async", s.memcpy_async(o, b, BYTES));
    });
    let mut pinned = step("PinnedBuffer::zeroed", || {
        PinnedBuffer::<u32>::zeroed(d, N as usize).unwrap()
    })
    .unwrap();
    let pinned2 = step("PinnedBuffer::from_slice", || {
        PinnedBuffer::<u32>::from_slice(d, &data).unwrap()
    })
    .unwrap();
    let p = &pinned;
    step("StreamMemOps::memcpy_htod_async", || {
        ok("memcpy_htod_async", s.memcpy_htod_async(b, p, BYTES));
    });
    step("StreamMemOps::memcpy_dtoh_async", || {
        ok("memcpy_dtoh_async", s.memcpy_dtoh_async(p, b, BYTES));
    });
    step("Function::launch", || {
        ok("launch", unsafe {
            fill.launch(s, cfg(), &KernelArgs::new().ptr(b).value(N).value(1u32))
        });
    });
    step("PinnedBuffer::as_slice / to_vec / is_idle", || {
        ok("as_slice", p.as_slice().map(|v| v.len()));
        ok("to_vec", p.to_vec());
        ok("is_idle", p.is_idle());
    });
    let pm = &mut pinned;
    step("PinnedBuffer::as_mut_slice / copy_from_slice", || {
        ok("as_mut_slice", pm.as_mut_slice().map(|v| v.len()));
        ok("copy_from_slice", pm.copy_from_slice(&data));
    });
    let managed = step("ManagedBuffer::zeroed", || {
        ManagedBuffer::<u32>::zeroed(d, N as usize).unwrap()
    })
    .unwrap();
    let m = &managed;
    step("ManagedBuffer::as_slice", || {
        ok("as_slice", m.as_slice().map(|v| v.len()));
    });
    // SAFETY: fill_u32 over `managed`; the stub runs nothing.
    unsafe { fill.launch(s, cfg(), &KernelArgs::new().ptr(m).value(N).value(1u32)) }.unwrap();
    step("ManagedBuffer::as_slice (after a kernel used it)", || {
        ok("as_slice", m.as_slice().map(|v| v.len()));
    });
    let pool = step("MemPool::new", || MemPool::new(d).unwrap()).unwrap();
    let pool2 = step("MemPool::new_managed", || {
        ok("new_managed", MemPool::new_managed(d))
    })
    .unwrap();
    let pl = &pool;
    step("MemPool::set_access / access", || {
        ok("set_access", pl.set_access(d, Access::ReadWrite));
        ok("access", pl.access(d));
    });
    let sa = step("StreamAllocation::new", || {
        StreamAllocation::new(s, BYTES).unwrap()
    })
    .unwrap();
    let sb = step("StreamAllocation::from_pool", || {
        StreamAllocation::from_pool(s, pl, BYTES).unwrap()
    })
    .unwrap();
    step("StreamAllocation::free_async", move || {
        ok("free_async", sa.free_async());
    });
    step("drop StreamAllocation", move || drop(sb));
    let sc = StreamAllocation::new(s, BYTES).unwrap();
    // SAFETY: fill_u32 over `sc`; the stub runs nothing.
    unsafe { fill.launch(s, cfg(), &KernelArgs::new().ptr(&sc).value(N).value(1u32)) }.unwrap();
    step(
        "drop StreamAllocation (after a kernel used it)",
        move || drop(sc),
    );
    let per_thread = BorrowedStream::per_thread(d);
    let sd = StreamAllocation::new(&per_thread, BYTES).unwrap();
    step(
        "drop StreamAllocation (per-thread stream of main)",
        move || drop(sd),
    );

    let module2 = step("Module::from_ptx", || {
        Module::from_ptx(d, cuda_graph::kernels::PTX).unwrap()
    })
    .unwrap();
    let m2 = &module2;
    let f2 = step("Module::function", || m2.function("fill_u32").unwrap()).unwrap();

    step("Device::get", || {
        ok("get", Device::get(0));
    });
    step("Device::synchronize", || {
        ok("synchronize", d.synchronize());
    });
    step("Device::graph_mem_info", || {
        ok("graph_mem_info", d.graph_mem_info());
    });
    step("Device::reset_graph_mem_high_watermarks", || {
        ok("reset", d.reset_graph_mem_high_watermarks());
    });
    step("Device::graph_mem_trim", || {
        ok("graph_mem_trim", d.graph_mem_trim());
    });
    step(
        "Device::name / total_memory / attribute / can_access_peer",
        || {
            ok("name", d.name());
            ok("total_memory", d.total_memory());
            ok("supports_memory_pools", d.supports_memory_pools());
            ok("can_access_peer", d.can_access_peer(d));
        },
    );
    let ctx = device.context_raw() as usize;
    step("Device::from_raw", || {
        ok("from_raw", unsafe {
            Device::from_raw(ctx as cuda_graph::sys::CUcontext)
        });
    });
    step("flush_deferred (nothing queued)", || {
        flush_deferred();
    });

    // Drops on a fresh thread.
    step("drop DeviceBuffer (after stream use)", move || drop(buf));
    step("drop DeviceBuffer", move || drop(other));
    step("drop PinnedBuffer (after stream copies)", move || {
        drop(pinned)
    });
    step("drop PinnedBuffer", move || drop(pinned2));
    step("drop ManagedBuffer (after a kernel used it)", move || {
        drop(managed)
    });
    step("drop MemPool", move || drop(pool));
    step("drop MemPool (managed)", move || drop(pool2));
    step("drop Function (module still held)", move || drop(f2));
    step("drop Module (last holder)", move || drop(module2));
    step("drop Stream (after work)", move || drop(stream));
    let idle = Stream::new(d).unwrap();
    step("drop Stream (never used)", move || drop(idle));
    let raw_stream = Stream::new(d).unwrap();
    step("Stream::into_raw", move || {
        let _ = raw_stream.into_raw();
    });
    step("drop Function + Module (last holders)", move || {
        drop((fill, module))
    });
    step(
        "drop Device (last handle: reaper stream, primary context)",
        move || drop(device),
    );
}

#[test]
fn streams_events_memory() {
    isolated("streams_events_memory", objects_body);
}

// ------------------------------------------------------------------ stream capture

/// In a capture: an allocation, a kernel that fills it, a memset of it, a copy of it into
/// `out`, its free.
fn captured_chain(
    cap: &cuda_graph::Capture<'_, Stream>,
    fill: &Function,
    out: &DeviceBuffer<u32>,
) -> cuda_graph::Result<()> {
    let a = cap.malloc_async(BYTES)?;
    unsafe { cap.launch(fill, cfg(), &KernelArgs::new().ptr(&a).value(N).value(1u32)) }?;
    cap.memset_async(&a, 9u32, N as usize)?;
    cap.memcpy_async(out, &a, BYTES)?;
    cap.free_async(&a)
}

fn capture_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let other = Stream::new(&device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pool = MemPool::new(&device).unwrap();
    let (s, o, d) = (&stream, &other, &device);
    let graph = step(
        "capture() on a fresh thread: malloc_async, launch, memset_async, memcpy_async, free_async",
        || {
            ok(
                "capture",
                capture(s, CaptureMode::Global, |cap| {
                    captured_chain(cap, &fill, &out)
                }),
            )
        },
    )
    .flatten();
    drop(graph);
    step(
        "capture(): memcpy_htod_async, memcpy_dtoh_async, malloc_from_pool_async",
        || {
            ok(
                "capture",
                capture(s, CaptureMode::ThreadLocal, |cap| {
                    let a = cap.malloc_from_pool_async(&pool, BYTES)?;
                    cap.memcpy_htod_async(&a, &pinned, BYTES)?;
                    cap.memcpy_dtoh_async(&pinned, &a, BYTES)?;
                    cap.free_async(&a)?;
                    Ok(())
                }),
            );
        },
    );
    step("capture(): fork, launch_on, join, free_async", || {
        ok(
            "capture",
            capture(s, CaptureMode::Global, |cap| {
                let a = cap.malloc_async(BYTES)?;
                cap.fork(o)?;
                unsafe {
                    cap.launch_on(
                        o,
                        &fill,
                        cfg(),
                        &KernelArgs::new().ptr(&a).value(N).value(1u32),
                    )
                }?;
                cap.join(o)?;
                cap.free_async(&a)?;
                Ok(())
            }),
        );
    });
    step(
        "capture(): Function::launch on the capturing stream (outside the guard)",
        || {
            ok(
                "capture",
                capture(s, CaptureMode::Relaxed, |_cap| unsafe {
                    fill.launch(s, cfg(), &KernelArgs::new().ptr(&out).value(N).value(1u32))
                }),
            );
        },
    );
    step(
        "capture(): closure fails (guard dropped, capture discarded)",
        || {
            let r: cuda_graph::Result<((), ())> = capture(s, CaptureMode::Global, |_cap| {
                Err(cuda_graph::Error::CaptureLeftOpen)
            })
            .map(|(g, v)| {
                drop(g);
                ((), v)
            });
            let _ = r;
        },
    );

    // Reading back a captured graph (the stub knows captured nodes' types), and taking over
    // a raw captured graph with memory nodes.
    let (captured, ()) = capture(&stream, CaptureMode::Global, |cap| {
        captured_chain(cap, &fill, &out)
    })
    .unwrap();
    let captured = step(
        "Graph::node_params / node_type on a captured graph (every node)",
        move || {
            let nodes: Vec<_> = captured
                .driver_nodes()
                .unwrap()
                .into_iter()
                .filter_map(|n| n.recorded())
                .collect();
            for node in nodes {
                ok("node_params", captured.node_params(node));
            }
            captured
        },
    )
    .unwrap();
    let raw = captured.into_raw() as usize;
    step(
        "Graph::from_raw of a captured graph with alloc and free nodes",
        move || {
            let g = ok("from_raw", unsafe {
                Graph::from_raw(raw as cuda_graph::sys::CUgraph, d)
            });
            std::mem::forget(g);
        },
    );

    // A capture left open on main (its guard forgotten); the stream dropped on a fresh thread.
    let open = Stream::new(&device).unwrap();
    let guard = cuda_graph::Capture::begin(&open, CaptureMode::Relaxed).unwrap();
    std::mem::forget(guard);
    step(
        "drop Stream with a capture left open (end_forgotten_capture)",
        move || drop(open),
    );
}

#[test]
fn stream_capture() {
    isolated("stream_capture", capture_body);
}

// ------------------------------------------------------------------ deferred releases

fn deferred_body() {
    let (device, module, fill) = stub();
    let work = Stream::new(&device).unwrap();
    let capturing = Stream::new(&device).unwrap();
    // A graph allocation whose free made the device's private (reaper) stream.
    {
        let mut producer = Graph::new(&device).unwrap();
        let (_, live) = producer
            .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap();
        let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
        pexec.launch(&work).unwrap();
        drop((pexec, producer));
        live.free().unwrap();
    }
    flush_deferred();

    // Releases put off while main captures (thread-local mode: only main is restricted), then
    // run by flush_deferred on a fresh thread, one value at a time (a release that binds the
    // context would hide the calls of the releases after it on that thread).
    // A live graph allocation (its graph launched, never freed), and an executable graph.
    let live = {
        let mut producer = Graph::new(&device).unwrap();
        let (_, live) = producer
            .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap();
        let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
        pexec.launch(&work).unwrap();
        drop((pexec, producer));
        flush_deferred();
        live
    };
    let (graph, _) = alloc_kernel_free(&device, &fill);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&BorrowedStream::legacy(&device)).unwrap();

    let guard = cuda_graph::Capture::begin(&capturing, CaptureMode::ThreadLocal).unwrap();
    // First, while the crate's release thread has not run anything: its drop wakes it.
    let _ = take_log();
    drop(exec);
    std::thread::sleep(std::time::Duration::from_millis(100));
    report(
        "ExecGraph: dropped on main inside a thread-local capture (the release thread runs its releases)",
    );
    step("ExecGraph: flush_deferred afterwards", || {
        flush_deferred();
    });
    let queued = |label: &str, value: Box<dyn FnOnce() + '_>| {
        let _ = take_log();
        value();
        report(&format!(
            "{label}: dropped on main inside a thread-local capture"
        ));
        step(
            &format!("{label}: its queued release, run by flush_deferred"),
            || {
                let left = flush_deferred();
                if left != 0 {
                    note(format!("flush_deferred left {left} queued"));
                }
            },
        );
    };
    let m = Module::from_ptx(&device, cuda_graph::kernels::PTX).unwrap();
    queued("Module", Box::new(move || drop(m)));
    let f = module.function("fill_u32").unwrap();
    let m = module.clone();
    queued(
        "Function + Module (last holders)",
        Box::new(move || drop((f, m))),
    );
    let b = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    queued("DeviceBuffer", Box::new(move || drop(b)));
    let p = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    queued("PinnedBuffer", Box::new(move || drop(p)));
    let mb = ManagedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    queued("ManagedBuffer", Box::new(move || drop(mb)));
    let pool = MemPool::new(&device).unwrap();
    queued("MemPool", Box::new(move || drop(pool)));
    let e = Event::new(&device).unwrap();
    queued("Event", Box::new(move || drop(e)));
    let st = Stream::new(&device).unwrap();
    queued("Stream", Box::new(move || drop(st)));
    {
        // A queued release run by Graph::instantiate on a fresh thread (it flushes first).
        let e = Event::new(&device).unwrap();
        drop(e);
        let g = Graph::new(&device).unwrap();
        let x = step(
            "Event: its queued release, run by Graph::instantiate",
            move || {
                let x = g.instantiate(InstantiateFlags::NONE).unwrap();
                (x, g)
            },
        );
        drop(x);
        flush_deferred();
        step("flush_deferred (what dropping that graph queued)", || {
            flush_deferred();
        });
    }
    let g = Graph::new(&device).unwrap();
    queued("Graph", Box::new(move || drop(g)));
    queued(
        "GraphAllocation (live, last handle)",
        Box::new(move || drop(live)),
    );
    let sa = StreamAllocation::new(&work, BYTES).unwrap();
    queued("StreamAllocation", Box::new(move || drop(sa)));
    drop(guard.end());
    drop(graph);
    drop(capturing);
    drop(work);
    drop((fill, module));
    flush_deferred();
    step(
        "drop Device (last handle; reaper stream exists)",
        move || drop(device),
    );
}

#[test]
fn deferred_releases() {
    isolated("deferred_releases", deferred_body);
}

/// Guards the audit's own machinery: the stub logs a call made with no context current and
/// none made with one.
#[test]
fn the_audit_stub_logs_calls_without_a_context() {
    isolated("the_audit_stub_logs_calls_without_a_context", || {
        let (device, _module, _fill) = stub();
        let _ = take_log();
        let _ = Event::new(&device).unwrap();
        flush_deferred();
        assert!(
            take_log().is_empty(),
            "calls on main, where the context is current"
        );
        std::thread::spawn(|| {
            let mut g = std::ptr::null_mut();
            let _ = unsafe { cuda_graph::sys::cuGraphCreate(&mut g, 0) };
        })
        .join()
        .unwrap();
        let log = take_log();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].0, "cuGraphCreate");
    });
}
