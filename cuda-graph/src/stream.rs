//! Streams: owned ([`Stream`]) and borrowed ([`BorrowedStream`]), in the manner of
//! `OwnedFd`/`BorrowedFd`.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::deferred;
use crate::device::Device;
use crate::error::{Error, Result, check, driver};
use crate::event::Event;
use crate::flags::flag_set;
use crate::handle::{Handle, OwnedHandle};
use crate::inline_list::Few;
use crate::sys;

/// Anything work can be queued on: an owned or a borrowed stream.
///
/// Sealed: the crate hands [`as_raw_stream`](AsStream::as_raw_stream) to the driver, and orders
/// and checks work by it, trusting it to be the same live stream of [`device`](AsStream::device)
/// for as long as the value lives; only [`Stream`] and [`BorrowedStream`] can promise that. A
/// stream made elsewhere is borrowed with [`BorrowedStream::from_raw`], whose caller vouches for
/// it (`tests/compile-fail/as_stream_is_sealed`).
pub trait AsStream: sealed::Sealed {
    /// The raw stream handle.
    #[must_use]
    fn as_raw_stream(&self) -> sys::CUstream;
    /// The device the stream belongs to.
    #[must_use]
    fn device(&self) -> &Device;

    /// Waits on the host until the stream's work is done (`cuStreamSynchronize`), then runs
    /// the releases the crate put off ([`flush_deferred`](crate::flush_deferred)).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamSynchronize`, which also
    /// reports an earlier asynchronous failure of work on the stream (a kernel's fault, for one).
    fn synchronize(&self) -> Result<()> {
        self.device().bind()?;
        // SAFETY: the stream handle is live for as long as `self` is.
        driver!(unsafe { sys::cuStreamSynchronize(self.as_raw_stream()) })?;
        deferred::flush_if_queued();
        Ok(())
    }

    /// The driver's id of the stream (`cuStreamGetId`), unique for the life of the process.
    /// For the per-thread default stream it is the calling thread's own stream: two threads get
    /// two ids for one handle. Not available while the stream captures.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamGetId`.
    fn stream_id(&self) -> Result<u64> {
        self.device().bind()?;
        let mut id = 0;
        // SAFETY: `id` is a valid out-pointer; the stream is live.
        driver!(unsafe { sys::cuStreamGetId(self.as_raw_stream(), &mut id) })?;
        Ok(id)
    }

    /// Makes later work on this stream wait for `event` (`cuStreamWaitEvent`). Inside a capture
    /// of this crate the wait adds dependencies the capture's guard did not make, so the capture
    /// reads its graph's edges from the driver when it ends ([`Capture`](crate::Capture)).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamWaitEvent`.
    fn wait_event(&self, event: &Event) -> Result<()> {
        wait_event_unnoted(self, event)?;
        if deferred::any_capture() {
            // A wait inside a capture of this crate adds dependencies the capture did not
            // make: it reads the captured graph's edges from the driver instead.
            if let Some(id) = capture_id(self.as_raw_stream())? {
                deferred::captured_outside(id, |outside| outside.waited = true);
            }
        }
        Ok(())
    }

    /// Whether the stream is capturing into a graph (`cuStreamIsCapturing`).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamIsCapturing`.
    fn capture_status(&self) -> Result<CaptureStatus> {
        self.device().bind()?;
        raw_capture_status(self.as_raw_stream())
    }
}

/// [`AsStream::wait_event`] without telling a capture that `stream` takes part in: for the
/// capture's own forks and joins, whose dependencies it notes itself.
pub(crate) fn wait_event_unnoted(stream: &(impl AsStream + ?Sized), event: &Event) -> Result<()> {
    stream.device().bind()?;
    // The wait may make this stream join a capture of this crate (a fork): not while an
    // operation on it is between its "not capturing" check and its driver call.
    let _gate = deferred::exclusive_gate_for_join();
    // SAFETY: both handles are live.
    driver!(unsafe { sys::cuStreamWaitEvent(stream.as_raw_stream(), event.as_raw(), 0) })
}

// Recording an event takes a stream, as waiting for one does (`AsStream::wait_event`): both are
// here, above event.rs, which names no stream.
impl Event {
    /// Records the event on `stream` (`cuEventRecord`).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors (for the stream's device); [`Error::Driver`] naming
    /// `cuEventRecord`.
    pub fn record(&self, stream: &impl AsStream) -> Result<()> {
        stream.device().bind()?;
        self.record_bound(stream)
    }

    /// [`record`](Event::record) where the stream's context is known to be current (the
    /// launch path, just after its own [`Device::bind`]): one driver call fewer.
    pub(crate) fn record_bound(&self, stream: &impl AsStream) -> Result<()> {
        // SAFETY: both handles are live; the caller made the stream's context current.
        driver!(unsafe { sys::cuEventRecord(self.as_raw(), stream.as_raw_stream()) })
    }
}

/// A stream's capture state (`CUstreamCaptureStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing into a graph.
    Active,
    /// The capture was invalidated by an illegal operation; ending it returns the error.
    Invalidated,
    /// A status these headers do not know.
    Other(u32),
}

impl CaptureStatus {
    pub(crate) fn from_raw(status: sys::CUstreamCaptureStatus) -> Self {
        match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
                CaptureStatus::Invalidated
            }
            other => CaptureStatus::Other(other.0),
        }
    }
}

/// Stream creation flags (`CU_STREAM_*`), a bit-set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StreamFlags(u32);

impl StreamFlags {
    /// `CU_STREAM_DEFAULT`: synchronizes with the legacy default stream.
    pub const DEFAULT: StreamFlags = StreamFlags(0);
    /// `CU_STREAM_NON_BLOCKING`: does not synchronize with the legacy default stream.
    pub const NON_BLOCKING: StreamFlags =
        StreamFlags(sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0);
}

flag_set!(StreamFlags(u32) { NON_BLOCKING });

/// An owned stream, destroyed on drop (`cuStreamDestroy`; queued work still completes).
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    device: Device,
    /// Whether this value destroys `raw` on drop (false once given up by `into_raw`).
    owns_raw: bool,
    /// Shared with the executable graphs whose latest launch on it is not marked yet.
    tail: Arc<StreamTail>,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: the driver lets any thread queue work on, synchronize or destroy a stream.
unsafe impl Send for Stream {}
// SAFETY: every method takes `&self` and only queues work or queries state, which the driver
// serializes internally; concurrent launches on one stream are ordered by the driver.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream on `device` with default flags and priority.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamCreateWithPriority`.
    pub fn new(device: &Device) -> Result<Stream> {
        Stream::with_flags(device, StreamFlags::DEFAULT, 0)
    }

    /// A new stream with flags and a priority (lower numbers are higher priorities; see
    /// `cuCtxGetStreamPriorityRange`).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamCreateWithPriority`.
    pub fn with_flags(device: &Device, flags: StreamFlags, priority: i32) -> Result<Stream> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the device's context is current.
        driver!(unsafe { sys::cuStreamCreateWithPriority(&mut raw, flags.bits(), priority) })?;
        Ok(Stream {
            raw,
            device: device.clone(),
            owns_raw: true,
            tail: StreamTail::new(raw, device),
            _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::Stream),
        })
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Takes ownership of a raw stream.
    ///
    /// # Safety
    ///
    /// `raw` is a live stream of `device`'s primary context that nothing else destroys; this
    /// value destroys it when dropped. No capture begun outside this crate records it while the
    /// crate queues work on it (as for [`BorrowedStream::from_raw`]).
    #[must_use]
    pub unsafe fn from_raw(raw: sys::CUstream, device: &Device) -> Stream {
        Stream {
            raw,
            device: device.clone(),
            owns_raw: true,
            tail: StreamTail::new(raw, device),
            _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::Stream),
        }
    }

    /// Ends a capture that a forgotten [`Capture`](crate::Capture) guard left open on this
    /// stream, recording [`Error::CaptureLeftOpen`]. A capture that is not relaxed can only be
    /// ended by the thread that began it: on another thread the failure is recorded too, and
    /// the capture stays registered (releases stay put off, as the driver still captures).
    fn end_forgotten_capture(&self) {
        let Some(id) = deferred::capture_on(self.raw as usize) else {
            return;
        };
        self.device.record_drop_error(Error::CaptureLeftOpen);
        if let Err(e) = self.device.bind() {
            self.device.record_drop_error(e);
        }
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (a registered capture began on it).
        let ended = driver!(unsafe { sys::cuStreamEndCapture(self.raw, &mut graph) });
        if !graph.is_null() {
            // SAFETY: the discarded graph is ours to destroy.
            let destroyed = driver!(unsafe { sys::cuGraphDestroy(graph) });
            self.device.record(destroyed);
        }
        if ended.is_ok() {
            deferred::capture_ended(id);
        } else {
            self.device.record(ended);
        }
    }

    /// Gives up ownership: the caller destroys the stream. A capture a forgotten guard left
    /// open on it is ended first, as on drop, and the launches queued on it are marked for the
    /// executable graphs that wait for them (an event recorded now; while the stream still takes
    /// part in a capture, what those launches use is kept for the rest of the process).
    #[must_use = "the handle is no longer destroyed on drop: destroy it, or it leaks"]
    pub fn into_raw(mut self) -> sys::CUstream {
        self.end_forgotten_capture();
        self.tail.seal();
        self.owns_raw = false;
        self.raw
    }

    /// A borrowed view of this stream.
    #[must_use]
    pub fn borrow(&self) -> BorrowedStream<'_> {
        BorrowedStream {
            raw: self.raw,
            device: self.device.clone(),
            _lifetime: PhantomData,
        }
    }
}

impl Handle for Stream {
    type Raw = sys::CUstream;

    fn as_raw(&self) -> sys::CUstream {
        Stream::as_raw(self)
    }
}

impl OwnedHandle for Stream {
    /// [`Stream::into_raw`]; never refused.
    fn into_raw(self) -> Result<sys::CUstream, Stream> {
        Ok(Stream::into_raw(self))
    }

    /// [`Stream::from_raw`]; never fails.
    unsafe fn from_raw(raw: sys::CUstream, device: &Device) -> Result<Stream> {
        // SAFETY: the caller upholds `Stream::from_raw`'s contract, which this one states.
        Ok(unsafe { Stream::from_raw(raw, device) })
    }
}

mod sealed {
    use std::sync::Arc;

    /// Implemented by the crate's streams only.
    pub trait Sealed {
        /// The tail of an owned stream, which lets its work be marked after the fact; `None`
        /// for a borrowed one, whose handle may be destroyed by its owner at any time.
        fn tail(&self) -> Option<&Arc<super::StreamTail>> {
            None
        }
    }
}

impl sealed::Sealed for Stream {
    fn tail(&self) -> Option<&Arc<StreamTail>> {
        Some(&self.tail)
    }
}
impl sealed::Sealed for BorrowedStream<'_> {}

/// The part of an owned [`Stream`] that work queued on it shares, so that the work can be
/// marked after it was queued: an executable graph holds its stream's tail instead of recording
/// an event after every launch, and records one only when it must know its launches are done
/// ([`StreamTail::mark`]; an event recorded later completes after everything queued before it).
///
/// The handle stays valid for such a record: the stream is destroyed only after its tail is
/// sealed, which records one last event for the holders when any hold it, so that a mark after
/// the stream's drop gets that event. (`pub` only to appear in the sealed trait; not exported.)
#[derive(Debug)]
pub struct StreamTail {
    raw: usize,
    device: Device,
    /// Set once the stream is destroyed or given up ([`StreamTail::seal`]).
    sealed: Mutex<Option<Mark>>,
}

/// What is known of the work queued on a stream up to some point.
#[derive(Debug, Clone)]
pub(crate) enum Mark {
    /// An event recorded after it.
    Event(Arc<Event>),
    /// It is done.
    Done,
    /// Nothing, for now: the stream captures (an event recorded now would be captured), or the
    /// stream cannot be waited for here; ask again later.
    NotNow,
    /// Nothing, ever: neither recorded after nor waited for (the error says why). What the work
    /// uses must be kept for the rest of the process.
    Unknown(Error),
}

impl StreamTail {
    fn new(raw: sys::CUstream, device: &Device) -> Arc<StreamTail> {
        Arc::new(StreamTail {
            raw: raw as usize,
            device: device.clone(),
            sealed: Mutex::new(None),
        })
    }

    /// Marks the work queued on the stream so far: an event recorded now (`spare` when it is
    /// held nowhere else), or the seal's mark once the stream is gone.
    pub(crate) fn mark(&self, spare: &mut Option<Arc<Event>>) -> Mark {
        let sealed = self.sealed.lock().unwrap_or_else(|e| e.into_inner());
        match &*sealed {
            Some(mark) => mark.clone(),
            None => self.record(spare),
        }
    }

    /// Records an event on the live stream (the caller holds `sealed`, so the stream is not
    /// destroyed meanwhile); where recording fails, waits for the stream instead.
    fn record(&self, spare: &mut Option<Arc<Event>>) -> Mark {
        let raw = self.raw as sys::CUstream;
        if let Err(e) = self.device.bind() {
            return Mark::Unknown(e);
        }
        match raw_capture_status(raw) {
            Ok(CaptureStatus::None) => {}
            Ok(_) => return Mark::NotNow,
            Err(e) => return Mark::Unknown(e),
        }
        // An idle stream needs no event (and what waits can go at once). Only where a release
        // may run: a capture of this crate that forbids releases may forbid the query too.
        if deferred::release_allowed() {
            // SAFETY: the stream is live and does not capture.
            if unsafe { sys::cuStreamQuery(raw) } == sys::CUresult::CUDA_SUCCESS {
                return Mark::Done;
            }
        }
        if let Ok(event) = crate::event::spare_event(&self.device, spare) {
            // SAFETY: both handles are live (the stream until sealed); the stream does not
            // capture, so the record is not captured.
            if driver!(unsafe { sys::cuEventRecord(event.as_raw(), raw) }).is_ok() {
                return Mark::Event(event);
            }
        }
        if !deferred::release_allowed() {
            // A capture of this crate forbids the synchronize: the queue asks again after it.
            return Mark::NotNow;
        }
        // SAFETY: the stream is live and does not capture.
        match driver!(unsafe { sys::cuStreamSynchronize(raw) }) {
            Ok(()) => Mark::Done,
            Err(e) => Mark::Unknown(e),
        }
    }

    /// Marks the work queued so far for the holders, if any, before the stream's handle is
    /// destroyed or given up; later marks get this one. The caller has checked that the stream
    /// does not capture (else the mark is [`Mark::Unknown`]).
    fn seal(self: &Arc<Self>) {
        let mut sealed = self.sealed.lock().unwrap_or_else(|e| e.into_inner());
        if sealed.is_some() {
            return;
        }
        // Only the stream holds it: no launch waits to be marked, and none can be queued on
        // the stream any more.
        let mark = if Arc::strong_count(self) == 1 {
            Mark::Done
        } else {
            match self.record(&mut None) {
                Mark::NotNow => Mark::Unknown(Error::InDoubt {
                    queued_by: "ExecGraph::launch",
                }),
                mark => mark,
            }
        };
        *sealed = Some(mark);
    }
}

impl AsStream for Stream {
    fn as_raw_stream(&self) -> sys::CUstream {
        self.raw
    }
    fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for Stream {
    /// Ends a capture this stream still began (its [`Capture`](crate::Capture) guard was
    /// forgotten), recording [`Error::CaptureLeftOpen`] in the device's drop errors, then
    /// destroys the stream: now, or, while stream-ordered frees on it are still queued or it
    /// still takes part in another stream's capture, once those have run.
    fn drop(&mut self) {
        if !self.owns_raw {
            return;
        }
        self.end_forgotten_capture();
        deferred::flush_if_queued();
        let (raw, tail) = (self.raw as usize, self.tail.clone());
        let destroy = move |device: &Device| {
            let raw = raw as sys::CUstream;
            if !matches!(raw_capture_status(raw), Ok(CaptureStatus::None)) {
                return false;
            }
            tail.seal();
            // SAFETY: owned and destroyed once; the driver finishes queued work first.
            device.record(driver!(unsafe { sys::cuStreamDestroy(raw) }));
            true
        };
        if deferred::queued() == 0 {
            self.device.release(destroy);
        } else {
            // Queued frees may name this stream: it is destroyed after them.
            self.device.enqueue_release(destroy);
        }
    }
}

/// `cuStreamIsCapturing` on a raw handle.
pub(crate) fn raw_capture_status(raw: sys::CUstream) -> Result<CaptureStatus> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a valid out-pointer; the caller's stream is live.
    driver!(unsafe { sys::cuStreamIsCapturing(raw, &mut status) })?;
    Ok(CaptureStatus::from_raw(status))
}

/// What `cuStreamGetCaptureInfo` says of a stream's capture.
pub(crate) struct CaptureInfo {
    /// Whether the stream captures (`CU_STREAM_CAPTURE_STATUS_ACTIVE`).
    pub(crate) active: bool,
    /// The graph the capture builds.
    pub(crate) graph: sys::CUgraph,
    /// The nodes the next operation captured on the stream will depend on.
    pub(crate) deps: Few<sys::CUgraphNode>,
}

/// The capture `stream` takes part in (`cuStreamGetCaptureInfo`).
pub(crate) fn capture_info(stream: sys::CUstream) -> Result<CaptureInfo> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut count = 0;
    check(
        // SAFETY: out-pointers valid (the id's optional, and null); the returned array is valid
        // until the next capture call.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                std::ptr::null_mut(),
                &mut graph,
                &mut deps,
                std::ptr::null_mut(),
                &mut count,
            )
        },
        "cuStreamGetCaptureInfo",
    )?;
    let deps = if count == 0 || deps.is_null() {
        Few::Empty
    } else if count == 1 {
        // SAFETY: the driver's array holds one entry, read before any other capture call.
        Few::One(unsafe { *deps })
    } else {
        // SAFETY: the driver's array holds `count` entries, read before any other capture call.
        unsafe { std::slice::from_raw_parts(deps, count) }
            .iter()
            .copied()
            .collect()
    };
    Ok(CaptureInfo {
        active: status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        graph,
        deps,
    })
}

/// The id of the capture `stream` takes part in, or `None`.
pub(crate) fn capture_id(stream: sys::CUstream) -> Result<Option<u64>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    check(
        // SAFETY: out-pointers valid; the others are optional, and null.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        },
        "cuStreamGetCaptureInfo",
    )?;
    Ok((status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE).then_some(id))
}

/// The node the next captured operation on `stream` would depend on, which is the node the
/// operation captured just before made; `None` when the stream depends on no node or on
/// several.
pub(crate) fn last_captured_node(stream: sys::CUstream) -> Result<Option<sys::CUgraphNode>> {
    match capture_info(stream)?.deps {
        Few::One(node) => Ok(Some(node)),
        _ => Ok(None),
    }
}

/// A stream someone else owns: the per-thread or legacy default stream, or one made by another
/// library. Never destroyed by us.
#[derive(Debug, Clone)]
pub struct BorrowedStream<'a> {
    raw: sys::CUstream,
    device: Device,
    _lifetime: PhantomData<&'a ()>,
}

// SAFETY: as for `Stream`: a stream handle may be used from any thread.
unsafe impl Send for BorrowedStream<'_> {}
// SAFETY: as for `Stream`.
unsafe impl Sync for BorrowedStream<'_> {}

impl BorrowedStream<'static> {
    /// The calling thread's default stream (`CU_STREAM_PER_THREAD`, `cudaStreamPerThread`).
    #[must_use]
    pub fn per_thread(device: &Device) -> BorrowedStream<'static> {
        BorrowedStream {
            raw: sys::CU_STREAM_PER_THREAD,
            device: device.clone(),
            _lifetime: PhantomData,
        }
    }

    /// The legacy default stream (`CU_STREAM_LEGACY`), which synchronizes with blocking streams.
    #[must_use]
    pub fn legacy(device: &Device) -> BorrowedStream<'static> {
        BorrowedStream {
            raw: sys::CU_STREAM_LEGACY,
            device: device.clone(),
            _lifetime: PhantomData,
        }
    }
}

impl BorrowedStream<'_> {
    /// Borrows a stream made elsewhere (another crate, the runtime API).
    ///
    /// # Safety
    ///
    /// `raw` is a stream of `device`'s primary context (or a special handle such as
    /// `CU_STREAM_PER_THREAD`) that stays live for the lifetime `'a` chosen by the caller, and,
    /// if a [`StreamAllocation`](crate::StreamAllocation) on it is dropped while it captures,
    /// until the free the crate then queues on it has run (after the capture ends; see
    /// [`flush_deferred`](crate::flush_deferred)). While the crate queues work on it, no capture
    /// begun outside this crate (raw `cuStreamBeginCapture`, another library) records it: the
    /// crate cannot see such a capture, and work it queues there would become a node of a graph
    /// that keeps nothing the work refers to alive.
    #[must_use]
    pub unsafe fn from_raw<'a>(raw: sys::CUstream, device: &Device) -> BorrowedStream<'a> {
        BorrowedStream {
            raw,
            device: device.clone(),
            _lifetime: PhantomData,
        }
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUstream {
        self.raw
    }
}

impl AsStream for BorrowedStream<'_> {
    fn as_raw_stream(&self) -> sys::CUstream {
        self.raw
    }
    fn device(&self) -> &Device {
        &self.device
    }
}
