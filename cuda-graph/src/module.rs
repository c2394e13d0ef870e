//! Modules (PTX or cubin), kernel functions, and kernel launches with typed argument lists.

use std::ffi::{CString, c_void};
use std::mem::MaybeUninit;
use std::sync::Arc;

use crate::alloc::GraphAllocation;
use crate::deferred;
use crate::device::Device;
use crate::error::{Error, Result, driver};
use crate::handle::Handle;
use crate::host_memory::HostMemory;
use crate::inline_list::Few;
use crate::keep::{Keep, KeepList};
use crate::memory::{DeviceAddress, Owner};
use crate::stream::{AsStream, CaptureStatus};
use crate::sys;

/// A loaded module (`cuModuleLoadData`), unloaded when the last [`Function`] of it drops.
#[derive(Debug, Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

#[derive(Debug)]
struct ModuleInner {
    raw: sys::CUmodule,
    device: Device,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: a module handle is usable from any thread; it is only read after loading.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        let raw = self.raw as usize;
        self.device.release(move |device| {
            // SAFETY: loaded in `Module::load`, unloaded once, when no Function, graph or
            // executable graph refers to it.
            let unloaded = driver!(unsafe { sys::cuModuleUnload(raw as sys::CUmodule) });
            device.record(unloaded);
            true
        });
    }
}

impl Module {
    /// Loads PTX text; the driver JIT-compiles it for the device.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Module::from_ptx` when `ptx` contains a NUL byte;
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuModuleLoadData` when the driver
    /// refuses the PTX (`CUDA_ERROR_INVALID_PTX`, or `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` for PTX
    /// newer than the driver, for two).
    pub fn from_ptx(device: &Device, ptx: &str) -> Result<Module> {
        let text = CString::new(ptx)
            .map_err(|_| Error::invalid("Module::from_ptx", "the PTX contains a NUL byte"))?;
        Module::load(device, text.as_ptr().cast())
    }

    /// Loads a cubin or fatbin image.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Module::from_cubin` when `image` is shorter than 16
    /// bytes; [`Device::bind`]'s errors; [`Error::Driver`] naming `cuModuleLoadData` when the
    /// driver refuses the image (`CUDA_ERROR_INVALID_IMAGE`, or `CUDA_ERROR_NO_BINARY_FOR_GPU` when
    /// it has no code for this device, for two).
    pub fn from_cubin(device: &Device, image: &[u8]) -> Result<Module> {
        if image.len() < 16 {
            return Err(Error::invalid(
                "Module::from_cubin",
                "the image is too short to be a cubin",
            ));
        }
        Module::load(device, image.as_ptr().cast())
    }

    fn load(device: &Device, image: *const c_void) -> Result<Module> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `image` points to a NUL-terminated PTX string or a complete cubin image that
        // outlives the call; the context is current.
        driver!(unsafe { sys::cuModuleLoadData(&mut raw, image) })?;
        Ok(Module {
            inner: Arc::new(ModuleInner {
                raw,
                device: device.clone(),
                _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::Module),
            }),
        })
    }

    /// The kernel `name` (an `extern "C"` name, or a mangled one).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Module::function` when `name` contains a NUL byte;
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuModuleGetFunction`, with
    /// `CUDA_ERROR_NOT_FOUND` when the module has no kernel of that name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let c_name = CString::new(name)
            .map_err(|_| Error::invalid("Module::function", "the name contains a NUL byte"))?;
        self.inner.device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the name is NUL-terminated; the module is loaded.
        driver!(unsafe { sys::cuModuleGetFunction(&mut raw, self.inner.raw, c_name.as_ptr()) })?;
        Ok(Function {
            raw,
            name: name.into(),
            module: self.clone(),
        })
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUmodule {
        self.inner.raw
    }

    /// The device the module is loaded on.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }
}

impl Handle for Module {
    type Raw = sys::CUmodule;

    fn as_raw(&self) -> sys::CUmodule {
        Module::as_raw(self)
    }
}

/// A kernel of a loaded module; keeps the module loaded, and so does every graph node and
/// executable graph that runs it.
#[derive(Debug, Clone)]
pub struct Function {
    raw: sys::CUfunction,
    name: Arc<str>,
    module: Module,
}

// SAFETY: a function handle is usable from any thread and never mutated.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// The kernel's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, shared (node records keep it without copying).
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }

    /// A value that keeps the module loaded.
    pub(crate) fn keep(&self) -> Keep {
        self.module.inner.clone() as Keep
    }

    /// Keeps the module loaded for as long as `list` and what it is shared with hold it.
    #[inline]
    pub(crate) fn keep_in(&self, list: &mut KeepList) {
        list.push_arc(&self.module.inner);
    }

    /// The device it runs on.
    #[must_use]
    pub fn device(&self) -> &Device {
        self.module.device()
    }

    /// Launches the kernel on `stream` (`cuLaunchKernel`). During a capture, the launch becomes a
    /// kernel node of the captured graph; use [`Capture::launch`](crate::Capture::launch), which
    /// also keeps what the node refers to alive.
    ///
    /// Memory of this crate passed with [`KernelArgs::ptr`] is ordered: a graph allocation must
    /// be live (else [`Error::NotLive`], nothing launched) and the stream first waits
    /// for the launch that allocated it when that ran on another stream; frees of graph and
    /// stream allocations wait for this launch.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; with nothing launched, [`Error::Capturing`] naming
    /// `Function::launch` when the stream captures and `args` name graph allocations (launch
    /// through [`Capture::launch`](crate::Capture::launch)), or [`Error::NotLive`] naming it when
    /// a graph allocation among `args` is not live; [`Error::Driver`] naming
    /// `cuStreamGetCaptureInfo`, `cuStreamIsCapturing`, `cuStreamGetId`, `cuStreamWaitEvent`
    /// (ordering the launch after the allocating launch) or `cuLaunchKernel`. After the launch,
    /// [`Error::Driver`] naming `cuStreamIsCapturing`, `cuStreamGetId`, `cuEventCreate` or
    /// `cuEventRecord` when a use cannot be recorded for later frees to wait for (the stream is
    /// then synchronized before the error is returned).
    ///
    /// # Safety
    ///
    /// `args` matches the kernel's parameters in number, order and type, and every address in it
    /// is valid for the accesses the kernel makes, for as long as the kernel runs: for memory
    /// passed with [`KernelArgs::ptr`] the crate ensures it (above; in a capture begun through
    /// [`Capture`](crate::Capture), the captured graph keeps the module and that memory); for
    /// addresses passed as plain values, and for everything a launch captured by a capture that
    /// other code began refers to (the module included), the caller does.
    pub unsafe fn launch(
        &self,
        stream: &impl AsStream,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        stream_ordered(
            "Function::launch",
            self.device(),
            stream,
            args,
            Some(self.keep()),
            // SAFETY: the caller upholds the launch contract; `stream_ordered` calls this once
            // the allocations among `args` are live and ordered before it on `stream`.
            || unsafe { self.launch_raw(stream, config, args) },
        )
    }

    /// `cuLaunchKernel` with `args`.
    ///
    /// # Safety
    ///
    /// As [`launch`](Function::launch).
    pub(crate) unsafe fn launch_raw(
        &self,
        stream: &impl AsStream,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        args.with_pointers(|params| {
            // SAFETY: `params` holds one pointer per argument into `args`' storage, alive for
            // the call; the caller vouches that they match the kernel's signature.
            driver!(unsafe {
                sys::cuLaunchKernel(
                    self.raw,
                    config.grid.0,
                    config.grid.1,
                    config.grid.2,
                    config.block.0,
                    config.block.1,
                    config.block.2,
                    config.shared_mem_bytes,
                    stream.as_raw_stream(),
                    params,
                    std::ptr::null_mut(),
                )
            })
        })
    }
}

impl Handle for Function {
    type Raw = sys::CUfunction;

    fn as_raw(&self) -> sys::CUfunction {
        Function::as_raw(self)
    }
}

/// Runs `op`, work on `stream` whose device memory operands are `operands` (their addresses
/// recorded with [`KernelArgs::ptr`]) and which needs `keep` alive too (a kernel's module), with
/// `device`'s context current (a kernel's: the driver refuses a stream of another context), the
/// way every stream-ordered operation of the crate on memory runs:
///
/// - on a stream that captures into a capture of this crate, `op` becomes a node of the captured
///   graph, which keeps `keep` and the operands alive; refused ([`Error::Capturing`] naming
///   `call`) when an operand is a graph allocation, whose use the capture's record would miss
///   (the [`Capture`](crate::Capture) methods record it);
/// - otherwise, with graph allocations among the operands, after checking that each is live
///   ([`Error::NotLive`]) and ordering the stream after the launch that allocated it, under the
///   allocations' locks (in id order) so that no free slips between the check and `op`; each
///   use is then recorded for later frees to wait for (when that fails, the stream is
///   synchronized before the error is returned, or, where it cannot be, the allocations are
///   kept in doubt: [`Error::InDoubt`]);
/// - uses of stream allocations are recorded for their frees to wait for (likewise);
/// - with host-visible memory among the operands (a managed buffer, the pinned side of a host
///   copy), `op` is refused while the host holds a view of one ([`Error::InUseByHost`], nothing
///   queued), and its use is recorded in each for views and frees to wait for, under their
///   locks, taken after the allocations' ([`crate::host_memory::gpu_use`]).
pub(crate) fn stream_ordered(
    call: &'static str,
    device: &Device,
    stream: &impl AsStream,
    operands: &KernelArgs<'_>,
    keep: Option<Keep>,
    op: impl FnOnce() -> Result<()>,
) -> Result<()> {
    device.bind()?;
    let has_allocations = operands.graph_allocations().next().is_some();
    // No capture of this crate begins on the stream, or forks it in, between the capture checks
    // below and the operation: held even when no capture is registered now, since one begun
    // meanwhile would capture the operation without keeping `keep` and the operands (and miss
    // the stream allocations' uses, which `note_stream_uses` skips on a capturing stream).
    let _gate = deferred::hold_gate();
    if deferred::any_capture() {
        // Work captured into a capture of this crate, made without its guard: the captured
        // graph keeps what it refers to all the same.
        if let Some(id) = crate::stream::capture_id(stream.as_raw_stream())? {
            if has_allocations {
                return Err(refused_in_capture(call));
            }
            let kept = deferred::captured_outside(id, |outside| {
                outside
                    .keep
                    .extend(keep.into_iter().chain(operands.keeps()));
            });
            op()?;
            if kept.is_some() {
                // The capture tells this node from those of its own calls by its handle.
                let node = crate::stream::last_captured_node(stream.as_raw_stream());
                let made = node.as_ref().ok().copied().flatten().map(|n| n as usize);
                deferred::captured_outside(id, |outside| outside.nodes.push(made));
                node?;
            }
            return Ok(());
        }
    }
    let hosts = operands.host_memories();
    let op = || crate::host_memory::gpu_use(call, stream, &hosts, op);
    if !has_allocations {
        op()?;
        return operands.note_stream_uses(call, stream);
    }
    if stream.capture_status()? != CaptureStatus::None {
        return Err(refused_in_capture(call));
    }
    let id = stream.stream_id()?;
    // From the first wait to the record of the use (see `uses`).
    let _order = crate::uses::hold_order_lock();
    let mut allocations: Vec<&GraphAllocation> = operands.graph_allocations().collect();
    allocations.sort_by_key(|a| a.id());
    allocations.dedup_by_key(|a| a.id());
    let mut states: Vec<_> = allocations.iter().map(|a| a.lock()).collect();
    for (a, state) in allocations.iter().zip(&states) {
        a.before_stream_use(call, state, stream, id)?;
    }
    op()?;
    let mut recorded = Ok(());
    for (a, state) in allocations.iter().zip(&mut states) {
        recorded = recorded.and_then(|()| state.used_on(a.device(), stream, id));
    }
    if recorded.is_err() && !crate::uses::wait_unmarked(stream) {
        // The operation is queued, not every use is recorded, and it cannot be waited for:
        // no free may be ordered after it.
        for state in &mut states {
            state.doubt(call);
        }
    }
    drop(states);
    recorded?;
    operands.note_stream_uses(call, stream)
}

/// A launch with graph allocations on a capturing stream, made without its [`Capture`]
/// guard: the captured graph's record would miss the uses.
fn refused_in_capture(call: &'static str) -> Error {
    Error::Capturing {
        call,
        instead: "the operands include graph allocations: go through the Capture guard (Capture::launch, launch_on, memset_async, memcpy_async), which records their uses",
    }
}

/// Grid and block shape of a launch. Made with [`new`](LaunchConfig::new) or
/// [`for_elements`](LaunchConfig::for_elements) (it may gain fields: launch attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// `grid` blocks of `block` threads (x, y, z), no dynamic shared memory.
    #[must_use]
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig {
            grid,
            block,
            shared_mem_bytes: 0,
        }
    }

    /// The same, with `bytes` of dynamic shared memory per block.
    #[must_use]
    pub fn with_shared_mem_bytes(self, bytes: u32) -> LaunchConfig {
        LaunchConfig {
            shared_mem_bytes: bytes,
            ..self
        }
    }

    /// One-dimensional: enough blocks of `block` threads to cover `elements`, at most 65,535
    /// blocks (the kernels of this project use grid-stride loops).
    #[must_use]
    pub fn for_elements(elements: u64, block: u32) -> LaunchConfig {
        let blocks = elements.div_ceil(block.max(1) as u64).clamp(1, 65_535) as u32;
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// A kernel's argument list, built from typed values. Memory passed with [`KernelArgs::ptr`] is
/// recorded: graph allocations as uses of the allocation, for the lifetime checks and for
/// ordering, and every owner so that a node or launch keeps it allocated.
///
/// The list borrows the memory it names (`'a`): a node or launch made from it takes its own
/// hold of each owner, so building the list touches no reference count.
#[derive(Debug, Default, Clone)]
pub struct KernelArgs<'a> {
    /// The argument bytes.
    words: ArgWords,
    /// The owners of the memory among the arguments.
    owners: Few<Owner<'a>>,
}

/// Arguments kept inline: words and arguments. A list this size stays under 128 bytes, which
/// the builder methods move without a `memcpy` call (a larger one costs more per kernel node:
/// `bench/README.md`, "Measurements behind code choices").
const INLINE_ARGS: usize = 8;

/// Argument bytes, each argument starting at a word boundary (8-byte alignment), and each
/// argument's word offset: inline up to [`INLINE_ARGS`] words and arguments, all on the heap
/// past that. The words are `MaybeUninit`: a value's padding bytes are uninitialized, and are
/// only ever copied, never read as integers.
#[derive(Debug, Clone)]
struct ArgWords {
    inline: [MaybeUninit<u64>; INLINE_ARGS],
    inline_offsets: [u8; INLINE_ARGS],
    /// Words in use.
    used: usize,
    /// Arguments.
    count: usize,
    /// Every word and offset, once they do not fit inline.
    heap: Option<Box<HeapWords>>,
}

/// The words and the argument offsets of an [`ArgWords`] past its inline capacity.
type HeapWords = (Vec<MaybeUninit<u64>>, Vec<usize>);

impl Default for ArgWords {
    fn default() -> ArgWords {
        ArgWords {
            inline: [MaybeUninit::uninit(); INLINE_ARGS],
            inline_offsets: [0; INLINE_ARGS],
            used: 0,
            count: 0,
            heap: None,
        }
    }
}

impl ArgWords {
    #[inline(always)]
    fn push<T: Copy>(&mut self, value: T) {
        let offset = self.used;
        let end = offset + size_of::<T>().div_ceil(8).max(1);
        if self.heap.is_none() && (end > INLINE_ARGS || self.count == INLINE_ARGS) {
            let offsets = self.inline_offsets[..self.count].iter();
            self.heap = Some(Box::new((
                self.inline[..offset].to_vec(),
                offsets.map(|&o| usize::from(o)).collect(),
            )));
        }
        let words = match &mut self.heap {
            None => {
                // Below INLINE_ARGS (8), so it fits a u8.
                self.inline_offsets[self.count] = offset as u8;
                &mut self.inline[offset..end]
            }
            Some(heap) => {
                heap.0.resize(end, MaybeUninit::uninit());
                heap.1.push(offset);
                &mut heap.0[offset..]
            }
        };
        // SAFETY: `words` holds at least size_of::<T>() bytes, 8-byte aligned (T's alignment is
        // at most 8), and `T: Copy` has no drop glue.
        unsafe { words.as_mut_ptr().cast::<T>().write(value) };
        self.used = end;
        self.count += 1;
    }

    /// The words.
    #[inline]
    fn words(&self) -> &[MaybeUninit<u64>] {
        match &self.heap {
            None => &self.inline[..self.used],
            Some(heap) => &heap.0,
        }
    }

    /// The word offset of argument `arg`.
    #[inline]
    fn offset(&self, arg: usize) -> usize {
        match &self.heap {
            None => usize::from(self.inline_offsets[arg]),
            Some(heap) => heap.1[arg],
        }
    }
}

impl<'a> KernelArgs<'a> {
    /// An empty list.
    #[inline]
    #[must_use]
    pub fn new() -> KernelArgs<'a> {
        KernelArgs::default()
    }

    /// Appends a value passed by copy (an integer, a float, a `#[repr(C)]` struct); its
    /// alignment is at most 8. Always inlined, as [`ptr`](KernelArgs::ptr) is: a chain of
    /// calls then builds the list in place instead of moving it into and out of each call.
    #[inline(always)]
    #[must_use = "returns the list with the argument appended"]
    pub fn value<T: Copy + 'static>(mut self, value: T) -> KernelArgs<'a> {
        const { assert!(align_of::<T>() <= 8, "kernel argument alignment above 8") };
        self.words.push(value);
        self
    }

    /// Appends a device address; its memory is recorded (a graph allocation as used by this
    /// kernel).
    #[inline(always)]
    #[must_use = "returns the list with the argument appended"]
    pub fn ptr(mut self, target: &'a impl DeviceAddress) -> KernelArgs<'a> {
        self.owners.push(target.owner());
        self.value(target.device_ptr())
    }

    /// Records `memory` as an operand without an argument word: the pinned side of a stream
    /// copy, whose operand list is never launched.
    pub(crate) fn host(mut self, memory: &'a Arc<HostMemory>) -> KernelArgs<'a> {
        self.owners.push(Owner::Host(memory));
        self
    }

    /// The host-visible memories among the operands, once each, in address order.
    pub(crate) fn host_memories(&self) -> Vec<&Arc<HostMemory>> {
        let memories = self.owners.iter().filter_map(|o| match o {
            Owner::Host(m) => Some(*m),
            _ => None,
        });
        crate::host_memory::in_address_order(memories.collect())
    }

    /// The number of arguments.
    #[must_use]
    pub fn len(&self) -> usize {
        self.words.count
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.words.count == 0
    }

    /// The graph allocations the arguments name.
    pub fn graph_allocations(&self) -> impl Iterator<Item = &GraphAllocation> {
        self.owners.iter().filter_map(|o| match o {
            Owner::Graph(a) => Some(*a),
            _ => None,
        })
    }

    /// Values that keep every argument's memory allocated.
    pub(crate) fn keeps(&self) -> impl Iterator<Item = Keep> + '_ {
        self.owners.iter().map(|o| match o {
            Owner::Graph(a) => a.keep(),
            Owner::Stream(m) => Arc::clone(m) as Keep,
            Owner::Buffer(m) => Arc::clone(m) as Keep,
            #[cfg(feature = "cudarc")]
            Owner::Cudarc(m) => Arc::clone(m) as Keep,
            Owner::Host(m) => Arc::clone(m) as Keep,
        })
    }

    /// Keeps every argument's memory but graph allocations allocated for as long as `list` and
    /// what it is shared with hold it. Graph allocations are the record's to hold: every caller
    /// records them as used by its node, and a graph's record holds each allocation it names,
    /// as an executable graph holds those that outlive its launches or come from another graph
    /// (the crate docs' "Safety model").
    #[inline]
    pub(crate) fn keep_unrecorded_in(&self, list: &mut KeepList) {
        for owner in self.owners.iter() {
            owner.keep_unrecorded_in(list);
        }
    }

    /// Calls `f` with the `void**` array `cuLaunchKernel` and kernel nodes take.
    #[inline]
    pub(crate) fn with_pointers<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R {
        let base = self.words.words().as_ptr() as *mut MaybeUninit<u64>;
        let mut inline = [std::ptr::null_mut::<c_void>(); INLINE_ARGS];
        let mut heap = Vec::new();
        let count = self.words.count;
        let pointers: &mut [*mut c_void] = if count <= INLINE_ARGS {
            &mut inline[..count]
        } else {
            heap.resize(count, std::ptr::null_mut());
            &mut heap
        };
        for (arg, slot) in pointers.iter_mut().enumerate() {
            // SAFETY: every offset is inside the words.
            *slot = unsafe { base.add(self.words.offset(arg)) }.cast();
        }
        f(pointers.as_mut_ptr())
    }

    /// After `call` queued work on a stream: stream allocations (and cudarc slices) among the
    /// arguments are not freed before it. When a use cannot be recorded, the stream is
    /// synchronized before the error is returned, so that no free can overtake the work; where
    /// that is impossible, the allocation is kept ([`Error::InDoubt`]).
    fn note_stream_uses(&self, call: &'static str, stream: &impl AsStream) -> Result<()> {
        for owner in &self.owners {
            if let Owner::Stream(m) = owner {
                if let Err(e) = m.note_stream_use(stream) {
                    if !crate::uses::wait_unmarked(stream) {
                        m.doubt(call);
                    }
                    return Err(e);
                }
            }
            #[cfg(feature = "cudarc")]
            if let Owner::Cudarc(m) = owner {
                if let Err(e) = m.note_stream_use(stream) {
                    if !crate::uses::wait_unmarked(stream) {
                        m.doubt(call);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::KernelArgs;

    /// Reads argument `arg` of `args` as a `T` through the `void**` array kernels receive.
    fn read<T: Copy>(args: &KernelArgs<'_>, arg: usize) -> T {
        args.with_pointers(|pointers| {
            // SAFETY: `arg` is below the argument count and was written as a `T`; the words
            // outlive this closure.
            unsafe { (*pointers.add(arg)).cast::<T>().read() }
        })
    }

    #[test]
    fn arguments_read_back_inline_and_on_the_heap() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[repr(C)]
        struct Wide {
            a: [u64; 5],
            b: u32,
        }
        let wide = Wide {
            a: [1, 2, 3, 4, 5],
            b: 6,
        };
        // Three plain values stay inline.
        let small = KernelArgs::new().value(7u32).value(8u64).value(9.5f32);
        assert_eq!(small.len(), 3);
        assert!(small.words.heap.is_none());
        assert_eq!((read::<u32>(&small, 0), read::<u64>(&small, 1)), (7, 8));
        assert_eq!(read::<f32>(&small, 2), 9.5);
        // A six-word struct after two values passes 8 words: everything moves to the heap.
        let wide_args = KernelArgs::new()
            .value(1u8)
            .value(2u16)
            .value(wide)
            .value(3i64);
        assert!(wide_args.words.heap.is_some());
        assert_eq!(read::<u8>(&wide_args, 0), 1);
        assert_eq!(read::<u16>(&wide_args, 1), 2);
        assert_eq!(read::<Wide>(&wide_args, 2), wide);
        assert_eq!(read::<i64>(&wide_args, 3), 3);
        // Twelve one-word arguments pass 8 arguments.
        let many = (0..12u32).fold(KernelArgs::new(), |args, v| args.value(v * 10));
        assert_eq!(many.len(), 12);
        assert!(many.words.heap.is_some());
        for i in 0..12 {
            assert_eq!(read::<u32>(&many, i), i as u32 * 10);
        }
        assert!(KernelArgs::new().is_empty());
    }
}
