//! Memory that both the host and the GPU touch: page-locked host memory (`cuMemHostAlloc`,
//! [`PinnedBuffer`](crate::PinnedBuffer)) and managed memory (`cuMemAllocManaged`,
//! [`ManagedBuffer`](crate::ManagedBuffer)). One kind of buffer, [`HostBuffer`], whose kind
//! ([`Pinned`](crate::Pinned), [`Managed`](crate::Managed)) says how it is allocated and freed,
//! and one set of host views, [`HostRef`] and [`HostMut`].
//!
//! Two rules make it safe, one for each side that touches it:
//!
//! - **The GPU never touches it after it is freed.** Its memory is a [`HostMemory`], shared
//!   (`Arc`) the way a [`DeviceBuffer`](crate::DeviceBuffer)'s is: a graph's node, a captured
//!   call and every executable graph made from them hold it in their keep lists until their last
//!   launch is done. Stream work (a copy, a memset, a kernel) records an event after itself in
//!   the memory's uses (per real stream, as [`crate::uses`] does for device memory); when the
//!   last holder lets go, the free (`cuMemFreeHost`, `cuMemFree`) is put off until each of those
//!   events has completed (and while a capture forbids it).
//! - **The host never touches it while the GPU may.** Rust code reads and writes it only through
//!   a view ([`HostBuffer::as_slice`], [`HostBuffer::as_mut_slice`]). Taking a view waits for
//!   every GPU use queued before (the events above, and the event after each launch of an
//!   executable graph whose keep list holds the memory); while a view lives, the crate queues no
//!   GPU work on the memory: stream work or a launch that would read or write it is refused with
//!   [`Error::InUseByHost`], before anything is queued. Both sides decide under the memory's
//!   lock, so a use is either queued (and recorded) before a view is taken, which then waits for
//!   it, or refused.
//!
//! What the crate cannot see is outside: work queued on the memory through raw handles or other
//! libraries (the address from [`HostBuffer::as_ptr`] passed as a plain value, a graph handed
//! over with [`Graph::into_raw`](crate::Graph::into_raw) and launched by other code).

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
use crate::live_objects::{Kind, Tracked};
use crate::stream::{AsStream, CaptureStatus};
use crate::sys;
use crate::uses::{StreamUses, wait_unmarked};

/// How a [`HostMemory`] is given back to the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Free {
    /// `cuMemFreeHost` (page-locked host memory from `cuMemHostAlloc`).
    Host,
    /// `cuMemFree` (managed memory from `cuMemAllocManaged`).
    Device,
}

/// The memory of a [`HostBuffer`], shared with the graphs whose nodes use it; freed (as its
/// [`Free`] says) when the last holder drops and every GPU use recorded in its uses has
/// completed. Not nameable outside the crate.
#[derive(Debug)]
pub struct HostMemory {
    ptr: *mut c_void,
    bytes: usize,
    device: Device,
    free: Free,
    state: Mutex<HostState>,
    _tracked: Tracked,
}

// SAFETY: the pointer is memory that any thread of the host may access (page-locked or
// managed); the crate reads and writes it only through views, whose exclusion from each other is
// Rust's borrow of the buffer, and from GPU work the state lock's (see the module docs).
unsafe impl Send for HostMemory {}
// SAFETY: as above; every mutation of the state is under its lock.
unsafe impl Sync for HostMemory {}

/// Who uses a [`HostMemory`] now: the GPU work queued on it, and the host's views.
#[derive(Debug, Default)]
pub(crate) struct HostState {
    /// The last GPU use on each stream (stream work, launches of graphs that use it).
    uses: StreamUses,
    /// Views alive ([`HostRef`], [`HostMut`]): while any is, no GPU work is queued on it.
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

impl HostMemory {
    /// The host address (for managed memory, also its device address).
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The address as the device sees it (unified addressing: the same value).
    pub(crate) fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr as usize as sys::CUdeviceptr
    }

    /// The size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The state, locked. Taken after the capture gate, the order lock and graph allocations'
    /// locks, wherever those are held too, and, where several are held, in address order;
    /// nothing is waited for under it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, HostState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
    fn is_idle(&self, call: &'static str) -> Result<bool> {
        if deferred::in_host_function() {
            return Err(Error::InHostFunction { call });
        }
        let events: Vec<Arc<Event>> = {
            let state = self.lock();
            state.uses.tracked()?;
            state.uses.events().cloned().collect()
        };
        self.device.bind()?;
        for event in &events {
            if !event.is_complete_bound()? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Runs `op`, work that `call` queues on `stream` and that reads or writes each memory of
/// `memories` (sorted by address, each once), from inside `module::stream_ordered` (which holds
/// the capture gate, and has put the memories in the keep list of a capture of this crate that
/// captures `stream`). Captured, the work is a node whose graph keeps the memories, and it runs
/// at that graph's launches, which check the views then. Otherwise it is refused while a view of
/// any of them is alive, and its use is recorded in each under their locks; when that fails, the
/// stream is synchronized before the error is returned, or, where it cannot be, the memories are
/// kept in doubt ([`Error::InDoubt`]).
pub(crate) fn gpu_use(
    call: &'static str,
    stream: &impl AsStream,
    memories: &[&Arc<HostMemory>],
    op: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if memories.is_empty() || stream.capture_status()? != CaptureStatus::None {
        return op();
    }
    let id = stream.stream_id()?;
    let mut states: Vec<_> = memories.iter().map(|m| m.lock()).collect();
    for state in &states {
        state.before_gpu_use(call)?;
    }
    op()?;
    // The event is the stream's device's (pinned memory is pinned for every context, managed
    // memory is mapped for every device).
    let mut recorded = Ok(());
    for state in &mut states {
        recorded = recorded.and_then(|()| state.uses.note(stream.device(), stream, id));
    }
    if recorded.is_err() && !wait_unmarked(stream) {
        for state in &mut states {
            state.doubt(call);
        }
    }
    recorded
}

/// `memories`, once each, in address order (the order they are locked in).
pub(crate) fn in_address_order<M: AsRef<HostMemory>>(mut memories: Vec<M>) -> Vec<M> {
    memories.sort_by_key(|m| m.as_ref().ptr as usize);
    memories.dedup_by_key(|m| m.as_ref().ptr as usize);
    memories
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

impl Drop for HostMemory {
    fn drop(&mut self) {
        let uses =
            std::mem::take(&mut self.state.get_mut().unwrap_or_else(|e| e.into_inner()).uses);
        let (ptr, free) = (self.ptr as usize, self.free);
        if let Err(e) = uses.tracked() {
            // Work on it may never end as far as the crate can tell: kept for the rest of the
            // process.
            self.device.record_drop_error(e);
            return;
        }
        // Not released for want of the context: kept, and tried again (`Device::release`).
        self.device.release_after(move |device| {
            for event in uses.events() {
                match event.is_complete_bound() {
                    Ok(false) => return false,
                    Ok(true) => {}
                    Err(e) => {
                        // Whether the work is done cannot be told: kept rather than freed
                        // under it.
                        device.record(Err(e));
                        return true;
                    }
                }
            }
            let freed = match free {
                // SAFETY: allocated by cuMemHostAlloc and freed once, when no node, launch,
                // handle or view refers to it and every GPU use recorded on it has completed.
                Free::Host => driver!(unsafe { sys::cuMemFreeHost(ptr as *mut c_void) }),
                // SAFETY: allocated by cuMemAllocManaged and freed once, under the same
                // conditions.
                Free::Device => driver!(unsafe { sys::cuMemFree(ptr as sys::CUdeviceptr) }),
            };
            device.record(freed);
            true
        });
    }
}

pub(crate) mod sealed {
    /// Implemented by [`Pinned`](crate::Pinned) and [`Managed`](crate::Managed) only.
    pub trait Sealed {
        /// The type's name, for the calls its errors name (`PinnedBuffer::as_slice`).
        const CALLS: super::Calls;
        /// How its memory is freed.
        const FREE: super::Free;
        /// Allocates `bytes` (more than 0) on `device`, whose context is current.
        fn allocate(device: &crate::Device, bytes: usize) -> crate::Result<*mut std::ffi::c_void>;
    }
}

/// The names of a kind's calls, as its errors name them.
#[derive(Debug)]
pub struct Calls {
    pub(crate) zeroed: &'static str,
    pub(crate) as_slice: &'static str,
    pub(crate) as_mut_slice: &'static str,
    pub(crate) copy_from_slice: &'static str,
    pub(crate) is_idle: &'static str,
}

/// The kind of a [`HostBuffer`]: [`Pinned`](crate::Pinned) (page-locked host memory) or
/// [`Managed`](crate::Managed) (managed memory). Sealed.
///
/// ```
/// # use cuda_graph::*;
/// fn kind_name<K: HostKind>() -> &'static str {
///     std::any::type_name::<K>().rsplit("::").next().unwrap_or("")
/// }
/// assert_eq!(kind_name::<Managed>(), "Managed");
/// ```
pub trait HostKind: sealed::Sealed + Send + Sync + 'static {}

/// Memory that the host and the GPU both read and write, holding `len` values of `T`:
/// [`PinnedBuffer`](crate::PinnedBuffer) (`HostBuffer<T, Pinned>`, page-locked host memory) or
/// [`ManagedBuffer`](crate::ManagedBuffer) (`HostBuffer<T, Managed>`, managed memory). Freed
/// when the buffer, every graph that refers to it, and every GPU use queued on it are done.
///
/// The host reads and writes it through views, [`as_slice`](HostBuffer::as_slice) and
/// [`as_mut_slice`](HostBuffer::as_mut_slice): taking one waits for the GPU work queued on the
/// buffer so far, and while one lives the crate refuses to queue more
/// ([`Error::InUseByHost`]), so the host and the GPU never touch it at the same time.
///
/// `T` is plain old data ([`bytemuck::Pod`]): every bit pattern the device writes is a valid
/// `T`.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let mut pinned: HostBuffer<u32, Pinned> = HostBuffer::zeroed(&device, 4)?;
/// pinned.copy_from_slice(&[1, 2, 3, 4])?;
/// let managed = ManagedBuffer::<u32>::from_slice(&device, &pinned.to_vec()?)?;
/// assert_eq!(managed.to_vec()?, [1, 2, 3, 4]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct HostBuffer<T: Pod, K: HostKind> {
    memory: Arc<HostMemory>,
    len: usize,
    _type: PhantomData<(T, K)>,
}

impl<T: Pod, K: HostKind> HostBuffer<T, K> {
    /// `len` values, zero-filled: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE` (pinned for
    /// every context) for a [`PinnedBuffer`](crate::PinnedBuffer), `cuMemAllocManaged` with
    /// `CU_MEM_ATTACH_GLOBAL` for a [`ManagedBuffer`](crate::ManagedBuffer).
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = PinnedBuffer::<u64>::zeroed(&device, 16)?;
    /// assert_eq!(buffer.byte_len(), 128);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `PinnedBuffer::zeroed` or `ManagedBuffer::zeroed` when
    /// `len` is 0, `T` is zero-sized or the size in bytes overflows (`len × size_of::<T>()`,
    /// computed without overflow), or when the driver's address is not aligned for `T`;
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuMemHostAlloc` or
    /// `cuMemAllocManaged`; for a managed buffer, those of
    /// [`ManagedBuffer`](crate::ManagedBuffer)'s device check.
    pub fn zeroed(device: &Device, len: usize) -> Result<HostBuffer<T, K>> {
        let call = K::CALLS.zeroed;
        let size = size_of::<T>();
        let bytes = len.checked_mul(size).filter(|&b| b > 0).ok_or_else(|| {
            Error::invalid(
                call,
                format!("{len} values of {size} bytes: the size is zero or overflows"),
            )
        })?;
        device.bind()?;
        let ptr = K::allocate(device, bytes)?;
        let memory = Arc::new(HostMemory {
            ptr,
            bytes,
            device: device.clone(),
            free: K::FREE,
            state: Mutex::new(HostState::default()),
            _tracked: Tracked::new(match K::FREE {
                Free::Host => Kind::PinnedBuffer,
                Free::Device => Kind::ManagedBuffer,
            }),
        });
        if ptr.is_null() || (ptr as usize) % align_of::<T>() != 0 {
            // Freed again as `memory` drops.
            return Err(Error::invalid(
                call,
                format!(
                    "the driver's address {ptr:p} is not aligned to {} bytes",
                    align_of::<T>()
                ),
            ));
        }
        // SAFETY: the allocation just made holds `bytes` bytes the host may write (page-locked
        // or managed memory, which no GPU work uses yet: nothing else refers to it). Zeroed
        // here, a view never shows uninitialized bytes.
        unsafe { ptr.cast::<u8>().write_bytes(0, bytes) };
        Ok(HostBuffer {
            memory,
            len,
            _type: PhantomData,
        })
    }

    /// A copy of `data`.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = ManagedBuffer::from_slice(&device, &[1.5f32, 2.5])?;
    /// assert_eq!(buffer.len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`zeroed`](HostBuffer::zeroed) (an empty `data` is refused there).
    pub fn from_slice(device: &Device, data: &[T]) -> Result<HostBuffer<T, K>> {
        let mut buffer = HostBuffer::zeroed(device, data.len())?;
        buffer.copy_from_slice(data)?;
        Ok(buffer)
    }

    /// A view of the values for reading, once every GPU use of the buffer queued so far has
    /// completed (stream work on it, a launch of a graph that uses it). While it lives, stream
    /// work and launches that use the buffer are refused with [`Error::InUseByHost`].
    ///
    /// The wait is `cuEventSynchronize`, or, while a capture of this crate forbids synchronizing
    /// calls on this thread, `cuEventQuery` polled.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let stream = Stream::new(&device)?;
    /// let flag = ManagedBuffer::<u32>::zeroed(&device, 1)?;
    /// stream.memset_async(&flag, 1u32, 1)?;
    /// assert_eq!(flag.as_slice()?[0], 1); // waits for the memset
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InHostFunction`] naming `PinnedBuffer::as_slice` or `ManagedBuffer::as_slice`
    /// in a host node's function; [`Error::InDoubt`] when work queued on the buffer could not be
    /// tracked; [`Error::Driver`] naming `cuEventQuery` or `cuEventSynchronize` (also an earlier
    /// asynchronous failure of the work waited for). No view is taken then.
    pub fn as_slice(&self) -> Result<HostRef<'_, T>> {
        self.memory.begin_view(K::CALLS.as_slice)?;
        Ok(HostRef {
            memory: &self.memory,
            len: self.len,
            _borrow: PhantomData,
        })
    }

    /// A view of the values for writing, as [`as_slice`](HostBuffer::as_slice) (it waits the
    /// same way, and GPU work on the buffer is refused while it lives).
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut input = PinnedBuffer::<u32>::zeroed(&device, 8)?;
    /// input.as_mut_slice()?.fill(3);
    /// assert_eq!(input.to_vec()?, [3; 8]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`as_slice`](HostBuffer::as_slice)'s, naming `PinnedBuffer::as_mut_slice` or
    /// `ManagedBuffer::as_mut_slice`.
    pub fn as_mut_slice(&mut self) -> Result<HostMut<'_, T>> {
        self.memory.begin_view(K::CALLS.as_mut_slice)?;
        Ok(HostMut {
            memory: &self.memory,
            len: self.len,
            _borrow: PhantomData,
        })
    }

    /// The values, copied out through a view ([`as_slice`](HostBuffer::as_slice)).
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = PinnedBuffer::from_slice(&device, &[5u8, 6])?;
    /// assert_eq!(buffer.to_vec()?, [5, 6]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`as_slice`](HostBuffer::as_slice).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        Ok(self.as_slice()?.to_vec())
    }

    /// Copies `data` (exactly [`len`](HostBuffer::len) values) in, through a view
    /// ([`as_mut_slice`](HostBuffer::as_mut_slice)).
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut buffer = ManagedBuffer::<i32>::zeroed(&device, 2)?;
    /// buffer.copy_from_slice(&[-1, 1])?;
    /// assert!(buffer.copy_from_slice(&[0]).is_err()); // one value for a buffer of two
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `PinnedBuffer::copy_from_slice` or
    /// `ManagedBuffer::copy_from_slice` when `data` does not hold exactly `len` values; those of
    /// [`as_mut_slice`](HostBuffer::as_mut_slice).
    pub fn copy_from_slice(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::invalid(
                K::CALLS.copy_from_slice,
                format!("{} values for a buffer of {}", data.len(), self.len),
            ));
        }
        self.as_mut_slice()?.copy_from_slice(data);
        Ok(())
    }

    /// Whether every GPU use of the buffer queued so far has completed (`cuEventQuery`): a view
    /// taken now would not wait.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = ManagedBuffer::<u32>::zeroed(&device, 1)?;
    /// assert!(buffer.is_idle()?); // nothing queued on it yet
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InHostFunction`] naming `PinnedBuffer::is_idle` or `ManagedBuffer::is_idle` in a
    /// host node's function; [`Error::InDoubt`] when work queued on the buffer could not be
    /// tracked; [`Error::Driver`] naming `cuEventQuery`.
    pub fn is_idle(&self) -> Result<bool> {
        self.memory.is_idle(K::CALLS.is_idle)
    }

    /// The number of values.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let buffer = PinnedBuffer::<u16>::zeroed(&Device::get(0)?, 3)?;
    /// assert_eq!(buffer.len(), 3);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no values (never: empty buffers are refused).
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// assert!(!ManagedBuffer::<u8>::zeroed(&Device::get(0)?, 1)?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// assert_eq!(ManagedBuffer::<u32>::zeroed(&Device::get(0)?, 4)?.byte_len(), 16);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.memory.bytes
    }

    /// The host address (for a managed buffer, also its device address). Reading or writing
    /// through it is the caller's `unsafe` business: it races with the GPU work the buffer is
    /// used by, which only a view waits for.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let buffer = PinnedBuffer::<u32>::zeroed(&Device::get(0)?, 1)?;
    /// assert!(!buffer.as_ptr().is_null());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn as_ptr(&self) -> *const T {
        self.memory.ptr.cast()
    }

    /// The device whose context allocated it.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// assert!(ManagedBuffer::<u32>::zeroed(&device, 1)?.device().same(&device));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.memory.device
    }

    /// The shared memory, for nodes, stream work and launches that use it.
    pub(crate) fn memory(&self) -> &Arc<HostMemory> {
        &self.memory
    }

    /// A value that keeps the memory allocated while it lives.
    pub(crate) fn keep(&self) -> Keep {
        self.memory.clone() as Keep
    }
}

/// A view of a [`HostBuffer`]'s values for reading ([`HostBuffer::as_slice`]); while it lives,
/// the crate queues no GPU work on the buffer. Dereferences to `[T]`.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let buffer = ManagedBuffer::from_slice(&Device::get(0)?, &[1u32, 2])?;
/// let view: HostRef<'_, u32> = buffer.as_slice()?;
/// assert_eq!(view.iter().sum::<u32>(), 3);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct HostRef<'a, T: Pod> {
    memory: &'a HostMemory,
    len: usize,
    /// Borrows the buffer shared, for `'a`.
    _borrow: PhantomData<&'a [T]>,
}

impl<T: Pod> Deref for HostRef<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the allocation holds `len` values of `T`, aligned (checked when made) and
        // initialized (zeroed when made; GPU work writes whole bytes, and any bytes are a valid
        // `T: Pod`); no GPU work on it runs while this view lives (the module docs), and no host
        // `&mut` to it exists while the buffer is borrowed shared.
        unsafe { std::slice::from_raw_parts(self.memory.ptr.cast::<T>(), self.len) }
    }
}

impl<T: Pod> Drop for HostRef<'_, T> {
    fn drop(&mut self) {
        self.memory.end_view();
    }
}

/// A view of a [`HostBuffer`]'s values for writing ([`HostBuffer::as_mut_slice`]); while it
/// lives, the crate queues no GPU work on the buffer. Dereferences to `[T]`, mutably.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let mut flag = ManagedBuffer::<u32>::zeroed(&Device::get(0)?, 1)?;
/// let mut view: HostMut<'_, u32> = flag.as_mut_slice()?;
/// view[0] = 0; // reset between launches
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct HostMut<'a, T: Pod> {
    memory: &'a HostMemory,
    len: usize,
    /// Borrows the buffer exclusively, for `'a` (made from `&'a mut HostBuffer`).
    _borrow: PhantomData<&'a mut [T]>,
}

impl<T: Pod> Deref for HostMut<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: as `HostRef`'s.
        unsafe { std::slice::from_raw_parts(self.memory.ptr.cast::<T>(), self.len) }
    }
}

impl<T: Pod> DerefMut for HostMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `HostRef`'s, and the buffer is borrowed exclusively by this view (made from
        // `&mut HostBuffer`), so no other host reference to the values exists.
        unsafe { std::slice::from_raw_parts_mut(self.memory.ptr.cast::<T>(), self.len) }
    }
}

impl<T: Pod> Drop for HostMut<'_, T> {
    fn drop(&mut self) {
        self.memory.end_view();
    }
}
