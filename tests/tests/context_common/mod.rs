//! What the tests against the context-tracking variant of the stub driver share: the variant
//! itself, reading its call log, its switches, and running a test body in a child process that
//! loads it as its driver. Included with `mod context_common;` by `context_audit_stub.rs` and
//! `attack_release_stub.rs`.
//!
//! The variant is `stub-driver/null_cuda.c` with the current context kept per thread, as the
//! driver keeps it, and every driver function other than the init, device and context queries
//! (`NOT_LOGGED`) wrapped: each call is logged with its function, whether a context was current
//! on the calling thread, and the thread's name ([`take_log`]). The wrappers of the stub's own
//! functions are generated from `null_cuda.c` at test time (`stub_functions`); what the stub
//! lacks (memset, memcpy, host, event and child nodes, launches, pools, host memory, ...) is
//! added in `EXTRAS`, doing nothing but hand out handles. Stream capture is simulated as in the
//! stub, plus fork/join: a stream that waits for an event recorded in the capture joins it.
//!
//! Two switches: [`fail_bind`] makes `cuCtxSetCurrent` fail (a context that cannot be made
//! current), and [`not_ready`] makes `cuEventQuery` and `cuStreamQuery` report work in flight.

#![allow(dead_code)] // each test binary uses a part

use std::ffi::{CStr, c_char, c_int};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use cuda_graph::{Device, DeviceAddress, Function, Graph, KernelArgs, LaunchConfig, Module, Node};

pub const BYTES: usize = 1 << 20;
pub const N: u64 = (BYTES / 4) as u64;

/// The variable that names the test a child process runs.
const CHILD_VAR: &str = "CONTEXT_STUB_CHILD";

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

/* The current context, per thread, as the driver keeps it; while stub_fail_bind(1), making a
 * context current fails with CUDA_ERROR_INVALID_CONTEXT (201). */
static __thread void *thread_current;
static int fail_bind;
void stub_fail_bind(int on) { __atomic_store_n(&fail_bind, on, __ATOMIC_SEQ_CST); }
CUresult cuCtxGetCurrent(void **c) { *c = thread_current; return 0; }
CUresult cuCtxSetCurrent(void *c)
{
    if (c && __atomic_load_n(&fail_bind, __ATOMIC_SEQ_CST)) return 201;
    thread_current = c;
    return 0;
}

/* The log: every wrapped call, with whether a context was current on the calling thread and
 * the thread's name. */
enum { LOG_MAX = 1 << 16 };
static struct { const char *name; int ctx; char thread[32]; } log_entries[LOG_MAX];
static int log_count, log_lock;
static void log_call(const char *name)
{
    char t[32] = "?";
    pthread_getname_np(pthread_self(), t, sizeof t);
    while (__atomic_exchange_n(&log_lock, 1, __ATOMIC_ACQUIRE)) {}
    if (log_count < LOG_MAX) {
        log_entries[log_count].name = name;
        log_entries[log_count].ctx = thread_current != NULL;
        memcpy(log_entries[log_count].thread, t, sizeof t);
        log_count++;
    }
    __atomic_store_n(&log_lock, 0, __ATOMIC_RELEASE);
}
int stub_log_len(void) { return __atomic_load_n(&log_count, __ATOMIC_SEQ_CST); }
const char *stub_log_name(int i) { return log_entries[i].name; }
int stub_log_ctx(int i) { return log_entries[i].ctx; }
const char *stub_log_thread(int i) { return log_entries[i].thread; }
void stub_log_clear(void)
{
    while (__atomic_exchange_n(&log_lock, 1, __ATOMIC_ACQUIRE)) {}
    log_count = 0;
    __atomic_store_n(&log_lock, 0, __ATOMIC_RELEASE);
}
#define LOG_CALL log_call(__func__)

/* While set, cuEventQuery and cuStreamQuery report CUDA_ERROR_NOT_READY (work in flight). */
static int not_ready;
void stub_not_ready(int on) { __atomic_store_n(&not_ready, on, __ATOMIC_SEQ_CST); }

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
static void *joined_map(void *s) { return s && capture_stream && is_joined(s) ? capture_stream : s; }

CUresult cuStreamQuery(void *s)
{
    LOG_CALL;
    if (__atomic_load_n(&not_ready, __ATOMIC_SEQ_CST)) return 600;
    return null_orig_cuStreamQuery(s);
}
CUresult cuStreamIsCapturing(void *s, int *status) { LOG_CALL; return null_orig_cuStreamIsCapturing(joined_map(s), status); }
CUresult cuStreamGetCaptureInfo_v3(void *s, int *status, unsigned long long *id, void **graph,
                                   void *const **deps, const void **edge_data, size_t *count)
{
    LOG_CALL;
    return null_orig_cuStreamGetCaptureInfo_v3(joined_map(s), status, id, graph, deps, edge_data, count);
}
CUresult cuMemAllocAsync(unsigned long long *p, size_t bytes, void *s) { LOG_CALL; return null_orig_cuMemAllocAsync(p, bytes, joined_map(s)); }
CUresult cuMemFreeAsync(unsigned long long p, void *s) { LOG_CALL; return null_orig_cuMemFreeAsync(p, joined_map(s)); }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *s, void **params, void **extra)
{
    LOG_CALL;
    return null_orig_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, joined_map(s), params, extra);
}
CUresult cuStreamEndCapture(void *s, void **g)
{
    LOG_CALL;
    CUresult r = null_orig_cuStreamEndCapture(s, g);
    joined_count = capture_event_count = 0;
    return r;
}

/* What null_cuda.c lacks. */
CUresult cuCtxGetDevice(int *d) { LOG_CALL; *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { LOG_CALL; return 0; }
CUresult cuDeviceCanAccessPeer(int *can, int a, int b) { (void)a; (void)b; *can = 1; return 0; }
CUresult cuDeviceGetGraphMemAttribute(int d, int attr, void *value)
{ LOG_CALL; (void)d; (void)attr; *(unsigned long long *)value = 0; return 0; }
CUresult cuDeviceSetGraphMemAttribute(int d, int attr, void *value)
{ LOG_CALL; (void)d; (void)attr; (void)value; return 0; }
CUresult cuDeviceGraphMemTrim(int d) { LOG_CALL; (void)d; return 0; }

CUresult cuEventRecord(void *e, void *s)
{
    LOG_CALL;
    if (s && (s == capture_stream || is_joined(s)) && capture_event_count < JOIN_MAX)
        capture_events[capture_event_count++] = e;
    return 0;
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags)
{
    LOG_CALL;
    (void)flags;
    for (int i = 0; i < capture_event_count; i++)
        if (capture_events[i] == e && s != capture_stream && !is_joined(s) && joined_count < JOIN_MAX)
            joined[joined_count++] = s;
    return 0;
}
CUresult cuEventQuery(void *e) { LOG_CALL; (void)e; return __atomic_load_n(&not_ready, __ATOMIC_SEQ_CST) ? 600 : 0; }
CUresult cuEventSynchronize(void *e) { LOG_CALL; (void)e; return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { LOG_CALL; (void)a; (void)b; *ms = 1.0f; return 0; }
CUresult cuStreamCreate(void **s, unsigned flags) { LOG_CALL; (void)flags; *s = handle(); return 0; }

CUresult cuGraphAddChildGraphNode(void **n, void *g, const void *deps, size_t count, void *child)
{ LOG_CALL; (void)g; (void)deps; (void)count; (void)child; *n = handle(); return 0; }
CUresult cuGraphAddEventRecordNode(void **n, void *g, const void *deps, size_t count, void *e)
{ LOG_CALL; (void)g; (void)deps; (void)count; (void)e; *n = handle(); return 0; }
CUresult cuGraphAddEventWaitNode(void **n, void *g, const void *deps, size_t count, void *e)
{ LOG_CALL; (void)g; (void)deps; (void)count; (void)e; *n = handle(); return 0; }
CUresult cuGraphAddHostNode(void **n, void *g, const void *deps, size_t count, const void *p)
{ LOG_CALL; (void)g; (void)deps; (void)count; (void)p; *n = handle(); return 0; }
CUresult cuGraphAddMemcpyNode(void **n, void *g, const void *deps, size_t count, const void *p, void *c)
{ LOG_CALL; (void)g; (void)deps; (void)count; (void)p; (void)c; *n = handle(); return 0; }
CUresult cuGraphAddMemsetNode(void **n, void *g, const void *deps, size_t count, const void *p, void *c)
{ LOG_CALL; (void)g; (void)deps; (void)count; (void)p; (void)c; *n = handle(); return 0; }
/* Conditional nodes: cuda_graph_tests::CONDITIONAL_NODE_STUB, after this, logs them too. */
#define STUB_NODE_HOOK LOG_CALL
CUresult cuGraphDebugDotPrint(void *g, const char *path, unsigned flags)
{
    LOG_CALL;
    (void)g; (void)flags;
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fputs("digraph stub {}\n", f);
    fclose(f);
    return 0;
}
CUresult cuGraphExecKernelNodeSetParams_v2(void *e, void *node, const void *p)
{ LOG_CALL; (void)e; (void)node; (void)p; return 0; }
CUresult cuGraphInstantiateWithParams(void **e, void *g, void *params)
{ LOG_CALL; (void)params; return null_orig_cuGraphInstantiateWithFlags(e, g, 0); }
CUresult cuGraphLaunch(void *e, void *s) { LOG_CALL; (void)e; (void)s; return 0; }
CUresult cuGraphUpload(void *e, void *s) { LOG_CALL; (void)e; (void)s; return 0; }
CUresult cuGraphGetRootNodes(void *g, void **nodes, size_t *count) { LOG_CALL; (void)g; (void)nodes; *count = 0; return 0; }
CUresult cuGraphNodeGetDependencies_v2(void *node, void **deps, void *data, size_t *count)
{ LOG_CALL; (void)node; (void)deps; (void)data; *count = 0; return 0; }
CUresult cuGraphNodeGetDependentNodes_v2(void *node, void **deps, void *data, size_t *count)
{ LOG_CALL; (void)node; (void)deps; (void)data; *count = 0; return 0; }
/* Node parameters are not kept: CUDA_ERROR_INVALID_VALUE (the call is logged all the same). */
CUresult cuGraphKernelNodeGetParams_v2(void *node, void *p) { LOG_CALL; (void)node; (void)p; return 1; }
CUresult cuGraphMemsetNodeGetParams(void *node, void *p) { LOG_CALL; (void)node; (void)p; return 1; }
CUresult cuGraphMemcpyNodeGetParams(void *node, void *p) { LOG_CALL; (void)node; (void)p; return 1; }

CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes)
{ LOG_CALL; (void)bytes; *p = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED); return 0; }
CUresult cuMemFree_v2(unsigned long long p) { LOG_CALL; (void)p; return 0; }
CUresult cuMemAllocManaged(unsigned long long *p, size_t bytes, unsigned flags)
{ LOG_CALL; (void)flags; *p = (unsigned long long)(uintptr_t)calloc(1, bytes ? bytes : 1); return 0; }
CUresult cuMemAllocFromPoolAsync(unsigned long long *p, size_t bytes, void *pool, void *s)
{ LOG_CALL; (void)pool; return null_orig_cuMemAllocAsync(p, bytes, joined_map(s)); }
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags)
{ LOG_CALL; (void)flags; *pp = calloc(1, bytes ? bytes : 1); return *pp ? 0 : 2; }
CUresult cuMemFreeHost(void *p) { LOG_CALL; free(p); return 0; }
CUresult cuMemPoolCreate(void **pool, const void *props) { LOG_CALL; (void)props; *pool = handle(); return 0; }
CUresult cuMemPoolDestroy(void *pool) { LOG_CALL; (void)pool; return 0; }
CUresult cuMemPoolGetAccess(int *flags, void *pool, void *location)
{ LOG_CALL; (void)pool; (void)location; *flags = 3; return 0; }
CUresult cuMemPoolSetAccess(void *pool, const void *map, size_t count)
{ LOG_CALL; (void)pool; (void)map; (void)count; return 0; }
/* Captured copies and memsets become nodes of the simulated capture (1: memcpy, 2: memset). */
CUresult cuMemcpyAsync(unsigned long long d, unsigned long long src, size_t n, void *s)
{ LOG_CALL; (void)d; (void)src; return capture_node(joined_map(s), 1, 0, n); }
CUresult cuMemcpyHtoDAsync_v2(unsigned long long d, const void *src, size_t n, void *s)
{ LOG_CALL; (void)d; (void)src; return capture_node(joined_map(s), 1, 0, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, unsigned long long src, size_t n, void *s)
{ LOG_CALL; (void)d; (void)src; return capture_node(joined_map(s), 1, 0, n); }
CUresult cuMemcpyHtoD_v2(unsigned long long d, const void *src, size_t n)
{ LOG_CALL; (void)d; (void)src; (void)n; return 0; }
CUresult cuMemcpyDtoH_v2(void *d, unsigned long long src, size_t n)
{ LOG_CALL; (void)src; memset(d, 0, n); return 0; }
CUresult cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n)
{ LOG_CALL; (void)p; (void)v; (void)n; return 0; }
CUresult cuMemsetD8Async(unsigned long long p, unsigned char v, size_t n, void *s)
{ LOG_CALL; (void)v; return capture_node(joined_map(s), 2, p, n); }
CUresult cuMemsetD16Async(unsigned long long p, unsigned short v, size_t n, void *s)
{ LOG_CALL; (void)v; return capture_node(joined_map(s), 2, p, n * 2); }
CUresult cuMemsetD32Async(unsigned long long p, unsigned v, size_t n, void *s)
{ LOG_CALL; (void)v; return capture_node(joined_map(s), 2, p, n * 4); }
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

/// The variant of the stub, built once per machine: `null_cuda.c`, every function but those of
/// `NOT_LOGGED` renamed and wrapped with one that logs its call, and `EXTRAS`.
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
        extras += cuda_graph_tests::CONDITIONAL_NODE_STUB;
        for f in &functions {
            if HAND_WRAPPED.contains(&f.name.as_str()) {
                continue;
            }
            extras += &format!(
                "CUresult {0}({1}) {{ LOG_CALL; return null_orig_{0}({2}); }}\n",
                f.name,
                f.params,
                f.args.join(", ")
            );
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("context-stub");
        cuda_graph_tests::build_stub_variant(&dir, "null_context", &prefix, &extras)
    })
    .clone()
}

/// The stub's function `name`, of type `F` (a C function pointer type).
fn stub_fn<F: Copy>(name: &str) -> F {
    // SAFETY: this module names the stub's functions with their C types.
    unsafe { cuda_graph_tests::stub_variant_fn(&stub_path().expect("the stub was built"), name) }
}

/// One logged driver call: function, whether a context was current, thread name.
#[derive(Debug, Clone)]
pub struct Call {
    pub name: String,
    pub ctx: bool,
    pub thread: String,
}

/// The log so far (every wrapped call, in order), and clears it.
pub fn take_log() -> Vec<Call> {
    let len: extern "C" fn() -> c_int = stub_fn("stub_log_len");
    let name: extern "C" fn(c_int) -> *const c_char = stub_fn("stub_log_name");
    let ctx: extern "C" fn(c_int) -> c_int = stub_fn("stub_log_ctx");
    let thread: extern "C" fn(c_int) -> *const c_char = stub_fn("stub_log_thread");
    let clear: extern "C" fn() = stub_fn("stub_log_clear");
    // SAFETY: the stub's names are static strings and its thread names NUL-terminated arrays
    // of the log, which stay put until `clear` below.
    let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    let log = (0..len())
        .map(|i| Call {
            name: text(name(i)),
            ctx: ctx(i) != 0,
            thread: text(thread(i)),
        })
        .collect();
    clear();
    log
}

/// Makes `cuCtxSetCurrent` fail with `CUDA_ERROR_INVALID_CONTEXT` (`true`), or work again.
pub fn fail_bind(on: bool) {
    let f: extern "C" fn(c_int) = stub_fn("stub_fail_bind");
    f(c_int::from(on));
}

/// Makes `cuEventQuery` and `cuStreamQuery` report work in flight (`true`) or done.
pub fn not_ready(on: bool) {
    let f: extern "C" fn(c_int) = stub_fn("stub_not_ready");
    f(c_int::from(on));
}

/// The device of the stub, a module and its `fill_u32(p, n, v)` (on the main thread, where
/// loading the module made the context current).
pub fn stub() -> (Device, Module, Function) {
    cuda_graph_tests::stub_variant_device(&stub_path().expect("the stub was built"))
}

/// The launch shape of `fill_u32` over `N` values.
pub fn cfg() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}

/// Adds to `graph`, after `deps`, a `fill_u32` node that writes `value` to the `N` words of
/// `target`.
pub fn add_fill_node(
    graph: &mut Graph,
    deps: &[Node],
    fill: &Function,
    target: &impl DeviceAddress,
    value: u32,
) -> Node {
    // SAFETY: fill_u32(p, n, v) over `target`, which holds N u32; the stub runs nothing.
    unsafe {
        graph.add_kernel_node(
            deps,
            fill,
            cfg(),
            &KernelArgs::new().ptr(target).value(N).value(value),
        )
    }
    .unwrap()
}

/// Runs `f` on a new thread named `fresh` (no context current there); `Err` when it panicked.
pub fn try_on_fresh<T: Send>(f: impl FnOnce() -> T + Send) -> std::thread::Result<T> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("fresh".into())
            .spawn_scoped(s, f)
            .unwrap()
            .join()
    })
}

/// Runs `f` on a new thread named `fresh` (no context current there).
pub fn on_fresh<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    try_on_fresh(f).unwrap()
}

/// Runs the test `name`'s `body` in a child process of its own against the variant, and prints
/// `==== <name>` and what `shown` keeps of each line of the child's output; fails when the child
/// fails or runs past 60 s (a deadlock). In the child, runs `body`.
pub fn isolated(name: &str, body: impl FnOnce(), shown: fn(&str) -> Option<&str>) {
    if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
        body();
        return;
    }
    if let Err(why) = stub_path() {
        assert!(
            !cuda_graph_tests::stub_required(),
            "{name}: the context stub could not be built ({why})"
        );
        println!("SKIPPED {name}: the context stub could not be built ({why})");
        return;
    }
    let (status, text) =
        cuda_graph_tests::run_test_in_child(name, CHILD_VAR, &[], Duration::from_secs(60));
    println!("==== {name}");
    for line in text.lines().filter_map(shown) {
        println!("{line}");
    }
    match status {
        None => panic!("{name}: no result after 60 s (deadlock)\n{text}"),
        Some(s) if !s.success() => panic!("{name} failed:\n{text}"),
        Some(_) => {}
    }
}
