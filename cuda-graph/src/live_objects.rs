//! Counts of the CUDA objects this crate holds, for leak tests: each owning value carries a
//! [`Tracked`] field, counted up when made and down when dropped.

use std::fmt;
use std::sync::atomic::{AtomicIsize, Ordering};

/// The kinds of object counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Context,
    Stream,
    Event,
    Module,
    Graph,
    ExecGraph,
    GraphAllocation,
    MemPool,
    DeviceBuffer,
    StreamAllocation,
    PinnedBuffer,
    ManagedBuffer,
}

const KINDS: usize = 12;
static LIVE: [AtomicIsize; KINDS] = [const { AtomicIsize::new(0) }; KINDS];

/// A field that counts its owner as live.
#[derive(Debug)]
pub(crate) struct Tracked(Kind);

impl Tracked {
    pub(crate) fn new(kind: Kind) -> Tracked {
        LIVE[kind as usize].fetch_add(1, Ordering::Relaxed);
        Tracked(kind)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        LIVE[self.0 as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

/// How many objects of each kind this crate holds right now, process-wide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveObjects {
    /// Retained primary contexts (one per live [`Device`](crate::Device) family).
    pub contexts: isize,
    /// Owned streams.
    pub streams: isize,
    /// Events.
    pub events: isize,
    /// Loaded modules.
    pub modules: isize,
    /// Graphs.
    pub graphs: isize,
    /// Executable graphs.
    pub exec_graphs: isize,
    /// Graph allocation handles' shared state (one per allocation).
    pub graph_allocations: isize,
    /// Memory pools.
    pub mem_pools: isize,
    /// Device buffers.
    pub device_buffers: isize,
    /// Stream-ordered allocations.
    pub stream_allocations: isize,
    /// Page-locked host buffers ([`PinnedBuffer`](crate::PinnedBuffer)s' memory).
    pub pinned_buffers: isize,
    /// Managed buffers ([`ManagedBuffer`](crate::ManagedBuffer)s' memory).
    pub managed_buffers: isize,
}

impl LiveObjects {
    /// The sum over all kinds.
    #[must_use]
    pub fn total(&self) -> isize {
        self.contexts
            + self.streams
            + self.events
            + self.modules
            + self.graphs
            + self.exec_graphs
            + self.graph_allocations
            + self.mem_pools
            + self.device_buffers
            + self.stream_allocations
            + self.pinned_buffers
            + self.managed_buffers
    }
}

impl fmt::Display for LiveObjects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} live: {} contexts, {} streams, {} events, {} modules, {} graphs, {} executable graphs, {} graph allocations, {} pools, {} buffers, {} stream allocations, {} pinned buffers, {} managed buffers",
            self.total(),
            self.contexts,
            self.streams,
            self.events,
            self.modules,
            self.graphs,
            self.exec_graphs,
            self.graph_allocations,
            self.mem_pools,
            self.device_buffers,
            self.stream_allocations,
            self.pinned_buffers,
            self.managed_buffers
        )
    }
}

/// The CUDA objects this crate holds now (every thread), by kind.
#[must_use]
pub fn live_objects() -> LiveObjects {
    let get = |k: Kind| LIVE[k as usize].load(Ordering::Relaxed);
    LiveObjects {
        contexts: get(Kind::Context),
        streams: get(Kind::Stream),
        events: get(Kind::Event),
        modules: get(Kind::Module),
        graphs: get(Kind::Graph),
        exec_graphs: get(Kind::ExecGraph),
        graph_allocations: get(Kind::GraphAllocation),
        mem_pools: get(Kind::MemPool),
        device_buffers: get(Kind::DeviceBuffer),
        stream_allocations: get(Kind::StreamAllocation),
        pinned_buffers: get(Kind::PinnedBuffer),
        managed_buffers: get(Kind::ManagedBuffer),
    }
}
