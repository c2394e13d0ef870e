/*
 * C side of the ABI cross-check of cuda-graph-sys (tests/tests/abi.rs).
 *
 * Compiled by tests/build.rs with the `cc` crate against the same headers that bindgen read
 * (DEP_CUDA_INCLUDE), it reports what the C compiler makes of them: sizeof, _Alignof and the
 * offsetof of every field of the graph-memory structures of the driver and runtime APIs, and the
 * values of the constants the graph-memory code relies on. The Rust test builds the same table
 * from the bindings and compares the two by name, in both directions.
 *
 * Names are written as the Rust side writes them:
 *   "sizeof(T)", "alignof(T)", "offsetof(T, field)", and a constant's C name.
 * Pointer constants (CU_STREAM_PER_THREAD, ...) are reported as integers.
 *
 * Every name below exists in the CUDA 12.3, 12.9 and 13.0 headers with the same definition,
 * except the pools' `usage`, which 12.3 lacks: tests/build.rs defines CUDA_GRAPH_POOL_USAGE
 * where the headers have it.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

struct cuda_graph_abi_entry {
    const char *name;
    unsigned long long value;
};

#define LAYOUT(T)                                                                                  \
    {"sizeof(" #T ")", (unsigned long long)sizeof(T)},                                             \
    {"alignof(" #T ")", (unsigned long long)_Alignof(T)}
#define OFF(T, f) {"offsetof(" #T ", " #f ")", (unsigned long long)offsetof(T, f)}
/* Most runtime structures are struct tags without a typedef in C (C++ needs none); the table
 * names them as the Rust bindings do, without "struct". */
#define LAYOUT_S(T)                                                                                \
    {"sizeof(" #T ")", (unsigned long long)sizeof(struct T)},                                      \
    {"alignof(" #T ")", (unsigned long long)_Alignof(struct T)}
#define OFF_S(T, f) {"offsetof(" #T ", " #f ")", (unsigned long long)offsetof(struct T, f)}
#define VAL(c) {#c, (unsigned long long)(c)}
#define PTR(c) {#c, (unsigned long long)(uintptr_t)(c)}

static const struct cuda_graph_abi_entry entries[] = {
    /* ---------------------------------------------------------------- driver API structures */

    /* CUmemLocation / CUmemAccessDesc / CUmemPoolProps */
    LAYOUT(CUmemLocation),
    LAYOUT(CUmemLocation_v1),
    OFF(CUmemLocation, type),
    OFF(CUmemLocation, id),

    LAYOUT(CUmemAccessDesc),
    LAYOUT(CUmemAccessDesc_v1),
    OFF(CUmemAccessDesc, location),
    OFF(CUmemAccessDesc, flags),

    LAYOUT(CUmemPoolProps),
    LAYOUT(CUmemPoolProps_v1),
    OFF(CUmemPoolProps, allocType),
    OFF(CUmemPoolProps, handleTypes),
    OFF(CUmemPoolProps, location),
    OFF(CUmemPoolProps, win32SecurityAttributes),
    OFF(CUmemPoolProps, maxSize),
#if CUDA_GRAPH_POOL_USAGE
    OFF(CUmemPoolProps, usage),
#endif
    OFF(CUmemPoolProps, reserved),

    /* CUDA_MEM_ALLOC_NODE_PARAMS (an alias of _v1) and _v2 */
    LAYOUT(CUDA_MEM_ALLOC_NODE_PARAMS),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS, poolProps),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescCount),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS, dptr),
    LAYOUT(CUDA_MEM_ALLOC_NODE_PARAMS_v1),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v1, poolProps),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v1, accessDescs),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v1, accessDescCount),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v1, bytesize),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v1, dptr),
    LAYOUT(CUDA_MEM_ALLOC_NODE_PARAMS_v2),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v2, poolProps),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v2, accessDescs),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v2, accessDescCount),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v2, bytesize),
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS_v2, dptr),

    LAYOUT(CUDA_MEM_FREE_NODE_PARAMS),
    OFF(CUDA_MEM_FREE_NODE_PARAMS, dptr),

    /* CUDA_KERNEL_NODE_PARAMS (an alias of _v2), _v1, _v2, _v3 */
    LAYOUT(CUDA_KERNEL_NODE_PARAMS),
    OFF(CUDA_KERNEL_NODE_PARAMS, func),
    OFF(CUDA_KERNEL_NODE_PARAMS, gridDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS, gridDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS, gridDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS, blockDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS, blockDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS, blockDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS, sharedMemBytes),
    OFF(CUDA_KERNEL_NODE_PARAMS, kernelParams),
    OFF(CUDA_KERNEL_NODE_PARAMS, extra),
    OFF(CUDA_KERNEL_NODE_PARAMS, kern),
    OFF(CUDA_KERNEL_NODE_PARAMS, ctx),
    LAYOUT(CUDA_KERNEL_NODE_PARAMS_v1),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, func),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, gridDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, gridDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, gridDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, blockDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, blockDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, blockDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, sharedMemBytes),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, kernelParams),
    OFF(CUDA_KERNEL_NODE_PARAMS_v1, extra),
    LAYOUT(CUDA_KERNEL_NODE_PARAMS_v2),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, func),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, gridDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, gridDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, gridDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, blockDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, blockDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, blockDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, sharedMemBytes),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, kernelParams),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, extra),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, kern),
    OFF(CUDA_KERNEL_NODE_PARAMS_v2, ctx),
    LAYOUT(CUDA_KERNEL_NODE_PARAMS_v3),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, func),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, gridDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, gridDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, gridDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, blockDimX),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, blockDimY),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, blockDimZ),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, sharedMemBytes),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, kernelParams),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, extra),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, kern),
    OFF(CUDA_KERNEL_NODE_PARAMS_v3, ctx),

    /* CUDA_MEMSET_NODE_PARAMS (an alias of _v1) and _v2 */
    LAYOUT(CUDA_MEMSET_NODE_PARAMS),
    OFF(CUDA_MEMSET_NODE_PARAMS, dst),
    OFF(CUDA_MEMSET_NODE_PARAMS, pitch),
    OFF(CUDA_MEMSET_NODE_PARAMS, value),
    OFF(CUDA_MEMSET_NODE_PARAMS, elementSize),
    OFF(CUDA_MEMSET_NODE_PARAMS, width),
    OFF(CUDA_MEMSET_NODE_PARAMS, height),
    LAYOUT(CUDA_MEMSET_NODE_PARAMS_v2),
    OFF(CUDA_MEMSET_NODE_PARAMS_v2, dst),
    OFF(CUDA_MEMSET_NODE_PARAMS_v2, pitch),
    OFF(CUDA_MEMSET_NODE_PARAMS_v2, value),
    OFF(CUDA_MEMSET_NODE_PARAMS_v2, elementSize),
    OFF(CUDA_MEMSET_NODE_PARAMS_v2, width),
    OFF(CUDA_MEMSET_NODE_PARAMS_v2, height),
    OFF(CUDA_MEMSET_NODE_PARAMS_v2, ctx),

    /* CUDA_MEMCPY3D and the memcpy node that wraps it */
    LAYOUT(CUDA_MEMCPY3D),
    OFF(CUDA_MEMCPY3D, srcXInBytes),
    OFF(CUDA_MEMCPY3D, srcY),
    OFF(CUDA_MEMCPY3D, srcZ),
    OFF(CUDA_MEMCPY3D, srcLOD),
    OFF(CUDA_MEMCPY3D, srcMemoryType),
    OFF(CUDA_MEMCPY3D, srcHost),
    OFF(CUDA_MEMCPY3D, srcDevice),
    OFF(CUDA_MEMCPY3D, srcArray),
    OFF(CUDA_MEMCPY3D, reserved0),
    OFF(CUDA_MEMCPY3D, srcPitch),
    OFF(CUDA_MEMCPY3D, srcHeight),
    OFF(CUDA_MEMCPY3D, dstXInBytes),
    OFF(CUDA_MEMCPY3D, dstY),
    OFF(CUDA_MEMCPY3D, dstZ),
    OFF(CUDA_MEMCPY3D, dstLOD),
    OFF(CUDA_MEMCPY3D, dstMemoryType),
    OFF(CUDA_MEMCPY3D, dstHost),
    OFF(CUDA_MEMCPY3D, dstDevice),
    OFF(CUDA_MEMCPY3D, dstArray),
    OFF(CUDA_MEMCPY3D, reserved1),
    OFF(CUDA_MEMCPY3D, dstPitch),
    OFF(CUDA_MEMCPY3D, dstHeight),
    OFF(CUDA_MEMCPY3D, WidthInBytes),
    OFF(CUDA_MEMCPY3D, Height),
    OFF(CUDA_MEMCPY3D, Depth),
    LAYOUT(CUDA_MEMCPY_NODE_PARAMS),
    OFF(CUDA_MEMCPY_NODE_PARAMS, flags),
    OFF(CUDA_MEMCPY_NODE_PARAMS, reserved),
    OFF(CUDA_MEMCPY_NODE_PARAMS, copyCtx),
    OFF(CUDA_MEMCPY_NODE_PARAMS, copyParams),

    /* Event record / wait nodes */
    LAYOUT(CUDA_EVENT_RECORD_NODE_PARAMS),
    OFF(CUDA_EVENT_RECORD_NODE_PARAMS, event),
    LAYOUT(CUDA_EVENT_WAIT_NODE_PARAMS),
    OFF(CUDA_EVENT_WAIT_NODE_PARAMS, event),

    /* Instantiation */
    LAYOUT(CUDA_GRAPH_INSTANTIATE_PARAMS),
    OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, flags),
    OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, hUploadStream),
    OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, hErrNode_out),
    OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out),

    /* CUgraphNodeParams: the members of its anonymous union are reached directly */
    LAYOUT(CUgraphNodeParams),
    OFF(CUgraphNodeParams, type),
    OFF(CUgraphNodeParams, reserved0),
    OFF(CUgraphNodeParams, reserved1),
    OFF(CUgraphNodeParams, kernel),
    OFF(CUgraphNodeParams, memcpy),
    OFF(CUgraphNodeParams, memset),
    OFF(CUgraphNodeParams, host),
    OFF(CUgraphNodeParams, graph),
    OFF(CUgraphNodeParams, eventWait),
    OFF(CUgraphNodeParams, eventRecord),
    OFF(CUgraphNodeParams, extSemSignal),
    OFF(CUgraphNodeParams, extSemWait),
    OFF(CUgraphNodeParams, alloc),
    OFF(CUgraphNodeParams, free),
    OFF(CUgraphNodeParams, memOp),
    OFF(CUgraphNodeParams, conditional),
    OFF(CUgraphNodeParams, reserved2),

    /* --------------------------------------------------------------- runtime API structures */

    LAYOUT_S(cudaMemLocation),
    OFF_S(cudaMemLocation, type),
    OFF_S(cudaMemLocation, id),

    LAYOUT_S(cudaMemAccessDesc),
    OFF_S(cudaMemAccessDesc, location),
    OFF_S(cudaMemAccessDesc, flags),

    LAYOUT_S(cudaMemPoolProps),
    OFF_S(cudaMemPoolProps, allocType),
    OFF_S(cudaMemPoolProps, handleTypes),
    OFF_S(cudaMemPoolProps, location),
    OFF_S(cudaMemPoolProps, win32SecurityAttributes),
    OFF_S(cudaMemPoolProps, maxSize),
#if CUDA_GRAPH_POOL_USAGE
    OFF_S(cudaMemPoolProps, usage),
#endif
    OFF_S(cudaMemPoolProps, reserved),

    LAYOUT_S(cudaMemAllocNodeParams),
    OFF_S(cudaMemAllocNodeParams, poolProps),
    OFF_S(cudaMemAllocNodeParams, accessDescs),
    OFF_S(cudaMemAllocNodeParams, accessDescCount),
    OFF_S(cudaMemAllocNodeParams, bytesize),
    OFF_S(cudaMemAllocNodeParams, dptr),
    LAYOUT_S(cudaMemAllocNodeParamsV2),
    OFF_S(cudaMemAllocNodeParamsV2, poolProps),
    OFF_S(cudaMemAllocNodeParamsV2, accessDescs),
    OFF_S(cudaMemAllocNodeParamsV2, accessDescCount),
    OFF_S(cudaMemAllocNodeParamsV2, bytesize),
    OFF_S(cudaMemAllocNodeParamsV2, dptr),

    LAYOUT_S(cudaMemFreeNodeParams),
    OFF_S(cudaMemFreeNodeParams, dptr),

    LAYOUT(dim3),
    OFF(dim3, x),
    OFF(dim3, y),
    OFF(dim3, z),

    LAYOUT_S(cudaKernelNodeParams),
    OFF_S(cudaKernelNodeParams, func),
    OFF_S(cudaKernelNodeParams, gridDim),
    OFF_S(cudaKernelNodeParams, blockDim),
    OFF_S(cudaKernelNodeParams, sharedMemBytes),
    OFF_S(cudaKernelNodeParams, kernelParams),
    OFF_S(cudaKernelNodeParams, extra),
    LAYOUT_S(cudaKernelNodeParamsV2),
    OFF_S(cudaKernelNodeParamsV2, func),
    OFF_S(cudaKernelNodeParamsV2, gridDim),
    OFF_S(cudaKernelNodeParamsV2, blockDim),
    OFF_S(cudaKernelNodeParamsV2, sharedMemBytes),
    OFF_S(cudaKernelNodeParamsV2, kernelParams),
    OFF_S(cudaKernelNodeParamsV2, extra),

    LAYOUT_S(cudaMemsetParams),
    OFF_S(cudaMemsetParams, dst),
    OFF_S(cudaMemsetParams, pitch),
    OFF_S(cudaMemsetParams, value),
    OFF_S(cudaMemsetParams, elementSize),
    OFF_S(cudaMemsetParams, width),
    OFF_S(cudaMemsetParams, height),
    LAYOUT_S(cudaMemsetParamsV2),
    OFF_S(cudaMemsetParamsV2, dst),
    OFF_S(cudaMemsetParamsV2, pitch),
    OFF_S(cudaMemsetParamsV2, value),
    OFF_S(cudaMemsetParamsV2, elementSize),
    OFF_S(cudaMemsetParamsV2, width),
    OFF_S(cudaMemsetParamsV2, height),

    LAYOUT_S(cudaPos),
    OFF_S(cudaPos, x),
    OFF_S(cudaPos, y),
    OFF_S(cudaPos, z),
    LAYOUT_S(cudaPitchedPtr),
    OFF_S(cudaPitchedPtr, ptr),
    OFF_S(cudaPitchedPtr, pitch),
    OFF_S(cudaPitchedPtr, xsize),
    OFF_S(cudaPitchedPtr, ysize),
    LAYOUT_S(cudaExtent),
    OFF_S(cudaExtent, width),
    OFF_S(cudaExtent, height),
    OFF_S(cudaExtent, depth),
    LAYOUT_S(cudaMemcpy3DParms),
    OFF_S(cudaMemcpy3DParms, srcArray),
    OFF_S(cudaMemcpy3DParms, srcPos),
    OFF_S(cudaMemcpy3DParms, srcPtr),
    OFF_S(cudaMemcpy3DParms, dstArray),
    OFF_S(cudaMemcpy3DParms, dstPos),
    OFF_S(cudaMemcpy3DParms, dstPtr),
    OFF_S(cudaMemcpy3DParms, extent),
    OFF_S(cudaMemcpy3DParms, kind),
    LAYOUT_S(cudaMemcpyNodeParams),
    OFF_S(cudaMemcpyNodeParams, flags),
    OFF_S(cudaMemcpyNodeParams, reserved),
    OFF_S(cudaMemcpyNodeParams, copyParams),

    LAYOUT_S(cudaEventRecordNodeParams),
    OFF_S(cudaEventRecordNodeParams, event),
    LAYOUT_S(cudaEventWaitNodeParams),
    OFF_S(cudaEventWaitNodeParams, event),

    LAYOUT(cudaGraphInstantiateParams),
    OFF(cudaGraphInstantiateParams, flags),
    OFF(cudaGraphInstantiateParams, uploadStream),
    OFF(cudaGraphInstantiateParams, errNode_out),
    OFF(cudaGraphInstantiateParams, result_out),

    LAYOUT_S(cudaGraphNodeParams),
    OFF_S(cudaGraphNodeParams, type),
    OFF_S(cudaGraphNodeParams, reserved0),
    OFF_S(cudaGraphNodeParams, reserved1),
    OFF_S(cudaGraphNodeParams, kernel),
    OFF_S(cudaGraphNodeParams, memcpy),
    OFF_S(cudaGraphNodeParams, memset),
    OFF_S(cudaGraphNodeParams, host),
    OFF_S(cudaGraphNodeParams, graph),
    OFF_S(cudaGraphNodeParams, eventWait),
    OFF_S(cudaGraphNodeParams, eventRecord),
    OFF_S(cudaGraphNodeParams, extSemSignal),
    OFF_S(cudaGraphNodeParams, extSemWait),
    OFF_S(cudaGraphNodeParams, alloc),
    OFF_S(cudaGraphNodeParams, free),
    OFF_S(cudaGraphNodeParams, conditional),
    OFF_S(cudaGraphNodeParams, reserved2),

    /* -------------------------------------------------------------------------- constants */

    VAL(CUDA_VERSION),
    VAL(CUDART_VERSION),

    VAL(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH),
    VAL(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD),
    VAL(CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH),
    VAL(CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY),
    VAL(cudaGraphInstantiateFlagAutoFreeOnLaunch),
    VAL(cudaGraphInstantiateFlagUpload),
    VAL(cudaGraphInstantiateFlagDeviceLaunch),
    VAL(cudaGraphInstantiateFlagUseNodePriority),

    VAL(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
    VAL(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH),
    VAL(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
    VAL(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH),
    VAL(cudaGraphMemAttrUsedMemCurrent),
    VAL(cudaGraphMemAttrUsedMemHigh),
    VAL(cudaGraphMemAttrReservedMemCurrent),
    VAL(cudaGraphMemAttrReservedMemHigh),

    VAL(CU_STREAM_CAPTURE_MODE_GLOBAL),
    VAL(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
    VAL(CU_STREAM_CAPTURE_MODE_RELAXED),
    VAL(cudaStreamCaptureModeGlobal),
    VAL(cudaStreamCaptureModeThreadLocal),
    VAL(cudaStreamCaptureModeRelaxed),

    VAL(CU_STREAM_CAPTURE_STATUS_NONE),
    VAL(CU_STREAM_CAPTURE_STATUS_ACTIVE),
    VAL(CU_STREAM_CAPTURE_STATUS_INVALIDATED),
    VAL(cudaStreamCaptureStatusNone),
    VAL(cudaStreamCaptureStatusActive),
    VAL(cudaStreamCaptureStatusInvalidated),

    VAL(CU_MEM_ALLOCATION_TYPE_PINNED),
    VAL(CU_MEM_LOCATION_TYPE_DEVICE),
    VAL(CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
    VAL(cudaMemAllocationTypePinned),
    VAL(cudaMemLocationTypeDevice),
    VAL(cudaMemAccessFlagsProtReadWrite),

    VAL(CU_GRAPH_NODE_TYPE_MEM_ALLOC),
    VAL(CU_GRAPH_NODE_TYPE_MEM_FREE),
    VAL(cudaGraphNodeTypeMemAlloc),
    VAL(cudaGraphNodeTypeMemFree),

    PTR(CU_STREAM_LEGACY),
    PTR(CU_STREAM_PER_THREAD),
    PTR(cudaStreamLegacy),
    PTR(cudaStreamPerThread),

    /* Error codes of graph misuse (and of a missing driver), driver API */
    VAL(CUDA_SUCCESS),
    VAL(CUDA_ERROR_INVALID_VALUE),
    VAL(CUDA_ERROR_OUT_OF_MEMORY),
    VAL(CUDA_ERROR_NO_DEVICE),
    VAL(CUDA_ERROR_INVALID_HANDLE),
    VAL(CUDA_ERROR_NOT_FOUND),
    VAL(CUDA_ERROR_NOT_SUPPORTED),
    VAL(CUDA_ERROR_NOT_PERMITTED),
    VAL(CUDA_ERROR_ILLEGAL_STATE),
    VAL(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND),
    VAL(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED),
    VAL(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    VAL(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
    VAL(CUDA_ERROR_STREAM_CAPTURE_MERGE),
    VAL(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED),
    VAL(CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
    VAL(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
    VAL(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
    VAL(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD),
    VAL(CUDA_ERROR_CAPTURED_EVENT),

    /* ... and runtime API */
    VAL(cudaSuccess),
    VAL(cudaErrorInvalidValue),
    VAL(cudaErrorMemoryAllocation),
    VAL(cudaErrorNoDevice),
    VAL(cudaErrorInsufficientDriver),
    VAL(cudaErrorInvalidResourceHandle),
    VAL(cudaErrorSymbolNotFound),
    VAL(cudaErrorNotSupported),
    VAL(cudaErrorNotPermitted),
    VAL(cudaErrorIllegalState),
    VAL(cudaErrorSharedObjectSymbolNotFound),
    VAL(cudaErrorSharedObjectInitFailed),
    VAL(cudaErrorStreamCaptureUnsupported),
    VAL(cudaErrorStreamCaptureInvalidated),
    VAL(cudaErrorStreamCaptureMerge),
    VAL(cudaErrorStreamCaptureUnmatched),
    VAL(cudaErrorStreamCaptureUnjoined),
    VAL(cudaErrorStreamCaptureIsolation),
    VAL(cudaErrorStreamCaptureImplicit),
    VAL(cudaErrorStreamCaptureWrongThread),
    VAL(cudaErrorCapturedEvent),
};

/* The table and its length; the entries and their names live as long as the program. */
const struct cuda_graph_abi_entry *cuda_graph_abi_entries(size_t *count) {
    *count = sizeof entries / sizeof entries[0];
    return entries;
}
