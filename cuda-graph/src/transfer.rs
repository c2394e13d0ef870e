//! Stream-ordered fills and copies of device memory (`cuMemsetD8/D16/D32Async`,
//! `cuMemcpyAsync`), on any stream ([`StreamMemOps`]) and, through the [`Capture`] guard, into a
//! captured graph (`Capture::memset_async`, `Capture::memcpy_async`).
//!
//! [`Capture`]: crate::Capture

use crate::error::{Error, Result, driver};
use crate::memory::{DeviceAddress, MemsetValue};
use crate::module::{KernelArgs, stream_ordered};
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
}

impl<S: AsStream> StreamMemOps for S {}
