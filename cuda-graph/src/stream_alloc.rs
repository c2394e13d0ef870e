//! Stream-ordered allocations outside a capture (`cuMemAllocAsync` on a stream that is not
//! capturing). Inside a capture, use [`Capture::malloc_async`](crate::Capture::malloc_async):
//! that becomes an alloc node.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use crate::deferred;
use crate::device::Device;
use crate::error::{Error, Result, check, driver};
use crate::pool::MemPool;
use crate::stream::{AsStream, CaptureStatus, raw_capture_status};
use crate::sys;
use crate::uses::StreamUses;

/// The memory of a [`StreamAllocation`], shared with the graphs whose nodes refer to it.
///
/// Freed in stream order after every use the crate knows of: by its handle on its own stream
/// when nothing else holds it, otherwise by the last holder on the device's private stream,
/// after the events of every use (its own stream's included, recorded when the handle let go).
#[derive(Debug)]
pub struct StreamMemory {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    device: Device,
    uses: Mutex<StreamUses>,
    freed: AtomicBool,
    _tracked: crate::live_objects::Tracked,
}

impl StreamMemory {
    /// Stream work using it was queued on `stream`.
    pub(crate) fn note_stream_use(&self, stream: &impl AsStream) -> Result<()> {
        crate::uses::note_stream_use(&self.uses, &self.device, stream)
    }

    /// Work that `queued_by` queued on it can neither be marked nor waited for: it is never
    /// freed ([`Error::InDoubt`]).
    pub(crate) fn doubt(&self, queued_by: &'static str) {
        crate::uses::doubt(&self.uses, queued_by);
    }
}

impl Drop for StreamMemory {
    fn drop(&mut self) {
        if self.freed.load(Ordering::Acquire) {
            return;
        }
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        let ptr = self.ptr;
        self.device.release(move |device| {
            let result = device.reaper_stream().and_then(|reaper| {
                uses.wait_on(reaper, None)?;
                // SAFETY: from cuMemAllocAsync, freed once, after every known use; the reaper
                // stream never captures.
                driver!(unsafe { sys::cuMemFreeAsync(ptr, reaper) })
            });
            if let Err(e) = result {
                device.record_drop_error(e);
            }
            true
        });
    }
}

/// Memory allocated in stream order on a stream, freed in stream order when dropped or by
/// [`free_async`](StreamAllocation::free_async). The stream outlives the handle.
///
/// The free waits for everything the crate knows uses it: work on its own stream, kernels
/// launched on other streams with it as an argument, and graphs whose nodes refer to it (they
/// keep it allocated until their last launch is done). Dropped while its stream captures, the
/// free is not captured: it is put off until the capture ends. On the per-thread default stream
/// ([`BorrowedStream::per_thread`](crate::BorrowedStream::per_thread)) the handle belongs to the
/// thread that made it; dropped on another thread, the free first waits for the whole device
/// (`cuCtxSynchronize`), the only order that thread can see.
#[derive(Debug)]
pub struct StreamAllocation<'s, S: AsStream> {
    memory: Option<Arc<StreamMemory>>,
    stream: &'s S,
    /// The thread that made it, when its stream is the per-thread default stream.
    per_thread_of: Option<ThreadId>,
}

impl<'s, S: AsStream> StreamAllocation<'s, S> {
    /// `bytes` from the device's current memory pool (`cuMemAllocAsync`), ordered on `stream`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `cuMemAllocAsync`, before any driver call, for 0 bytes or a size
    /// of the device's whole memory or more. CUDA accepts a 0-byte allocation under stream
    /// capture (an alloc node of 0 bytes) and refuses it for an explicit node; this crate refuses
    /// both, so that every allocation it hands out has an address that is its own. A size the
    /// device cannot hold would be accepted by CUDA and fail only at the launch or upload. Sums
    /// of allocations are not checked: what fits depends on what else is allocated then.
    ///
    /// [`Error::Capturing`] naming `cuMemAllocAsync` when `stream` is capturing (allocate with
    /// [`Capture::malloc_async`](crate::Capture::malloc_async), which makes an alloc node);
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuDeviceTotalMem` (read once per
    /// device, for the size check), `cuStreamIsCapturing` or `cuMemAllocAsync`.
    pub fn new(stream: &'s S, bytes: usize) -> Result<Self> {
        Self::allocate(stream, bytes, "cuMemAllocAsync", |ptr| {
            // SAFETY: out-pointer valid; the stream is live and not capturing (checked).
            unsafe { sys::cuMemAllocAsync(ptr, bytes, stream.as_raw_stream()) }
        })
    }

    /// `bytes` from `pool` (`cuMemAllocFromPoolAsync`), ordered on `stream`.
    ///
    /// # Errors
    ///
    /// As [`new`](StreamAllocation::new)'s, naming `cuMemAllocFromPoolAsync`.
    pub fn from_pool(stream: &'s S, pool: &MemPool, bytes: usize) -> Result<Self> {
        Self::allocate(stream, bytes, "cuMemAllocFromPoolAsync", |ptr| {
            // SAFETY: out-pointer valid; pool and stream are live; the stream is not capturing.
            unsafe {
                sys::cuMemAllocFromPoolAsync(ptr, bytes, pool.as_raw(), stream.as_raw_stream())
            }
        })
    }

    fn allocate(
        stream: &'s S,
        bytes: usize,
        call: &'static str,
        f: impl FnOnce(*mut sys::CUdeviceptr) -> sys::CUresult,
    ) -> Result<Self> {
        crate::alloc::check_size(call, stream.device(), bytes)?;
        // No capture of this crate begins on the stream, or forks it in, between the check and
        // the allocation: it would become an alloc node, its address mapped only by the graph.
        let _gate = deferred::hold_gate();
        if stream.capture_status()? != CaptureStatus::None {
            return Err(Error::Capturing {
                call,
                instead: "allocate with Capture::malloc_async, which makes an alloc node",
            });
        }
        stream.device().bind()?;
        let mut ptr = 0;
        check(f(&mut ptr), call)?;
        Ok(StreamAllocation {
            memory: Some(Arc::new(StreamMemory {
                ptr,
                bytes,
                device: stream.device().clone(),
                uses: Mutex::new(StreamUses::default()),
                freed: AtomicBool::new(false),
                _tracked: crate::live_objects::Tracked::new(
                    crate::live_objects::Kind::StreamAllocation,
                ),
            })),
            stream,
            per_thread_of: (stream.as_raw_stream() == sys::CU_STREAM_PER_THREAD)
                .then(|| std::thread::current().id()),
        })
    }

    /// Frees it on its stream now (`cuMemFreeAsync`), after the work queued there and every
    /// other use the crate knows of; while the stream captures, or a graph still refers to it,
    /// the free is put off as on drop.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamIsCapturing`, `cuStreamGetId`,
    /// `cuStreamWaitEvent` (ordering the free after other streams' uses), `cuMemFreeAsync`,
    /// `cuCtxSynchronize` (a per-thread default stream freed from another thread) or, when a graph
    /// still holds the memory, `cuEventCreate` or `cuEventRecord`. The handle lets go all the same:
    /// on error the memory is freed as when its last holder drops.
    pub fn free_async(mut self) -> Result<()> {
        self.let_go()
    }

    /// The stream it is ordered on.
    #[must_use]
    pub fn stream(&self) -> &'s S {
        self.stream
    }

    pub(crate) fn memory(&self) -> &Arc<StreamMemory> {
        self.memory
            .as_ref()
            .expect("present until the handle lets go")
    }

    /// Frees the memory on its stream if nothing else holds it, or leaves the free to the last
    /// holder after recording this stream's last use; put off while the stream captures or a
    /// registered capture forbids releases.
    fn let_go(&mut self) -> Result<()> {
        let Some(mut memory) = self.memory.take() else {
            return Ok(());
        };
        let raw = self.stream.as_raw_stream();
        let owner = self.per_thread_of;
        {
            // No capture of this crate begins between the checks and the free.
            let _gate = deferred::hold_gate();
            if deferred::release_allowed() && let_go_on(&mut memory, raw, owner)? {
                return Ok(());
            }
        }
        let raw = raw as usize;
        let ordinal = memory.device.ordinal();
        let mut memory = Some(memory);
        deferred::enqueue(
            ordinal,
            Box::new(move || {
                let Some(mut m) = memory.take() else {
                    return true;
                };
                match let_go_on(&mut m, raw as sys::CUstream, owner) {
                    Ok(false) => {
                        memory = Some(m);
                        false
                    }
                    Ok(true) => true,
                    Err(e) => {
                        m.device.record_drop_error(e);
                        true
                    }
                }
            }),
        );
        Ok(())
    }
}

/// One attempt of [`StreamAllocation::let_go`] on stream `raw`, on the calling thread:
/// `Ok(false)` while it cannot run yet. `owner` is the thread whose per-thread default stream
/// `raw` is, if it is that stream. On `Ok(true)` the caller drops `memory`.
fn let_go_on(
    memory: &mut Arc<StreamMemory>,
    raw: sys::CUstream,
    owner: Option<ThreadId>,
) -> Result<bool> {
    let other_thread = owner.is_some_and(|t| t != std::thread::current().id());
    if other_thread {
        // The per-thread stream of another thread: nothing this thread can queue is ordered
        // after its work but the whole device, which must not be synchronized while any
        // capture of this crate runs. Then the last holder frees it (StreamMemory's drop),
        // after the other known uses.
        if deferred::any_capture() {
            return Ok(false);
        }
        memory.device.bind()?;
        // SAFETY: the context is current; no capture of this crate is active.
        driver!(unsafe { sys::cuCtxSynchronize() })?;
        return Ok(true);
    }
    memory.device.bind()?;
    if raw_capture_status(raw)? != CaptureStatus::None {
        return Ok(false);
    }
    let mut id = 0;
    // SAFETY: `id` is a valid out-pointer; the stream is live and not capturing.
    driver!(unsafe { sys::cuStreamGetId(raw, &mut id) })?;
    let device = memory.device.clone();
    match Arc::get_mut(memory) {
        Some(m) => {
            let uses = m.uses.get_mut().unwrap_or_else(|e| e.into_inner());
            uses.wait_on(raw, Some(id))?;
            // SAFETY: from cuMemAllocAsync, freed once (marked below), in order on its stream
            // after every other known use.
            driver!(unsafe { sys::cuMemFreeAsync(m.ptr, raw) })?;
            m.freed.store(true, Ordering::Release);
        }
        None => {
            // A graph still holds it: its free, by the last holder, waits for this stream too.
            // SAFETY: `raw` is the allocation's live stream, of `device`.
            let stream = unsafe { crate::stream::BorrowedStream::from_raw(raw, &device) };
            let mut uses = memory.uses.lock().unwrap_or_else(|e| e.into_inner());
            uses.note(&device, &stream, id)?;
        }
    }
    Ok(true)
}

impl<S: AsStream> Drop for StreamAllocation<'_, S> {
    fn drop(&mut self) {
        let device = self.stream.device().clone();
        if let Err(e) = self.let_go() {
            device.record_drop_error(e);
        }
    }
}
