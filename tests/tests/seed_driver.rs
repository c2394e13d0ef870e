//! The rules of `cuGraphAddMemAllocNode` (the driver API reference's entry for it) in the driver
//! API, in raw FFI, with the test kernels loaded by `cuModuleLoadData`:
//!
//! - the allocation's address (`nodeParams.dptr`) stays fixed across launches and across
//!   instantiations;
//! - an allocation not freed in its graph outlives the launch, blocks a relaunch until it is freed,
//!   and is freed by `cuMemFreeAsync`;
//! - a graph with memory nodes cannot be cloned, cannot have a second instantiation while one
//!   exists, and its nodes cannot be deleted;
//! - an allocation is freed once, in one graph: not in another graph when its own graph frees it,
//!   and not in its own graph when another graph frees it.
//!
//! The error codes asserted are the ones the driver returns (seen on an H200 with driver 580.159.04,
//! CUDA 13.0): `CUDA_ERROR_NOT_SUPPORTED` for cloning, a second instantiation and deleting a node;
//! `CUDA_ERROR_INVALID_VALUE` for a second free and for relaunching with an allocation unfreed. The
//! documentation names no code for these; each test prints the call and the code it got.
//!
//! Each test skips (prints `SKIPPED ...`) without a GPU, and fails instead with
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Every test frees and destroys what it creates.

use std::ptr::{null, null_mut};

use cuda_graph_sys::*;
use cuda_graph_tests::{
    Args, DriverContext, DriverKernels, assert_iota, driver_alloc_node_params, driver_kernel_node,
    driver_read_u32, drv, drv_expect, require_gpu,
};

/// Elements of each allocation (4 MiB of `u32`).
const N: usize = 1 << 20;
/// Bytes of each allocation.
const SIZE: usize = N * 4;

/// The code the driver returns for `cuGraphClone` of a graph with memory nodes.
const CLONE_ERROR: CUresult = CUresult::CUDA_ERROR_NOT_SUPPORTED;
/// The code for a second `cuGraphInstantiate` while an executable graph of it exists
/// (`cuGraphInstantiateWithParams` reports `result_out` = `CUDA_GRAPH_INSTANTIATE_ERROR`).
const SECOND_INSTANTIATION_ERROR: CUresult = CUresult::CUDA_ERROR_NOT_SUPPORTED;
/// The code for `cuGraphDestroyNode` on a node of a graph with memory nodes.
const DESTROY_NODE_ERROR: CUresult = CUresult::CUDA_ERROR_NOT_SUPPORTED;
/// The code for a free node that would free an allocation a second time, or in a second graph.
const SECOND_FREE_ERROR: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;

/// What every test needs: the primary context of device 0, current, and the kernels. Fields drop
/// in order: the module is unloaded while the context is still current.
struct Fixture {
    kernels: DriverKernels,
    stream: CUstream,
    ctx: DriverContext,
}

impl Fixture {
    fn new() -> Self {
        let ctx = DriverContext::primary(0);
        let kernels = DriverKernels::load();
        let mut stream = null_mut();
        // SAFETY: valid out-pointer; the stream is destroyed in Drop.
        unsafe {
            drv!(cuStreamCreate(
                &mut stream,
                CUstream_flags::CU_STREAM_NON_BLOCKING.0
            ));
        }
        Fixture {
            kernels,
            stream,
            ctx,
        }
    }

    /// A new empty graph.
    fn graph(&self) -> CUgraph {
        let mut g = null_mut();
        // SAFETY: valid out-pointer; the caller destroys the graph.
        unsafe { drv!(cuGraphCreate(&mut g, 0)) };
        g
    }

    /// Adds an alloc node of `SIZE` bytes on this device, after `deps`; returns it and the address.
    ///
    /// # Safety
    /// `graph` and `deps` are valid.
    unsafe fn alloc(&self, graph: CUgraph, deps: &[CUgraphNode]) -> (CUgraphNode, CUdeviceptr) {
        let mut params = driver_alloc_node_params(self.ctx.device, SIZE);
        let mut node = null_mut();
        // SAFETY: the caller guarantees graph and deps; `params` is valid for the call.
        unsafe {
            drv!(cuGraphAddMemAllocNode(
                &mut node,
                graph,
                deps.as_ptr(),
                deps.len(),
                &mut params
            ));
        }
        assert_ne!(params.dptr, 0, "cuGraphAddMemAllocNode returned no address");
        (node, params.dptr)
    }

    /// Adds a free node for `dptr` after `deps`.
    ///
    /// # Safety
    /// `graph` and `deps` are valid.
    unsafe fn free(&self, graph: CUgraph, deps: &[CUgraphNode], dptr: CUdeviceptr) -> CUgraphNode {
        let mut node = null_mut();
        // SAFETY: the caller guarantees graph and deps.
        unsafe {
            drv!(cuGraphAddMemFreeNode(
                &mut node,
                graph,
                deps.as_ptr(),
                deps.len(),
                dptr
            ))
        };
        node
    }

    /// Adds a kernel node `iota_u32(dptr, N, base)` after `deps`.
    ///
    /// # Safety
    /// `graph` and `deps` are valid; `dptr` is valid for `N` u32 when the node runs.
    unsafe fn iota(
        &self,
        graph: CUgraph,
        deps: &[CUgraphNode],
        dptr: CUdeviceptr,
        base: u32,
    ) -> CUgraphNode {
        let mut args = Args::new().dptr(dptr).u64(N as u64).u32(base);
        let params = driver_kernel_node(self.kernels.iota_u32, N, &mut args);
        let mut node = null_mut();
        // SAFETY: the caller guarantees graph, deps and dptr; params and args outlive the call.
        unsafe {
            drv!(cuGraphAddKernelNode(
                &mut node,
                graph,
                deps.as_ptr(),
                deps.len(),
                &params
            ))
        };
        node
    }

    /// Instantiates `graph` with no flags.
    ///
    /// # Safety
    /// `graph` is valid.
    unsafe fn instantiate(&self, graph: CUgraph) -> CUgraphExec {
        let mut exec = null_mut();
        // SAFETY: the caller guarantees graph; valid out-pointer.
        unsafe { drv!(cuGraphInstantiate(&mut exec, graph, 0)) };
        exec
    }

    /// Launches `exec` into the fixture's stream and waits for it.
    ///
    /// # Safety
    /// `exec` is valid and may be launched.
    unsafe fn launch_and_wait(&self, exec: CUgraphExec) {
        // SAFETY: the caller guarantees exec.
        unsafe {
            drv!(cuGraphLaunch(exec, self.stream));
            drv!(cuStreamSynchronize(self.stream));
        }
    }

    /// The address an alloc node reports now (`cuGraphMemAllocNodeGetParams`).
    ///
    /// # Safety
    /// `node` is a valid alloc node.
    unsafe fn node_dptr(&self, node: CUgraphNode) -> CUdeviceptr {
        let mut p = CUDA_MEM_ALLOC_NODE_PARAMS::default();
        // SAFETY: the caller guarantees node; valid out-pointer.
        unsafe { drv!(cuGraphMemAllocNodeGetParams(node, &mut p)) };
        p.dptr
    }

    /// Frees `dptr` in stream order (`cuMemFreeAsync`) and waits.
    ///
    /// # Safety
    /// `dptr` is a live allocation no pending work still uses.
    unsafe fn free_async_and_wait(&self, dptr: CUdeviceptr) {
        // SAFETY: the caller guarantees dptr.
        unsafe {
            drv!(cuMemFreeAsync(dptr, self.stream));
            drv!(cuStreamSynchronize(self.stream));
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SAFETY: the stream was created in `new` and is destroyed once.
        unsafe {
            let _ = cuStreamSynchronize(self.stream);
            let _ = cuStreamDestroy(self.stream);
        }
    }
}

/// "The allocation's address remains fixed across instantiations and launches": a graph that
/// allocates and writes (iota) without freeing. Each launch's data is read back at the address
/// the node returned at creation, then the memory is zeroed and freed with `cuMemFreeAsync`; the
/// next launch writes it again at the same address. The first executable graph is destroyed before
/// the second instantiation; the node reports the same address throughout.
#[test]
#[ignore = "needs a GPU"]
fn alloc_address_fixed_across_launches_and_instantiations() {
    const TEST: &str = "alloc_address_fixed_across_launches_and_instantiations";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let f = Fixture::new();

    // SAFETY: handles are created before use and destroyed once; the allocation is read and freed
    // in stream order after each launch that allocates it.
    unsafe {
        let graph = f.graph();
        let (alloc, dptr) = f.alloc(graph, &[]);
        f.iota(graph, &[alloc], dptr, 11);

        let check = |label: &str| {
            assert_iota(&driver_read_u32(dptr, N), 11, label);
            drv!(cuMemsetD32Async(dptr, 0, N, f.stream));
            f.free_async_and_wait(dptr);
        };

        let exec1 = f.instantiate(graph);
        assert_eq!(
            f.node_dptr(alloc),
            dptr,
            "address after the first instantiation"
        );
        for launch in 1..=2 {
            f.launch_and_wait(exec1);
            check(&format!(
                "instantiation 1, launch {launch}: data at {dptr:#x}"
            ));
        }
        drv!(cuGraphExecDestroy(exec1));

        let exec2 = f.instantiate(graph);
        assert_eq!(
            f.node_dptr(alloc),
            dptr,
            "address after the second instantiation"
        );
        for launch in 1..=2 {
            f.launch_and_wait(exec2);
            check(&format!(
                "instantiation 2, launch {launch}: data at {dptr:#x}"
            ));
        }
        println!("allocation stayed at {dptr:#x} over 2 instantiations x 2 launches");
        drv!(cuGraphExecDestroy(exec2));
        drv!(cuGraphDestroy(graph));
    }
}

/// An allocation not freed in its graph outlives the launch: stream work reads it after the
/// launch; relaunching the (regularly instantiated) graph before it is freed fails with
/// `CUDA_ERROR_INVALID_VALUE`; `cuMemFreeAsync` frees it, after which the graph launches again.
#[test]
#[ignore = "needs a GPU"]
fn unfreed_allocation_outlives_launch_and_is_freed_by_cu_mem_free_async() {
    const TEST: &str = "unfreed_allocation_outlives_launch_and_is_freed_by_cu_mem_free_async";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let f = Fixture::new();

    // SAFETY: handles are created before use and destroyed once; the allocation is read after the
    // launch and freed once per launch.
    unsafe {
        let graph = f.graph();
        let (alloc, dptr) = f.alloc(graph, &[]);
        f.iota(graph, &[alloc], dptr, 500);
        let exec = f.instantiate(graph);

        f.launch_and_wait(exec);
        assert_iota(
            &driver_read_u32(dptr, N),
            500,
            "allocation read after the launch",
        );
        drv_expect!(
            cuGraphLaunch(exec, f.stream),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );

        f.free_async_and_wait(dptr);
        f.launch_and_wait(exec);
        assert_iota(&driver_read_u32(dptr, N), 500, "allocation after relaunch");
        f.free_async_and_wait(dptr);

        drv!(cuGraphExecDestroy(exec));
        drv!(cuGraphDestroy(graph));
    }
}

/// "The graph cannot be cloned": `cuGraphClone` of a graph with an alloc and a free node, and of a
/// graph with only an (unfreed) alloc node, fails with [`CLONE_ERROR`]; a graph of the same kernel
/// without memory nodes clones.
#[test]
#[ignore = "needs a GPU"]
fn clone_of_graph_with_memory_nodes_fails() {
    const TEST: &str = "clone_of_graph_with_memory_nodes_fails";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let f = Fixture::new();

    // SAFETY: graphs are created before use and destroyed once; nothing is launched except the
    // control graph, which writes a cuMemAlloc'd buffer.
    unsafe {
        // Control: no memory nodes.
        let mut buffer: CUdeviceptr = 0;
        drv!(cuMemAlloc(&mut buffer, SIZE));
        let plain = f.graph();
        f.iota(plain, &[], buffer, 1);
        let mut clone = null_mut();
        drv!(cuGraphClone(&mut clone, plain));
        drv!(cuGraphDestroy(clone));
        drv!(cuGraphDestroy(plain));
        drv!(cuMemFree(buffer));

        // Alloc → kernel → free.
        let graph = f.graph();
        let (alloc, dptr) = f.alloc(graph, &[]);
        let k = f.iota(graph, &[alloc], dptr, 1);
        f.free(graph, &[k], dptr);
        let mut clone = null_mut();
        drv_expect!(cuGraphClone(&mut clone, graph), CLONE_ERROR);
        drv!(cuGraphDestroy(graph));

        // Alloc only.
        let graph = f.graph();
        f.alloc(graph, &[]);
        let mut clone = null_mut();
        drv_expect!(cuGraphClone(&mut clone, graph), CLONE_ERROR);
        drv!(cuGraphDestroy(graph));
    }
}

/// "Only one instantiation of the graph may exist at any point in time": a second
/// `cuGraphInstantiate` while the first executable graph exists fails with
/// [`SECOND_INSTANTIATION_ERROR`], and so does `cuGraphInstantiateWithParams`, with `result_out`
/// `CUDA_GRAPH_INSTANTIATE_ERROR`; after `cuGraphExecDestroy` of the first, instantiation succeeds and launches.
#[test]
#[ignore = "needs a GPU"]
fn second_instantiation_fails_while_first_exists() {
    const TEST: &str = "second_instantiation_fails_while_first_exists";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let f = Fixture::new();

    // SAFETY: handles are created before use and destroyed once; the graph allocates and frees
    // its own memory, so it launches freely.
    unsafe {
        let graph = f.graph();
        let (alloc, dptr) = f.alloc(graph, &[]);
        let k = f.iota(graph, &[alloc], dptr, 1);
        f.free(graph, &[k], dptr);

        let exec1 = f.instantiate(graph);
        let mut exec2: CUgraphExec = null_mut();
        drv_expect!(
            cuGraphInstantiate(&mut exec2, graph, 0),
            SECOND_INSTANTIATION_ERROR
        );
        assert!(exec2.is_null(), "no executable graph is returned");

        let mut params = CUDA_GRAPH_INSTANTIATE_PARAMS::default();
        let r = cuGraphInstantiateWithParams(&mut exec2, graph, &mut params);
        println!(
            "cuGraphInstantiateWithParams (second) -> {}, result_out {:?}",
            cuda_graph_tests::driver_error_name(r),
            params.result_out
        );
        assert_eq!(
            r, SECOND_INSTANTIATION_ERROR,
            "second instantiation with params"
        );
        assert_eq!(
            params.result_out,
            CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR
        );

        f.launch_and_wait(exec1);
        drv!(cuGraphExecDestroy(exec1));
        let exec2 = f.instantiate(graph);
        f.launch_and_wait(exec2);
        drv!(cuGraphExecDestroy(exec2));
        drv!(cuGraphDestroy(graph));
    }
}

/// "Nodes and edges of the graph cannot be deleted": `cuGraphDestroyNode` of the alloc node, of
/// the free node and of a kernel node in a graph with memory nodes each fails with
/// [`DESTROY_NODE_ERROR`]; the graph still instantiates and runs afterwards. Control: a kernel
/// node of a graph without memory nodes is destroyed.
#[test]
#[ignore = "needs a GPU"]
fn destroying_nodes_of_graph_with_memory_nodes_fails() {
    const TEST: &str = "destroying_nodes_of_graph_with_memory_nodes_fails";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let f = Fixture::new();

    // SAFETY: handles are created before use and destroyed once; the graph allocates and frees
    // its own memory.
    unsafe {
        // Control: no memory nodes.
        let plain = f.graph();
        let mut empty = null_mut();
        drv!(cuGraphAddEmptyNode(&mut empty, plain, null(), 0));
        drv!(cuGraphDestroyNode(empty));
        drv!(cuGraphDestroy(plain));

        let graph = f.graph();
        let (alloc, dptr) = f.alloc(graph, &[]);
        let k = f.iota(graph, &[alloc], dptr, 1);
        let free = f.free(graph, &[k], dptr);
        drv_expect!(cuGraphDestroyNode(alloc), DESTROY_NODE_ERROR);
        drv_expect!(cuGraphDestroyNode(free), DESTROY_NODE_ERROR);
        drv_expect!(cuGraphDestroyNode(k), DESTROY_NODE_ERROR);

        let exec = f.instantiate(graph);
        f.launch_and_wait(exec);
        drv!(cuGraphExecDestroy(exec));
        drv!(cuGraphDestroy(graph));
    }
}

/// An allocation is freed once, in one graph:
/// - freed in its own graph: a free node for it in a second graph fails, and so does a second free
///   node in its own graph ([`SECOND_FREE_ERROR`]);
/// - freed in another graph (allowed while its own graph does not free it): a free node in its own
///   graph then fails ([`SECOND_FREE_ERROR`]); launching the allocating graph and then the freeing
///   graph in one stream works, and the allocating graph relaunches after that.
#[test]
#[ignore = "needs a GPU"]
fn free_node_rules_across_graphs() {
    const TEST: &str = "free_node_rules_across_graphs";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let f = Fixture::new();

    // SAFETY: handles are created before use and destroyed once; the allocation freed by the other
    // graph is used only between the two launches, in one stream.
    unsafe {
        // Freed in its own graph.
        let owner = f.graph();
        let (alloc, dptr) = f.alloc(owner, &[]);
        let k = f.iota(owner, &[alloc], dptr, 1);
        let free = f.free(owner, &[k], dptr);
        let other = f.graph();
        let mut node = null_mut();
        drv_expect!(
            cuGraphAddMemFreeNode(&mut node, other, null(), 0, dptr),
            SECOND_FREE_ERROR
        );
        drv_expect!(
            cuGraphAddMemFreeNode(&mut node, owner, &free, 1, dptr),
            SECOND_FREE_ERROR
        );
        drv!(cuGraphDestroy(other));
        drv!(cuGraphDestroy(owner));

        // Freed in another graph.
        let owner = f.graph();
        let (alloc, dptr) = f.alloc(owner, &[]);
        let k = f.iota(owner, &[alloc], dptr, 77);
        let freeing = f.graph();
        f.free(freeing, &[], dptr);
        drv_expect!(
            cuGraphAddMemFreeNode(&mut node, owner, &k, 1, dptr),
            SECOND_FREE_ERROR
        );

        let owner_exec = f.instantiate(owner);
        let freeing_exec = f.instantiate(freeing);
        for _ in 0..2 {
            f.launch_and_wait(owner_exec);
            assert_iota(
                &driver_read_u32(dptr, N),
                77,
                "allocation freed by another graph",
            );
            f.launch_and_wait(freeing_exec);
        }
        drv!(cuGraphExecDestroy(owner_exec));
        drv!(cuGraphExecDestroy(freeing_exec));
        drv!(cuGraphDestroy(freeing));
        drv!(cuGraphDestroy(owner));
    }
}
