//! Where memory was last used, per real stream: what a free waits for.
//!
//! Streams are told apart by the driver's stream id (`cuStreamGetId`), not by handle: the
//! per-thread default stream has one handle and a different stream on every thread. Each
//! stream's entry holds an event recorded after the latest use there (stream order makes it
//! cover the earlier uses). An event is re-recorded only while this entry is its one holder;
//! a graph launch that uses many allocations records one event and shares it among them, and a
//! shared event is never recorded again, so no record elsewhere can move an entry's event.

use std::sync::Arc;

use crate::device::Device;
use crate::error::{Result, driver};
use crate::event::{Event, EventFlags};
use crate::stream::AsStream;
use crate::sys;

/// The last use of some memory on each stream that used it.
#[derive(Debug, Default)]
pub(crate) struct StreamUses {
    entries: Vec<(u64, Arc<Event>)>,
}

/// An event recorded after some work: `event` on `stream`, or a new one. An event held
/// elsewhere too is never recorded again.
pub(crate) fn recorded(
    device: &Device,
    stream: &impl AsStream,
    reuse: Option<Arc<Event>>,
) -> Result<Arc<Event>> {
    let event = match reuse {
        Some(event) if Arc::strong_count(&event) == 1 => event,
        _ => Arc::new(Event::with_flags(device, EventFlags::DISABLE_TIMING)?),
    };
    event.record(stream)?;
    Ok(event)
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
    // SAFETY: both handles are live; the event was recorded outside any capture.
    driver!(unsafe { sys::cuStreamWaitEvent(stream, event.as_raw(), 0) })
}
