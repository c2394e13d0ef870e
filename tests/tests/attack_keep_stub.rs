//! Attacks on the rule that graph allocations are held by the records that name them and by
//! executable graphs (`Roles`), not by keep lists: whenever an allocation's last handle goes
//! while it is live, its free on the device's private stream must wait for every launch that
//! allocated or used it; an allocation never live after a launch is never freed by a handle;
//! and every node that names an allocation is in a record that holds it.
//!
//! The driver is the launch-log variant of `stub-driver/null_cuda.c` (`launch_log_common`): a
//! log of graph launches, event records, event waits and frees outside captures (the order the
//! GPU would see them in), conditional nodes, and two faults for captures: a
//! `cuStreamGetCaptureInfo` that fails, or reports no node, right after a captured kernel
//! launch. Each test runs in a process of its own, under a watchdog that fails it after 60 s.

#![allow(clippy::undocumented_unsafe_blocks)]

mod launch_log_common;

use std::ffi::c_int;

use cuda_graph::{
    AllocParams, AsStream, BorrowedStream, CaptureMode, ConditionalKind, DeviceBuffer, Error,
    ExecGraph, Function, Graph, GraphAllocation, InstantiateFlags, KernelArgs, Stream, capture,
    flush_deferred,
};
use launch_log_common::{
    BYTES, Entry, N, config, fault_after_next_launch, filling, isolated, launched_owner, log, stub,
};

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

fn live() -> isize {
    cuda_graph::live_objects().graph_allocations
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
