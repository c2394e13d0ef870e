//! One test per lifetime rule of `cuda_graph::check`, in both directions: a graph that breaks
//! the rule is caught, with an error that names the nodes, the allocation and the edge; the legal
//! graphs of every fragment of the guide's "Graph Memory Nodes" (G.3.1 without `d` and `e`,
//! G.3.2's captured graph, G.3.3's three orderings, G.3.4, G.4.1's chains) pass.
//!
//! Everything here runs on `Record`s, without a GPU.

use cuda_graph::NodeKind;
use cuda_graph::check::{AllocKey, LifetimeError, Record, Rule, Violation, check_record};

fn kernel(name: &str) -> NodeKind {
    NodeKind::Kernel(name.into())
}

/// A labelled node.
fn node(m: &mut Record, kind: NodeKind, deps: &[usize], label: &str) -> usize {
    let i = m.add_node(kind, deps);
    m.set_label(i, label);
    i
}

/// A labelled alloc node allocating `k`.
fn alloc(m: &mut Record, k: AllocKey, deps: &[usize], label: &str) -> usize {
    let i = node(m, NodeKind::MemAlloc, deps, label);
    m.allocates(i, k);
    i
}

/// A labelled free node freeing `k`.
fn free(m: &mut Record, k: AllocKey, deps: &[usize], label: &str) -> usize {
    let i = node(m, NodeKind::MemFree, deps, label);
    m.frees(i, k);
    i
}

/// A labelled kernel using `k`.
fn user(m: &mut Record, k: AllocKey, deps: &[usize], label: &str) -> usize {
    let i = node(m, kernel("k"), deps, label);
    m.uses(i, k);
    i
}

#[track_caller]
fn assert_passes(m: &Record) {
    let v = check_record(m);
    assert!(
        v.is_empty(),
        "expected no violations, got:\n{}",
        v.iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The one violation of `m`, which must break `rule`.
#[track_caller]
fn only(m: &Record, rule: Rule) -> Violation {
    let v = check_record(m);
    assert_eq!(v.len(), 1, "expected one {rule:?} violation, got {v:#?}");
    assert_eq!(v[0].rule, rule, "{}", v[0]);
    assert_one_sentence(&v[0].to_string());
    v.into_iter().next().unwrap()
}

/// One sentence: one line, no sentence break inside, no trailing period.
#[track_caller]
fn assert_one_sentence(s: &str) {
    assert!(!s.contains('\n'), "more than one line: {s}");
    assert!(!s.contains(". "), "more than one sentence: {s}");
    assert!(!s.ends_with('.'), "{s}");
    assert!(s.len() > 20, "{s}");
}

/// G.3.1 without `d` and `e`: alloc → a → {b, c} → free.
fn g3_1() -> (Record, AllocKey, [usize; 5]) {
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "allocNode");
    let a = user(&mut m, buf, &[al], "a");
    let b = user(&mut m, buf, &[a], "b");
    let c = user(&mut m, buf, &[a], "c");
    let fr = free(&mut m, buf, &[b, c], "freeNode");
    (m, buf, [al, a, b, c, fr])
}

// ---- Rule 1: every user (and the free node) is ordered after the alloc node ----

#[test]
fn g3_1_without_d_and_e_passes() {
    assert_passes(&g3_1().0);
}

#[test]
fn not_after_alloc_node_e_of_g3_1_is_caught() {
    let (mut m, buf, [al, ..]) = g3_1();
    let e = user(&mut m, buf, &[], "e");
    let v = check_record(&m);
    // `e` is neither after the alloc node nor before the free node.
    let rules: Vec<_> = v.iter().map(|v| (v.node.index, v.rule)).collect();
    assert_eq!(
        rules,
        [(e, Rule::NotAfterAlloc), (e, Rule::UnorderedWithFree)]
    );
    let v = &v[0];
    assert_eq!(v.node.label.as_deref(), Some("e"));
    assert_eq!(v.node.kind, kernel("k"));
    assert_eq!(v.other.as_ref().map(|o| o.index), Some(al));
    assert_eq!(v.key, Some(buf));
    assert_eq!(v.allocation, "allocation 'buf'");
    assert_eq!(v.missing_edge, Some((al, e)));
    assert_eq!(v.offending_edge, None);
    let s = v.to_string();
    assert_one_sentence(&s);
    for part in [
        "node 'e' (kernel k, #5)",
        "uses allocation 'buf'",
        "not ordered after its alloc node",
        "node 'allocNode' (alloc node, #0)",
        "the edge node 'allocNode' (alloc node, #0) → node 'e' (kernel k, #5) is missing",
    ] {
        assert!(s.contains(part), "{s:?} lacks {part:?}");
    }
}

#[test]
fn not_after_alloc_even_when_the_free_depends_on_the_user() {
    // G.3.1: "This would be true even if the freeNode depended on kernel node e."
    let (mut m, buf, [al, .., fr]) = g3_1();
    let e = user(&mut m, buf, &[], "e");
    m.add_edge(e, fr);
    let v = only(&m, Rule::NotAfterAlloc);
    assert_eq!((v.node.index, v.missing_edge), (e, Some((al, e))));
}

#[test]
fn not_after_alloc_free_node_is_caught() {
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "allocNode");
    let fr = m.add_node(NodeKind::MemFree, &[]);
    m.frees(fr, buf);
    let v = only(&m, Rule::NotAfterAlloc);
    assert_eq!(v.node.index, fr);
    assert_eq!(v.node.label, None);
    let s = v.to_string();
    assert!(
        s.starts_with("free node #1 frees allocation 'buf' but is not ordered after"),
        "{s}"
    );
    assert_eq!(v.missing_edge, Some((al, fr)));
    // Ordered after it: legal.
    m.add_edge(al, fr);
    assert_passes(&m);
}

#[test]
fn not_after_alloc_through_a_path_of_edges_passes() {
    // Ordering is transitive: the free depends on b and c only (G.3.1's remark on node a).
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "alloc");
    let e1 = node(&mut m, NodeKind::Empty, &[al], "join1");
    let e2 = node(&mut m, NodeKind::Host, &[e1], "host");
    let k = user(&mut m, buf, &[e2], "k");
    free(&mut m, buf, &[k], "free");
    assert_passes(&m);
}

// ---- Rule 2a: no user ordered after the free node ----

/// G.4.1: chain 1 (alloc1 → k1 → free1) then chain 2 (alloc2 → k2 → free2) after it, so that
/// alloc2 may reuse alloc1's address.
fn g4_1_chains() -> (Record, [AllocKey; 2], [usize; 6]) {
    let mut m = Record::new();
    let one = m.add_allocation("allocation 'one'");
    let two = m.add_allocation("allocation 'two'");
    let a1 = alloc(&mut m, one, &[], "alloc1");
    let k1 = user(&mut m, one, &[a1], "k1");
    let f1 = free(&mut m, one, &[k1], "free1");
    let a2 = alloc(&mut m, two, &[f1], "alloc2");
    let k2 = user(&mut m, two, &[a2], "k2");
    let f2 = free(&mut m, two, &[k2], "free2");
    (m, [one, two], [a1, k1, f1, a2, k2, f2])
}

#[test]
fn g4_1_chains_pass() {
    let (mut m, _, [.., f2]) = g4_1_chains();
    // Alloc node 3 of G.4.1, not after free node 2: a new address, still legal.
    let three = m.add_allocation("allocation 'three'");
    let a3 = alloc(&mut m, three, &[], "alloc3");
    let k3 = user(&mut m, three, &[a3], "k3");
    free(&mut m, three, &[k3], "free3");
    let _ = f2;
    assert_passes(&m);
}

#[test]
fn use_after_free_is_caught_with_the_offending_path() {
    // A kernel that uses allocation 'one' after chain 2 began, whose alloc node may have reused
    // the address: it would write into allocation 'two' (G.4.2).
    let (mut m, [one, _], [_, _, f1, a2, k2, _]) = g4_1_chains();
    let late = user(&mut m, one, &[k2], "late");
    let v = only(&m, Rule::UseAfterFree);
    assert_eq!(v.node.index, late);
    assert_eq!(v.other.as_ref().map(|o| o.index), Some(f1));
    let path: Vec<usize> = v.path.iter().map(|n| n.index).collect();
    assert_eq!(path, [f1, a2, k2, late]);
    assert_eq!(v.offending_edge, Some((k2, late)));
    assert_eq!(v.missing_edge, Some((late, f1)));
    let s = v.to_string();
    for part in [
        "node 'late' (kernel k, #6) uses allocation 'one' after its free node, node 'free1' (free node, #2), has freed it",
        "node 'free1' (free node, #2) → node 'alloc2' (alloc node, #3) → node 'k2' (kernel k, #4) → node 'late' (kernel k, #6)",
        "its last edge is node 'k2' (kernel k, #4) → node 'late' (kernel k, #6)",
    ] {
        assert!(s.contains(part), "{s:?} lacks {part:?}");
    }
}

#[test]
fn use_after_free_direct_edge_and_its_legal_counterpart() {
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "alloc");
    let fr = free(&mut m, buf, &[al], "free");
    let k = user(&mut m, buf, &[fr], "k");
    let v = only(&m, Rule::UseAfterFree);
    assert_eq!(v.offending_edge, Some((fr, k)));
    // The legal graph: k between the alloc and the free.
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "alloc");
    let k = user(&mut m, buf, &[al], "k");
    free(&mut m, buf, &[k], "free");
    assert_passes(&m);
}

#[test]
fn use_after_free_long_path_is_elided_in_the_sentence() {
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "alloc");
    let fr = free(&mut m, buf, &[al], "free");
    let mut last = fr;
    for _ in 0..10 {
        last = m.add_node(NodeKind::Empty, &[last]);
    }
    let k = user(&mut m, buf, &[last], "k");
    let v = only(&m, Rule::UseAfterFree);
    assert_eq!(v.path.len(), 12);
    assert_eq!(v.path[0].index, fr);
    assert_eq!(v.path[11].index, k);
    let s = v.to_string();
    assert!(s.contains("… (7 more)"), "{s}");
}

// ---- Rule 2b: no user unordered with the free node ----

#[test]
fn unordered_with_free_node_d_of_g3_1_is_caught() {
    let (mut m, buf, [.., c, fr]) = g3_1();
    // "free node does not depend on kernel node d, so it must not access the freed graph
    // allocation"
    let d = user(&mut m, buf, &[c], "d");
    let v = only(&m, Rule::UnorderedWithFree);
    assert_eq!(v.node.index, d);
    assert_eq!(v.other.as_ref().map(|o| o.index), Some(fr));
    assert_eq!(v.missing_edge, Some((d, fr)));
    let s = v.to_string();
    assert!(
        s.contains("the edge node 'd' (kernel k, #5) → node 'freeNode' (free node, #4) is missing"),
        "{s}"
    );
    // With the missing edge, legal.
    m.add_edge(d, fr);
    assert_passes(&m);
}

#[test]
fn unordered_with_free_when_the_user_comes_later_in_the_order() {
    // The user is in a branch that the topological order places after the free node.
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "alloc");
    let fr = free(&mut m, buf, &[al], "free");
    let side = node(&mut m, NodeKind::Empty, &[al], "side");
    let k = user(&mut m, buf, &[side], "k");
    let v = only(&m, Rule::UnorderedWithFree);
    assert_eq!((v.node.index, v.missing_edge), (k, Some((k, fr))));
    assert!(v.path.is_empty());
}

// ---- Rule 3: one free node, one graph, one alloc node, allocations that exist ----

#[test]
fn freed_twice_is_caught() {
    let (mut m, buf, [.., fr]) = g3_1();
    let again = free(&mut m, buf, &[fr], "again");
    let v = only(&m, Rule::FreedTwice);
    assert_eq!(v.node.index, again);
    assert_eq!(v.other.as_ref().map(|o| o.index), Some(fr));
    assert!(
        v.to_string()
            .starts_with("node 'again' (free node, #5) frees allocation 'buf', which node 'freeNode' (free node, #4) already frees"),
        "{v}"
    );
}

#[test]
fn freed_by_two_graphs_is_caught() {
    let (mut m, buf, [.., fr]) = g3_1();
    m.set_freed_elsewhere(buf);
    let v = only(&m, Rule::FreedByTwoGraphs);
    assert_eq!(v.node.index, fr);
    assert!(v.to_string().contains("another graph also frees"), "{v}");
}

#[test]
fn freed_by_another_graph_only_passes() {
    // The owner allocates and uses it; another graph frees it (G.3.3).
    let mut m = Record::new();
    let buf = m.add_allocation("allocation 'buf'");
    let al = alloc(&mut m, buf, &[], "alloc");
    user(&mut m, buf, &[al], "k");
    m.set_freed_elsewhere(buf);
    assert_passes(&m);
}

#[test]
fn allocated_twice_is_caught() {
    let (mut m, buf, [al, ..]) = g3_1();
    let again = alloc(&mut m, buf, &[], "again");
    let v = only(&m, Rule::AllocatedTwice);
    assert_eq!(v.node.index, again);
    assert_eq!(v.other.as_ref().map(|o| o.index), Some(al));
}

#[test]
fn free_of_an_allocation_that_does_not_exist_is_caught() {
    let (mut m, _, [.., fr]) = g3_1();
    let ghost = free(&mut m, AllocKey(7), &[fr], "ghost");
    let v = only(&m, Rule::UnknownAllocation);
    assert_eq!((v.node.index, v.key), (ghost, Some(AllocKey(7))));
    assert!(v.to_string().contains("allocation key #7"), "{v}");
}

#[test]
fn dependency_on_a_node_that_does_not_exist_is_caught() {
    let (mut m, _, [.., fr]) = g3_1();
    let k = m.add_node(kernel("k"), &[fr, 99]);
    let v = only(&m, Rule::UnknownDependency);
    assert_eq!((v.node.index, v.offending_edge), (k, Some((99, k))));
    assert_eq!((v.key, v.allocation.as_str()), (None, ""));
    assert!(
        v.to_string().contains("node #99, which does not exist"),
        "{v}"
    );
}

#[test]
fn cycle_is_caught_and_an_acyclic_graph_passes() {
    let (mut m, _, [al, a, b, _, fr]) = g3_1();
    m.add_edge(fr, a);
    let v = only(&m, Rule::Cycle);
    let path: Vec<usize> = v.path.iter().map(|n| n.index).collect();
    assert_eq!(path, [a, b, fr]);
    assert_eq!(v.offending_edge, Some((fr, a)));
    let s = v.to_string();
    assert!(
        s.contains("node 'a' (kernel k, #1) → node 'b' (kernel k, #2) → node 'freeNode' (free node, #4) → node 'a' (kernel k, #1)"),
        "{s}"
    );
    let _ = al;
    // A self-loop.
    let mut m = Record::new();
    let x = m.add_node(NodeKind::Empty, &[]);
    m.add_edge(x, x);
    let v = only(&m, Rule::Cycle);
    assert_eq!(v.offending_edge, Some((x, x)));
}

// ---- The other seed fragments: legal graphs pass ----

#[test]
fn g3_2_captured_graph_passes() {
    // cudaMallocAsync; A on stream1; fork; B on stream1; C on stream2; join; cudaFreeAsync.
    // The capture turns event dependencies into edges: A → B, A → C, {B, C} → free.
    let mut m = Record::new();
    let dptr = m.add_allocation("allocation #1 (4.0 MiB at 0x7f0000000000)");
    let al = m.add_node(NodeKind::MemAlloc, &[]);
    m.allocates(al, dptr);
    let a = m.add_node(kernel("kernel_A"), &[al]);
    let b = m.add_node(kernel("kernel_B"), &[a]);
    let c = m.add_node(kernel("kernel_C"), &[a]);
    for k in [a, b, c] {
        m.uses(k, dptr);
    }
    let fr = m.add_node(NodeKind::MemFree, &[b, c]);
    m.frees(fr, dptr);
    assert_passes(&m);
    // Without the join (the free after B only), C is unordered with the free.
    m.remove_edge(c, fr);
    let v = only(&m, Rule::UnorderedWithFree);
    assert_eq!(v.node.index, c);
    assert!(
        v.to_string()
            .starts_with("kernel kernel_C #3 uses allocation #1 (4.0 MiB at 0x7f0000000000)"),
        "{v}"
    );
}

#[test]
fn g3_3_single_stream_ordering_passes() {
    // allocGraph holds the alloc node alone; kernel and cudaFreeAsync are stream work.
    let mut alloc_graph = Record::new();
    let dptr = alloc_graph.add_allocation("allocation 'dptr'");
    alloc(&mut alloc_graph, dptr, &[], "allocNode");
    assert_passes(&alloc_graph);
}

#[test]
fn g3_3_event_ordering_passes() {
    let mut alloc_graph = Record::new();
    let dptr = alloc_graph.add_allocation("allocation 'dptr'");
    alloc(&mut alloc_graph, dptr, &[], "allocNode");
    assert_passes(&alloc_graph);
    // The consuming and freeing graph: kernel a, then the free node (of another graph's
    // allocation: no alloc node here).
    let mut free_graph = Record::new();
    let dptr = free_graph.add_allocation("allocation 'dptr'");
    let a = user(&mut free_graph, dptr, &[], "a");
    free(&mut free_graph, dptr, &[a], "freeNode");
    assert_passes(&free_graph);
    // Freeing before the kernel: caught in the freeing graph.
    let mut bad = Record::new();
    let dptr = bad.add_allocation("allocation 'dptr'");
    let fr = free(&mut bad, dptr, &[], "freeNode");
    user(&mut bad, dptr, &[fr], "a");
    only(&bad, Rule::UseAfterFree);
}

/// G.3.3's third ordering: allocGraph = alloc → record(allocEvent); waitAndFreeGraph =
/// wait(streamUseDone), wait(allocReady) → kernel; free after kernel and wait(streamUseDone).
fn g3_3_event_nodes() -> (Record, Record, [usize; 4], AllocKey) {
    let mut alloc_graph = Record::new();
    let dptr = alloc_graph.add_allocation("allocation 'dptr'");
    let al = alloc(&mut alloc_graph, dptr, &[], "allocNode");
    node(&mut alloc_graph, NodeKind::EventRecord, &[al], "recordNode");
    let mut wf = Record::new();
    let dptr = wf.add_allocation("allocation 'dptr'");
    let done = node(&mut wf, NodeKind::EventWait, &[], "streamUseDoneEventNode");
    let ready = node(&mut wf, NodeKind::EventWait, &[], "allocReadyEventNode");
    let k = user(&mut wf, dptr, &[ready], "kernelNode");
    let fr = free(&mut wf, dptr, &[k, done], "freeNode");
    (alloc_graph, wf, [done, ready, k, fr], dptr)
}

#[test]
fn g3_3_event_node_ordering_passes() {
    let (alloc_graph, wait_and_free, ..) = g3_3_event_nodes();
    assert_passes(&alloc_graph);
    assert_passes(&wait_and_free);
}

#[test]
fn g3_3_free_node_not_after_the_consuming_kernel_is_caught() {
    let (_, mut wf, [_, _, k, fr], _) = g3_3_event_nodes();
    wf.remove_edge(k, fr);
    let v = only(&wf, Rule::UnorderedWithFree);
    assert_eq!((v.node.index, v.missing_edge), (k, Some((k, fr))));
}

#[test]
fn g3_3_kernel_not_after_the_event_wait_node_is_not_visible_in_one_graph() {
    // The documented limit (module docs, rule 4): which event wait node stands for the
    // allocation's readiness is not in one graph's record, so this passes the record's check.
    let (_, mut wf, [_, ready, k, _], _) = g3_3_event_nodes();
    wf.remove_edge(ready, k);
    assert_passes(&wf);
}

#[test]
fn g3_4_producer_and_consumers_pass() {
    // Producer: two allocations, one kernel, no frees (AutoFreeOnLaunch frees them).
    let mut producer = Record::new();
    let d1 = producer.add_allocation("allocation 'data1'");
    let d2 = producer.add_allocation("allocation 'data2'");
    let a1 = alloc(&mut producer, d1, &[], "malloc1");
    let a2 = alloc(&mut producer, d2, &[a1], "malloc2");
    let p = node(&mut producer, kernel("produce"), &[a2], "produce");
    producer.uses(p, d1);
    producer.uses(p, d2);
    assert_passes(&producer);
    // Consumers use the producer's allocations and free nothing.
    for name in ["consume1", "consume2"] {
        let mut consumer = Record::new();
        let d = consumer.add_allocation("allocation 'data'");
        user(&mut consumer, d, &[], name);
        assert_passes(&consumer);
    }
    // The final cudaFreeAsync of G.3.4 is stream work; a graph that frees both instead:
    let mut freeing = Record::new();
    let d1 = freeing.add_allocation("allocation 'data1'");
    let d2 = freeing.add_allocation("allocation 'data2'");
    let f1 = free(&mut freeing, d1, &[], "free1");
    free(&mut freeing, d2, &[f1], "free2");
    assert_passes(&freeing);
}

// ---- Errors: order, naming, sentences ----

#[test]
fn unlabelled_nodes_are_named_by_kind_and_position() {
    let mut m = Record::new();
    let buf = m.add_allocation("allocation #3 (1.0 MiB at 0x7f0000200000)");
    let al = m.add_node(NodeKind::MemAlloc, &[]);
    m.allocates(al, buf);
    let k = m.add_node(kernel("add_u32"), &[]);
    m.uses(k, buf);
    let v = only(&m, Rule::NotAfterAlloc);
    assert_eq!(
        v.to_string(),
        "kernel add_u32 #1 uses allocation #3 (1.0 MiB at 0x7f0000200000) but is not ordered after its alloc node, alloc node #0: the edge alloc node #0 → kernel add_u32 #1 is missing (add it, or a path of edges between them)"
    );
}

#[test]
fn every_rule_reads_as_one_sentence_and_violations_come_in_node_order() {
    let (mut m, buf, [.., c, fr]) = g3_1();
    user(&mut m, buf, &[c], "d"); // unordered with free
    user(&mut m, buf, &[], "e"); // not after alloc, unordered
    user(&mut m, buf, &[fr], "after"); // use after free
    free(&mut m, buf, &[fr], "again"); // freed twice
    alloc(&mut m, buf, &[], "realloc"); // allocated twice
    m.add_node(kernel("k"), &[1234]); // unknown dependency
    free(&mut m, AllocKey(42), &[], "ghost"); // unknown allocation
    m.set_freed_elsewhere(buf); // freed by two graphs
    let violations = check_record(&m);
    let mut rules: Vec<Rule> = violations.iter().map(|v| v.rule).collect();
    let indices: Vec<usize> = violations.iter().map(|v| v.node.index).collect();
    assert!(indices.is_sorted(), "{indices:?}");
    for v in &violations {
        assert_one_sentence(&v.to_string());
    }
    rules.sort();
    rules.dedup();
    assert_eq!(
        rules,
        [
            Rule::NotAfterAlloc,
            Rule::UseAfterFree,
            Rule::UnorderedWithFree,
            Rule::FreedTwice,
            Rule::FreedByTwoGraphs,
            Rule::AllocatedTwice,
            Rule::UnknownAllocation,
            Rule::UnknownDependency,
        ]
    );
    let error = LifetimeError { violations };
    let s = error.to_string();
    assert_one_sentence(&s);
    assert!(s.starts_with("graph allocation lifetime: "), "{s}");
    assert!(
        s.ends_with(&format!("(and {} more)", error.violations.len() - 1)),
        "{s}"
    );
    // The error converts into the crate's error type.
    let e = cuda_graph::Error::Lifetime(error);
    assert!(std::error::Error::source(&e).is_none());
}

#[test]
fn many_allocations_in_several_batches_are_each_checked() {
    // 300 independent chains: more than one batch of 64 in each pass; break one chain of each
    // kind far from the first batch.
    let mut m = Record::new();
    let mut chains = Vec::new();
    for i in 0..300 {
        let k = m.add_allocation(format!("allocation 'c{i}'"));
        let al = alloc(&mut m, k, &[], &format!("alloc{i}"));
        let u1 = user(&mut m, k, &[al], &format!("u{i}"));
        let u2 = user(&mut m, k, &[al], &format!("w{i}"));
        let fr = free(&mut m, k, &[u1, u2], &format!("free{i}"));
        chains.push((k, al, u1, u2, fr));
    }
    assert_passes(&m);
    let (k, _, _, _, fr) = chains[200];
    let x = user(&mut m, k, &[], "x"); // not after alloc, unordered with free
    let (k2, al2, u2, _, _) = chains[250];
    m.remove_edge(al2, u2); // not after alloc
    let (_, al3, _, w3, fr3) = chains[130];
    m.remove_edge(w3, fr3); // unordered with free
    let got: Vec<(usize, Rule)> = check_record(&m)
        .iter()
        .map(|v| (v.node.index, v.rule))
        .collect();
    let mut want = vec![
        (x, Rule::NotAfterAlloc),
        (x, Rule::UnorderedWithFree),
        (u2, Rule::NotAfterAlloc),
        (w3, Rule::UnorderedWithFree),
    ];
    want.sort();
    assert_eq!(got, want);
    let _ = (fr, k2, al3);
}
