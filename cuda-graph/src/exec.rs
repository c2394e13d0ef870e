//! Executable graphs: instantiate (with the lifetime checks), upload, launch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::alloc::GraphAllocation;
use crate::check::Roles;
use crate::device::Device;
use crate::error::{Error, Result, check};
use crate::event::{Event, EventFlags};
use crate::graph::{Graph, Keep};
use crate::stream::AsStream;
use crate::sys;

/// Instantiation flags (`CUgraphInstantiate_flags`), a bit-set:
/// `InstantiateFlags::AUTO_FREE_ON_LAUNCH | InstantiateFlags::UPLOAD`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InstantiateFlags(u64);

impl InstantiateFlags {
    /// No flags.
    pub const NONE: InstantiateFlags = InstantiateFlags(0);
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: each launch first frees the
    /// allocations the previous launch left live (G.3.4).
    pub const AUTO_FREE_ON_LAUNCH: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0 as u64,
    );
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: upload as part of instantiation, into the stream
    /// given to [`Graph::instantiate_and_upload`].
    pub const UPLOAD: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64,
    );
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: launchable from the device.
    pub const DEVICE_LAUNCH: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH.0 as u64,
    );
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`: honour per-node priorities.
    pub const USE_NODE_PRIORITY: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY.0 as u64,
    );

    /// The raw bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: InstantiateFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for InstantiateFlags {
    type Output = InstantiateFlags;
    fn bitor(self, rhs: InstantiateFlags) -> InstantiateFlags {
        InstantiateFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for InstantiateFlags {
    fn bitor_assign(&mut self, rhs: InstantiateFlags) {
        self.0 |= rhs.0;
    }
}

impl Graph {
    /// Checks the lifetime rules ([`crate::check`]) and instantiates (`cuGraphInstantiateWithFlags`).
    pub fn instantiate(&self, flags: InstantiateFlags) -> Result<ExecGraph> {
        let roles = self.checked_roles()?;
        self.instantiate_raw(flags, std::ptr::null_mut(), roles)
    }

    /// As [`instantiate`](Graph::instantiate), and uploads into `stream` as part of it
    /// (adds [`InstantiateFlags::UPLOAD`]).
    pub fn instantiate_and_upload(
        &self,
        flags: InstantiateFlags,
        stream: &impl AsStream,
    ) -> Result<ExecGraph> {
        let roles = self.checked_roles()?;
        self.instantiate_raw(
            flags | InstantiateFlags::UPLOAD,
            stream.as_raw_stream(),
            roles,
        )
    }

    /// Instantiates without the lifetime checks: for those who measured that they need it.
    /// A graph that breaks the rules then reads or writes other allocations' data.
    pub fn instantiate_unchecked(&self, flags: InstantiateFlags) -> Result<ExecGraph> {
        self.instantiate_raw(flags, std::ptr::null_mut(), self.roles())
    }

    fn instantiate_raw(
        &self,
        flags: InstantiateFlags,
        upload: sys::CUstream,
        roles: Roles,
    ) -> Result<ExecGraph> {
        const CALL: &str = "Graph::instantiate";
        let memory_nodes = self.has_memory_nodes();
        if memory_nodes && self.instantiated.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(
                CALL,
                "the graph has memory nodes and an executable graph of it still exists; CUDA allows one instantiation at a time (drop the ExecGraph first)",
            ));
        }
        let release = |e| {
            if memory_nodes {
                self.instantiated.store(false, Ordering::Release);
            }
            e
        };
        let Roles {
            unfreed,
            foreign_frees,
            foreign_uses,
        } = roles;
        // Created before the executable graph, so that a failure here leaks nothing.
        let launch_event = if unfreed.is_empty() && foreign_uses.is_empty() {
            None
        } else {
            Some(Event::with_flags(&self.device, EventFlags::DISABLE_TIMING).map_err(release)?)
        };
        self.device.bind().map_err(release)?;
        let mut raw = std::ptr::null_mut();
        if upload.is_null() && !flags.contains(InstantiateFlags::UPLOAD) {
            // The common path: WithFlags measured cheaper than WithParams on the H200.
            check(
                // SAFETY: out-pointer valid; the graph is live.
                unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, flags.bits()) },
                "cuGraphInstantiateWithFlags",
            )
            .map_err(release)?;
        } else {
            let mut params = sys::CUDA_GRAPH_INSTANTIATE_PARAMS {
                flags: flags.bits(),
                hUploadStream: upload,
                ..Default::default()
            };
            check(
                // SAFETY: out-pointers valid; the graph and the upload stream are live.
                unsafe { sys::cuGraphInstantiateWithParams(&mut raw, self.raw, &mut params) },
                "cuGraphInstantiateWithParams",
            )
            .map_err(release)?;
        }
        Ok(ExecGraph {
            raw,
            device: self.device.clone(),
            flags,
            unfreed,
            foreign_frees,
            foreign_uses,
            launch_event,
            _keep: self.keep.clone(),
            instantiated: memory_nodes.then(|| self.instantiated.clone()),
            _tracked: crate::track::Tracked::new(crate::track::Kind::ExecGraph),
        })
    }
}

/// An executable graph (`CUgraphExec`), destroyed on drop.
///
/// `Send` but not `Sync`: CUDA does not allow launching one executable graph from two threads
/// at once, so sharing one between threads takes a `Mutex`, which the compiler then requires.
pub struct ExecGraph {
    raw: sys::CUgraphExec,
    device: Device,
    flags: InstantiateFlags,
    /// Allocated by this graph and not freed in it: live after a launch.
    unfreed: Vec<GraphAllocation>,
    /// Allocated elsewhere and freed by this graph.
    foreign_frees: Vec<GraphAllocation>,
    /// Allocated elsewhere, used (not freed) by this graph.
    foreign_uses: Vec<GraphAllocation>,
    /// Recorded after each launch when `unfreed` or `foreign_uses` is not empty: the RAII free
    /// of those allocations waits for it.
    launch_event: Option<Event>,
    _keep: Vec<Keep>,
    instantiated: Option<Arc<AtomicBool>>,
    _tracked: crate::track::Tracked,
}

// SAFETY: an executable graph may be launched or destroyed from any thread, one at a time;
// `ExecGraph` is not `Sync`, so it is never used from two threads at once.
unsafe impl Send for ExecGraph {}

impl std::fmt::Debug for ExecGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecGraph")
            .field("flags", &self.flags)
            .field("unfreed", &self.unfreed)
            .field("foreign_frees", &self.foreign_frees)
            .finish()
    }
}

impl ExecGraph {
    /// Launches the graph on `stream` (`cuGraphLaunch`).
    ///
    /// Refused before the driver is called when a previous launch left allocations live and the
    /// graph was instantiated without AutoFreeOnLaunch ([`Error::UnfreedOnRelaunch`]), or when a
    /// free node of this graph names an allocation that is not live.
    #[inline]
    pub fn launch(&self, stream: &impl AsStream) -> Result<()> {
        if self.unfreed.is_empty() && self.foreign_frees.is_empty() && self.foreign_uses.is_empty()
        {
            // Special streams (per-thread, legacy) need the context current.
            self.device.bind()?;
            return check(
                // SAFETY: both handles are live.
                unsafe { sys::cuGraphLaunch(self.raw, stream.as_raw_stream()) },
                "cuGraphLaunch",
            );
        }
        self.launch_with_allocations(stream)
    }

    fn launch_with_allocations(&self, stream: &impl AsStream) -> Result<()> {
        if !self.flags.contains(InstantiateFlags::AUTO_FREE_ON_LAUNCH) {
            let live: Vec<String> = self
                .unfreed
                .iter()
                .filter(|a| a.is_live())
                .map(|a| a.to_string())
                .collect();
            if !live.is_empty() {
                return Err(Error::UnfreedOnRelaunch { allocations: live });
            }
        }
        if let Some(dead) = self.foreign_frees.iter().find(|a| !a.is_live()) {
            return Err(Error::invalid(
                "cuGraphLaunch",
                format!(
                    "the graph frees {dead}, which is not live (not yet allocated by a launch of its graph, or already freed)"
                ),
            ));
        }
        if let Some(dead) = self.foreign_uses.iter().find(|a| !a.is_live()) {
            return Err(Error::invalid(
                "cuGraphLaunch",
                format!(
                    "the graph uses {dead}, which is not live (not yet allocated by a launch of its graph, or already freed)"
                ),
            ));
        }
        self.device.bind()?;
        check(
            // SAFETY: both handles are live.
            unsafe { sys::cuGraphLaunch(self.raw, stream.as_raw_stream()) },
            "cuGraphLaunch",
        )?;
        if let Some(event) = &self.launch_event {
            event.record(stream)?;
            for allocation in &self.unfreed {
                allocation.mark_allocated(stream.as_raw_stream(), event);
            }
            for allocation in &self.foreign_uses {
                allocation.note_launch_use(stream.as_raw_stream(), event);
            }
        }
        for allocation in &self.foreign_frees {
            allocation.mark_freed();
        }
        Ok(())
    }

    /// Maps the graph's memory and uploads it into `stream` ahead of the launch
    /// (`cuGraphUpload`, G.5.1).
    pub fn upload(&self, stream: &impl AsStream) -> Result<()> {
        self.device.bind()?;
        check(
            // SAFETY: both handles are live.
            unsafe { sys::cuGraphUpload(self.raw, stream.as_raw_stream()) },
            "cuGraphUpload",
        )
    }

    /// The flags it was instantiated with.
    pub fn flags(&self) -> InstantiateFlags {
        self.flags
    }

    /// The allocations this graph leaves live after a launch (not freed in the graph).
    pub fn unfreed_allocations(&self) -> &[GraphAllocation] {
        &self.unfreed
    }

    /// The raw handle.
    pub fn as_raw(&self) -> sys::CUgraphExec {
        self.raw
    }
}

impl Drop for ExecGraph {
    fn drop(&mut self) {
        // SAFETY: owned and destroyed once; live allocations stay live (their handles free them).
        let _ = unsafe { sys::cuGraphExecDestroy(self.raw) };
        if let Some(flag) = &self.instantiated {
            flag.store(false, Ordering::Release);
        }
    }
}
