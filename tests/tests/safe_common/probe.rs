//! The reuse probe of the design guide ("Testing": test what the tools cannot see), and what the
//! soundness tests need around it: kernels that only spin, reading device memory back, and a
//! watchdog for calls that may hang.
//!
//! compute-sanitizer memcheck does not see a memset or memcpy node writing freed memory, nor a
//! graph reading another allocation's physical pages (the guide's G.4.2), and the used-memory
//! attributes do not drop on a premature free. What does show it is the memory itself:
//!
//! 1. after the suspect drop or free, allocate the same size the same way (it tends to get the
//!    same address, or for graph memory the same physical pages): the *probe*;
//! 2. fill the probe with [`PATTERN`];
//! 3. let the suspect work run, slowed down where needed by a spin kernel ([`spin`],
//!    [`add_spin_node`]) queued ahead of it, so that it runs after the probe is filled;
//! 4. synchronize and check that the probe still holds the pattern ([`assert_intact`]).
//!
//! Whether the probe got the freed address is reported ([`assert_intact`] prints it) but never
//! decides the verdict on its own: a probe at another address proves nothing either way, and
//! after a fix that keeps the owner alive the probe *must* get another address. Each test also
//! has a control: the same work with the owner kept alive, whose output is verified, so that a
//! broken kernel or a wrong expectation cannot pass for a sound library.
//!
//! This file depends only on `cuda_graph`, so that any test binary can include it with
//! `#[path = "safe_common/probe.rs"] mod probe;`.

#![allow(dead_code)] // each test binary uses a part

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuda_graph::sys;
use cuda_graph::{AsStream, Device, Function, Graph, KernelArgs, LaunchConfig, Node};

/// What probes are filled with: not a value any test kernel writes.
pub const PATTERN: u32 = 0x5A5A_A5A5;

/// Clock cycles of a spin of about 20 ms on the H200 (about 2 GHz).
pub const SPIN_20_MS: u64 = 40_000_000;

/// Clock cycles of a spin of about 50 ms.
pub const SPIN_50_MS: u64 = 100_000_000;

/// Clock cycles of a spin of about 100 ms: for races that involve other host threads.
pub const SPIN_100_MS: u64 = 200_000_000;

/// One block of one thread: the shape of a spin kernel.
pub fn one_thread() -> LaunchConfig {
    LaunchConfig::new((1, 1, 1), (1, 1, 1))
}

/// The arguments of `spin_then_fill_u32(p, n, v, cycles)` for a kernel that spins `cycles`
/// clock cycles and writes nothing (`n` = 0, so `p` is never dereferenced).
fn spin_args(cycles: u64) -> KernelArgs<'static> {
    KernelArgs::new()
        .value(0u64)
        .value(0u64)
        .value(0u32)
        .value(cycles)
}

/// Queues a kernel on `stream` that only spins for `cycles` clock cycles; `spin_then_fill` is
/// the `spin_then_fill_u32` kernel. Work queued after it on the stream starts that much later.
#[track_caller]
pub fn spin(spin_then_fill: &Function, stream: &impl AsStream, cycles: u64) {
    // SAFETY: spin_then_fill_u32(unsigned* p, unsigned long long n, unsigned v,
    // unsigned long long spins) with n = 0: the null address is never dereferenced.
    unsafe { spin_then_fill.launch(stream, one_thread(), &spin_args(cycles)) }
        .expect("launch the spin kernel");
}

/// Adds a kernel node that only spins for `cycles` clock cycles, after `deps`.
#[track_caller]
pub fn add_spin_node(
    graph: &mut Graph,
    deps: &[Node],
    spin_then_fill: &Function,
    cycles: u64,
) -> Node {
    // SAFETY: as in `spin`: n = 0, the null address is never dereferenced.
    unsafe { graph.add_kernel_node(deps, spin_then_fill, one_thread(), &spin_args(cycles)) }
        .expect("add the spin kernel node")
}

/// Reads `n` 32-bit words of device memory at `ptr`, after all work of the device
/// (`cuCtxSynchronize`, then `cuMemcpyDtoH`). The error names the failing call and its code:
/// a suspect write to unmapped memory shows up here as `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub fn read_words(device: &Device, ptr: sys::CUdeviceptr, n: usize) -> Result<Vec<u32>, String> {
    device
        .synchronize()
        .map_err(|e| format!("cuCtxSynchronize: {e}"))?;
    let mut out = vec![0u32; n];
    // SAFETY: `out` holds `n` words; the caller names `n` words of device memory at `ptr` that
    // are allocated (a failure is an error code, not undefined behaviour on the host); the
    // device's context is current (bound by `synchronize`).
    let status = unsafe { sys::cuMemcpyDtoH(out.as_mut_ptr().cast(), ptr, n * 4) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemcpyDtoH: {status:?}"));
    }
    Ok(out)
}

/// The verdict of a reuse probe: every word of `got` (read back from the probe) must still be
/// `pattern`. Prints whether the probe got the suspect's address (`freed`) and how many words
/// the suspect work overwrote; panics naming the first overwritten word.
#[track_caller]
pub fn assert_intact(
    what: &str,
    freed: sys::CUdeviceptr,
    probe: sys::CUdeviceptr,
    got: &[u32],
    pattern: u32,
) {
    let same = freed == probe;
    let overwritten = got.iter().filter(|&&v| v != pattern).count();
    println!(
        "PROBE {what}: probe at {probe:#x}, the suspect's memory at {freed:#x} (same address: {}), {overwritten} of {} words overwritten",
        if same { "yes" } else { "no" },
        got.len()
    );
    if let Some((i, v)) = got.iter().enumerate().find(|&(_, &v)| v != pattern) {
        panic!(
            "{what}: the probe was overwritten: word {i} is {v:#x}, expected the pattern {pattern:#x} ({overwritten} of {} words differ; the probe {} the freed memory's address {freed:#x})",
            got.len(),
            if same { "got" } else { "did not get" },
        );
    }
}

/// Aborts the process with a message when it is still armed after `limit`: a call that hangs
/// (a driver call on memory that was freed under it) must fail the test, not block the suite.
/// Disarmed when dropped.
#[derive(Debug)]
pub struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    /// Arms a watchdog for `what`.
    pub fn arm(what: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !flag.load(Ordering::Acquire) {
                if start.elapsed() > limit {
                    eprintln!(
                        "WATCHDOG {what}: still running after {limit:?}: a driver call hangs; aborting the process"
                    );
                    print_stacks();
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Watchdog { done }
    }
}

/// Prints every thread's stack through the debugger that `CUDA_GRAPH_WATCHDOG_DEBUGGER` names
/// (`gdb` or `cuda-gdb`), attached to this process, so that a hang shows where each thread
/// waits. Nothing when the variable is unset or the debugger cannot run.
fn print_stacks() {
    let Some(debugger) = std::env::var_os("CUDA_GRAPH_WATCHDOG_DEBUGGER") else {
        return;
    };
    let pid = std::process::id().to_string();
    match std::process::Command::new(&debugger)
        .args(["-p", &pid, "-batch", "-ex", "thread apply all bt"])
        .output()
    {
        Ok(out) => eprintln!(
            "WATCHDOG stacks ({debugger:?}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("WATCHDOG: {debugger:?} did not run: {e}"),
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}
