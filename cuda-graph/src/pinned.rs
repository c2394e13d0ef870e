//! Page-locked host memory (`cuMemHostAlloc`), which graphs' memcpy nodes and stream-ordered
//! copies read and write: [`PinnedBuffer`], a [`HostBuffer`] of the kind [`Pinned`].
//!
//! Its memory, its GPU uses and its host views are [`crate::host_memory`]'s, shared with
//! managed memory ([`crate::managed`]): the GPU never touches it after it is freed (graphs keep
//! it, `cuMemFreeHost` waits for every recorded use), and the host never touches it while the
//! GPU may (views wait for the recorded uses and, while alive, make GPU work on it fail with
//! [`Error::InUseByHost`](crate::Error::InUseByHost)).

use std::ffi::c_void;

use crate::device::Device;
use crate::error::{Result, driver};
use crate::host_memory::{Calls, Free, HostBuffer, HostKind, HostMut, HostRef, sealed};
use crate::sys;

/// The kind of [`HostBuffer`] that is page-locked host memory (`cuMemHostAlloc` with
/// `CU_MEMHOSTALLOC_PORTABLE`, freed with `cuMemFreeHost`): [`PinnedBuffer`]. The host side of
/// memcpy nodes and host copies; the GPU reaches it only through them.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let buffer: HostBuffer<u32, Pinned> = PinnedBuffer::zeroed(&Device::get(0)?, 4)?;
/// assert_eq!(buffer.len(), 4);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub enum Pinned {}

impl sealed::Sealed for Pinned {
    const CALLS: Calls = Calls {
        zeroed: "PinnedBuffer::zeroed",
        as_slice: "PinnedBuffer::as_slice",
        as_mut_slice: "PinnedBuffer::as_mut_slice",
        copy_from_slice: "PinnedBuffer::copy_from_slice",
        is_idle: "PinnedBuffer::is_idle",
    };
    const FREE: Free = Free::Host;

    fn allocate(_device: &Device, bytes: usize) -> Result<*mut c_void> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the context is current (the caller's); the flag
        // is one of cuMemHostAlloc's.
        driver!(unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        Ok(ptr)
    }
}

impl HostKind for Pinned {}

/// Page-locked host memory from `cuMemHostAlloc` holding `len` values of `T`: the host side of
/// memcpy nodes ([`Graph::add_memcpy_node_htod`](crate::Graph::add_memcpy_node_htod),
/// [`Graph::add_memcpy_node_dtoh`](crate::Graph::add_memcpy_node_dtoh)), of captured copies
/// ([`Capture::memcpy_htod_async`](crate::Capture::memcpy_htod_async)) and of stream copies
/// ([`StreamMemOps::memcpy_htod_async`](crate::StreamMemOps::memcpy_htod_async)). Freed when
/// the buffer, every graph that refers to it, and every copy queued on it are done. Its methods
/// are [`HostBuffer`]'s.
///
/// The host reads and writes it through views, [`as_slice`](HostBuffer::as_slice) and
/// [`as_mut_slice`](HostBuffer::as_mut_slice): taking one waits for the GPU work queued on the
/// buffer so far, and while one lives the crate refuses to queue more
/// ([`Error::InUseByHost`](crate::Error::InUseByHost)), so the host and the GPU never touch it
/// at the same time. Between the launches of a graph, write the next input and read the last
/// output through views.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let stream = Stream::new(&device)?;
/// let mut input = PinnedBuffer::<u32>::zeroed(&device, 1024)?;
/// let output = PinnedBuffer::<u32>::zeroed(&device, 1024)?;
/// let on_device = DeviceBuffer::<u32>::zeroed(&device, 1024)?;
/// let mut graph = Graph::new(&device)?;
/// let h2d = graph.add_memcpy_node_htod(&[], &on_device, &input, 4096)?;
/// graph.add_memcpy_node_dtoh(&[h2d], &output, &on_device, 4096)?;
/// let exec = graph.instantiate(InstantiateFlags::NONE)?;
/// for step in 0..3u32 {
///     input.as_mut_slice()?.fill(step); // waits for the previous launch
///     exec.launch(&stream)?;
///     assert!(output.as_slice()?.iter().all(|&x| x == step)); // waits for this one
/// }
/// # Ok(())
/// # }
/// ```
pub type PinnedBuffer<T> = HostBuffer<T, Pinned>;

/// A view of a [`PinnedBuffer`]'s values for reading ([`HostBuffer::as_slice`]): a [`HostRef`].
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let buffer = PinnedBuffer::from_slice(&Device::get(0)?, &[7u32])?;
/// let view: PinnedRef<'_, u32> = buffer.as_slice()?;
/// assert_eq!(view[0], 7);
/// # Ok(())
/// # }
/// ```
pub type PinnedRef<'a, T> = HostRef<'a, T>;

/// A view of a [`PinnedBuffer`]'s values for writing ([`HostBuffer::as_mut_slice`]): a
/// [`HostMut`].
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let mut buffer = PinnedBuffer::<u32>::zeroed(&Device::get(0)?, 2)?;
/// let mut view: PinnedMut<'_, u32> = buffer.as_mut_slice()?;
/// view.copy_from_slice(&[1, 2]);
/// # Ok(())
/// # }
/// ```
pub type PinnedMut<'a, T> = HostMut<'a, T>;
