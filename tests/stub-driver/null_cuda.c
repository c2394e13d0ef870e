/*
 * A stand-in for libcuda.so.1 that does no work: the functions below return CUDA_SUCCESS and
 * hand out made-up handles and addresses. Loaded through CUDA_GRAPH_LIBCUDA, it lets what the
 * safe layer does on the host run on a machine without a GPU:
 *   - tests/tests/record_stub.rs: the builder's record and the lifetime checks on real Graphs,
 *     in CI (tests/build.rs builds this file);
 *   - bench/host-overhead/run.sh: the safe layer's host cost against raw cuda-graph-sys calls.
 * Nothing here runs a kernel or touches memory: device results are the GPU suite's to test.
 * Stream capture is simulated for one stream at a time (tests that capture run in a process of
 * their own): each alloc, kernel launch and free captured becomes a node that depends on the
 * one before it, and the captured graph reads back as that chain: its nodes (in the order
 * captured, or reversed after null_cuda_reverse_node_order(1)), their types, the memory nodes'
 * addresses, and the edges.
 * A function it lacks makes the loader return CUDA_ERROR_NOT_FOUND, naming it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;

static uintptr_t next_handle = 0x1000;
static unsigned long long next_address = 0x700000000000ull;

/* Atomic: the tests call the stub from several threads. */
static void *handle(void) { return (void *)__atomic_add_fetch(&next_handle, 16, __ATOMIC_RELAXED); }

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)0x42; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }

static void *current;
CUresult cuCtxGetCurrent(void **c) { *c = current; return 0; }
CUresult cuCtxSetCurrent(void *c) { current = c; return 0; }

CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)140 << 30; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) { (void)attribute; (void)d; *v = 1; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    strncpy(name, "null driver", (size_t)len);
    return 0;
}

/* User objects, as the driver keeps them: a reference count and a destructor run when it
 * reaches zero. Graphs and executable graphs hold references (one object each at most, as the
 * safe layer uses them); destroying them releases theirs. */
typedef void (*destroy_fn)(void *);
struct user_object { destroy_fn destroy; void *data; int refs; };
enum { MAX_HOLDERS = 1 << 14 };
static struct { void *holder; struct user_object *object; } holders[MAX_HOLDERS];
static int holders_lock;
static size_t holders_end; /* slots at and past this index were never used */
static void lock(void) { while (__atomic_exchange_n(&holders_lock, 1, __ATOMIC_ACQUIRE)) {} }
static void unlock(void) { __atomic_store_n(&holders_lock, 0, __ATOMIC_RELEASE); }
static void release_object(struct user_object *o, int count)
{
    if (__atomic_sub_fetch(&o->refs, count, __ATOMIC_ACQ_REL) == 0) {
        o->destroy(o->data);
        free(o);
    }
}
static void hold(void *holder, struct user_object *o)
{
    lock();
    for (size_t i = 0; i < MAX_HOLDERS; i++)
        if (!holders[i].holder) {
            holders[i].holder = holder;
            holders[i].object = o;
            if (i >= holders_end) holders_end = i + 1;
            break;
        }
    unlock();
}
static struct user_object *held_by(void *holder, int remove)
{
    struct user_object *o = NULL;
    lock();
    for (size_t i = 0; i < holders_end; i++)
        if (holders[i].holder == holder) {
            o = holders[i].object;
            if (remove) holders[i].holder = NULL;
            break;
        }
    unlock();
    return o;
}
static void drop_holder(void *holder)
{
    struct user_object *o;
    while ((o = held_by(holder, 1)))
        release_object(o, 1);
}
CUresult cuUserObjectCreate(void **out, void *data, destroy_fn destroy, unsigned count, unsigned flags)
{
    (void)flags;
    struct user_object *o = malloc(sizeof *o);
    if (!o) return 2;
    o->destroy = destroy; o->data = data; o->refs = (int)count;
    *out = o;
    return 0;
}
CUresult cuUserObjectRelease(void *o, unsigned count) { release_object(o, (int)count); return 0; }
CUresult cuGraphRetainUserObject(void *g, void *o, unsigned count, unsigned flags)
{
    struct user_object *obj = o;
    if (!(flags & 1)) __atomic_add_fetch(&obj->refs, (int)count, __ATOMIC_ACQ_REL);
    hold(g, obj);
    return 0;
}
CUresult cuGraphReleaseUserObject(void *g, void *o, unsigned count)
{
    (void)count;
    if (held_by(g, 1) == o) release_object(o, 1);
    return 0;
}
CUresult cuStreamGetId(void *s, unsigned long long *id) { *id = (unsigned long long)(uintptr_t)s; return 0; }

CUresult cuGraphCreate(void **g, unsigned flags) { (void)flags; *g = handle(); return 0; }
CUresult cuGraphDestroy(void *g) { drop_holder(g); return 0; }

/* CUDA_MEM_ALLOC_NODE_PARAMS: CUmemPoolProps (88 bytes), accessDescs, accessDescCount,
 * bytesize, then dptr. */
CUresult cuGraphAddMemAllocNode(void **n, void *g, void *deps, size_t count, void *params)
{
    (void)g; (void)deps; (void)count;
    unsigned long long *dptr = (unsigned long long *)((char *)params + 88 + 3 * 8);
    *dptr = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED);
    *n = handle();
    return 0;
}
CUresult cuGraphAddKernelNode_v2(void **n, void *g, void *deps, size_t count, const void *p)
{
    (void)g; (void)deps; (void)count; (void)p;
    *n = handle();
    return 0;
}
CUresult cuGraphAddMemFreeNode(void **n, void *g, void *deps, size_t count, unsigned long long p)
{
    (void)g; (void)deps; (void)count; (void)p;
    *n = handle();
    return 0;
}
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long flags)
{
    (void)flags;
    *e = handle();
    struct user_object *o = held_by(g, 0);
    if (o) {
        __atomic_add_fetch(&o->refs, 1, __ATOMIC_ACQ_REL);
        hold(*e, o);
    }
    return 0;
}
CUresult cuGraphExecDestroy(void *e) { drop_holder(e); return 0; }
/* CUgraphExecUpdateResultInfo: the result (0: CU_GRAPH_EXEC_UPDATE_SUCCESS), then the node
 * the driver names and its dependency. The update always succeeds and changes nothing. */
CUresult cuGraphExecUpdate_v2(void *e, void *g, void *info)
{
    (void)e; (void)g;
    struct { int result; void *error_node, *error_from_node; } *out = info;
    out->result = 0;
    out->error_node = out->error_from_node = NULL;
    return 0;
}
CUresult cuGraphAddEmptyNode(void **n, void *g, void *deps, size_t count)
{
    (void)g; (void)deps; (void)count;
    *n = handle();
    return 0;
}
CUresult cuGraphAddDependencies_v2(void *g, const void *from, const void *to, const void *data,
                                   size_t count)
{
    (void)g; (void)from; (void)to; (void)data; (void)count;
    return 0;
}

CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = handle(); return 0; }
CUresult cuEventDestroy_v2(void *e) { (void)e; return 0; }

CUresult cuModuleLoadData(void **m, const void *image) { (void)image; *m = handle(); return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
    (void)m; (void)name;
    *f = handle();
    return 0;
}
CUresult cuModuleUnload(void *m) { (void)m; return 0; }

/* Stream capture: one capturing stream at a time; its captured calls form a chain. */
enum { MAX_CAPTURED = 1 << 16 };
enum { NODE_KERNEL = 0, NODE_MEM_ALLOC = 10, NODE_MEM_FREE = 11 };
static void *capture_stream, *capture_graph, *captured_graph;
static struct captured_node {
    void *node;
    int type;
    unsigned long long address;
    size_t bytes;
} captured[MAX_CAPTURED];
static void *captured_handles[MAX_CAPTURED];
static size_t captured_count;
static int reverse_node_order;

/* For tests: cuGraphGetNodes lists a captured graph's nodes in reverse order when set. */
void null_cuda_reverse_node_order(int reversed) { reverse_node_order = reversed; }

CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int priority)
{
    (void)flags; (void)priority;
    *s = handle();
    return 0;
}
CUresult cuStreamDestroy_v2(void *s) { (void)s; return 0; }
CUresult cuStreamSynchronize(void *s) { (void)s; return 0; }
CUresult cuStreamQuery(void *s) { (void)s; return 0; }
CUresult cuStreamBeginCapture_v2(void *s, int mode)
{
    (void)mode;
    if (capture_stream)
        return 900; /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: one capture at a time here */
    capture_stream = s;
    capture_graph = handle();
    captured_count = 0;
    return 0;
}
CUresult cuStreamEndCapture(void *s, void **g)
{
    if (s != capture_stream)
        return 901; /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
    *g = captured_graph = capture_graph;
    capture_stream = NULL;
    return 0;
}
CUresult cuStreamIsCapturing(void *s, int *status)
{
    *status = s && s == capture_stream;
    return 0;
}
/* The stream's capture status and its dependencies: the node captured last. */
CUresult cuStreamGetCaptureInfo_v3(void *s, int *status, unsigned long long *id, void **graph,
                                   void *const **deps, const void **edge_data, size_t *count)
{
    int capturing = s && s == capture_stream;
    *status = capturing;
    if (id)
        *id = 1;
    if (graph)
        *graph = capturing ? capture_graph : NULL;
    if (edge_data)
        *edge_data = NULL;
    if (deps)
        *deps = capturing && captured_count ? &captured_handles[captured_count - 1] : NULL;
    if (count)
        *count = capturing && captured_count ? 1 : 0;
    return 0;
}
static CUresult capture_node(void *s, int type, unsigned long long address, size_t bytes)
{
    if (!s || s != capture_stream)
        return 0; /* not capturing: the work "ran" */
    if (captured_count == MAX_CAPTURED)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    struct captured_node *n = &captured[captured_count];
    n->node = captured_handles[captured_count] = handle();
    n->type = type;
    n->address = address;
    n->bytes = bytes;
    captured_count++;
    return 0;
}
CUresult cuMemAllocAsync(unsigned long long *p, size_t bytes, void *s)
{
    *p = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED);
    return capture_node(s, NODE_MEM_ALLOC, *p, bytes);
}
CUresult cuMemFreeAsync(unsigned long long p, void *s) { return capture_node(s, NODE_MEM_FREE, p, 0); }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *s, void **params, void **extra)
{
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared;
    (void)params; (void)extra;
    return capture_node(s, NODE_KERNEL, 0, 0);
}
/* The last captured graph reads back as its chain; any other graph as empty. */
static size_t captured_nodes_of(void *g) { return g && g == captured_graph ? captured_count : 0; }
CUresult cuGraphGetNodes(void *g, void **nodes, size_t *count)
{
    size_t n = captured_nodes_of(g);
    for (size_t i = 0; nodes && i < n && i < *count; i++)
        nodes[i] = captured[reverse_node_order ? n - 1 - i : i].node;
    *count = n;
    return 0;
}
CUresult cuGraphGetEdges_v2(void *g, void **from, void **to, void *data, size_t *count)
{
    (void)data;
    size_t n = captured_nodes_of(g) ? captured_count - 1 : 0;
    for (size_t i = 0; from && to && i < n && i < *count; i++) {
        from[i] = captured[i].node;
        to[i] = captured[i + 1].node;
    }
    *count = n;
    return 0;
}
static struct captured_node *captured_node(void *node)
{
    for (size_t i = 0; i < captured_count; i++)
        if (captured[i].node == node)
            return &captured[i];
    return NULL;
}
CUresult cuGraphNodeGetType(void *node, int *type)
{
    struct captured_node *n = captured_node(node);
    if (!n)
        return 400; /* CUDA_ERROR_INVALID_HANDLE */
    *type = n->type;
    return 0;
}
/* CUDA_MEM_ALLOC_NODE_PARAMS as in cuGraphAddMemAllocNode. */
CUresult cuGraphMemAllocNodeGetParams(void *node, void *params)
{
    struct captured_node *n = captured_node(node);
    if (!n || n->type != NODE_MEM_ALLOC)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    memset(params, 0, 88 + 4 * 8);
    *(size_t *)((char *)params + 88 + 2 * 8) = n->bytes;
    *(unsigned long long *)((char *)params + 88 + 3 * 8) = n->address;
    return 0;
}
CUresult cuGraphMemFreeNodeGetParams(void *node, unsigned long long *address)
{
    struct captured_node *n = captured_node(node);
    if (!n || n->type != NODE_MEM_FREE)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    *address = n->address;
    return 0;
}

CUresult cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_UNKNOWN"; return 0; }
CUresult cuGetErrorString(int e, const char **s) { (void)e; *s = "null driver"; return 0; }
