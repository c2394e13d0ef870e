//! Attacks on the safety model that show on the host, without a GPU: moved and copied child
//! graphs, `Graph::into_raw`, `Function::launch` inside a capture, panicking drops in the release
//! queue and on the release thread, lost drop errors of events and pools. Each test states what
//! the crate must do; each failed on the library as it was before the fix it names (the
//! "Finding" of its doc). Two more findings are refused at compile time now:
//! `instantiate_unchecked` is `unsafe`, and a `Capture` guard of its own needs an owned
//! `Stream` (`tests/compile-fail/`).
//!
//! The driver is `stub-driver/null_cuda.c` with a few functions added (host, child-graph,
//! memset nodes, graph launch, pools, ...) and three switches for the tests: graph and
//! executable-graph destroys that release their user objects on a thread after a delay, as the
//! real driver's internal thread does; destroys that fail; a count of module unloads. It is
//! compiled by the first test that needs it (`cc`, into `CARGO_TARGET_TMPDIR`). Each test runs
//! in a process of its own (the stub captures one stream at a time, and some tests leave the
//! process-wide release queue stuck on purpose), under a watchdog that fails it after 60 s.

#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cuda_graph::{
    AllocParams, Capture, CaptureMode, Device, Event, Function, Graph, InstantiateFlags,
    KernelArgs, LaunchConfig, MemPool, Module, Stream, capture, flush_deferred,
};

const BYTES: usize = 1 << 20;
const N: u64 = (BYTES / 4) as u64;

/// What the stub gets on top of `null_cuda.c`; the functions it replaces are renamed away.
const PREFIX: &str = r#"
#define cuGraphDestroy null_orig_cuGraphDestroy
#define cuGraphExecDestroy null_orig_cuGraphExecDestroy
#define cuModuleUnload null_orig_cuModuleUnload
#define cuEventDestroy_v2 null_orig_cuEventDestroy_v2
"#;

const EXTRAS: &str = r#"
#undef cuGraphDestroy
#undef cuGraphExecDestroy
#undef cuModuleUnload
#undef cuEventDestroy_v2
#include <pthread.h>
#include <unistd.h>

/* > 0: graph and exec destroys release their user-object references on a thread, this many
 * milliseconds later (the real driver runs destructors on an internal thread). */
static int async_ms;
void attack_set_async_destroy_ms(int ms) { __atomic_store_n(&async_ms, ms, __ATOMIC_SEQ_CST); }
struct later { void *h; int exec; int ms; };
static void *release_later(void *p)
{
    struct later *l = p;
    usleep((useconds_t)l->ms * 1000);
    if (l->exec) null_orig_cuGraphExecDestroy(l->h); else null_orig_cuGraphDestroy(l->h);
    free(l);
    return NULL;
}
static CUresult destroy_graph_or_exec(void *h, int exec)
{
    int ms = __atomic_load_n(&async_ms, __ATOMIC_SEQ_CST);
    if (ms <= 0)
        return exec ? null_orig_cuGraphExecDestroy(h) : null_orig_cuGraphDestroy(h);
    struct later *l = malloc(sizeof *l);
    l->h = h; l->exec = exec; l->ms = ms;
    pthread_t t;
    pthread_create(&t, NULL, release_later, l);
    pthread_detach(t);
    return 0;
}
CUresult cuGraphDestroy(void *g) { return destroy_graph_or_exec(g, 0); }
CUresult cuGraphExecDestroy(void *e) { return destroy_graph_or_exec(e, 1); }

static int unloads;
int attack_unloads(void) { return __atomic_load_n(&unloads, __ATOMIC_SEQ_CST); }
CUresult cuModuleUnload(void *m) { (void)m; __atomic_add_fetch(&unloads, 1, __ATOMIC_SEQ_CST); return 0; }

/* Set: event and pool destroys fail with CUDA_ERROR_UNKNOWN. */
static int fail_destroys;
void attack_fail_destroys(int f) { __atomic_store_n(&fail_destroys, f, __ATOMIC_SEQ_CST); }
CUresult cuEventDestroy_v2(void *e) { (void)e; return __atomic_load_n(&fail_destroys, __ATOMIC_SEQ_CST) ? 999 : 0; }
CUresult cuMemPoolCreate(void **p, const void *props) { (void)props; *p = handle(); return 0; }
CUresult cuMemPoolDestroy(void *p) { (void)p; return __atomic_load_n(&fail_destroys, __ATOMIC_SEQ_CST) ? 999 : 0; }

CUresult cuGraphAddHostNode(void **n, void *g, void *deps, size_t count, const void *p)
{ (void)g; (void)deps; (void)count; (void)p; *n = handle(); return 0; }
CUresult cuGraphAddChildGraphNode(void **n, void *g, void *deps, size_t count, void *child)
{ (void)g; (void)deps; (void)count; (void)child; *n = handle(); return 0; }
CUresult cuGraphAddNode_v2(void **n, void *g, void *deps, const void *data, size_t count, void *p)
{ (void)g; (void)deps; (void)data; (void)count; (void)p; *n = handle(); return 0; }
CUresult cuGraphAddMemsetNode(void **n, void *g, void *deps, size_t count, const void *p, void *c)
{ (void)g; (void)deps; (void)count; (void)p; (void)c; *n = handle(); return 0; }
CUresult cuGraphLaunch(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuGraphUpload(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { (void)s; (void)e; (void)f; return 0; }
CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = handle(); return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAlloc_v2(unsigned long long *p, size_t b)
{ (void)b; *p = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED); return 0; }
CUresult cuMemFree_v2(unsigned long long p) { (void)p; return 0; }
CUresult cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n) { (void)p; (void)v; (void)n; return 0; }
"#;

/// The extended stub, built once per machine (the parent test builds it before its child runs).
fn stub_path() -> Result<PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("attack-stub");
        cuda_graph_tests::build_stub_variant(&dir, "null_attack", PREFIX, EXTRAS)
    })
    .clone()
}

/// Calls `name(arg)` (or `name()` when `arg` is `None`) in the loaded stub.
fn stub_call(name: &str, arg: Option<c_int>) -> c_int {
    let path = stub_path().expect("the stub was built");
    // SAFETY: this file's hooks take an int and return nothing, or take nothing and return an
    // int, as called here.
    unsafe {
        match arg {
            Some(a) => {
                let f: extern "C" fn(c_int) = cuda_graph_tests::stub_variant_fn(&path, name);
                f(a);
                0
            }
            None => {
                let f: extern "C" fn() -> c_int = cuda_graph_tests::stub_variant_fn(&path, name);
                f()
            }
        }
    }
}

fn unloads() -> c_int {
    stub_call("attack_unloads", None)
}

/// The device of the stub, a module and its `fill_u32(p, n, v)`.
fn stub() -> (Device, Module, Function) {
    cuda_graph_tests::stub_variant_device(&stub_path().expect("the stub was built"))
}

fn config() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}

/// The unload counter works: a module dropped outside any capture is unloaded at once.
fn control_unloads(device: &Device) {
    let before = unloads();
    drop(Module::from_ptx(device, cuda_graph::kernels::PTX).unwrap());
    assert_eq!(
        unloads(),
        before + 1,
        "control: a dropped module is unloaded"
    );
}

/// A value whose strong count says whether a host closure that holds it still exists.
fn sentinel_closure(sentinel: &Arc<()>) -> impl Fn() + Send + Sync + 'static {
    let s = sentinel.clone();
    move || {
        std::hint::black_box(&s);
    }
}

/// Runs `body` in a child process of this test binary (the test `name`, with `ATTACK_CHILD`
/// naming it), failing when it fails or runs past 60 s (a deadlock).
fn isolated(name: &str, body: fn()) {
    cuda_graph_tests::isolated_on_stub_variant(name, "ATTACK_CHILD", stub_path(), body);
}

/// Finding 1. A moved child graph is never checked, and in the parent's record it is one node
/// that allocates, uses and frees: a node is exempt from ordering against itself, so the
/// parent passes the lifetime checks whatever order the child's nodes have.
// Child-graph ownership transfer needs the CUDA 12.9 headers or newer.
#[cfg(cuda_graph_child_move)]
#[test]
fn moved_child_graph_bypasses_the_lifetime_checks() {
    isolated("moved_child_graph_bypasses_the_lifetime_checks", || {
        let (device, _module, _fill) = stub();
        let mut child = Graph::new(&device).unwrap();
        let (alloc, buf) = child
            .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap();
        // A memset of the allocation that is not ordered after its alloc node (nor before its
        // free node): safe code, and it writes memory the graph has not (or no longer) mapped.
        child.add_memset_node(&[], &buf, 0xdead, 1).unwrap();
        child.add_mem_free_node(&[alloc], &buf).unwrap();
        let refused = child.instantiate(InstantiateFlags::NONE);
        assert!(refused.is_err(), "the child alone is refused");
        println!("child alone: {}", refused.unwrap_err());
        let mut parent = Graph::new(&device).unwrap();
        // Refused when the child moves in, or at the parent's instantiation: never run.
        if let Err(e) = parent.add_child_graph_node_moved(&[], child) {
            println!("moving the child in: {e}");
            return;
        }
        let exec = parent.instantiate(InstantiateFlags::NONE);
        assert!(
            exec.is_err(),
            "FINDING 1: the parent of the moved child was instantiated: its memset runs unordered with the allocation's alloc and free"
        );
    });
}

/// Finding 2. `add_child_graph_node_moved` empties the child's keep list (`take_from`), which
/// is shared: with a parent that holds a copy of the child, and with the user object of the
/// child's executable graphs. Dropping the second parent then frees what the copy and the
/// executable graph still run (here a host closure: the driver keeps its address).
// Child-graph ownership transfer needs the CUDA 12.9 headers or newer.
#[cfg(cuda_graph_child_move)]
#[test]
fn moving_a_child_empties_the_list_its_copies_and_executable_graphs_share() {
    isolated(
        "moving_a_child_empties_the_list_its_copies_and_executable_graphs_share",
        || {
            let (device, _module, _fill) = stub();
            let sentinel = Arc::new(());
            let mut child = Graph::new(&device).unwrap();
            child
                .add_host_node(&[], sentinel_closure(&sentinel))
                .unwrap();
            // A copy of the child in p1 (its host node keeps the closure's address), and an
            // executable graph of the child.
            let mut p1 = Graph::new(&device).unwrap();
            p1.add_child_graph_node(&[], &child).unwrap();
            let child_exec = child.instantiate(InstantiateFlags::NONE).unwrap();
            let mut p2 = Graph::new(&device).unwrap();
            p2.add_child_graph_node_moved(&[], child).unwrap();
            drop(p2);
            flush_deferred();
            assert_eq!(
                Arc::strong_count(&sentinel),
                2,
                "FINDING 2: the host closure was freed while p1's copy and the child's executable graph still call it"
            );
            drop((p1, child_exec));
        },
    );
}

/// Finding 3. `Graph::into_raw` drops the keep list of a graph never instantiated: the raw
/// graph's host node points at a freed closure (and kernel nodes at unloaded modules, memset
/// nodes at freed buffers) although `from_raw`'s contract is then met.
#[test]
fn into_raw_frees_what_the_raw_graph_refers_to() {
    isolated("into_raw_frees_what_the_raw_graph_refers_to", || {
        let (device, _module, _fill) = stub();
        let sentinel = Arc::new(());
        let mut graph = Graph::new(&device).unwrap();
        graph
            .add_host_node(&[], sentinel_closure(&sentinel))
            .unwrap();
        let raw = graph.into_raw();
        flush_deferred();
        let alive = Arc::strong_count(&sentinel);
        // SAFETY: `raw` is the live graph just given up, of this device; nothing else owns it.
        let back = unsafe { Graph::from_raw(raw, &device) }.unwrap();
        let exec = back.instantiate(InstantiateFlags::NONE).unwrap();
        drop((exec, back));
        assert_eq!(
            alive, 2,
            "FINDING 3: the host closure was freed by into_raw; the raw graph (instantiated again through from_raw) still calls it"
        );
    });
}

/// `Graph::into_raw` hands the raw graph what its nodes refer to, graph allocations included:
/// the record, which holds the allocations a graph's nodes name, goes with the value. A kernel
/// node of the raw graph uses an allocation of another graph (G.3.3); once that graph and every
/// handle are dropped, the raw graph's user object still holds the allocation, until the raw
/// graph is destroyed.
#[test]
fn into_raw_keeps_the_graph_allocations_its_nodes_use() {
    isolated("into_raw_keeps_the_graph_allocations_its_nodes_use", || {
        let (device, _module, fill) = stub();
        let live = || cuda_graph::live_objects().graph_allocations;
        let before = live();
        let mut owner = Graph::new(&device).unwrap();
        let (_, escaping) = owner
            .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap();
        let mut user = Graph::new(&device).unwrap();
        let args = KernelArgs::new().ptr(&escaping).value(N).value(1u32);
        // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the allocation's
        // N words; the stub runs nothing.
        unsafe { user.add_kernel_node(&[], &fill, config(), &args) }.unwrap();
        let raw = user.into_raw();
        drop((owner, escaping));
        flush_deferred();
        assert_eq!(
            live() - before,
            1,
            "the raw graph's kernel node uses the allocation, which into_raw let go of"
        );
        // SAFETY: `raw` is the graph given up above; nothing else destroys it.
        assert_eq!(
            unsafe { cuda_graph::sys::cuGraphDestroy(raw) },
            cuda_graph::sys::CUresult::CUDA_SUCCESS
        );
        flush_deferred();
        assert_eq!(live(), before, "released with the raw graph's user object");
    });
}

/// Finding 4. A kernel captured through `Function::launch` into a `Capture` keeps its module
/// and memory, but its uses of graph allocations are not recorded: the captured graph's launch
/// is not refused for an allocation that is not live, nor ordered after its allocating launch,
/// nor waited for by its free. `Capture::launch` with the same arguments is refused.
#[test]
fn function_launch_into_a_capture_skips_the_allocation_checks() {
    isolated(
        "function_launch_into_a_capture_skips_the_allocation_checks",
        || {
            let (device, _module, fill) = stub();
            let mut owner = Graph::new(&device).unwrap();
            // Never launched: not live.
            let (_, buf) = owner
                .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
                .unwrap();
            let stream = Stream::new(&device).unwrap();
            let args = KernelArgs::new().ptr(&buf).value(N).value(1u32);
            let (guarded, ()) = capture(&stream, CaptureMode::Global, |cap| {
                // SAFETY: the arguments match fill_u32(p, n, v); the stub runs nothing.
                unsafe { cap.launch(&fill, config(), &args) }
            })
            .unwrap();
            let refused = guarded
                .instantiate(InstantiateFlags::NONE)
                .unwrap()
                .launch(&stream);
            assert!(refused.is_err(), "Capture::launch's graph is refused");
            println!("Capture::launch: {}", refused.unwrap_err());
            let captured = capture(&stream, CaptureMode::Global, |cap| {
                // SAFETY: as above; Function::launch's contract says the crate ensures memory
                // passed with KernelArgs::ptr in a capture begun through Capture.
                unsafe { fill.launch(cap.stream(), config(), &args) }
            });
            // Refused in the capture, or at the captured graph's launch: never run.
            let (unguarded, ()) = match captured {
                Err(e) => {
                    println!("Function::launch in the capture: {e}");
                    return;
                }
                Ok(captured) => captured,
            };
            println!(
                "record of the Function::launch node: {:?}",
                unguarded.nodes()
            );
            let launched = unguarded
                .instantiate(InstantiateFlags::NONE)
                .unwrap()
                .launch(&stream);
            assert!(
                launched.is_err(),
                "FINDING 4: the graph captured through Function::launch was launched on an allocation that is not live"
            );
        },
    );
}

/// Hands `graph` over ([`Graph::into_raw`]: its keep list moves into a user object the raw graph
/// retains) and destroys the raw graph: the stub's driver thread then runs the user object's
/// destructor, whose release the crate's release thread runs, with no flush point of the
/// program's.
fn hand_over_and_destroy(graph: Graph) {
    let raw = graph.into_raw();
    // SAFETY: handed over just now, destroyed once.
    let destroyed = unsafe { cuda_graph::sys::cuGraphDestroy(raw) };
    assert_eq!(destroyed, cuda_graph::sys::CUresult::CUDA_SUCCESS);
}

/// A value whose drop panics (a user type captured by a host closure).
struct PanicOnDrop;
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("a user value's Drop panics");
    }
}

/// Finding 7a. A panic in the drop of something the keep list holds (a host closure's capture)
/// unwinds out of `flush_deferred`, which drops the jobs it had taken without running them: an
/// unrelated module unload queued behind is lost for good, and the panic escapes the library
/// call that flushed (here `Capture::end`).
#[test]
fn a_panicking_drop_in_the_queue_loses_the_releases_behind_it() {
    isolated(
        "a_panicking_drop_in_the_queue_loses_the_releases_behind_it",
        || {
            let (device, module, fill) = stub();
            drop(fill);
            control_unloads(&device);
            stub_call("attack_set_async_destroy_ms", Some(150));
            let mut graph = Graph::new(&device).unwrap();
            let bomb = PanicOnDrop;
            graph
                .add_host_node(&[], move || {
                    std::hint::black_box(&bomb);
                })
                .unwrap();
            hand_over_and_destroy(graph);
            // The driver's thread runs the user object's destructor in 150 ms: by then a Global
            // capture forbids releases, so its job waits in the queue, ahead of the unload.
            let stream = Stream::new(&device).unwrap();
            let cap = Capture::begin(&stream, CaptureMode::Global).unwrap();
            std::thread::sleep(Duration::from_millis(500));
            let before = unloads();
            drop(module);
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cap.end()));
            let escaped = ended.is_err();
            flush_deferred();
            let after = unloads();
            assert!(
                !escaped && after == before + 1,
                "FINDING 7a: panic escaped Capture::end: {escaped}; module unloads {before} -> {after} (the unload queued behind the panicking job was dropped, never run)"
            );
        },
    );
}

/// Finding 7b. The same panic on the release thread ends the thread, silently: later releases
/// queued by user-object destructors wait for the program's next flush point, against the
/// crate's promise.
#[test]
fn a_panicking_drop_kills_the_release_thread() {
    isolated("a_panicking_drop_kills_the_release_thread", || {
        let (device, _module, _fill) = stub();
        stub_call("attack_set_async_destroy_ms", Some(50));
        // A closure released by the release thread alone (no flush point follows).
        let released_within = |sentinel: &Arc<()>, what: &str| {
            let start = Instant::now();
            while Arc::strong_count(sentinel) > 1 {
                if start.elapsed() > Duration::from_secs(2) {
                    println!("{what}: not released after 2 s");
                    return false;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            true
        };
        let release_only_by_the_thread = hand_over_and_destroy;
        let first = Arc::new(());
        let mut graph = Graph::new(&device).unwrap();
        graph.add_host_node(&[], sentinel_closure(&first)).unwrap();
        release_only_by_the_thread(graph);
        assert!(
            released_within(&first, "before"),
            "the release thread works"
        );
        let mut graph = Graph::new(&device).unwrap();
        let bomb = PanicOnDrop;
        graph
            .add_host_node(&[], move || {
                std::hint::black_box(&bomb);
            })
            .unwrap();
        release_only_by_the_thread(graph);
        std::thread::sleep(Duration::from_millis(500));
        let second = Arc::new(());
        let mut graph = Graph::new(&device).unwrap();
        graph.add_host_node(&[], sentinel_closure(&second)).unwrap();
        release_only_by_the_thread(graph);
        assert!(
            released_within(&second, "after"),
            "FINDING 7b: the release thread died with the panic; releases wait for the next flush point"
        );
    });
}

/// Finding 8. Driver errors in `Drop` of events and pools are discarded (`let _ =`), not
/// recorded in `Device::drop_errors` (and neither drop is queued during a capture, although the
/// crate docs' table says so).
#[test]
fn event_and_pool_drop_errors_are_lost() {
    isolated("event_and_pool_drop_errors_are_lost", || {
        let (device, _module, _fill) = stub();
        let before = device.drop_errors().count;
        let event = Event::new(&device).unwrap();
        let pool = MemPool::new(&device).unwrap();
        stub_call("attack_fail_destroys", Some(1));
        drop(event);
        drop(pool);
        stub_call("attack_fail_destroys", Some(0));
        let after = device.drop_errors().count;
        assert_eq!(
            after,
            before + 2,
            "FINDING 8: two destroys failed in Drop, {} recorded",
            after - before
        );
    });
}

/// Finding 9. Child-graph copies share keep lists by `Arc`: two graphs that hold copies of each
/// other form a cycle, and everything either refers to is never released.
#[test]
fn graphs_copied_into_each_other_leak_what_they_keep() {
    isolated("graphs_copied_into_each_other_leak_what_they_keep", || {
        let (device, _module, _fill) = stub();
        let sentinel = Arc::new(());
        let mut a = Graph::new(&device).unwrap();
        a.add_host_node(&[], sentinel_closure(&sentinel)).unwrap();
        let mut b = Graph::new(&device).unwrap();
        b.add_child_graph_node(&[], &a).unwrap();
        a.add_child_graph_node(&[], &b).unwrap();
        drop((a, b));
        flush_deferred();
        assert_eq!(
            Arc::strong_count(&sentinel),
            1,
            "FINDING 9: both graphs are gone and their host closure is never released"
        );
    });
}
