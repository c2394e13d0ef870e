//! Attacks on `ExecGraph::update`, `ExecGraph::set_kernel_node_params`, child graphs,
//! conditional bodies and the `into_raw`/`from_raw` hand-overs of streams and events, on the
//! host, without a GPU: what an executable graph keeps, tracks and refuses stays right.
//!
//! Two drivers: the launch-log variant of `stub-driver/null_cuda.c` (`launch_log_common`: a
//! log of launches, event records, waits and frees; `cuGraphExecUpdate` that can be made to
//! refuse; `cuEventQuery` that can be made to answer "not ready"), and the checking stub
//! `stub-driver/hunt_cuda.c` (managed memory that GPU work writes when it runs). Each test runs
//! in a process of its own.

#![allow(clippy::undocumented_unsafe_blocks)]

#[cfg(cuda_graph_tests_hunt_stub)]
mod hunt_common;
mod launch_log_common;

use std::sync::Arc;

#[cfg(cuda_graph_child_move)]
use cuda_graph::AllocParams;
use cuda_graph::KernelArgs;
#[cfg(cuda_graph_tests_hunt_stub)]
use cuda_graph::{AsStream, DeviceBuffer, LaunchConfig, Module};
use cuda_graph::{
    BorrowedStream, ConditionalKind, Device, Error, Event, Graph, InstantiateFlags, Stream,
    UpdateRefusal, flush_deferred,
};
use launch_log_common::{BYTES, Entry, N, config, filling, isolated, launched_owner, log, stub};

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

/// `set_kernel_node_params` refuses, before the driver is called, a node added to the graph
/// after the executable graph was made from it: the executable graph has no such node, and the
/// checks made at instantiation did not see what it uses.
#[test]
fn set_kernel_node_params_refuses_a_node_added_after_the_instantiation() {
    isolated(
        "set_kernel_node_params_refuses_a_node_added_after_the_instantiation",
        || {
            let (device, _module, fill) = stub();
            let buffer = cuda_graph::DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
            let mut graph = filling(&device, &fill, &buffer);
            let mut exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
            let args = KernelArgs::new().ptr(&buffer).value(N).value(2u32);
            // SAFETY: fill_u32 over the buffer's N words; the stub runs nothing.
            let later = unsafe { graph.add_kernel_node(&[], &fill, config(), &args) }.unwrap();
            let before = launch_log_common::set_params();
            // SAFETY: as above.
            let set = unsafe { exec.set_kernel_node_params(&graph, later, &fill, config(), &args) };
            assert!(
                matches!(set, Err(Error::InvalidArgument { .. })),
                "a node added after the instantiation: {set:?}"
            );
            assert_eq!(
                launch_log_common::set_params(),
                before,
                "the driver was not called"
            );
        },
    );
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
            launch_log_common::refuse_update(true);
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
            let updates = launch_log_common::updates();
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
            assert_eq!(
                launch_log_common::updates(),
                updates,
                "the driver was not asked"
            );
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
                launch_log_common::not_ready(true);
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
                launch_log_common::not_ready(false);
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
