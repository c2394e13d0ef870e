//! Run-time loading of the CUDA driver (`libcuda.so.1`), and of the runtime (`libcudart.so`) in
//! builds that had no runtime library to link.
//!
//! Every driver function of this crate resolves its own symbol at its first call, so a binary
//! starts on a machine without an NVIDIA driver, and a symbol that an older driver lacks only
//! affects the functions that need it. A call that cannot reach its function returns an error
//! code instead:
//!
//! | what is missing | driver API returns | runtime API (loaded builds) returns |
//! |---|---|---|
//! | the library | `CUDA_ERROR_NO_DEVICE` | `cudaErrorSharedObjectInitFailed` |
//! | the symbol | `CUDA_ERROR_NOT_FOUND` | `cudaErrorSymbolNotFound` |
//!
//! [`driver_load_error`] and [`runtime_load_error`] say why, in words and as data.
//!
//! The variable `CUDA_GRAPH_LIBCUDA` names another file to load as the driver (a path or a
//! soname); `CUDA_GRAPH_LIBCUDART` does the same for the runtime in loaded builds. They are read
//! once, at the first call.

use std::ffi::{CStr, CString, c_void};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Why a library or one of its symbols could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The library could not be opened (no NVIDIA driver installed, or not on the loader's path).
    LibraryNotFound {
        /// The file that was asked for.
        library: String,
        /// What the dynamic loader said.
        reason: String,
    },
    /// The library is there but does not export the symbol.
    SymbolNotFound {
        /// The library that was searched.
        library: String,
        /// The missing symbol.
        symbol: String,
        /// The CUDA version the installed driver supports (`cuDriverGetVersion`), when known.
        driver_version: Option<i32>,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::LibraryNotFound { library, reason } => {
                write!(f, "{library} could not be loaded ({reason})")?;
                if library.contains("libcuda.") {
                    write!(
                        f,
                        ": no NVIDIA driver is installed or it is not on the loader's path"
                    )?;
                }
                Ok(())
            }
            LoadError::SymbolNotFound {
                library,
                symbol,
                driver_version,
            } => {
                write!(f, "{library} does not export {symbol}")?;
                match driver_version {
                    Some(v) if *v < crate::CUDA_VERSION as i32 => write!(
                        f,
                        ": the driver is too old (it supports CUDA {}, these bindings are for CUDA {}); update the driver",
                        dotted(*v),
                        dotted(crate::CUDA_VERSION as i32)
                    ),
                    Some(v) => write!(f, " (the driver supports CUDA {})", dotted(*v)),
                    None => Ok(()),
                }
            }
        }
    }
}

impl std::error::Error for LoadError {}

fn dotted(version: i32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

/// Why a generated function could not reach its symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    Library,
    Symbol,
}

/// A shared library opened at first use.
pub(crate) struct Library {
    /// File names tried in order; the first that opens wins.
    candidates: &'static [&'static CStr],
    /// Variable naming a file to load instead.
    override_var: &'static str,
    handle: OnceLock<Result<Handle, LoadError>>,
    /// The most recent symbol found missing.
    last_missing: Mutex<Option<&'static CStr>>,
}

/// A `dlopen` handle.
#[derive(Debug, Clone, Copy)]
struct Handle(*mut c_void);

// SAFETY: a dlopen handle is a process-wide token; dlsym may be called with it from any thread.
unsafe impl Send for Handle {}
// SAFETY: as above; the handle is never written after it is stored.
unsafe impl Sync for Handle {}

/// The driver.
pub(crate) static DRIVER: Library = Library {
    candidates: &[c"libcuda.so.1"],
    override_var: "CUDA_GRAPH_LIBCUDA",
    handle: OnceLock::new(),
    last_missing: Mutex::new(None),
};

/// The runtime, used only by builds that could not link it.
#[cfg_attr(not(cuda_graph_sys_runtime_loaded), allow(dead_code))]
pub(crate) static RUNTIME: Library = Library {
    candidates: if crate::CUDA_VERSION >= 13000 {
        &[c"libcudart.so.13", c"libcudart.so"]
    } else {
        &[c"libcudart.so.12", c"libcudart.so"]
    },
    override_var: "CUDA_GRAPH_LIBCUDART",
    handle: OnceLock::new(),
    last_missing: Mutex::new(None),
};

impl Library {
    fn handle(&self) -> Result<Handle, &LoadError> {
        self.handle.get_or_init(|| self.open()).as_ref().copied()
    }

    fn open(&self) -> Result<Handle, LoadError> {
        let names: Vec<CString> = match std::env::var(self.override_var) {
            Ok(path) if !path.is_empty() => vec![CString::new(path).unwrap_or_default()],
            _ => self.candidates.iter().map(|c| CString::from(*c)).collect(),
        };
        let mut reason = String::new();
        for name in &names {
            // SAFETY: `name` is a NUL-terminated string; the flags are valid for dlopen.
            let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                return Ok(Handle(handle));
            }
            reason = dl_error();
        }
        Err(LoadError::LibraryNotFound {
            library: names
                .iter()
                .map(|n| n.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" or "),
            reason,
        })
    }

    fn name(&self) -> String {
        match std::env::var(self.override_var) {
            Ok(path) if !path.is_empty() => path,
            _ => self.candidates[0].to_string_lossy().into_owned(),
        }
    }

    /// The error a failing call on this library would explain: the library, else the last symbol.
    fn load_error(&self, driver_version: impl FnOnce() -> Option<i32>) -> Option<LoadError> {
        if let Some(Err(e)) = self.handle.get() {
            return Some(e.clone());
        }
        let symbol = (*self.last_missing.lock().unwrap_or_else(|e| e.into_inner()))?;
        Some(LoadError::SymbolNotFound {
            library: self.name(),
            symbol: symbol.to_string_lossy().into_owned(),
            driver_version: driver_version(),
        })
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local message or null.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: a non-null dlerror result is a NUL-terminated string valid until the next call.
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    }
}

/// One function's symbol, resolved at its first use and cached.
pub(crate) struct Symbol {
    library: &'static Library,
    name: &'static CStr,
    /// `UNRESOLVED`, `NO_LIBRARY`, `NO_SYMBOL`, or the address.
    state: AtomicUsize,
}

const UNRESOLVED: usize = 0;
const NO_LIBRARY: usize = 1;
const NO_SYMBOL: usize = 2;

impl Symbol {
    pub(crate) const fn new(library: &'static Library, name: &'static CStr) -> Self {
        Symbol {
            library,
            name,
            state: AtomicUsize::new(UNRESOLVED),
        }
    }

    /// The symbol's address, resolving it on first use.
    #[inline]
    pub(crate) fn address(&self) -> Result<*mut c_void, Missing> {
        match self.state.load(Ordering::Acquire) {
            UNRESOLVED => self.resolve(),
            NO_LIBRARY => Err(Missing::Library),
            NO_SYMBOL => Err(Missing::Symbol),
            address => Ok(address as *mut c_void),
        }
    }

    #[cold]
    fn resolve(&self) -> Result<*mut c_void, Missing> {
        let Ok(handle) = self.library.handle() else {
            self.state.store(NO_LIBRARY, Ordering::Release);
            return Err(Missing::Library);
        };
        // SAFETY: the handle came from dlopen and is never closed; the name is NUL-terminated.
        let address = unsafe { libc::dlsym(handle.0, self.name.as_ptr()) };
        if address.is_null() {
            *self
                .library
                .last_missing
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(self.name);
            self.state.store(NO_SYMBOL, Ordering::Release);
            return Err(Missing::Symbol);
        }
        // Racing resolvers store the same address; any of them may win.
        self.state.store(address as usize, Ordering::Release);
        Ok(address)
    }
}

/// The driver error code for a call that could not reach its function.
pub(crate) fn driver_error(missing: Missing) -> crate::CUresult {
    match missing {
        Missing::Library => crate::CUresult::CUDA_ERROR_NO_DEVICE,
        Missing::Symbol => crate::CUresult::CUDA_ERROR_NOT_FOUND,
    }
}

/// The runtime error code for a call that could not reach its function (loaded builds).
#[cfg_attr(not(cuda_graph_sys_runtime_loaded), allow(dead_code))]
pub(crate) fn runtime_error(missing: Missing) -> crate::cudaError_t {
    match missing {
        Missing::Library => crate::cudaError_t::cudaErrorSharedObjectInitFailed,
        Missing::Symbol => crate::cudaError_t::cudaErrorSymbolNotFound,
    }
}

/// Opens the driver library now, if not yet done, and says whether it is there.
///
/// # Errors
///
/// [`LoadError::LibraryNotFound`] when the library could not be opened; the first attempt's
/// error, on every call.
pub fn load_driver() -> Result<(), LoadError> {
    DRIVER.handle().map(|_| ()).map_err(Clone::clone)
}

/// Whether the driver exports `symbol` (an ABI name such as `cuMemAlloc_v2`).
pub fn driver_has_symbol(symbol: &CStr) -> bool {
    match DRIVER.handle() {
        // SAFETY: the handle came from dlopen; the name is NUL-terminated.
        Ok(handle) => !unsafe { libc::dlsym(handle.0, symbol.as_ptr()) }.is_null(),
        Err(_) => false,
    }
}

/// The CUDA version the installed driver supports (`cuDriverGetVersion`), e.g. 13000.
///
/// Looked up directly, not through the recorded symbols, so asking never changes what
/// [`driver_load_error`] reports.
pub fn driver_version() -> Option<i32> {
    let handle = DRIVER.handle().ok()?;
    // SAFETY: the handle came from dlopen; the name is NUL-terminated.
    let address = unsafe { libc::dlsym(handle.0, c"cuDriverGetVersion".as_ptr()) };
    if address.is_null() {
        return None;
    }
    // SAFETY: the driver's cuDriverGetVersion has this signature in every CUDA version.
    let function: unsafe extern "C" fn(*mut i32) -> crate::CUresult =
        unsafe { std::mem::transmute(address) };
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    let result = unsafe { function(&mut version) };
    (result == crate::CUresult::CUDA_SUCCESS).then_some(version)
}

/// Why driver calls fail to reach the driver: the library could not be opened, or the most recent
/// call whose symbol was missing (and whether the driver is too old for it). `None` when every call
/// so far reached its function.
pub fn driver_load_error() -> Option<LoadError> {
    DRIVER.load_error(driver_version)
}

/// As [`driver_load_error`], for the runtime in builds that load it at run time
/// (`CUDA_GRAPH_SYS_CUDART` is `loaded`); always `None` where the runtime is linked.
pub fn runtime_load_error() -> Option<LoadError> {
    if cfg!(cuda_graph_sys_runtime_loaded) {
        RUNTIME.load_error(|| None)
    } else {
        None
    }
}
