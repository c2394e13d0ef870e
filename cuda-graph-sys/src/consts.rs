//! Constants the headers define as casts, which bindgen cannot translate.

use crate::{CUdevice, CUstream, cudaStream_t};

/// `CU_STREAM_LEGACY`: the legacy default stream, as a stream handle.
pub const CU_STREAM_LEGACY: CUstream = core::ptr::without_provenance_mut(0x1);
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, as a stream handle.
pub const CU_STREAM_PER_THREAD: CUstream = core::ptr::without_provenance_mut(0x2);
/// `cudaStreamLegacy`: the legacy default stream of the runtime API.
pub const cudaStreamLegacy: cudaStream_t = core::ptr::without_provenance_mut(0x1);
/// `cudaStreamPerThread`: the calling thread's default stream of the runtime API.
pub const cudaStreamPerThread: cudaStream_t = core::ptr::without_provenance_mut(0x2);
/// `CU_DEVICE_CPU`: the host, where a device ordinal is expected.
pub const CU_DEVICE_CPU: CUdevice = -1;
/// `CU_DEVICE_INVALID`: an invalid device ordinal.
pub const CU_DEVICE_INVALID: CUdevice = -2;
/// `CU_LAUNCH_PARAM_END`: ends the `extra` array of `cuLaunchKernel`.
pub const CU_LAUNCH_PARAM_END: *mut core::ffi::c_void = core::ptr::null_mut();
/// `CU_LAUNCH_PARAM_BUFFER_POINTER`: in `extra`, the next entry points to the argument buffer.
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: *mut core::ffi::c_void =
    core::ptr::without_provenance_mut(0x1);
/// `CU_LAUNCH_PARAM_BUFFER_SIZE`: in `extra`, the next entry points to the buffer's size.
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: *mut core::ffi::c_void =
    core::ptr::without_provenance_mut(0x2);
