//! Memory pools for stream-ordered allocation, with peer access (G.7.2).

use crate::alloc::{Access, device_location};
use crate::device::Device;
use crate::error::{Result, driver};
use crate::handle::Handle;
use crate::sys;

/// `CU_MEM_ALLOCATION_TYPE_MANAGED`, by value: the 13.0 headers name it, older ones do not,
/// and the driver, not the headers, decides whether pools of managed memory exist (drivers of
/// CUDA 13.0 and newer make them; older ones refuse the call).
const MANAGED: sys::CUmemAllocationType = sys::CUmemAllocationType(2);

/// An explicit memory pool (`cuMemPoolCreate`) of pinned device memory ([`MemPool::new`]) or
/// of managed memory ([`MemPool::new_managed`]), destroyed on drop. A capture that allocates
/// from it records the pool's peer access at that moment.
#[derive(Debug)]
pub struct MemPool {
    raw: sys::CUmemoryPool,
    device: Device,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: a pool handle may be used from any thread; the driver synchronizes access.
unsafe impl Send for MemPool {}
// SAFETY: as above; `&self` methods are thread-safe driver calls.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// A pool of memory resident on `device`.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`](crate::Error::Driver) naming `cuMemPoolCreate`.
    pub fn new(device: &Device) -> Result<MemPool> {
        MemPool::create(
            device,
            sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        )
    }

    /// A pool of managed memory located on `device` (`allocType` managed): its allocations,
    /// stream-ordered ([`StreamAllocation::from_pool`](crate::StreamAllocation::from_pool)) or captured
    /// ([`Capture::malloc_from_pool_async`](crate::Capture::malloc_from_pool_async)), are
    /// managed memory, reached by the crate through their addresses only, as the pinned ones.
    ///
    /// # Errors
    ///
    /// As [`new`](MemPool::new)'s; drivers before CUDA 13.0 refuse the pool
    /// ([`Error::Driver`](crate::Error::Driver) naming `cuMemPoolCreate`).
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let stream = Stream::new(&device)?;
    /// let pool = MemPool::new_managed(&device)?;
    /// // A temporary of the graph, from the managed pool: allocated, filled, freed in the capture.
    /// let (graph, ()) = capture(&stream, CaptureMode::Global, |cap| {
    ///     let scratch = cap.malloc_from_pool_async(&pool, 1 << 20)?;
    ///     cap.memset_async(&scratch, 0u32, 1 << 18)?;
    ///     cap.free_async(&scratch)
    /// })?;
    /// graph.instantiate(InstantiateFlags::NONE)?.launch(&stream)?;
    /// stream.synchronize()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new_managed(device: &Device) -> Result<MemPool> {
        MemPool::create(device, MANAGED)
    }

    fn create(device: &Device, kind: sys::CUmemAllocationType) -> Result<MemPool> {
        device.bind()?;
        let props = sys::CUmemPoolProps {
            allocType: kind,
            location: device_location(device),
            ..Default::default()
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer valid; props describe memory of `device` of a type the driver
        // checks.
        driver!(unsafe { sys::cuMemPoolCreate(&mut raw, &props) })?;
        Ok(MemPool {
            raw,
            device: device.clone(),
            _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::MemPool),
        })
    }

    /// Grants `peer` access to the pool's memory (`cuMemPoolSetAccess`).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`](crate::Error::Driver) naming
    /// `cuMemPoolSetAccess` (a peer that cannot access the resident device, for one).
    pub fn set_access(&self, peer: &Device, access: Access) -> Result<()> {
        self.device.bind()?;
        let desc = sys::CUmemAccessDesc {
            location: device_location(peer),
            flags: access.raw(),
        };
        // SAFETY: one valid descriptor.
        driver!(unsafe { sys::cuMemPoolSetAccess(self.raw, &desc, 1) })
    }

    /// The access `peer` has (`cuMemPoolGetAccess`): `None` when it has none.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`](crate::Error::Driver) naming
    /// `cuMemPoolGetAccess`.
    pub fn access(&self, peer: &Device) -> Result<Option<Access>> {
        self.device.bind()?;
        let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        let mut location = device_location(peer);
        // SAFETY: out-pointer valid; the location names a device.
        driver!(unsafe { sys::cuMemPoolGetAccess(&mut flags, self.raw, &mut location) })?;
        Ok(match flags {
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ => Some(Access::Read),
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE => Some(Access::ReadWrite),
            _ => None,
        })
    }

    /// The resident device.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUmemoryPool {
        self.raw
    }
}

impl Handle for MemPool {
    type Raw = sys::CUmemoryPool;

    fn as_raw(&self) -> sys::CUmemoryPool {
        MemPool::as_raw(self)
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        let raw = self.raw as usize;
        self.device.release(move |device| {
            // SAFETY: owned and destroyed once; the driver defers it while allocations are
            // live.
            let destroyed = driver!(unsafe { sys::cuMemPoolDestroy(raw as sys::CUmemoryPool) });
            device.record(destroyed);
            true
        });
    }
}
