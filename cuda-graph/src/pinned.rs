//! Page-locked host memory (`cuMemHostAlloc`), which graphs' memcpy nodes and stream-ordered
//! copies read and write: [`PinnedBuffer`].
//!
//! Two rules make it safe, one for each side that touches it:
//!
//! - **The GPU never touches it after it is freed.** Its memory is a [`PinnedMemory`], shared
//!   (`Arc`) the way a [`DeviceBuffer`](crate::DeviceBuffer)'s is: a graph's memcpy node, a
//!   captured copy and every executable graph made from them hold it in their keep lists until
//!   their last launch is done. A stream copy records an event after itself in the memory's
//!   uses (per real stream, as [`crate::uses`] does for device memory); when the last holder
//!   lets go, `cuMemFreeHost` is put off until each of those events has completed (and while a
//!   capture forbids it).
//! - **The host never touches it while the GPU may.** Rust code reads and writes it only through
//!   a view ([`PinnedBuffer::as_slice`], [`PinnedBuffer::as_mut_slice`]). Taking a view waits
//!   for every GPU use queued before (the events above, and the event after each launch of an
//!   executable graph that copies to or from it); while a view lives, the crate queues no GPU
//!   work on the memory: a stream copy or a launch that would read or write it is refused with
//!   [`Error::InUseByHost`], before anything is queued. Both sides decide under the memory's
//!   lock, so a use is either queued (and recorded) before a view is taken, which then waits
//!   for it, or refused.
//!
//! What the crate cannot see is outside: work queued on the memory through raw handles or
//! other libraries (the address from [`PinnedBuffer::as_ptr`], a graph handed over with
//! [`Graph::into_raw`](crate::Graph::into_raw) and launched by other code).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytemuck::Pod;

use crate::deferred;
use crate::device::Device;
use crate::error::{Error, Result, driver};
use crate::event::Event;
use crate::keep::Keep;
use crate::stream::{AsStream, CaptureStatus};
use crate::sys;
use crate::uses::{StreamUses, wait_unmarked};

/// The memory of a [`PinnedBuffer`], shared with the graphs whose nodes copy to or from it;
/// freed (`cuMemFreeHost`) when the last holder drops and every stream copy recorded in its uses
/// has completed.
#[derive(Debug)]
pub(crate) struct PinnedMemory {
    ptr: *mut c_void,
    bytes: usize,
    device: Device,
    state: Mutex<HostState>,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: the pointer is page-locked host memory that any thread may access; the crate reads
// and writes it only through views, whose exclusion from each other is Rust's borrow of the
// `PinnedBuffer`, and from GPU work the state lock's (see the module docs).
unsafe impl Send for PinnedMemory {}
// SAFETY: as above; every mutation of the state is under its lock.
unsafe impl Sync for PinnedMemory {}

/// Who uses a [`PinnedMemory`] now: the GPU work queued on it, and the host's views.
#[derive(Debug, Default)]
pub(crate) struct HostState {
    /// The last GPU use on each stream (stream copies, launches of graphs that copy it).
    uses: StreamUses,
    /// Views alive ([`PinnedRef`], [`PinnedMut`]): while any is, no GPU work is queued on it.
    views: usize,
}

impl HostState {
    /// Refuses GPU work on the memory while the host holds a view of it
    /// ([`Error::InUseByHost`] naming `call`), and after work whose end is unknown
    /// ([`Error::InDoubt`]).
    pub(crate) fn before_gpu_use(&self, call: &'static str) -> Result<()> {
        if self.views > 0 {
            return Err(Error::InUseByHost { call });
        }
        self.uses.tracked()
    }

    /// A launch on the stream of id `id` uses the memory; `event` was recorded after it.
    pub(crate) fn used_by_launch(&mut self, id: u64, event: &Arc<Event>) {
        self.uses.note_event(id, event);
    }

    /// Work that `queued_by` queued on it can neither be marked nor waited for: no view is
    /// taken and no free made from now on ([`Error::InDoubt`]).
    pub(crate) fn doubt(&mut self, queued_by: &'static str) {
        self.uses.doubt(queued_by);
    }
}

impl PinnedMemory {
    /// The host address.
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The state, locked. Taken after the capture gate, the order lock and graph allocations'
    /// locks, wherever those are held too; nothing is waited for under it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, HostState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `op`, a copy that `call` queues on `stream` and that reads or writes this memory,
    /// from inside `module::stream_ordered` (which holds the capture gate, and has put this
    /// memory in the keep list of a capture of this crate that captures `stream`). Captured, the
    /// copy is a node whose graph keeps the memory, and it runs at that graph's launches, which
    /// check the views then. Otherwise it is refused while a view is alive, and its use is
    /// recorded under the lock; when that fails, the stream is synchronized before the error
    /// is returned, or, where it cannot be, the memory is kept in doubt ([`Error::InDoubt`]).
    pub(crate) fn stream_use(
        &self,
        call: &'static str,
        stream: &impl AsStream,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if stream.capture_status()? != CaptureStatus::None {
            return op();
        }
        let id = stream.stream_id()?;
        let mut state = self.lock();
        state.before_gpu_use(call)?;
        op()?;
        // The event is the stream's device's (the memory is pinned for every context).
        if let Err(e) = state.uses.note(stream.device(), stream, id) {
            if !wait_unmarked(stream) {
                state.doubt(call);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Takes a view (for `call`): counted first, so that no GPU work is queued from now on,
    /// then every GPU use queued before is waited for. On error no view is counted.
    fn begin_view(&self, call: &'static str) -> Result<()> {
        if deferred::in_host_function() {
            // A driver thread, which may be running one of the very launches to wait for.
            return Err(Error::InHostFunction { call });
        }
        let events: Vec<Arc<Event>> = {
            let mut state = self.lock();
            state.uses.tracked()?;
            state.views += 1;
            state.uses.events().cloned().collect()
        };
        let waited = wait_for(&events);
        if waited.is_err() {
            self.end_view();
        }
        waited
    }

    /// A view was dropped.
    fn end_view(&self) {
        let mut state = self.lock();
        state.views = state.views.saturating_sub(1);
    }

    /// Whether every GPU use queued so far has completed.
    fn is_idle(&self) -> Result<bool> {
        if deferred::in_host_function() {
            return Err(Error::InHostFunction {
                call: "PinnedBuffer::is_idle",
            });
        }
        let events: Vec<Arc<Event>> = {
            let state = self.lock();
            state.uses.tracked()?;
            state.uses.events().cloned().collect()
        };
        for event in &events {
            if !event.is_complete()? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Waits on the host until every event of `events` has completed: `cuEventSynchronize` where a
/// synchronizing call may be made (no capture of this crate forbids it on this thread; held
/// under the capture gate, so that none begins during it), else by polling `cuEventQuery`,
/// which captures allow.
fn wait_for(events: &[Arc<Event>]) -> Result<()> {
    for event in events {
        let mut pause = Duration::from_micros(20);
        loop {
            if event.is_complete()? {
                break;
            }
            {
                let _gate = deferred::hold_gate();
                if deferred::release_allowed() {
                    event.synchronize()?;
                    break;
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
    Ok(())
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        let uses =
            std::mem::take(&mut self.state.get_mut().unwrap_or_else(|e| e.into_inner()).uses);
        let (ptr, device) = (self.ptr as usize, self.device.clone());
        if let Err(e) = uses.tracked() {
            // Work on it may never end as far as the crate can tell: kept for the rest of the
            // process.
            device.record_drop_error(e);
            return;
        }
        deferred::release_after(device.ordinal(), move || {
            for event in uses.events() {
                match event.is_complete() {
                    Ok(false) => return false,
                    Ok(true) => {}
                    Err(e) => {
                        // Whether the copy is done cannot be told: kept rather than freed
                        // under it.
                        device.record(Err(e));
                        return true;
                    }
                }
            }
            if let Err(e) = device.bind() {
                device.record_drop_error(e);
                return true;
            }
            // SAFETY: allocated by cuMemHostAlloc and freed once, when no node, launch, handle
            // or view refers to it and every stream copy recorded on it has completed.
            device.record(driver!(unsafe { sys::cuMemFreeHost(ptr as *mut c_void) }));
            true
        });
    }
}

/// Page-locked host memory from `cuMemHostAlloc` holding `len` values of `T`: the host side of
/// memcpy nodes ([`Graph::add_memcpy_node_htod`](crate::Graph::add_memcpy_node_htod),
/// [`Graph::add_memcpy_node_dtoh`](crate::Graph::add_memcpy_node_dtoh)), of captured copies
/// ([`Capture::memcpy_htod_async`](crate::Capture::memcpy_htod_async)) and of stream copies
/// ([`StreamMemOps::memcpy_htod_async`](crate::StreamMemOps::memcpy_htod_async)). Freed when
/// the buffer, every graph that refers to it, and every copy queued on it are done.
///
/// The host reads and writes it through views, [`as_slice`](PinnedBuffer::as_slice) and
/// [`as_mut_slice`](PinnedBuffer::as_mut_slice): taking one waits for the GPU work queued on
/// the buffer so far, and while one lives the crate refuses to queue more
/// ([`Error::InUseByHost`]), so the host and the GPU never touch it at the same time. Between
/// the launches of a graph, write the next input and read the last output through views.
///
/// `T` is plain old data ([`bytemuck::Pod`]): every bit pattern the device writes is a valid
/// `T`.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let stream = Stream::new(&device)?;
/// let mut input = PinnedBuffer::<u32>::zeroed(&device, 1024)?;
/// let output = PinnedBuffer::<u32>::zeroed(&device, 1024)?;
/// let on_device = DeviceBuffer::<u32>::zeroed(&device, 1024)?;
/// let mut graph = Graph::new(&device)?;
/// let h2d = graph.add_memcpy_node_htod(&[], &on_device, &input, 4096)?;
/// graph.add_memcpy_node_dtoh(&[h2d], &output, &on_device, 4096)?;
/// let exec = graph.instantiate(InstantiateFlags::NONE)?;
/// for step in 0..3u32 {
///     input.as_mut_slice()?.fill(step); // waits for the previous launch
///     exec.launch(&stream)?;
///     assert!(output.as_slice()?.iter().all(|&x| x == step)); // waits for this one
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PinnedBuffer<T: Pod> {
    memory: Arc<PinnedMemory>,
    len: usize,
    _type: PhantomData<T>,
}

impl<T: Pod> PinnedBuffer<T> {
    /// `len` values, zero-filled, in page-locked memory (`cuMemHostAlloc` with
    /// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `PinnedBuffer::zeroed` when `len` is 0, `T` is zero-sized
    /// or the size in bytes overflows (`len × size_of::<T>()`, computed without overflow), or
    /// when the driver's address is not aligned for `T`; [`Device::bind`]'s errors;
    /// [`Error::Driver`] naming `cuMemHostAlloc`.
    pub fn zeroed(device: &Device, len: usize) -> Result<PinnedBuffer<T>> {
        const CALL: &str = "PinnedBuffer::zeroed";
        let size = size_of::<T>();
        let bytes = len.checked_mul(size).filter(|&b| b > 0).ok_or_else(|| {
            Error::invalid(
                CALL,
                format!("{len} values of {size} bytes: the size is zero or overflows"),
            )
        })?;
        device.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the context is current; the flag is one of
        // cuMemHostAlloc's.
        driver!(unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        let memory = Arc::new(PinnedMemory {
            ptr,
            bytes,
            device: device.clone(),
            state: Mutex::new(HostState::default()),
            _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::PinnedBuffer),
        });
        if ptr.is_null() || (ptr as usize) % align_of::<T>() != 0 {
            // Freed again as `memory` drops.
            return Err(Error::invalid(
                CALL,
                format!(
                    "the driver's address {ptr:p} is not aligned to {} bytes",
                    align_of::<T>()
                ),
            ));
        }
        // SAFETY: the allocation just made holds `bytes` writable bytes; nothing else refers to
        // it yet. Zeroed here, a view never shows uninitialized bytes.
        unsafe { ptr.cast::<u8>().write_bytes(0, bytes) };
        Ok(PinnedBuffer {
            memory,
            len,
            _type: PhantomData,
        })
    }

    /// A page-locked copy of `data`.
    ///
    /// # Errors
    ///
    /// Those of [`zeroed`](PinnedBuffer::zeroed) (an empty `data` is refused there).
    pub fn from_slice(device: &Device, data: &[T]) -> Result<PinnedBuffer<T>> {
        let mut buffer = PinnedBuffer::zeroed(device, data.len())?;
        buffer.copy_from_slice(data)?;
        Ok(buffer)
    }

    /// A view of the values for reading, once every GPU use of the buffer queued so far has
    /// completed (a copy into it on a stream, a launch of a graph that copies to or from it).
    /// While it lives, stream copies and launches that use the buffer are refused with
    /// [`Error::InUseByHost`].
    ///
    /// The wait is `cuEventSynchronize`, or, while a capture of this crate forbids synchronizing
    /// calls on this thread, `cuEventQuery` polled.
    ///
    /// # Errors
    ///
    /// [`Error::InHostFunction`] naming `PinnedBuffer::as_slice` in a host node's function;
    /// [`Error::InDoubt`] when work queued on the buffer could not be tracked; [`Error::Driver`]
    /// naming `cuEventQuery` or `cuEventSynchronize` (also an earlier asynchronous failure of
    /// the work waited for). No view is taken then.
    pub fn as_slice(&self) -> Result<PinnedRef<'_, T>> {
        self.memory.begin_view("PinnedBuffer::as_slice")?;
        Ok(PinnedRef { buffer: self })
    }

    /// A view of the values for writing, as [`as_slice`](PinnedBuffer::as_slice) (it waits the
    /// same way, and GPU work on the buffer is refused while it lives).
    ///
    /// # Errors
    ///
    /// As [`as_slice`](PinnedBuffer::as_slice)'s, naming `PinnedBuffer::as_mut_slice`.
    pub fn as_mut_slice(&mut self) -> Result<PinnedMut<'_, T>> {
        self.memory.begin_view("PinnedBuffer::as_mut_slice")?;
        Ok(PinnedMut { buffer: self })
    }

    /// The values, copied out through a view ([`as_slice`](PinnedBuffer::as_slice)).
    ///
    /// # Errors
    ///
    /// Those of [`as_slice`](PinnedBuffer::as_slice).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        Ok(self.as_slice()?.to_vec())
    }

    /// Copies `data` (exactly [`len`](PinnedBuffer::len) values) in, through a view
    /// ([`as_mut_slice`](PinnedBuffer::as_mut_slice)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `PinnedBuffer::copy_from_slice` when `data` does not
    /// hold exactly `len` values; those of [`as_mut_slice`](PinnedBuffer::as_mut_slice).
    pub fn copy_from_slice(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::invalid(
                "PinnedBuffer::copy_from_slice",
                format!("{} values for a buffer of {}", data.len(), self.len),
            ));
        }
        self.as_mut_slice()?.copy_from_slice(data);
        Ok(())
    }

    /// Whether every GPU use of the buffer queued so far has completed (`cuEventQuery`): a view
    /// taken now would not wait.
    ///
    /// # Errors
    ///
    /// [`Error::InHostFunction`] naming `PinnedBuffer::is_idle` in a host node's function;
    /// [`Error::InDoubt`] when work queued on the buffer could not be tracked;
    /// [`Error::Driver`] naming `cuEventQuery`.
    pub fn is_idle(&self) -> Result<bool> {
        self.memory.is_idle()
    }

    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no values (never: empty buffers are refused).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.memory.bytes
    }

    /// The host address. Reading or writing through it is the caller's `unsafe` business: it
    /// races with the GPU work the buffer is used by, which only a view waits for.
    #[must_use]
    pub fn as_ptr(&self) -> *const T {
        self.memory.ptr.cast()
    }

    /// The device whose context allocated it.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.memory.device
    }

    /// The shared memory, for nodes, copies and launches that use it.
    pub(crate) fn memory(&self) -> &Arc<PinnedMemory> {
        &self.memory
    }

    /// A value that keeps the memory allocated while it lives.
    pub(crate) fn keep(&self) -> Keep {
        self.memory.clone() as Keep
    }
}

/// A view of a [`PinnedBuffer`]'s values for reading ([`PinnedBuffer::as_slice`]); while it
/// lives, the crate queues no GPU work on the buffer. Dereferences to `[T]`.
#[derive(Debug)]
pub struct PinnedRef<'a, T: Pod> {
    buffer: &'a PinnedBuffer<T>,
}

impl<T: Pod> Deref for PinnedRef<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        let b = self.buffer;
        // SAFETY: the allocation holds `len` values of `T`, aligned (checked when made) and
        // initialized (zeroed when made; copies write whole bytes, and any bytes are a valid
        // `T: Pod`); no GPU work on it runs while this view lives (the module docs), and no
        // host `&mut` to it exists while the buffer is borrowed shared.
        unsafe { std::slice::from_raw_parts(b.memory.ptr.cast::<T>(), b.len) }
    }
}

impl<T: Pod> Drop for PinnedRef<'_, T> {
    fn drop(&mut self) {
        self.buffer.memory.end_view();
    }
}

/// A view of a [`PinnedBuffer`]'s values for writing ([`PinnedBuffer::as_mut_slice`]); while
/// it lives, the crate queues no GPU work on the buffer. Dereferences to `[T]`, mutably.
#[derive(Debug)]
pub struct PinnedMut<'a, T: Pod> {
    buffer: &'a mut PinnedBuffer<T>,
}

impl<T: Pod> Deref for PinnedMut<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        let b = &*self.buffer;
        // SAFETY: as `PinnedRef`'s.
        unsafe { std::slice::from_raw_parts(b.memory.ptr.cast::<T>(), b.len) }
    }
}

impl<T: Pod> DerefMut for PinnedMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let b = &mut *self.buffer;
        // SAFETY: as `PinnedRef`'s, and the buffer is borrowed exclusively by this view, so no
        // other host reference to the values exists.
        unsafe { std::slice::from_raw_parts_mut(b.memory.ptr.cast::<T>(), b.len) }
    }
}

impl<T: Pod> Drop for PinnedMut<'_, T> {
    fn drop(&mut self) {
        self.buffer.memory.end_view();
    }
}
