//! Stream-ordered fills and copies of device memory (`cuMemsetD8/D16/D32Async`,
//! `cuMemcpyAsync`) and copies between device memory and pinned host memory
//! (`cuMemcpyHtoDAsync`, `cuMemcpyDtoHAsync`), on any stream ([`StreamMemOps`]) and, through
//! the [`Capture`] guard, into a captured graph (`Capture::memset_async`,
//! `Capture::memcpy_async`, `Capture::memcpy_htod_async`, `Capture::memcpy_dtoh_async`).
//!
//! [`Capture`]: crate::Capture

use bytemuck::Pod;

use crate::error::{Error, Result, driver};
use crate::memory::{DeviceAddress, MemsetValue};
use crate::module::{KernelArgs, stream_ordered};
use crate::pinned::PinnedBuffer;
use crate::stream::AsStream;
use crate::sys;

/// Refuses a memset of `count` elements of `size` bytes that is empty or does not fit `target`
/// (the byte count computed without overflow).
pub(crate) fn check_memset(
    call: &'static str,
    target: &impl DeviceAddress,
    count: usize,
    size: usize,
) -> Result<()> {
    let fits = count
        .checked_mul(size)
        .is_some_and(|bytes| bytes <= target.byte_len());
    if count == 0 || !fits {
        return Err(Error::invalid(
            call,
            format!(
                "{count} elements of {size} bytes do not fit a target of {} bytes",
                target.byte_len()
            ),
        ));
    }
    Ok(())
}

/// Refuses a copy of `bytes` that is empty, does not fit `dst` or `src`, or whose source and
/// destination ranges overlap (CUDA leaves the result of such a copy undefined).
pub(crate) fn check_memcpy(
    call: &'static str,
    dst: &impl DeviceAddress,
    src: &impl DeviceAddress,
    bytes: usize,
) -> Result<()> {
    if bytes == 0 || bytes > dst.byte_len() || bytes > src.byte_len() {
        return Err(Error::invalid(
            call,
            format!(
                "{bytes} bytes do not fit a destination of {} bytes and a source of {} bytes",
                dst.byte_len(),
                src.byte_len()
            ),
        ));
    }
    let (d, s) = (dst.device_ptr(), src.device_ptr());
    let b = bytes as u64;
    if d < s.saturating_add(b) && s < d.saturating_add(b) {
        return Err(Error::invalid(
            call,
            format!("the {bytes} bytes at {d:#x} and at {s:#x} overlap"),
        ));
    }
    Ok(())
}

/// Refuses a copy of `bytes` between `device` memory and a pinned buffer of `host_bytes` that is
/// empty or does not fit either side. (The two cannot overlap: device allocations and page-locked
/// host allocations are distinct ranges of the unified address space.)
pub(crate) fn check_host_memcpy(
    call: &'static str,
    device: &impl DeviceAddress,
    host_bytes: usize,
    bytes: usize,
) -> Result<()> {
    if bytes == 0 || bytes > device.byte_len() || bytes > host_bytes {
        return Err(Error::invalid(
            call,
            format!(
                "{bytes} bytes do not fit the device memory of {} bytes and the pinned buffer of {host_bytes} bytes",
                device.byte_len()
            ),
        ));
    }
    Ok(())
}

/// Fills and copies of device memory ordered on a stream, for every [`AsStream`].
///
/// The operands are kept and ordered as a kernel's are ([`Function::launch`]): a graph
/// allocation must be live, and the stream first waits for the launch that allocated it; its
/// use, and a stream allocation's, is recorded so that their frees wait for it; a
/// [`DeviceBuffer`]'s `cuMemFree` waits for the device. On a stream that captures into a
/// capture of this crate, the operation becomes a node of the captured graph, which keeps the
/// operands alive; with a graph allocation among them it is refused there
/// ([`Error::Capturing`]): use `Capture::memset_async` or `Capture::memcpy_async`, which record
/// the use.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let stream = Stream::new(&device)?;
/// let a = DeviceBuffer::<u32>::zeroed(&device, 1024)?;
/// let b = DeviceBuffer::<u32>::zeroed(&device, 1024)?;
/// stream.memset_async(&a, 7u32, 1024)?;
/// stream.memcpy_async(&b, &a, 4096)?;
/// stream.synchronize()?;
/// assert!(b.to_vec()?.iter().all(|&x| x == 7));
/// # Ok(())
/// # }
/// ```
///
/// [`Function::launch`]: crate::Function::launch
/// [`DeviceBuffer`]: crate::DeviceBuffer
pub trait StreamMemOps: AsStream + Sized {
    /// Writes `value` to the first `count` elements (1, 2 or 4 bytes each, by `T`) of `target`
    /// (`cuMemsetD8Async`, `cuMemsetD16Async`, `cuMemsetD32Async`), ordered on this stream.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `StreamMemOps::memset_async`, before the driver, when
    /// `count` is 0 or the elements do not fit `target`; [`Error::NotLive`] or
    /// [`Error::Capturing`] naming it, with nothing queued, as described above;
    /// [`Device::bind`](crate::Device::bind)'s errors; [`Error::Driver`] naming the memset call
    /// or the stream and event calls that order and record the use (one that fails to record it
    /// is returned after the stream is synchronized, so that no free overtakes the queued memset).
    fn memset_async<T: MemsetValue>(
        &self,
        target: &impl DeviceAddress,
        value: T,
        count: usize,
    ) -> Result<()> {
        const CALL: &str = "StreamMemOps::memset_async";
        check_memset(CALL, target, count, std::mem::size_of::<T>())?;
        let operands = KernelArgs::new().ptr(target);
        stream_ordered(CALL, self.device(), self, &operands, None, || {
            // SAFETY: `count` elements fit `target` (checked); `stream_ordered` keeps `target`
            // alive and ordered for the operation; the stream is live.
            unsafe { T::memset_async(target.device_ptr(), value, count, self.as_raw_stream()) }
        })
    }

    /// Copies `bytes` from `src` to `dst`, both device memory (`cuMemcpyAsync`), ordered on this
    /// stream.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `StreamMemOps::memcpy_async`, before the driver, when
    /// `bytes` is 0, does not fit `dst` or `src`, or the two ranges overlap; [`Error::NotLive`]
    /// or [`Error::Capturing`] naming it, with nothing queued, as described above;
    /// [`Device::bind`](crate::Device::bind)'s errors; [`Error::Driver`] naming `cuMemcpyAsync`
    /// or the stream and event calls that order and record the uses (one that fails to record
    /// them is returned after the stream is synchronized, so that no free overtakes the copy).
    fn memcpy_async(
        &self,
        dst: &impl DeviceAddress,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<()> {
        const CALL: &str = "StreamMemOps::memcpy_async";
        check_memcpy(CALL, dst, src, bytes)?;
        let operands = KernelArgs::new().ptr(dst).ptr(src);
        stream_ordered(CALL, self.device(), self, &operands, None, || {
            // SAFETY: `bytes` fit both ranges, which do not overlap (checked); `stream_ordered`
            // keeps both alive and ordered for the operation; the stream is live.
            driver!(unsafe {
                sys::cuMemcpyAsync(
                    dst.device_ptr(),
                    src.device_ptr(),
                    bytes,
                    self.as_raw_stream(),
                )
            })
        })
    }

    /// Copies the first `bytes` of the pinned buffer `src` to device memory `dst`
    /// (`cuMemcpyHtoDAsync`), ordered on this stream. `dst` is ordered as in
    /// [`memcpy_async`](StreamMemOps::memcpy_async); the copy's use of `src` is recorded, so that
    /// a view of it ([`PinnedBuffer::as_slice`], [`as_mut_slice`](PinnedBuffer::as_mut_slice))
    /// waits for the copy and its memory is not freed before the copy is done. On a stream that
    /// captures into a capture of this crate, the copy becomes a memcpy node, which keeps both
    /// alive.
    ///
    /// Pageable host memory (`&[T]`) is not offered: CUDA may read it after the call returns,
    /// when the slice may be gone (and a captured copy reads it at every launch); use
    /// [`DeviceBuffer::copy_from`](crate::DeviceBuffer::copy_from) for a synchronous copy.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let stream = Stream::new(&device)?;
    /// let host = PinnedBuffer::from_slice(&device, &[1u32, 2, 3, 4])?;
    /// let back = PinnedBuffer::<u32>::zeroed(&device, 4)?;
    /// let on_device = DeviceBuffer::<u32>::zeroed(&device, 4)?;
    /// stream.memcpy_htod_async(&on_device, &host, 16)?;
    /// stream.memcpy_dtoh_async(&back, &on_device, 16)?;
    /// assert_eq!(&*back.as_slice()?, &[1, 2, 3, 4]); // waits for the copy
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `StreamMemOps::memcpy_htod_async`, before the driver,
    /// when `bytes` is 0 or does not fit `dst` or `src`; [`Error::InUseByHost`] naming it, with
    /// nothing queued, while a view of `src` is alive; [`Error::NotLive`], [`Error::Capturing`]
    /// and [`Error::InDoubt`] naming it, with nothing queued, as for
    /// [`memcpy_async`](StreamMemOps::memcpy_async); [`Device::bind`](crate::Device::bind)'s
    /// errors; [`Error::Driver`] naming `cuMemcpyHtoDAsync` or the stream and event calls that
    /// order and record the uses (one that fails to record them is returned after the stream is
    /// synchronized).
    fn memcpy_htod_async<T: Pod>(
        &self,
        dst: &impl DeviceAddress,
        src: &PinnedBuffer<T>,
        bytes: usize,
    ) -> Result<()> {
        const CALL: &str = "StreamMemOps::memcpy_htod_async";
        check_host_memcpy(CALL, dst, src.byte_len(), bytes)?;
        let host = src.memory();
        let operands = KernelArgs::new().ptr(dst).host(host);
        stream_ordered(CALL, self.device(), self, &operands, None, || {
            // SAFETY: `bytes` fit both (checked); `stream_ordered` keeps `dst` and `src` alive and
            // ordered, records the read of `src`, whose memory is freed only after it, and
            // refused it while the host holds a view; the stream is live.
            driver!(unsafe {
                sys::cuMemcpyHtoDAsync(
                    dst.device_ptr(),
                    host.ptr().cast_const(),
                    bytes,
                    self.as_raw_stream(),
                )
            })
        })
    }

    /// Copies the first `bytes` of device memory `src` into the pinned buffer `dst`
    /// (`cuMemcpyDtoHAsync`), ordered on this stream; `src` and `dst` are ordered, recorded and
    /// kept as in [`memcpy_htod_async`](StreamMemOps::memcpy_htod_async), so that a view of `dst`
    /// shows the copied values. Pageable host memory (`&mut [T]`) is not offered, for the same
    /// reasons: use [`DeviceBuffer::to_vec`](crate::DeviceBuffer::to_vec).
    ///
    /// # Errors
    ///
    /// As [`memcpy_htod_async`](StreamMemOps::memcpy_htod_async)'s, naming
    /// `StreamMemOps::memcpy_dtoh_async` and `cuMemcpyDtoHAsync`.
    fn memcpy_dtoh_async<T: Pod>(
        &self,
        dst: &PinnedBuffer<T>,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<()> {
        const CALL: &str = "StreamMemOps::memcpy_dtoh_async";
        check_host_memcpy(CALL, src, dst.byte_len(), bytes)?;
        let host = dst.memory();
        let operands = KernelArgs::new().ptr(src).host(host);
        stream_ordered(CALL, self.device(), self, &operands, None, || {
            // SAFETY: as in `memcpy_htod_async`, with the pinned memory written.
            driver!(unsafe {
                sys::cuMemcpyDtoHAsync(host.ptr(), src.device_ptr(), bytes, self.as_raw_stream())
            })
        })
    }
}

impl<S: AsStream> StreamMemOps for S {}
