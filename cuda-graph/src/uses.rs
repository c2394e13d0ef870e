//! Where memory was last used, per real stream: what a free waits for.
//!
//! Streams are told apart by the driver's stream id (`cuStreamGetId`), not by handle: the
//! per-thread default stream has one handle and a different stream on every thread. Each
//! stream's entry holds an event recorded after the latest use there (stream order makes it
//! cover the earlier uses). An event is re-recorded only while this entry is its one holder;
//! a graph launch that uses many allocations records one event and shares it among them, and a
//! shared event is never recorded again, so no record elsewhere can move an entry's event.
//!
//! Work on graph memory is ordered and queued under one process-wide lock ([`hold_order_lock`]).
//! Events and stream order alone do not keep it in order on the H200 (driver 580): when two
//! threads launch graphs that allocate, free or use graph memory into streams they share, a
//! relaunch was seen to run before a use of the previous launch that it waited for, a consumer
//! to read a later launch's value, and `cuGraphLaunch` to crash inside the driver. Plain CUDA
//! does the same (`bench/probe/stream_change_order.cu`: tens of bad rounds in 3000 with the
//! launches alone serialized, none with each thread's wait, launch and record sequence
//! serialized); with the crate's sequences serialized the reuse probes of the soundness and
//! stream stress tests find none.

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::Device;
use crate::error::{Error, Result, driver};
use crate::event::{Event, spare_event};
use crate::stream::AsStream;
use crate::sys;

/// The last use of some memory on each stream that used it.
#[derive(Debug, Default)]
pub(crate) struct StreamUses {
    entries: Vec<(u64, Arc<Event>)>,
    /// Set when work that uses the memory was queued but could neither be marked with an event
    /// nor waited for ([`wait_unmarked`]): the call that queued it. From then on no free or
    /// use can be ordered after that work, so every [`wait_on`](StreamUses::wait_on) fails and
    /// the memory is kept for the rest of the process.
    in_doubt: Option<&'static str>,
}

/// An event recorded after some work: `event` on `stream`, or a new one. An event held
/// elsewhere too is never recorded again.
pub(crate) fn recorded(
    device: &Device,
    stream: &impl AsStream,
    mut reuse: Option<Arc<Event>>,
) -> Result<Arc<Event>> {
    let event = spare_event(device, &mut reuse)?;
    event.record(stream)?;
    Ok(event)
}

/// Work is queued on `stream` but could not be marked with an event: waits for it, so that
/// nothing the crate frees later can overtake it. `false` when it cannot be waited for (a
/// capture of this crate forbids the synchronize here, or the synchronize fails): then when
/// the work ends is unknown, and what it uses must be kept ([`StreamUses::doubt`]).
pub(crate) fn wait_unmarked(stream: &impl AsStream) -> bool {
    crate::deferred::release_allowed() && stream.synchronize().is_ok()
}

impl StreamUses {
    /// Work using the memory was queued on `stream`, whose id is `id`.
    pub(crate) fn note(&mut self, device: &Device, stream: &impl AsStream, id: u64) -> Result<()> {
        let slot = self.entries.iter().position(|(s, _)| *s == id);
        if let Some(i) = slot {
            let event = &self.entries[i].1;
            if Arc::strong_count(event) == 1 {
                // Ours alone: recorded again (a failed record leaves the earlier one).
                return event.record(stream);
            }
        }
        // A new event replaces the entry only once recorded: a failure forgets no use.
        let event = recorded(device, stream, None)?;
        match slot {
            Some(i) => self.entries[i].1 = event,
            None => self.entries.push((id, event)),
        }
        Ok(())
    }

    /// Work using the memory was queued on the stream of id `id`, and `event` was recorded
    /// after it (an event shared with other allocations of the same launch).
    pub(crate) fn note_event(&mut self, id: u64, event: &Arc<Event>) {
        match self.entries.iter_mut().find(|(s, _)| *s == id) {
            Some(entry) => entry.1 = event.clone(),
            None => self.entries.push((id, event.clone())),
        }
    }

    /// Work that `queued_by` queued on the memory can neither be marked nor waited for
    /// ([`wait_unmarked`]): no free or use is ordered after it from now on.
    pub(crate) fn doubt(&mut self, queued_by: &'static str) {
        self.in_doubt.get_or_insert(queued_by);
    }

    /// [`Error::InDoubt`] when work on the memory could not be tracked ([`doubt`](Self::doubt)).
    pub(crate) fn tracked(&self) -> Result<()> {
        match self.in_doubt {
            Some(queued_by) => Err(Error::InDoubt { queued_by }),
            None => Ok(()),
        }
    }

    /// Makes `stream` (id `id`) wait for the uses on every other stream; [`Error::InDoubt`]
    /// when one of them could not be tracked.
    pub(crate) fn wait_on(&self, stream: sys::CUstream, id: Option<u64>) -> Result<()> {
        self.tracked()?;
        for (s, event) in &self.entries {
            if Some(*s) != id {
                wait(stream, event)?;
            }
        }
        Ok(())
    }

    /// The events after the last use on each stream: once all have completed, no use queued
    /// before is still running (a host wait for the memory, [`crate::PinnedBuffer`]'s).
    pub(crate) fn events(&self) -> impl Iterator<Item = &Arc<Event>> {
        self.entries.iter().map(|(_, event)| event)
    }

    /// Forgets every use (the memory was freed, or allocated anew); work in doubt is not
    /// forgotten.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }
}

/// Stream work using some memory (a stream allocation, a cudarc slice) was queued on `stream`:
/// recorded in its `uses`, for its free to wait for. Not on a capturing stream: captured work
/// runs in a graph launch, and the graph keeps the memory alive.
pub(crate) fn note_stream_use(
    uses: &Mutex<StreamUses>,
    device: &Device,
    stream: &impl AsStream,
) -> Result<()> {
    if stream.capture_status()? != crate::stream::CaptureStatus::None {
        return Ok(());
    }
    let id = stream.stream_id()?;
    uses.lock()
        .unwrap_or_else(|e| e.into_inner())
        .note(device, stream, id)
}

/// [`StreamUses::doubt`] on the uses behind a lock.
pub(crate) fn doubt(uses: &Mutex<StreamUses>, queued_by: &'static str) {
    uses.lock()
        .unwrap_or_else(|e| e.into_inner())
        .doubt(queued_by);
}

/// `cuStreamWaitEvent(stream, event)`.
pub(crate) fn wait(stream: sys::CUstream, event: &Event) -> Result<()> {
    // SAFETY: both handles are live; the event was recorded outside any capture.
    driver!(unsafe { sys::cuStreamWaitEvent(stream, event.as_raw(), 0) })
}

/// The lock of the module docs: held from the first wait that orders work on graph memory to
/// the record of the event after it.
static ORDER: Mutex<()> = Mutex::new(());

thread_local! {
    /// How many [`OrderLock`]s this thread holds: only the outermost takes [`ORDER`] (a release
    /// run under the lock, such as a RAII free set off by an event's drop, takes it again).
    static ORDER_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// A hold of [`ORDER`], re-entrant on one thread; not `Send` (the guard is released on the
/// thread that took it).
pub(crate) struct OrderLock {
    _held: Option<MutexGuard<'static, ()>>,
}

/// Holds the order lock until the value drops. Taken after the capture gate and before any
/// allocation's lock, everywhere: nothing that holds it waits for either.
pub(crate) fn hold_order_lock() -> OrderLock {
    let depth = ORDER_DEPTH.get();
    ORDER_DEPTH.set(depth + 1);
    OrderLock {
        // A panic under the lock leaves nothing half-done that the lock guards (it guards the
        // driver's order of work, not data): a poisoned lock is taken all the same.
        _held: (depth == 0).then(|| ORDER.lock().unwrap_or_else(|e| e.into_inner())),
    }
}

impl Drop for OrderLock {
    fn drop(&mut self) {
        ORDER_DEPTH.set(ORDER_DEPTH.get() - 1);
    }
}
