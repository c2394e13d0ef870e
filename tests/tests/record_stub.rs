//! The builder's record, the lifetime checks and the bookkeeping of instantiation on real
//! [`Graph`]s, without a GPU: this binary loads `stub-driver/null_cuda.c` (built by `build.rs`)
//! as its driver, through `CUDA_GRAPH_LIBCUDA`. The stub returns success and made-up handles
//! and runs nothing, so these tests check only what the safe layer decides on the host: which
//! graphs it accepts and how it names what it refuses. That a graph computes the right thing
//! is the GPU suite's to show (`lifetime_gpu.rs` shows the corruption these checks prevent).
//!
//! The whole binary uses the stub; a packed suite carries it (see `stub_common`). Where it is
//! missing, each test prints `SKIPPED ...` and returns, except in CI (`CI=true`) and under
//! `CUDA_GRAPH_REQUIRE_GPU=1`, where it fails.

mod stub_common;

use cuda_graph::check::Rule;
use cuda_graph::{AllocParams, Device, Error, Function, Graph, InstantiateFlags, KernelArgs, Node};
use stub_common::{BYTES, N, config, stub};

/// A kernel node using `buf` after `deps`.
fn kernel(
    graph: &mut Graph,
    deps: &[Node],
    fill: &Function,
    buf: &cuda_graph::GraphAllocation,
) -> Node {
    let args = KernelArgs::new().ptr(buf).value(N).value(1u32);
    // SAFETY: the stub driver runs nothing; the arguments match fill_u32(p, n, v).
    unsafe { graph.add_kernel_node(deps, fill, config(), &args) }.expect("kernel node")
}

/// `k` (at least 1) segments alloc → kernel → free, each after the previous free; the graph and
/// its last free node.
fn chain(device: &Device, fill: &Function, k: usize) -> (Graph, Node) {
    let mut graph = Graph::new(device).unwrap();
    let params = AllocParams::new(device, BYTES);
    let mut prev: Option<Node> = None;
    for _ in 0..k {
        let (alloc, buf) = graph.add_mem_alloc_node(prev.as_slice(), &params).unwrap();
        let k = kernel(&mut graph, &[alloc], fill, &buf);
        prev = Some(graph.add_mem_free_node(&[k], &buf).unwrap());
    }
    (graph, prev.expect("at least one segment"))
}

/// The rules of the violations of `result`, which must be a lifetime error.
fn rules<T: std::fmt::Debug>(result: cuda_graph::Result<T>) -> Vec<Rule> {
    match result {
        Err(Error::Lifetime(e)) => e.violations.iter().map(|v| v.rule).collect(),
        other => panic!("expected a lifetime error, got {other:?}"),
    }
}

#[test]
fn long_chains_pass_and_instantiate() {
    let Some((device, fill, _module)) = stub("long_chains_pass_and_instantiate") else {
        return;
    };
    for k in [1, 21, 22, 300] {
        let (graph, _) = chain(&device, &fill, k);
        assert_eq!(graph.nodes().len(), 3 * k);
        graph.check().unwrap();
        graph.instantiate(InstantiateFlags::NONE).unwrap();
    }
}

#[test]
fn a_kernel_not_after_its_alloc_node_is_named() {
    let Some((device, fill, _module)) = stub("a_kernel_not_after_its_alloc_node_is_named") else {
        return;
    };
    // 40 good segments, then an allocation whose kernel has no edge from its alloc node.
    let (mut graph, last) = chain(&device, &fill, 40);
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[last], &AllocParams::new(&device, BYTES).label("late"))
        .unwrap();
    let k = kernel(&mut graph, &[last], &fill, &buf);
    graph.set_label(k, "unordered").unwrap();
    graph.add_mem_free_node(&[k, alloc], &buf).unwrap();
    let err = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
    let Error::Lifetime(e) = &err else {
        panic!("expected a lifetime error, got {err:?}");
    };
    assert_eq!(e.violations.len(), 1, "{err}");
    let v = &e.violations[0];
    assert_eq!(v.rule, Rule::NotAfterAlloc);
    assert_eq!(v.node.label.as_deref(), Some("unordered"));
    assert_eq!(v.missing_edge, Some((alloc.index(), k.index())));
    assert!(v.allocation.contains("late"), "{}", v.allocation);
    assert!(err.to_string().contains("unordered"), "{err}");
}

#[test]
fn a_use_after_the_free_is_named_with_its_path() {
    let Some((device, fill, _module)) = stub("a_use_after_the_free_is_named_with_its_path") else {
        return;
    };
    let mut graph = Graph::new(&device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let free = graph.add_mem_free_node(&[alloc], &buf).unwrap();
    let late = kernel(&mut graph, &[free], &fill, &buf);
    assert_eq!(rules(graph.check()), vec![Rule::UseAfterFree]);
    let Err(Error::Lifetime(e)) = graph.check() else {
        unreachable!()
    };
    assert_eq!(
        e.violations[0].offending_edge,
        Some((free.index(), late.index()))
    );
}

#[test]
fn an_allocation_living_across_many_nodes_is_checked_exactly() {
    let Some((device, fill, _module)) =
        stub("an_allocation_living_across_many_nodes_is_checked_exactly")
    else {
        return;
    };
    // The allocation lives across 80 nodes (beyond the fast check's 64): the general check
    // decides, both ways.
    for ordered in [true, false] {
        let mut graph = Graph::new(&device).unwrap();
        let (alloc, buf) = graph
            .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap();
        let mut prev = alloc;
        for _ in 0..80 {
            prev = graph.add_empty_node(&[prev]).unwrap();
        }
        let start = if ordered {
            prev
        } else {
            graph.add_empty_node(&[]).unwrap()
        };
        let k = kernel(&mut graph, &[start], &fill, &buf);
        graph.add_mem_free_node(&[k, prev], &buf).unwrap();
        if ordered {
            graph.check().unwrap();
        } else {
            assert_eq!(rules(graph.check()), vec![Rule::NotAfterAlloc]);
        }
    }
}

#[test]
fn an_edge_added_backwards_in_the_record_is_followed() {
    let Some((device, fill, _module)) = stub("an_edge_added_backwards_in_the_record_is_followed")
    else {
        return;
    };
    // The empty node comes first in the record; the kernel hangs off it. Only the edge
    // alloc → empty, added afterwards (against the record's order), puts the kernel after the
    // alloc node.
    let mut graph = Graph::new(&device).unwrap();
    let empty = graph.add_empty_node(&[]).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let k = kernel(&mut graph, &[empty], &fill, &buf);
    graph.add_mem_free_node(&[k], &buf).unwrap();
    // Neither the kernel nor the free node after it is ordered after the alloc node.
    assert_eq!(
        rules(graph.check()),
        vec![Rule::NotAfterAlloc, Rule::NotAfterAlloc]
    );
    graph.add_dependency(alloc, empty).unwrap();
    graph.check().unwrap();
    graph.instantiate(InstantiateFlags::NONE).unwrap();
}

#[test]
fn freeing_in_two_graphs_is_refused_until_one_is_dropped() {
    let Some((device, _fill, _module)) =
        stub("freeing_in_two_graphs_is_refused_until_one_is_dropped")
    else {
        return;
    };
    let mut owner = Graph::new(&device).unwrap();
    let (_, buf) = owner
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let mut first = Graph::new(&device).unwrap();
    first.add_mem_free_node(&[], &buf).unwrap();
    first.check().unwrap();
    let mut second = Graph::new(&device).unwrap();
    second.add_mem_free_node(&[], &buf).unwrap();
    assert_eq!(rules(first.check()), vec![Rule::FreedByTwoGraphs]);
    assert_eq!(rules(second.check()), vec![Rule::FreedByTwoGraphs]);
    drop(first);
    second.check().unwrap();
    // A third graph takes the place the first left in the allocation's registry of freeing
    // graphs, beside the second: both are refused again, and the last one left passes.
    let mut third = Graph::new(&device).unwrap();
    third.add_mem_free_node(&[], &buf).unwrap();
    assert_eq!(rules(second.check()), vec![Rule::FreedByTwoGraphs]);
    assert_eq!(rules(third.check()), vec![Rule::FreedByTwoGraphs]);
    drop(second);
    third.check().unwrap();
    // The owner, which does not free it, instantiates (its allocation stays live after a launch).
    owner.instantiate(InstantiateFlags::NONE).unwrap();
}

/// `driver_version` reads the driver's `cuDriverGetVersion` (the stub says 13000);
/// `HEADERS_VERSION` is the headers' `CUDA_VERSION`.
#[test]
fn driver_version_is_the_drivers_answer() {
    let Some((_device, _fill, _module)) = stub("driver_version_is_the_drivers_answer") else {
        return;
    };
    assert_eq!(cuda_graph::driver_version().unwrap(), 13000);
    assert_eq!(
        cuda_graph::HEADERS_VERSION,
        cuda_graph::sys::CUDA_VERSION as i32
    );
    const { assert!(cuda_graph::HEADERS_VERSION >= 12030) };
}
