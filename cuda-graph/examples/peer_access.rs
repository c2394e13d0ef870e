//! G.7: graph allocations that other GPUs access. Needs two GPUs that can access each other's
//! memory; with fewer, it says so in one line and exits with status 2.
//!
//! - G.7.1, explicit alloc nodes: an allocation resident on device 1 with no access list (only
//!   device 1 maps it), and one whose access list adds device 0. A kernel on device 0 writes the
//!   second through the peer mapping; kernels on device 1 read both back.
//! - G.7.2, stream capture: an alloc node records the peer access its pool has at the moment of
//!   capture. `malloc_from_pool_async` is captured into graph 1, then device 1 is given access to
//!   the pool, then captured again into graph 2: only graph 2's alloc node maps device 1, and a
//!   kernel on device 1 uses that allocation.
//!
//! Each alloc node's access list is read back from the driver (`cuGraphMemAllocNodeGetParams`)
//! and checked; every kernel's output is checked.
//!
//! Run with `cargo run --example peer_access --features example-kernels`.

mod common;

use anyhow::{Context, bail, ensure};
use common::{Kernels, args, config, thousands, verify_u32};
use cuda_graph::sys;
use cuda_graph::{
    Access, AllocParams, AsStream, CaptureMode, Device, DeviceBuffer, Event, Graph,
    InstantiateFlags, MemPool, Stream, capture, device_count,
};

/// Elements of every allocation: 4 MiB of `u32`.
const N: u64 = 1 << 20;
/// Bytes of every allocation.
const BYTES: usize = N as usize * 4;

fn main() {
    common::run(|dev0| {
        let count = device_count()?;
        if count < 2 {
            common::cannot_run(&format!(
                "needs 2 CUDA devices with peer access, found {count}: {}",
                common::describe(dev0)?
            ));
        }
        let dev1 = common::usable_device(1).unwrap_or_else(|why| common::cannot_run(&why));
        if !dev0.can_access_peer(&dev1)? || !dev1.can_access_peer(dev0)? {
            common::cannot_run(&format!(
                "devices 0 ({}) and 1 ({}) cannot access each other's memory (cuDeviceCanAccessPeer)",
                dev0.name()?,
                dev1.name()?
            ));
        }
        println!("G.7 peer access to graph allocations");
        println!("  device 0: {}", common::describe(dev0)?);
        println!("  device 1: {}", common::describe(&dev1)?);
        let k0 = Kernels::load(dev0)?;
        let k1 = Kernels::load(&dev1)?;
        node_api(dev0, &dev1, &k0, &k1)?;
        stream_capture(dev0, &dev1, &k0, &k1)?;
        Ok(())
    });
}

/// The devices an alloc node's access list names, as the driver reports it: every alloc node of
/// `graph`, in node order.
///
/// The crate's record does not keep an alloc node's access list, so this reads the driver's
/// copy of the node parameters through the raw API.
fn access_lists(graph: &Graph) -> anyhow::Result<Vec<Vec<i32>>> {
    let check = |code: sys::CUresult, call: &str| -> anyhow::Result<()> {
        if code != sys::CUresult::CUDA_SUCCESS {
            bail!(
                "{call} failed: {}",
                code.name()
                    .map_or_else(|| format!("CUDA_ERROR_{}", code.0), str::to_string)
            );
        }
        Ok(())
    };
    let mut count = 0usize;
    // SAFETY: the graph is live (borrowed); a null array asks only for the count.
    let status = unsafe { sys::cuGraphGetNodes(graph.as_raw(), std::ptr::null_mut(), &mut count) };
    check(status, "cuGraphGetNodes")?;
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: the array holds `count` entries; the driver writes at most that many.
    let status = unsafe { sys::cuGraphGetNodes(graph.as_raw(), nodes.as_mut_ptr(), &mut count) };
    check(status, "cuGraphGetNodes")?;
    nodes.truncate(count);

    let mut lists = Vec::new();
    for node in nodes {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: the node belongs to the live graph; `kind` is a valid out-pointer.
        let status = unsafe { sys::cuGraphNodeGetType(node, &mut kind) };
        check(status, "cuGraphNodeGetType")?;
        if kind != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            continue;
        }
        let mut params = sys::CUDA_MEM_ALLOC_NODE_PARAMS::default();
        // SAFETY: the node is an alloc node of the live graph; `params` is a valid out-pointer.
        let status = unsafe { sys::cuGraphMemAllocNodeGetParams(node, &mut params) };
        check(status, "cuGraphMemAllocNodeGetParams")?;
        let descs = if params.accessDescCount == 0 || params.accessDescs.is_null() {
            &[][..]
        } else {
            // SAFETY: the driver returns `accessDescCount` descriptors at `accessDescs`, owned by
            // the node, which lives as long as the graph borrowed here; they are copied at once.
            unsafe { std::slice::from_raw_parts(params.accessDescs, params.accessDescCount) }
        };
        lists.push(
            descs
                .iter()
                .filter(|d| d.flags != sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE)
                .map(|d| d.location.id)
                .collect(),
        );
    }
    Ok(lists)
}

/// G.7.1: access lists on alloc nodes of an explicit graph.
fn node_api(dev0: &Device, dev1: &Device, k0: &Kernels, k1: &Kernels) -> anyhow::Result<()> {
    println!("\n  G.7.1 explicit alloc nodes resident on device 1");
    let cfg = config(N);
    let out_p = DeviceBuffer::<u32>::zeroed(dev1, N as usize)?;
    let out_q1 = DeviceBuffer::<u32>::zeroed(dev1, N as usize)?;
    let out_q0 = DeviceBuffer::<u32>::zeroed(dev0, N as usize)?;

    let mut graph = Graph::new(dev1)?;
    // P: resident on device 1, accessible from device 1 only (the resident device is implicit).
    let (p_alloc, p) = graph.add_mem_alloc_node(&[], &AllocParams::new(dev1, BYTES).label("P"))?;
    // Q: resident on device 1, and mapped for device 0 too (one access descriptor).
    let q_params = AllocParams::new(dev1, BYTES)
        .peer_access(dev0, Access::ReadWrite)
        .label("Q");
    let (q_alloc, q) = graph.add_mem_alloc_node(&[], &q_params)?;

    // SAFETY: (for the five kernel nodes) every argument list comes from `common::args`, which
    // matches the kernel's signature and checks sizes; each node is ordered after its
    // allocation's alloc node and before its free node; the kernels on device 0 touch only Q,
    // which is mapped for device 0; the output buffers outlive the launch.
    let p_fill =
        unsafe { graph.add_kernel_node(&[p_alloc], &k1.iota, cfg, &args::pnv(&p, N, 100))? };
    // SAFETY: as above.
    let p_read =
        unsafe { graph.add_kernel_node(&[p_fill], &k1.copy, cfg, &args::copy(&out_p, &p, N))? };
    graph.add_mem_free_node(&[p_read], &p)?;
    // Device 0 writes Q through the peer mapping; device 1 and device 0 read it back.
    // SAFETY: as above.
    let q_fill =
        unsafe { graph.add_kernel_node(&[q_alloc], &k0.iota, cfg, &args::pnv(&q, N, 200))? };
    // SAFETY: as above.
    let q_read1 =
        unsafe { graph.add_kernel_node(&[q_fill], &k1.copy, cfg, &args::copy(&out_q1, &q, N))? };
    // SAFETY: as above.
    let q_read0 =
        unsafe { graph.add_kernel_node(&[q_fill], &k0.copy, cfg, &args::copy(&out_q0, &q, N))? };
    graph.add_mem_free_node(&[q_read1, q_read0], &q)?;

    let lists = access_lists(&graph)?;
    ensure!(
        lists.len() == 2,
        "expected 2 alloc nodes, found {}",
        lists.len()
    );
    println!(
        "    P's alloc node: access list {:?} (resident device 1 implicit)",
        lists[0]
    );
    println!("    Q's alloc node: access list {:?}", lists[1]);
    ensure!(
        !lists[0].contains(&0),
        "P was allocated without an access list, yet maps device 0"
    );
    ensure!(lists[1].contains(&0), "Q's alloc node should map device 0");

    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    let stream = Stream::new(dev1)?;
    exec.launch(&stream)?;
    stream.synchronize()?;
    dev0.synchronize()?;
    verify_u32("P read on device 1", &out_p.to_vec()?, |i| 100 + i as u32)?;
    verify_u32("Q read on device 1", &out_q1.to_vec()?, |i| 200 + i as u32)?;
    verify_u32("Q read on device 0", &out_q0.to_vec()?, |i| 200 + i as u32)?;
    println!(
        "    ✓ device 1 filled P; device 0 filled Q through the peer mapping; both devices read Q back ({} elements each)",
        thousands(N)
    );
    Ok(())
}

/// G.7.2: the pool's peer access at capture time is what an alloc node records.
fn stream_capture(dev0: &Device, dev1: &Device, k0: &Kernels, k1: &Kernels) -> anyhow::Result<()> {
    println!("\n  G.7.2 stream capture from a memory pool resident on device 0");
    let cfg = config(N);
    let pool = MemPool::new(dev0)?;
    let (s0, s1) = (Stream::new(dev0)?, Stream::new(dev1)?);
    let out = DeviceBuffer::<u32>::zeroed(dev0, N as usize)?;
    ensure!(
        pool.access(dev1)?.is_none(),
        "a new pool should not be accessible from device 1"
    );

    // Graph 1, captured while only device 0 has access: allocates, fills, reads back, frees.
    let (graph1, ()) = capture(&s0, CaptureMode::Global, |cap| {
        let dptr1 = cap.malloc_from_pool_async(&pool, BYTES)?;
        // SAFETY: (both launches) the arguments match iota_u32 and copy_u32 (sizes checked by
        // `common::args`); dptr1 is used between its captured allocation and free; `out`
        // outlives the launch.
        unsafe { cap.launch(&k0.iota, cfg, &args::pnv(&dptr1, N, 0))? };
        // SAFETY: as above.
        unsafe { cap.launch(&k0.copy, cfg, &args::copy(&out, &dptr1, N))? };
        cap.free_async(&dptr1)
    })
    .context("capturing graph 1")?;

    pool.set_access(dev1, Access::ReadWrite)?;
    ensure!(
        pool.access(dev1)? == Some(Access::ReadWrite),
        "the pool should now be accessible from device 1"
    );

    // Graph 2, captured after: allocates and fills, and leaves the allocation live for device 1.
    let (graph2, dptr2) = capture(&s0, CaptureMode::Global, |cap| {
        let dptr2 = cap.malloc_from_pool_async(&pool, BYTES)?;
        // SAFETY: the arguments match iota_u32; dptr2 was captured just before and is freed
        // below, after the graph's launch and the work that follows it.
        unsafe { cap.launch(&k0.iota, cfg, &args::pnv(&dptr2, N, 1000))? };
        Ok(dptr2)
    })
    .context("capturing graph 2")?;

    let list1 = access_lists(&graph1)?;
    let list2 = access_lists(&graph2)?;
    println!("    graph 1's alloc node (captured before set_access): access list {list1:?}");
    println!("    graph 2's alloc node (captured after set_access):  access list {list2:?}");
    ensure!(
        list1.len() == 1 && !list1[0].contains(&1),
        "graph 1's alloc node should not map device 1: {list1:?}"
    );
    ensure!(
        list2.len() == 1 && list2[0].contains(&1),
        "graph 2's alloc node should map device 1: {list2:?}"
    );
    println!("    ✓ changing the pool's access after the capture did not change graph 1's mapping");

    let exec1 = graph1.instantiate(InstantiateFlags::NONE)?;
    exec1.launch(&s0)?;
    s0.synchronize()?;
    verify_u32("graph 1's allocation", &out.to_vec()?, |i| i as u32)?;

    // Graph 2 allocates dptr2 on device 0; device 1 adds 5 to it through its mapping; device 0
    // copies it out and frees it. Events order the streams of the two devices.
    let exec2 = graph2.instantiate(InstantiateFlags::NONE)?;
    exec2.launch(&s0)?;
    let allocated = Event::new(dev0)?;
    allocated.record(&s0)?;
    s1.wait_event(&allocated)?;
    // SAFETY: the arguments match add_u32; dptr2 is allocated and filled before (event
    // `allocated`), mapped for device 1 (checked above), and freed after (event `used`).
    unsafe { k1.add.launch(&s1, cfg, &args::pnv(&dptr2, N, 5))? };
    let used = Event::new(dev1)?;
    used.record(&s1)?;
    s0.wait_event(&used)?;
    // SAFETY: the arguments match copy_u32; dptr2 is live until the free queued after this on s0.
    unsafe { k0.copy.launch(&s0, cfg, &args::copy(&out, &dptr2, N))? };
    dptr2.free_async(&s0)?;
    s0.synchronize()?;
    verify_u32(
        "graph 2's allocation after device 1 added 5",
        &out.to_vec()?,
        |i| 1005 + i as u32,
    )?;
    println!(
        "    ✓ graph 1 filled and read its allocation on device 0; device 1 updated graph 2's allocation through its mapping ({} elements)",
        thousands(N)
    );
    Ok(())
}
