//! Releases the crate puts off, the captures that make it put them off, and the record of
//! driver errors met in `Drop`.
//!
//! A release (a free, an unload, a destroy) cannot always run when its owner drops:
//! - **a capture forbids it.** While a capture is active in `CU_STREAM_CAPTURE_MODE_GLOBAL`,
//!   "potentially unsafe" calls such as `cuMemFree` fail on every thread, and on the capturing
//!   thread in `THREAD_LOCAL` mode too; a stream-ordered free on a stream that takes part in a
//!   capture would be captured into the graph instead of running. The crate knows the captures
//!   it began ([`Capture`](crate::Capture) registers them here) and queues such releases until
//!   they end. Captures begun by other code are not known: a release that then fails is recorded
//!   ([`Device::drop_errors`](crate::Device::drop_errors)), not retried.
//! - **the GPU still needs it.** What the nodes of an executable graph refer to is released
//!   once the event after its last launch has completed ([`crate::ExecGraph`]'s drop); until
//!   then the release waits in the queue. A graph handed over with `Graph::into_raw` keeps its
//!   list in a CUDA user object, whose destructor runs on a driver thread, which must not call
//!   CUDA: it only queues the release.
//!
//! The queue is one per process, whatever `Device` handle queued a job (each job holds its own
//! device). It is worked through when the last registered capture ends, at stream and device
//! synchronization, instantiation, when an executable graph or stream is dropped, by
//! [`flush_deferred`], and by the crate's release thread (`cuda-graph-release`, started at the
//! first release that waits for the GPU or comes from a driver thread), which is woken then and
//! looks at the queue every [`POLL`] while anything waits in it: memory the GPU is done with is
//! not held until the program's next call.
//!
//! When the process exits, an exit handler (registered after `cuInit`, so it runs before the
//! driver's own teardown) stops all of this: releases still queued, or put off from then on,
//! are left to the process's end, and the handler waits (at most 2 s) for releases already
//! running. Without it, destructors the driver runs as in-flight work completes during exit
//! would set the release thread calling the driver while it is torn down.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{
    Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::thread::ThreadId;

use crate::error::Error;
use crate::keep::Keep;
use crate::sys;

/// A queued release of something of device `.0`: returns `true` once done, `false` to stay
/// queued (its stream still captures). Runs only when no registered capture forbids releases.
pub(crate) type Job = (usize, Box<dyn FnMut() -> bool + Send>);

static QUEUE: Mutex<Vec<Job>> = Mutex::new(Vec::new());
/// Jobs queued or being run by a flush, readable without the lock (a flush point that finds 0
/// costs one load; a stream is destroyed at once only when no job, queued or running, may name
/// it).
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// Orders releases against the beginning of captures: a release holds it shared from its check
/// ([`release_allowed`]) to its end, [`Capture`](crate::Capture)'s beginning holds it exclusive
/// until the capture is registered. So no release runs inside a capture that began after its
/// check, and no free checked "not capturing" is captured.
///
/// Lock order: the gate, then graph allocations' state locks. A release can start under those
/// locks (an event dropped while a launch records its uses), and std's `RwLock` makes a new
/// shared hold wait while an exclusive one is waiting: a thread that took an allocation's lock
/// first and the gate second would wait behind a `Capture::begin` that waits for a holder of
/// the gate that waits for that allocation's lock. Every path that locks allocations' states
/// takes the gate first; nested holds on one thread do not touch the lock.
///
/// No user code runs under it: what a finished job holds (a keep list with a host closure's
/// captures) is dropped once the thread lets go of it ([`dispose`]).
static GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// How many [`Gate`]s this thread holds (a release may drop values whose release nests).
    static GATE_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Finished jobs whose drop waits until this thread lets go of the gate ([`dispose`])...
    static AFTER_GATE: RefCell<Vec<Job>> = const { RefCell::new(Vec::new()) };
    /// ...and whether it holds any: the outermost [`Gate`]'s drop, on every launch's path,
    /// reads this flag rather than the list.
    static AFTER_GATE_PENDING: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread runs a host node's function (a driver thread, where CUDA must not
    /// be called).
    static IN_HOST_FUNCTION: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as running a host node's function until the value drops: the
/// crate then refuses to bind a context ([`crate::Device::bind`]) and queues releases.
pub(crate) struct InHostFunction(());

impl InHostFunction {
    pub(crate) fn enter() -> InHostFunction {
        IN_HOST_FUNCTION.set(true);
        InHostFunction(())
    }
}

impl Drop for InHostFunction {
    fn drop(&mut self) {
        IN_HOST_FUNCTION.set(false);
    }
}

/// Whether the calling thread runs a host node's function.
#[inline]
pub(crate) fn in_host_function() -> bool {
    IN_HOST_FUNCTION.get()
}

/// The shared hold of [`GATE`], re-entrant on one thread. When the outermost hold ends, the
/// jobs finished under it are dropped ([`dispose`]).
pub(crate) struct Gate {
    held: Option<RwLockReadGuard<'static, ()>>,
}

/// Holds the gate shared until the value drops. Inside a host node's function nothing is
/// taken: releases are only queued there and no CUDA call is made, and a driver thread must not
/// wait behind a `Capture::begin` that waits for a holder of the gate that may itself wait for
/// the GPU, and so for this host function (a release that synchronizes, such as `cuMemFree`).
pub(crate) fn hold_gate() -> Gate {
    let depth = GATE_DEPTH.get();
    GATE_DEPTH.set(depth + 1);
    Gate {
        held: (depth == 0 && !in_host_function())
            .then(|| GATE.read().unwrap_or_else(|e| e.into_inner())),
    }
}

impl Drop for Gate {
    #[inline]
    fn drop(&mut self) {
        let depth = GATE_DEPTH.get() - 1;
        GATE_DEPTH.set(depth);
        if depth == 0 {
            drop(self.held.take());
            if AFTER_GATE_PENDING.get() {
                drop_after_gate();
            }
        }
    }
}

/// Drops a finished job, and so what it holds (a keep list, whose values may be the user's:
/// a host closure's captures). Not under the gate: a user's `Drop` may wait for a thread that
/// begins a capture, which waits for the gate. Where this thread holds the gate, the job waits
/// in [`AFTER_GATE`] until the outermost hold ends. A panic in the drop is recorded as in
/// [`run`].
fn dispose(ordinal: usize, job: impl FnMut() -> bool + Send + 'static) {
    if GATE_DEPTH.get() != 0 {
        let mut job: Option<Job> = Some((ordinal, Box::new(job)));
        // Past the thread's local storage (its exit), it is dropped here.
        let _ = AFTER_GATE.try_with(|after| after.borrow_mut().extend(job.take()));
        if job.is_none() {
            AFTER_GATE_PENDING.set(true);
        }
        if let Some((ordinal, job)) = job {
            drop_caught(ordinal, job);
        }
        return;
    }
    drop_caught(ordinal, job);
}

/// Drops the jobs [`dispose`] put off on this thread, and those their drops put off in turn.
#[cold]
#[inline(never)]
fn drop_after_gate() {
    loop {
        AFTER_GATE_PENDING.set(false);
        let jobs = AFTER_GATE
            .try_with(|after| std::mem::take(&mut *after.borrow_mut()))
            .unwrap_or_default();
        if jobs.is_empty() {
            return;
        }
        for (ordinal, job) in jobs {
            drop_caught(ordinal, job);
        }
    }
}

/// Drops `value`; a panic in its drop is recorded as a drop error of device `ordinal`.
fn drop_caught<T>(ordinal: usize, value: T) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        record_drop_error(ordinal, Error::ReleasePanicked(panic_message(&*panic)));
    }
}

/// What a caught panic says.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Set when the process begins to exit (an exit handler registered after `cuInit`, which
/// runs before the driver's own teardown): from then on no queued release runs, and the release
/// thread is not woken. A user-object destructor that the driver calls as in-flight work
/// completes must not set off CUDA calls from the release thread while the driver is being torn
/// down; what is still queued then is left to the process's end.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Whether the process is exiting (see [`EXITING`]).
#[inline]
fn exiting() -> bool {
    EXITING.load(Ordering::Acquire)
}

/// Registers, once, the exit handler that stops releases: it sets [`EXITING`], then waits (at
/// most 2 s) for the releases that hold the gate to finish, so that none is inside the driver
/// when the driver's teardown starts.
pub(crate) fn stop_releases_at_exit() {
    unsafe extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn stop_releases() {
        EXITING.store(true, Ordering::Release);
        if GATE_DEPTH.get() != 0 {
            // Exiting from inside a release: the gate is ours; nothing to wait for.
            return;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            match GATE.try_write() {
                Ok(_) | Err(std::sync::TryLockError::Poisoned(_)) => return,
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `stop_releases` does not unwind and touches only statics and a
        // const-initialized thread-local without a destructor, usable during exit.
        let _ = unsafe { atexit(stop_releases) };
    });
}

/// Whether this thread holds the gate (a release it runs, or an operation of the crate): an
/// exclusive hold would then wait for itself.
pub(crate) fn gate_held() -> bool {
    GATE_DEPTH.get() > 0
}

/// Holds the gate exclusively: while a capture begins and is registered.
pub(crate) fn exclusive_gate() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(|e| e.into_inner())
}

/// Holds the gate exclusively while a stream may join a registered capture (a wait on an event
/// recorded in it: [`Capture::fork`](crate::Capture::fork)), so that no operation checked "not
/// capturing" on that stream is captured. `None` when no capture is registered (the event
/// cannot belong to one), and on a thread that holds the gate already, which cannot wait for
/// itself.
pub(crate) fn exclusive_gate_for_join() -> Option<RwLockWriteGuard<'static, ()>> {
    (any_capture() && GATE_DEPTH.get() == 0 && !in_host_function()).then(exclusive_gate)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a registered capture restricts other calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restricts {
    /// Global mode: every thread.
    AllThreads,
    /// Thread-local mode: the thread that began it.
    Thread(ThreadId),
    /// Relaxed mode: nothing.
    Nothing,
}

/// A capture begun through this crate and not yet ended.
#[derive(Debug)]
struct Registered {
    /// The capturing (origin) stream's handle.
    stream: usize,
    /// The driver's capture id.
    id: u64,
    restricts: Restricts,
    /// What the crate captures into it outside its guard.
    outside: CapturedOutside,
}

/// What the crate captures into a capture of its own outside the capture's guard: launches
/// through [`Function::launch`](crate::Function::launch) and stream work on any stream of the
/// capture ([`crate::module`]'s `stream_ordered`), from any thread. The captured graph keeps
/// what they refer to, and tells their nodes from those of the guard's calls. Kept in the
/// capture's registration, under the registry's lock, and handed to the guard when the capture
/// ends ([`capture_ended`]).
#[derive(Default, Debug)]
pub(crate) struct CapturedOutside {
    /// What the captured graph keeps for them.
    pub(crate) keep: Vec<Keep>,
    /// The nodes they made, as the stream reported each (`None`: not reported).
    pub(crate) nodes: Vec<Option<usize>>,
    /// Whether a stream of the capture waited for an event outside the capture's own forks
    /// and joins ([`AsStream::wait_event`](crate::AsStream::wait_event)): dependencies the
    /// capture did not make.
    pub(crate) waited: bool,
}

impl CapturedOutside {
    /// Whether the crate captured nodes outside the guard, or a stream waited for an event:
    /// then the capture cannot tell its graph's edges from its own calls.
    pub(crate) fn changed_dependencies(&self) -> bool {
        self.waited || !self.nodes.is_empty()
    }

    /// The nodes made.
    pub(crate) fn node_handles(&self) -> Vec<Option<sys::CUgraphNode>> {
        let nodes = self.nodes.iter();
        nodes.map(|n| n.map(|n| n as sys::CUgraphNode)).collect()
    }
}

static CAPTURES: Mutex<Vec<Registered>> = Mutex::new(Vec::new());
/// `CAPTURES.len()`, readable without the lock.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Registers a capture that began on `stream` with the driver's capture `id`.
pub(crate) fn capture_began(stream: usize, id: u64, restricts: Restricts) {
    let mut captures = lock(&CAPTURES);
    captures.push(Registered {
        stream,
        id,
        restricts,
        outside: CapturedOutside::default(),
    });
    ACTIVE.store(captures.len(), Ordering::Release);
}

/// Unregisters the capture `id`; returns what the crate captured into it outside its guard
/// (`None`: it was not registered). Flushes the queue when no capture restricts releases any
/// longer.
pub(crate) fn capture_ended(id: u64) -> Option<CapturedOutside> {
    let found = {
        let mut captures = lock(&CAPTURES);
        let found = captures
            .iter()
            .position(|c| c.id == id)
            .map(|at| captures.swap_remove(at).outside);
        ACTIVE.store(captures.len(), Ordering::Release);
        found
    };
    flush_if_queued();
    found
}

/// The id of the registered capture whose origin stream is `stream`, if any.
pub(crate) fn capture_on(stream: usize) -> Option<u64> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    lock(&CAPTURES)
        .iter()
        .find(|c| c.stream == stream)
        .map(|c| c.id)
}

/// Whether any capture is registered (one atomic load).
#[inline]
pub(crate) fn any_capture() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0
}

/// Runs `f` on what the crate captured outside the guard of the registered capture with the
/// driver's capture `id`, under the registry's lock; `None` when no such capture is registered.
pub(crate) fn captured_outside<R>(id: u64, f: impl FnOnce(&mut CapturedOutside) -> R) -> Option<R> {
    let mut captures = lock(&CAPTURES);
    captures
        .iter_mut()
        .find(|c| c.id == id)
        .map(|c| f(&mut c.outside))
}

/// Whether a release may run on this thread now: no registered capture restricts it.
pub(crate) fn release_allowed() -> bool {
    if in_host_function() {
        return false;
    }
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return true;
    }
    let me = std::thread::current().id();
    !lock(&CAPTURES).iter().any(|c| match c.restricts {
        Restricts::AllThreads => true,
        Restricts::Thread(t) => t == me,
        Restricts::Nothing => false,
    })
}

/// Runs `job`, a release of something of device `ordinal`, now if releases are allowed and it
/// completes; queues it otherwise.
pub(crate) fn release(ordinal: usize, mut job: impl FnMut() -> bool + Send + 'static) {
    let done = {
        let _gate = hold_gate();
        !exiting() && release_allowed() && run(ordinal, &mut job)
    };
    if done {
        dispose(ordinal, job);
    } else {
        enqueue(ordinal, Box::new(job));
    }
}

/// As [`release`], for a job that may also stay queued because the GPU is not done with what
/// it releases: the release thread is woken, and polls the queue while it is not empty, so
/// that the release follows the GPU without waiting for the program's next call.
pub(crate) fn release_after(ordinal: usize, mut job: impl FnMut() -> bool + Send + 'static) {
    let done = {
        let _gate = hold_gate();
        !exiting() && release_allowed() && run(ordinal, &mut job)
    };
    if done {
        dispose(ordinal, job);
    } else {
        enqueue(ordinal, Box::new(job));
        wake_release_thread();
    }
}

/// Runs a job; a panic in it (a value's `Drop`) is caught and recorded as a drop error of
/// device `ordinal`, and counts as done. What a finished job holds is dropped after the gate
/// ([`dispose`]).
fn run(ordinal: usize, job: &mut dyn FnMut() -> bool) -> bool {
    match catch_unwind(AssertUnwindSafe(job)) {
        Ok(done) => done,
        Err(panic) => {
            record_drop_error(ordinal, Error::ReleasePanicked(panic_message(&*panic)));
            true
        }
    }
}

/// Queues `job` without trying it (for callers that must not call CUDA, such as user-object
/// destructors on driver threads).
pub(crate) fn enqueue(ordinal: usize, job: Box<dyn FnMut() -> bool + Send>) {
    let mut queue = lock(&QUEUE);
    queue.push((ordinal, job));
    QUEUED.fetch_add(1, Ordering::AcqRel);
}

/// How many jobs are queued.
pub(crate) fn queued() -> usize {
    QUEUED.load(Ordering::Acquire)
}

/// Queues `job` from a driver thread (a user object's destructor) and wakes the release
/// thread, which runs it as soon as no registered capture forbids it.
pub(crate) fn enqueue_from_driver(ordinal: usize, job: Box<dyn FnMut() -> bool + Send>) {
    enqueue(ordinal, job);
    wake_release_thread();
}

/// How often the release thread looks at the queue while jobs wait in it, at first...
const POLL: std::time::Duration = std::time::Duration::from_micros(500);
/// ...and at least, once looks that release nothing have doubled the interval: each look
/// queries every waiting job, so a long wait (a slow launch, a long capture) must not cost a
/// query per job every `POLL`. A new job, or one released, starts again at `POLL`.
const POLL_MAX: std::time::Duration = std::time::Duration::from_millis(8);

/// Wakes the release thread, started at the first call.
fn wake_release_thread() {
    if exiting() {
        // The driver is about to be torn down: the release thread must not call it now.
        return;
    }
    /// A flag the release thread sleeps on, and its signal.
    type Wake = Arc<(Mutex<bool>, Condvar)>;
    static WAKE: OnceLock<Option<Wake>> = OnceLock::new();
    let wake = WAKE.get_or_init(|| {
        let wake = Arc::new((Mutex::new(false), Condvar::new()));
        let theirs = wake.clone();
        std::thread::Builder::new()
            .name("cuda-graph-release".into())
            .spawn(move || {
                let (woken, signal) = &*theirs;
                let (mut waiting, mut poll) = (0, POLL);
                loop {
                    let mut flag = lock(woken);
                    let mut was_woken = *flag;
                    while !*flag {
                        if waiting == 0 {
                            flag = signal.wait(flag).unwrap_or_else(|e| e.into_inner());
                            was_woken = true;
                        } else {
                            // Jobs wait for the GPU or for a capture: look again shortly.
                            let timeout;
                            (flag, timeout) = signal
                                .wait_timeout(flag, poll)
                                .unwrap_or_else(|e| e.into_inner());
                            was_woken = !timeout.timed_out();
                            break;
                        }
                    }
                    *flag = false;
                    drop(flag);
                    let before = waiting;
                    waiting = if exiting() { 0 } else { flush_deferred() };
                    poll = if was_woken || waiting < before {
                        POLL
                    } else {
                        (poll * 2).min(POLL_MAX)
                    };
                }
            })
            .ok()
            .map(|_| wake)
    });
    // Without the thread (it could not be started), the next flush point runs the job.
    if let Some(wake) = wake {
        *lock(&wake.0) = true;
        wake.1.notify_one();
    }
}

/// Works through the queue if anything is queued (one atomic load otherwise).
#[inline]
pub(crate) fn flush_if_queued() {
    if QUEUED.load(Ordering::Acquire) != 0 {
        flush_deferred();
    }
}

/// Runs the releases the crate put off (see the module docs of this crate's "Safety model")
/// and returns how many are still waiting: those a capture still forbids, or whose stream
/// still captures. The crate calls it itself at every natural point (end of a capture,
/// synchronization, instantiation, drops of executable graphs and streams); call it to release
/// memory at a moment of your choosing, or in a leak test.
pub fn flush_deferred() -> usize {
    let gate = hold_gate();
    if exiting() || !release_allowed() {
        return QUEUED.load(Ordering::Acquire);
    }
    // Taken out of the lock: a job may drop values whose own release queues more jobs. They
    // still count in QUEUED until they are done.
    let jobs = std::mem::take(&mut *lock(&QUEUE));
    let mut waiting: Vec<Job> = Vec::new();
    let mut done: Vec<Job> = Vec::new();
    for (ordinal, mut job) in jobs {
        if run(ordinal, &mut *job) {
            QUEUED.fetch_sub(1, Ordering::AcqRel);
            done.push((ordinal, job));
        } else {
            waiting.push((ordinal, job));
        }
    }
    let left = {
        let mut queue = lock(&QUEUE);
        if !waiting.is_empty() {
            // Jobs queued meanwhile go after the older ones.
            waiting.append(&mut queue);
            *queue = waiting;
        }
        queue.len()
    };
    drop(gate);
    for (ordinal, job) in done {
        dispose(ordinal, job);
    }
    left
}

/// Driver errors met in `Drop` on one device: the count, and the last one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DropErrors {
    /// How many errors were recorded since the process started (or the last
    /// [`Device::take_drop_errors`](crate::Device::take_drop_errors)).
    pub count: u64,
    /// The most recent error.
    pub last: Option<Error>,
}

static DROP_ERRORS: Mutex<Vec<DropErrors>> = Mutex::new(Vec::new());

/// Records `error`, met while dropping something of device `ordinal`.
pub(crate) fn record_drop_error(ordinal: usize, error: Error) {
    let mut all = lock(&DROP_ERRORS);
    if all.len() <= ordinal {
        all.resize(ordinal + 1, DropErrors::default());
    }
    all[ordinal].count += 1;
    all[ordinal].last = Some(error);
}

/// The errors recorded for device `ordinal`; with `take`, also clears them.
pub(crate) fn drop_errors(ordinal: usize, take: bool) -> DropErrors {
    let mut all = lock(&DROP_ERRORS);
    match all.get_mut(ordinal) {
        Some(e) if take => std::mem::take(e),
        Some(e) => e.clone(),
        None => DropErrors::default(),
    }
}
