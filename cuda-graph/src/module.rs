//! Modules (PTX or cubin), kernel functions, and kernel launches with typed argument lists.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use crate::alloc::GraphAllocation;
use crate::device::Device;
use crate::error::{Error, Result, check};
use crate::few::{Few, Inline};
use crate::memory::DeviceAddress;
use crate::stream::AsStream;
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
    _tracked: crate::track::Tracked,
}

// SAFETY: a module handle is usable from any thread; it is only read after loading.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: loaded in `Module::load`, unloaded once, when no Function refers to it.
            let _ = unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}

impl Module {
    /// Loads PTX text; the driver JIT-compiles it for the device.
    pub fn from_ptx(device: &Device, ptx: &str) -> Result<Module> {
        let text = CString::new(ptx)
            .map_err(|_| Error::invalid("Module::from_ptx", "the PTX contains a NUL byte"))?;
        Module::load(device, text.as_ptr().cast())
    }

    /// Loads a cubin or fatbin image.
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
        check(
            // SAFETY: `image` points to a NUL-terminated PTX string or a complete cubin image that
            // outlives the call; the context is current.
            unsafe { sys::cuModuleLoadData(&mut raw, image) },
            "cuModuleLoadData",
        )?;
        Ok(Module {
            inner: Arc::new(ModuleInner {
                raw,
                device: device.clone(),
                _tracked: crate::track::Tracked::new(crate::track::Kind::Module),
            }),
        })
    }

    /// The kernel `name` (an `extern "C"` name, or a mangled one).
    pub fn function(&self, name: &str) -> Result<Function> {
        let c_name = CString::new(name)
            .map_err(|_| Error::invalid("Module::function", "the name contains a NUL byte"))?;
        let mut raw = std::ptr::null_mut();
        check(
            // SAFETY: `raw` is a valid out-pointer; the name is NUL-terminated; the module is loaded.
            unsafe { sys::cuModuleGetFunction(&mut raw, self.inner.raw, c_name.as_ptr()) },
            "cuModuleGetFunction",
        )?;
        Ok(Function {
            raw,
            name: name.into(),
            module: self.clone(),
        })
    }

    /// The raw handle.
    pub fn as_raw(&self) -> sys::CUmodule {
        self.inner.raw
    }

    /// The device the module is loaded on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }
}

/// A kernel of a loaded module; keeps the module loaded.
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
    pub fn as_raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, shared (node records keep it without copying).
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        self.module.device()
    }

    /// Launches the kernel on `stream` (`cuLaunchKernel`). During a capture, the launch becomes a
    /// kernel node of the captured graph.
    ///
    /// # Safety
    ///
    /// `args` matches the kernel's parameters in number, order and type, and every address in it
    /// is valid for the accesses the kernel makes, for as long as the kernel runs.
    pub unsafe fn launch(
        &self,
        stream: &impl AsStream,
        config: LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        self.device().bind()?;
        args.with_pointers(|params| {
            check(
                // SAFETY: `params` holds one pointer per argument into `args`' storage, alive for
                // the call; the caller vouches that they match the kernel's signature.
                unsafe {
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
                },
                "cuLaunchKernel",
            )
        })?;
        args.note_stream_use(stream)
    }
}

/// Grid and block shape of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// One-dimensional: enough blocks of `block` threads to cover `elements`, at most 65,535
    /// blocks (the kernels of this project use grid-stride loops).
    pub fn for_elements(elements: u64, block: u32) -> LaunchConfig {
        let blocks = elements.div_ceil(block.max(1) as u64).clamp(1, 65_535) as u32;
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// A kernel's argument list, built from typed values. Addresses of graph allocations passed with
/// [`KernelArgs::ptr`] are recorded as uses of the allocation, for the lifetime checks.
#[derive(Debug, Default, Clone)]
pub struct KernelArgs {
    /// Argument bytes, each argument starting at a word boundary (8-byte alignment); inline up
    /// to 16 words, so a typical list needs no heap allocation.
    words: Inline<u64, 16>,
    /// Word offset of each argument.
    offsets: Inline<u32, 16>,
    /// Graph allocations among the arguments.
    uses: Few<GraphAllocation>,
}

impl KernelArgs {
    /// An empty list.
    #[inline]
    pub fn new() -> KernelArgs {
        KernelArgs::default()
    }

    /// Appends a value passed by copy (an integer, a float, a `#[repr(C)]` struct); its
    /// alignment is at most 8.
    #[inline]
    pub fn value<T: Copy + 'static>(mut self, value: T) -> KernelArgs {
        const { assert!(align_of::<T>() <= 8, "kernel argument alignment above 8") };
        let offset = self.words.len();
        self.words
            .grow_to(offset + size_of::<T>().div_ceil(8).max(1));
        let words = &mut self.words.as_mut_slice()[offset..];
        // SAFETY: `words` holds at least size_of::<T>() bytes, 8-byte aligned, and `T: Copy`
        // has no drop glue.
        unsafe { words.as_mut_ptr().cast::<T>().write(value) };
        self.offsets.push(offset as u32);
        self
    }

    /// Appends a device address; a graph allocation is recorded as used by this kernel.
    #[inline]
    pub fn ptr(mut self, target: &impl DeviceAddress) -> KernelArgs {
        if let Some(allocation) = target.graph_allocation() {
            self.uses.push(allocation.clone());
        }
        self.value(target.device_ptr())
    }

    /// The number of arguments.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.offsets.len() == 0
    }

    /// The graph allocations the arguments name.
    pub fn uses(&self) -> &[GraphAllocation] {
        &self.uses
    }

    /// Calls `f` with the `void**` array `cuLaunchKernel` and kernel nodes take.
    #[inline]
    pub(crate) fn with_pointers<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R {
        let base = self.words.as_slice().as_ptr() as *mut u64;
        let mut inline = [std::ptr::null_mut::<c_void>(); 16];
        let mut heap = Vec::new();
        let pointers: &mut [*mut c_void] = if self.offsets.len() <= inline.len() {
            &mut inline[..self.offsets.len()]
        } else {
            heap.resize(self.offsets.len(), std::ptr::null_mut());
            &mut heap
        };
        for (slot, &offset) in pointers.iter_mut().zip(self.offsets.as_slice()) {
            // SAFETY: every offset is inside `words`.
            *slot = unsafe { base.add(offset as usize) }.cast();
        }
        f(pointers.as_mut_ptr())
    }

    /// After a launch on a stream: the used allocations must not be freed by RAII before it.
    fn note_stream_use(&self, stream: &impl AsStream) -> Result<()> {
        for allocation in &self.uses {
            allocation.note_stream_use(stream)?;
        }
        Ok(())
    }
}
