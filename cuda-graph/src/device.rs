//! Devices and their primary contexts.

use std::ffi::CStr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::deferred::{self, DropErrors};
use crate::error::{Error, Result, driver};
use crate::sys;

/// Initialises the driver (`cuInit`) once per process; later calls return the first result.
///
/// # Errors
///
/// [`Error::Driver`] naming `cuInit` when the driver cannot be loaded or initialised; when
/// `libcuda.so.1` or one of its symbols is missing, the error carries the loader's explanation
/// ([`DriverError::load`](crate::DriverError::load)). Every later call returns the same error.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: cuInit takes flags by value; 0 is the only valid value.
        driver!(unsafe { sys::cuInit(0) })?;
        // After cuInit: exit handlers run in reverse order, so this one runs before the
        // driver's own teardown.
        deferred::stop_releases_at_exit();
        Ok(())
    })
    .clone()
}

/// The number of CUDA devices (`cuDeviceGetCount`), after [`init`].
///
/// # Errors
///
/// [`init`]'s errors; [`Error::Driver`] naming `cuDeviceGetCount`.
pub fn device_count() -> Result<usize> {
    init()?;
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    driver!(unsafe { sys::cuDeviceGetCount(&mut count) })?;
    Ok(count as usize)
}

/// The newest CUDA version the installed driver supports (`cuDriverGetVersion`), written as
/// CUDA writes versions: 1000 × major + 10 × minor (13000 is 13.0, 12090 is 12.9). Needs no
/// [`init`]; fails with the loader's error when there is no driver.
///
/// # Errors
///
/// [`Error::Driver`] naming `cuDriverGetVersion`, with the loader's explanation when the driver
/// cannot be loaded.
///
/// ```no_run
/// let v = cuda_graph::driver_version()?;
/// println!("driver supports CUDA {}.{}", v / 1000, v % 1000 / 10);
/// assert!(v >= cuda_graph::HEADERS_VERSION, "the driver is older than the headers");
/// # Ok::<(), cuda_graph::Error>(())
/// ```
pub fn driver_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    driver!(unsafe { sys::cuDriverGetVersion(&mut version) })?;
    Ok(version)
}

/// The version of the CUDA headers this crate was built against (`CUDA_VERSION` of `cuda.h`),
/// in the form of [`driver_version`]. With an older driver, a call whose entry point the driver
/// does not export fails with `CUDA_ERROR_NOT_FOUND` and the loader's error naming the symbol.
pub const HEADERS_VERSION: i32 = sys::CUDA_VERSION as i32;

/// A device with its primary context retained: the context the runtime API uses too, so handles
/// made here and by runtime-API code on the same device interoperate.
///
/// Cheap to clone (one reference count). Every handle of this crate keeps its `Device`, so the
/// context outlives them all. Every `Device::get` of one ordinal returns the same device while
/// any handle of it lives: its reaper stream and its record of drop errors are the device's, not
/// a handle's.
#[derive(Clone, Debug)]
pub struct Device {
    inner: Arc<PrimaryContext>,
}

#[derive(Debug)]
struct PrimaryContext {
    ordinal: usize,
    device: sys::CUdevice,
    context: sys::CUcontext,
    /// A private stream on which RAII frees of escaped graph allocations are queued.
    reaper: OnceLock<Result<sys::CUstream>>,
    /// `cuDeviceTotalMem`, once asked.
    total_memory: OnceLock<usize>,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: a CUcontext and a CUdevice are process-wide handles that the driver lets any thread use;
// the reaper stream is created once (OnceLock) and then only read.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; no method mutates the handles.
unsafe impl Sync for PrimaryContext {}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        if let Some(Ok(stream)) = self.reaper.get() {
            // In this context, which may not be current where the last handle drops.
            let mut current = std::ptr::null_mut();
            // SAFETY: `current` is a valid out-pointer.
            let bound = match driver!(unsafe { sys::cuCtxGetCurrent(&mut current) }) {
                Ok(()) if current != self.context => {
                    // SAFETY: the context is retained until the release below.
                    driver!(unsafe { sys::cuCtxSetCurrent(self.context) })
                }
                other => other,
            };
            record(self.ordinal, bound);
            // SAFETY: the reaper stream was created in this context and is destroyed once, here;
            // the driver finishes the frees queued on it first.
            let destroyed = driver!(unsafe { sys::cuStreamDestroy(*stream) });
            record(self.ordinal, destroyed);
        }
        // SAFETY: retained in `Device::get`; released exactly once.
        let released = driver!(unsafe { sys::cuDevicePrimaryCtxRelease(self.device) });
        record(self.ordinal, released);
    }
}

/// Records a failed release of device `ordinal` (a [`driver!`] call's error) in its drop-error
/// record.
pub(crate) fn record(ordinal: usize, released: Result<()>) {
    if let Err(e) = released {
        deferred::record_drop_error(ordinal, e);
    }
}

/// The live devices by ordinal: `Device::get` hands out the one that exists.
static DEVICES: Mutex<Vec<Weak<PrimaryContext>>> = Mutex::new(Vec::new());

impl Device {
    /// The device with this ordinal, its primary context retained.
    ///
    /// # Errors
    ///
    /// While the device is not open yet: [`init`]'s and [`device_count`]'s errors;
    /// [`Error::InvalidArgument`] naming `Device::get` when `ordinal` is not below the device
    /// count; [`Error::Driver`] naming `cuDeviceGet` or `cuDevicePrimaryCtxRetain`.
    pub fn get(ordinal: usize) -> Result<Device> {
        let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = devices.get(ordinal).and_then(Weak::upgrade) {
            return Ok(Device { inner });
        }
        let device = Device::open(ordinal)?;
        if devices.len() <= ordinal {
            devices.resize(ordinal + 1, Weak::new());
        }
        devices[ordinal] = Arc::downgrade(&device.inner);
        Ok(device)
    }

    fn open(ordinal: usize) -> Result<Device> {
        init()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::invalid(
                "Device::get",
                format!("device ordinal {ordinal} does not exist ({count} device(s))"),
            ));
        }
        let mut device = 0;
        // SAFETY: `device` is a valid out-pointer; the ordinal was checked above.
        driver!(unsafe { sys::cuDeviceGet(&mut device, ordinal as i32) })?;
        let mut context = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer; `device` came from cuDeviceGet.
        driver!(unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) })?;
        Ok(Device {
            inner: Arc::new(PrimaryContext {
                ordinal,
                device,
                context,
                reaper: OnceLock::new(),
                total_memory: OnceLock::new(),
                _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::Context),
            }),
        })
    }

    /// The device whose primary context `context` is: adopts a context handle made elsewhere
    /// (the CUDA runtime API and crates such as cudarc work in primary contexts), and returns the
    /// same value as [`Device::get`] of that device's ordinal. The crate works in primary
    /// contexts only: any other context is refused.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Device::from_raw` when `context` is not the primary
    /// context of a device (a context made with `cuCtxCreate`); [`Error::Driver`] naming
    /// `cuCtxGetCurrent`, `cuCtxSetCurrent` or `cuCtxGetDevice` (the context is made current to
    /// ask for its device, and the previous one made current again), or [`Device::get`]'s.
    ///
    /// # Safety
    ///
    /// `context` is a live context handle (not destroyed, and not a primary context released
    /// by everyone who retained it).
    pub unsafe fn from_raw(context: sys::CUcontext) -> Result<Device> {
        const CALL: &str = "Device::from_raw";
        init()?;
        let mut previous = std::ptr::null_mut();
        // SAFETY: `previous` is a valid out-pointer.
        driver!(unsafe { sys::cuCtxGetCurrent(&mut previous) })?;
        // SAFETY: the caller vouches that `context` is live.
        driver!(unsafe { sys::cuCtxSetCurrent(context) })?;
        let mut handle = 0;
        // SAFETY: `handle` is a valid out-pointer; `context` is current.
        let asked = driver!(unsafe { sys::cuCtxGetDevice(&mut handle) });
        // SAFETY: `previous` was current on this thread a moment ago (or null: none).
        let restored = driver!(unsafe { sys::cuCtxSetCurrent(previous) });
        asked?;
        restored?;
        let mut ordinal = None;
        for i in 0..device_count()? {
            let mut candidate = 0;
            // SAFETY: `candidate` is a valid out-pointer; `i` is below the device count.
            driver!(unsafe { sys::cuDeviceGet(&mut candidate, i as i32) })?;
            if candidate == handle {
                ordinal = Some(i);
                break;
            }
        }
        let Some(ordinal) = ordinal else {
            return Err(Error::invalid(
                CALL,
                format!("the context's device {handle} is none of the devices"),
            ));
        };
        let device = Device::get(ordinal)?;
        if device.inner.context != context {
            return Err(Error::invalid(
                CALL,
                format!(
                    "the context is not device {ordinal}'s primary context; the crate works in primary contexts only"
                ),
            ));
        }
        Ok(device)
    }

    /// The device's ordinal.
    #[must_use]
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The driver's device handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUdevice {
        self.inner.device
    }

    /// The primary context's handle.
    #[must_use]
    pub fn context_raw(&self) -> sys::CUcontext {
        self.inner.context
    }

    /// Makes the primary context current on the calling thread, unless it already is. Refused
    /// inside a host node's function, which runs on a driver thread where CUDA must not be
    /// called.
    ///
    /// # Errors
    ///
    /// [`Error::InHostFunction`] naming `Device::bind` when called from a host node's function;
    /// [`Error::Driver`] naming `cuCtxGetCurrent` or `cuCtxSetCurrent`.
    #[inline]
    pub fn bind(&self) -> Result<()> {
        if deferred::in_host_function() {
            return Err(Error::InHostFunction {
                call: "Device::bind",
            });
        }
        let mut current = std::ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        driver!(unsafe { sys::cuCtxGetCurrent(&mut current) })?;
        if current != self.inner.context {
            // SAFETY: the context is retained for as long as `self` lives.
            driver!(unsafe { sys::cuCtxSetCurrent(self.inner.context) })?;
        }
        Ok(())
    }

    /// Runs `job`, a release of something of this device (a drop's driver calls), now or
    /// later ([`deferred`]), with this device's context made current first and the device
    /// handed to it: a drop may run where no context is current (on a new thread, on the
    /// crate's release thread), and there a driver call may crash the process
    /// (`add_kernel_node` did). Where the context cannot be made current the job does not run:
    /// it stays queued, and is tried again at the next flush (the error is recorded once per
    /// job). What it releases is kept meanwhile, never let go of without its driver calls.
    pub(crate) fn release(&self, mut job: impl FnMut(&Device) -> bool + Send + 'static) {
        let (device, mut reported) = (self.clone(), false);
        deferred::release(self.ordinal(), move || {
            device.run_bound(&mut job, &mut reported)
        });
    }

    /// [`release`](Device::release) through [`deferred::release_after`].
    pub(crate) fn release_after(&self, mut job: impl FnMut(&Device) -> bool + Send + 'static) {
        let (device, mut reported) = (self.clone(), false);
        deferred::release_after(self.ordinal(), move || {
            device.run_bound(&mut job, &mut reported)
        });
    }

    /// [`release`](Device::release) through [`deferred::enqueue`]: queued without being tried.
    pub(crate) fn enqueue_release(&self, mut job: impl FnMut(&Device) -> bool + Send + 'static) {
        let (device, mut reported) = (self.clone(), false);
        deferred::enqueue(
            self.ordinal(),
            Box::new(move || device.run_bound(&mut job, &mut reported)),
        );
    }

    /// Runs `job` with the context current; `false` (not done) without running it where the
    /// context cannot be made current, the error recorded unless `reported` says it was.
    fn run_bound(&self, job: &mut impl FnMut(&Device) -> bool, reported: &mut bool) -> bool {
        if let Err(e) = self.bind() {
            if !std::mem::replace(reported, true) {
                self.record_drop_error(e);
            }
            return false;
        }
        job(self)
    }

    /// The device's name (`cuDeviceGetName`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuDeviceGetName`.
    pub fn name(&self) -> Result<String> {
        let mut buffer = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer holds `len` bytes.
        driver!(unsafe {
            sys::cuDeviceGetName(buffer.as_mut_ptr(), buffer.len() as i32, self.as_raw())
        })?;
        // SAFETY: the driver wrote a NUL-terminated string into the buffer.
        Ok(unsafe { CStr::from_ptr(buffer.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Total memory of the device in bytes (`cuDeviceTotalMem`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuDeviceTotalMem`.
    pub fn total_memory(&self) -> Result<usize> {
        let mut bytes = 0;
        // SAFETY: `bytes` is a valid out-pointer.
        driver!(unsafe { sys::cuDeviceTotalMem(&mut bytes, self.as_raw()) })?;
        Ok(bytes)
    }

    /// A device attribute (`cuDeviceGetAttribute`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuDeviceGetAttribute` (an attribute the driver does not know,
    /// for one).
    pub fn attribute(&self, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let mut value = 0;
        // SAFETY: `value` is a valid out-pointer; an unknown attribute is an error code.
        driver!(unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, self.as_raw()) })?;
        Ok(value)
    }

    /// Whether the device supports stream-ordered allocation and memory pools, which graph
    /// memory nodes need.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuDeviceGetAttribute`.
    pub fn supports_memory_pools(&self) -> Result<bool> {
        Ok(
            self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?
                != 0,
        )
    }

    /// The compute capability, as (major, minor).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuDeviceGetAttribute`.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// Whether this device can map memory resident on `peer` (`cuDeviceCanAccessPeer`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuDeviceCanAccessPeer`.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        let mut can = 0;
        // SAFETY: `can` is a valid out-pointer; both devices are valid.
        driver!(unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.as_raw(), peer.as_raw()) })?;
        Ok(can != 0)
    }

    /// Waits for all work in the primary context (`cuCtxSynchronize`), then runs the releases
    /// the crate put off ([`flush_deferred`](crate::flush_deferred)) and waits again for the
    /// frees they queue: what dropped executable graphs held is then released.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuCtxSynchronize`, which also reports
    /// an earlier asynchronous failure of work in the context (a kernel's fault, for one).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current.
        driver!(unsafe { sys::cuCtxSynchronize() })?;
        if deferred::queued() != 0 {
            // Releases that waited for the work just finished run now; the frees they queue
            // are waited for too, so that the memory is free when this returns.
            deferred::flush_deferred();
            // SAFETY: as above.
            driver!(unsafe { sys::cuCtxSynchronize() })?;
        }
        Ok(())
    }

    /// The driver errors met in `Drop` of this device's objects (frees, destroys, unloads that
    /// failed), and the error of a capture ended because its stream was dropped. `Drop` cannot
    /// return errors; they are counted here instead of being discarded.
    #[must_use]
    pub fn drop_errors(&self) -> DropErrors {
        deferred::drop_errors(self.inner.ordinal, false)
    }

    /// As [`drop_errors`](Device::drop_errors), and clears the record.
    #[allow(
        clippy::must_use_candidate,
        reason = "clearing the record without reading it is a use"
    )]
    pub fn take_drop_errors(&self) -> DropErrors {
        deferred::drop_errors(self.inner.ordinal, true)
    }

    /// Records an error met in `Drop`.
    pub(crate) fn record_drop_error(&self, error: Error) {
        deferred::record_drop_error(self.inner.ordinal, error);
    }

    /// Records a failed release call met in `Drop`: `device.record(driver!(unsafe { .. }))`.
    pub(crate) fn record(&self, released: Result<()>) {
        record(self.inner.ordinal, released);
    }

    /// Whether two handles name the same device.
    #[must_use]
    pub fn same(&self, other: &Device) -> bool {
        self.inner.device == other.inner.device
    }

    /// Waits for the frees queued on the private stream, if it exists
    /// (`cuStreamSynchronize`).
    pub(crate) fn synchronize_reaper(&self) -> Result<()> {
        match self.inner.reaper.get() {
            // SAFETY: the reaper stream lives as long as the device.
            Some(Ok(stream)) => driver!(unsafe { sys::cuStreamSynchronize(*stream) }),
            _ => Ok(()),
        }
    }

    /// The private, non-blocking stream that orders RAII frees of escaped graph allocations.
    pub(crate) fn reaper_stream(&self) -> Result<sys::CUstream> {
        self.inner
            .reaper
            .get_or_init(|| {
                self.bind()?;
                let mut stream = std::ptr::null_mut();
                // SAFETY: `stream` is a valid out-pointer; the context is current.
                driver!(unsafe {
                    sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0)
                })?;
                Ok(stream)
            })
            .clone()
    }

    /// The device's memory in bytes, read once.
    #[inline]
    pub(crate) fn memory_bytes(&self) -> Result<usize> {
        match self.inner.total_memory.get() {
            Some(&bytes) => Ok(bytes),
            None => self.read_memory_bytes(),
        }
    }

    /// [`memory_bytes`](Device::memory_bytes) the first time.
    #[cold]
    fn read_memory_bytes(&self) -> Result<usize> {
        let bytes = self.total_memory()?;
        Ok(*self.inner.total_memory.get_or_init(|| bytes))
    }
}
