//! Where memory was last used, per real stream: what a free waits for.
//!
//! Streams are told apart by the driver's stream id (`cuStreamGetId`), not by handle: the
//! per-thread default stream has one handle and a different stream on every thread. Each
//! stream's entry owns its event, re-recorded at each use there (stream order makes the latest
//! record cover the earlier uses); no event is shared with another set, so no record elsewhere
//! can move it.

use crate::device::Device;
use crate::error::{Result, check};
use crate::event::{Event, EventFlags};
use crate::stream::AsStream;
use crate::sys;

/// The last use of some memory on each stream that used it.
#[derive(Debug, Default)]
pub(crate) struct StreamUses {
    entries: Vec<(u64, Event)>,
}

impl StreamUses {
    /// Work using the memory was queued on `stream`, whose id is `id`.
    pub(crate) fn note(&mut self, device: &Device, stream: &impl AsStream, id: u64) -> Result<()> {
        if let Some((_, event)) = self.entries.iter().find(|(s, _)| *s == id) {
            return event.record(stream);
        }
        let event = Event::with_flags(device, EventFlags::DISABLE_TIMING)?;
        event.record(stream)?;
        self.entries.push((id, event));
        Ok(())
    }

    /// Makes `stream` (id `id`) wait for the uses on every other stream.
    pub(crate) fn wait_on(&self, stream: sys::CUstream, id: Option<u64>) -> Result<()> {
        for (s, event) in &self.entries {
            if Some(*s) != id {
                wait(stream, event)?;
            }
        }
        Ok(())
    }

    /// Forgets every use (the memory was freed, or allocated anew).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }
}

/// `cuStreamWaitEvent(stream, event)`.
pub(crate) fn wait(stream: sys::CUstream, event: &Event) -> Result<()> {
    check(
        // SAFETY: both handles are live; the event was recorded outside any capture.
        unsafe { sys::cuStreamWaitEvent(stream, event.as_raw(), 0) },
        "cuStreamWaitEvent",
    )
}
