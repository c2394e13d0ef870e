//! [`Handle`] and [`OwnedHandle`]: the driver handle behind a value of the crate, and, where
//! ownership can change hands, giving the handle up and adopting one.

use crate::device::Device;
use crate::error::Result;
use crate::sys;

/// A value that stands for a driver handle, which it owns or keeps alive: the handle is valid
/// while the value lives. Every type here but [`DeviceBuffer`](crate::DeviceBuffer) also has
/// `as_raw` as an inherent method, which needs no import; the trait is for code generic over
/// handles.
///
/// ```no_run
/// use cuda_graph::{Device, Handle, OwnedHandle, Stream};
///
/// /// Hands `value`'s handle to code that destroys it, unless the value cannot give it up now.
/// fn hand_over<H: OwnedHandle>(value: H, to: impl FnOnce(H::Raw)) -> Result<(), H> {
///     to(value.into_raw()?);
///     Ok(())
/// }
///
/// # fn main() -> cuda_graph::Result<()> {
/// let device = Device::get(0)?;
/// let stream = Stream::new(&device)?;
/// println!("{:?} on device {:?}", Handle::as_raw(&stream), Handle::as_raw(&device));
/// hand_over(stream, |raw| {
///     // SAFETY: `raw` was given up by its `Stream`: nothing else destroys it.
///     let _ = unsafe { cuda_graph::sys::cuStreamDestroy(raw) };
/// })
/// .ok();
/// # Ok(()) }
/// ```
///
/// | type | `Raw` | [`OwnedHandle`] |
/// |---|---|---|
/// | [`Stream`](crate::Stream) | `CUstream` | yes |
/// | [`Event`](crate::Event) | `CUevent` | yes: `into_raw` refuses while clones share the event |
/// | [`Graph`](crate::Graph) | `CUgraph` | yes |
/// | [`ExecGraph`](crate::ExecGraph) | `CUgraphExec` | no |
/// | [`Module`](crate::Module) | `CUmodule` | no |
/// | [`Function`](crate::Function) | `CUfunction` | no |
/// | [`MemPool`](crate::MemPool) | `CUmemoryPool` | no |
/// | [`DeviceBuffer`](crate::DeviceBuffer) | `CUdeviceptr` (its [`device_ptr`](crate::DeviceAddress::device_ptr)) | no |
/// | [`Device`] | `CUdevice` | no |
///
/// Why the others are not [`OwnedHandle`]s:
///
/// - [`ExecGraph`](crate::ExecGraph): the value carries what the crate's checks of its launches
///   need (the allocations they leave live, the other graphs' allocations they use or free, and
///   its graph's one instantiation at a time, released on drop); a raw executable graph has
///   none of it, so one cannot be adopted, and one given up would leave the checks behind.
/// - [`Module`](crate::Module) and [`Function`](crate::Function): a function belongs to its
///   module (unloading the module frees it), and the module is shared with every function of
///   it and every graph and executable graph that runs one, which keep it loaded; neither is
///   handed over or adopted.
/// - [`MemPool`](crate::MemPool): not offered yet; nothing stands in the way (the driver defers
///   a pool's destruction while allocations from it are live).
/// - [`DeviceBuffer`](crate::DeviceBuffer): its memory is shared with the graphs whose nodes
///   use it, which free it last, and its length and element type are not in the handle.
/// - [`Device`]: `CUdevice` is the device itself, not something owned; a `Device` owns a
///   reference to the primary context, shared by every handle of the crate on that device
///   (get one with [`Device::get`]).
pub trait Handle {
    /// The driver's handle type.
    type Raw: Copy;

    /// The raw handle, valid while `self` lives. Work queued through it is not seen by the
    /// crate's checks (the crate docs' "Safety model" says what they follow).
    fn as_raw(&self) -> Self::Raw;
}

/// A [`Handle`] whose ownership can be given up and adopted: [`Stream`](crate::Stream),
/// [`Event`](crate::Event), [`Graph`](crate::Graph). Each type's inherent `into_raw` and
/// `from_raw` do the same, with the signature that suits it; these give every one the same
/// signature.
pub trait OwnedHandle: Handle + Sized {
    /// Gives up ownership: the caller destroys the handle. `Err(self)` when the value cannot
    /// give it up now: an [`Event`](crate::Event) while other clones share it (a stream or a
    /// graph always gives it up). See the type's inherent `into_raw` for what it does first.
    ///
    /// # Errors
    /// The value itself, unchanged and still owning its handle, when it cannot give the handle
    /// up now (an `Event` with other clones).
    fn into_raw(self) -> Result<Self::Raw, Self>;

    /// Takes ownership of a raw handle made elsewhere; the value destroys it when dropped. Fails
    /// only for a graph whose nodes cannot be read ([`Graph::from_raw`](crate::Graph::from_raw)).
    ///
    /// # Errors
    /// For a graph, [`Graph::from_raw`](crate::Graph::from_raw)'s: `Error::Driver` naming the
    /// node-reading call that failed; the graph is destroyed then. Streams and events never fail.
    ///
    /// # Safety
    ///
    /// As the type's inherent `from_raw` states: `raw` is a live handle of the kind `Self`
    /// wraps, for `device` (a stream or an event of its primary context), that nothing else
    /// destroys from now on, nor, for a graph, mutates.
    unsafe fn from_raw(raw: Self::Raw, device: &Device) -> Result<Self>;
}

// `Device` is below this module (it names no handle trait): its implementation is here.
impl Handle for Device {
    type Raw = sys::CUdevice;

    fn as_raw(&self) -> sys::CUdevice {
        Device::as_raw(self)
    }
}
