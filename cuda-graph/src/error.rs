//! The error type of the safe layer: CUDA's code with its name and text, and what we were doing;
//! our own checks of graph-allocation lifetimes are variants of it too.

use std::ffi::CStr;
use std::fmt;

use crate::sys;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the safe layer can fail with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A driver call returned an error code.
    Driver(DriverError),
    /// A graph breaks a rule of graph-allocation lifetimes (see [`crate::check`]).
    Lifetime(crate::lifetime_error::LifetimeError),
    /// Relaunching an executable graph that still owns allocations it did not free, instantiated
    /// without AutoFreeOnLaunch: CUDA would refuse, and the memory would leak.
    UnfreedOnRelaunch {
        /// The allocations still live from the previous launch.
        allocations: Vec<AllocationRef>,
    },
    /// The operation needs a live graph allocation (allocated by a launch of its graph, not yet
    /// freed), and `allocation` is not: freeing it, launching work that uses or frees it.
    NotLive {
        /// The operation.
        call: &'static str,
        /// The allocation.
        allocation: AllocationRef,
    },
    /// A graph is instantiated again while `allocation`, which a launch of it made, is still
    /// live: its alloc node's address is fixed for the life of the graph, so a second executable
    /// graph would map it again while the first mapping is in use.
    StillLive {
        /// The operation.
        call: &'static str,
        /// The allocation.
        allocation: AllocationRef,
    },
    /// The graph has memory nodes and an executable graph of it still exists: CUDA allows one
    /// instantiation of such a graph at a time.
    AlreadyInstantiated {
        /// The operation.
        call: &'static str,
    },
    /// The operation is refused on a stream that is capturing: it would be captured where the
    /// crate cannot record it, or break the capture. `instead` says what to call.
    Capturing {
        /// The operation.
        call: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// The stream is not part of this capture (it was not forked into it): the work would run
    /// now, on addresses that exist only in the captured graph.
    NotInCapture {
        /// The operation.
        call: &'static str,
    },
    /// The nodes of a capture on an owned [`Stream`](crate::Stream) could not be matched to
    /// the calls that captured them. Such a capture tells its nodes apart by the order in which
    /// the driver lists them, which is the order captured ([`Capture`](crate::Capture)); here
    /// the graph holds nodes the crate did not capture (`found` ≠ `captured`: work was queued
    /// on a capturing stream through its raw handle), or the driver listed them in another
    /// order (the capturing stream's last dependencies, or the edges between consecutive calls
    /// on a stream, are not the nodes the order gives). The graph cannot
    /// be checked, and is destroyed. A capture begun on a
    /// [`BorrowedStream`](crate::BorrowedStream) (`stream.borrow()`) asks the driver for the node
    /// of each call, and lets other code add nodes.
    CaptureNotMatched {
        /// The operation.
        call: &'static str,
        /// The nodes the crate captured.
        captured: usize,
        /// The nodes of the captured graph.
        found: usize,
    },
    /// A call of a capture that asks the driver for each call's node (on a
    /// [`BorrowedStream`](crate::BorrowedStream)) captured work that uses graph allocations,
    /// but its node could not be told: the driver's query failed, or the stream reported no
    /// node (other code changed its dependencies). The node's uses cannot be recorded, so the
    /// graph cannot be checked; [`Capture::end`](crate::Capture::end) destroys it.
    CaptureNodeUnknown {
        /// The operation.
        call: &'static str,
    },
    /// CUDA was called from a host node's function, where CUDA must not be called.
    InHostFunction {
        /// The operation.
        call: &'static str,
    },
    /// A stream was dropped while a capture begun on it was still open (its
    /// [`Capture`](crate::Capture) guard was forgotten): the capture was ended and its graph
    /// discarded. Recorded in [`Device::drop_errors`](crate::Device::drop_errors).
    CaptureLeftOpen,
    /// A value dropped by a deferred release panicked in its `Drop` (for example a host
    /// closure's captured state); the panic was caught so that the other releases run.
    /// Recorded in [`Device::drop_errors`](crate::Device::drop_errors).
    ReleasePanicked(String),
    /// An update of an executable graph ([`ExecGraph::update`](crate::ExecGraph::update)) was
    /// refused, by the driver (`cuGraphExecUpdate`) or by the crate before it; the executable
    /// graph is unchanged.
    UpdateRefused {
        /// Why.
        reason: UpdateRefusal,
        /// The position of the new graph's node that the refusal names
        /// ([`Graph::nodes`](crate::Graph::nodes)), if one is named.
        node: Option<usize>,
    },
    /// Work on some memory was queued (by `queued_by`) but could neither be marked with an event
    /// (its record failed) nor waited for (a capture of this crate forbade the synchronize, or
    /// it failed): the crate cannot tell when that work ends, so it orders no free and no
    /// further use after it, and keeps the memory, and what the work refers to, for the rest
    /// of the process. Returned by later frees and uses; recorded in
    /// [`Device::drop_errors`](crate::Device::drop_errors) where a drop meets it.
    InDoubt {
        /// The operation that queued the work.
        queued_by: &'static str,
    },
    /// GPU work on a [`PinnedBuffer`](crate::PinnedBuffer) or a
    /// [`ManagedBuffer`](crate::ManagedBuffer) (stream work that names it, the launch of a
    /// graph whose nodes use it) is refused while the host holds a view of it
    /// ([`HostBuffer::as_slice`](crate::HostBuffer::as_slice) or
    /// [`as_mut_slice`](crate::HostBuffer::as_mut_slice)): the GPU would read or write memory
    /// that Rust code is reading or writing. Nothing was queued; drop the view first.
    InUseByHost {
        /// The operation.
        call: &'static str,
    },
    /// An argument the safe layer rejects before calling CUDA.
    InvalidArgument {
        /// The operation.
        call: &'static str,
        /// What is wrong with the argument.
        reason: String,
    },
}

impl Error {
    /// The CUDA code when this is a driver error.
    #[must_use]
    pub fn code(&self) -> Option<sys::CUresult> {
        match self {
            Error::Driver(e) => Some(e.code),
            _ => None,
        }
    }

    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            call,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Driver(e) => e.fmt(f),
            Error::Lifetime(e) => e.fmt(f),
            Error::UnfreedOnRelaunch { allocations } => write!(
                f,
                "cannot relaunch: the previous launch's allocation{} {} {} not been freed; free {} (free_async, or a free node in another graph) or instantiate with InstantiateFlags::AUTO_FREE_ON_LAUNCH",
                if allocations.len() == 1 { "" } else { "s" },
                allocations
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                if allocations.len() == 1 {
                    "has"
                } else {
                    "have"
                },
                if allocations.len() == 1 { "it" } else { "them" },
            ),
            Error::CaptureLeftOpen => f.write_str(
                "a stream was dropped while a capture begun on it was open (its Capture guard was forgotten); the capture was ended and its graph discarded",
            ),
            Error::ReleasePanicked(what) => {
                write!(f, "a value dropped by a deferred release panicked: {what}")
            }
            Error::InvalidArgument { call, reason } => write!(f, "{call}: {reason}"),
            Error::NotLive { call, allocation } => write!(
                f,
                "{call}: {allocation} is not live: no launch of its graph has allocated it yet, or it was already freed"
            ),
            Error::StillLive { call, allocation } => write!(
                f,
                "{call}: {allocation} of this graph is still live from an earlier launch; free it (free_async, or a free node in another graph) before instantiating the graph again"
            ),
            Error::AlreadyInstantiated { call } => write!(
                f,
                "{call}: the graph has memory nodes and an executable graph of it still exists; CUDA allows one instantiation at a time (drop the ExecGraph first)"
            ),
            Error::Capturing { call, instead } => {
                write!(f, "{call}: the stream is capturing; {instead}")
            }
            Error::NotInCapture { call } => write!(
                f,
                "{call}: the stream is not capturing into this capture; fork it from the capturing stream first (Capture::fork)"
            ),
            Error::InHostFunction { call } => write!(
                f,
                "{call}: called from a host node's function, where CUDA must not be called"
            ),
            Error::CaptureNodeUnknown { call } => write!(
                f,
                "{call}: a captured call that uses graph allocations could not tell its node (the driver's query failed, or the stream reported none), so its uses cannot be checked; the captured graph is destroyed"
            ),
            Error::CaptureNotMatched {
                call,
                captured,
                found,
            } => {
                if captured == found {
                    write!(
                        f,
                        "{call}: the driver listed the captured graph's {found} nodes in another order than captured, so they cannot be matched to the calls; begin the capture on stream.borrow(), which asks the driver for each call's node"
                    )
                } else {
                    write!(
                        f,
                        "{call}: the captured graph holds {found} nodes, but the crate captured {captured}: other code queued work on a capturing owned Stream through its raw handle; begin the capture on stream.borrow() to let it"
                    )
                }
            }
            Error::InUseByHost { call } => write!(
                f,
                "{call}: a pinned or managed buffer it reads or writes is borrowed by the host (an as_slice or as_mut_slice view of it is alive); nothing was queued"
            ),
            Error::InDoubt { queued_by } => write!(
                f,
                "{queued_by}: the work it queued could neither be marked with an event nor waited for; the memory it uses is kept, and no free or use is ordered after it"
            ),
            Error::UpdateRefused { reason, node } => {
                write!(f, "ExecGraph::update: {reason}")?;
                match node {
                    Some(i) => write!(f, "; at node {i} of the new graph"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Why an executable graph could not be updated from a graph ([`Error::UpdateRefused`]): the
/// driver's `CUgraphExecUpdateResult`, and the crate's own refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UpdateRefusal {
    /// The crate's: the executable graph or the new graph has memory nodes. An alloc node's
    /// address is fixed for the life of its graph (G.3.1), so the new graph's nodes would use
    /// addresses that the executable graph does not map.
    MemoryNodes,
    /// The crate's: the new graph belongs to another device.
    OtherDevice,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`: other nodes or edges.
    TopologyChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED`.
    NodeTypeChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED`: a kernel's function changed context.
    FunctionChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE`.
    UnsupportedFunctionChange,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED`: a node's parameters changed in a way
    /// that cannot be updated (a memcpy's memory type, a 2-D memset's shape, ...).
    ParametersChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED`.
    AttributesChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED`: something about a node cannot be updated.
    NotSupported,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR`, or a result this version of the crate does not know.
    Other,
}

impl UpdateRefusal {
    pub(crate) fn from_raw(result: sys::CUgraphExecUpdateResult) -> UpdateRefusal {
        use sys::CUgraphExecUpdateResult as R;
        match result {
            R::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED => UpdateRefusal::TopologyChanged,
            R::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED => UpdateRefusal::NodeTypeChanged,
            R::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED => UpdateRefusal::FunctionChanged,
            R::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE => {
                UpdateRefusal::UnsupportedFunctionChange
            }
            R::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED => UpdateRefusal::ParametersChanged,
            R::CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED => UpdateRefusal::AttributesChanged,
            R::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED => UpdateRefusal::NotSupported,
            _ => UpdateRefusal::Other,
        }
    }
}

impl fmt::Display for UpdateRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpdateRefusal::MemoryNodes => {
                "a graph has memory nodes, whose addresses are fixed for the life of their graph (instantiate the new graph instead)"
            }
            UpdateRefusal::OtherDevice => "the new graph belongs to another device",
            UpdateRefusal::TopologyChanged => "the topology changed (CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED)",
            UpdateRefusal::NodeTypeChanged => "a node's type changed (CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED)",
            UpdateRefusal::FunctionChanged => "a kernel's function changed (CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED)",
            UpdateRefusal::UnsupportedFunctionChange => "a kernel's function changed in an unsupported way (CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE)",
            UpdateRefusal::ParametersChanged => "a node's parameters changed in an unsupported way (CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED)",
            UpdateRefusal::AttributesChanged => "a node's attributes changed in an unsupported way (CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED)",
            UpdateRefusal::NotSupported => "a node cannot be updated (CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED)",
            UpdateRefusal::Other => "the driver refused the update (CU_GRAPH_EXEC_UPDATE_ERROR)",
        })
    }
}

/// A graph allocation as an error names it: its id ([`GraphAllocation::id`]), address, size
/// and label. A description, not a handle: an error held on to keeps no memory alive. Compare
/// with an allocation through [`GraphAllocation::id`].
///
/// [`GraphAllocation::id`]: crate::GraphAllocation::id
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct AllocationRef {
    /// Its id, unique in the process.
    pub id: u64,
    /// Its fixed address.
    pub address: sys::CUdeviceptr,
    /// Its size in bytes.
    pub bytes: usize,
    /// Its label ([`AllocParams::label`](crate::AllocParams::label)), if any.
    pub label: Option<String>,
}

impl fmt::Display for AllocationRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "allocation '{label}'"),
            None => write!(
                f,
                "allocation #{} ({} at {:#x})",
                self.id,
                crate::bytes::Bytes(self.bytes as u64),
                self.address
            ),
        }
    }
}

/// No variant has a `source()`: each `Display` is complete on its own (a driver error names the
/// call, the code and, when the driver could not be reached, the loader's explanation, which is
/// also in [`DriverError::load`]), so `{}` alone is informative and a chain printed with `{:#}`
/// (anyhow) says nothing twice.
impl std::error::Error for Error {}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        Error::Driver(e)
    }
}

/// A driver call that failed: which call, CUDA's code, its name and text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverError {
    /// The driver function (`"cuGraphInstantiateWithFlags"`).
    pub call: &'static str,
    /// The code it returned.
    pub code: sys::CUresult,
    /// Why the driver could not be reached, when that is the cause (`Display` includes it).
    pub load: Option<sys::loader::LoadError>,
}

impl DriverError {
    /// The code's C name (`"CUDA_ERROR_INVALID_VALUE"`), or `"CUDA_ERROR_<n>"` for one the
    /// headers do not know.
    #[must_use]
    pub fn name(&self) -> String {
        self.code
            .name()
            .map(str::to_string)
            .unwrap_or_else(|| format!("CUDA_ERROR_{}", self.code.0))
    }

    /// The driver's description of the code (`"invalid argument"`), when the driver can say.
    #[must_use]
    pub fn text(&self) -> Option<String> {
        let mut text = std::ptr::null();
        // SAFETY: `text` is a valid out-pointer; the driver stores a static string or nothing.
        let status = unsafe { sys::cuGetErrorString(self.code, &mut text) };
        if status != sys::CUresult::CUDA_SUCCESS || text.is_null() {
            return None;
        }
        Some(
            // SAFETY: on success the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.name())?;
        if let Some(load) = &self.load {
            write!(f, ": {load}")
        } else if let Some(text) = self.text() {
            write!(f, ": {text}")
        } else {
            Ok(())
        }
    }
}

/// No `source()`, for the same reason as [`Error`]'s: the loader's explanation is part of the
/// `Display` text already.
impl std::error::Error for DriverError {}

/// Turns a driver status into a `Result`, naming the call. Calls written out are checked with
/// [`driver!`], which names the call from the code; `check` itself remains for a status kept
/// to be looked at first, and for the calls reported under another name than their function's.
#[inline]
pub(crate) fn check(code: sys::CUresult, call: &'static str) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(failure(code, call))
    }
}

#[cold]
#[inline(never)]
fn failure(code: sys::CUresult, call: &'static str) -> Error {
    let load = matches!(
        code,
        sys::CUresult::CUDA_ERROR_NO_DEVICE | sys::CUresult::CUDA_ERROR_NOT_FOUND
    )
    .then(sys::loader::driver_load_error)
    .flatten();
    Error::Driver(DriverError { call, code, load })
}

/// A driver call checked with [`check`], its name taken from the code:
/// `driver!(unsafe { sys::cuStreamSynchronize(stream) })` is
/// `check(unsafe { sys::cuStreamSynchronize(stream) }, "cuStreamSynchronize")`, a `Result<()>`
/// whose error names `cuStreamSynchronize`.
///
/// The argument is the `unsafe` block, written by the caller: one call of a function by its path
/// (`sys::cuX(..)`), nothing else. Its tokens are passed through unchanged, so the block keeps the
/// caller's span and the `// SAFETY:` comment on the line above it counts for it (clippy's
/// `undocumented_unsafe_blocks`), and the macro makes no unsafe block of its own.
macro_rules! driver {
    // The name: the last segment of the called path.
    (@name unsafe { $segment:ident :: $($rest:tt)+ }) => {
        $crate::error::driver!(@name unsafe { $($rest)+ })
    };
    (@name unsafe { $function:ident ( $($args:tt)* ) }) => {
        stringify!($function)
    };
    ($unsafe:tt $block:tt) => {
        $crate::error::check($unsafe $block, $crate::error::driver!(@name $unsafe $block))
    };
}
pub(crate) use driver;

#[cfg(test)]
mod tests {
    use super::{DriverError, Error};
    use crate::sys;

    /// Stands in for a driver function: returns the code it is given.
    unsafe fn fake_call(code: sys::CUresult) -> sys::CUresult {
        code
    }

    #[test]
    fn driver_names_the_function_it_calls() {
        // SAFETY: `fake_call` has no precondition.
        let succeeded = driver!(unsafe { fake_call(sys::CUresult::CUDA_SUCCESS) });
        assert_eq!(succeeded, Ok(()));
        let code = sys::CUresult::CUDA_ERROR_INVALID_VALUE;
        let expected = Err(Error::Driver(DriverError {
            call: "fake_call",
            code,
            load: None,
        }));
        // SAFETY: as above.
        let failed = driver!(unsafe { fake_call(code) });
        assert_eq!(failed, expected);
        // SAFETY: as above; a path of several segments is named by its last.
        let failed = driver!(unsafe { self::fake_call(code) });
        assert_eq!(failed, expected);
        let name = driver!(@name unsafe { crate::sys::cuStreamSynchronize(std::ptr::null_mut()) });
        assert_eq!(name, "cuStreamSynchronize");
    }
}

#[cfg(test)]
mod display_tests {
    use super::*;
    use crate::lifetime_error::LifetimeError;

    /// One error of every variant, built without a driver.
    fn every_variant() -> Vec<Error> {
        let driver = |call, code, load| Error::Driver(DriverError { call, code, load });
        let labelled = AllocationRef {
            id: 1,
            address: 0x7f00_0000_0000,
            bytes: 1 << 20,
            label: Some("a".into()),
        };
        let unlabelled = AllocationRef {
            id: 2,
            address: 0x7f00_0010_0000,
            bytes: 1 << 20,
            label: None,
        };
        vec![
            driver(
                "cuInit",
                sys::CUresult::CUDA_ERROR_NO_DEVICE,
                Some(sys::loader::LoadError::LibraryNotFound {
                    library: "libcuda.so.1".into(),
                    reason: "libcuda.so.1: cannot open shared object file".into(),
                }),
            ),
            driver(
                "cuGraphLaunch",
                sys::CUresult::CUDA_ERROR_INVALID_VALUE,
                None,
            ),
            Error::Lifetime(LifetimeError {
                violations: Vec::new(),
            }),
            Error::UnfreedOnRelaunch {
                allocations: vec![labelled.clone(), unlabelled.clone()],
            },
            Error::CaptureLeftOpen,
            Error::ReleasePanicked("boom".into()),
            Error::invalid("Graph::node", "node 3 belongs to another graph"),
            Error::NotLive {
                call: "GraphAllocation::free_async",
                allocation: unlabelled.clone(),
            },
            Error::StillLive {
                call: "Graph::instantiate",
                allocation: labelled,
            },
            Error::AlreadyInstantiated {
                call: "Graph::instantiate",
            },
            Error::Capturing {
                call: "Function::launch",
                instead: "launch through Capture::launch",
            },
            Error::NotInCapture {
                call: "Capture::join",
            },
            Error::InHostFunction {
                call: "Device::bind",
            },
            Error::InDoubt {
                queued_by: "ExecGraph::launch",
            },
            Error::CaptureNotMatched {
                call: "Capture::end",
                captured: 3,
                found: 4,
            },
            Error::CaptureNodeUnknown {
                call: "Capture::end",
            },
            Error::UpdateRefused {
                reason: UpdateRefusal::ParametersChanged,
                node: Some(4),
            },
        ]
    }

    #[test]
    fn display_names_the_call_and_the_code() {
        let e = &every_variant()[0];
        let text = e.to_string();
        assert!(
            text.starts_with("cuInit failed: CUDA_ERROR_NO_DEVICE"),
            "{text}"
        );
        assert!(text.contains("libcuda.so.1 could not be loaded"), "{text}");
        let text = every_variant()[1].to_string();
        assert!(
            text.starts_with("cuGraphLaunch failed: CUDA_ERROR_INVALID_VALUE"),
            "{text}"
        );
    }

    /// Each state error names its operation, and the allocation where it carries one (by label,
    /// or by id, size and address).
    #[test]
    fn state_errors_name_the_call_and_the_allocation() {
        for e in every_variant().into_iter().skip(7) {
            let text = e.to_string();
            let call = match &e {
                Error::NotLive { call, .. }
                | Error::StillLive { call, .. }
                | Error::AlreadyInstantiated { call }
                | Error::Capturing { call, .. }
                | Error::NotInCapture { call }
                | Error::InHostFunction { call }
                | Error::CaptureNotMatched { call, .. }
                | Error::CaptureNodeUnknown { call }
                | Error::InDoubt { queued_by: call } => *call,
                Error::UpdateRefused { .. } => "ExecGraph::update",
                other => panic!("not a state error: {other:?}"),
            };
            assert!(text.starts_with(&format!("{call}: ")), "{text}");
            assert_eq!(e.code(), None, "{text}");
        }
        let all = every_variant();
        let text = |i: usize| all[i].to_string();
        assert!(
            text(7).contains("allocation #2 (1.0 MiB at 0x7f0000100000) is not live"),
            "{}",
            text(7)
        );
        assert!(
            text(8).contains("allocation 'a' of this graph is still live"),
            "{}",
            text(8)
        );
        assert!(
            text(3).contains("allocation 'a', allocation #2 (1.0 MiB"),
            "{}",
            text(3)
        );
    }

    #[test]
    fn an_error_chain_says_nothing_twice() {
        for e in every_variant() {
            let plain = e.to_string();
            // Every level of the chain, outermost first.
            let mut levels = vec![plain.clone()];
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                levels.push(s.to_string());
                source = s.source();
            }
            let alternate = format!("{:#}", anyhow::Error::from(e));
            for level in &levels {
                assert_eq!(
                    alternate.matches(level.as_str()).count(),
                    1,
                    "{level:?} is printed more than once in {alternate:?}"
                );
            }
            for (i, outer) in levels.iter().enumerate() {
                for inner in &levels[i + 1..] {
                    assert!(
                        !outer.contains(inner.as_str()),
                        "{outer:?} repeats {inner:?}"
                    );
                }
            }
        }
    }
}
