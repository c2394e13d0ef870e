//! cudarc 0.19 with this crate's graphs (the `cudarc` feature, off by default): cudarc's context
//! and streams adopted as [`Device`] and [`BorrowedStream`] without casts, its device memory kept
//! by graphs as [`CudarcSlice`], and cudarc's errors as this crate's. The user-facing account of
//! what is ordered and what each side sees is [`CudarcSlice`]'s docs (this module is private; its
//! items are re-exported at the crate root).
//!
//! Below `memory`: the `DeviceAddress` impl of `CudarcSlice` is there, beside the trait, and
//! `memory::Owner::Cudarc` holds this module's `CudarcMemory`.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use ::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use bytemuck::Pod;

use crate::deferred;
use crate::device::Device;
use crate::error::{DriverError, Error, Result, driver};
use crate::keep::Keep;
use crate::stream::{AsStream, BorrowedStream, CaptureStatus, capture_id, raw_capture_status};
use crate::sys;
use crate::uses::StreamUses;

impl Device {
    /// The device of a cudarc context: adopts its handle through [`Device::from_raw`], without a
    /// cast, and returns the same value as [`Device::get`] of its ordinal. Safe, because the
    /// borrow keeps the context alive for the call (cudarc holds it until the last `Arc` of the
    /// [`CudaContext`] drops), and the returned device retains the primary context itself.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Device::from_cudarc` when the context is not a primary
    /// context (`CudaContext::new_non_primary`, `new_cig`, `from_raw_context`: contexts cudarc
    /// destroys on drop; the crate works in primary contexts only); [`Device::from_raw`]'s
    /// errors.
    pub fn from_cudarc(context: &CudaContext) -> Result<Device> {
        if !context.is_primary() {
            return Err(Error::invalid(
                "Device::from_cudarc",
                "the context is not a primary context (cudarc made it with new_non_primary, new_cig or from_raw_context); the crate works in primary contexts only",
            ));
        }
        // SAFETY: the handle is live: cudarc retained it (cuDevicePrimaryCtxRetain) and releases
        // it only when the CudaContext drops, which the borrow rules out during the call.
        unsafe { Device::from_raw(context.cu_ctx().cast()) }
    }
}

impl BorrowedStream<'_> {
    /// Borrows a cudarc stream, for as long as the [`CudaStream`] is borrowed, without a cast.
    /// `BorrowedStream::from_raw`'s contract, part by part:
    ///
    /// - the stream belongs to `device`'s primary context: checked here;
    /// - it stays live for `'a`: the borrow. cudarc destroys a stream it made only in the
    ///   `CudaStream`'s `Drop`; its default and per-thread streams are never destroyed; a stream
    ///   it wraps with its `unsafe` `wrap_borrowed_stream` is live while the wrapper is, by that
    ///   function's contract;
    /// - the two parts the `# Safety` section keeps, which cudarc cannot promise.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `BorrowedStream::from_cudarc` when the stream belongs to
    /// another context than `device`'s primary context.
    ///
    /// # Safety
    ///
    /// While the crate queues work on the stream, no capture begun outside this crate records
    /// it: in particular not one begun with cudarc's `CudaStream::begin_capture`, a safe function
    /// of cudarc's, which the crate cannot see (work it queued there would become a node of a
    /// graph that keeps nothing alive). And if a [`StreamAllocation`](crate::StreamAllocation) on
    /// the stream is dropped while the stream captures, the `CudaStream` is not dropped (an owned
    /// cudarc stream is destroyed at its drop) until the free the crate then queues on it has run,
    /// after the capture ends ([`flush_deferred`](crate::flush_deferred),
    /// [`Device::synchronize`]).
    pub unsafe fn from_cudarc<'a>(
        stream: &'a CudaStream,
        device: &Device,
    ) -> Result<BorrowedStream<'a>> {
        if stream.context().cu_ctx().cast::<sys::CUctx_st>() != device.context_raw() {
            return Err(Error::invalid(
                "BorrowedStream::from_cudarc",
                format!(
                    "the stream belongs to another context than device {}'s primary context",
                    device.ordinal()
                ),
            ));
        }
        // SAFETY: the stream is of `device`'s primary context (checked) and live for 'a (the
        // borrow, above); the caller upholds the rest of the contract (this function's).
        Ok(unsafe { BorrowedStream::from_raw(stream.cu_stream().cast(), device) })
    }
}

/// A driver error cudarc returned, as this crate's [`Error::Driver`] (its call named
/// `"a cudarc call"`, as cudarc's error does not say which call failed).
impl From<::cudarc::driver::DriverError> for Error {
    fn from(e: ::cudarc::driver::DriverError) -> Error {
        Error::Driver(DriverError {
            call: "a cudarc call",
            code: sys::CUresult(e.0 as u32),
            load: None,
        })
    }
}

/// An error, and the value the call was given, handed back: a [`CudaSlice`] that
/// [`CudarcSlice::new`] did not take, a [`CudarcSlice`] that [`CudarcSlice::into_inner`] could
/// not give up. Converts into [`Error`] (dropping the value) for `?`.
pub struct Refused<V> {
    /// Why.
    pub error: Error,
    /// The value, unchanged.
    pub value: V,
}

impl<V> fmt::Debug for Refused<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .field("value", &std::any::type_name::<V>())
            .finish()
    }
}

impl<V> fmt::Display for Refused<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

/// No `source()`: the `Display` is the error's, complete (as [`Error`]'s is).
impl<V> std::error::Error for Refused<V> {}

impl<V> From<Refused<V>> for Error {
    fn from(refused: Refused<V>) -> Error {
        refused.error
    }
}

/// The memory of a [`CudarcSlice`], shared with the graphs, executable graphs and argument lists
/// that refer to it: the cudarc slice, and the uses the crate queued on it per stream.
///
/// Dropped by its last holder: the slice's stream waits for every recorded use, then the
/// `CudaSlice` is dropped (cudarc frees it on that stream); put off while the stream captures.
#[derive(Debug)]
pub struct CudarcMemory {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    device: Device,
    /// The slice's stream, on which cudarc frees it: held here too, so that the stream outlives
    /// the free queued on it.
    stream: Arc<CudaStream>,
    uses: Mutex<StreamUses>,
    /// The `CudaSlice<T>`, its type erased (its [`CudarcSlice<T>`] knows it); `None` once
    /// [`CudarcSlice::into_inner`] took it back.
    slice: Option<Box<dyn Any + Send + Sync>>,
}

impl CudarcMemory {
    /// The slice's stream, as the crate's raw handle.
    fn raw_stream(&self) -> sys::CUstream {
        self.stream.cu_stream().cast()
    }

    /// Stream work using it was queued on `stream` (as [`StreamMemory`]'s).
    ///
    /// [`StreamMemory`]: crate::stream_alloc::StreamMemory
    pub(crate) fn note_stream_use(&self, stream: &impl AsStream) -> Result<()> {
        crate::uses::note_stream_use(&self.uses, &self.device, stream)
    }

    /// Work that `queued_by` queued on it can neither be marked nor waited for: it is never
    /// freed, nor handed back ([`Error::InDoubt`]).
    pub(crate) fn doubt(&self, queued_by: &'static str) {
        crate::uses::doubt(&self.uses, queued_by);
    }
}

impl Drop for CudarcMemory {
    fn drop(&mut self) {
        let Some(slice) = self.slice.take() else {
            return; // handed back to cudarc by `into_inner`
        };
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        let device = self.device.clone();
        let mut held = Some((slice, self.stream.clone()));
        deferred::release(self.device.ordinal(), move || {
            let Some((slice, stream)) = held.take() else {
                return true;
            };
            let raw: sys::CUstream = stream.cu_stream().cast();
            if let Err(e) = device.bind() {
                // Nothing can be ordered: the slice is kept for the rest of the process.
                device.record_drop_error(e);
                std::mem::forget((slice, stream));
                return true;
            }
            if !matches!(raw_capture_status(raw), Ok(CaptureStatus::None)) {
                // cudarc's free on a capturing stream would be captured: after the capture.
                held = Some((slice, stream));
                return false;
            }
            if let Err(e) = uses.wait_on(raw, None) {
                // The free cannot be ordered after every use (one is in doubt, or a wait
                // failed): the slice is kept for the rest of the process.
                device.record_drop_error(e);
                std::mem::forget((slice, stream));
                return true;
            }
            // cudarc's Drop: waits for cudarc's own events, then frees on the slice's stream,
            // which now waits for every use the crate recorded.
            drop(slice);
            drop(stream);
            true
        });
    }
}

/// A cudarc [`CudaSlice`] in the crate's keeping: a node operand and kernel argument
/// ([`DeviceAddress`](crate::DeviceAddress)) that every graph, executable graph and argument list
/// referring to it keeps alive, and whose free, by cudarc on the slice's stream, waits for every
/// use the crate queued (below: what each side sees).
///
/// `T` is plain old data ([`bytemuck::Pod`]), as for [`DeviceBuffer`](crate::DeviceBuffer): the
/// crate's nodes write any bytes (a memset, a kernel), and cudarc reads them back as `T`.
///
/// Dropping the handle is safe at any time: the memory stays allocated while a graph, executable
/// graph or argument list that refers to it exists, and after the last executable graph until its
/// last launch is done; then cudarc frees it, after the crate's recorded uses.
///
/// The rest of the `cudarc` feature: [`Device::from_cudarc`] adopts cudarc's context, and
/// [`BorrowedStream::from_cudarc`] (`unsafe`) its streams, for this crate's captures, launches
/// and stream work; cudarc's `DriverError` converts into [`Error`], so that `?` works on cudarc
/// calls in closures that return this crate's [`Result`] (a [`capture`](crate::capture) of cudarc
/// work).
///
/// # What is ordered, and what each side does not see
///
/// The crate records every use it queues on a [`CudarcSlice`] outside a capture, per stream (the
/// driver's stream id), as it does for a [`StreamAllocation`](crate::StreamAllocation): kernels
/// launched with the slice passed by [`KernelArgs::ptr`](crate::KernelArgs::ptr), memsets and
/// copies of [`StreamMemOps`](crate::StreamMemOps). Graphs, executable graphs and argument lists
/// that refer to the slice hold it; an executable graph lets go once its last launch is done.
/// When the last holder lets go, the slice's own stream first waits for every recorded use, then
/// cudarc's `Drop` frees the slice on that stream (after waiting for cudarc's own events); while
/// that stream captures, or a capture of this crate forbids releases, this is put off until the
/// capture ends.
///
/// cudarc orders a slice across its streams with two events of the slice (read and write),
/// recorded by cudarc's own operations when its context manages stream synchronization (streams
/// made with `CudaContext::new_stream`, event tracking on). **cudarc does not see the work this
/// crate queues on the slice**: kernels, memsets and copies on any stream, graph launches. Its
/// events do not cover that work, so cudarc orders none of its own later work after it; and its
/// `Drop` would not wait for it (the crate's drop does, above). Where the slice goes back to
/// cudarc, the crate orders cudarc after its own work:
///
/// - [`CudarcSlice::into_inner`] makes the slice's stream wait for every recorded use and then
///   records cudarc's write event on that stream: cudarc work on the slice on any of its streams,
///   which waits for that event, follows the crate's (when cudarc does not track the slice, its
///   work on the slice's own stream follows the crate's, and its work on other streams is ordered
///   by the caller, as cudarc requires then).
/// - [`CudarcSlice::as_cudarc`], read-only access while the crate holds the slice, makes the
///   slice's stream wait for the uses recorded so far, and records no cudarc event: cudarc reads
///   on the slice's own stream follow them; cudarc reads on another stream do not, nor does any
///   cudarc read follow a graph launch on another stream (graph launches are not recorded uses:
///   graphs keep the slice instead) or a use queued after the call.
///
/// **The crate does not see cudarc's work** on the slice after [`CudarcSlice::new`] (which waits
/// on the host for cudarc's work on the slice so far, so that work the crate queues on any stream
/// finds it allocated and written): reads through [`CudarcSlice::as_cudarc`], and kernels cudarc
/// launches with the slice (an `unsafe` launch of cudarc's), are not waited for by the crate's
/// later work on other streams. cudarc work captured into a capture of this crate is a node of the
/// captured graph like any other, but the graph keeps nothing it refers to, with one exception:
/// a slice whose [`as_cudarc`](CudarcSlice::as_cudarc) is called while its own stream captures
/// into a capture of this crate is kept by that capture's graph (and `as_cudarc` is refused while
/// the stream captures into a capture other code began, such as cudarc's `begin_capture`).
///
/// # Capturing cudarc work
///
/// When cudarc manages stream synchronization (event tracking on, and a stream made with
/// `CudaContext::new_stream`, which a capture needs), a cudarc operation waits for events the
/// slices' earlier operations recorded outside the capture: stream capture does not allow an
/// event wait across its boundary, and the capture is invalidated. Capture cudarc work on slices
/// allocated after `CudaContext::disable_event_tracking` (`unsafe`: then the caller orders
/// cudarc's streams), as cudarc's own capture tests do. The capture stream must not be cudarc's
/// default stream (the legacy stream cannot capture): use one made with `new_stream`.
///
/// cudarc panics when `libcuda` or one of its symbols is missing (its dynamic loading): open the
/// device through this crate first ([`Device::get`] fails with an error instead), then cudarc.
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// use cuda_graph::{AsStream, BorrowedStream, CudarcSlice, Device, Graph, InstantiateFlags};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let device = Device::get(0)?; // an error, not a panic, without a driver
/// let ctx = CudaContext::new(0)?;
/// let cudarc_stream = ctx.new_stream()?;
/// assert_eq!(Device::from_cudarc(&ctx)?.ordinal(), device.ordinal());
///
/// // cudarc memory, moved into the crate's keeping.
/// let data = CudarcSlice::new(cudarc_stream.clone_htod(&[1u32; 1024])?)?;
/// let mut graph = Graph::new(&device)?;
/// graph.add_memset_node(&[], &data, 7, 1024)?;
/// let exec = graph.instantiate(InstantiateFlags::NONE)?;
/// drop((graph, data)); // the executable graph keeps the slice
///
/// // SAFETY: no capture begun outside this crate records cudarc_stream while the crate uses it,
/// // and no StreamAllocation is made on it.
/// let stream = unsafe { BorrowedStream::from_cudarc(&cudarc_stream, &device)? };
/// exec.launch(&stream)?;
/// stream.synchronize()?;
/// # Ok(()) }
/// ```
pub struct CudarcSlice<T: Pod> {
    memory: Arc<CudarcMemory>,
    len: usize,
    _type: PhantomData<T>,
}

impl<T: Pod> fmt::Debug for CudarcSlice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudarcSlice")
            .field("ptr", &format_args!("{:#x}", self.memory.ptr))
            .field("len", &self.len)
            .field("type", &std::any::type_name::<T>())
            .field("device", &self.memory.device.ordinal())
            .finish()
    }
}

impl<T: Pod> CudarcSlice<T> {
    /// Takes `slice` into the crate's keeping. Waits on the host for the work cudarc queued on it
    /// so far: its stream first waits for cudarc's events of the slice (its uses on other cudarc
    /// streams), then is synchronized (`cuStreamSynchronize`). So work the crate queues on any
    /// stream, graph launches included, finds the slice allocated and written.
    ///
    /// A view (`CudaView`) cannot be taken: only whole slices, which own their memory.
    ///
    /// # Errors
    ///
    /// With `slice` handed back in [`Refused`]: [`Error::InvalidArgument`] naming
    /// `CudarcSlice::new` when the slice is empty, or its stream is the per-thread default stream
    /// (cudarc frees a slice on the per-thread stream of whichever thread drops it, which is not
    /// the stream its uses were ordered on); [`Error::Capturing`] naming `CudarcSlice::new` when
    /// its stream is capturing (wrap the slice before the capture); [`Device::from_cudarc`]'s and
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamIsCapturing` or
    /// `cuStreamSynchronize` (which also reports an earlier failure of work on the stream).
    #[allow(
        clippy::result_large_err,
        reason = "the slice handed back on error is the point; the error path is rare"
    )]
    pub fn new(mut slice: CudaSlice<T>) -> Result<CudarcSlice<T>, Refused<CudaSlice<T>>> {
        match Self::take(&mut slice) {
            Ok((ptr, bytes, device)) => {
                let (len, stream) = (slice.len(), slice.stream().clone());
                Ok(CudarcSlice {
                    memory: Arc::new(CudarcMemory {
                        ptr,
                        bytes,
                        device,
                        stream,
                        uses: Mutex::new(StreamUses::default()),
                        slice: Some(Box::new(slice)),
                    }),
                    len,
                    _type: PhantomData,
                })
            }
            Err(error) => Err(Refused {
                error,
                value: slice,
            }),
        }
    }

    /// [`new`](CudarcSlice::new)'s checks and wait: the address, the size and the device.
    fn take(slice: &mut CudaSlice<T>) -> Result<(sys::CUdeviceptr, usize, Device)> {
        const CALL: &str = "CudarcSlice::new";
        let bytes = slice
            .len()
            .checked_mul(size_of::<T>())
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::invalid(CALL, "the slice is empty, or its size overflows"))?;
        let device = Device::from_cudarc(slice.context())?;
        let stream = slice.stream().clone();
        let raw: sys::CUstream = stream.cu_stream().cast();
        if raw == sys::CU_STREAM_PER_THREAD {
            return Err(Error::invalid(
                CALL,
                "the slice's stream is the per-thread default stream: cudarc frees it on the per-thread stream of the thread that drops it, not the stream its uses are ordered on",
            ));
        }
        device.bind()?;
        // No capture of this crate begins on the stream between the check and the synchronize.
        let _gate = deferred::hold_gate();
        if raw_capture_status(raw)? != CaptureStatus::None {
            return Err(Error::Capturing {
                call: CALL,
                instead: "wrap the slice before its stream begins capturing",
            });
        }
        // cudarc's own record of the slice's uses on its other streams: the slice's stream waits
        // for them (and cudarc records its write event there).
        let (ptr, record) = slice.device_ptr_mut(&stream);
        drop(record);
        // SAFETY: the stream is live (the slice holds it) and not capturing (checked, under the
        // gate).
        driver!(unsafe { sys::cuStreamSynchronize(raw) })?;
        Ok((ptr, bytes, device))
    }

    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no values (never: empty slices are refused).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.memory.device
    }

    /// The slice's cudarc stream, on which cudarc allocated it and frees it.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.memory.stream
    }

    pub(crate) fn memory(&self) -> &Arc<CudarcMemory> {
        &self.memory
    }

    /// The cudarc slice, to read through cudarc (`CudaStream::clone_dtoh`, `memcpy_dtod` from
    /// it, a kernel argument): shared access, while the crate keeps the slice. Outside a capture,
    /// the slice's stream first waits for every use the crate recorded so far, so cudarc work on
    /// that stream follows them (on other streams it does not: [`CudarcSlice`]'s docs). While the
    /// slice's stream captures into a capture of this crate, nothing is waited for (an event wait
    /// cannot cross the capture's boundary) and the captured graph keeps the slice, so that cudarc
    /// work captured there on it is covered; while it captures otherwise (a capture other code
    /// began, whose graph would keep nothing, or an invalidated one), access is refused.
    ///
    /// # Errors
    ///
    /// [`Error::Capturing`] naming `CudarcSlice::as_cudarc` while the slice's stream captures,
    /// but not into a capture of this crate; [`Device::bind`]'s errors; [`Error::InDoubt`] when a
    /// use could not be tracked;
    /// [`Error::Driver`] naming `cuStreamIsCapturing`, `cuStreamGetCaptureInfo` or
    /// `cuStreamWaitEvent`; [`Error::InvalidArgument`] naming `CudarcSlice::as_cudarc` if the
    /// slice is not a `CudaSlice<T>` (never: the type is fixed by [`new`](CudarcSlice::new)).
    pub fn as_cudarc(&self) -> Result<&CudaSlice<T>> {
        const CALL: &str = "CudarcSlice::as_cudarc";
        let memory = &*self.memory;
        memory.device.bind()?;
        let raw = memory.raw_stream();
        {
            // No capture of this crate begins on the stream between the check and the waits.
            let _gate = deferred::hold_gate();
            if raw_capture_status(raw)? == CaptureStatus::None {
                let uses = memory.uses.lock().unwrap_or_else(|e| e.into_inner());
                uses.wait_on(raw, None)?;
            } else if let Some(()) = capture_id(raw)?.and_then(|id| {
                deferred::captured_outside(id, |outside| {
                    outside.keep.push(Arc::clone(&self.memory) as Keep);
                })
            }) {
            } else {
                // A capture other code began (cudarc's begin_capture, for one): its graph would
                // keep nothing cudarc captures on the slice.
                return Err(Error::Capturing {
                    call: CALL,
                    instead: "the slice's stream captures into a capture not begun through this crate, whose graph would not keep the slice; read it before or after that capture",
                });
            }
        }
        memory
            .slice
            .as_deref()
            .and_then(|slice| slice.downcast_ref::<CudaSlice<T>>())
            .ok_or_else(|| Error::invalid(CALL, "the slice is not a CudaSlice of this type"))
    }

    /// Gives the slice back to cudarc, ordered after the crate's work: its stream waits for every
    /// use the crate recorded, then cudarc's write event of the slice is recorded there (when
    /// cudarc tracks the slice), so that cudarc's later work on the slice, on any of its streams,
    /// follows the crate's.
    ///
    /// # Errors
    ///
    /// With the handle given back in [`Refused`]: [`Error::InvalidArgument`] naming
    /// `CudarcSlice::into_inner` while a graph, an executable graph or a kernel argument list
    /// still holds the slice (an executable graph lets go once its last launch is done:
    /// [`Device::synchronize`] waits for that); [`Error::Capturing`] naming it while the slice's
    /// stream captures; [`Error::InDoubt`] when a use could not be tracked; [`Device::bind`]'s
    /// errors; [`Error::Driver`] naming `cuStreamIsCapturing` or `cuStreamWaitEvent`.
    pub fn into_inner(self) -> Result<CudaSlice<T>, Refused<CudarcSlice<T>>> {
        const CALL: &str = "CudarcSlice::into_inner";
        let CudarcSlice { memory, len, _type } = self;
        let mut memory = match Arc::try_unwrap(memory) {
            Ok(memory) => memory,
            Err(shared) => {
                return Err(Refused {
                    error: Error::invalid(
                        CALL,
                        "a graph, an executable graph or a kernel argument list still holds the slice",
                    ),
                    value: CudarcSlice {
                        memory: shared,
                        len,
                        _type,
                    },
                });
            }
        };
        match memory.hand_back::<T>(CALL) {
            Ok(slice) => Ok(slice),
            Err(error) => Err(Refused {
                error,
                value: CudarcSlice {
                    memory: Arc::new(memory),
                    len,
                    _type,
                },
            }),
        }
    }
}

impl CudarcMemory {
    /// [`CudarcSlice::into_inner`] once nothing else holds the memory: the waits, the record of
    /// cudarc's write event, and the slice. On error nothing is taken.
    fn hand_back<T: Pod>(&mut self, call: &'static str) -> Result<CudaSlice<T>> {
        self.device.bind()?;
        let raw = self.raw_stream();
        // No capture of this crate begins on the stream between the check and the record.
        let _gate = deferred::hold_gate();
        if raw_capture_status(raw)? != CaptureStatus::None {
            return Err(Error::Capturing {
                call,
                instead: "take the slice back after the capture has ended",
            });
        }
        let uses = self.uses.get_mut().unwrap_or_else(|e| e.into_inner());
        uses.wait_on(raw, None)?;
        let erased = self
            .slice
            .take()
            .ok_or_else(|| Error::invalid(call, "the slice was taken back already"))?;
        let mut slice = match erased.downcast::<CudaSlice<T>>() {
            Ok(slice) => *slice,
            Err(other) => {
                self.slice = Some(other);
                return Err(Error::invalid(
                    call,
                    "the slice is not a CudaSlice of this type",
                ));
            }
        };
        // cudarc's write event, recorded on the slice's stream after the waits: cudarc's later
        // work on the slice waits for it, on whichever of its streams.
        let (_, record) = slice.device_ptr_mut(&self.stream);
        drop(record);
        Ok(slice)
    }
}
