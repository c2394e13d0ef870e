//! Conditional nodes: IF, IF-ELSE, WHILE and SWITCH bodies chosen by a condition's default
//! value, the lifetime rules around bodies (a body's use of a graph allocation is the
//! conditional node's use), memory nodes refused inside bodies, and what a body refers to kept
//! by the graph (a reuse probe). The condition is set by its default at every launch
//! (`CU_GRAPH_COND_ASSIGN_DEFAULT`), or from device code by the kernels of
//! `kernels::CONDITION_FATBIN`, which call `cudaGraphSetConditional`: a WHILE loop that a kernel
//! ends, over a counter in a graph allocation, and an IF whose condition a kernel reads from
//! memory.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, Body, ConditionalKind, DeviceBuffer, Error, Graph, InstantiateFlags,
    KernelArgs, LaunchConfig, Module, Stream,
};
use probe::PATTERN;
use safe_common::{BYTES, Gpu, N, assert_all, assert_no_drop_errors, config, gpu};

/// Adds `fill_u32(out, N, value)` to `body`.
fn fill(g: &Gpu, body: &mut Body, out: &DeviceBuffer<u32>, value: u32) -> cuda_graph::Result<()> {
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the N values of `out`.
    unsafe {
        body.add_kernel_node(
            &[],
            &g.k.fill,
            config(N),
            &KernelArgs::new().ptr(out).value(N).value(value),
        )
    }
    .map(drop)
}

/// Builds a graph with one conditional node of `kind` whose condition defaults to `value`;
/// body i fills `out` with 100 + i. Launches it once and returns `out`'s first word (all words
/// are checked to be equal).
fn run(g: &Gpu, kind: ConditionalKind, value: u32) -> u32 {
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let condition = graph.add_condition(Some(value)).unwrap();
    graph
        .add_conditional_node(&[], &condition, kind, |bodies| {
            for (i, body) in bodies.iter_mut().enumerate() {
                fill(g, body, &out, 100 + i as u32)?;
            }
            Ok(())
        })
        .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    assert_all(&got, got[0], &format!("{kind:?} with condition {value}"));
    got[0]
}

/// Each kind runs the body its condition selects, and none when it selects none.
#[test]
#[ignore = "needs a GPU"]
fn conditional_kinds_run_the_body_the_condition_selects() {
    let Some(g) = gpu("conditional_kinds_run_the_body_the_condition_selects") else {
        return;
    };
    assert_eq!(run(&g, ConditionalKind::If, 1), 100, "IF, condition 1");
    assert_eq!(
        run(&g, ConditionalKind::If, 0),
        0,
        "IF, condition 0: no body"
    );
    assert_eq!(
        run(&g, ConditionalKind::IfElse, 5),
        100,
        "IF-ELSE, condition 5"
    );
    assert_eq!(
        run(&g, ConditionalKind::IfElse, 0),
        101,
        "IF-ELSE, condition 0: the else body"
    );
    assert_eq!(
        run(&g, ConditionalKind::While, 0),
        0,
        "WHILE, condition 0: no run"
    );
    #[cfg(cuda_graph_cond_switch)]
    {
        assert_eq!(
            run(&g, ConditionalKind::Switch(3), 2),
            102,
            "SWITCH(3), condition 2"
        );
        assert_eq!(
            run(&g, ConditionalKind::Switch(3), 3),
            0,
            "SWITCH(3), condition 3: none"
        );
    }
    assert_no_drop_errors(&g.device);
}

/// A body's use of a graph allocation is the conditional node's: the node between the alloc
/// and the free node passes the checks and runs; the node with no edge from the alloc node is
/// refused by the lifetime checks before instantiation. Memory nodes inside a body are refused
/// before the driver; a condition of another graph too.
#[test]
#[ignore = "needs a GPU"]
fn bodies_follow_the_lifetime_rules_and_hold_no_memory_nodes() {
    let Some(g) = gpu("bodies_follow_the_lifetime_rules_and_hold_no_memory_nodes") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let build = |ordered: bool| {
        let mut graph = Graph::new(device).unwrap();
        let (alloc, a) = graph
            .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
            .unwrap();
        let condition = graph.add_condition(Some(1)).unwrap();
        let deps = if ordered { vec![alloc] } else { Vec::new() };
        let cond = graph
            .add_conditional_node(&deps, &condition, ConditionalKind::If, |bodies| {
                // SAFETY: fill_u32 over the N values of `a`, then copy_u32 of them to `out`.
                unsafe {
                    let f = bodies[0].add_kernel_node(
                        &[],
                        &g.k.fill,
                        config(N),
                        &KernelArgs::new().ptr(&a).value(N).value(42u32),
                    )?;
                    bodies[0].add_kernel_node(
                        &[f],
                        &g.k.copy,
                        config(N),
                        &KernelArgs::new().ptr(&out).ptr(&a).value(N),
                    )?;
                }
                Ok(())
            })
            .unwrap();
        assert!(
            graph
                .record()
                .allocations_of(&graph.nodes()[cond.index()], cuda_graph::MemRole::Use)
                .any(|u| u.same(&a)),
            "the conditional node records its body's use of the allocation"
        );
        let free_deps = if ordered { vec![cond] } else { vec![alloc] };
        graph.add_mem_free_node(&free_deps, &a).unwrap();
        graph
    };
    let graph = build(true);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        42,
        "the body's copy of the allocation",
    );

    let unordered = build(false);
    let err = unordered.instantiate(InstantiateFlags::NONE).unwrap_err();
    println!("CASE body use not ordered after the alloc node: {err}");
    assert!(matches!(err, Error::Lifetime(_)), "{err:?}");

    // Memory nodes in a body do not compile (`Body` has no such methods:
    // compile-fail/conditional_body_has_no_memory_nodes.rs).
    let mut graph = Graph::new(device).unwrap();
    let mut other = Graph::new(device).unwrap();
    let foreign = other.add_condition(None).unwrap();
    let err = graph
        .add_conditional_node(&[], &foreign, ConditionalKind::If, |_| Ok(()))
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { call, .. } if *call == "cuGraphAddNode"),
        "{err:?}"
    );
    assert_no_drop_errors(device);
}

/// What a body refers to is kept by the graph: the body copies from a buffer whose handle is
/// dropped as soon as the graph is built; a new buffer of the same size (the reuse probe,
/// filled with a pattern) is allocated; the launch must still copy the old buffer's data.
#[test]
#[ignore = "needs a GPU"]
fn a_body_keeps_what_it_refers_to() {
    if let Some(g) = gpu("a_body_keeps_what_it_refers_to") {
        body_keeps_its_source(&g, false);
    }
}

/// As above, the build closure panicking after it added the node (the caller catches the
/// panic): the node stays in the graph, so what its body refers to must stay too.
#[test]
#[ignore = "needs a GPU"]
fn a_body_whose_build_panicked_keeps_what_it_refers_to() {
    if let Some(g) = gpu("a_body_whose_build_panicked_keeps_what_it_refers_to") {
        body_keeps_its_source(&g, true);
    }
}

/// A body copies from a buffer whose handle is dropped once the graph is built; a probe of the
/// same size, filled with a pattern, is allocated; the launch must still copy the old buffer's
/// data. With `panics`, the build closure panics after adding the copy.
fn body_keeps_its_source(g: &Gpu, panics: bool) {
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let src = DeviceBuffer::from_slice(device, &vec![0x0303_0303u32; N as usize]).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let condition = graph.add_condition(Some(1)).unwrap();
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        graph.add_conditional_node(&[], &condition, ConditionalKind::If, |bodies| {
            // SAFETY: copy_u32(unsigned* dst, const unsigned* src, unsigned long long n) over
            // the N values of `out` and `src`.
            unsafe {
                bodies[0].add_kernel_node(
                    &[],
                    &g.k.copy,
                    config(N),
                    &KernelArgs::new().ptr(&out).ptr(&src).value(N),
                )?;
            }
            assert!(!panics, "the build closure panics after adding its node");
            Ok(())
        })
    }));
    assert_eq!(built.is_err(), panics, "the closure panicked as asked");
    drop(src);
    let probe = DeviceBuffer::from_slice(device, &vec![PATTERN; N as usize]).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    drop(graph);
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        0x0303_0303,
        "the body's copy (the source freed early reads the probe's pattern)",
    );
    assert_all(&probe.to_vec().unwrap(), PATTERN, "the probe");
    assert_no_drop_errors(device);
}

/// The condition set on the GPU: a WHILE loop whose body's `count_to_then_clear` adds 1 to a
/// counter in a graph allocation and clears the condition once it reaches the limit (the graph
/// then copies the counter out and frees the allocation), for limits 1, 10 and 1000, launched
/// twice each; and an IF without a default whose condition `set_condition_from` reads from
/// device memory, 0 then 1.
#[test]
#[ignore = "needs a GPU"]
fn a_kernel_sets_the_condition_on_the_gpu() {
    let Some(g) = gpu("a_kernel_sets_the_condition_on_the_gpu") else {
        return;
    };
    let device = &g.device;
    let module = Module::from_cubin(device, cuda_graph::kernels::CONDITION_FATBIN).unwrap();
    let count_to = module.function("count_to_then_clear").unwrap();
    let set_from = module.function("set_condition_from").unwrap();
    let one = LaunchConfig::new((1, 1, 1), (32, 1, 1));
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, 1).unwrap();
    for limit in [1u32, 10, 1000] {
        let mut graph = Graph::new(device).unwrap();
        let (alloc, counter) = graph
            .add_mem_alloc_node(&[], &AllocParams::new(device, 4).label("counter"))
            .unwrap();
        let zeroed = graph.add_memset_node(&[alloc], &counter, 0, 1).unwrap();
        let condition = graph.add_condition(Some(1)).unwrap();
        let looped = graph
            .add_conditional_node(&[zeroed], &condition, ConditionalKind::While, |bodies| {
                let args = KernelArgs::new()
                    .value(condition.as_raw())
                    .ptr(&counter)
                    .value(limit);
                // SAFETY: count_to_then_clear(CUgraphConditionalHandle h, unsigned* counter,
                // unsigned limit): this graph's condition and a counter of one word.
                unsafe { bodies[0].add_kernel_node(&[], &count_to, one, &args)? };
                Ok(())
            })
            .unwrap();
        let copied = graph.add_memcpy_node(&[looped], &out, &counter, 4).unwrap();
        graph.add_mem_free_node(&[copied], &counter).unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        for launch in 0..2 {
            exec.launch(&stream).unwrap();
            stream.synchronize().unwrap();
            assert_eq!(
                out.to_vec().unwrap()[0],
                limit,
                "WHILE until the counter reaches {limit}, launch {launch}"
            );
        }
    }
    let value = DeviceBuffer::<u32>::zeroed(device, 1).unwrap();
    let filled = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let condition = graph.add_condition(None).unwrap();
    let args = KernelArgs::new().value(condition.as_raw()).ptr(&value);
    // SAFETY: set_condition_from(CUgraphConditionalHandle h, const unsigned* value): this
    // graph's condition and one word.
    let set = unsafe { graph.add_kernel_node(&[], &set_from, one, &args) }.unwrap();
    graph
        .add_conditional_node(&[set], &condition, ConditionalKind::If, |bodies| {
            fill(&g, &mut bodies[0], &filled, 5)
        })
        .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for (v, want) in [(0u32, 0u32), (1, 5)] {
        value.copy_from(&[v]).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_all(
            &filled.to_vec().unwrap(),
            want,
            &format!("IF set to {v} on the GPU"),
        );
    }
    assert_no_drop_errors(device);
}
