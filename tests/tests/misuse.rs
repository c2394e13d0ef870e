//! The misuse catalog: each way of holding the API wrong, with the exact error it gives (the
//! variant; for driver errors the call and CUDA's code), and then proof that the device still
//! works: a fresh graph launches and its output verifies.
//!
//! Where the safe API makes a misuse impossible to write (cloning a graph, freeing an address no
//! graph allocated, ending a capture twice, sharing an executable graph between threads without
//! a lock), `tests/compile-fail/` shows it (run by `compile_fail.rs`), and the test here makes
//! the raw driver call on a raw handle, to record what CUDA itself answers.
//!
//! Each test prints `OBSERVED <case>: ...` lines with what the driver returned. Where NVIDIA's
//! documentation does not pin the behaviour down, the assertion is what the H200 showed (driver
//! 580.159.04, CUDA 13.0 headers), and the comment says so. On another driver,
//! `CUDA_GRAPH_EXPLORE=1` turns each difference into a printed `MISMATCH` line instead of a
//! failure, so that one run shows them all. What the library itself does is asserted, never
//! only observed.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`; the test that needs two GPUs also fails there on a machine with
//! one (the GPU runner excludes it by name, from `ci/needs-two-gpus.txt`).

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use safe_common::{assert_no_drop_errors, settle};
use std::ptr::{null, null_mut};

use cuda_graph::check::Rule;
use cuda_graph::sys::{self, CUresult};
use cuda_graph::{
    AllocParams, AsStream, Capture, CaptureMode, CaptureStatus, Device, DeviceAddress,
    DeviceBuffer, DriverError, Error, Graph, GraphAllocation, InstantiateFlags, KernelArgs, Node,
    NodeKind, Stream, StreamAllocation, StreamFlags, capture, live_objects,
};
use safe_common::{BYTES, Gpu, N, assert_all, assert_iota, assert_released, config, gpu};

/// Elements of the buffers the device check writes.
const SMALL: u64 = 4096;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A code's C name, or its number.
fn name(code: CUresult) -> String {
    code.name()
        .map(str::to_string)
        .unwrap_or_else(|| format!("CUDA_ERROR_{}", code.0))
}

/// `CUDA_GRAPH_EXPLORE=1`: a driver that behaves otherwise than the H200 did prints `MISMATCH`
/// lines instead of failing the test, so that one run on a new driver shows every difference.
fn exploring() -> bool {
    std::env::var("CUDA_GRAPH_EXPLORE").is_ok_and(|v| v.trim() == "1")
}

/// An error as short, comparable text: `Driver(cuMemAllocAsync, CUDA_ERROR_OUT_OF_MEMORY)`,
/// `InvalidArgument(Device::get)`, `Lifetime(FreedByTwoGraphs)`, `UnfreedOnRelaunch`,
/// `NotLive(ExecGraph::launch)`.
fn key(err: &Error) -> String {
    match err {
        Error::Driver(DriverError { call, code, .. }) => format!("Driver({call}, {})", name(*code)),
        Error::InvalidArgument { call, .. } => format!("InvalidArgument({call})"),
        Error::Lifetime(e) => {
            let rules: Vec<String> = e
                .violations
                .iter()
                .map(|v| format!("{:?}", v.rule))
                .collect();
            format!("Lifetime({})", rules.join(", "))
        }
        Error::UnfreedOnRelaunch { .. } => "UnfreedOnRelaunch".into(),
        Error::NotLive { call, .. } => format!("NotLive({call})"),
        Error::StillLive { call, .. } => format!("StillLive({call})"),
        Error::AlreadyInstantiated { call } => format!("AlreadyInstantiated({call})"),
        Error::Capturing { call, .. } => format!("Capturing({call})"),
        Error::NotInCapture { call } => format!("NotInCapture({call})"),
        Error::InHostFunction { call } => format!("InHostFunction({call})"),
        other => format!("{other:?}"),
    }
}

/// A result as short text: `Ok`, or the error's [`key`].
fn outcome<T>(result: &Result<T, Error>) -> String {
    match result {
        Ok(_) => "Ok".into(),
        Err(e) => key(e),
    }
}

/// What CUDA did in `case`, printed as `OBSERVED <case>: <got>`, and asserted equal to what the
/// H200 showed (`expected`); under [`exploring`], a difference prints `MISMATCH` instead.
#[track_caller]
fn observed(case: &str, got: impl Into<String>, expected: &str) {
    let got = got.into();
    println!("OBSERVED {case}: {got}");
    if got != expected {
        if exploring() {
            println!("MISMATCH {case}: expected {expected}");
        } else {
            panic!("{case}: CUDA answered {got}, the H200 answered {expected}");
        }
    }
}

/// Asserts a driver error from `call` with `code`.
#[track_caller]
fn assert_driver(err: &Error, call: &str, code: CUresult) {
    match err {
        Error::Driver(DriverError {
            call: c, code: got, ..
        }) => {
            assert_eq!(
                (*c, name(*got)),
                (call, name(code)),
                "expected {call} to fail with {}, got: {err}",
                name(code)
            );
            assert_eq!(err.code(), Some(code));
        }
        other => panic!(
            "expected {call} to fail with {}, got {other:?} ({other})",
            name(code)
        ),
    }
}

/// Asserts an [`Error::InvalidArgument`] from `call`; returns its reason.
#[track_caller]
fn assert_invalid(err: &Error, call: &str) -> String {
    match err {
        Error::InvalidArgument { call: c, reason } => {
            assert_eq!(*c, call, "{err}");
            assert_eq!(err.code(), None, "our own checks carry no CUDA code");
            reason.clone()
        }
        other => {
            panic!("expected {call} to be refused as an invalid argument, got {other:?} ({other})")
        }
    }
}

/// Asserts an [`Error::NotLive`] from `call` naming `allocation`.
#[track_caller]
fn assert_not_live(err: &Error, call: &str, allocation: &cuda_graph::GraphAllocation) {
    match err {
        Error::NotLive {
            call: c,
            allocation: a,
        } => {
            assert_eq!(*c, call, "{err}");
            assert_eq!(a.id, allocation.id(), "{err}: another allocation");
            assert_eq!(err.code(), None, "our own checks carry no CUDA code");
        }
        other => panic!(
            "expected {call} to refuse an allocation that is not live, got {other:?} ({other})"
        ),
    }
}

/// Asserts an [`Error::Lifetime`] that contains a violation of `rule`.
#[track_caller]
fn assert_lifetime(err: &Error, rule: Rule) {
    match err {
        Error::Lifetime(e) => assert!(
            e.violations.iter().any(|v| v.rule == rule),
            "expected a {rule:?} violation, got {e}"
        ),
        other => panic!("expected a lifetime error ({rule:?}), got {other:?} ({other})"),
    }
    assert_eq!(err.code(), None);
}

/// A fresh explicit graph (alloc → iota from 17 → copy out → free) launched on `stream`: what
/// it copied out, or the first error.
fn small_graph(g: &Gpu, stream: &impl AsStream) -> cuda_graph::Result<Vec<u32>> {
    let device = &g.device;
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize)?;
    let cfg = config(SMALL);
    let mut graph = Graph::new(device)?;
    let (alloc, buf) =
        graph.add_mem_alloc_node(&[], &AllocParams::new(device, SMALL as usize * 4))?;
    // SAFETY: iota_u32(p, n, base) over the SMALL values of `buf`; copy_u32(dst, src, n) of them
    // into `out`, which holds SMALL values; both ordered between the alloc and free nodes.
    let copy = unsafe {
        let iota = graph.add_kernel_node(
            &[alloc],
            &g.k.iota,
            cfg,
            &KernelArgs::new().ptr(&buf).value(SMALL).value(17u32),
        )?;
        graph.add_kernel_node(
            &[iota],
            &g.k.copy,
            cfg,
            &KernelArgs::new().ptr(&out).ptr(&buf).value(SMALL),
        )?
    };
    graph.add_mem_free_node(&[copy], &buf)?;
    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    exec.launch(stream)?;
    stream.synchronize()?;
    out.to_vec()
}

/// The device still works: on `stream`, a fresh explicit graph (alloc → iota → copy out → free)
/// and a fresh captured one launch, and both outputs verify.
#[track_caller]
fn assert_device_works(g: &Gpu, stream: &impl AsStream, case: &str) {
    let device = &g.device;
    assert_eq!(
        stream.capture_status().expect("cuStreamIsCapturing"),
        CaptureStatus::None,
        "{case}: the stream is still capturing"
    );
    let got =
        small_graph(g, stream).unwrap_or_else(|e| panic!("{case}: a small graph failed: {e}"));
    assert_iota(&got, 17, case);

    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).expect("cuMemAlloc");
    let cfg = config(SMALL);
    let (graph, ()) = capture(stream, CaptureMode::Global, |cap| {
        let buf = cap.malloc_async(SMALL as usize * 4)?;
        // SAFETY: fill_u32 over the SMALL values of `buf`, then copy_u32 of them into `out`.
        unsafe {
            cap.launch(
                &g.k.fill,
                cfg,
                &KernelArgs::new().ptr(&buf).value(SMALL).value(23u32),
            )?;
            cap.launch(
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(&out).ptr(&buf).value(SMALL),
            )?;
        }
        cap.free_async(&buf)
    })
    .expect("capture");
    let exec = graph
        .instantiate(InstantiateFlags::NONE)
        .expect("instantiate");
    exec.launch(stream).expect("launch");
    stream.synchronize().expect("synchronize");
    assert_all(&out.to_vec().expect("copy back"), 23, case);
    println!("{case}: the device still works (an explicit and a captured graph ran and verified)");
}

/// A raw graph, destroyed on drop: for the driver calls the safe API does not offer.
struct RawGraph(sys::CUgraph);

impl RawGraph {
    fn new(device: &Device) -> RawGraph {
        device.bind().expect("bind");
        let mut raw = null_mut();
        // SAFETY: `raw` is a valid out-pointer; flags must be 0.
        let code = unsafe { sys::cuGraphCreate(&mut raw, 0) };
        assert_eq!(code, CUresult::CUDA_SUCCESS, "cuGraphCreate");
        RawGraph(raw)
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        // SAFETY: created by cuGraphCreate (or handed over by `Graph::into_raw`) and destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(self.0) };
    }
}

/// The nodes of a raw graph.
fn raw_nodes(graph: sys::CUgraph) -> Vec<sys::CUgraphNode> {
    let mut count = 0;
    // SAFETY: a null array asks for the count.
    let code = unsafe { sys::cuGraphGetNodes(graph, null_mut(), &mut count) };
    assert_eq!(code, CUresult::CUDA_SUCCESS, "cuGraphGetNodes");
    let mut nodes = vec![null_mut(); count];
    if count > 0 {
        // SAFETY: the array holds `count` entries.
        let code = unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) };
        assert_eq!(code, CUresult::CUDA_SUCCESS, "cuGraphGetNodes");
    }
    nodes.truncate(count);
    nodes
}

/// The node type of a raw node.
fn raw_type(node: sys::CUgraphNode) -> sys::CUgraphNodeType {
    let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: the node is live; `kind` is a valid out-pointer.
    let code = unsafe { sys::cuGraphNodeGetType(node, &mut kind) };
    assert_eq!(code, CUresult::CUDA_SUCCESS, "cuGraphNodeGetType");
    kind
}

/// Bytes in use from the device's default memory pool (where `cuMemAllocAsync` allocates).
fn default_pool_used(device: &Device) -> u64 {
    device.bind().expect("bind");
    let mut pool = null_mut();
    // SAFETY: `pool` is a valid out-pointer; the device is valid.
    let code = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, device.as_raw()) };
    assert_eq!(code, CUresult::CUDA_SUCCESS, "cuDeviceGetDefaultMemPool");
    let mut used: u64 = 0;
    // SAFETY: USED_MEM_CURRENT is a 64-bit value; `used` is a valid out-pointer.
    let code = unsafe {
        sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            (&mut used as *mut u64).cast(),
        )
    };
    assert_eq!(code, CUresult::CUDA_SUCCESS, "cuMemPoolGetAttribute");
    used
}

/// A graph that allocates `bytes` (labelled `label`), fills its first SMALL values with `value`
/// and copies them to `out`, without freeing it: its allocation outlives each launch (G.3.3).
fn escaping_graph(
    g: &Gpu,
    out: &DeviceBuffer<u32>,
    label: &str,
    value: u32,
) -> (Graph, GraphAllocation, Node) {
    let device = &g.device;
    let mut graph = Graph::new(device).expect("cuGraphCreate");
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label(label))
        .expect("alloc node");
    // SAFETY: fill_u32 over the first SMALL values of `buf` (which holds N ≥ SMALL), then
    // copy_u32 of them into `out` (SMALL values).
    let copy = unsafe {
        let fill = graph
            .add_kernel_node(
                &[alloc],
                &g.k.fill,
                config(SMALL),
                &KernelArgs::new().ptr(&buf).value(SMALL).value(value),
            )
            .expect("kernel node");
        graph
            .add_kernel_node(
                &[fill],
                &g.k.copy,
                config(SMALL),
                &KernelArgs::new().ptr(out).ptr(&buf).value(SMALL),
            )
            .expect("kernel node")
    };
    (graph, buf, copy)
}

// ---------------------------------------------------------------------------------------------
// Graph memory: relaunch, sizes, frees
// ---------------------------------------------------------------------------------------------

/// Relaunching a graph whose previous launch left an allocation live, instantiated without
/// AutoFreeOnLaunch, is refused before the driver is called, naming the allocation; freeing it
/// makes the relaunch legal.
#[test]
#[ignore = "needs a GPU"]
fn relaunch_with_unfreed_allocations_without_auto_free_is_refused() {
    let Some(g) = gpu("relaunch_with_unfreed_allocations_without_auto_free_is_refused") else {
        return;
    };
    let stream = Stream::new(&g.device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(&g.device, SMALL as usize).unwrap();
    let (graph, buf, _) = escaping_graph(&g, &out, "x", 5);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), 5, "first launch");
    assert!(buf.is_live());

    let err = exec.launch(&stream).unwrap_err();
    println!("CASE relaunch with unfreed allocation: {err}");
    match &err {
        Error::UnfreedOnRelaunch { allocations } => {
            assert_eq!(allocations, &[buf.describe()]);
            assert_eq!(allocations[0].id, buf.id());
            assert_eq!(allocations[0].label.as_deref(), Some("x"));
        }
        other => panic!("expected UnfreedOnRelaunch, got {other:?}"),
    }
    assert_eq!(err.code(), None);
    assert!(err.to_string().contains("AUTO_FREE_ON_LAUNCH"), "{err}");

    buf.free_async(&stream).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), 5, "relaunch after free_async");
    buf.free_async(&stream).unwrap();
    drop((exec, graph, buf));
    assert_device_works(&g, &stream, "relaunch_with_unfreed");
    assert_released(&g.device, "relaunch_with_unfreed");
}

/// Allocations of 0 bytes are refused before the driver is called, explicit and captured and
/// stream-ordered; the raw driver call is recorded too.
#[test]
#[ignore = "needs a GPU"]
fn zero_byte_allocations_are_refused() {
    let Some(g) = gpu("zero_byte_allocations_are_refused") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();

    let mut graph = Graph::new(device).unwrap();
    let err = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, 0))
        .unwrap_err();
    println!("CASE explicit alloc of 0 bytes: {err}");
    assert_invalid(&err, "cuGraphAddMemAllocNode");
    assert!(graph.nodes().is_empty(), "no node was recorded");

    let err = capture(&stream, CaptureMode::Global, |cap| cap.malloc_async(0)).unwrap_err();
    println!("CASE captured malloc_async of 0 bytes: {err}");
    assert_invalid(&err, "cuMemAllocAsync");
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);

    let err = StreamAllocation::new(&stream, 0).unwrap_err();
    assert_invalid(&err, "cuMemAllocAsync");

    // What CUDA itself says to a 0-byte alloc node (on a raw graph).
    let raw = RawGraph::new(device);
    let mut params = sys::CUDA_MEM_ALLOC_NODE_PARAMS {
        poolProps: sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device.ordinal() as i32,
            },
            ..Default::default()
        },
        accessDescs: null(),
        accessDescCount: 0,
        bytesize: 0,
        dptr: 0,
    };
    let mut node = null_mut();
    // SAFETY: out-pointers valid; no dependencies; no access descriptors.
    let code = unsafe { sys::cuGraphAddMemAllocNode(&mut node, raw.0, null(), 0, &mut params) };
    observed(
        "raw alloc node of 0 bytes: cuGraphAddMemAllocNode",
        name(code),
        "CUDA_ERROR_INVALID_VALUE",
    );
    drop(raw);

    assert_device_works(&g, &stream, "zero_byte_allocations");
    assert_released(device, "zero_byte_allocations");
}

/// An allocation larger than the device's memory. CUDA itself accepts such an alloc node and
/// its instantiation, fails the upload or launch with CUDA_ERROR_OUT_OF_MEMORY, and then keeps
/// nearly the whole device reserved for graphs until the process exits, even after a trim
/// (observed on the H200: 135.41 GiB of 139.8 GiB, 26 MB left free). So our layer refuses it
/// before the driver on all three routes (explicit node, captured `malloc_async`, stream
/// allocation), and the device keeps working with nothing reserved.
#[test]
#[ignore = "needs a GPU"]
fn allocation_larger_than_the_device_fails_and_the_process_goes_on() {
    let Some(g) = gpu("allocation_larger_than_the_device_fails_and_the_process_goes_on") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let bytes = device.total_memory().unwrap() * 2;
    println!("device memory {} B; asking for {bytes} B", bytes / 2);

    let mut graph = Graph::new(device).unwrap();
    let err = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, bytes))
        .unwrap_err();
    println!("CASE oversized explicit allocation: {err}");
    let reason = assert_invalid(&err, "cuGraphAddMemAllocNode");
    assert!(reason.contains("on a device of"), "{reason}");
    assert!(graph.nodes().is_empty(), "no node is recorded");
    drop(graph);

    let err = capture(&stream, CaptureMode::Global, |cap| {
        let buf = cap.malloc_async(bytes)?;
        cap.free_async(&buf)
    })
    .unwrap_err();
    println!("CASE oversized captured allocation: {err}");
    assert_invalid(&err, "cuMemAllocAsync");
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);

    let err = cuda_graph::StreamAllocation::new(&stream, bytes).unwrap_err();
    println!("CASE oversized stream allocation: {err}");
    assert_invalid(&err, "cuMemAllocAsync");

    assert_device_works(&g, &stream, "oversized_allocation");
    assert_released(device, "oversized_allocation");
}

/// A free node for an address no graph allocated. The safe API takes a `&GraphAllocation`, so
/// a plain device address cannot be passed (compile-fail `free_node_needs_a_graph_allocation`);
/// the raw call is refused by CUDA. A graph allocation that no launch has made live yet may be
/// named by a free node in another graph, but launching that graph is refused by our layer.
#[test]
#[ignore = "needs a GPU"]
fn free_node_for_an_address_no_graph_allocated() {
    let Some(g) = gpu("free_node_for_an_address_no_graph_allocated") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();

    let buffer = DeviceBuffer::<u32>::zeroed(device, 1024).unwrap();
    let raw = RawGraph::new(device);
    for (what, address) in [
        ("a cuMemAlloc address", buffer.device_ptr()),
        ("an address nobody allocated", 0x7f00_dead_0000),
    ] {
        let mut node = null_mut();
        // SAFETY: out-pointer valid; no dependencies; the driver validates the address.
        let code = unsafe { sys::cuGraphAddMemFreeNode(&mut node, raw.0, null(), 0, address) };
        // Documented: freeing an address not returned by an alloc node is an invalid value.
        observed(
            &format!("raw free node of {what}: cuGraphAddMemFreeNode"),
            name(code),
            "CUDA_ERROR_INVALID_VALUE",
        );
    }
    drop(raw);

    // An allocation whose graph never launched: the free node is accepted, the launch refused.
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let (owner, x, _) = escaping_graph(&g, &out, "never launched", 1);
    let mut freer = Graph::new(device).unwrap();
    let added = freer.add_mem_free_node(&[], &x);
    observed(
        "free node in another graph for an allocation never launched",
        outcome(&added),
        "Ok",
    );
    let exec = freer.instantiate(InstantiateFlags::NONE).unwrap();
    let err = exec.launch(&stream).unwrap_err();
    println!("CASE launch of a free of an allocation that is not live: {err}");
    assert_not_live(&err, "ExecGraph::launch", &x);
    drop((exec, freer, owner, x));

    assert_device_works(&g, &stream, "free_of_unallocated");
    assert_released(device, "free_of_unallocated");
}

/// Two free nodes for one allocation in one graph: CUDA refuses the second (documented), the
/// record keeps one, and the graph still instantiates and runs. Captured, the second
/// `cuMemFreeAsync` of one address fails with CUDA_ERROR_INVALID_VALUE and the capture goes on:
/// its graph (one free node) runs (observed on the H200).
#[test]
#[ignore = "needs a GPU"]
fn two_free_nodes_for_one_allocation() {
    let Some(g) = gpu("two_free_nodes_for_one_allocation") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();

    let (mut graph, x, copy) = escaping_graph(&g, &out, "x", 3);
    let free = graph.add_mem_free_node(&[copy], &x).unwrap();
    let second = graph.add_mem_free_node(&[free], &x);
    if let Err(err) = &second {
        println!("CASE second free node for one allocation: {err}");
    }
    // Documented: CUDA refuses to free an allocation twice in one graph.
    observed(
        "second free node for one allocation",
        outcome(&second),
        "Driver(cuGraphAddMemFreeNode, CUDA_ERROR_INVALID_VALUE)",
    );
    let frees = graph
        .nodes()
        .iter()
        .filter(|n| n.kind() == NodeKind::MemFree)
        .count();
    assert_eq!(frees, 1, "the refused free node is not in the record");
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        3,
        "graph after the refused second free",
    );
    drop((exec, graph, x));

    // Captured: the same address freed twice.
    let mut second = None;
    let result = capture(&stream, CaptureMode::Global, |cap| {
        let buf = cap.malloc_async(BYTES)?;
        cap.free_async(&buf)?;
        second = Some(cap.free_async(&buf));
        Ok(())
    });
    let second = second.expect("the closure ran");
    observed(
        "captured double free: the second cuMemFreeAsync",
        outcome(&second),
        "Driver(cuMemFreeAsync, CUDA_ERROR_INVALID_VALUE)",
    );
    observed(
        "captured double free: the end of the capture",
        outcome(&result),
        "Ok",
    );
    if let Ok((graph, ())) = result {
        graph.check().unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
    }
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);

    assert_device_works(&g, &stream, "two_free_nodes");
    assert_released(device, "two_free_nodes");
}

/// A graph that allocates, fills with `value`, copies the first SMALL values to `out`, and frees.
fn freed_graph(g: &Gpu, out: &DeviceBuffer<u32>, value: u32) -> Graph {
    let (mut graph, buf, copy) = escaping_graph(g, out, "freed", value);
    graph.add_mem_free_node(&[copy], &buf).expect("free node");
    graph
}

/// Freeing one allocation in two graphs. CUDA's documentation: when the owner frees it, no
/// other graph may add a free node; when another graph frees it, the owner may not. When two
/// graphs other than the owner free it, our check refuses to instantiate either.
#[test]
#[ignore = "needs a GPU"]
fn freeing_in_two_graphs() {
    let Some(g) = gpu("freeing_in_two_graphs") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();

    // (a) The owner frees it; another graph adds a free node too.
    let (mut owner, x, copy) = escaping_graph(&g, &out, "a", 1);
    owner.add_mem_free_node(&[copy], &x).unwrap();
    let mut other = Graph::new(device).unwrap();
    let added = other.add_mem_free_node(&[], &x);
    // Documented: "If the allocation is freed in the same graph, a free node cannot be added to
    // another graph."
    observed(
        "free node in a second graph for an allocation its owner frees",
        outcome(&added),
        "Driver(cuGraphAddMemFreeNode, CUDA_ERROR_INVALID_VALUE)",
    );
    match added {
        Err(err) => assert_driver(
            &err,
            "cuGraphAddMemFreeNode",
            CUresult::CUDA_ERROR_INVALID_VALUE,
        ),
        Ok(_) => {
            assert_lifetime(
                &other.instantiate(InstantiateFlags::NONE).unwrap_err(),
                Rule::FreedByTwoGraphs,
            );
            assert_lifetime(
                &owner.instantiate(InstantiateFlags::NONE).unwrap_err(),
                Rule::FreedByTwoGraphs,
            );
        }
    }
    drop((owner, other, x));

    // (b) Another graph frees it; then the owner adds a free node.
    let (mut owner, x, copy) = escaping_graph(&g, &out, "b", 2);
    let mut freer = Graph::new(device).unwrap();
    freer.add_mem_free_node(&[], &x).unwrap();
    let added = owner.add_mem_free_node(&[copy], &x);
    // Documented: "If the allocation is freed in another graph, a free node can no longer be
    // added to the owning graph."
    observed(
        "owner's free node for an allocation another graph frees",
        outcome(&added),
        "Driver(cuGraphAddMemFreeNode, CUDA_ERROR_INVALID_VALUE)",
    );
    match added {
        Err(err) => assert_driver(
            &err,
            "cuGraphAddMemFreeNode",
            CUresult::CUDA_ERROR_INVALID_VALUE,
        ),
        Ok(_) => assert_lifetime(
            &owner.instantiate(InstantiateFlags::NONE).unwrap_err(),
            Rule::FreedByTwoGraphs,
        ),
    }
    drop((owner, freer, x));

    // (c) The owner does not free it; two other graphs do.
    let (owner, x, _) = escaping_graph(&g, &out, "c", 3);
    let mut first = Graph::new(device).unwrap();
    first.add_mem_free_node(&[], &x).unwrap();
    let mut second = Graph::new(device).unwrap();
    let added = second.add_mem_free_node(&[], &x);
    // Not documented; observed on the H200.
    observed(
        "free nodes for one allocation in two graphs other than its owner",
        outcome(&added),
        "Ok",
    );
    match added {
        Err(err) => assert_driver(
            &err,
            "cuGraphAddMemFreeNode",
            CUresult::CUDA_ERROR_INVALID_VALUE,
        ),
        Ok(_) => {
            let err = first.instantiate(InstantiateFlags::NONE).unwrap_err();
            println!("CASE freed by two graphs: {err}");
            assert_lifetime(&err, Rule::FreedByTwoGraphs);
            assert_lifetime(
                &second.instantiate(InstantiateFlags::NONE).unwrap_err(),
                Rule::FreedByTwoGraphs,
            );
        }
    }
    // Dropping the second graph makes the first legal: launch the owner, then the freer.
    drop(second);
    let owner_exec = owner.instantiate(InstantiateFlags::NONE).unwrap();
    let first_exec = first.instantiate(InstantiateFlags::NONE).unwrap();
    owner_exec.launch(&stream).unwrap();
    first_exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), 3, "owner then freer");
    assert!(!x.is_live(), "the freer's launch freed it");
    drop((owner_exec, first_exec, owner, first, x));

    assert_device_works(&g, &stream, "freeing_in_two_graphs");
    assert_released(device, "freeing_in_two_graphs");
}

/// Cloning a graph with memory nodes: `Graph` is not `Clone` (compile-fail
/// `graph_is_not_clone`); the raw `cuGraphClone` is refused by CUDA, while a graph without
/// memory nodes clones.
#[test]
#[ignore = "needs a GPU"]
fn cloning_a_graph_with_memory_nodes() {
    let Some(g) = gpu("cloning_a_graph_with_memory_nodes") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let graph = freed_graph(&g, &out, 9);

    let mut clone = null_mut();
    // SAFETY: `clone` is a valid out-pointer; the graph is live.
    let code = unsafe { sys::cuGraphClone(&mut clone, graph.as_raw()) };
    if code == CUresult::CUDA_SUCCESS {
        // SAFETY: the clone is ours to destroy.
        let _ = unsafe { sys::cuGraphDestroy(clone) };
    }
    // The documentation says only "cannot be cloned"; the code is the H200's.
    observed(
        "raw clone of a graph with memory nodes: cuGraphClone",
        name(code),
        "CUDA_ERROR_NOT_SUPPORTED",
    );

    let mut plain = Graph::new(device).unwrap();
    plain.add_empty_node(&[]).unwrap();
    let mut clone = null_mut();
    // SAFETY: as above.
    let code = unsafe { sys::cuGraphClone(&mut clone, plain.as_raw()) };
    assert_eq!(
        code,
        CUresult::CUDA_SUCCESS,
        "a graph without memory nodes clones"
    );
    // SAFETY: the clone is ours to destroy.
    let _ = unsafe { sys::cuGraphDestroy(clone) };

    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        9,
        "the graph after the refused clone",
    );
    drop((exec, graph));
    assert_device_works(&g, &stream, "cloning");
    assert_released(device, "cloning");
}

/// A second instantiation of a graph with memory nodes while one exists: refused by our layer
/// before the driver (all three instantiate calls), and by CUDA when called raw. Dropping the
/// first makes it legal again.
#[test]
#[ignore = "needs a GPU"]
fn second_instantiation_while_one_exists() {
    let Some(g) = gpu("second_instantiation_while_one_exists") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let graph = freed_graph(&g, &out, 4);
    let first = graph.instantiate(InstantiateFlags::NONE).unwrap();

    let err = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
    println!("CASE second instantiation: {err}");
    assert_eq!(
        key(&err),
        "AlreadyInstantiated(Graph::instantiate)",
        "{err}"
    );
    // SAFETY: the graph obeys the lifetime rules; the refusal tested is the one-instantiation
    // rule, which the unchecked path keeps.
    let err =
        unsafe { graph.instantiate_unchecked(InstantiateFlags::AUTO_FREE_ON_LAUNCH) }.unwrap_err();
    assert_eq!(
        key(&err),
        "AlreadyInstantiated(Graph::instantiate)",
        "{err}"
    );
    let err = graph
        .instantiate_and_upload(InstantiateFlags::NONE, &stream)
        .unwrap_err();
    assert_eq!(
        key(&err),
        "AlreadyInstantiated(Graph::instantiate)",
        "{err}"
    );

    let mut raw = null_mut();
    // SAFETY: `raw` is a valid out-pointer; the graph is live.
    let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, graph.as_raw(), 0) };
    if code == CUresult::CUDA_SUCCESS {
        // SAFETY: the executable graph is ours to destroy.
        let _ = unsafe { sys::cuGraphExecDestroy(raw) };
    }
    // The documentation says only "one instantiation at a time"; the code is the H200's.
    observed(
        "raw second instantiation: cuGraphInstantiateWithFlags",
        name(code),
        "CUDA_ERROR_NOT_SUPPORTED",
    );

    first.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    drop(first);
    out.copy_from(&vec![0; SMALL as usize]).unwrap();
    let again = graph.instantiate(InstantiateFlags::NONE).unwrap();
    again.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        4,
        "instantiated again after the first dropped",
    );
    drop((again, graph));
    assert_device_works(&g, &stream, "second_instantiation");
    assert_released(device, "second_instantiation");
}

/// Deleting a node or an edge of a graph with memory nodes: the safe API has no deletion at
/// all; the raw calls are refused by CUDA (on a graph without memory nodes they succeed).
#[test]
#[ignore = "needs a GPU"]
fn deleting_nodes_or_edges_of_a_graph_with_memory_nodes() {
    let Some(g) = gpu("deleting_nodes_or_edges_of_a_graph_with_memory_nodes") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let raw = RawGraph(freed_graph(&g, &out, 1).into_raw());
    let nodes = raw_nodes(raw.0);
    let kernel = *nodes
        .iter()
        .find(|&&n| raw_type(n) == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
        .expect("a kernel node");
    let (mut from, mut to) = (null_mut(), null_mut());
    let mut count = 1;
    // SAFETY: both arrays hold one entry; edge data is not asked for.
    let code =
        unsafe { sys::cuGraphGetEdges_v2(raw.0, &mut from, &mut to, null_mut(), &mut count) };
    assert!(
        code == CUresult::CUDA_SUCCESS && count >= 1,
        "cuGraphGetEdges"
    );

    // SAFETY: one edge of this graph, no edge data.
    let code = unsafe { sys::cuGraphRemoveDependencies_v2(raw.0, &from, &to, null(), 1) };
    // The documentation says "cannot be deleted"; the codes are the H200's.
    observed(
        "raw edge removal in a graph with memory nodes: cuGraphRemoveDependencies",
        name(code),
        "CUDA_ERROR_NOT_SUPPORTED",
    );
    // SAFETY: a node of this graph.
    let code = unsafe { sys::cuGraphDestroyNode(kernel) };
    observed(
        "raw node deletion in a graph with memory nodes: cuGraphDestroyNode",
        name(code),
        "CUDA_ERROR_NOT_SUPPORTED",
    );
    observed(
        "nodes left after the refused deletions",
        raw_nodes(raw.0).len().to_string(),
        &nodes.len().to_string(),
    );
    drop(raw);

    // Contrast: without memory nodes both succeed.
    let plain = RawGraph::new(device);
    let (mut a, mut b) = (null_mut(), null_mut());
    // SAFETY: out-pointers valid; `b` depends on `a`, both in `plain`.
    unsafe {
        assert_eq!(
            sys::cuGraphAddEmptyNode(&mut a, plain.0, null(), 0),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuGraphAddEmptyNode(&mut b, plain.0, &a, 1),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuGraphRemoveDependencies_v2(plain.0, &a, &b, null(), 1),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(sys::cuGraphDestroyNode(b), CUresult::CUDA_SUCCESS);
    }
    drop(plain);

    assert_device_works(&g, &stream, "deleting");
    assert_released(device, "deleting");
}

/// A child graph with memory nodes added by copy: refused by our layer before the driver, and
/// by CUDA when called raw; a child without memory nodes is copied and runs.
#[test]
#[ignore = "needs a GPU"]
fn child_graph_with_memory_nodes_added_by_copy() {
    let Some(g) = gpu("child_graph_with_memory_nodes_added_by_copy") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let child = freed_graph(&g, &out, 6);

    let mut parent = Graph::new(device).unwrap();
    let err = parent.add_child_graph_node(&[], &child).unwrap_err();
    println!("CASE child graph with memory nodes by copy: {err}");
    let reason = assert_invalid(&err, "cuGraphAddChildGraphNode");
    assert!(reason.contains("add_child_graph_node_moved"), "{reason}");
    assert!(parent.nodes().is_empty());

    let raw_parent = RawGraph::new(device);
    let mut node = null_mut();
    // SAFETY: out-pointer valid; both graphs live; the driver copies the child or refuses.
    let code = unsafe {
        sys::cuGraphAddChildGraphNode(&mut node, raw_parent.0, null(), 0, child.as_raw())
    };
    // The code is the H200's (the documentation says only that ownership must move).
    observed(
        "raw child graph with memory nodes by copy: cuGraphAddChildGraphNode",
        name(code),
        "CUDA_ERROR_NOT_SUPPORTED",
    );
    drop(raw_parent);

    // Contrast: a child without memory nodes.
    let mut plain_child = Graph::new(device).unwrap();
    // SAFETY: fill_u32 over the SMALL values of `out`.
    unsafe {
        plain_child
            .add_kernel_node(
                &[],
                &g.k.fill,
                config(SMALL),
                &KernelArgs::new().ptr(&out).value(SMALL).value(8u32),
            )
            .unwrap();
    }
    parent.add_child_graph_node(&[], &plain_child).unwrap();
    let exec = parent.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), 8, "parent with a copied child");
    drop((exec, parent, plain_child, child));
    assert_device_works(&g, &stream, "child_by_copy");
    assert_released(device, "child_by_copy");
}

// ---------------------------------------------------------------------------------------------
// Stream capture
// ---------------------------------------------------------------------------------------------

/// Synchronizing a capturing stream fails, invalidates the capture, and ending it says so; the
/// stream is not capturing afterwards and works. With `?` the synchronize error itself comes
/// back from `capture`.
#[test]
#[ignore = "needs a GPU"]
fn synchronizing_a_capturing_stream_invalidates_the_capture() {
    let Some(g) = gpu("synchronizing_a_capturing_stream_invalidates_the_capture") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();

    let mut seen = None;
    let result = capture(&stream, CaptureMode::Global, |cap| {
        let _buf = cap.malloc_async(BYTES)?;
        let sync = cap.stream().synchronize();
        seen = Some((sync, cap.status()));
        Ok(())
    });
    let (sync, status) = seen.expect("the closure ran");
    if let (Err(sync), Err(end)) = (&sync, &result) {
        println!("CASE synchronize during capture: {sync}");
        println!("CASE end of the invalidated capture: {end}");
    }
    observed(
        "synchronize during capture",
        outcome(&sync),
        "Driver(cuStreamSynchronize, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)",
    );
    observed(
        "capture status after the synchronize",
        format!("{:?}", status.unwrap()),
        "Invalidated",
    );
    observed(
        "end of the capture after the synchronize",
        outcome(&result),
        "Driver(cuStreamEndCapture, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)",
    );
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);

    let result = capture(&stream, CaptureMode::Global, |cap| {
        cap.stream().synchronize()?;
        Ok(())
    });
    observed(
        "capture whose closure returns the synchronize error with ?",
        outcome(&result),
        "Driver(cuStreamSynchronize, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)",
    );
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);

    assert_device_works(&g, &stream, "synchronize_during_capture");
    assert_released(device, "synchronize_during_capture");
}

/// Ending a capture on a stream that is not capturing. The safe guard's `end` consumes it
/// (compile-fail `capture_used_after_end`); raw, CUDA refuses; and a guard whose capture was
/// ended behind its back reports the driver's error from `end`.
#[test]
#[ignore = "needs a GPU"]
fn ending_a_capture_on_a_stream_that_is_not_capturing() {
    let Some(g) = gpu("ending_a_capture_on_a_stream_that_is_not_capturing") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();

    let mut graph = null_mut();
    // SAFETY: the stream is live; `graph` is a valid out-pointer.
    let code = unsafe { sys::cuStreamEndCapture(stream.as_raw(), &mut graph) };
    // Documented: CUDA_ERROR_ILLEGAL_STATE when the stream is not capturing.
    observed(
        "raw end of capture, not capturing: cuStreamEndCapture",
        name(code),
        "CUDA_ERROR_ILLEGAL_STATE",
    );
    assert!(graph.is_null());

    let cap = Capture::begin(&stream, CaptureMode::Global).unwrap();
    let mut stolen = null_mut();
    // SAFETY: ends the capture begun above, behind the guard's back; the graph is destroyed.
    unsafe {
        assert_eq!(
            sys::cuStreamEndCapture(stream.as_raw(), &mut stolen),
            CUresult::CUDA_SUCCESS
        );
        let _ = sys::cuGraphDestroy(stolen);
    }
    let end = cap.end();
    observed(
        "guard ended after its capture was ended elsewhere",
        outcome(&end),
        "Driver(cuStreamEndCapture, CUDA_ERROR_ILLEGAL_STATE)",
    );

    assert_device_works(&g, &stream, "end_not_capturing");
    assert_released(device, "end_not_capturing");
}

/// Beginning a capture on a stream that is already capturing is refused by the library before
/// the driver is called (`Error::InvalidArgument` from `cuStreamBeginCapture`, "already
/// capturing"), and the first capture is unharmed: still active, it ends normally and its graph,
/// launched, writes its output. Twenty runs, each on a new stream with its own value, every one
/// asserted. (When the driver itself answered the second begin, `CUDA_ERROR_ILLEGAL_STATE`, the
/// first capture's graph sometimes wrote nothing.)
#[test]
#[ignore = "needs a GPU"]
fn beginning_a_capture_twice_is_refused_and_the_first_capture_still_writes_its_output() {
    const RUNS: u32 = 20;
    let Some(g) =
        gpu("beginning_a_capture_twice_is_refused_and_the_first_capture_still_writes_its_output")
    else {
        return;
    };
    let device = &g.device;
    for run in 0..RUNS {
        let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
        let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
        let value = 1200 + run;
        let cap = Capture::begin(&stream, CaptureMode::Global).unwrap();
        // SAFETY: fill_u32 over the SMALL values of `out`.
        unsafe {
            cap.launch(
                &g.k.fill,
                config(SMALL),
                &KernelArgs::new().ptr(&out).value(SMALL).value(value),
            )
            .unwrap();
        }
        let second = Capture::begin(&stream, CaptureMode::Global).map(drop);
        let err = second.expect_err("a second capture began on a capturing stream");
        if run == 0 {
            println!("CASE second begin of capture: {err}");
        }
        assert_eq!(
            key(&err),
            "Capturing(cuStreamBeginCapture)",
            "run {run}: {err}"
        );
        assert!(
            err.to_string().contains("already capturing"),
            "run {run}: {err}"
        );
        assert_eq!(
            cap.status().unwrap(),
            CaptureStatus::Active,
            "run {run}: the first capture after the refused second begin"
        );
        let graph = cap
            .end()
            .unwrap_or_else(|e| panic!("run {run}: the first capture did not end: {e}"));
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_all(
            &out.to_vec().unwrap(),
            value,
            &format!(
                "run {run}: the first capture's graph after a refused second begin (0: it wrote nothing)"
            ),
        );
        assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);
    }

    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    assert_device_works(&g, &stream, "begin_twice");
    assert_released(device, "begin_twice");
    assert_no_drop_errors(device);
}

/// Another thread calls a capture-unsafe function (`cuMemAlloc`, through `DeviceBuffer::zeroed`)
/// while this thread captures in global mode: that call fails, and this thread's capture is
/// invalidated (ending it says so); the stream works afterwards. In thread-local mode the same
/// call succeeds and the capture is unharmed.
#[test]
#[ignore = "needs a GPU"]
fn capture_unsafe_call_from_another_thread_in_global_mode() {
    let Some(g) = gpu("capture_unsafe_call_from_another_thread_in_global_mode") else {
        return;
    };
    let device = &g.device;
    // Non-blocking, so that no legacy-stream synchronization is involved.
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();

    for mode in [CaptureMode::Global, CaptureMode::ThreadLocal] {
        let cap = Capture::begin(&stream, mode).unwrap();
        // SAFETY: fill_u32 over the SMALL values of `out`.
        unsafe {
            cap.launch(
                &g.k.fill,
                config(SMALL),
                &KernelArgs::new().ptr(&out).value(SMALL).value(31u32),
            )
            .unwrap();
        }
        let other = std::thread::scope(|s| {
            s.spawn(|| DeviceBuffer::<u32>::zeroed(device, 256).map(drop))
                .join()
                .expect("the other thread")
        });
        let status = cap.status().unwrap();
        let end = cap.end();
        if let Err(err) = &other {
            println!("CASE capture-unsafe call from another thread ({mode:?} capture): {err}");
        }
        let (expected_call, expected_status, expected_end) = match mode {
            // Observed on the H200: the other thread's call fails, and it invalidates this
            // thread's capture too.
            CaptureMode::Global => (
                "Driver(cuMemAlloc, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)",
                "Invalidated",
                "Driver(cuStreamEndCapture, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)",
            ),
            _ => ("Ok", "Active", "Ok"),
        };
        observed(
            &format!("cuMemAlloc on another thread during a {mode:?} capture"),
            outcome(&other),
            expected_call,
        );
        observed(
            &format!("the {mode:?} capture after the other thread's call"),
            format!("{status:?}"),
            expected_status,
        );
        observed(
            &format!("end of the {mode:?} capture"),
            outcome(&end),
            expected_end,
        );
        if let Ok(graph) = end {
            out.copy_from(&vec![0; SMALL as usize]).unwrap();
            let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
            exec.launch(&stream).unwrap();
            stream.synchronize().unwrap();
            assert_all(&out.to_vec().unwrap(), 31, "the capture's graph");
        }
        assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);
    }

    assert_device_works(&g, &stream, "other_thread_global_mode");
    assert_released(device, "other_thread_global_mode");
}

/// Dropping a stream-ordered allocation while its stream is capturing (the trap cudarc hit): the
/// free is not captured into the graph; it is queued when the capture ends, and the memory goes
/// back to the pool. Allocating one on a capturing stream is refused.
#[test]
#[ignore = "needs a GPU"]
fn dropping_a_stream_allocation_while_its_stream_is_capturing() {
    let Some(g) = gpu("dropping_a_stream_allocation_while_its_stream_is_capturing") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    stream.synchronize().unwrap();
    let used_before = default_pool_used(device);
    let live_before = live_objects();

    let a = StreamAllocation::new(&stream, BYTES).unwrap();
    // SAFETY: fill_u32 over the N values of `a` (BYTES = 4 N), on its stream.
    unsafe {
        g.k.fill
            .launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&a).value(N).value(2u32),
            )
            .unwrap();
    }
    stream.synchronize().unwrap();
    assert!(default_pool_used(device) >= used_before + BYTES as u64);

    let (graph, ()) = capture(&stream, CaptureMode::Global, |cap| {
        // SAFETY: copy_u32 of SMALL values from `a` (alive while the capture records) to `out`;
        // the captured graph is not launched (its source is freed below).
        unsafe {
            cap.launch(
                &g.k.copy,
                config(SMALL),
                &KernelArgs::new().ptr(&out).ptr(&a).value(SMALL),
            )?;
        }
        let err = StreamAllocation::new(cap.stream(), BYTES).unwrap_err();
        println!("CASE stream allocation on a capturing stream: {err}");
        assert!(
            matches!(
                &err,
                Error::Capturing {
                    call: "cuMemAllocAsync",
                    ..
                }
            ),
            "expected cuMemAllocAsync to be refused as Capturing: {err:?}"
        );
        assert_eq!(err.code(), None, "our own checks carry no CUDA code");
        drop(a);
        Ok(())
    })
    .unwrap();
    let kinds: Vec<_> = graph.nodes().iter().map(|n| n.kind().clone()).collect();
    println!("captured nodes: {kinds:?}");
    assert!(
        !kinds.contains(&NodeKind::MemFree),
        "the drop during capture must not capture a free node"
    );
    drop(graph);
    stream.synchronize().unwrap();
    assert_eq!(
        default_pool_used(device),
        used_before,
        "the deferred free ran after the capture ended"
    );
    assert_eq!(
        live_objects().stream_allocations,
        live_before.stream_allocations
    );

    // The same drop on a second stream that joined the capture through `fork`.
    let stream2 = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let b = StreamAllocation::new(&stream2, BYTES).unwrap();
    stream2.synchronize().unwrap();
    let (graph, ()) = capture(&stream, CaptureMode::Global, |cap| {
        cap.fork(&stream2)?;
        assert_eq!(stream2.capture_status()?, CaptureStatus::Active);
        drop(b);
        cap.join(&stream2)
    })
    .unwrap();
    assert!(!graph.nodes().iter().any(|n| n.kind() == NodeKind::MemFree));
    drop(graph);
    stream.synchronize().unwrap();
    stream2.synchronize().unwrap();
    let leaked = default_pool_used(device) - used_before;
    println!(
        "OBSERVED forked stream: {leaked} B of the dropped allocation still in use after the capture ended"
    );
    assert_eq!(default_pool_used(device), used_before);

    assert_device_works(&g, &stream, "stream_allocation_drop_during_capture");
    assert_released(device, "stream_allocation_drop_during_capture");
}

/// A panic inside the capture closure: the capture is ended, its graph discarded, the panic
/// continues to the caller, nothing leaks, and the stream works. An error with `?` likewise.
#[test]
#[ignore = "needs a GPU"]
fn panic_inside_a_capture_closure() {
    let Some(g) = gpu("panic_inside_a_capture_closure") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let side = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let before = live_objects();

    let caught: std::thread::Result<cuda_graph::Result<(Graph, ())>> =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            capture(&stream, CaptureMode::Global, |cap| {
                let buf = cap.malloc_async(BYTES)?;
                // SAFETY: fill_u32 over the SMALL values of `buf`.
                unsafe {
                    cap.launch(
                        &g.k.fill,
                        config(SMALL),
                        &KernelArgs::new().ptr(&buf).value(SMALL).value(1u32),
                    )?;
                }
                // A forked stream too, left unjoined by the panic.
                cap.fork(&side)?;
                panic!("boom inside the capture");
            })
        }));
    let payload = caught.expect_err("the panic reaches the caller");
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    println!("CASE panic inside capture: caught '{message}'");
    assert!(message.contains("boom"));
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);
    observed(
        "the forked stream after the panic ended the capture",
        format!("{:?}", side.capture_status().unwrap()),
        "None",
    );
    assert_eq!(live_objects(), before, "nothing leaked by the panic");

    let err = capture(&stream, CaptureMode::Global, |cap| {
        let _buf = cap.malloc_async(BYTES)?;
        Err::<(), _>(Error::InvalidArgument {
            call: "test",
            reason: "an early return".into(),
        })
    })
    .unwrap_err();
    assert_invalid(&err, "test");
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);
    assert_eq!(live_objects(), before);

    drop(out);
    assert_device_works(&g, &stream, "panic_in_capture");
    assert_device_works(&g, &side, "panic_in_capture (forked stream)");
    assert_released(device, "panic_in_capture");
}

// ---------------------------------------------------------------------------------------------
// Devices and streams
// ---------------------------------------------------------------------------------------------

/// An invalid device ordinal: refused by our layer; raw, `cuDeviceGet` says invalid device.
#[test]
#[ignore = "needs a GPU"]
fn invalid_device_ordinal() {
    let Some(g) = gpu("invalid_device_ordinal") else {
        return;
    };
    let count = cuda_graph::device_count().unwrap();
    for ordinal in [count, count + 7, usize::MAX] {
        let err = Device::get(ordinal).unwrap_err();
        println!("CASE device ordinal {ordinal}: {err}");
        let reason = assert_invalid(&err, "Device::get");
        assert!(reason.contains("does not exist"), "{reason}");
    }
    for ordinal in [count as i32, -1] {
        let mut device = 0;
        // SAFETY: `device` is a valid out-pointer; the driver validates the ordinal.
        let code = unsafe { sys::cuDeviceGet(&mut device, ordinal) };
        // Documented: CUDA_ERROR_INVALID_DEVICE.
        observed(
            &format!("raw device ordinal {ordinal}: cuDeviceGet"),
            name(code),
            "CUDA_ERROR_INVALID_DEVICE",
        );
    }
    let stream = Stream::new(&g.device).unwrap();
    assert_device_works(&g, &stream, "invalid_ordinal");
}

/// A graph of device 1 launched on a stream of device 0. `ExecGraph::launch` does not compare
/// the stream's device with the graph's: it passes the launch to CUDA and returns CUDA's answer,
/// which its docs leave open. What the library guarantees either way, and what this test
/// asserts: when the launch is accepted, it is stream work like any other, so once stream 0 has
/// synchronized the graph has run and its output (on device 1) is there; when it is refused,
/// the error is CUDA's, from `cuGraphLaunch`, and nothing ran (the output is still zero). Either
/// way both devices still work afterwards and no error was met in `Drop`. CUDA's answer is
/// printed with the driver version.
///
/// Needs two GPUs: with one it prints `SKIPPED` and passes, except under
/// `CUDA_GRAPH_REQUIRE_GPU=1`, where it fails (the GPU runner excludes it by name on a one-GPU
/// machine: it is listed in `ci/needs-two-gpus.txt`).
#[test]
#[ignore = "needs a GPU"]
fn graph_of_one_device_launched_on_a_stream_of_another() {
    const NAME: &str = "graph_of_one_device_launched_on_a_stream_of_another";
    // Before the GPU probe, so that a run without a GPU already catches an unlisted name.
    cuda_graph_tests::assert_listed_two_gpu_test(NAME, 2);
    let Some(g) = gpu(NAME) else {
        return;
    };
    let count = cuda_graph::device_count().unwrap();
    if !cuda_graph_tests::enough_gpus(NAME, 2, count) {
        return;
    }
    let device = &g.device;
    let stream0 = Stream::new(device).unwrap();
    let other = Device::get(1).unwrap();
    let module = cuda_graph::Module::from_ptx(&other, cuda_graph::kernels::PTX).unwrap();
    let fill = module.function("fill_u32").unwrap();
    let copy = module.function("copy_u32").unwrap();
    let out1 = DeviceBuffer::<u32>::zeroed(&other, SMALL as usize).unwrap();
    let mut graph = Graph::new(&other).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(&other, BYTES))
        .unwrap();
    // SAFETY: fill_u32 over the SMALL values of `buf`, copy_u32 of them into `out1`; both
    // between the alloc and free nodes.
    unsafe {
        let f = graph
            .add_kernel_node(
                &[alloc],
                &fill,
                config(SMALL),
                &KernelArgs::new().ptr(&buf).value(SMALL).value(44u32),
            )
            .unwrap();
        let c = graph
            .add_kernel_node(
                &[f],
                &copy,
                config(SMALL),
                &KernelArgs::new().ptr(&out1).ptr(&buf).value(SMALL),
            )
            .unwrap();
        graph.add_mem_free_node(&[c], &buf).unwrap();
    }
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    let result = exec.launch(&stream0);
    println!(
        "OBSERVED graph of device 1 launched on a stream of device 0 (driver {:?}): {}",
        cuda_graph_tests::probe_gpu().map(|gpu| gpu.driver_version),
        outcome(&result)
    );
    stream0
        .synchronize()
        .expect("stream 0 after the cross-device launch");
    let written = out1.to_vec().unwrap();
    match &result {
        Ok(()) => assert_all(
            &written,
            44,
            "an accepted cross-device launch, after its stream synchronized",
        ),
        Err(err) => {
            assert!(
                matches!(
                    err,
                    Error::Driver(DriverError {
                        call: "cuGraphLaunch",
                        ..
                    })
                ),
                "a refused cross-device launch must carry CUDA's error from cuGraphLaunch: {err:?}"
            );
            assert_all(&written, 0, "a refused cross-device launch ran nothing");
        }
    }
    drop((exec, graph, buf));
    other.synchronize().unwrap();

    // Device 1 works: the same kernels on a stream of its own.
    let stream1 = Stream::new(&other).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(&other, SMALL as usize).unwrap();
    // SAFETY: fill_u32 over the SMALL values of `out`.
    unsafe {
        fill.launch(
            &stream1,
            config(SMALL),
            &KernelArgs::new().ptr(&out).value(SMALL).value(45u32),
        )
    }
    .unwrap();
    stream1.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        45,
        "device 1 after the cross-device launch",
    );
    assert_device_works(&g, &stream0, "cross_device");
    assert_released(device, "cross_device, device 0");
    assert_released(&other, "cross_device, device 1");
    assert_no_drop_errors(device);
    assert_no_drop_errors(&other);
}

// ---------------------------------------------------------------------------------------------
// Our own checks
// ---------------------------------------------------------------------------------------------

/// G.3.1's node `e`, which uses the allocation without being ordered after its alloc node, is
/// refused at instantiation with an error that names it.
#[test]
#[ignore = "needs a GPU"]
fn lifetime_violation_is_refused_before_instantiation() {
    let Some(g) = gpu("lifetime_violation_is_refused_before_instantiation") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let (mut graph, x, copy) = escaping_graph(&g, &out, "x", 1);
    let free = graph.add_mem_free_node(&[copy], &x).unwrap();
    // SAFETY: never launched: the check refuses the graph.
    let e = unsafe {
        graph.add_kernel_node(
            &[],
            &g.k.fill,
            config(SMALL),
            &KernelArgs::new().ptr(&x).value(SMALL).value(0u32),
        )
    }
    .unwrap();
    graph.set_label(e, "e").unwrap();
    let err = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
    println!("CASE G.3.1 node e: {err}");
    assert_lifetime(&err, Rule::NotAfterAlloc);
    assert!(err.to_string().contains("node 'e'"), "{err}");
    if let Error::Lifetime(l) = &err {
        let v = l
            .violations
            .iter()
            .find(|v| v.rule == Rule::NotAfterAlloc)
            .unwrap();
        assert_eq!(v.node.index, e.index());
        assert_eq!(v.missing_edge, Some((0, e.index())));
        assert!(l.violations.iter().all(|v| v.node.index == e.index()));
        assert_ne!(free.index(), e.index());
    }
    drop((graph, x));
    assert_device_works(&g, &stream, "lifetime_violation");
    assert_released(device, "lifetime_violation");
}

/// `free_async` of an allocation that is not live (never launched, or freed already), or on a
/// capturing stream; a consumer graph launched before its producer; dependencies on nodes of
/// another graph or listed twice: each refused by our layer before the driver.
#[test]
#[ignore = "needs a GPU"]
fn misuses_our_layer_refuses_before_the_driver() {
    let Some(g) = gpu("misuses_our_layer_refuses_before_the_driver") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let stream2 = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let out2 = DeviceBuffer::<u32>::zeroed(device, SMALL as usize).unwrap();
    let (producer, x, _) = escaping_graph(&g, &out, "x", 21);

    let err = x.free_async(&stream).unwrap_err();
    println!("CASE free_async before any launch: {err}");
    assert_not_live(&err, "GraphAllocation::free_async", &x);

    let mut consumer = Graph::new(device).unwrap();
    // SAFETY: copy_u32 of SMALL values from `x` (live after the producer's launch) into `out2`.
    unsafe {
        consumer
            .add_kernel_node(
                &[],
                &g.k.copy,
                config(SMALL),
                &KernelArgs::new().ptr(&out2).ptr(&x).value(SMALL),
            )
            .unwrap();
    }
    let producer_exec = producer.instantiate(InstantiateFlags::NONE).unwrap();
    let consumer_exec = consumer.instantiate(InstantiateFlags::NONE).unwrap();
    let err = consumer_exec.launch(&stream).unwrap_err();
    println!("CASE consumer launched before its producer: {err}");
    assert_not_live(&err, "ExecGraph::launch", &x);

    producer_exec.launch(&stream).unwrap();
    consumer_exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&out2.to_vec().unwrap(), 21, "consumer after producer");

    let err = capture(&stream2, CaptureMode::Global, |cap| {
        x.free_async(cap.stream())
    })
    .unwrap_err();
    println!("CASE free_async on a capturing stream: {err}");
    assert_eq!(key(&err), "Capturing(GraphAllocation::free_async)", "{err}");
    assert_eq!(stream2.capture_status().unwrap(), CaptureStatus::None);
    assert!(x.is_live(), "the refused free changed nothing");

    x.free_async(&stream).unwrap();
    let err = x.free_async(&stream).unwrap_err();
    assert_not_live(&err, "GraphAllocation::free_async", &x);
    let err = consumer_exec.launch(&stream).unwrap_err();
    assert_not_live(&err, "ExecGraph::launch", &x);

    let mut a = Graph::new(device).unwrap();
    let node_of_a = a.add_empty_node(&[]).unwrap();
    let mut b = Graph::new(device).unwrap();
    let err = b.add_empty_node(&[node_of_a]).unwrap_err();
    println!("CASE dependency on a node of another graph: {err}");
    assert_invalid(&err, "cuGraphAddEmptyNode");
    let err = b.add_dependency(node_of_a, node_of_a).unwrap_err();
    assert_invalid(&err, "cuGraphAddDependencies");
    let first = b.add_empty_node(&[]).unwrap();
    let err = b.add_empty_node(&[first, first]).unwrap_err();
    assert!(assert_invalid(&err, "cuGraphAddEmptyNode").contains("twice"));

    drop((producer_exec, consumer_exec, producer, consumer, x, a, b));
    assert_device_works(&g, &stream, "our_checks");
    assert_released(device, "our_checks");
}

/// A graph with one alloc node of `BYTES` and a fill of every word with `value` after it, no
/// free node: each launch leaves the allocation live (G.3.3).
fn filled_allocation(g: &Gpu, value: u32, label: &str) -> (Graph, GraphAllocation) {
    let device = &g.device;
    let mut graph = Graph::new(device).expect("cuGraphCreate");
    let (alloc, a) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label(label))
        .expect("alloc node");
    let args = KernelArgs::new().ptr(&a).value(N).value(value);
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the N words of `a`,
    // after its alloc node.
    unsafe { graph.add_kernel_node(&[alloc], &g.k.fill, config(N), &args) }.expect("kernel node");
    (graph, a)
}

/// Dropping every handle of an escaped allocation while a consumer graph that reads it is still
/// queued: the RAII free waits for that launch. The producer fills the allocation with `VALUE`;
/// the consumer graph, launched on a second stream, spins about 50 ms and then copies every word
/// into `out`. Right after the consumer's launch the producer's and the consumer's graphs, their
/// executable graphs and the allocation's handle are dropped; 10 ms later a probe graph
/// allocates the same size on the first stream and fills it with the pattern (an early free
/// hands it the allocation's memory), and after it graph memory is trimmed (an early free lets
/// the trim unmap it). The consumer's stream must then synchronize without error and `out`
/// must hold `VALUE` in every word. Control: the same with a clone of the handle kept until the
/// consumer is done.
#[test]
#[ignore = "needs a GPU"]
fn dropping_an_allocation_while_a_consumer_graph_runs_frees_it_after_the_consumer() {
    const VALUE: u32 = 0x7700_0077;
    let Some(g) =
        gpu("dropping_an_allocation_while_a_consumer_graph_runs_frees_it_after_the_consumer")
    else {
        return;
    };
    let device = &g.device;
    let s1 = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let s2 = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let live_start = live_objects();
    let (probe_graph, probe_allocation) = filled_allocation(&g, probe::PATTERN, "probe");
    let probe_exec = probe_graph.instantiate(InstantiateFlags::NONE).unwrap();

    for keep_alive in [true, false] {
        let case = if keep_alive {
            "control (a handle kept)"
        } else {
            "every handle dropped"
        };
        out.copy_from(&vec![0; N as usize]).unwrap();
        let (producer, x) = filled_allocation(&g, VALUE, "x");
        let mut consumer = Graph::new(device).unwrap();
        let spin = probe::add_spin_node(&mut consumer, &[], &g.k.spin_then_fill, probe::SPIN_50_MS);
        // SAFETY: copy_u32(unsigned* dst, const unsigned* src, unsigned long long n) over the N
        // words of `out` and of `x`, which the library keeps allocated until the graph is done.
        unsafe {
            consumer.add_kernel_node(
                &[spin],
                &g.k.copy,
                config(N),
                &KernelArgs::new().ptr(&out).ptr(&x).value(N),
            )
        }
        .unwrap();
        let producer_exec = producer.instantiate(InstantiateFlags::NONE).unwrap();
        let consumer_exec = consumer.instantiate(InstantiateFlags::NONE).unwrap();
        producer_exec.launch(&s1).unwrap();
        s1.synchronize().unwrap();
        let freed = x.ptr();

        consumer_exec.launch(&s2).unwrap();
        let kept = keep_alive.then(|| x.clone());
        drop((consumer_exec, consumer, producer_exec, producer, x));
        std::thread::sleep(std::time::Duration::from_millis(10));
        probe_exec.launch(&s1).unwrap();
        s1.synchronize().unwrap();
        device.graph_mem_trim().unwrap();
        let consumer_done = s2.synchronize();
        println!(
            "{case}: the probe's allocation at {:#x}, the dropped one at {freed:#x}; the consumer's stream: {consumer_done:?}",
            probe_allocation.ptr()
        );
        consumer_done.unwrap_or_else(|e| {
            panic!("{case}: the consumer read freed, trimmed graph memory: {e}")
        });
        assert_all(
            &out.to_vec().unwrap(),
            VALUE,
            &format!(
                "{case}: the consumer's copy ({:#x}: the probe's pattern, read through a freed allocation)",
                probe::PATTERN
            ),
        );
        if let Some(x) = kept {
            x.free_async(&s1).unwrap();
        }
        probe_allocation.free_async(&s1).unwrap();
        s1.synchronize().unwrap();
    }
    drop((probe_exec, probe_graph, probe_allocation));
    assert_eq!(
        settle(device, live_start),
        live_start,
        "objects of the crate still live after every graph and handle was dropped"
    );
    assert_device_works(&g, &s1, "raii_free_and_consumer_graph");
    assert_released(device, "raii_free_and_consumer_graph");
    assert_no_drop_errors(device);
}
