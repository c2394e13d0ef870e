//! Events: create, synchronize, query, time. Recording one and waiting for one take a stream:
//! [`Event::record`] and [`AsStream::wait_event`](crate::AsStream::wait_event) are in
//! `stream.rs`, above this module.

use std::sync::Arc;
use std::time::Duration;

use crate::device::Device;
use crate::error::{Error, Result, check, driver};
use crate::flags::flag_set;
use crate::handle::{Handle, OwnedHandle};
use crate::sys;

/// Event creation flags (`CU_EVENT_*`), a bit-set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventFlags(u32);

impl EventFlags {
    /// `CU_EVENT_DEFAULT`: records timing, spins on synchronize.
    pub const DEFAULT: EventFlags = EventFlags(0);
    /// `CU_EVENT_BLOCKING_SYNC`: synchronize blocks the thread instead of spinning.
    pub const BLOCKING_SYNC: EventFlags = EventFlags(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC.0);
    /// `CU_EVENT_DISABLE_TIMING`: no timestamps; cheapest for ordering.
    pub const DISABLE_TIMING: EventFlags =
        EventFlags(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING.0);
}

flag_set!(EventFlags(u32) {
    BLOCKING_SYNC,
    DISABLE_TIMING,
});

/// An owned event, destroyed when the last clone drops (graphs with event nodes keep a clone).
#[derive(Debug, Clone)]
pub struct Event {
    inner: Arc<EventInner>,
}

#[derive(Debug)]
struct EventInner {
    raw: sys::CUevent,
    device: Device,
    /// Whether dropping this destroys `raw` (false once given up by `Event::into_raw`).
    owns_raw: bool,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: the driver lets any thread record, wait on, query or destroy an event.
unsafe impl Send for EventInner {}
// SAFETY: all methods take `&self` and are thread-safe driver calls.
unsafe impl Sync for EventInner {}

impl Event {
    /// A new event with default flags (timing enabled).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuEventCreate`.
    pub fn new(device: &Device) -> Result<Event> {
        Event::with_flags(device, EventFlags::DEFAULT)
    }

    /// A new event with flags.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuEventCreate`.
    pub fn with_flags(device: &Device, flags: EventFlags) -> Result<Event> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        driver!(unsafe { sys::cuEventCreate(&mut raw, flags.bits()) })?;
        Ok(Event {
            inner: Arc::new(EventInner {
                raw,
                device: device.clone(),
                owns_raw: true,
                _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::Event),
            }),
        })
    }

    /// Waits on the host for the recorded work (`cuEventSynchronize`).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuEventSynchronize`, which also
    /// reports an earlier asynchronous failure of the recorded work.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.device.bind()?;
        // SAFETY: the event is live.
        driver!(unsafe { sys::cuEventSynchronize(self.inner.raw) })
    }

    /// Whether the recorded work is done (`cuEventQuery`).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuEventQuery` for any code but
    /// `CUDA_SUCCESS` and `CUDA_ERROR_NOT_READY` (which is `Ok(false)`).
    pub fn is_complete(&self) -> Result<bool> {
        self.inner.device.bind()?;
        self.is_complete_bound()
    }

    /// [`is_complete`](Event::is_complete) where the event's context is known to be current (a
    /// release, which made it so): one driver call fewer per poll.
    pub(crate) fn is_complete_bound(&self) -> Result<bool> {
        // SAFETY: the event is live.
        match unsafe { sys::cuEventQuery(self.inner.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => check(code, "cuEventQuery").map(|_| false),
        }
    }

    /// The time from `earlier` to this event: [`elapsed_ms_since`](Event::elapsed_ms_since) as a
    /// [`Duration`], rounded to the nanosecond (the driver's resolution is about half a
    /// microsecond). Both events recorded and complete, with timing enabled.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuEventElapsedTime` when the driver
    /// refuses: an event not recorded or made with [`EventFlags::DISABLE_TIMING`], or one not
    /// yet complete (`CUDA_ERROR_NOT_READY`). [`Error::InvalidArgument`] naming `Event::elapsed_since` when
    /// the driver's figure is negative (`earlier` completed after this event) or not finite.
    pub fn elapsed_since(&self, earlier: &Event) -> Result<Duration> {
        duration_from_ms(self.elapsed_ms_since(earlier)?)
    }

    /// Milliseconds between `start` and this event, the driver's figure as it reports it
    /// (`cuEventElapsedTime`): resolution about half a microsecond, negative when `start`
    /// completed after this event. Both recorded and complete, with timing enabled.
    /// [`elapsed_since`](Event::elapsed_since) gives a [`Duration`].
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuEventElapsedTime` when the driver
    /// refuses: an event not recorded or made with [`EventFlags::DISABLE_TIMING`], or one not
    /// yet complete (`CUDA_ERROR_NOT_READY`).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        self.inner.device.bind()?;
        let mut ms = 0.0;
        // SAFETY: `ms` is a valid out-pointer; both events are live.
        driver!(unsafe { sys::cuEventElapsedTime(&mut ms, start.inner.raw, self.inner.raw) })?;
        Ok(ms)
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUevent {
        self.inner.raw
    }

    /// Takes ownership of a raw event.
    ///
    /// # Safety
    ///
    /// `raw` is a live event of `device`'s primary context that nothing else destroys.
    #[must_use]
    pub unsafe fn from_raw(raw: sys::CUevent, device: &Device) -> Event {
        Event {
            inner: Arc::new(EventInner {
                raw,
                device: device.clone(),
                owns_raw: true,
                _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::Event),
            }),
        }
    }

    /// Gives up ownership, if this is the only clone: the caller destroys the event.
    ///
    /// # Errors
    ///
    /// The event itself, unchanged, when another clone of it exists.
    pub fn into_raw(self) -> Result<sys::CUevent, Event> {
        let mut inner = Arc::try_unwrap(self.inner).map_err(|inner| Event { inner })?;
        inner.owns_raw = false;
        Ok(inner.raw)
    }
}

impl Handle for Event {
    type Raw = sys::CUevent;

    fn as_raw(&self) -> sys::CUevent {
        Event::as_raw(self)
    }
}

impl OwnedHandle for Event {
    /// [`Event::into_raw`]: refused while other clones share the event.
    fn into_raw(self) -> Result<sys::CUevent, Event> {
        Event::into_raw(self)
    }

    /// [`Event::from_raw`]; never fails.
    unsafe fn from_raw(raw: sys::CUevent, device: &Device) -> Result<Event> {
        // SAFETY: the caller upholds `Event::from_raw`'s contract, which this one states.
        Ok(unsafe { Event::from_raw(raw, device) })
    }
}

/// `ms` milliseconds from `cuEventElapsedTime` as a [`Duration`], rounded to the nanosecond;
/// refused when negative (the earlier event completed after the later one) or not finite.
fn duration_from_ms(ms: f32) -> Result<Duration> {
    let nanos = (f64::from(ms) * 1e6).round();
    if !(0.0..=u64::MAX as f64).contains(&nanos) {
        return Err(Error::invalid(
            "Event::elapsed_since",
            if ms < 0.0 {
                format!("the driver reports {ms} ms: the earlier event completed after this one")
            } else {
                format!("the driver reports {ms} ms, which is no duration")
            },
        ));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

impl Drop for EventInner {
    fn drop(&mut self) {
        if !self.owns_raw {
            return;
        }
        let raw = self.raw as usize;
        self.device.release(move |device| {
            // SAFETY: owned and destroyed once, when the last clone drops.
            device.record(driver!(unsafe { sys::cuEventDestroy(raw as sys::CUevent) }));
            true
        });
    }
}

/// An event to record after work about to be queued: `reuse` when it is held nowhere else
/// (taken out of the option), else a new one (`reuse` left as it was). Made before the work is
/// queued, so that a failure to make it leaves nothing queued and unmarked.
pub(crate) fn spare_event(device: &Device, reuse: &mut Option<Arc<Event>>) -> Result<Arc<Event>> {
    match reuse.take() {
        Some(event) if Arc::strong_count(&event) == 1 => Ok(event),
        other => {
            *reuse = other;
            Ok(Arc::new(Event::with_flags(
                device,
                EventFlags::DISABLE_TIMING,
            )?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::duration_from_ms;
    use std::time::Duration;

    #[test]
    fn elapsed_milliseconds_become_a_duration() {
        assert_eq!(duration_from_ms(0.0).unwrap(), Duration::ZERO);
        assert_eq!(duration_from_ms(1.5).unwrap(), Duration::from_micros(1500));
        // The driver's half-microsecond steps survive; f32 noise below a nanosecond does not.
        assert_eq!(duration_from_ms(0.0005).unwrap(), Duration::from_nanos(500));
        assert_eq!(duration_from_ms(2_000.0).unwrap(), Duration::from_secs(2));
        for bad in [-0.5, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = duration_from_ms(bad).unwrap_err();
            assert!(e.to_string().starts_with("Event::elapsed_since: "), "{e}");
        }
    }
}
