//! Stream capture read back into the record, without a GPU: the stub driver
//! (`stub-driver/null_cuda.c`) simulates the capture of one stream, whose captured calls read
//! back as a chain of nodes. On an owned stream the record matches each node to the call that
//! made it by the order the driver lists them in, and refuses a graph whose order the edges do
//! not confirm or that holds nodes the crate did not capture; on a borrowed stream it asks the
//! driver for each call's node, in the driver's order or not, and reads the nodes it did not
//! make (raw driver calls on the capturing stream) through the driver. One test, in a process
//! of its own: the stub captures one stream at a time.

mod stub_common;

use std::ffi::{CString, c_int};

use cuda_graph::check::Rule;
use cuda_graph::{
    AsStream, CaptureMode, Error, Function, Graph, GraphAllocation, InstantiateFlags, KernelArgs,
    MemRole, NodeKind, NodeRecord, Stream, StreamFlags, capture, sys,
};
use stub_common::{BYTES, N, config, stub, stub_path};

/// Has the stub list a captured graph's nodes in reverse order (or in the order captured).
fn reverse_node_order(reversed: bool) {
    let path = stub_path().expect("the stub driver was found before it was loaded");
    let path = CString::new(path.into_os_string().into_encoded_bytes()).unwrap();
    let name = CString::new("null_cuda_reverse_node_order").unwrap();
    // SAFETY: the stub is already loaded (RTLD_NOLOAD finds it); the symbol is a C function
    // taking an int, and the handle is released after the call.
    unsafe {
        let lib = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!lib.is_null(), "the stub driver is loaded");
        let f = libc::dlsym(lib, name.as_ptr());
        assert!(
            !f.is_null(),
            "the stub exports null_cuda_reverse_node_order"
        );
        let f: extern "C" fn(c_int) = std::mem::transmute(f);
        f(c_int::from(reversed));
        libc::dlclose(lib);
    }
}

/// Launches `fill` over `buf` in the capture.
fn launch<S: AsStream>(cap: &cuda_graph::Capture<'_, S>, fill: &Function, buf: &GraphAllocation) {
    let args = KernelArgs::new().ptr(buf).value(N).value(1u32);
    // SAFETY: the stub driver runs nothing; the arguments match fill_u32(p, n, v).
    unsafe { cap.launch(fill, config(), &args) }.expect("captured launch");
}

/// `k` captured segments alloc → kernel → free, on `stream`.
fn try_captured_chain<S: AsStream>(stream: &S, fill: &Function, k: usize) -> Result<Graph, Error> {
    let (graph, ()) = capture(stream, CaptureMode::Global, |cap| {
        for _ in 0..k {
            let buf = cap.malloc_async(BYTES)?;
            launch(cap, fill, &buf);
            cap.free_async(&buf)?;
        }
        Ok(())
    })?;
    Ok(graph)
}

/// The allocation a memory node of `graph` allocates or frees.
fn allocation<'g>(graph: &'g Graph, node: &NodeRecord) -> &'g GraphAllocation {
    match node.refs() {
        [(MemRole::Alloc | MemRole::Free, k)] => graph.record().allocation(*k).unwrap(),
        other => panic!("expected one memory operation, got {other:?}"),
    }
}

/// The record of a captured chain of `k` segments, listed by the driver in capture order or
/// reversed: each node's kind, its one dependency (the node captured before it), and the
/// allocation its alloc node makes, its kernel uses and its free node frees.
fn assert_chain(graph: &Graph, k: usize, reversed: bool) {
    let nodes = graph.nodes();
    assert_eq!(nodes.len(), 3 * k);
    // Position in the record of the node captured `i`-th.
    let at = |i: usize| if reversed { 3 * k - 1 - i } else { i };
    for s in 0..k {
        let (a, kn, f) = (
            &nodes[at(3 * s)],
            &nodes[at(3 * s + 1)],
            &nodes[at(3 * s + 2)],
        );
        assert_eq!(a.kind(), NodeKind::MemAlloc, "segment {s}");
        assert_eq!(kn.kind().to_string(), "kernel fill_u32", "segment {s}");
        assert_eq!(f.kind(), NodeKind::MemFree, "segment {s}");
        let made = allocation(graph, a);
        assert!(matches!(a.refs()[0], (MemRole::Alloc, _)));
        assert!(matches!(f.refs()[0], (MemRole::Free, _)));
        assert_eq!(
            allocation(graph, f).id(),
            made.id(),
            "segment {s}: the free frees its alloc"
        );
        let uses: Vec<_> = graph.record().allocations_of(kn, MemRole::Use).collect();
        assert_eq!(uses.len(), 1);
        assert_eq!(uses[0].id(), made.id(), "segment {s}: the kernel uses it");
        assert_eq!(made.owner_graph(), graph.id());
    }
    for i in 0..3 * k {
        let deps: Vec<u32> = if i == 0 {
            vec![]
        } else {
            vec![at(i - 1) as u32]
        };
        assert_eq!(nodes[at(i)].deps(), deps, "captured node {i}");
    }
}

/// A kernel captured after the free of its allocation is reported.
fn assert_use_after_free_found<S: AsStream>(stream: &S, fill: &Function, what: &str) {
    let (graph, ()) = capture(stream, CaptureMode::Global, |cap| {
        let buf = cap.malloc_async(BYTES)?;
        cap.free_async(&buf)?;
        launch(cap, fill, &buf);
        Ok(())
    })
    .unwrap();
    match graph.check() {
        Err(Error::Lifetime(e)) => {
            let rules: Vec<Rule> = e.violations.iter().map(|v| v.rule).collect();
            assert_eq!(rules, vec![Rule::UseAfterFree], "{what}");
        }
        other => panic!("{what}: expected a use after free, got {other:?}"),
    }
}

/// Raw driver calls on the capturing stream: a free of the capture's allocation, then an
/// allocation and its free. Returns the capture's allocation and the raw one's address.
fn capture_with_raw_calls<S: AsStream>(
    stream: &S,
    fill: &Function,
) -> (Result<Graph, Error>, sys::CUdeviceptr) {
    let raw = stream.as_raw_stream();
    let mut raw_ptr = 0;
    let graph = capture(stream, CaptureMode::Global, |cap| {
        let buf = cap.malloc_async(BYTES)?;
        launch(cap, fill, &buf);
        // SAFETY: the stream is capturing; the address is the capture's allocation.
        let freed = unsafe { sys::cuMemFreeAsync(buf.ptr(), raw) };
        assert_eq!(freed, sys::CUresult::CUDA_SUCCESS);
        // SAFETY: valid out-pointer; the stream is capturing.
        let made = unsafe { sys::cuMemAllocAsync(&mut raw_ptr, BYTES, raw) };
        assert_eq!(made, sys::CUresult::CUDA_SUCCESS);
        // SAFETY: frees the raw allocation just made, once.
        let freed = unsafe { sys::cuMemFreeAsync(raw_ptr, raw) };
        assert_eq!(freed, sys::CUresult::CUDA_SUCCESS);
        Ok(buf)
    });
    (graph.map(|(graph, _)| graph), raw_ptr)
}

#[test]
fn captured_graphs_read_back_into_the_record() {
    let Some((device, fill, _module)) = stub("captured_graphs_read_back_into_the_record") else {
        return;
    };
    let stream = Stream::with_flags(&device, StreamFlags::NON_BLOCKING, 0).unwrap();
    for reversed in [false, true] {
        reverse_node_order(reversed);
        for k in [1, 3, 100] {
            // On an owned stream the nodes are matched to the calls by their order, which the
            // edges between consecutive calls confirm: listed in another order, the capture
            // cannot be checked, and says so.
            match try_captured_chain(&stream, &fill, k) {
                Ok(graph) if !reversed => {
                    assert_chain(&graph, k, false);
                    graph.instantiate(InstantiateFlags::NONE).unwrap();
                }
                Err(Error::CaptureNotMatched {
                    call: "Capture::end",
                    captured,
                    found,
                }) if reversed => assert_eq!((captured, found), (3 * k, 3 * k)),
                other => panic!("owned stream, k = {k}, reversed: {reversed}: {other:?}"),
            }
            // A borrowed stream asks the driver for each call's node: any order is read.
            let graph = try_captured_chain(&stream.borrow(), &fill, k).unwrap();
            assert_chain(&graph, k, reversed);
            graph.instantiate(InstantiateFlags::NONE).unwrap();
        }
        if !reversed {
            assert_use_after_free_found(&stream, &fill, "owned stream");
        }
        assert_use_after_free_found(&stream.borrow(), &fill, "borrowed stream");
    }
    reverse_node_order(false);

    // Raw driver calls on a capturing owned stream make nodes the crate did not capture: the
    // nodes cannot be matched by their order, and the capture says so.
    let (graph, _) = capture_with_raw_calls(&stream, &fill);
    match graph {
        Err(Error::CaptureNotMatched {
            captured: 2,
            found: 5,
            ..
        }) => {}
        other => panic!("raw calls on an owned stream: {other:?}"),
    }
    // On a borrowed stream they are read: the record asks the driver for their type and
    // matches memory nodes by address. A raw free of the capture's allocation frees that
    // allocation; a raw alloc becomes a new one, which a raw free then frees.
    let (graph, raw_ptr) = capture_with_raw_calls(&stream.borrow(), &fill);
    let graph = graph.unwrap();
    let nodes = graph.nodes();
    let kinds: Vec<String> = nodes.iter().map(|n| n.kind().to_string()).collect();
    assert_eq!(
        kinds,
        [
            "alloc node",
            "kernel fill_u32",
            "free node",
            "alloc node",
            "free node"
        ]
    );
    let buf = allocation(&graph, &nodes[0]).clone();
    assert_eq!(
        allocation(&graph, &nodes[2]).id(),
        buf.id(),
        "the raw free frees buf"
    );
    let other = allocation(&graph, &nodes[3]);
    assert_eq!((other.ptr(), other.bytes()), (raw_ptr, BYTES));
    assert_ne!(other.id(), buf.id());
    assert_eq!(
        allocation(&graph, &nodes[4]).id(),
        other.id(),
        "the raw free frees it"
    );
    graph.instantiate(InstantiateFlags::NONE).unwrap();
}
