//! Device addresses and plain device buffers (`cuMemAlloc`), for data that lives outside graphs:
//! inputs, results to copy back, and the like.

use std::marker::PhantomData;

use crate::alloc::GraphAllocation;
use crate::device::Device;
use crate::error::{Error, Result, check};
use crate::stream::{AsStream, BorrowedStream};
use crate::sys;

/// Something with a device address: a [`DeviceBuffer`], a [`GraphAllocation`].
pub trait DeviceAddress {
    /// The address.
    fn device_ptr(&self) -> sys::CUdeviceptr;
    /// The size in bytes.
    fn byte_len(&self) -> usize;
    /// The graph allocation behind the address, if it is one (its uses are recorded).
    fn graph_allocation(&self) -> Option<&GraphAllocation> {
        None
    }
}

/// Device memory from `cuMemAlloc` holding `len` values of `T`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer<T: Copy> {
    ptr: sys::CUdeviceptr,
    len: usize,
    device: Device,
    _type: PhantomData<T>,
    _tracked: crate::track::Tracked,
}

// SAFETY: device memory may be used from any thread; the buffer owns its address exclusively.
unsafe impl<T: Copy + Send> Send for DeviceBuffer<T> {}
// SAFETY: `&self` methods only read the address or copy through the driver, which is thread-safe.
unsafe impl<T: Copy + Sync> Sync for DeviceBuffer<T> {}

impl<T: Copy> DeviceBuffer<T> {
    /// `len` values, zero-filled.
    pub fn zeroed(device: &Device, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::invalid("DeviceBuffer::zeroed", "size is zero or overflows"))?;
        device.bind()?;
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the context is current.
        check(unsafe { sys::cuMemAlloc(&mut ptr, bytes) }, "cuMemAlloc")?;
        let buffer = DeviceBuffer {
            ptr,
            len,
            device: device.clone(),
            _type: PhantomData,
            _tracked: crate::track::Tracked::new(crate::track::Kind::DeviceBuffer),
        };
        // SAFETY: the range is the allocation just made.
        check(unsafe { sys::cuMemsetD8(ptr, 0, bytes) }, "cuMemsetD8")?;
        // cuMemsetD8 on device memory returns before it runs, queued on the legacy stream,
        // which non-blocking streams do not wait for: a kernel on one could write the buffer
        // and the memset clear it afterwards. Zeroed means zeroed when this returns.
        BorrowedStream::legacy(device).synchronize()?;
        Ok(buffer)
    }

    /// A copy of `data` on the device.
    pub fn from_slice(device: &Device, data: &[T]) -> Result<DeviceBuffer<T>> {
        let buffer = DeviceBuffer::zeroed(device, data.len())?;
        buffer.copy_from(data)?;
        Ok(buffer)
    }

    /// Copies `data` (exactly `len` values) to the device; the values are there when it returns,
    /// for work on any stream.
    pub fn copy_from(&self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::invalid(
                "DeviceBuffer::copy_from",
                format!("{} values for a buffer of {}", data.len(), self.len),
            ));
        }
        self.device.bind()?;
        check(
            // SAFETY: source and destination both hold `len * size_of::<T>()` bytes.
            unsafe { sys::cuMemcpyHtoD(self.ptr, data.as_ptr().cast(), self.byte_len()) },
            "cuMemcpyHtoD",
        )?;
        // From pageable memory cuMemcpyHtoD may return before the data reaches the device.
        BorrowedStream::legacy(&self.device).synchronize()
    }

    /// The contents, copied to the host synchronously (after the legacy stream's work).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.device.bind()?;
        let mut out = Vec::<T>::with_capacity(self.len);
        check(
            // SAFETY: the destination has capacity for `len` values of `T`.
            unsafe { sys::cuMemcpyDtoH(out.as_mut_ptr().cast(), self.ptr, self.byte_len()) },
            "cuMemcpyDtoH",
        )?;
        // SAFETY: all `len` values were written by the copy.
        unsafe { out.set_len(self.len) };
        Ok(out)
    }

    /// Copies the contents to the host after the work queued on `stream`.
    pub fn to_vec_after(&self, stream: &impl AsStream) -> Result<Vec<T>> {
        stream.synchronize()?;
        self.to_vec()
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no values (never: zero-sized buffers are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Copy> DeviceAddress for DeviceBuffer<T> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }
}

impl<T: Copy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: allocated by cuMemAlloc and freed once; cuMemFree waits for work using it.
            let _ = unsafe { sys::cuMemFree(self.ptr) };
        }
    }
}
