//! The device's graph memory: footprint attributes (G.6), resetting the high-water marks, trim.

use std::fmt;

use crate::bytes::Bytes;
use crate::device::Device;
use crate::error::{Result, driver};
use crate::sys;

/// The four graph-memory attributes of a device (`cuDeviceGetGraphMemAttribute`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct GraphMemInfo {
    /// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`: memory mapped by at least one graph now.
    pub used_current: Bytes,
    /// `CU_GRAPH_MEM_ATTR_USED_MEM_HIGH`: the most ever used since the last reset.
    pub used_high: Bytes,
    /// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`: memory the driver holds for graphs now.
    pub reserved_current: Bytes,
    /// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH`: the most ever reserved since the last reset.
    pub reserved_high: Bytes,
}

impl fmt::Display for GraphMemInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "used {} (high {}), reserved {} (high {})",
            self.used_current, self.used_high, self.reserved_current, self.reserved_high
        )
    }
}

fn attribute(device: &Device, attr: sys::CUgraphMem_attribute) -> Result<Bytes> {
    let mut value: u64 = 0;
    // SAFETY: the four graph-memory attributes are 64-bit values; `value` is a valid out-pointer.
    driver!(unsafe {
        sys::cuDeviceGetGraphMemAttribute(device.as_raw(), attr, (&mut value as *mut u64).cast())
    })?;
    Ok(Bytes(value))
}

impl Device {
    /// The device's graph-memory footprint: used and reserved, current and high-water.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`](crate::Error::Driver) naming
    /// `cuDeviceGetGraphMemAttribute`.
    pub fn graph_mem_info(&self) -> Result<GraphMemInfo> {
        use sys::CUgraphMem_attribute as A;
        self.bind()?;
        Ok(GraphMemInfo {
            used_current: attribute(self, A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            used_high: attribute(self, A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
            reserved_current: attribute(self, A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: attribute(self, A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Resets both high-water marks to the current values (only zero may be set).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`](crate::Error::Driver) naming
    /// `cuDeviceSetGraphMemAttribute`.
    pub fn reset_graph_mem_high_watermarks(&self) -> Result<()> {
        use sys::CUgraphMem_attribute as A;
        self.bind()?;
        for attr in [
            A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: setting a high-water attribute takes a pointer to a 64-bit zero.
            driver!(unsafe {
                sys::cuDeviceSetGraphMemAttribute(
                    self.as_raw(),
                    attr,
                    (&mut zero as *mut u64).cast(),
                )
            })?;
        }
        Ok(())
    }

    /// Returns graph memory that no graph is using to the OS (`cuDeviceGraphMemTrim`). Live
    /// allocations and scheduled or running graphs keep theirs.
    ///
    /// First, unless a capture of this crate forbids it, it runs the releases the crate put off
    /// ([`flush_deferred`](crate::flush_deferred)) and waits for the frees of dropped graph
    /// allocations queued on the device's private stream, so that memory whose last handle is
    /// gone is trimmed too.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`](crate::Error::Driver) naming
    /// `cuStreamSynchronize` (the wait for the private stream's frees) or `cuDeviceGraphMemTrim`.
    pub fn graph_mem_trim(&self) -> Result<()> {
        self.bind()?;
        if crate::deferred::release_allowed() {
            crate::deferred::flush_if_queued();
            self.synchronize_reaper()?;
        }
        // SAFETY: the device is valid.
        driver!(unsafe { sys::cuDeviceGraphMemTrim(self.as_raw()) })
    }
}
