/*
 * The C baseline of cuda-graph-bench: the benchmark's workloads written the way the CUDA
 * Programming Guide ("Graph Memory Nodes") and NVIDIA's graphMemoryFootprint sample write them,
 * with the runtime API, for src/c_path.rs to call in the same process as the Rust paths.
 *
 * Compiled by bench/build.rs with the `cc` crate against the headers cuda-graph-sys used, and
 * linked with the runtime cuda-graph-sys links (libcudart_static.a by default). Kernels come from
 * the PTX text that Rust passes in (cuda_graph::kernels::PTX), loaded with cudaLibraryLoadData
 * and cudaLibraryGetKernel; a cudaKernel_t is what cudaLaunchKernel and kernel nodes take as
 * their function.
 *
 * Every function returns 0, or -1 after filling a gb_error with the runtime call that failed, its
 * cudaError_t, name and text, and the line here. On an error, what the function made is released
 * as far as it can be (a capture in progress is ended first). Times are CLOCK_MONOTONIC
 * nanoseconds, the clock Rust's Instant reads on Linux.
 *
 * Everything here builds against the CUDA 12.x and 13.x headers.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The kernels are loaded with cudaLibraryLoadData, which came with the CUDA 12.5 headers; built
 * with older ones (the crates support 12.3), gb_open refuses with cudaErrorNotSupported. */
#if CUDART_VERSION >= 12050
#define GB_HAVE_LIBRARY 1
#else
#define GB_HAVE_LIBRARY 0
typedef void *cudaLibrary_t;
#endif

/* ---------------------------------------------------------------- shared with src/c_path.rs */

/* Why a function failed. `call`, `name` and `text` are static strings. */
typedef struct gb_error {
    const char *call;
    int code;
    const char *name;
    const char *text;
    int line;
} gb_error;

/* The launch shape of the chain's kernel: fill_u32(p, elements, i) over `grid` x `block`. */
typedef struct gb_shape {
    unsigned long long elements;
    unsigned int grid;
    unsigned int block;
} gb_shape;

/* One steady launch measurement of the chain gb_graph_chain left (gb_steady). */
typedef struct gb_graph_times {
    uint64_t steady_enqueue_ns; /* `launches` cudaGraphLaunch calls, before the synchronize */
    uint64_t steady_ns;         /* the same launches and one cudaStreamSynchronize */
} gb_graph_times;

/* One build + instantiate cycle (gb_build_instantiate). */
typedef struct gb_cycle_times {
    uint64_t build_ns;       /* cudaGraphCreate + 3k nodes, or the whole capture */
    uint64_t instantiate_ns; /* cudaGraphInstantiate */
} gb_cycle_times;

/* One step of the kernel chain's update (gb_update_step). */
typedef struct gb_update_times {
    uint64_t build_ns;       /* cudaGraphCreate + k kernel nodes */
    uint64_t update_ns;      /* cudaGraphExecUpdate of the kept executable graph from it */
    uint64_t instantiate_ns; /* cudaGraphInstantiate of a graph built the same way */
} gb_update_times;

/* One run of the same work without a graph (gb_stream_chain). */
typedef struct gb_stream_times {
    uint64_t enqueue_ns; /* `iters` x k x (cudaMallocAsync, cudaLaunchKernel, cudaFreeAsync) */
    uint64_t total_ns;   /* the same and one cudaStreamSynchronize */
} gb_stream_times;

/* The graph-memory attributes of the device, in bytes. */
typedef struct gb_mem {
    unsigned long long used;
    unsigned long long reserved;
    unsigned long long used_high;
    unsigned long long reserved_high;
} gb_mem;

/* Which chain a workload builds (src/workload.rs, Mode). */
enum {
    GB_EXPLICIT = 0, /* explicit alloc, kernel and free nodes */
    GB_CAPTURE = 1,  /* captured cudaMallocAsync, cudaLaunchKernel, cudaFreeAsync */
    GB_ESCAPING = 2  /* explicit alloc and kernel nodes, no free: every allocation escapes the
                      * graph, which is instantiated with cudaGraphInstantiateFlagAutoFreeOnLaunch */
};

/* What gb_open sets up: the device, the kernels, and the stream the chain workloads run on;
 * the chain gb_graph_chain leaves for gb_launch_sync, until gb_release_chain; and the kernel
 * chain gb_update_chain sets up for gb_update_step, until gb_release_update. */
typedef struct gb_ctx {
    int device;
    cudaLibrary_t library;
    cudaKernel_t fill;      /* fill_u32(unsigned *p, unsigned long long n, unsigned v) */
    cudaKernel_t spin_fill; /* spin_then_fill_u32(p, n, v, unsigned long long spins) */
    cudaKernel_t add;       /* add_u32(unsigned *p, unsigned long long n, unsigned v) */
    cudaStream_t stream;
    cudaGraph_t chain_graph;
    cudaGraphExec_t chain_exec;
    void **chain_escaped; /* GB_ESCAPING: the chain's allocations, live after each launch */
    unsigned int chain_escaped_count;
    unsigned int *update_buffer;  /* the kernel chain's buffer (cudaMalloc), shape.elements values */
    cudaGraphExec_t update_exec;  /* instantiated from step 0's chain, updated at every step */
    unsigned int update_k;
    gb_shape update_shape;
} gb_ctx;

/* Graphs of the footprint scenarios, as in graphMemoryFootprint. */
#define GB_NUM_GRAPHS 8

/* ---------------------------------------------------------------- helpers */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fail(gb_error *err, const char *call, cudaError_t code, int line)
{
    if (err == NULL) {
        return;
    }
    err->call = call;
    err->code = (int)code;
    err->name = cudaGetErrorName(code);
    err->text = cudaGetErrorString(code);
    err->line = line;
}

/* Calls a runtime function; on an error, records it and jumps to the function's `out:`. */
#define CK(fn, args)                                                                               \
    do {                                                                                           \
        cudaError_t ck_status_ = fn args;                                                          \
        if (ck_status_ != cudaSuccess) {                                                           \
            fail(err, #fn, ck_status_, __LINE__);                                                  \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static dim3 dim1(unsigned int x)
{
    dim3 d;
    d.x = x;
    d.y = 1;
    d.z = 1;
    return d;
}

/* The Guide's allocation parameters: pinned memory resident on the device. */
static struct cudaMemAllocNodeParams alloc_params(int device, size_t bytes)
{
    struct cudaMemAllocNodeParams params;
    memset(&params, 0, sizeof params);
    params.poolProps.allocType = cudaMemAllocationTypePinned;
    params.poolProps.location.type = cudaMemLocationTypeDevice;
    params.poolProps.location.id = device;
    params.bytesize = bytes;
    return params;
}

static int read_mem(int device, gb_mem *m, gb_error *err)
{
    CK(cudaDeviceGetGraphMemAttribute, (device, cudaGraphMemAttrUsedMemCurrent, &m->used));
    CK(cudaDeviceGetGraphMemAttribute, (device, cudaGraphMemAttrReservedMemCurrent, &m->reserved));
    CK(cudaDeviceGetGraphMemAttribute, (device, cudaGraphMemAttrUsedMemHigh, &m->used_high));
    CK(cudaDeviceGetGraphMemAttribute, (device, cudaGraphMemAttrReservedMemHigh, &m->reserved_high));
    return 0;
out:
    return -1;
}

/* Every scenario starts from nothing: no work in flight, no graph memory kept, high marks reset. */
static int fresh_start(int device, gb_error *err)
{
    unsigned long long zero = 0;
    CK(cudaDeviceSynchronize, ());
    CK(cudaDeviceGraphMemTrim, (device));
    CK(cudaDeviceSetGraphMemAttribute, (device, cudaGraphMemAttrUsedMemHigh, &zero));
    zero = 0;
    CK(cudaDeviceSetGraphMemAttribute, (device, cudaGraphMemAttrReservedMemHigh, &zero));
    return 0;
out:
    return -1;
}

/* ---------------------------------------------------------------- set-up */

int gb_release_chain(gb_ctx *ctx, gb_error *err);
int gb_release_update(gb_ctx *ctx, gb_error *err);

int gb_open(const char *ptx, int device, gb_ctx **out_ctx, gb_error *err)
{
    gb_ctx *ctx = calloc(1, sizeof *ctx);
    *out_ctx = NULL;
    if (ctx == NULL) {
        fail(err, "calloc", cudaErrorMemoryAllocation, __LINE__);
        return -1;
    }
    ctx->device = device;
    CK(cudaSetDevice, (device));
#if GB_HAVE_LIBRARY
    CK(cudaLibraryLoadData, (&ctx->library, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CK(cudaLibraryGetKernel, (&ctx->fill, ctx->library, "fill_u32"));
    CK(cudaLibraryGetKernel, (&ctx->spin_fill, ctx->library, "spin_then_fill_u32"));
    CK(cudaLibraryGetKernel, (&ctx->add, ctx->library, "add_u32"));
#else
    (void)ptx;
    fail(err, "cudaLibraryLoadData (needs CUDA 12.5 headers or newer)", cudaErrorNotSupported,
         __LINE__);
    goto out;
#endif
    CK(cudaStreamCreateWithFlags, (&ctx->stream, cudaStreamNonBlocking));
    *out_ctx = ctx;
    return 0;
out:
    if (ctx->stream != NULL) {
        (void)cudaStreamDestroy(ctx->stream);
    }
#if GB_HAVE_LIBRARY
    if (ctx->library != NULL) {
        (void)cudaLibraryUnload(ctx->library);
    }
#endif
    free(ctx);
    return -1;
}

int gb_close(gb_ctx *ctx, gb_error *err)
{
    int rc = -1;
    if (ctx == NULL) {
        return 0;
    }
    if (gb_release_chain(ctx, err) != 0) {
        goto out;
    }
    if (gb_release_update(ctx, err) != 0) {
        goto out;
    }
    CK(cudaStreamSynchronize, (ctx->stream));
    CK(cudaStreamDestroy, (ctx->stream));
    ctx->stream = NULL;
#if GB_HAVE_LIBRARY
    CK(cudaLibraryUnload, (ctx->library));
#endif
    ctx->library = NULL;
    rc = 0;
out:
    if (ctx->chain_exec != NULL) {
        (void)cudaGraphExecDestroy(ctx->chain_exec);
    }
    if (ctx->chain_graph != NULL) {
        (void)cudaGraphDestroy(ctx->chain_graph);
    }
    free(ctx->chain_escaped);
    if (ctx->update_exec != NULL) {
        (void)cudaGraphExecDestroy(ctx->update_exec);
    }
    if (ctx->update_buffer != NULL) {
        (void)cudaFree(ctx->update_buffer);
    }
    if (ctx->stream != NULL) {
        (void)cudaStreamDestroy(ctx->stream);
    }
#if GB_HAVE_LIBRARY
    if (ctx->library != NULL) {
        (void)cudaLibraryUnload(ctx->library);
    }
#endif
    free(ctx);
    return rc;
}

/* The sizes of the structures above, for src/c_path.rs to check its copies of them against. */
void gb_layout(unsigned long long sizes[7])
{
    sizes[0] = sizeof(gb_error);
    sizes[1] = sizeof(gb_shape);
    sizes[2] = sizeof(gb_graph_times);
    sizes[3] = sizeof(gb_stream_times);
    sizes[4] = sizeof(gb_mem);
    sizes[5] = sizeof(gb_cycle_times);
    sizes[6] = sizeof(gb_update_times);
}

/* The runtime's version (cudaRuntimeGetVersion), for the report. */
int gb_runtime_version(int *version, gb_error *err)
{
    CK(cudaRuntimeGetVersion, (version));
    return 0;
out:
    return -1;
}

/* ---------------------------------------------------------------- the chain workloads */

/*
 * Builds a chain of k segments alloc -> kernel -> free, each segment after the previous one's
 * free, so CUDA reuses one address for all of them (G.4.1): with explicit nodes (GB_EXPLICIT) or
 * by capturing cudaMallocAsync / cudaLaunchKernel / cudaFreeAsync on the context's stream
 * (GB_CAPTURE). GB_ESCAPING: explicit alloc -> kernel segments, each after the previous kernel,
 * without free nodes (G.3.3); their k addresses go into escaped[] unless it is NULL. On success
 * *out holds the graph; on an error nothing is left (a capture in progress is ended and its graph
 * destroyed).
 */
static int build_chain(gb_ctx *ctx, int mode, unsigned int k, const gb_shape *shape,
                       cudaGraph_t *out_graph, void **escaped, gb_error *err)
{
    int capturing = 0;
    cudaGraph_t graph = NULL;
    cudaStream_t stream = ctx->stream;
    const size_t bytes = (size_t)shape->elements * sizeof(unsigned int);
    const dim3 grid = dim1(shape->grid);
    const dim3 block = dim1(shape->block);
    unsigned long long n = shape->elements;

    if (mode != GB_CAPTURE) {
        struct cudaMemAllocNodeParams params = alloc_params(ctx->device, bytes);
        cudaGraphNode_t prev = NULL;
        CK(cudaGraphCreate, (&graph, 0));
        for (unsigned int i = 0; i < k; i++) {
            cudaGraphNode_t alloc_node, kernel_node, free_node;
            struct cudaKernelNodeParams kernel_params;
            void *dptr;
            unsigned int v = i;
            void *args[3];

            CK(cudaGraphAddMemAllocNode,
               (&alloc_node, graph, prev == NULL ? NULL : &prev, prev == NULL ? 0 : 1, &params));
            dptr = params.dptr;

            args[0] = &dptr;
            args[1] = &n;
            args[2] = &v;
            memset(&kernel_params, 0, sizeof kernel_params);
            kernel_params.func = (void *)ctx->fill;
            kernel_params.gridDim = grid;
            kernel_params.blockDim = block;
            kernel_params.sharedMemBytes = 0;
            kernel_params.kernelParams = args;
            kernel_params.extra = NULL;
            CK(cudaGraphAddKernelNode, (&kernel_node, graph, &alloc_node, 1, &kernel_params));

            if (mode == GB_ESCAPING) {
                if (escaped != NULL) {
                    escaped[i] = dptr;
                }
                prev = kernel_node;
                continue;
            }
            CK(cudaGraphAddMemFreeNode, (&free_node, graph, &kernel_node, 1, dptr));
            prev = free_node;
        }
    } else {
        CK(cudaStreamBeginCapture, (stream, cudaStreamCaptureModeGlobal));
        capturing = 1;
        for (unsigned int i = 0; i < k; i++) {
            void *dptr;
            unsigned int v = i;
            void *args[3];
            CK(cudaMallocAsync, (&dptr, bytes, stream));
            args[0] = &dptr;
            args[1] = &n;
            args[2] = &v;
            CK(cudaLaunchKernel, ((const void *)ctx->fill, grid, block, args, 0, stream));
            CK(cudaFreeAsync, (dptr, stream));
        }
        capturing = 0;
        CK(cudaStreamEndCapture, (stream, &graph));
    }
    *out_graph = graph;
    return 0;
out:
    if (capturing) {
        cudaGraph_t discarded = NULL;
        (void)cudaStreamEndCapture(stream, &discarded);
        if (discarded != NULL) {
            (void)cudaGraphDestroy(discarded);
        }
    }
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    return -1;
}

/* The flags a chain is instantiated with: AutoFreeOnLaunch when its allocations escape, so that
 * it can be launched again while the previous launch's allocations are live (G.3.4). */
static unsigned long long chain_flags(int mode)
{
    return mode == GB_ESCAPING ? (unsigned long long)cudaGraphInstantiateFlagAutoFreeOnLaunch : 0;
}

/* Frees, on the stream after its work, the allocations the last launch of an escaping chain left
 * live: n addresses. */
static int free_escaped(gb_ctx *ctx, void **escaped, unsigned int n, gb_error *err)
{
    for (unsigned int i = 0; i < n; i++) {
        CK(cudaFreeAsync, (escaped[i], ctx->stream));
    }
    return 0;
out:
    return -1;
}

/* Destroys the chain gb_graph_chain left, if any, after its launches finish; frees the
 * allocations its last launch left live (GB_ESCAPING). */
int gb_release_chain(gb_ctx *ctx, gb_error *err)
{
    int rc = -1;
    void **escaped = ctx->chain_escaped;
    unsigned int n = ctx->chain_escaped_count;
    ctx->chain_escaped = NULL;
    ctx->chain_escaped_count = 0;
    if (ctx->chain_exec != NULL) {
        if (free_escaped(ctx, escaped, n, err) != 0) {
            goto out;
        }
        CK(cudaStreamSynchronize, (ctx->stream));
        CK(cudaGraphExecDestroy, (ctx->chain_exec));
        ctx->chain_exec = NULL;
    }
    if (ctx->chain_graph != NULL) {
        CK(cudaGraphDestroy, (ctx->chain_graph));
        ctx->chain_graph = NULL;
    }
    rc = 0;
out:
    free(escaped);
    return rc;
}

/*
 * The chain of build_chain, built and instantiated untimed (gb_build_instantiate times those),
 * then launched once and synchronized (*first_launch_ns). The executable graph stays in `ctx`
 * for gb_steady and gb_launch_sync until gb_release_chain (or the next call).
 */
int gb_graph_chain(gb_ctx *ctx, int mode, unsigned int k, const gb_shape *shape,
                   uint64_t *first_launch_ns, gb_error *err)
{
    int rc = -1;
    int launched = 0;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaStream_t stream = ctx->stream;
    void **escaped = NULL;
    uint64_t t0;

    *first_launch_ns = 0;
    if (gb_release_chain(ctx, err) != 0) {
        return -1;
    }
    if (mode == GB_ESCAPING) {
        escaped = calloc(k == 0 ? 1 : k, sizeof *escaped);
        if (escaped == NULL) {
            fail(err, "calloc", cudaErrorMemoryAllocation, __LINE__);
            goto out;
        }
    }
    if (build_chain(ctx, mode, k, shape, &graph, escaped, err) != 0) {
        goto out;
    }
    CK(cudaGraphInstantiate, (&exec, graph, chain_flags(mode)));

    t0 = now_ns();
    CK(cudaGraphLaunch, (exec, stream));
    launched = 1;
    CK(cudaStreamSynchronize, (stream));
    *first_launch_ns = now_ns() - t0;

    ctx->chain_graph = graph;
    ctx->chain_exec = exec;
    ctx->chain_escaped = escaped;
    ctx->chain_escaped_count = escaped == NULL ? 0 : k;
    graph = NULL;
    exec = NULL;
    escaped = NULL;
    rc = 0;
out:
    if (exec != NULL) {
        if (launched && escaped != NULL) {
            (void)free_escaped(ctx, escaped, k, NULL);
        }
        (void)cudaStreamSynchronize(stream);
        (void)cudaGraphExecDestroy(exec);
    }
    free(escaped);
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    return rc;
}

/* Whether gb_graph_chain left no chain; if so, records `call` as the error. */
static int no_chain(const gb_ctx *ctx, const char *call, gb_error *err)
{
    if (ctx->chain_exec != NULL) {
        return 0;
    }
    fail(err, call, cudaErrorInvalidValue, __LINE__);
    return 1;
}

/* `launches` times cudaGraphLaunch, then one cudaStreamSynchronize, of the chain gb_graph_chain
 * left. */
int gb_steady(gb_ctx *ctx, unsigned int launches, gb_graph_times *times, gb_error *err)
{
    uint64_t t0, t1;
    memset(times, 0, sizeof *times);
    if (no_chain(ctx, "gb_steady (no chain: call gb_graph_chain first)", err)) {
        return -1;
    }
    t0 = now_ns();
    for (unsigned int i = 0; i < launches; i++) {
        CK(cudaGraphLaunch, (ctx->chain_exec, ctx->stream));
    }
    t1 = now_ns();
    CK(cudaStreamSynchronize, (ctx->stream));
    times->steady_ns = now_ns() - t0;
    times->steady_enqueue_ns = t1 - t0;
    return 0;
out:
    return -1;
}

/* `iters` times cudaGraphLaunch + cudaStreamSynchronize of the chain gb_graph_chain left. */
int gb_launch_sync(gb_ctx *ctx, unsigned int iters, uint64_t *ns, gb_error *err)
{
    uint64_t t0;
    *ns = 0;
    if (no_chain(ctx, "gb_launch_sync (no chain: call gb_graph_chain first)", err)) {
        return -1;
    }
    t0 = now_ns();
    for (unsigned int i = 0; i < iters; i++) {
        CK(cudaGraphLaunch, (ctx->chain_exec, ctx->stream));
        CK(cudaStreamSynchronize, (ctx->stream));
    }
    *ns = now_ns() - t0;
    return 0;
out:
    return -1;
}

/*
 * One build + instantiate cycle: the chain of build_chain, instantiated, then the executable
 * graph and the graph destroyed without a launch. Times the build and the instantiation.
 */
int gb_build_instantiate(gb_ctx *ctx, int mode, unsigned int k, const gb_shape *shape,
                         gb_cycle_times *times, gb_error *err)
{
    int rc = -1;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    uint64_t t0, t1;

    memset(times, 0, sizeof *times);
    t0 = now_ns();
    if (build_chain(ctx, mode, k, shape, &graph, NULL, err) != 0) {
        goto out;
    }
    t1 = now_ns();
    times->build_ns = t1 - t0;

    t0 = now_ns();
    CK(cudaGraphInstantiate, (&exec, graph, chain_flags(mode)));
    t1 = now_ns();
    times->instantiate_ns = t1 - t0;

    CK(cudaGraphExecDestroy, (exec));
    exec = NULL;
    CK(cudaGraphDestroy, (graph));
    graph = NULL;
    rc = 0;
out:
    if (exec != NULL) {
        (void)cudaGraphExecDestroy(exec);
    }
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    return rc;
}

/* The same work without a graph: `iters` times k x (cudaMallocAsync, kernel, cudaFreeAsync) on
 * the stream, then one synchronize. */
int gb_stream_chain(gb_ctx *ctx, unsigned int k, const gb_shape *shape, unsigned int iters,
                    gb_stream_times *times, gb_error *err)
{
    cudaStream_t stream = ctx->stream;
    const size_t bytes = (size_t)shape->elements * sizeof(unsigned int);
    const dim3 grid = dim1(shape->grid);
    const dim3 block = dim1(shape->block);
    unsigned long long n = shape->elements;
    uint64_t t0, t1, t2;

    memset(times, 0, sizeof *times);
    t0 = now_ns();
    for (unsigned int it = 0; it < iters; it++) {
        for (unsigned int i = 0; i < k; i++) {
            void *dptr;
            unsigned int v = i;
            void *args[3];
            CK(cudaMallocAsync, (&dptr, bytes, stream));
            args[0] = &dptr;
            args[1] = &n;
            args[2] = &v;
            CK(cudaLaunchKernel, ((const void *)ctx->fill, grid, block, args, 0, stream));
            CK(cudaFreeAsync, (dptr, stream));
        }
    }
    t1 = now_ns();
    CK(cudaStreamSynchronize, (stream));
    t2 = now_ns();
    times->enqueue_ns = t1 - t0;
    times->total_ns = t2 - t0;
    return 0;
out:
    (void)cudaStreamSynchronize(stream);
    return -1;
}

/* ---------------------------------------------------------------- updating in place */

/* The value node i of the kernel chain adds at step `step`: as update_value in src/workload.rs. */
static unsigned int update_value(unsigned int step, unsigned int i)
{
    return step + i;
}

/*
 * The kernel chain of step `step`: k kernel nodes add_u32(buffer, n, update_value(step, i)), each
 * after the previous one, no memory nodes (an alloc node's address is fixed for the life of its
 * graph, so a graph with memory nodes cannot be updated from another). On success *out_graph
 * holds the graph; on an error nothing is left.
 */
static int build_add_chain(gb_ctx *ctx, unsigned int step, cudaGraph_t *out_graph, gb_error *err)
{
    cudaGraph_t graph = NULL;
    cudaGraphNode_t prev = NULL;
    void *dptr = ctx->update_buffer;
    unsigned long long n = ctx->update_shape.elements;
    const dim3 grid = dim1(ctx->update_shape.grid);
    const dim3 block = dim1(ctx->update_shape.block);

    CK(cudaGraphCreate, (&graph, 0));
    for (unsigned int i = 0; i < ctx->update_k; i++) {
        cudaGraphNode_t kernel_node;
        struct cudaKernelNodeParams kernel_params;
        unsigned int v = update_value(step, i);
        void *args[3];

        args[0] = &dptr;
        args[1] = &n;
        args[2] = &v;
        memset(&kernel_params, 0, sizeof kernel_params);
        kernel_params.func = (void *)ctx->add;
        kernel_params.gridDim = grid;
        kernel_params.blockDim = block;
        kernel_params.sharedMemBytes = 0;
        kernel_params.kernelParams = args;
        kernel_params.extra = NULL;
        CK(cudaGraphAddKernelNode,
           (&kernel_node, graph, prev == NULL ? NULL : &prev, prev == NULL ? 0 : 1, &kernel_params));
        prev = kernel_node;
    }
    *out_graph = graph;
    return 0;
out:
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    return -1;
}

/* Destroys what gb_update_chain set up, if anything, after its launches finish. */
int gb_release_update(gb_ctx *ctx, gb_error *err)
{
    if (ctx->update_exec != NULL) {
        CK(cudaStreamSynchronize, (ctx->stream));
        CK(cudaGraphExecDestroy, (ctx->update_exec));
        ctx->update_exec = NULL;
    }
    if (ctx->update_buffer != NULL) {
        CK(cudaFree, (ctx->update_buffer));
        ctx->update_buffer = NULL;
    }
    return 0;
out:
    return -1;
}

/*
 * Sets up the kernel chain for gb_update_step: a buffer of shape->elements values (cudaMalloc)
 * and an executable graph instantiated from step 0's chain of k kernel nodes.
 */
int gb_update_chain(gb_ctx *ctx, unsigned int k, const gb_shape *shape, gb_error *err)
{
    cudaGraph_t graph = NULL;

    if (gb_release_update(ctx, err) != 0) {
        return -1;
    }
    ctx->update_k = k;
    ctx->update_shape = *shape;
    CK(cudaMalloc, ((void **)&ctx->update_buffer, (size_t)shape->elements * sizeof(unsigned int)));
    if (build_add_chain(ctx, 0, &graph, err) != 0) {
        goto out;
    }
    CK(cudaGraphInstantiate, (&ctx->update_exec, graph, 0));
    CK(cudaGraphDestroy, (graph));
    return 0;
out:
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    return -1;
}

/*
 * One step of the kernel chain (step >= 1): builds step `step`'s chain and updates the kept
 * executable graph in place from it (cudaGraphExecUpdate); builds it again and instantiates that
 * graph (cudaGraphInstantiate), then destroys the new executable graph without a launch. Then
 * zeroes the buffer, launches the updated executable graph, synchronizes and copies the buffer
 * into host[] (shape->elements values) for the caller to check. Times the first build, the
 * update and the instantiation.
 */
int gb_update_step(gb_ctx *ctx, unsigned int step, unsigned int *host, gb_update_times *times,
                   gb_error *err)
{
    int rc = -1;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t fresh = NULL;
    cudaGraphExecUpdateResultInfo info;
    const size_t bytes = (size_t)ctx->update_shape.elements * sizeof(unsigned int);
    uint64_t t0, t1;

    memset(times, 0, sizeof *times);
    if (ctx->update_exec == NULL) {
        fail(err, "gb_update_step (no kernel chain: call gb_update_chain first)",
             cudaErrorInvalidValue, __LINE__);
        return -1;
    }
    t0 = now_ns();
    if (build_add_chain(ctx, step, &graph, err) != 0) {
        goto out;
    }
    t1 = now_ns();
    times->build_ns = t1 - t0;

    t0 = now_ns();
    CK(cudaGraphExecUpdate, (ctx->update_exec, graph, &info));
    t1 = now_ns();
    times->update_ns = t1 - t0;
    CK(cudaGraphDestroy, (graph));
    graph = NULL;

    if (build_add_chain(ctx, step, &graph, err) != 0) {
        goto out;
    }
    t0 = now_ns();
    CK(cudaGraphInstantiate, (&fresh, graph, 0));
    t1 = now_ns();
    times->instantiate_ns = t1 - t0;
    CK(cudaGraphExecDestroy, (fresh));
    fresh = NULL;
    CK(cudaGraphDestroy, (graph));
    graph = NULL;

    CK(cudaMemsetAsync, (ctx->update_buffer, 0, bytes, ctx->stream));
    CK(cudaGraphLaunch, (ctx->update_exec, ctx->stream));
    CK(cudaStreamSynchronize, (ctx->stream));
    CK(cudaMemcpy, (host, ctx->update_buffer, bytes, cudaMemcpyDeviceToHost));
    rc = 0;
out:
    if (fresh != NULL) {
        (void)cudaGraphExecDestroy(fresh);
    }
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    (void)cudaStreamSynchronize(ctx->stream);
    return rc;
}

/* ---------------------------------------------------------------- footprint scenarios */

/*
 * The scenarios of graphMemoryFootprint, each from a fresh start (synchronized, trimmed, high
 * marks reset). After each step the four graph-memory attributes go into steps[], in the order
 * that src/footprint.rs names them; *nsteps says how many were written (at most max_steps).
 */

#define STEP()                                                                                     \
    do {                                                                                           \
        if (*nsteps >= max_steps) {                                                                \
            fail(err, "gb_footprint: more steps than the caller expects", cudaErrorInvalidValue,   \
                 __LINE__);                                                                        \
            goto out;                                                                              \
        }                                                                                          \
        if (read_mem(ctx->device, &steps[*nsteps], err) != 0) {                                    \
            goto out;                                                                              \
        }                                                                                          \
        *nsteps += 1;                                                                              \
    } while (0)

/*
 * Address reuse in one graph: alloc A -> free A -> alloc B -> free B. B depends on A's free, so
 * CUDA may give it A's address (*same_address says whether it did).
 * Steps: instantiated; launched and synchronized; exec destroyed and trimmed.
 */
int gb_fp_address_reuse(gb_ctx *ctx, size_t bytes, gb_mem *steps, unsigned int max_steps,
                        unsigned int *nsteps, int *same_address, gb_error *err)
{
    int rc = -1;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaGraphNode_t alloc_a, free_a, alloc_b, free_b;
    struct cudaMemAllocNodeParams params = alloc_params(ctx->device, bytes);
    void *d_a, *d_b;

    *nsteps = 0;
    if (fresh_start(ctx->device, err) != 0) {
        return -1;
    }
    CK(cudaGraphCreate, (&graph, 0));
    CK(cudaGraphAddMemAllocNode, (&alloc_a, graph, NULL, 0, &params));
    d_a = params.dptr;
    CK(cudaGraphAddMemFreeNode, (&free_a, graph, &alloc_a, 1, d_a));
    CK(cudaGraphAddMemAllocNode, (&alloc_b, graph, &free_a, 1, &params));
    d_b = params.dptr;
    CK(cudaGraphAddMemFreeNode, (&free_b, graph, &alloc_b, 1, d_b));
    *same_address = d_a == d_b;
    CK(cudaGraphInstantiate, (&exec, graph, 0));
    CK(cudaGraphDestroy, (graph));
    graph = NULL;
    STEP();

    CK(cudaGraphLaunch, (exec, ctx->stream));
    CK(cudaStreamSynchronize, (ctx->stream));
    STEP();

    CK(cudaGraphExecDestroy, (exec));
    exec = NULL;
    CK(cudaDeviceGraphMemTrim, (ctx->device));
    STEP();
    rc = 0;
out:
    if (exec != NULL) {
        (void)cudaStreamSynchronize(ctx->stream);
        (void)cudaGraphExecDestroy(exec);
    }
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    return rc;
}

/* alloc -> spin_then_fill_u32 -> free, instantiated; the kernel keeps the graph running for
 * `spins` clock cycles so that graphs launched into different streams overlap. */
static int simple_alloc_free_graph(gb_ctx *ctx, const gb_shape *shape, unsigned long long spins,
                                   cudaGraphExec_t *exec, void **dptr, gb_error *err)
{
    int rc = -1;
    cudaGraph_t graph = NULL;
    cudaGraphNode_t alloc_node, kernel_node, free_node;
    struct cudaMemAllocNodeParams params =
        alloc_params(ctx->device, (size_t)shape->elements * sizeof(unsigned int));
    struct cudaKernelNodeParams kernel_params;
    unsigned long long n = shape->elements;
    unsigned int v = 7;
    void *args[4];

    *exec = NULL;
    CK(cudaGraphCreate, (&graph, 0));
    CK(cudaGraphAddMemAllocNode, (&alloc_node, graph, NULL, 0, &params));
    *dptr = params.dptr;
    args[0] = dptr;
    args[1] = &n;
    args[2] = &v;
    args[3] = &spins;
    memset(&kernel_params, 0, sizeof kernel_params);
    kernel_params.func = (void *)ctx->spin_fill;
    kernel_params.gridDim = dim1(shape->grid);
    kernel_params.blockDim = dim1(shape->block);
    kernel_params.kernelParams = args;
    CK(cudaGraphAddKernelNode, (&kernel_node, graph, &alloc_node, 1, &kernel_params));
    CK(cudaGraphAddMemFreeNode, (&free_node, graph, &kernel_node, 1, *dptr));
    CK(cudaGraphInstantiate, (exec, graph, 0));
    rc = 0;
out:
    if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    return rc;
}

static void destroy_execs(cudaGraphExec_t *execs, int count)
{
    for (int i = 0; i < count; i++) {
        if (execs[i] != NULL) {
            (void)cudaGraphExecDestroy(execs[i]);
            execs[i] = NULL;
        }
    }
}

/*
 * Eight graphs launched into one stream share physical memory.
 * Steps: 8 graphs instantiated; graph 0 launched; graph 0 relaunched; graphs 1..7 launched (one
 * step each); synchronized; execs destroyed and trimmed. *distinct: all addresses differ.
 */
int gb_fp_one_stream(gb_ctx *ctx, const gb_shape *shape, unsigned long long spins, gb_mem *steps,
                     unsigned int max_steps, unsigned int *nsteps, int *distinct, gb_error *err)
{
    int rc = -1;
    cudaGraphExec_t execs[GB_NUM_GRAPHS] = {0};
    void *dptrs[GB_NUM_GRAPHS] = {0};

    *nsteps = 0;
    if (fresh_start(ctx->device, err) != 0) {
        return -1;
    }
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        if (simple_alloc_free_graph(ctx, shape, spins, &execs[i], &dptrs[i], err) != 0) {
            goto out;
        }
    }
    STEP();
    CK(cudaGraphLaunch, (execs[0], ctx->stream));
    STEP();
    CK(cudaGraphLaunch, (execs[0], ctx->stream));
    STEP();
    for (int i = 1; i < GB_NUM_GRAPHS; i++) {
        CK(cudaGraphLaunch, (execs[i], ctx->stream));
        STEP();
    }
    CK(cudaStreamSynchronize, (ctx->stream));
    STEP();
    *distinct = 1;
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        for (int j = i + 1; j < GB_NUM_GRAPHS; j++) {
            if (dptrs[i] == dptrs[j]) {
                *distinct = 0;
            }
        }
    }
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        CK(cudaGraphExecDestroy, (execs[i]));
        execs[i] = NULL;
    }
    CK(cudaDeviceGraphMemTrim, (ctx->device));
    STEP();
    rc = 0;
out:
    (void)cudaStreamSynchronize(ctx->stream);
    destroy_execs(execs, GB_NUM_GRAPHS);
    return rc;
}

/*
 * Graphs launched into concurrent streams need memory of their own.
 * Steps: 8 graphs instantiated; graph i launched into stream i (8 steps); all synchronized;
 * execs destroyed and trimmed.
 */
int gb_fp_concurrent(gb_ctx *ctx, const gb_shape *shape, unsigned long long spins, gb_mem *steps,
                     unsigned int max_steps, unsigned int *nsteps, gb_error *err)
{
    int rc = -1;
    cudaGraphExec_t execs[GB_NUM_GRAPHS] = {0};
    void *dptrs[GB_NUM_GRAPHS] = {0};
    cudaStream_t streams[GB_NUM_GRAPHS] = {0};

    *nsteps = 0;
    if (fresh_start(ctx->device, err) != 0) {
        return -1;
    }
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        if (simple_alloc_free_graph(ctx, shape, spins, &execs[i], &dptrs[i], err) != 0) {
            goto out;
        }
        CK(cudaStreamCreateWithFlags, (&streams[i], cudaStreamNonBlocking));
    }
    STEP();
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        CK(cudaGraphLaunch, (execs[i], streams[i]));
        STEP();
    }
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        CK(cudaStreamSynchronize, (streams[i]));
    }
    STEP();
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        CK(cudaGraphExecDestroy, (execs[i]));
        execs[i] = NULL;
    }
    CK(cudaDeviceGraphMemTrim, (ctx->device));
    STEP();
    rc = 0;
out:
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        if (streams[i] != NULL) {
            (void)cudaStreamSynchronize(streams[i]);
        }
    }
    destroy_execs(execs, GB_NUM_GRAPHS);
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        if (streams[i] != NULL) {
            (void)cudaStreamDestroy(streams[i]);
        }
    }
    return rc;
}

/*
 * Allocations a graph does not free (G.3.3) keep their memory until freed; trim returns it only
 * after that. Eight graphs of one alloc node each, launched into one stream.
 * Steps: 8 graphs instantiated; graph i launched (8 steps); synchronized; trimmed with the
 * allocations live; allocations freed (cudaFreeAsync, synchronized); trimmed; execs destroyed and
 * trimmed.
 */
int gb_fp_unfreed(gb_ctx *ctx, size_t bytes, gb_mem *steps, unsigned int max_steps,
                  unsigned int *nsteps, gb_error *err)
{
    int rc = -1;
    int launched = 0;
    int freed = 0;
    cudaGraphExec_t execs[GB_NUM_GRAPHS] = {0};
    void *dptrs[GB_NUM_GRAPHS] = {0};

    *nsteps = 0;
    if (fresh_start(ctx->device, err) != 0) {
        return -1;
    }
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        cudaGraph_t graph = NULL;
        cudaGraphNode_t alloc_node;
        struct cudaMemAllocNodeParams params = alloc_params(ctx->device, bytes);
        cudaError_t status = cudaGraphCreate(&graph, 0);
        if (status == cudaSuccess) {
            status = cudaGraphAddMemAllocNode(&alloc_node, graph, NULL, 0, &params);
            if (status == cudaSuccess) {
                dptrs[i] = params.dptr;
                status = cudaGraphInstantiate(&execs[i], graph, 0);
                if (status != cudaSuccess) {
                    fail(err, "cudaGraphInstantiate", status, __LINE__);
                }
            } else {
                fail(err, "cudaGraphAddMemAllocNode", status, __LINE__);
            }
            (void)cudaGraphDestroy(graph);
        } else {
            fail(err, "cudaGraphCreate", status, __LINE__);
        }
        if (status != cudaSuccess) {
            goto out;
        }
    }
    STEP();
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        CK(cudaGraphLaunch, (execs[i], ctx->stream));
        launched = i + 1;
        STEP();
    }
    CK(cudaStreamSynchronize, (ctx->stream));
    STEP();
    CK(cudaDeviceGraphMemTrim, (ctx->device));
    STEP();
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        CK(cudaFreeAsync, (dptrs[i], ctx->stream));
        freed = i + 1;
    }
    CK(cudaStreamSynchronize, (ctx->stream));
    STEP();
    CK(cudaDeviceGraphMemTrim, (ctx->device));
    STEP();
    for (int i = 0; i < GB_NUM_GRAPHS; i++) {
        CK(cudaGraphExecDestroy, (execs[i]));
        execs[i] = NULL;
    }
    CK(cudaDeviceGraphMemTrim, (ctx->device));
    STEP();
    rc = 0;
out:
    /* Whatever a launch allocated and nobody freed yet is freed here, so nothing leaks. */
    for (int i = freed; i < launched; i++) {
        (void)cudaFreeAsync(dptrs[i], ctx->stream);
    }
    (void)cudaStreamSynchronize(ctx->stream);
    destroy_execs(execs, GB_NUM_GRAPHS);
    return rc;
}
