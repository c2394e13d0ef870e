//! Stream-ordered allocations outside a capture (`cuMemAllocAsync` on a stream that is not
//! capturing). Inside a capture, use [`Capture::malloc_async`](crate::Capture::malloc_async):
//! that becomes an alloc node.

use crate::error::{Error, Result, check};
use crate::memory::DeviceAddress;
use crate::pool::MemPool;
use crate::stream::{AsStream, CaptureStatus};
use crate::sys;

/// Memory allocated in stream order on a stream, freed in stream order on the same stream when
/// dropped or by [`free_async`](StreamAllocation::free_async). The stream outlives it.
///
/// Dropping it while its stream is capturing would capture the free into the graph (the trap
/// other wrappers fell into); the free is deferred instead and queued on the stream when the
/// capture ends through this crate's [`Capture`](crate::Capture). Work captured into a graph
/// must not use a stream allocation that is freed before the graph's launches finish: keep it
/// alive as long as the executable graph runs, or allocate inside the capture.
#[derive(Debug)]
pub struct StreamAllocation<'s, S: AsStream> {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    stream: &'s S,
    freed: bool,
    _tracked: crate::track::Tracked,
}

impl<'s, S: AsStream> StreamAllocation<'s, S> {
    /// `bytes` from the device's current memory pool (`cuMemAllocAsync`), ordered on `stream`.
    pub fn new(stream: &'s S, bytes: usize) -> Result<Self> {
        Self::allocate(stream, bytes, "cuMemAllocAsync", |ptr| {
            // SAFETY: out-pointer valid; the stream is live and not capturing (checked).
            unsafe { sys::cuMemAllocAsync(ptr, bytes, stream.as_raw_stream()) }
        })
    }

    /// `bytes` from `pool` (`cuMemAllocFromPoolAsync`), ordered on `stream`.
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
        if stream.capture_status()? != CaptureStatus::None {
            return Err(Error::invalid(
                call,
                "the stream is capturing; allocate with Capture::malloc_async, which makes an alloc node",
            ));
        }
        stream.device().bind()?;
        let mut ptr = 0;
        check(f(&mut ptr), call)?;
        Ok(StreamAllocation {
            ptr,
            bytes,
            stream,
            freed: false,
            _tracked: crate::track::Tracked::new(crate::track::Kind::StreamAllocation),
        })
    }

    /// Frees it on its stream now (`cuMemFreeAsync`), after the work queued there.
    pub fn free_async(mut self) -> Result<()> {
        let capturing = self.stream.capture_status()? != CaptureStatus::None;
        self.freed = true;
        if capturing {
            self.stream
                .device()
                .defer_free(self.ptr, self.stream.as_raw_stream());
            return Ok(());
        }
        check(
            // SAFETY: the address came from cuMemAllocAsync and is freed once.
            unsafe { sys::cuMemFreeAsync(self.ptr, self.stream.as_raw_stream()) },
            "cuMemFreeAsync",
        )
    }

    /// The stream it is ordered on.
    pub fn stream(&self) -> &'s S {
        self.stream
    }
}

impl<S: AsStream> DeviceAddress for StreamAllocation<'_, S> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.bytes
    }
}

impl<S: AsStream> Drop for StreamAllocation<'_, S> {
    fn drop(&mut self) {
        if self.freed {
            return;
        }
        match self.stream.capture_status() {
            Ok(CaptureStatus::None) => {
                // SAFETY: the address came from cuMemAllocAsync and is freed once, in order.
                let _ = unsafe { sys::cuMemFreeAsync(self.ptr, self.stream.as_raw_stream()) };
            }
            _ => self
                .stream
                .device()
                .defer_free(self.ptr, self.stream.as_raw_stream()),
        }
    }
}
