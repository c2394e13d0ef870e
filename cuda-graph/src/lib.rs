//! Safe CUDA graphs with graph-owned memory.
//!
//! `cuda-graph` wraps the driver API's graph-memory machinery (the Programming Guide's "Graph
//! Memory Nodes"): alloc and free nodes, stream capture of `cuMemAllocAsync`/`cuMemFreeAsync`,
//! AutoFreeOnLaunch, upload, trim and the footprint attributes, and peer access. Every handle is
//! owned by a value whose `Drop` releases it; allocations that outlive their graph (G.3.3) are
//! owned values too, freed by you or, failing that, when the last handle that reaches them drops.
//! And what CUDA does not do: before instantiation, the builder's record of nodes, edges and
//! uses is checked against the lifetime rules of graph allocations ([`check`]).
//!
//! It needs only `libcuda.so.1` at run time, loaded when first used, and shares the primary
//! context with runtime-API code on the same device.
//!
//! # G.3.1: an explicit graph
//!
//! An alloc node, kernels `a`, `b`, `c` that use the allocation, and a free node after `b` and
//! `c`. Node `e` of the guide, which is not ordered after the alloc node, is refused at
//! instantiation with an error that names it.
//!
//! ```no_run
//! use cuda_graph::{AllocParams, AsStream, Device, DeviceBuffer, Graph, InstantiateFlags};
//! use cuda_graph::{KernelArgs, LaunchConfig, Module, Stream};
//!
//! # fn main() -> cuda_graph::Result<()> {
//! let device = Device::get(0)?;
//! let module = Module::from_ptx(&device, cuda_graph::kernels::PTX)?;
//! let (iota, copy) = (module.function("iota_u32")?, module.function("copy_u32")?);
//! let n: u64 = 1 << 20;
//! let config = LaunchConfig::for_elements(n, 256);
//! let (out_b, out_c) = (DeviceBuffer::<u32>::zeroed(&device, n as usize)?, DeviceBuffer::<u32>::zeroed(&device, n as usize)?);
//!
//! let mut graph = Graph::new(&device)?;
//! let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(&device, n as usize * 4))?;
//! // SAFETY: iota_u32(unsigned* p, unsigned long long n, unsigned base);
//! // copy_u32(unsigned* dst, const unsigned* src, unsigned long long n).
//! let a = unsafe { graph.add_kernel_node(&[alloc], &iota, config, &KernelArgs::new().ptr(&buf).value(n).value(0u32))? };
//! let copy_to = |out| KernelArgs::new().ptr(out).ptr(&buf).value(n);
//! let b = unsafe { graph.add_kernel_node(&[a], &copy, config, &copy_to(&out_b))? };
//! let c = unsafe { graph.add_kernel_node(&[a], &copy, config, &copy_to(&out_c))? };
//! graph.add_mem_free_node(&[b, c], &buf)?;
//!
//! let exec = graph.instantiate(InstantiateFlags::NONE)?;
//! let stream = Stream::new(&device)?;
//! exec.launch(&stream)?;
//! stream.synchronize()?;
//! assert_eq!(out_b.to_vec()?[12345], 12345);
//!
//! // Node e: uses the allocation without depending on the alloc node.
//! let e = unsafe { graph.add_kernel_node(&[], &copy, config, &copy_to(&out_c))? };
//! graph.set_label(e, "e")?;
//! drop(exec);
//! let err = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
//! assert!(err.to_string().contains("node 'e'"));
//! # Ok(()) }
//! ```
//!
//! # G.3.2: stream capture with fork and join
//!
//! ```no_run
//! use cuda_graph::{capture, AsStream, CaptureMode, Device, DeviceBuffer, InstantiateFlags};
//! use cuda_graph::{KernelArgs, LaunchConfig, Module, Stream};
//!
//! # fn main() -> cuda_graph::Result<()> {
//! let device = Device::get(0)?;
//! let module = Module::from_ptx(&device, cuda_graph::kernels::PTX)?;
//! let (iota, copy) = (module.function("iota_u32")?, module.function("copy_u32")?);
//! let (stream1, stream2) = (Stream::new(&device)?, Stream::new(&device)?);
//! let n: u64 = 1 << 20;
//! let config = LaunchConfig::for_elements(n, 256);
//! let (out_b, out_c) = (DeviceBuffer::<u32>::zeroed(&device, n as usize)?, DeviceBuffer::<u32>::zeroed(&device, n as usize)?);
//!
//! let (graph, ()) = capture(&stream1, CaptureMode::Global, |cap| {
//!     let dptr = cap.malloc_async(n as usize * 4)?;
//!     let copy_to = |out| KernelArgs::new().ptr(out).ptr(&dptr).value(n);
//!     // SAFETY: iota_u32(unsigned* p, unsigned long long n, unsigned base);
//!     // copy_u32(unsigned* dst, const unsigned* src, unsigned long long n).
//!     unsafe { cap.launch(&iota, config, &KernelArgs::new().ptr(&dptr).value(n).value(0u32))? }; // A
//!     cap.fork(&stream2)?;                                                  // event1
//!     unsafe { cap.launch(&copy, config, &copy_to(&out_b))? };              // kernel B
//!     unsafe { cap.launch_on(&stream2, &copy, config, &copy_to(&out_c))? }; // kernel C
//!     cap.join(&stream2)?;                                        // event2
//!     cap.free_async(&dptr)                                       // after A, B and C
//! })?;
//! let exec = graph.instantiate(InstantiateFlags::NONE)?;
//! exec.launch(&stream1)?;
//! stream1.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! # Footprint
//!
//! [`Device::graph_mem_info`] returns the four graph-memory attributes as one value that prints
//! as `used 64.0 MiB (high 64.0 MiB), reserved 64.0 MiB (high 128.0 MiB)`;
//! [`Device::graph_mem_trim`] returns unused memory to the OS.

#![warn(missing_docs)]

pub use bytemuck;
pub use cuda_graph_sys as sys;

mod alloc;
mod capture;
pub mod check;
mod deferred;
mod device;
mod dot;
mod error;
mod event;
mod exec;
mod few;
mod graph;
mod graph_mem;
mod idmap;
pub mod kernels;
mod memory;
mod module;
mod pool;
mod stream;
mod stream_alloc;
mod track;
mod uses;

pub use alloc::{Access, AllocParams, GraphAllocation};
pub use capture::{Capture, CaptureMode, capture};
pub use deferred::{DropErrors, flush_deferred};
pub use device::{Device, device_count, init};
pub use error::{DriverError, Error, Result};
pub use event::{Event, EventFlags};
pub use exec::{ExecGraph, InstantiateFlags};
pub use few::Few;
pub use graph::{Graph, MemOp, Node, NodeKind, NodeRecord};
pub use graph_mem::{Bytes, GraphMemInfo};
pub use memory::{DeviceAddress, DeviceBuffer};
pub use module::{Function, KernelArgs, LaunchConfig, Module};
pub use pool::MemPool;
pub use stream::{AsStream, BorrowedStream, CaptureStatus, Stream, StreamFlags};
pub use stream_alloc::StreamAllocation;
pub use track::{LiveObjects, live_objects};
