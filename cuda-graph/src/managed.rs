//! Managed memory (`cuMemAllocManaged`), which kernels, memsets and copies on the device and
//! Rust code on the host both read and write: [`ManagedBuffer`], a [`HostBuffer`] of the kind
//! [`Managed`]; the graphMemoryNodes sample's result flag, which a validation kernel sets and
//! the host reads after a synchronize.
//!
//! Its memory, its GPU uses and its host views are [`crate::host_memory`]'s, shared with pinned
//! memory ([`crate::pinned`]). It has a device address too: it is a
//! [`DeviceAddress`](crate::DeviceAddress) (implemented in `memory`), so a memset or memcpy node,
//! a stream memset or copy and a kernel argument ([`KernelArgs::ptr`](crate::KernelArgs::ptr))
//! take it like device memory, and keep it allocated as they keep device memory (the ownership
//! rule). Every such use is also a GPU use of host-visible memory: refused while a view lives
//! ([`Error::InUseByHost`]), recorded for views and the free to wait for.
//!
//! # Safety
//!
//! Host access to managed memory while the GPU may touch it is a data race; the views prevent
//! it for the work the crate queues. On a device without concurrent managed access
//! (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` 0: Windows, some embedded GPUs) the host
//! may not touch *any* managed memory attached globally while *any* kernel runs on the device,
//! used or not: the access faults. The views cannot know of unrelated work, so
//! [`HostBuffer::zeroed`] refuses managed memory unless every device of the process reports
//! concurrent managed access. The driver's page migration under a view is coherent and not a
//! race.

use std::ffi::c_void;

use crate::device::Device;
use crate::error::{Error, Result, driver};
use crate::host_memory::{Calls, Free, HostBuffer, HostKind, HostMut, HostRef, sealed};
use crate::sys;

/// The kind of [`HostBuffer`] that is managed memory (`cuMemAllocManaged` with
/// `CU_MEM_ATTACH_GLOBAL`, freed with `cuMemFree`): [`ManagedBuffer`]. Its address is valid on
/// the host and on the device.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let flag: HostBuffer<u32, Managed> = ManagedBuffer::zeroed(&Device::get(0)?, 1)?;
/// assert_eq!(flag.device_ptr() as usize, flag.as_ptr() as usize); // one address for both
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub enum Managed {}

/// The calls managed buffers name.
const CALLS: Calls = Calls {
    zeroed: "ManagedBuffer::zeroed",
    as_slice: "ManagedBuffer::as_slice",
    as_mut_slice: "ManagedBuffer::as_mut_slice",
    copy_from_slice: "ManagedBuffer::copy_from_slice",
    is_idle: "ManagedBuffer::is_idle",
};

impl sealed::Sealed for Managed {
    const CALLS: Calls = CALLS;
    const FREE: Free = Free::Device;

    fn allocate(device: &Device, bytes: usize) -> Result<*mut c_void> {
        refuse_without_concurrent_access(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0;
        // SAFETY: `ptr` is a valid out-pointer; the context is current (the caller's); the flag
        // is one of cuMemAllocManaged's.
        driver!(unsafe { sys::cuMemAllocManaged(&mut ptr, bytes, flags) })?;
        Ok(ptr as usize as *mut c_void)
    }
}

impl HostKind for Managed {}

/// Refuses managed memory unless every device of the process reports concurrent managed
/// access (the module's `# Safety`): without it, a host view could fault while unrelated work
/// runs.
fn refuse_without_concurrent_access(device: &Device) -> Result<()> {
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    driver!(unsafe { sys::cuDeviceGetCount(&mut count) })?;
    for ordinal in 0..count {
        let mut raw = 0;
        // SAFETY: `raw` is a valid out-pointer; `ordinal` is below the count.
        driver!(unsafe { sys::cuDeviceGet(&mut raw, ordinal) })?;
        let mut concurrent = 0;
        // SAFETY: `concurrent` is a valid out-pointer; `raw` is a device handle.
        driver!(unsafe {
            sys::cuDeviceGetAttribute(
                &mut concurrent,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
                raw,
            )
        })?;
        if concurrent == 0 {
            return Err(Error::invalid(
                CALLS.zeroed,
                format!(
                    "device {ordinal} does not report concurrent managed access, so the host may not read managed memory while any kernel runs; a view could not rule that out (allocating on device {})",
                    device.ordinal()
                ),
            ));
        }
    }
    Ok(())
}

/// Managed memory from `cuMemAllocManaged` (`CU_MEM_ATTACH_GLOBAL`) holding `len` values of
/// `T`, at one address for the host and every device: a [`DeviceAddress`](crate::DeviceAddress)
/// operand of memset and memcpy nodes, of stream memsets and copies, and of kernels
/// ([`KernelArgs::ptr`](crate::KernelArgs::ptr)), and host memory read and written through
/// views. Freed (`cuMemFree`) when the buffer, every graph that refers to it, and every GPU use
/// queued on it are done. Its methods are [`HostBuffer`]'s.
///
/// Taking a view ([`as_slice`](HostBuffer::as_slice), [`as_mut_slice`](HostBuffer::as_mut_slice))
/// waits for the GPU work queued on the buffer so far: stream work that names it and the
/// launches of executable graphs whose nodes name it. While a view lives, such work is refused
/// ([`Error::InUseByHost`]), before anything is queued. Refused on systems without concurrent
/// managed access ([`HostBuffer::zeroed`]; the module's `# Safety`).
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let stream = Stream::new(&device)?;
/// let mut flag = ManagedBuffer::<u32>::zeroed(&device, 1)?;
/// stream.memset_async(&flag, 1u32, 1)?; // GPU work on the flag, as a kernel would be
/// assert_eq!(flag.as_slice()?[0], 1); // waits for the memset
/// flag.as_mut_slice()?[0] = 0; // reset on the host, no copy
/// # Ok(())
/// # }
/// ```
pub type ManagedBuffer<T> = HostBuffer<T, Managed>;

/// A view of a [`ManagedBuffer`]'s values for reading ([`HostBuffer::as_slice`]): a
/// [`HostRef`].
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let flag = ManagedBuffer::<u32>::zeroed(&Device::get(0)?, 1)?;
/// let view: ManagedRef<'_, u32> = flag.as_slice()?;
/// assert_eq!(view[0], 0);
/// # Ok(())
/// # }
/// ```
pub type ManagedRef<'a, T> = HostRef<'a, T>;

/// A view of a [`ManagedBuffer`]'s values for writing ([`HostBuffer::as_mut_slice`]): a
/// [`HostMut`].
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let mut flag = ManagedBuffer::<u32>::zeroed(&Device::get(0)?, 1)?;
/// let mut view: ManagedMut<'_, u32> = flag.as_mut_slice()?;
/// view[0] = 1;
/// # Ok(())
/// # }
/// ```
pub type ManagedMut<'a, T> = HostMut<'a, T>;
