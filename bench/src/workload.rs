//! What the three paths have in common: the workloads' shape, what one run of a workload
//! measures, the error type, and the [`Workloads`] trait each path implements.

use std::fmt;
use std::time::Duration;

use cuda_graph::sys;

/// An error of the benchmark, in words. CUDA errors name the call that failed, its code's name
/// and text (`cuGraphLaunch failed: CUDA_ERROR_INVALID_VALUE: invalid argument`); the callers
/// add which path and workload it was.
#[derive(Debug, Clone)]
pub struct BenchError(pub String);

impl BenchError {
    /// The same error, after `what` (`"safe path, explicit graph, k = 10: ..."`).
    pub fn context(self, what: impl fmt::Display) -> BenchError {
        BenchError(format!("{what}: {}", self.0))
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

impl From<cuda_graph::Error> for BenchError {
    fn from(e: cuda_graph::Error) -> Self {
        BenchError(e.to_string())
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        BenchError(e.to_string())
    }
}

/// `Result` with [`BenchError`].
pub type Result<T> = std::result::Result<T, BenchError>;

/// Turns a driver status into a `Result` that names the call.
#[inline]
pub fn driver(code: sys::CUresult, call: &'static str) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_failure(code, call))
    }
}

#[cold]
#[inline(never)]
fn driver_failure(code: sys::CUresult, call: &'static str) -> BenchError {
    let name = code
        .name()
        .map(str::to_string)
        .unwrap_or_else(|| format!("CUDA_ERROR_{}", code.0));
    let mut text = std::ptr::null();
    // SAFETY: `text` is a valid out-pointer; the driver stores a static string or nothing.
    let status = unsafe { sys::cuGetErrorString(code, &mut text) };
    let mut message = format!("{call} failed: {name}");
    if status == sys::CUresult::CUDA_SUCCESS && !text.is_null() {
        // SAFETY: on success the driver returned a NUL-terminated static string.
        let text = unsafe { std::ffi::CStr::from_ptr(text) };
        message.push_str(": ");
        message.push_str(&text.to_string_lossy());
    }
    let unreachable = matches!(
        code,
        sys::CUresult::CUDA_ERROR_NO_DEVICE | sys::CUresult::CUDA_ERROR_NOT_FOUND
    );
    if let Some(load) = sys::loader::driver_load_error().filter(|_| unreachable) {
        message.push_str(&format!(" ({load})"));
    }
    BenchError(message)
}

/// The launch shape of the chain's kernel, `fill_u32(p, elements, i)`: the same in every path.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// 32-bit elements per allocation.
    pub elements: u64,
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
}

impl Shape {
    /// Bytes per allocation.
    pub fn bytes(&self) -> usize {
        self.elements as usize * 4
    }
}

/// Which chain a graph workload builds, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// `cuGraphAddMemAllocNode` / kernel node / `cuGraphAddMemFreeNode`.
    Explicit,
    /// Stream capture of `cuMemAllocAsync` / kernel launch / `cuMemFreeAsync`.
    Capture,
    /// Explicit alloc and kernel nodes without free nodes: every segment's allocation escapes
    /// the graph (G.3.3), and the graph is instantiated with AutoFreeOnLaunch, so that each
    /// launch first frees what the previous launch left. The safe API launches it on its slow
    /// path (locks, ordering, an event per allocation); the other paths make the same
    /// `cuGraphLaunch` without that bookkeeping.
    Escaping,
}

impl Mode {
    /// Every graph workload that is launched, in the order they run.
    pub const ALL: [Mode; 3] = [Mode::Explicit, Mode::Capture, Mode::Escaping];

    /// The chains that free every allocation they make (the safe API's fast launch path),
    /// which the build + instantiate cycles also time.
    pub const FREED: [Mode; 2] = [Mode::Explicit, Mode::Capture];

    /// The name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Explicit => "explicit graph",
            Mode::Capture => "captured graph",
            Mode::Escaping => "escaping graph",
        }
    }

    /// Whether the graph's allocations escape it (instantiated with AutoFreeOnLaunch).
    pub fn escapes(self) -> bool {
        self == Mode::Escaping
    }
}

/// One of the three ways the same work is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathId {
    /// The safe API (`cuda-graph`).
    Safe,
    /// Raw `cuda-graph-sys` driver calls.
    Raw,
    /// C with the runtime API (`c/graph_bench.c`).
    C,
}

impl PathId {
    /// The three, in table order.
    pub const ALL: [PathId; 3] = [PathId::Safe, PathId::Raw, PathId::C];

    /// The short name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            PathId::Safe => "safe",
            PathId::Raw => "raw",
            PathId::C => "C",
        }
    }
}

/// How many launches and iterations one run makes.
#[derive(Clone, Copy, Debug)]
pub struct Counts {
    /// Launches between the start of the steady measurement and its one synchronize; also the
    /// iterations of the workload without a graph.
    pub launches: u32,
    /// Iterations of launch + synchronize.
    pub sync_iters: u32,
}

/// What [`Workloads::graph_chain`] measured. The build and instantiation are not timed there:
/// [`Workloads::build_instantiate`] times them, many times.
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphRun {
    /// The safe path only: `Graph::check` alone (the checks' share of the instantiation).
    pub check: Option<Duration>,
    /// The first launch and a synchronize.
    pub first_launch: Duration,
}

/// One steady launch measurement ([`Workloads::steady`]), totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct SteadyRun {
    /// `launches` launches, before the synchronize.
    pub enqueue: Duration,
    /// `launches` launches and one synchronize.
    pub total: Duration,
}

/// What one build + instantiate cycle measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct CycleRun {
    /// Building the graph: creating it and adding 3k nodes, or the whole capture.
    pub build: Duration,
    /// Instantiating it (the safe path: with or without the lifetime checks, as asked).
    pub instantiate: Duration,
}

/// What one step of the kernel chain's update measured ([`Workloads::update_step`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct UpdateRun {
    /// Building the step's graph: creating it and adding its k kernel nodes.
    pub build: Duration,
    /// Updating the kept executable graph in place from that graph.
    pub update: Duration,
    /// Instantiating a graph built the same way (a second build, not timed).
    pub instantiate: Duration,
}

/// The value node `i` of the kernel chain adds at step `step` (`add_u32(p, n, v)`); the C
/// baseline computes the same (`update_value` in `c/graph_bench.c`).
pub fn update_value(step: u32, i: u32) -> u32 {
    step.wrapping_add(i)
}

/// What one launch of step `step`'s kernel chain of `k` nodes adds to every element.
pub fn update_sum(k: u32, step: u32) -> u32 {
    (0..k).fold(0u32, |sum, i| sum.wrapping_add(update_value(step, i)))
}

/// Checks the buffer read back after a launch of the executable graph updated to step `step`
/// (zeroed before the launch): every element must be [`update_sum`]; an element that is not
/// shows that the update did not take effect on every node.
pub fn verify_update(values: &[u32], k: u32, step: u32) -> Result<()> {
    let want = update_sum(k, step);
    match values.iter().position(|&v| v != want) {
        None => Ok(()),
        Some(at) => Err(BenchError(format!(
            "wrong result after the update to step {step} (k = {k}): element {at} of {} is {}, expected {want} (the sum of the step's values; step {} gives {})",
            values.len(),
            values[at],
            step.wrapping_sub(1),
            update_sum(k, step.wrapping_sub(1)),
        ))),
    }
}

/// What one run of the workload without graphs measured (totals).
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamRun {
    /// `iters` × k × (alloc, kernel, free) queued, before the synchronize.
    pub enqueue: Duration,
    /// The same and one synchronize.
    pub total: Duration,
}

/// The workloads, as each path writes them.
pub trait Workloads {
    /// Which path this is.
    fn id(&self) -> PathId;

    /// A chain of `k` segments alloc → kernel → free, each after the previous free, built with
    /// `mode` (for [`Mode::Escaping`]: alloc → kernel, each after the previous kernel, nothing
    /// freed, instantiated with AutoFreeOnLaunch), instantiated and launched once. The
    /// executable graph stays for [`steady`](Workloads::steady) and
    /// [`launch_sync`](Workloads::launch_sync) until [`release_chain`](Workloads::release_chain)
    /// or the next call.
    fn graph_chain(&mut self, mode: Mode, k: u32, shape: Shape) -> Result<GraphRun>;

    /// `launches` launches of the chain the last `graph_chain` left, then one synchronize.
    fn steady(&mut self, launches: u32) -> Result<SteadyRun>;

    /// `iters` times launch + synchronize of the chain the last `graph_chain` left.
    fn launch_sync(&mut self, iters: u32) -> Result<Duration>;

    /// Destroys the chain the last `graph_chain` left, if any, once its launches are done; frees
    /// the allocations its last launch left live ([`Mode::Escaping`]).
    fn release_chain(&mut self) -> Result<()>;

    /// One build + instantiate cycle of the same chain: built with `mode`, instantiated, then
    /// destroyed without a launch. `checked` asks the safe path for its lifetime checks (on in
    /// a user's `Graph::instantiate`, off in `instantiate_unchecked`); the others ignore it.
    fn build_instantiate(
        &mut self,
        mode: Mode,
        k: u32,
        shape: Shape,
        checked: bool,
    ) -> Result<CycleRun>;

    /// Whether this path also instantiates without checks (`checked == false` differs).
    fn has_unchecked(&self) -> bool {
        false
    }

    /// The same work without a graph: `iters` times k × (stream-ordered alloc, kernel,
    /// stream-ordered free) on one stream, then one synchronize.
    fn stream_chain(&mut self, k: u32, shape: Shape, iters: u32) -> Result<StreamRun>;

    /// Sets up the kernel chain for [`update_step`](Workloads::update_step): a device buffer of
    /// `shape.elements` values and an executable graph instantiated from step 0's chain, a graph
    /// of `k` kernel nodes `add_u32(buffer, elements, update_value(0, i))`, each after the
    /// previous one, without memory nodes (an update cannot change an alloc node's address,
    /// which is fixed for the life of its graph). Releases the chain of a previous call first.
    fn update_chain(&mut self, k: u32, shape: Shape) -> Result<()>;

    /// One step of the kernel chain (`step` ≥ 1): builds the chain with step `step`'s values
    /// ([`update_value`]) and updates the kept executable graph in place from it; builds it again
    /// and instantiates that graph, then destroys the new executable graph without a launch;
    /// then zeroes the buffer, launches the updated executable graph, synchronizes and checks the
    /// buffer ([`verify_update`]). Times the first build, the update and the instantiation.
    fn update_step(&mut self, step: u32) -> Result<UpdateRun>;

    /// Destroys what [`update_chain`](Workloads::update_chain) set up, if anything, once its
    /// launches are done.
    fn release_update(&mut self) -> Result<()>;
}
