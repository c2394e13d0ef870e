//! Device addresses and plain device buffers (`cuMemAlloc`), for data that lives outside graphs:
//! inputs, results to copy back, and the like. [`DeviceAddress`] is implemented here for every
//! kind of the crate's device-addressable memory (buffers, [`GraphAllocation`]s, stream-ordered
//! allocations, managed buffers).

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;

use crate::alloc::GraphAllocation;
use crate::device::Device;
use crate::error::{Error, Result, driver};
use crate::handle::Handle;
use crate::host_memory::{HostBuffer, HostMemory};
use crate::keep::{Keep, KeepList};
use crate::managed::Managed;
use crate::stream::{AsStream, BorrowedStream};
use crate::stream_alloc::{StreamAllocation, StreamMemory};
use crate::sys;

/// Memory of this crate with a device address: a [`DeviceBuffer`], a
/// [`StreamAllocation`](crate::StreamAllocation), a [`GraphAllocation`], a
/// [`ManagedBuffer`](crate::ManagedBuffer).
///
/// Sealed: graph nodes and kernel arguments trust the address and the length, and keep the
/// memory's owner alive for as long as the GPU may touch it; only the crate's own types can
/// promise both. Memory from elsewhere reaches kernels as a plain value
/// ([`KernelArgs::value`](crate::KernelArgs::value)), under the launch's `unsafe` contract.
pub trait DeviceAddress: sealed::Sealed {
    /// The address.
    #[must_use]
    fn device_ptr(&self) -> sys::CUdeviceptr;
    /// The size in bytes.
    #[must_use]
    fn byte_len(&self) -> usize;
    /// The graph allocation behind the address, if it is one (its uses are recorded).
    #[must_use]
    fn graph_allocation(&self) -> Option<&GraphAllocation> {
        match self.owner() {
            Owner::Graph(a) => Some(a),
            _ => None,
        }
    }
}

pub(crate) mod sealed {
    /// Implemented by the crate's memory types only.
    pub trait Sealed {
        /// Who owns the memory: what a node or launch that refers to it keeps alive.
        fn owner(&self) -> super::Owner<'_>;
    }
}

/// The owner of some memory, as a node or a launch sees it.
#[derive(Debug, Clone, Copy)]
pub enum Owner<'a> {
    /// A graph allocation: its uses are recorded for the lifetime checks and ordered.
    Graph(&'a GraphAllocation),
    /// A stream-ordered allocation: its free waits for every use on other streams.
    Stream(&'a Arc<StreamMemory>),
    /// A `cuMemAlloc` buffer: `cuMemFree` waits for the device, so keeping it alive suffices.
    Buffer(&'a Arc<BufferMemory>),
    /// A cudarc slice ([`CudarcSlice`](crate::CudarcSlice)): its uses are recorded per stream,
    /// as a stream allocation's, and its free by cudarc waits for them.
    #[cfg(feature = "cudarc")]
    Cudarc(&'a Arc<crate::cudarc::CudarcMemory>),
    /// Managed memory ([`ManagedBuffer`](crate::ManagedBuffer)): the host reads and writes it
    /// too, so every GPU use is refused while a host view lives, and recorded for the views and
    /// its free to wait for.
    Host(&'a Arc<HostMemory>),
}

impl Owner<'_> {
    /// Keeps the memory allocated for as long as `list` and what it is shared with hold it, but
    /// for a graph allocation, which the record of the graph whose node uses it holds (see
    /// `KernelArgs::keep_unrecorded_in`).
    #[inline]
    pub(crate) fn keep_unrecorded_in(&self, list: &mut KeepList) {
        match self {
            Owner::Graph(_) => {}
            Owner::Stream(m) => list.push_arc(m),
            Owner::Buffer(m) => list.push_arc(m),
            #[cfg(feature = "cudarc")]
            Owner::Cudarc(m) => list.push_arc(m),
            Owner::Host(m) => list.push_host(Arc::clone(m) as Keep),
        }
    }
}

/// The allocation behind a [`DeviceBuffer`], shared with the graphs whose nodes refer to it;
/// freed (`cuMemFree`, which waits for the device's work) when the last holder drops.
#[derive(Debug)]
pub struct BufferMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    device: Device,
    _tracked: crate::live_objects::Tracked,
}

impl Drop for BufferMemory {
    fn drop(&mut self) {
        let ptr = self.ptr;
        self.device.release(move |device| {
            // SAFETY: allocated by cuMemAlloc and freed once, when no node, launch or handle
            // refers to it; cuMemFree waits for work using it.
            device.record(driver!(unsafe { sys::cuMemFree(ptr) }));
            true
        });
    }
}

/// Device memory from `cuMemAlloc` holding `len` values of `T`, freed when the buffer and
/// every graph that refers to it are gone.
///
/// `T` is plain old data ([`bytemuck::Pod`]): every bit pattern the device writes is a valid
/// `T`, and a `T` has no padding bytes to copy. References, `bool`, `char` and types with
/// invariants are refused at compile time.
#[derive(Debug)]
pub struct DeviceBuffer<T: Pod> {
    memory: Arc<BufferMemory>,
    len: usize,
    _type: PhantomData<T>,
}

impl<T: Pod> DeviceBuffer<T> {
    /// `len` values, zero-filled.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `DeviceBuffer::zeroed` when `len` is 0 or the size in
    /// bytes overflows; [`Device::bind`]'s errors; [`Error::Driver`] naming `cuMemAlloc`,
    /// `cuMemsetD8` or `cuStreamSynchronize` (the wait for the zeroing, on the legacy stream).
    pub fn zeroed(device: &Device, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::invalid("DeviceBuffer::zeroed", "size is zero or overflows"))?;
        device.bind()?;
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the context is current.
        driver!(unsafe { sys::cuMemAlloc(&mut ptr, bytes) })?;
        let buffer = DeviceBuffer {
            memory: Arc::new(BufferMemory {
                ptr,
                bytes,
                device: device.clone(),
                _tracked: crate::live_objects::Tracked::new(
                    crate::live_objects::Kind::DeviceBuffer,
                ),
            }),
            len,
            _type: PhantomData,
        };
        // SAFETY: the range is the allocation just made.
        driver!(unsafe { sys::cuMemsetD8(ptr, 0, bytes) })?;
        // cuMemsetD8 on device memory returns before it runs, queued on the legacy stream,
        // which non-blocking streams do not wait for: a kernel on one could write the buffer
        // and the memset clear it afterwards. Zeroed means zeroed when this returns.
        BorrowedStream::legacy(device).synchronize()?;
        Ok(buffer)
    }

    /// A copy of `data` on the device.
    ///
    /// # Errors
    ///
    /// Those of [`zeroed`](DeviceBuffer::zeroed) (an empty `data` is refused there) and
    /// [`copy_from`](DeviceBuffer::copy_from).
    pub fn from_slice(device: &Device, data: &[T]) -> Result<DeviceBuffer<T>> {
        let buffer = DeviceBuffer::zeroed(device, data.len())?;
        buffer.copy_from(data)?;
        Ok(buffer)
    }

    /// Copies `data` (exactly `len` values) to the device; the values are there when it returns,
    /// for work on any stream.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `DeviceBuffer::copy_from` when `data` does not hold
    /// exactly [`len`](DeviceBuffer::len) values; [`Device::bind`]'s errors; [`Error::Driver`]
    /// naming `cuMemcpyHtoD` or `cuStreamSynchronize` (the wait for the copy, on the legacy
    /// stream).
    pub fn copy_from(&self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::invalid(
                "DeviceBuffer::copy_from",
                format!("{} values for a buffer of {}", data.len(), self.len),
            ));
        }
        self.memory.device.bind()?;
        // SAFETY: source and destination both hold `len * size_of::<T>()` bytes; `T: Pod`
        // has no padding, so every source byte is initialized.
        driver!(unsafe {
            sys::cuMemcpyHtoD(self.memory.ptr, data.as_ptr().cast(), self.byte_len())
        })?;
        // From pageable memory cuMemcpyHtoD may return before the data reaches the device.
        BorrowedStream::legacy(&self.memory.device).synchronize()
    }

    /// The contents, copied to the host synchronously (after the legacy stream's work).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuMemcpyDtoH`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.memory.device.bind()?;
        let mut out = Vec::<T>::with_capacity(self.len);
        // SAFETY: the destination has capacity for `len` values of `T`.
        driver!(unsafe {
            sys::cuMemcpyDtoH(out.as_mut_ptr().cast(), self.memory.ptr, self.byte_len())
        })?;
        // SAFETY: all `len` values were written by the copy, and any bytes are a valid `T`
        // (`T: Pod`).
        unsafe { out.set_len(self.len) };
        Ok(out)
    }

    /// Copies the contents to the host after the work queued on `stream`.
    ///
    /// # Errors
    ///
    /// Those of [`AsStream::synchronize`] on `stream`, then those of
    /// [`to_vec`](DeviceBuffer::to_vec).
    pub fn to_vec_after(&self, stream: &impl AsStream) -> Result<Vec<T>> {
        stream.synchronize()?;
        self.to_vec()
    }

    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no values (never: zero-sized buffers are refused).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.memory.device
    }
}

/// The buffer's device address, as [`DeviceAddress::device_ptr`].
impl<T: Pod> Handle for DeviceBuffer<T> {
    type Raw = sys::CUdeviceptr;

    fn as_raw(&self) -> sys::CUdeviceptr {
        self.memory.ptr
    }
}

impl<T: Pod> sealed::Sealed for DeviceBuffer<T> {
    fn owner(&self) -> Owner<'_> {
        Owner::Buffer(&self.memory)
    }
}

impl<T: Pod> DeviceAddress for DeviceBuffer<T> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.memory.ptr
    }
    fn byte_len(&self) -> usize {
        self.memory.bytes
    }
}

// The other kinds of memory (and, with the `cudarc` feature, cudarc's): their types are below this
// module (they name neither the trait nor `Owner`), and the trait's implementations for them are
// here, beside the trait.

impl sealed::Sealed for GraphAllocation {
    fn owner(&self) -> Owner<'_> {
        Owner::Graph(self)
    }
}

impl DeviceAddress for GraphAllocation {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr()
    }
    fn byte_len(&self) -> usize {
        self.bytes()
    }
}

impl<S: AsStream> sealed::Sealed for StreamAllocation<'_, S> {
    fn owner(&self) -> Owner<'_> {
        Owner::Stream(self.memory())
    }
}

impl<S: AsStream> DeviceAddress for StreamAllocation<'_, S> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.memory().ptr
    }
    fn byte_len(&self) -> usize {
        self.memory().bytes
    }
}

impl<T: Pod> sealed::Sealed for HostBuffer<T, Managed> {
    fn owner(&self) -> Owner<'_> {
        Owner::Host(self.memory())
    }
}

/// A managed buffer's address, valid on the device as on the host.
impl<T: Pod> DeviceAddress for HostBuffer<T, Managed> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.memory().device_ptr()
    }
    fn byte_len(&self) -> usize {
        self.memory().bytes()
    }
}

#[cfg(feature = "cudarc")]
impl<T: Pod> sealed::Sealed for crate::cudarc::CudarcSlice<T> {
    fn owner(&self) -> Owner<'_> {
        Owner::Cudarc(self.memory())
    }
}

#[cfg(feature = "cudarc")]
impl<T: Pod> DeviceAddress for crate::cudarc::CudarcSlice<T> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.memory().ptr
    }
    fn byte_len(&self) -> usize {
        self.memory().bytes
    }
}

/// A value a memset writes: 1, 2 or 4 bytes (CUDA's element sizes): `u8`, `u16`, `u32`. Sealed.
pub trait MemsetValue: memset_value::Sealed + Copy {
    /// The value as CUDA's 32-bit `value` field holds it (zero-extended).
    fn bits(self) -> u32;
}

mod memset_value {
    use crate::error::{Result, driver};
    use crate::sys;

    pub trait Sealed: Sized {
        /// `cuMemsetD8Async`, `cuMemsetD16Async` or `cuMemsetD32Async` of `count` elements at
        /// `dst` on `stream`.
        ///
        /// # Safety
        ///
        /// `count` elements of this size fit the memory at `dst`, which outlives the operation;
        /// `stream` is live.
        unsafe fn memset_async(
            dst: sys::CUdeviceptr,
            value: Self,
            count: usize,
            stream: sys::CUstream,
        ) -> Result<()>;
    }

    impl Sealed for u8 {
        unsafe fn memset_async(
            dst: sys::CUdeviceptr,
            value: u8,
            count: usize,
            stream: sys::CUstream,
        ) -> Result<()> {
            // SAFETY: the caller's contract.
            driver!(unsafe { sys::cuMemsetD8Async(dst, value, count, stream) })
        }
    }

    impl Sealed for u16 {
        unsafe fn memset_async(
            dst: sys::CUdeviceptr,
            value: u16,
            count: usize,
            stream: sys::CUstream,
        ) -> Result<()> {
            // SAFETY: the caller's contract.
            driver!(unsafe { sys::cuMemsetD16Async(dst, value, count, stream) })
        }
    }

    impl Sealed for u32 {
        unsafe fn memset_async(
            dst: sys::CUdeviceptr,
            value: u32,
            count: usize,
            stream: sys::CUstream,
        ) -> Result<()> {
            // SAFETY: the caller's contract.
            driver!(unsafe { sys::cuMemsetD32Async(dst, value, count, stream) })
        }
    }
}

impl MemsetValue for u8 {
    fn bits(self) -> u32 {
        u32::from(self)
    }
}

impl MemsetValue for u16 {
    fn bits(self) -> u32 {
        u32::from(self)
    }
}

impl MemsetValue for u32 {
    fn bits(self) -> u32 {
        self
    }
}
