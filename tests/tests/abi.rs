//! ABI cross-check of the bindings against C compiled with the same headers.
//!
//! `abi/probe.c`, compiled by `build.rs` against the headers cuda-graph-sys used
//! (`DEP_CUDA_GRAPH_SYS_INCLUDE`), reports `sizeof`, `_Alignof` and `offsetof` of the
//! graph-memory structures of the driver and runtime APIs, and the values of the constants the
//! graph-memory code relies on. This test builds the same table from the bindings and compares
//! the two by name: every value must agree, and every name must be in both tables.
//!
//! A build without toolkit headers (pregenerated bindings) has nothing to compare against; the
//! tests then print why they skip, except under `CUDA_GRAPH_REQUIRE_ABI=1` (set by CI, which gives
//! the headers), where they fail. After comparing, `abi_matches_c` prints
//! `abi_matches_c: <n> entries compared, all equal; ...`, the line CI looks for.

#![allow(non_snake_case)]

/// What the build script did with the probe (compiled against which headers, or why not).
const PROBE: &str = env!("CUDA_GRAPH_TESTS_ABI_PROBE");

#[cfg(not(cuda_graph_tests_no_abi_probe))]
/// Fewer entries than this means the probe lost part of its table: the C table has 399 today.
const MIN_ENTRIES: usize = 380;

/// Prints why `test` cannot compare anything in this build, or, under `CUDA_GRAPH_REQUIRE_ABI=1`,
/// fails: a run that was given the headers must not pass without comparing.
#[cfg(cuda_graph_tests_no_abi_probe)]
fn no_probe(test: &str) {
    let required = std::env::var("CUDA_GRAPH_REQUIRE_ABI").is_ok_and(|v| v.trim() == "1");
    assert!(
        !required,
        "{test}: CUDA_GRAPH_REQUIRE_ABI=1 but the C probe was not built: {PROBE}"
    );
    println!("SKIPPED {test}: no toolkit headers: {PROBE}");
}

#[cfg(cuda_graph_tests_no_abi_probe)]
#[test]
fn abi_matches_c() {
    no_probe("abi_matches_c");
}

#[cfg(cuda_graph_tests_no_abi_probe)]
#[test]
fn probe_is_not_empty() {
    no_probe("probe_is_not_empty");
}

#[cfg(not(cuda_graph_tests_no_abi_probe))]
#[test]
fn abi_matches_c() {
    let c = probe::c_table();
    let rust = probe::rust_table();
    let mut problems = Vec::new();
    for (name, &c_value) in &c {
        match rust.get(name) {
            Some(&rust_value) if rust_value == c_value => {}
            Some(&rust_value) => problems.push(format!(
                "  {name}: C says {c_value}, Rust says {rust_value}"
            )),
            None => problems.push(format!("  {name}: only in the C probe (= {c_value})")),
        }
    }
    for (name, rust_value) in &rust {
        if !c.contains_key(name) {
            problems.push(format!("  {name}: only in the Rust table (= {rust_value})"));
        }
    }
    assert!(
        problems.is_empty(),
        "ABI cross-check failed: {} problem(s) out of {} C and {} Rust entries ({PROBE}):\n{}",
        problems.len(),
        c.len(),
        rust.len(),
        problems.join("\n")
    );
    println!(
        "abi_matches_c: {} entries compared, all equal; CUDA_VERSION {}; {PROBE}",
        c.len(),
        cuda_graph_sys::CUDA_VERSION
    );
}

#[cfg(not(cuda_graph_tests_no_abi_probe))]
#[test]
fn probe_is_not_empty() {
    let c = probe::c_table();
    assert!(
        c.len() >= MIN_ENTRIES,
        "the C probe reported {} entries, expected at least {MIN_ENTRIES}",
        c.len()
    );
    for name in [
        "sizeof(CUDA_MEM_ALLOC_NODE_PARAMS)",
        "sizeof(cudaMemAllocNodeParams)",
        "offsetof(cudaGraphNodeParams, alloc)",
        "CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH",
        "cudaGraphMemAttrReservedMemHigh",
        "CUDA_VERSION",
    ] {
        assert!(c.contains_key(name), "the C probe lacks {name}");
    }
    println!(
        "probe_is_not_empty: the C probe has {} entries (at least {MIN_ENTRIES} expected)",
        c.len()
    );
}

#[cfg(not(cuda_graph_tests_no_abi_probe))]
mod probe {
    use std::collections::BTreeMap;
    use std::ffi::{CStr, c_char, c_ulonglong};
    use std::mem::{align_of, offset_of, size_of};

    use cuda_graph_sys::*;

    /// Name → value, sorted so that failures read in order.
    pub type Table = BTreeMap<String, u64>;

    /// One row of the C table (`struct cuda_graph_abi_entry`).
    #[repr(C)]
    struct Entry {
        name: *const c_char,
        value: c_ulonglong,
    }

    #[link(name = "cuda_graph_abi_probe", kind = "static")]
    unsafe extern "C" {
        /// Returns the C table and writes its length to `count`.
        fn cuda_graph_abi_entries(count: *mut usize) -> *const Entry;
    }

    /// The table the C compiler made of the headers.
    pub fn c_table() -> Table {
        let mut count = 0usize;
        // SAFETY: `count` is a valid out-pointer; the function only writes it.
        let entries = unsafe { cuda_graph_abi_entries(&mut count) };
        assert!(!entries.is_null(), "the C probe returned no table");
        // SAFETY: the probe returns a pointer to a static array of `count` entries that lives as
        // long as the program and is never written.
        let entries = unsafe { std::slice::from_raw_parts(entries, count) };
        let mut table = Table::new();
        for entry in entries {
            // SAFETY: every name is a NUL-terminated string literal of the probe.
            let name = unsafe { CStr::from_ptr(entry.name) }
                .to_string_lossy()
                .into_owned();
            let previous = table.insert(name.clone(), entry.value);
            assert!(previous.is_none(), "the C probe reports {name} twice");
        }
        table
    }

    struct Builder(Table);

    impl Builder {
        fn add(&mut self, name: &str, value: u64) {
            let previous = self.0.insert(name.to_string(), value);
            assert!(previous.is_none(), "the Rust table has {name} twice");
        }
    }

    /// Size, alignment and the offset of every listed field. A field whose Rust name differs
    /// from C's (`type` → `type_`, members of anonymous unions) gives its Rust path after `as`.
    macro_rules! layout {
        ($b:ident, $t:ident { $($field:ident $(as $($path:ident).+)?),* $(,)? }) => {{
            $b.add(concat!("sizeof(", stringify!($t), ")"), size_of::<$t>() as u64);
            $b.add(concat!("alignof(", stringify!($t), ")"), align_of::<$t>() as u64);
            $(
                $b.add(
                    concat!("offsetof(", stringify!($t), ", ", stringify!($field), ")"),
                    layout!(@offset $t, $field $(, $($path).+)?) as u64,
                );
            )*
        }};
        (@offset $t:ident, $field:ident) => { offset_of!($t, $field) };
        (@offset $t:ident, $field:ident, $($path:ident).+) => { offset_of!($t, $($path).+) };
    }

    /// Only size and alignment (a typedef that names the same struct as another entry).
    macro_rules! size_only {
        ($b:ident, $($t:ident),* $(,)?) => {{
            $(
                $b.add(concat!("sizeof(", stringify!($t), ")"), size_of::<$t>() as u64);
                $b.add(concat!("alignof(", stringify!($t), ")"), align_of::<$t>() as u64);
            )*
        }};
    }

    /// Enumerators: `Type::NAME` is reported under `NAME`, as its integer value.
    macro_rules! values {
        ($b:ident, $ty:ident: $($name:ident),* $(,)?) => {{
            $( $b.add(stringify!($name), $ty::$name.0 as u64); )*
        }};
    }

    /// The same table, from the bindings.
    pub fn rust_table() -> Table {
        let mut b = Builder(Table::new());

        // Driver API structures.
        layout!(b, CUmemLocation { type as type_, id });
        size_only!(b, CUmemLocation_v1);
        layout!(b, CUmemAccessDesc { location, flags });
        size_only!(b, CUmemAccessDesc_v1);
        layout!(
            b,
            CUmemPoolProps {
                allocType,
                handleTypes,
                location,
                win32SecurityAttributes,
                maxSize,
                reserved,
            }
        );
        #[cfg(cuda_graph_tests_pool_usage)]
        b.add(
            "offsetof(CUmemPoolProps, usage)",
            offset_of!(CUmemPoolProps, usage) as u64,
        );
        size_only!(b, CUmemPoolProps_v1);
        layout!(
            b,
            CUDA_MEM_ALLOC_NODE_PARAMS {
                poolProps,
                accessDescs,
                accessDescCount,
                bytesize,
                dptr
            }
        );
        layout!(
            b,
            CUDA_MEM_ALLOC_NODE_PARAMS_v1 {
                poolProps,
                accessDescs,
                accessDescCount,
                bytesize,
                dptr
            }
        );
        layout!(
            b,
            CUDA_MEM_ALLOC_NODE_PARAMS_v2 {
                poolProps,
                accessDescs,
                accessDescCount,
                bytesize,
                dptr
            }
        );
        layout!(b, CUDA_MEM_FREE_NODE_PARAMS { dptr });
        layout!(
            b,
            CUDA_KERNEL_NODE_PARAMS {
                func,
                gridDimX,
                gridDimY,
                gridDimZ,
                blockDimX,
                blockDimY,
                blockDimZ,
                sharedMemBytes,
                kernelParams,
                extra,
                kern,
                ctx,
            }
        );
        layout!(
            b,
            CUDA_KERNEL_NODE_PARAMS_v1 {
                func,
                gridDimX,
                gridDimY,
                gridDimZ,
                blockDimX,
                blockDimY,
                blockDimZ,
                sharedMemBytes,
                kernelParams,
                extra,
            }
        );
        layout!(
            b,
            CUDA_KERNEL_NODE_PARAMS_v2 {
                func,
                gridDimX,
                gridDimY,
                gridDimZ,
                blockDimX,
                blockDimY,
                blockDimZ,
                sharedMemBytes,
                kernelParams,
                extra,
                kern,
                ctx,
            }
        );
        layout!(
            b,
            CUDA_KERNEL_NODE_PARAMS_v3 {
                func,
                gridDimX,
                gridDimY,
                gridDimZ,
                blockDimX,
                blockDimY,
                blockDimZ,
                sharedMemBytes,
                kernelParams,
                extra,
                kern,
                ctx,
            }
        );
        layout!(
            b,
            CUDA_MEMSET_NODE_PARAMS {
                dst,
                pitch,
                value,
                elementSize,
                width,
                height
            }
        );
        layout!(
            b,
            CUDA_MEMSET_NODE_PARAMS_v2 {
                dst,
                pitch,
                value,
                elementSize,
                width,
                height,
                ctx
            }
        );
        layout!(
            b,
            CUDA_MEMCPY3D {
                srcXInBytes,
                srcY,
                srcZ,
                srcLOD,
                srcMemoryType,
                srcHost,
                srcDevice,
                srcArray,
                reserved0,
                srcPitch,
                srcHeight,
                dstXInBytes,
                dstY,
                dstZ,
                dstLOD,
                dstMemoryType,
                dstHost,
                dstDevice,
                dstArray,
                reserved1,
                dstPitch,
                dstHeight,
                WidthInBytes,
                Height,
                Depth,
            }
        );
        layout!(
            b,
            CUDA_MEMCPY_NODE_PARAMS {
                flags,
                reserved,
                copyCtx,
                copyParams
            }
        );
        layout!(b, CUDA_EVENT_RECORD_NODE_PARAMS { event });
        layout!(b, CUDA_EVENT_WAIT_NODE_PARAMS { event });
        layout!(
            b,
            CUDA_GRAPH_INSTANTIATE_PARAMS {
                flags,
                hUploadStream,
                hErrNode_out,
                result_out
            }
        );
        layout!(b, CUgraphNodeParams {
            type as type_,
            reserved0,
            reserved1 as __bindgen_anon_1.reserved1,
            kernel as __bindgen_anon_1.kernel,
            memcpy as __bindgen_anon_1.memcpy,
            memset as __bindgen_anon_1.memset,
            host as __bindgen_anon_1.host,
            graph as __bindgen_anon_1.graph,
            eventWait as __bindgen_anon_1.eventWait,
            eventRecord as __bindgen_anon_1.eventRecord,
            extSemSignal as __bindgen_anon_1.extSemSignal,
            extSemWait as __bindgen_anon_1.extSemWait,
            alloc as __bindgen_anon_1.alloc,
            free as __bindgen_anon_1.free,
            memOp as __bindgen_anon_1.memOp,
            conditional as __bindgen_anon_1.conditional,
            reserved2,
        });

        // Runtime API structures.
        layout!(b, cudaMemLocation { type as type_, id });
        layout!(b, cudaMemAccessDesc { location, flags });
        layout!(
            b,
            cudaMemPoolProps {
                allocType,
                handleTypes,
                location,
                win32SecurityAttributes,
                maxSize,
                reserved,
            }
        );
        #[cfg(cuda_graph_tests_pool_usage)]
        b.add(
            "offsetof(cudaMemPoolProps, usage)",
            offset_of!(cudaMemPoolProps, usage) as u64,
        );
        layout!(
            b,
            cudaMemAllocNodeParams {
                poolProps,
                accessDescs,
                accessDescCount,
                bytesize,
                dptr
            }
        );
        layout!(
            b,
            cudaMemAllocNodeParamsV2 {
                poolProps,
                accessDescs,
                accessDescCount,
                bytesize,
                dptr
            }
        );
        layout!(b, cudaMemFreeNodeParams { dptr });
        layout!(b, dim3 { x, y, z });
        layout!(
            b,
            cudaKernelNodeParams {
                func,
                gridDim,
                blockDim,
                sharedMemBytes,
                kernelParams,
                extra
            }
        );
        layout!(
            b,
            cudaKernelNodeParamsV2 {
                func,
                gridDim,
                blockDim,
                sharedMemBytes,
                kernelParams,
                extra
            }
        );
        layout!(
            b,
            cudaMemsetParams {
                dst,
                pitch,
                value,
                elementSize,
                width,
                height
            }
        );
        layout!(
            b,
            cudaMemsetParamsV2 {
                dst,
                pitch,
                value,
                elementSize,
                width,
                height
            }
        );
        layout!(b, cudaPos { x, y, z });
        layout!(
            b,
            cudaPitchedPtr {
                ptr,
                pitch,
                xsize,
                ysize
            }
        );
        layout!(
            b,
            cudaExtent {
                width,
                height,
                depth
            }
        );
        layout!(
            b,
            cudaMemcpy3DParms {
                srcArray,
                srcPos,
                srcPtr,
                dstArray,
                dstPos,
                dstPtr,
                extent,
                kind
            }
        );
        layout!(
            b,
            cudaMemcpyNodeParams {
                flags,
                reserved,
                copyParams
            }
        );
        layout!(b, cudaEventRecordNodeParams { event });
        layout!(b, cudaEventWaitNodeParams { event });
        layout!(
            b,
            cudaGraphInstantiateParams {
                flags,
                uploadStream,
                errNode_out,
                result_out
            }
        );
        layout!(b, cudaGraphNodeParams {
            type as type_,
            reserved0,
            reserved1 as __bindgen_anon_1.reserved1,
            kernel as __bindgen_anon_1.kernel,
            memcpy as __bindgen_anon_1.memcpy,
            memset as __bindgen_anon_1.memset,
            host as __bindgen_anon_1.host,
            graph as __bindgen_anon_1.graph,
            eventWait as __bindgen_anon_1.eventWait,
            eventRecord as __bindgen_anon_1.eventRecord,
            extSemSignal as __bindgen_anon_1.extSemSignal,
            extSemWait as __bindgen_anon_1.extSemWait,
            alloc as __bindgen_anon_1.alloc,
            free as __bindgen_anon_1.free,
            conditional as __bindgen_anon_1.conditional,
            reserved2,
        });

        // Constants.
        b.add("CUDA_VERSION", u64::from(CUDA_VERSION));
        b.add("CUDART_VERSION", u64::from(CUDART_VERSION));

        values!(b, CUgraphInstantiate_flags:
            CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
            CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH,
            CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY,
        );
        values!(b, cudaGraphInstantiateFlags:
            cudaGraphInstantiateFlagAutoFreeOnLaunch,
            cudaGraphInstantiateFlagUpload,
            cudaGraphInstantiateFlagDeviceLaunch,
            cudaGraphInstantiateFlagUseNodePriority,
        );
        values!(b, CUgraphMem_attribute:
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        );
        values!(b, cudaGraphMemAttributeType:
            cudaGraphMemAttrUsedMemCurrent,
            cudaGraphMemAttrUsedMemHigh,
            cudaGraphMemAttrReservedMemCurrent,
            cudaGraphMemAttrReservedMemHigh,
        );
        values!(b, CUstreamCaptureMode:
            CU_STREAM_CAPTURE_MODE_GLOBAL,
            CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CU_STREAM_CAPTURE_MODE_RELAXED,
        );
        values!(b, cudaStreamCaptureMode:
            cudaStreamCaptureModeGlobal,
            cudaStreamCaptureModeThreadLocal,
            cudaStreamCaptureModeRelaxed,
        );
        values!(b, CUstreamCaptureStatus:
            CU_STREAM_CAPTURE_STATUS_NONE,
            CU_STREAM_CAPTURE_STATUS_ACTIVE,
            CU_STREAM_CAPTURE_STATUS_INVALIDATED,
        );
        values!(b, cudaStreamCaptureStatus:
            cudaStreamCaptureStatusNone,
            cudaStreamCaptureStatusActive,
            cudaStreamCaptureStatusInvalidated,
        );
        values!(b, CUmemAllocationType: CU_MEM_ALLOCATION_TYPE_PINNED);
        values!(b, CUmemLocationType: CU_MEM_LOCATION_TYPE_DEVICE);
        values!(b, CUmemAccess_flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        values!(b, cudaMemAllocationType: cudaMemAllocationTypePinned);
        values!(b, cudaMemLocationType: cudaMemLocationTypeDevice);
        values!(b, cudaMemAccessFlags: cudaMemAccessFlagsProtReadWrite);
        values!(b, CUgraphNodeType: CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE);
        values!(b, cudaGraphNodeType: cudaGraphNodeTypeMemAlloc, cudaGraphNodeTypeMemFree);

        b.add("CU_STREAM_LEGACY", CU_STREAM_LEGACY.addr() as u64);
        b.add("CU_STREAM_PER_THREAD", CU_STREAM_PER_THREAD.addr() as u64);
        b.add("cudaStreamLegacy", cudaStreamLegacy.addr() as u64);
        b.add("cudaStreamPerThread", cudaStreamPerThread.addr() as u64);

        values!(b, CUresult:
            CUDA_SUCCESS,
            CUDA_ERROR_INVALID_VALUE,
            CUDA_ERROR_OUT_OF_MEMORY,
            CUDA_ERROR_NO_DEVICE,
            CUDA_ERROR_INVALID_HANDLE,
            CUDA_ERROR_NOT_FOUND,
            CUDA_ERROR_NOT_SUPPORTED,
            CUDA_ERROR_NOT_PERMITTED,
            CUDA_ERROR_ILLEGAL_STATE,
            CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
            CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            CUDA_ERROR_STREAM_CAPTURE_MERGE,
            CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
            CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            CUDA_ERROR_CAPTURED_EVENT,
        );
        values!(b, cudaError_t:
            cudaSuccess,
            cudaErrorInvalidValue,
            cudaErrorMemoryAllocation,
            cudaErrorNoDevice,
            cudaErrorInsufficientDriver,
            cudaErrorInvalidResourceHandle,
            cudaErrorSymbolNotFound,
            cudaErrorNotSupported,
            cudaErrorNotPermitted,
            cudaErrorIllegalState,
            cudaErrorSharedObjectSymbolNotFound,
            cudaErrorSharedObjectInitFailed,
            cudaErrorStreamCaptureUnsupported,
            cudaErrorStreamCaptureInvalidated,
            cudaErrorStreamCaptureMerge,
            cudaErrorStreamCaptureUnmatched,
            cudaErrorStreamCaptureUnjoined,
            cudaErrorStreamCaptureIsolation,
            cudaErrorStreamCaptureImplicit,
            cudaErrorStreamCaptureWrongThread,
            cudaErrorCapturedEvent,
        );

        b.0
    }
}
