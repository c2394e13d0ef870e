//! Attacks on `ExecGraph::update`, `ExecGraph::set_kernel_node_params`, child graphs,
//! conditional bodies and the `into_raw`/`from_raw` hand-overs of streams and events, on the
//! host, without a GPU: what an executable graph keeps, tracks and refuses stays right.
//!
//! Two drivers: a variant of `stub-driver/null_cuda.c` built here (a log of launches, event
//! records, waits and frees; `cuGraphExecUpdate` that can be made to refuse; `cuEventQuery`
//! that can be made to answer "not ready"), and the checking stub `stub-driver/hunt_cuda.c`
//! (managed memory that GPU work writes when it runs). Each test runs in a process of its own.

#![allow(clippy::undocumented_unsafe_blocks)]

#[cfg(cuda_graph_tests_hunt_stub)]
mod hunt_common;

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

#[cfg(cuda_graph_child_move)]
use cuda_graph::AllocParams;
use cuda_graph::{
    AsStream, BorrowedStream, ConditionalKind, Device, DeviceBuffer, Error, Event, ExecGraph,
    Function, Graph, GraphAllocation, InstantiateFlags, KernelArgs, LaunchConfig, Module, Stream,
    UpdateRefusal, flush_deferred,
};

const BYTES: usize = 1 << 20;
const N: u64 = (BYTES / 4) as u64;

const PREFIX: &str = r#"
#define cuGraphExecUpdate_v2 null_orig_cuGraphExecUpdate_v2
#define cuMemFreeAsync null_orig_cuMemFreeAsync
"#;

const EXTRAS: &str = r#"
#undef cuGraphExecUpdate_v2
#undef cuMemFreeAsync

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
int upd_log_len(void) { return __atomic_load_n(&entry_count, __ATOMIC_SEQ_CST); }
void upd_log_at(int i, unsigned long long *out)
{
    out[0] = (unsigned long long)entries[i].kind;
    out[1] = entries[i].a;
    out[2] = entries[i].b;
}

/* Set: cuGraphExecUpdate refuses (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, topology changed). */
static int refuse_update;
void upd_refuse_update(int r) { __atomic_store_n(&refuse_update, r, __ATOMIC_SEQ_CST); }
static int updates;
int upd_updates(void) { return __atomic_load_n(&updates, __ATOMIC_SEQ_CST); }
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

/* Set: events are not complete (the launches they follow still run). */
static int not_ready;
void upd_not_ready(int r) { __atomic_store_n(&not_ready, r, __ATOMIC_SEQ_CST); }
CUresult cuEventQuery(void *e) { (void)e; return __atomic_load_n(&not_ready, __ATOMIC_SEQ_CST) ? 600 : 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }

CUresult cuGraphLaunch(void *e, void *s) { note(1, e, s); return 0; }
CUresult cuEventRecord(void *e, void *s) { note(2, e, s); return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { (void)f; note(3, s, e); return 0; }
CUresult cuMemFreeAsync(unsigned long long p, void *s)
{
    if (!(s && s == capture_stream))
        note(4, (void *)(uintptr_t)p, s);
    return null_orig_cuMemFreeAsync(p, s);
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
int upd_set_params(void) { return __atomic_load_n(&set_params, __ATOMIC_SEQ_CST); }
CUresult cuGraphExecKernelNodeSetParams_v2(void *e, void *n, const void *p)
{ (void)e; (void)n; (void)p; __atomic_add_fetch(&set_params, 1, __ATOMIC_SEQ_CST); return 0; }
CUresult cuGraphAddNode_v2(void **n, void *g, void *deps, const void *data, size_t count, void *p)
{
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
CUresult cuGraphConditionalHandleCreate(unsigned long long *h, void *g, void *ctx, unsigned v,
                                        unsigned flags)
{ (void)g; (void)ctx; (void)v; (void)flags; *h = (unsigned long long)(uintptr_t)handle(); return 0; }
"#;

fn stub_path() -> Result<PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("attack-update-stub");
        cuda_graph_tests::build_stub_variant(&dir, "null_update", PREFIX, EXTRAS)
    })
    .clone()
}

fn stub_fn<F: Copy>(name: &str) -> F {
    // SAFETY: this file names the stub's functions with their C types.
    unsafe { cuda_graph_tests::stub_variant_fn(&stub_path().expect("the stub was built"), name) }
}

fn set(name: &str, v: c_int) {
    let f: extern "C" fn(c_int) = stub_fn(name);
    f(v);
}

fn get(name: &str) -> c_int {
    let f: extern "C" fn() -> c_int = stub_fn(name);
    f()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Launch { exec: u64, stream: u64 },
    Record { event: u64, stream: u64 },
    Wait { stream: u64, event: u64 },
    Free { ptr: u64, stream: u64 },
}

fn log() -> Vec<Entry> {
    let len: extern "C" fn() -> c_int = stub_fn("upd_log_len");
    let at: extern "C" fn(c_int, *mut u64) = stub_fn("upd_log_at");
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

fn stub() -> (Device, Module, Function) {
    cuda_graph_tests::stub_variant_device(&stub_path().expect("the stub was built"))
}

fn config() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}

fn isolated(name: &str, body: fn()) {
    cuda_graph_tests::isolated_on_stub_variant(name, "ATTACK_UPDATE_CHILD", stub_path(), body);
}

fn live_allocations() -> isize {
    cuda_graph::live_objects().graph_allocations
}

/// A value whose strong count says whether a host closure that holds it still exists.
fn sentinel_closure(sentinel: &Arc<()>) -> impl Fn() + Send + Sync + 'static {
    let s = sentinel.clone();
    move || {
        std::hint::black_box(&s);
    }
}

fn host_graph(device: &Device, sentinel: &Arc<()>) -> Graph {
    let mut g = Graph::new(device).unwrap();
    g.add_host_node(&[], sentinel_closure(sentinel)).unwrap();
    g
}

/// A graph whose one kernel node fills `target`.
fn filling(device: &Device, fill: &Function, target: &impl cuda_graph::DeviceAddress) -> Graph {
    let mut graph = Graph::new(device).unwrap();
    let args = KernelArgs::new().ptr(target).value(N).value(1u32);
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over N words of the
    // target; the stub runs nothing.
    unsafe { graph.add_kernel_node(&[], fill, config(), &args) }.unwrap();
    graph
}

/// A graph that allocates an allocation it does not free, launched: the allocation is live.
fn launched_owner(device: &Device, stream: &Stream) -> (Graph, ExecGraph, GraphAllocation) {
    let mut owner = Graph::new(device).unwrap();
    let (_, a) = owner
        .add_mem_alloc_node(&[], &cuda_graph::AllocParams::new(device, BYTES))
        .unwrap();
    let exec = owner.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(stream).unwrap();
    assert!(a.is_live());
    (owner, exec, a)
}

/// `set_kernel_node_params` accepts a graph allocation that the node uses when a child graph
/// moved into the graph (`add_child_graph_node_moved`) allocates it: the allocation is the
/// graph's own, though the child made it.
#[cfg(cuda_graph_child_move)]
#[test]
fn set_kernel_node_params_accepts_an_allocation_of_a_moved_child() {
    isolated(
        "set_kernel_node_params_accepts_an_allocation_of_a_moved_child",
        || {
            let (device, _module, fill) = stub();
            let mut child = Graph::new(&device).unwrap();
            let (_, a) = child
                .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
                .unwrap();
            let mut parent = Graph::new(&device).unwrap();
            let moved = parent.add_child_graph_node_moved(&[], child).unwrap();
            let args = KernelArgs::new().ptr(&a).value(N).value(1u32);
            // SAFETY: fill_u32 over N words of the allocation; the stub runs nothing.
            let k = unsafe { parent.add_kernel_node(&[moved], &fill, config(), &args) }.unwrap();
            let mut exec = parent.instantiate(InstantiateFlags::NONE).unwrap();
            assert_eq!(
                exec.unfreed_allocations().len(),
                1,
                "the parent allocates it"
            );
            let args = KernelArgs::new().ptr(&a).value(N).value(2u32);
            // SAFETY: as above.
            let set = unsafe { exec.set_kernel_node_params(&parent, k, &fill, config(), &args) };
            assert!(
                set.is_ok(),
                "a new value for a node that uses its graph's own allocation was refused: {}",
                set.unwrap_err()
            );
        },
    );
}

/// An update the driver refuses changes nothing: the executable graph keeps the allocation it
/// used and still launches (the new graph's allocation, never live, would be refused), and
/// the new graph's operands are not taken.
#[test]
fn refused_update_leaves_the_executable_graph_as_it_was() {
    isolated(
        "refused_update_leaves_the_executable_graph_as_it_was",
        || {
            let (device, _module, fill) = stub();
            let before = live_allocations();
            let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let (owner, owner_exec, a) = launched_owner(&device, &s1);
            let user = filling(&device, &fill, &a);
            let mut exec = user.instantiate(InstantiateFlags::NONE).unwrap();
            exec.launch(&s2).unwrap();
            // The new graph uses another graph's allocation, never launched (not live), and a
            // host closure.
            let mut other_owner = Graph::new(&device).unwrap();
            let (_, b) = other_owner
                .add_mem_alloc_node(&[], &cuda_graph::AllocParams::new(&device, BYTES))
                .unwrap();
            let sentinel = Arc::new(());
            let mut new = filling(&device, &fill, &b);
            new.add_host_node(&[], sentinel_closure(&sentinel)).unwrap();
            set("upd_refuse_update", 1);
            let e = exec.update(&new).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::UpdateRefused {
                        reason: UpdateRefusal::TopologyChanged,
                        ..
                    }
                ),
                "{e:?}"
            );
            drop(new);
            flush_deferred();
            assert_eq!(
                Arc::strong_count(&sentinel),
                1,
                "the refused graph's closure is not kept"
            );
            exec.launch(&s2)
                .expect("still the old graph: its allocation is live");
            drop((user, owner, a, other_owner, b));
            flush_deferred();
            assert_eq!(
                live_allocations() - before,
                1,
                "the executable graph still holds its allocation"
            );
            drop((exec, owner_exec));
            flush_deferred();
            assert_eq!(live_allocations(), before);
        },
    );
}

/// Refused updates, either side with memory nodes: a moved child with memory nodes counts.
#[cfg(cuda_graph_child_move)]
#[test]
fn update_to_a_graph_with_a_moved_memory_child_is_refused() {
    isolated(
        "update_to_a_graph_with_a_moved_memory_child_is_refused",
        || {
            let (device, _module, _fill) = stub();
            let mut g = Graph::new(&device).unwrap();
            g.add_empty_node(&[]).unwrap();
            let mut exec = g.instantiate(InstantiateFlags::NONE).unwrap();
            let mut child = Graph::new(&device).unwrap();
            let (n, a) = child
                .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
                .unwrap();
            child.add_mem_free_node(&[n], &a).unwrap();
            let mut parent = Graph::new(&device).unwrap();
            parent.add_child_graph_node_moved(&[], child).unwrap();
            let updates = get("upd_updates");
            let e = exec.update(&parent).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::UpdateRefused {
                        reason: UpdateRefusal::MemoryNodes,
                        ..
                    }
                ),
                "{e:?}"
            );
            assert_eq!(get("upd_updates"), updates, "the driver was not asked");
        },
    );
}

/// What the previous graph's nodes refer to is kept until the launch queued before the update
/// is done (its event not complete: kept; complete: let go), on a borrowed stream too.
#[test]
fn update_keeps_the_previous_closure_until_the_earlier_launch_is_done() {
    isolated(
        "update_keeps_the_previous_closure_until_the_earlier_launch_is_done",
        || {
            let (device, _module, _fill) = stub();
            let (old, new) = (Arc::new(()), Arc::new(()));
            for owned in [true, false] {
                let g1 = host_graph(&device, &old);
                let mut exec = g1.instantiate(InstantiateFlags::NONE).unwrap();
                drop(g1);
                let stream = Stream::new(&device).unwrap();
                let per_thread = BorrowedStream::per_thread(&device);
                set("upd_not_ready", 1);
                if owned {
                    exec.launch(&stream).unwrap();
                } else {
                    exec.launch(&per_thread).unwrap();
                }
                let g2 = host_graph(&device, &new);
                exec.update(&g2).unwrap();
                drop(g2);
                flush_deferred();
                if !owned {
                    // The null stub's cuStreamQuery says idle, so the owned stream's tail is
                    // marked Done at once; only the borrowed stream's event can be not ready.
                    assert_eq!(Arc::strong_count(&old), 2, "kept while the launch runs");
                }
                assert_eq!(Arc::strong_count(&new), 2, "the new closure is kept");
                set("upd_not_ready", 0);
                flush_deferred();
                std::thread::sleep(std::time::Duration::from_millis(50));
                flush_deferred();
                assert_eq!(Arc::strong_count(&old), 1, "let go once the launch is done");
                drop(exec);
                flush_deferred();
                std::thread::sleep(std::time::Duration::from_millis(50));
                flush_deferred();
                assert_eq!(Arc::strong_count(&new), 1);
            }
        },
    );
}

/// A conditional node's body reads as a `&Graph` inside its build closure: an executable
/// graph can be updated from it, and another one instantiated from it, both escaping the
/// closure. Each keeps what the body's nodes refer to after the parent is gone.
#[test]
fn executable_graphs_made_from_a_conditional_body_keep_what_it_refers_to() {
    isolated(
        "executable_graphs_made_from_a_conditional_body_keep_what_it_refers_to",
        || {
            let (device, _module, _fill) = stub();
            let (old, body_sentinel) = (Arc::new(()), Arc::new(()));
            let g1 = host_graph(&device, &old);
            let mut exec = g1.instantiate(InstantiateFlags::NONE).unwrap();
            let mut escaped = None;
            let mut parent = Graph::new(&device).unwrap();
            let condition = parent.add_condition(Some(1)).unwrap();
            parent
                .add_conditional_node(&[], &condition, ConditionalKind::If, |bodies| {
                    bodies[0].add_host_node(&[], sentinel_closure(&body_sentinel))?;
                    exec.update(&bodies[0])?;
                    escaped = Some(bodies[0].instantiate(InstantiateFlags::NONE)?);
                    Ok(())
                })
                .unwrap();
            let escaped = escaped.unwrap();
            let stream = Stream::new(&device).unwrap();
            escaped.launch(&stream).unwrap();
            exec.launch(&stream).unwrap();
            drop((parent, g1));
            flush_deferred();
            assert_eq!(
                Arc::strong_count(&old),
                1,
                "the update let go of the old closure"
            );
            assert_eq!(
                Arc::strong_count(&body_sentinel),
                2,
                "the executable graphs hold the body's closure"
            );
            drop(exec);
            flush_deferred();
            assert_eq!(Arc::strong_count(&body_sentinel), 2);
            drop(escaped);
            flush_deferred();
            assert_eq!(Arc::strong_count(&body_sentinel), 1);
        },
    );
}

/// An event that an event node (of a graph, of its executable graph after the graph is gone)
/// holds cannot be given up; once both are gone it can.
#[test]
fn event_into_raw_is_refused_while_a_graph_or_executable_graph_holds_it() {
    isolated(
        "event_into_raw_is_refused_while_a_graph_or_executable_graph_holds_it",
        || {
            let (device, _module, _fill) = stub();
            let event = Event::new(&device).unwrap();
            let mut g = Graph::new(&device).unwrap();
            g.add_event_record_node(&[], &event).unwrap();
            let exec = g.instantiate(InstantiateFlags::NONE).unwrap();
            let event = event.into_raw().expect_err("a graph holds it");
            drop(g);
            flush_deferred();
            let event = event.into_raw().expect_err("the executable graph holds it");
            drop(exec);
            flush_deferred();
            let raw = event.into_raw().expect("no other holder");
            // SAFETY: given up above; destroyed once.
            let back = unsafe { Event::from_raw(raw, &device) };
            drop(back);
        },
    );
}

/// `Stream::into_raw` while an executable graph's latest launch on it is unmarked: the launch
/// is marked (an event recorded on the stream after it) before the handle is handed over, and
/// the executable graph's release later uses that mark, not the handle.
#[test]
fn stream_into_raw_marks_the_unmarked_launch_before_handing_over() {
    isolated(
        "stream_into_raw_marks_the_unmarked_launch_before_handing_over",
        || {
            let (device, _module, _fill) = stub();
            let sentinel = Arc::new(());
            let g = host_graph(&device, &sentinel);
            let exec = g.instantiate(InstantiateFlags::NONE).unwrap();
            drop(g);
            let stream = Stream::new(&device).unwrap();
            let raw = stream.as_raw() as u64;
            exec.launch(&stream).unwrap();
            let n = log().len();
            let given = stream.into_raw();
            let after: Vec<Entry> = log()[n..].to_vec();
            println!("{after:?}");
            // The null stub says every stream is idle: a Done mark needs no record. Either a
            // record on the stream or nothing (Done); never a later record on the handle.
            assert!(
                after
                    .iter()
                    .all(|e| matches!(e, Entry::Record { stream, .. } if *stream == raw))
            );
            // SAFETY: handed over above; destroyed once.
            let _ = unsafe { cuda_graph::sys::cuStreamDestroy_v2(given) };
            let n = log().len();
            drop(exec);
            flush_deferred();
            assert!(
                !log()[n..]
                    .iter()
                    .any(|e| matches!(e, Entry::Record { stream, .. } if *stream == raw)),
                "the release recorded on the destroyed stream"
            );
            assert_eq!(Arc::strong_count(&sentinel), 1);
        },
    );
}

// ------------------------------------------------------------------------------------------
// Against the checking stub (hunt_cuda.c): managed memory set as a kernel argument.
// ------------------------------------------------------------------------------------------

/// A `ManagedBuffer` that `set_kernel_node_params` passes to a node with `KernelArgs::ptr` is
/// tracked as the graph's own host memory from then on: a view taken right after a launch waits
/// for the kernel's write, and a launch while a view lives is refused. (Untracked, the view read
/// the buffer before the kernel wrote it, and the launch was queued under the view.)
#[cfg(cuda_graph_tests_hunt_stub)]
#[test]
fn managed_buffer_set_as_a_kernel_argument_follows_the_host_view_rules() {
    hunt_common::isolated(
        "managed_buffer_set_as_a_kernel_argument_follows_the_host_view_rules",
        hunt_common::SLOW,
        || {
            const WORDS: usize = 1 << 10;
            const GPU_WORD: u32 = 0xD2D2_D2D2;
            let d = Device::get(0).unwrap();
            let s = Stream::new(&d).unwrap();
            let fill = Module::from_ptx(&d, cuda_graph::kernels::PTX)
                .unwrap()
                .function("fill_u32")
                .unwrap();
            let cfg = LaunchConfig::for_elements(WORDS as u64, 256);
            let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
            let mut graph = Graph::new(&d).unwrap();
            let args = KernelArgs::new().ptr(&dev).value(WORDS as u64).value(1u32);
            // SAFETY: fill_u32(u32* p, u64 n, u32 v) over the buffer's WORDS values.
            let k = unsafe { graph.add_kernel_node(&[], &fill, cfg, &args) }.unwrap();
            let mut exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
            let mut managed = cuda_graph::ManagedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
            let args = KernelArgs::new()
                .ptr(&managed)
                .value(WORDS as u64)
                .value(1u32);
            // SAFETY: as above, over the managed buffer.
            unsafe { exec.set_kernel_node_params(&graph, k, &fill, cfg, &args) }.unwrap();
            drop(args);
            exec.launch(&s).unwrap();
            let seen = managed.as_slice().unwrap()[0];
            s.synchronize().unwrap();
            let after = managed.as_slice().unwrap()[0];
            println!("view right after the launch: {seen:#x}; after synchronize: {after:#x}");
            let refused = {
                let _view = managed.as_mut_slice().unwrap();
                exec.launch(&s)
            };
            s.synchronize().unwrap();
            drop((exec, graph, managed));
            flush_deferred();
            assert!(
                seen == GPU_WORD && refused.is_err(),
                "the view right after the launch read {seen:#x} (the GPU writes {GPU_WORD:#x}); a launch under a view: {refused:?}"
            );
        },
    );
}
