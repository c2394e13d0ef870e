//! Attacks on the rule that graph allocations are held by the records that name them and by
//! executable graphs (`Roles`), not by keep lists: whenever an allocation's last handle goes
//! while it is live, its free on the device's private stream must wait for every launch that
//! allocated or used it; an allocation never live after a launch is never freed by a handle;
//! and every node that names an allocation is in a record that holds it.
//!
//! The driver is `stub-driver/null_cuda.c` with a log of graph launches, event records, event
//! waits and frees outside captures (the order the GPU would see them in), conditional nodes,
//! and two faults for captures: a `cuStreamGetCaptureInfo` that fails, or reports no node,
//! right after a captured kernel launch. Each test runs in a process of its own, under a
//! watchdog that fails it after 60 s.

#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::OnceLock;

use cuda_graph::{
    AllocParams, AsStream, BorrowedStream, CaptureMode, ConditionalKind, Device, DeviceBuffer,
    Error, ExecGraph, Function, Graph, GraphAllocation, InstantiateFlags, KernelArgs, LaunchConfig,
    Module, Stream, capture, flush_deferred,
};

const BYTES: usize = 1 << 20;
const N: u64 = (BYTES / 4) as u64;

/// What the stub gets on top of `null_cuda.c`; the functions it wraps are renamed away.
const PREFIX: &str = r#"
#define cuStreamGetCaptureInfo_v3 null_orig_cuStreamGetCaptureInfo_v3
#define cuMemFreeAsync null_orig_cuMemFreeAsync
#define cuLaunchKernel null_orig_cuLaunchKernel
"#;

const EXTRAS: &str = r#"
#undef cuStreamGetCaptureInfo_v3
#undef cuMemFreeAsync
#undef cuLaunchKernel

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
int keep_log_len(void) { return __atomic_load_n(&entry_count, __ATOMIC_SEQ_CST); }
void keep_log_at(int i, unsigned long long *out)
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
CUresult cuEventQuery(void *e) { (void)e; return 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
CUresult cuGraphUpload(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = handle(); return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAlloc_v2(unsigned long long *p, size_t b)
{ (void)b; *p = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED); return 0; }
CUresult cuMemFree_v2(unsigned long long p) { (void)p; return 0; }
CUresult cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n) { (void)p; (void)v; (void)n; return 0; }
CUresult cuGraphAddChildGraphNode(void **n, void *g, void *deps, size_t count, void *child)
{ (void)g; (void)deps; (void)count; (void)child; *n = handle(); return 0; }
CUresult cuGraphAddMemsetNode(void **n, void *g, void *deps, size_t count, const void *p, void *c)
{ (void)g; (void)deps; (void)count; (void)p; (void)c; *n = handle(); return 0; }

/* CUgraphNodeParams: the type, 12 reserved bytes, then the union; for a conditional node
 * (type 13), CUDA_CONDITIONAL_NODE_PARAMS: handle (8), type (4), size (4), phGraph_out. */
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

/* Faults: after the next captured kernel launch, the next cuStreamGetCaptureInfo fails (1) or
 * reports no dependency (2). */
static int armed, pending;
void keep_fault_after_next_launch(int fault) { __atomic_store_n(&armed, fault, __ATOMIC_SEQ_CST); }
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

/// The extended stub, built once per machine (the parent test builds it before its child runs).
fn stub_path() -> Result<PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("attack-keep-stub");
        cuda_graph_tests::build_stub_variant(&dir, "null_keep", PREFIX, EXTRAS)
    })
    .clone()
}

/// The stub's function `name`, of type `F` (a C function pointer type).
fn stub_fn<F: Copy>(name: &str) -> F {
    // SAFETY: this file names the stub's functions with their C types.
    unsafe { cuda_graph_tests::stub_variant_fn(&stub_path().expect("the stub was built"), name) }
}

/// One entry of the stub's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Launch { exec: u64, stream: u64 },
    Record { event: u64, stream: u64 },
    Wait { stream: u64, event: u64 },
    Free { ptr: u64, stream: u64 },
}

fn log() -> Vec<Entry> {
    let len: extern "C" fn() -> c_int = stub_fn("keep_log_len");
    let at: extern "C" fn(c_int, *mut u64) = stub_fn("keep_log_at");
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

/// Faults the next `cuStreamGetCaptureInfo` after the next captured kernel launch: 1, it fails;
/// 2, it reports no dependency.
fn fault_after_next_launch(fault: c_int) {
    let f: extern "C" fn(c_int) = stub_fn("keep_fault_after_next_launch");
    f(fault);
}

/// The frees of `ptr` outside captures, by position in `log`.
fn frees_of(log: &[Entry], ptr: u64) -> Vec<usize> {
    (0..log.len())
        .filter(|&i| matches!(log[i], Entry::Free { ptr: p, .. } if p == ptr))
        .collect()
}

/// Whether the free at `free` (a position in `log`) waits for the latest launch of `exec` on
/// `stream` before it: its stream waits, between that launch and the free, for an event whose
/// latest record before the wait was on `stream` after the launch (stream order).
fn free_waits_for(log: &[Entry], free: usize, exec: u64, stream: u64) -> bool {
    let Entry::Free { stream: on, .. } = log[free] else {
        panic!("not a free")
    };
    let Some(launch) = (0..free).rev().find(
        |&i| matches!(log[i], Entry::Launch { exec: e, stream: s } if e == exec && s == stream),
    ) else {
        panic!("no launch of {exec:#x} on {stream:#x} before the free")
    };
    let mut after_launch: Vec<u64> = Vec::new();
    for entry in &log[launch + 1..free] {
        match *entry {
            Entry::Record { event, stream: s } => {
                after_launch.retain(|&e| e != event);
                if s == stream {
                    after_launch.push(event);
                }
            }
            Entry::Wait { stream: s, event } if s == on && after_launch.contains(&event) => {
                return true;
            }
            _ => {}
        }
    }
    false
}

/// Asserts that `ptr` is freed once outside captures, after every launch of `launches`
/// (executable graph, stream).
fn assert_freed_after(ptr: u64, launches: &[(u64, u64)], what: &str) {
    let log = log();
    let frees = frees_of(&log, ptr);
    assert_eq!(frees.len(), 1, "{what}: freed once, by its last handle");
    for &(exec, stream) in launches {
        assert!(
            free_waits_for(&log, frees[0], exec, stream),
            "{what}: the free does not wait for the launch of {exec:#x} on {stream:#x}\n{log:#?}"
        );
    }
}

fn assert_not_freed(ptr: u64, what: &str) {
    assert!(
        frees_of(&log(), ptr).is_empty(),
        "{what}: freed outside the graphs"
    );
}

/// The device of the stub, a module and its `fill_u32(p, n, v)`.
fn stub() -> (Device, Module, Function) {
    cuda_graph_tests::stub_variant_device(&stub_path().expect("the stub was built"))
}

fn config() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}

fn live() -> isize {
    cuda_graph::live_objects().graph_allocations
}

/// Runs `body` in a child process of this test binary (the test `name`, with
/// `ATTACK_KEEP_CHILD` naming it), failing when it fails or runs past 60 s (a deadlock).
fn isolated(name: &str, body: fn()) {
    cuda_graph_tests::isolated_on_stub_variant(name, "ATTACK_KEEP_CHILD", stub_path(), body);
}

/// A graph that allocates an allocation it does not free (G.3.3), instantiated and launched
/// on `stream`: the allocation is live.
fn launched_owner(device: &Device, stream: &Stream) -> (Graph, ExecGraph, GraphAllocation) {
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
fn filling(device: &Device, fill: &Function, target: &impl cuda_graph::DeviceAddress) -> Graph {
    let mut graph = Graph::new(device).unwrap();
    let args = KernelArgs::new().ptr(target).value(N).value(1u32);
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over N words of the
    // target; the stub runs nothing.
    unsafe { graph.add_kernel_node(&[], fill, config(), &args) }.unwrap();
    graph
}

fn raw(stream: &impl AsStream) -> u64 {
    stream.as_raw_stream() as u64
}

/// The graph's executable graph, launched on `stream`, and the launch as
/// `assert_freed_after` names it.
fn launch(graph: &Graph, stream: &Stream) -> (ExecGraph, (u64, u64)) {
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(stream).unwrap();
    let at = (exec.as_raw() as u64, raw(stream));
    (exec, at)
}

/// A kernel node of another graph uses the live allocation. Every other holder gone, the
/// user's executable graph holds it (`foreign_uses`); its drop lets go of it at once, and the
/// free then waits for both the allocating launch and the using one.
#[test]
fn dropped_live_allocation_is_freed_after_the_launches_that_used_it() {
    isolated(
        "dropped_live_allocation_is_freed_after_the_launches_that_used_it",
        || {
            let (device, _module, fill) = stub();
            let before = live();
            let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let (owner, owner_exec, a) = launched_owner(&device, &s1);
            let owner_launch = (owner_exec.as_raw() as u64, raw(&s1));
            let user = filling(&device, &fill, &a);
            let (user_exec, user_launch) = launch(&user, &s2);
            let ptr = a.ptr();
            drop((user, owner, a, owner_exec));
            flush_deferred();
            assert_eq!(live() - before, 1, "the user's executable graph holds it");
            assert_not_freed(ptr, "while the user's executable graph holds it");
            drop(user_exec);
            flush_deferred();
            assert_eq!(live(), before);
            assert_freed_after(ptr, &[owner_launch, user_launch], "foreign use");
        },
    );
}

/// As above, the use inside a copied child graph and inside a conditional node's body: the
/// parent's record names it, and the parent's executable graph holds it.
#[test]
fn uses_in_child_graphs_and_conditional_bodies_are_held_and_waited_for() {
    isolated(
        "uses_in_child_graphs_and_conditional_bodies_are_held_and_waited_for",
        || {
            let (device, _module, fill) = stub();
            let before = live();
            let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let (owner, owner_exec, a) = launched_owner(&device, &s1);
            let owner_launch = (owner_exec.as_raw() as u64, raw(&s1));
            let child = filling(&device, &fill, &a);
            let mut parent = Graph::new(&device).unwrap();
            parent.add_child_graph_node(&[], &child).unwrap();
            let condition = parent.add_condition(Some(1)).unwrap();
            parent
                .add_conditional_node(&[], &condition, ConditionalKind::If, |bodies| {
                    let args = KernelArgs::new().ptr(&a).value(N).value(2u32);
                    // SAFETY: as in `filling`.
                    unsafe { bodies[0].add_kernel_node(&[], &fill, config(), &args) }?;
                    Ok(())
                })
                .unwrap();
            let (parent_exec, parent_launch) = launch(&parent, &s2);
            let ptr = a.ptr();
            drop((child, parent, owner, a, owner_exec));
            flush_deferred();
            assert_eq!(live() - before, 1, "the parent's executable graph holds it");
            drop(parent_exec);
            flush_deferred();
            assert_eq!(live(), before);
            assert_freed_after(ptr, &[owner_launch, parent_launch], "child and body use");
        },
    );
}

/// A use captured through the guard, on an owned stream and on a borrowed one (whose calls ask
/// the driver for their nodes): the captured graph's executable graph holds the allocation.
#[test]
fn captured_uses_are_held_and_waited_for() {
    isolated("captured_uses_are_held_and_waited_for", || {
        let (device, _module, fill) = stub();
        let before = live();
        let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
        let (owner, owner_exec, a) = launched_owner(&device, &s1);
        let owner_launch = (owner_exec.as_raw() as u64, raw(&s1));
        let args = KernelArgs::new().ptr(&a).value(N).value(1u32);
        let (owned, ()) = capture(&s2, CaptureMode::Global, |cap| {
            // SAFETY: as in `filling`.
            unsafe { cap.launch(&fill, config(), &args) }
        })
        .unwrap();
        let per_thread = BorrowedStream::per_thread(&device);
        let (borrowed, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
            // SAFETY: as in `filling`.
            unsafe { cap.launch(&fill, config(), &args) }
        })
        .unwrap();
        let (owned_exec, owned_launch) = launch(&owned, &s2);
        let (borrowed_exec, borrowed_launch) = launch(&borrowed, &s1);
        let ptr = a.ptr();
        drop(args);
        drop((owned, borrowed, owner, a, owner_exec));
        flush_deferred();
        assert_eq!(
            live() - before,
            1,
            "the captured graphs' executable graphs hold it"
        );
        drop(owned_exec);
        flush_deferred();
        assert_not_freed(ptr, "while an executable graph holds it");
        drop(borrowed_exec);
        flush_deferred();
        assert_eq!(live(), before);
        assert_freed_after(
            ptr,
            &[owner_launch, owned_launch, borrowed_launch],
            "captured use",
        );
    });
}

/// `ExecGraph::update` to a graph that no longer uses the allocation lets go of it at once:
/// the free still waits for the launch queued before the update.
#[test]
fn update_away_from_an_allocation_frees_it_after_the_earlier_launch() {
    isolated(
        "update_away_from_an_allocation_frees_it_after_the_earlier_launch",
        || {
            let (device, _module, fill) = stub();
            let before = live();
            let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let (owner, owner_exec, a) = launched_owner(&device, &s1);
            let owner_launch = (owner_exec.as_raw() as u64, raw(&s1));
            let user = filling(&device, &fill, &a);
            let (mut user_exec, user_launch) = launch(&user, &s2);
            let ptr = a.ptr();
            drop((user, owner, a, owner_exec));
            let buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
            let other = filling(&device, &fill, &buffer);
            user_exec.update(&other).unwrap();
            flush_deferred();
            assert_eq!(live(), before, "the update let go of it");
            assert_freed_after(ptr, &[owner_launch, user_launch], "update");
            // The updated graph launches without it.
            user_exec.launch(&s2).unwrap();
            drop((user_exec, other));
        },
    );
}

/// With AutoFreeOnLaunch, each launch frees the allocation the launch before left live; the
/// executable graph holds it (`unfreed`), and its last handle's free waits for the last launch.
#[test]
fn auto_free_allocation_is_freed_after_the_last_launch() {
    isolated(
        "auto_free_allocation_is_freed_after_the_last_launch",
        || {
            let (device, _module, _fill) = stub();
            let before = live();
            let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let mut owner = Graph::new(&device).unwrap();
            let (_, a) = owner
                .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
                .unwrap();
            let exec = owner
                .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
                .unwrap();
            exec.launch(&s1).unwrap();
            exec.launch(&s2).unwrap();
            let last = (exec.as_raw() as u64, raw(&s2));
            let ptr = a.ptr();
            drop((owner, a));
            flush_deferred();
            assert_eq!(live() - before, 1, "the executable graph holds it");
            drop(exec);
            flush_deferred();
            assert_eq!(live(), before);
            assert_freed_after(ptr, &[last], "AutoFreeOnLaunch");
        },
    );
}

/// An allocation allocated and freed by its own graph, and one freed by another graph's
/// launch, are never live after a launch: no handle frees them, whatever is dropped first
/// (the graph that frees them does).
#[test]
fn allocations_freed_by_a_launch_are_never_freed_by_their_handles() {
    isolated(
        "allocations_freed_by_a_launch_are_never_freed_by_their_handles",
        || {
            let (device, _module, fill) = stub();
            let before = live();
            let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            // Allocated, used and freed in one graph.
            let mut own = Graph::new(&device).unwrap();
            let (alloc, b) = own
                .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
                .unwrap();
            let args = KernelArgs::new().ptr(&b).value(N).value(1u32);
            // SAFETY: as in `filling`.
            let k = unsafe { own.add_kernel_node(&[alloc], &fill, config(), &args) }.unwrap();
            own.add_mem_free_node(&[k], &b).unwrap();
            let (own_exec, _) = launch(&own, &s1);
            assert!(!b.is_live(), "freed by its own graph's launch");
            let own_ptr = b.ptr();
            drop(args);
            drop((own, b));
            flush_deferred();
            own_exec.launch(&s2).unwrap();
            drop(own_exec);
            flush_deferred();
            assert_not_freed(own_ptr, "allocated and freed in its own graph");
            // Allocated by one graph, freed by a captured free of another.
            let (owner, owner_exec, a) = launched_owner(&device, &s1);
            let (freeing, ()) =
                capture(&s2, CaptureMode::Global, |cap| cap.free_async(&a)).unwrap();
            let (freeing_exec, _) = launch(&freeing, &s2);
            assert!(!a.is_live(), "freed by the other graph's launch");
            let ptr = a.ptr();
            drop((freeing, owner, a, owner_exec, freeing_exec));
            flush_deferred();
            assert_not_freed(ptr, "freed by another graph's launch");
            assert_eq!(live(), before);
        },
    );
}

/// A captured free of a live allocation whose graph is never launched: the allocation stays
/// live, and its handle's free waits for the launch that allocated it.
#[test]
fn unlaunched_captured_free_leaves_the_allocation_to_its_handle() {
    isolated(
        "unlaunched_captured_free_leaves_the_allocation_to_its_handle",
        || {
            let (device, _module, _fill) = stub();
            let before = live();
            let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let (owner, owner_exec, a) = launched_owner(&device, &s1);
            let owner_launch = (owner_exec.as_raw() as u64, raw(&s1));
            let (freeing, ()) =
                capture(&s2, CaptureMode::Global, |cap| cap.free_async(&a)).unwrap();
            let freeing_exec = freeing.instantiate(InstantiateFlags::NONE).unwrap();
            let ptr = a.ptr();
            drop((freeing, owner, a, owner_exec));
            flush_deferred();
            assert_eq!(
                live() - before,
                1,
                "the freeing graph's executable graph holds it"
            );
            drop(freeing_exec);
            flush_deferred();
            assert_eq!(live(), before);
            assert_freed_after(ptr, &[owner_launch], "never freed by a launch");
        },
    );
}

// A conditional node's body cannot be taken out of its build closure (with `mem::replace`,
// it would take nodes the parent's record never sees, and outlive the raw graph that owns it):
// compile-fail/conditional_body_cannot_leave_its_closure.rs.

/// A panic in a conditional node's build closure, caught by the caller: the node stays in the
/// raw graph with what the closure added to its body, but the parent neither records the
/// body's uses nor keeps its memory (the bodies' lists are dropped with them during the
/// unwind). Launching the parent then writes a freed buffer. The node must be recorded and
/// the bodies' lists taken on every way out of `add_conditional_node` (a guard whose drop does
/// it), or the node removed from the raw graph.
#[test]
fn panic_in_a_conditional_build_closure_drops_what_the_body_refers_to() {
    isolated(
        "panic_in_a_conditional_build_closure_drops_what_the_body_refers_to",
        || {
            let (device, _module, fill) = stub();
            let buffers = || cuda_graph::live_objects().device_buffers;
            let before = buffers();
            let buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
            let mut parent = Graph::new(&device).unwrap();
            let condition = parent.add_condition(Some(1)).unwrap();
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                parent.add_conditional_node(&[], &condition, ConditionalKind::If, |bodies| {
                    let args = KernelArgs::new().ptr(&buffer).value(N).value(1u32);
                    // SAFETY: as in `filling`.
                    unsafe { bodies[0].add_kernel_node(&[], &fill, config(), &args) }?;
                    panic!("the closure panics after adding its node");
                })
            }));
            assert!(caught.is_err(), "the closure panicked");
            drop(buffer);
            flush_deferred();
            assert_eq!(
                buffers() - before,
                1,
                "the parent's conditional body still writes the buffer, which was freed"
            );
            drop(parent);
        },
    );
}

/// On a borrowed stream each captured call asks the driver for its node. A captured kernel of
/// the per-thread stream uses the allocation `a`, and the query after it is faulted (1: it
/// fails, and the caller goes on; 2: the stream reports no node, as when other code changed
/// its dependencies). Returns how the capture ended.
fn capture_with_lost_node(
    fill: &Function,
    a: &GraphAllocation,
    fault: c_int,
) -> cuda_graph::Result<(Graph, ())> {
    let per_thread = BorrowedStream::per_thread(a.device());
    let args = KernelArgs::new().ptr(a).value(N).value(1u32);
    capture(&per_thread, CaptureMode::Global, |cap| {
        fault_after_next_launch(fault);
        // SAFETY: as in `filling`.
        let launched = unsafe { cap.launch(fill, config(), &args) };
        assert_eq!(
            launched.is_err(),
            fault == 1,
            "the fault hit the launch's node query"
        );
        Ok(())
    })
}

/// The graph of such a capture would lack the kernel's use of `a` in its record: its launch
/// would be neither refused for an allocation that is not live nor ordered after the launch
/// that made it live, and nothing would hold `a` for it (keep lists do not hold graph
/// allocations), so a live `a` could be freed under the launch. The capture's end refuses it.
#[test]
fn captured_call_whose_node_is_lost_fails_the_capture() {
    isolated("captured_call_whose_node_is_lost_fails_the_capture", || {
        let (device, _module, fill) = stub();
        let stream = Stream::new(&device).unwrap();
        // Live: allocated by a launch, never freed.
        let (_owner, _owner_exec, a) = launched_owner(&device, &stream);
        for (fault, what) in [(1, "the node query failed"), (2, "no node was reported")] {
            let ended = capture_with_lost_node(&fill, &a, fault);
            assert!(
                matches!(
                    ended,
                    Err(Error::CaptureNodeUnknown {
                        call: "Capture::end"
                    })
                ),
                "{what}: the capture ended with {:?}",
                ended.map(|_| ())
            );
        }
        // Control: without a fault the capture ends, and its record names the allocation.
        let (graph, ()) = capture_with_lost_node(&fill, &a, 0).unwrap();
        assert!(graph.record().key_of(&a).is_some());
    });
}
