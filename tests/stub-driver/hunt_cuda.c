/*
 * A checking stand-in for libcuda.so.1, for hunting host memory errors and races in cuda-graph
 * without a GPU. Unlike null_cuda.c it is built against the toolkit's cuda.h (so every
 * signature and ABI name is the real one), and it behaves more like the real driver:
 *
 *  - work (kernels, graph launches, frees, event records, host nodes) runs later, in issue
 *    order, on one "GPU" thread of the stub, which sleeps a little before each item;
 *  - CUDA user-object destructors, host-node functions and the release of an executable
 *    graph's user objects (deferred while its launches are queued) run on that thread;
 *  - every handle is registered; a use of a destroyed, moved or unknown handle, a double
 *    destroy, a double free, a kernel or graph that touches freed device memory when it runs,
 *    and a relaunch over a live allocation without AutoFreeOnLaunch are reported ("HUNT
 *    ERROR"), counted (hunt_errors()), and abort the process under HUNT_ABORT=1;
 *  - out-parameters are written with their full size and in-parameters read in full (kernel
 *    arguments by the known kernels' layouts), so valgrind/ASan check the crate's buffers;
 *  - the current context is per thread, as in the driver;
 *  - page-locked host memory (cuMemHostAlloc) is registered: copies between it and device
 *    memory (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, memcpy nodes with a CU_MEMORYTYPE_HOST side)
 *    check when they run that it is still allocated, and cuMemFreeHost does not wait for them
 *    (the harshest reading of the driver). A device-to-host copy writes HUNT_D2H_BYTE into every
 *    byte it copies, when it runs; a host-to-device copy keeps the first 8 bytes it read
 *    (hunt_last_host_read()), so that tests see when the GPU touched host memory. Freed host
 *    memory stays allocated in the stub, filled with 0xDD.
 *  - managed memory (cuMemAllocManaged) is real host memory registered as device memory too:
 *    work that uses it (kernels, memsets, copies, graph nodes) writes HUNT_D2H_BYTE into all of
 *    it when it runs, so that tests see whether the host read it before or after the GPU did;
 *    cuMemFree of it marks it freed (filled with 0xDD, never reused). HUNT_NO_CONCURRENT_MANAGED=1
 *    makes CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS read 0.
 * One stream captures at a time (plus the streams forked into it); captured work forms a chain.
 * Graphs read back as the driver describes them (cuGraphGetNodes, cuGraphGetEdges,
 * cuGraphGetRootNodes, cuGraphNodeGetDependencies/DependentNodes, cuGraphNodeGetType and the
 * kernel, memset, memcpy, alloc and free nodes' Get*Params): every node, explicit or captured, is
 * recorded with its dependencies (a captured node's: the node captured before it) and the
 * parameters it was made with (a captured kernel's function and shape, a captured memset's
 * value and extent), and an alloc node's peer access list is the stub's copy, owned by the
 * node. Argument arrays are not kept: a kernel node reads back without kernelParams.
 *
 * For tests of races and error paths (tests/attack_new.rs), each thread can arm one-shot hooks:
 * hunt_stall(call, ms) makes its next call of `call` sleep on entry (a thread preempted just
 * before the driver takes its locks), hunt_fail_next(call) makes its next call of `call` fail
 * with CUDA_ERROR_OUT_OF_MEMORY. Opt-in checks, off unless their variable is 1:
 *  - HUNT_ORDER: stream order as a GPU would see it. Work carries its stream; events carry a
 *    vector clock; a stream-ordered free (cuMemFreeAsync) of memory that queued work not yet
 *    run on another stream uses, without the freeing stream being ordered after that work
 *    through events, is reported (the stub itself would still run them in queue order);
 *  - HUNT_GLOBAL_CAPTURE: a synchronizing call (cuStreamSynchronize, cuCtxSynchronize,
 *    cuEventSynchronize, cuMemFree) while a CU_STREAM_CAPTURE_MODE_GLOBAL capture is active is
 *    reported and refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
 *  - HUNT_DELAY_FIXED: every work item sleeps exactly HUNT_DELAY_US, not a random part of it.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <execinfo.h>

#define OK CUDA_SUCCESS

/* ---------------------------------------------------------------- errors */
static int errors;
static int errors_at_exit;
int hunt_errors(void) { return __atomic_load_n(&errors, __ATOMIC_SEQ_CST); }
static void bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "HUNT ERROR: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    __atomic_add_fetch(&errors, 1, __ATOMIC_SEQ_CST);
    const char *a = getenv("HUNT_ABORT");
    if (a && *a == '1')
        abort();
}

/* ---------------------------------------------------------------- fault injection */
/* HUNT_FAIL_PM=n: calls that check fail() return CUDA_ERROR_OUT_OF_MEMORY n times in 1000. */
static int fail_pct = -1;
static unsigned fail_rng = 777;
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;
static int failures;
int hunt_failures(void) { return __atomic_load_n(&failures, __ATOMIC_SEQ_CST); }
static int fail(void)
{
    pthread_mutex_lock(&fail_lock);
    if (fail_pct < 0) {
        const char *f = getenv("HUNT_FAIL_PM");
        fail_pct = f ? atoi(f) : 0;
    }
    fail_rng = fail_rng * 1103515245u + 12345u;
    int r = fail_pct > 0 && (int)((fail_rng >> 8) % 1000) < fail_pct;
    pthread_mutex_unlock(&fail_lock);
    if (r)
        __atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST);
    return r;
}
/* One-shot hooks of the calling thread (see the top of the file). `call` is a static string. */
static __thread const char *stall_call;
static __thread int stall_ms;
static __thread const char *fail_call;
void hunt_stall(const char *call, int ms)
{
    stall_call = call;
    stall_ms = ms;
}
void hunt_fail_next(const char *call) { fail_call = call; }
/* Runs the hooks armed for `call`; returns whether the call is to fail. */
static int hooked(const char *call)
{
    if (stall_call && !strcmp(call, stall_call)) {
        int ms = stall_ms;
        stall_call = NULL;
        usleep((useconds_t)ms * 1000);
    }
    if (fail_call && !strcmp(call, fail_call)) {
        fail_call = NULL;
        __atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST);
        return 1;
    }
    return 0;
}
static int env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v == '1';
}
#define MAYBE_FAIL() do { if (hooked(__func__) || fail()) return CUDA_ERROR_OUT_OF_MEMORY; } while (0)

/* ---------------------------------------------------------------- process exit */
/* HUNT_TEARDOWN=1: at exit (this library's ELF destructor, run by exit() after the atexit
 * handlers, as libcuda's own is) the stub plays the driver's teardown: its GPU thread finishes
 * the queued work (running user-object destructors as launches complete) while any CUDA call
 * that arrives meanwhile is reported with its stack. */
static int tearing_down;
static void teardown_call(const char *call)
{
    if (!__atomic_load_n(&tearing_down, __ATOMIC_SEQ_CST))
        return;
    static int reported;
    fprintf(stderr, "HUNT ERROR: %s called during the driver's teardown at process exit (thread %ld)\n", call,
            (long)gettid());
    if (__atomic_add_fetch(&reported, 1, __ATOMIC_SEQ_CST) <= 3) {
        void *frames[40];
        int n = backtrace(frames, 40);
        backtrace_symbols_fd(frames, n, 2);
    }
    __atomic_add_fetch(&errors_at_exit, 1, __ATOMIC_SEQ_CST);
}

/* ---------------------------------------------------------------- registry */
enum kind { K_FREE_SLOT, K_STREAM, K_EVENT, K_GRAPH, K_EXEC, K_MODULE, K_FUNC, K_POOL, K_UOBJ, K_NODE, K_MEM };
static const char *kind_name[] = {"?", "stream", "event", "graph", "exec graph", "module", "function", "pool", "user object", "node", "memory"};
enum state { S_LIVE, S_DEAD, S_MOVED, S_UNMAPPED /* graph memory not allocated by a launch */ };
struct ent { uintptr_t key; unsigned char kind, state; void *desc; };
static struct ent *tab;
static size_t tab_mask, tab_used;
static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER; /* all stub state */
static __thread int on_gpu_thread;
static void lock_big(const char *call)
{
    if (!on_gpu_thread)
        teardown_call(call);
    pthread_mutex_lock(&big);
}
static uintptr_t next_handle = 0x1000;
static unsigned long long next_address = 0x700000000000ull;

static size_t hash(uintptr_t k) { k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33; return (size_t)k; }
static struct ent *find(uintptr_t key, int insert)
{
    if (!tab) {
        tab_mask = (1u << 21) - 1;
        tab = calloc(tab_mask + 1, sizeof *tab);
    }
    for (size_t i = hash(key) & tab_mask;; i = (i + 1) & tab_mask) {
        if (tab[i].key == key)
            return &tab[i];
        if (!tab[i].key) {
            if (!insert)
                return NULL;
            if (++tab_used > tab_mask / 4 * 3) {
                fprintf(stderr, "HUNT: registry full\n");
                abort();
            }
            tab[i].key = key;
            return &tab[i];
        }
    }
}
/* Under `big`. */
static void *new_handle(int kind, void *desc)
{
    next_handle += 16;
    struct ent *e = find(next_handle, 1);
    e->kind = (unsigned char)kind;
    e->state = S_LIVE;
    e->desc = desc;
    return (void *)next_handle;
}
static const char *state_name(int s) { return s == S_DEAD ? "destroyed" : s == S_MOVED ? "moved into a parent graph" : s == S_UNMAPPED ? "not allocated" : "live"; }
/* Under `big`: the entry of a live handle of `kind`, or NULL after reporting. */
static struct ent *live(const void *h, int kind, const char *call)
{
    struct ent *e = h ? find((uintptr_t)h, 0) : NULL;
    if (!e || e->kind != kind) {
        bad("%s: %p is not a %s handle%s", call, h, kind_name[kind], e ? " (another kind)" : "");
        return NULL;
    }
    if (e->state != S_LIVE) {
        bad("%s: %s %p is %s", call, kind_name[kind], h, state_name(e->state));
        return NULL;
    }
    return e;
}
static int special_stream(CUstream s) { return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }
static int check_stream(CUstream s, const char *call) { return special_stream(s) || live(s, K_STREAM, call) != NULL; }

/* ---------------------------------------------------------------- device memory */
static CUdeviceptr new_address(int state)
{
    next_address += 1 << 20;
    struct ent *e = find((uintptr_t)next_address, 1);
    e->kind = K_MEM;
    e->state = (unsigned char)state;
    return next_address;
}
/* Under `big`: memory `p` must be live when used (0: no address). */
static void use_memory(CUdeviceptr p, const char *what)
{
    if (!p)
        return;
    struct ent *e = find((uintptr_t)p, 0);
    if (!e) {
        /* an address inside an allocation: find its base (allocations are 1 MiB apart) */
        CUdeviceptr base = p & ~(CUdeviceptr)((1 << 20) - 1);
        e = find((uintptr_t)base, 0);
    }
    if (!e || e->kind != K_MEM)
        bad("%s: address %#llx is not device memory", what, (unsigned long long)p);
    else if (e->state != S_LIVE)
        bad("%s: device memory %#llx is %s", what, (unsigned long long)p, state_name(e->state));
}
static void free_memory(CUdeviceptr p, const char *what)
{
    struct ent *e = find((uintptr_t)p, 0);
    if (!e || e->kind != K_MEM)
        bad("%s: %#llx is not device memory", what, (unsigned long long)p);
    else if (e->state != S_LIVE)
        bad("%s: free of %#llx, which is %s", what, (unsigned long long)p, state_name(e->state));
    else
        e->state = S_DEAD;
}

/* ---------------------------------------------------------------- pinned host memory */
/* What a device-to-host copy writes into each byte of host memory when it runs. */
#define HUNT_D2H_BYTE 0xD2
struct hostmem { unsigned char *p; size_t bytes; int live; };
static struct hostmem *hostmems;
static size_t nhostmem, caphostmem;
static int host_live;
static unsigned long long last_host_read;
/* Live cuMemHostAlloc allocations. */
int hunt_host_live(void) { return __atomic_load_n(&host_live, __ATOMIC_SEQ_CST); }
/* The first 8 bytes the last host-to-device copy read, when it ran. */
unsigned long long hunt_last_host_read(void) { return __atomic_load_n(&last_host_read, __ATOMIC_SEQ_CST); }
/* Under `big`: the allocation that holds `p` (freed ones are never reused, so at most one). */
static struct hostmem *host_find(const void *p)
{
    for (size_t i = nhostmem; i-- > 0;)
        if ((const unsigned char *)p >= hostmems[i].p && (const unsigned char *)p < hostmems[i].p + hostmems[i].bytes)
            return &hostmems[i];
    return NULL;
}
/* Under `big`: `n` bytes at `p` must be live pinned memory; returns whether they are. */
static int use_host(const void *p, size_t n, const char *what)
{
    struct hostmem *h = host_find(p);
    if (!h) {
        bad("%s: host address %p is not page-locked memory from cuMemHostAlloc", what, p);
        return 0;
    }
    if (!h->live) {
        bad("%s: page-locked host memory %p is freed", what, p);
        return 0;
    }
    if ((const unsigned char *)p + n > h->p + h->bytes) {
        bad("%s: %zu bytes at %p overrun the page-locked allocation of %zu bytes", what, n, p, h->bytes);
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- managed memory */
/* Live cuMemAllocManaged allocations, 1 MiB-aligned real memory (so that use_memory finds their
   base), registered as device memory at their host address. */
static struct hostmem *managed;
static size_t nmanaged, capmanaged;
static int managed_live;
int hunt_managed_live(void) { return __atomic_load_n(&managed_live, __ATOMIC_SEQ_CST); }
/* Under `big`: the managed allocation that holds `p`, or NULL. */
static struct hostmem *managed_find(CUdeviceptr p)
{
    for (size_t i = nmanaged; i-- > 0;)
        if ((unsigned char *)(uintptr_t)p >= managed[i].p && (unsigned char *)(uintptr_t)p < managed[i].p + managed[i].bytes)
            return &managed[i];
    return NULL;
}
/* Under `big`: GPU work that uses `p` runs; if it is live managed memory, the GPU writes it. */
static void touch_managed(CUdeviceptr p)
{
    struct hostmem *m = p ? managed_find(p) : NULL;
    if (m && m->live)
        memset(m->p, HUNT_D2H_BYTE, m->bytes);
}

/* ---------------------------------------------------------------- kernels */
struct func { const char *layout; void *module; };
/* P: pointer (8 bytes), 8: u64, 4: u32 */
static const char *layout_of(const char *name)
{
    if (!strcmp(name, "fill_u32") || !strcmp(name, "iota_u32") || !strcmp(name, "add_u32")) return "P84";
    if (!strcmp(name, "copy_u32")) return "PP8";
    if (!strcmp(name, "axpy_u32")) return "PP84";
    if (!strcmp(name, "sum_u32")) return "P8P";
    if (!strcmp(name, "spin_then_fill_u32")) return "P848";
    return "";
}
/* Reads every argument as the driver does (so a bad pointer shows on the host); returns the
 * pointer arguments. Under `big`. */
static int read_args(CUfunction f, void **params, CUdeviceptr out[4], const char *call)
{
    struct ent *e = live(f, K_FUNC, call);
    if (!e)
        return 0;
    struct func *fn = e->desc;
    struct ent *m = find((uintptr_t)fn->module, 0);
    if (!m || m->state != S_LIVE)
        bad("%s: the function's module %p is %s", call, fn->module, m ? state_name(m->state) : "unknown");
    int n = 0;
    for (int i = 0; fn->layout[i]; i++) {
        unsigned long long v = 0;
        size_t size = fn->layout[i] == '4' ? 4 : 8;
        memcpy(&v, params[i], size);
        if (fn->layout[i] == 'P' && n < 4)
            out[n++] = v;
    }
    return n;
}

/* ---------------------------------------------------------------- graphs */
/* OP_H2D, OP_D2H: a copy between pinned host memory `a` (`b` bytes) and device memory p[0]. */
enum op_type { OP_ALLOC, OP_FREE, OP_HOST, OP_EVENT, OP_KERNEL, OP_USE, OP_H2D, OP_D2H };
struct op { int type; uintptr_t a, b; CUdeviceptr p[4]; int np; };
struct uobj { void (*destroy)(void *); void *data; int refs; };
struct held { struct uobj *o; int count; };
struct gdesc {
    struct op *ops; size_t n, cap;
    struct held *objs; size_t nobj, capobj;
    /* every node, in the order made: its type, dependencies and parameters, for the Get calls */
    struct cnode {
        CUgraphNode node; int type; CUdeviceptr address; size_t bytes;
        CUgraphNode *deps; size_t ndeps, capdeps;
        union {
            CUDA_KERNEL_NODE_PARAMS kernel;  /* kernelParams and extra NULL */
            CUDA_MEMSET_NODE_PARAMS memset;
            CUDA_MEMCPY3D memcpy;
            CUDA_MEM_ALLOC_NODE_PARAMS alloc; /* accessDescs: the stub's copy, freed with the graph */
        } p;
    } *nodes;
    size_t nnodes, capnodes;
    unsigned long long flags; /* exec: instantiate flags */
    void *graph;              /* exec: its graph's handle */
};
static void push_op(struct gdesc *g, struct op op)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 8;
        g->ops = realloc(g->ops, g->cap * sizeof *g->ops);
    }
    g->ops[g->n++] = op;
}
static void push_obj(struct gdesc *g, struct uobj *o, int count)
{
    if (g->nobj == g->capobj) {
        g->capobj = g->capobj ? 2 * g->capobj : 4;
        g->objs = realloc(g->objs, g->capobj * sizeof *g->objs);
    }
    g->objs[g->nobj].o = o;
    g->objs[g->nobj].count = count;
    g->nobj++;
}
static void add_dep(struct cnode *c, CUgraphNode dep)
{
    if (c->ndeps == c->capdeps) {
        c->capdeps = c->capdeps ? 2 * c->capdeps : 4;
        c->deps = realloc(c->deps, c->capdeps * sizeof *c->deps);
    }
    c->deps[c->ndeps++] = dep;
}
/* Under `big`: records `node` in `g` after `deps`; the entry (valid until the next node of `g`)
 * is zeroed but for its handle, type and dependencies. */
static struct cnode *record_node(struct gdesc *g, CUgraphNode node, int type, const CUgraphNode *deps,
                                 size_t count)
{
    if (g->nnodes == g->capnodes) {
        g->capnodes = g->capnodes ? 2 * g->capnodes : 8;
        g->nodes = realloc(g->nodes, g->capnodes * sizeof *g->nodes);
    }
    struct cnode *c = &g->nodes[g->nnodes++];
    memset(c, 0, sizeof *c);
    c->node = node;
    c->type = type;
    for (size_t i = 0; i < count; i++)
        add_dep(c, deps[i]);
    return c;
}
/* Under `big`: a captured node, after the node captured before it. */
static struct cnode *push_node(struct gdesc *g, int type, CUdeviceptr address, size_t bytes)
{
    CUgraphNode prev = g->nnodes ? g->nodes[g->nnodes - 1].node : NULL;
    struct cnode *c = record_node(g, new_handle(K_NODE, NULL), type, &prev, prev ? 1 : 0);
    c->address = address;
    c->bytes = bytes;
    return c;
}
/* Under `big`: the entry of `node` in `g`, or NULL. */
static struct cnode *node_in(struct gdesc *g, CUgraphNode node)
{
    for (size_t i = 0; g && i < g->nnodes; i++)
        if (g->nodes[i].node == node)
            return &g->nodes[i];
    return NULL;
}
static void free_desc(struct gdesc *g)
{
    for (size_t i = 0; i < g->nnodes; i++) {
        free(g->nodes[i].deps);
        if (g->nodes[i].type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            free((void *)g->nodes[i].p.alloc.accessDescs);
    }
    free(g->ops);
    free(g->objs);
    free(g->nodes);
    free(g);
}

/* ---------------------------------------------------------------- the GPU thread */
enum work { W_NOP, W_KERNEL, W_EXEC, W_FREE, W_RELEASE, W_DESTROY_OBJ };
struct item { struct item *next; int work; void *a; struct op op; const char *what; uintptr_t stream; unsigned long long seq; };
static pthread_mutex_t wq = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wq_signal = PTHREAD_COND_INITIALIZER, wq_done = PTHREAD_COND_INITIALIZER;
static struct item *head, *tail;
static unsigned long long issued, done;
static pthread_t gpu_thread;
static int gpu_started;
static unsigned rng = 12345;
static int delay_us = -1;
static int delay_fixed;
static struct item *running; /* the item the GPU thread runs now (off the list) */

/* HUNT_ORDER: streams by key (a handle; the per-thread stream as a key of its thread; the
 * legacy stream as 1), each with a vector clock over the streams: clock[i][j] is the last item of
 * stream j that stream i is ordered after. Under `wq`. */
#define ORDER_STREAMS 64
static int order_on = -1;
static uintptr_t order_keys[ORDER_STREAMS];
static unsigned long long order_clock[ORDER_STREAMS][ORDER_STREAMS];
static int order_n;
static int order_enabled(void)
{
    if (order_on < 0)
        order_on = env_flag("HUNT_ORDER");
    return order_on;
}
static int order_index(uintptr_t key)
{
    for (int i = 0; i < order_n; i++)
        if (order_keys[i] == key)
            return i;
    if (order_n == ORDER_STREAMS) {
        fprintf(stderr, "HUNT: HUNT_ORDER tracks at most %d streams\n", ORDER_STREAMS);
        abort();
    }
    order_keys[order_n] = key;
    return order_n++;
}
static __thread unsigned long long per_thread_id;
static unsigned long long per_thread_ids = 1ull << 40;
static unsigned long long this_threads_stream_id(void)
{
    if (!per_thread_id)
        per_thread_id = __atomic_add_fetch(&per_thread_ids, 1, __ATOMIC_SEQ_CST);
    return per_thread_id;
}
static uintptr_t stream_key(CUstream s)
{
    if (s == CU_STREAM_PER_THREAD)
        return ((uintptr_t)1 << 62) | (uintptr_t)this_threads_stream_id();
    if (s == NULL || s == CU_STREAM_LEGACY)
        return 1;
    return (uintptr_t)s;
}
/* Whether `it` touches the 1 MiB block of `p`. */
static int item_uses(const struct item *it, CUdeviceptr p)
{
    CUdeviceptr base = p & ~(CUdeviceptr)((1 << 20) - 1);
#define SAME(x) ((x) && (((CUdeviceptr)(x)) & ~(CUdeviceptr)((1 << 20) - 1)) == base)
    if (it->work == W_KERNEL) {
        for (int i = 0; i < it->op.np; i++)
            if (SAME(it->op.p[i]))
                return 1;
    } else if (it->work == W_EXEC) {
        const struct gdesc *x = it->a;
        for (size_t k = 0; k < x->n; k++) {
            const struct op *op = &x->ops[k];
            if ((op->type == OP_ALLOC || op->type == OP_FREE) && SAME(op->a))
                return 1;
            for (int i = 0; (op->type == OP_KERNEL || op->type == OP_USE || op->type == OP_H2D || op->type == OP_D2H) && i < op->np; i++)
                if (SAME(op->p[i]))
                    return 1;
        }
    } else if (it->work == W_FREE && SAME(it->op.a))
        return 1;
#undef SAME
    return 0;
}
/* HUNT_ORDER, at a stream-ordered free of `p` on stream `key`: every queued item that uses `p`
 * on another stream must be ordered before the free. Under `wq`. */
static void order_check_free(uintptr_t key, CUdeviceptr p, const char *call)
{
    int s = order_index(key);
    for (struct item *it = running ? running : head; it; it = it == running ? head : it->next) {
        if (!it->stream || it->stream == key || !item_uses(it, p))
            continue;
        int t = order_index(it->stream);
        if (order_clock[s][t] < it->seq)
            bad("%s: free of %#llx on stream %#lx is not ordered after work queued on stream %#lx that "
                "uses it (%s, not run yet)",
                call, (unsigned long long)p, (unsigned long)key, (unsigned long)it->stream, it->what);
    }
}

static void release_objs(struct gdesc *g);
static void run_item(struct item *it);

static void *gpu_main(void *arg)
{
    (void)arg;
    on_gpu_thread = 1;
    for (;;) {
        pthread_mutex_lock(&wq);
        while (!head)
            pthread_cond_wait(&wq_signal, &wq);
        struct item *it = head;
        head = it->next;
        if (!head)
            tail = NULL;
        rng = rng * 1103515245u + 12345u;
        unsigned sleep_us = delay_us > 0 ? delay_fixed ? (unsigned)delay_us : (rng >> 8) % (unsigned)delay_us : 0;
        running = it;
        pthread_mutex_unlock(&wq);
        if (sleep_us)
            usleep(sleep_us);
        run_item(it);
        pthread_mutex_lock(&wq);
        running = NULL;
        free(it);
        done++;
        pthread_cond_broadcast(&wq_done);
        pthread_mutex_unlock(&wq);
    }
    return NULL;
}
/* Queues work on stream `stream` (its key, 0: none); returns its sequence number. With
 * HUNT_ORDER and a `snapshot`, copies the stream's clock there after the item (an event
 * recorded by it). Not under `big`. */
/* The last work item issued on each stream (under `wq`), for cuStreamQuery; once the table is
 * full, streams not in it count every item issued. */
#define QUERY_STREAMS 256
static uintptr_t query_keys[QUERY_STREAMS];
static unsigned long long query_seqs[QUERY_STREAMS];
static int query_n, query_full;
static void note_stream_seq(uintptr_t stream, unsigned long long seq)
{
    for (int i = 0; i < query_n; i++)
        if (query_keys[i] == stream) {
            query_seqs[i] = seq;
            return;
        }
    if (query_n == QUERY_STREAMS) {
        query_full = 1;
        return;
    }
    query_keys[query_n] = stream;
    query_seqs[query_n++] = seq;
}
static unsigned long long last_seq_on(uintptr_t stream)
{
    for (int i = 0; i < query_n; i++)
        if (query_keys[i] == stream)
            return query_seqs[i];
    return query_full ? issued : 0;
}
static unsigned long long enqueue_on(uintptr_t stream, int work, void *a, const struct op *op, const char *what,
                                     unsigned long long *snapshot)
{
    struct item *it = calloc(1, sizeof *it);
    it->work = work;
    it->a = a;
    if (op)
        it->op = *op;
    it->what = what;
    pthread_mutex_lock(&wq);
    if (!gpu_started) {
        const char *d = getenv("HUNT_DELAY_US");
        delay_us = d ? atoi(d) : 100;
        delay_fixed = env_flag("HUNT_DELAY_FIXED");
        pthread_create(&gpu_thread, NULL, gpu_main, NULL);
        pthread_detach(gpu_thread);
        gpu_started = 1;
    }
    if (tail)
        tail->next = it;
    else
        head = it;
    tail = it;
    unsigned long long seq = ++issued;
    it->seq = seq;
    if (stream)
        note_stream_seq(stream, seq);
    if (order_enabled() && stream) {
        it->stream = stream;
        int i = order_index(stream);
        order_clock[i][i] = seq;
        if (snapshot)
            memcpy(snapshot, order_clock[i], sizeof order_clock[i]);
    }
    pthread_cond_signal(&wq_signal);
    pthread_mutex_unlock(&wq);
    return seq;
}
static unsigned long long enqueue(int work, void *a, const struct op *op, const char *what)
{
    return enqueue_on(0, work, a, op, what, NULL);
}
static void wait_for(unsigned long long seq)
{
    if (on_gpu_thread) {
        bad("a synchronizing call on the driver's own thread (a host function or destructor called CUDA)");
        return;
    }
    pthread_mutex_lock(&wq);
    while (done < seq)
        pthread_cond_wait(&wq_done, &wq);
    pthread_mutex_unlock(&wq);
}
static void wait_all(void)
{
    pthread_mutex_lock(&wq);
    unsigned long long seq = issued;
    pthread_mutex_unlock(&wq);
    wait_for(seq);
}
static unsigned long long completed(void)
{
    pthread_mutex_lock(&wq);
    unsigned long long d = done;
    pthread_mutex_unlock(&wq);
    return d;
}

/* HUNT_SYNC_DESTROY=1: destructors run at once on the releasing thread (the driver may do
 * that when nothing is in flight), and graph/exec destroys release their objects at once. */
static int sync_destroy(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("HUNT_SYNC_DESTROY");
        v = e && *e == '1';
    }
    return v;
}
static void release_obj(struct uobj *o, int count)
{
    if (__atomic_sub_fetch(&o->refs, count, __ATOMIC_ACQ_REL) == 0) {
        if (on_gpu_thread || sync_destroy()) {
            o->destroy(o->data);
            free(o);
        } else {
            enqueue(W_DESTROY_OBJ, o, NULL, "destroy");
        }
    }
}
static void release_objs(struct gdesc *g)
{
    for (size_t i = 0; i < g->nobj; i++)
        if (g->objs[i].count > 0)
            release_obj(g->objs[i].o, g->objs[i].count);
    g->nobj = 0;
}

static void run_op(const struct op *op, unsigned long long flags, const char *what)
{
    switch (op->type) {
    case OP_ALLOC: {
        lock_big(__func__);
        struct ent *e = find((uintptr_t)op->a, 0);
        if (e && e->state == S_LIVE && !(flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
            bad("%s: relaunch over live allocation %#llx without AutoFreeOnLaunch", what, (unsigned long long)op->a);
        if (e)
            e->state = S_LIVE;
        pthread_mutex_unlock(&big);
        break;
    }
    case OP_FREE:
        lock_big(__func__);
        free_memory(op->a, what);
        pthread_mutex_unlock(&big);
        break;
    case OP_HOST:
        ((CUhostFn)op->a)((void *)op->b);
        break;
    case OP_EVENT: {
        lock_big(__func__);
        struct ent *e = find(op->a, 0);
        if (!e || e->state != S_LIVE)
            bad("%s: an event node's event %p is %s when the node runs", what, (void *)op->a, e ? state_name(e->state) : "unknown");
        pthread_mutex_unlock(&big);
        break;
    }
    case OP_KERNEL: {
        lock_big(__func__);
        struct ent *e = find(op->a, 0);
        if (!e || e->state != S_LIVE)
            bad("%s: a kernel's function %p is %s when it runs", what, (void *)op->a, e ? state_name(e->state) : "unknown");
        else {
            struct func *fn = e->desc;
            struct ent *m = find((uintptr_t)fn->module, 0);
            if (!m || m->state != S_LIVE)
                bad("%s: a kernel's module %p is %s when it runs", what, fn->module, m ? state_name(m->state) : "unknown");
        }
        for (int i = 0; i < op->np; i++) {
            use_memory(op->p[i], what);
            touch_managed(op->p[i]);
        }
        pthread_mutex_unlock(&big);
        break;
    }
    case OP_USE:
        lock_big(__func__);
        for (int i = 0; i < op->np; i++) {
            use_memory(op->p[i], what);
            touch_managed(op->p[i]);
        }
        pthread_mutex_unlock(&big);
        break;
    case OP_H2D:
        lock_big(__func__);
        use_memory(op->p[0], what);
        if (use_host((const void *)op->a, op->b, what)) {
            unsigned long long first = 0;
            memcpy(&first, (const void *)op->a, op->b < 8 ? op->b : 8);
            __atomic_store_n(&last_host_read, first, __ATOMIC_SEQ_CST);
        }
        pthread_mutex_unlock(&big);
        break;
    case OP_D2H:
        lock_big(__func__);
        use_memory(op->p[0], what);
        if (use_host((const void *)op->a, op->b, what))
            memset((void *)op->a, HUNT_D2H_BYTE, op->b);
        pthread_mutex_unlock(&big);
        break;
    }
}

static void run_item(struct item *it)
{
    switch (it->work) {
    case W_NOP:
        break;
    case W_KERNEL:
        run_op(&it->op, 0, it->op.type == OP_H2D || it->op.type == OP_D2H ? it->what : "a kernel launched on a stream");
        break;
    case W_EXEC: {
        struct gdesc *x = it->a;
        for (size_t i = 0; i < x->n; i++)
            run_op(&x->ops[i], x->flags, "a graph launch");
        break;
    }
    case W_FREE:
        lock_big(__func__);
        free_memory(it->op.a, it->what);
        pthread_mutex_unlock(&big);
        break;
    case W_RELEASE: {
        struct gdesc *g = it->a;
        release_objs(g);
        free_desc(g);
        break;
    }
    case W_DESTROY_OBJ: {
        struct uobj *o = it->a;
        o->destroy(o->data);
        free(o);
        break;
    }
    }
}

/* ---------------------------------------------------------------- init, devices, contexts */
CUresult cuInit(unsigned int flags) { (void)flags; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { *d = ordinal; return ordinal == 0 ? OK : CUDA_ERROR_INVALID_DEVICE; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
static int primary_refs;
#define PRIMARY ((CUcontext)0x42)
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; __atomic_add_fetch(&primary_refs, 1, __ATOMIC_SEQ_CST); *c = PRIMARY; return OK; }
CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    (void)d;
    int left = __atomic_sub_fetch(&primary_refs, 1, __ATOMIC_SEQ_CST);
    if (left < 0)
        bad("cuDevicePrimaryCtxRelease: released more often than retained");
    return OK;
}
static __thread CUcontext current;
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
/* The primary context is device 0's; any other non-null handle is "a context made elsewhere",
   also of device 0. */
CUresult cuCtxGetDevice(CUdevice *d)
{
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = 0;
    return OK;
}
static int need_context(const char *call)
{
    if (!on_gpu_thread)
        teardown_call(call);
    if (current != PRIMARY) {
        /* Not an error for every call in the real driver, but worth seeing. */
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_SEQ_CST))
            fprintf(stderr, "HUNT NOTE: %s without a current context (reported once)\n", call);
    }
    if (__atomic_load_n(&primary_refs, __ATOMIC_SEQ_CST) <= 0)
        bad("%s: the primary context is released", call);
    return 1;
}
CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) { (void)d; *bytes = (size_t)140 << 30; return OK; }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    (void)d;
    const char *no = getenv("HUNT_NO_CONCURRENT_MANAGED");
    *v = !(a == CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS && no && *no == '1');
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    (void)d;
    if (len <= 0) return CUDA_ERROR_INVALID_VALUE;
    memset(name, 0, (size_t)len); /* the whole buffer, as the caller promised */
    strncpy(name, "hunt driver", (size_t)len - 1);
    return OK;
}
CUresult cuDeviceCanAccessPeer(int *can, CUdevice a, CUdevice b) { *can = a != b; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "CUDA_ERROR_UNKNOWN"; return OK; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "hunt driver"; return OK; }

/* ---------------------------------------------------------------- capture */
static CUstream capture_stream;
static CUstream joined[16];
static int njoined;
static struct gdesc *capture_desc;
static CUstreamCaptureMode capture_mode;
static unsigned long long capture_id_counter;
static unsigned long long capture_id_now;
static CUevent capture_events[64];
static int ncapture_events;
/* HUNT_GLOBAL_CAPTURE: a synchronizing call while a Global-mode capture is active (the driver
 * refuses it, and invalidates the capture). */
static int global_capture_forbids(const char *call)
{
    static int on = -1;
    if (on < 0)
        on = env_flag("HUNT_GLOBAL_CAPTURE");
    if (!on)
        return 0;
    lock_big(__func__);
    int active = capture_stream && capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    pthread_mutex_unlock(&big);
    if (active)
        bad("%s: a synchronizing call while a CU_STREAM_CAPTURE_MODE_GLOBAL capture is active", call);
    return active;
}
CUresult cuCtxSynchronize(void)
{
    need_context("cuCtxSynchronize");
    if (global_capture_forbids("cuCtxSynchronize"))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_all();
    return OK;
}
/* Under `big`. */
static int capturing(CUstream s)
{
    if (!capture_stream || special_stream(s))
        return 0;
    if (s == capture_stream)
        return 1;
    for (int i = 0; i < njoined; i++)
        if (joined[i] == s)
            return 1;
    return 0;
}

CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    MAYBE_FAIL();
    lock_big(__func__);
    CUresult r = OK;
    if (!check_stream(s, "cuStreamBeginCapture"))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (capture_stream || special_stream(s))
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else {
        capture_stream = s;
        capture_desc = calloc(1, sizeof *capture_desc);
        capture_mode = mode;
        capture_id_now = ++capture_id_counter;
        njoined = 0;
        ncapture_events = 0;
    }
    pthread_mutex_unlock(&big);
    return r;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    lock_big(__func__);
    CUresult r = OK;
    *g = NULL;
    if (!check_stream(s, "cuStreamEndCapture"))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!capture_stream || s != capture_stream)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else {
        *g = new_handle(K_GRAPH, capture_desc);
        capture_stream = NULL;
        capture_desc = NULL;
        njoined = 0;
    }
    pthread_mutex_unlock(&big);
    return r;
}
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status)
{
    if (hooked(__func__))
        return CUDA_ERROR_OUT_OF_MEMORY;
    lock_big(__func__);
    check_stream(s, "cuStreamIsCapturing");
    *status = capturing(s) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&big);
    return OK;
}
/* The dependencies array handed out stays valid until the next capture call, as documented:
 * here until the next call on any thread (one slot per thread). */
static __thread CUgraphNode last_dep;
CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                const CUgraphNode **deps, const CUgraphEdgeData **edge_data, size_t *count)
{
    lock_big(__func__);
    check_stream(s, "cuStreamGetCaptureInfo");
    int c = capturing(s);
    *status = c ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id)
        *id = c ? capture_id_now : 0;
    if (graph)
        *graph = NULL;
    if (edge_data)
        *edge_data = NULL;
    size_t n = c && capture_desc->nnodes ? 1 : 0;
    if (n)
        last_dep = capture_desc->nodes[capture_desc->nnodes - 1].node;
    if (deps)
        *deps = n ? &last_dep : NULL;
    if (count)
        *count = n;
    pthread_mutex_unlock(&big);
    return OK;
}

/* ---------------------------------------------------------------- streams and events */
CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    MAYBE_FAIL();
    (void)flags;
    need_context("cuStreamCreate");
    lock_big(__func__);
    *s = new_handle(K_STREAM, NULL);
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) { (void)priority; return cuStreamCreate(s, flags); }
CUresult cuStreamDestroy(CUstream s)
{
    lock_big(__func__);
    CUresult r = OK;
    struct ent *e = live(s, K_STREAM, "cuStreamDestroy");
    if (!e)
        r = CUDA_ERROR_INVALID_HANDLE;
    else {
        if (capturing(s))
            bad("cuStreamDestroy: stream %p is capturing", (void *)s);
        e->state = S_DEAD;
    }
    pthread_mutex_unlock(&big);
    return r;
}
CUresult cuStreamSynchronize(CUstream s)
{
    MAYBE_FAIL();
    lock_big(__func__);
    int ok = check_stream(s, "cuStreamSynchronize");
    int c = capturing(s);
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (c || global_capture_forbids("cuStreamSynchronize"))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_all();
    return OK;
}
/* Done when the last work item issued on the stream has run (the queue runs in issue order, so
 * every earlier item of the stream has run too). */
CUresult cuStreamQuery(CUstream s)
{
    MAYBE_FAIL();
    lock_big(__func__);
    int ok = check_stream(s, "cuStreamQuery");
    int c = capturing(s);
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (c)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&wq);
    int idle = done >= last_seq_on(stream_key(s));
    pthread_mutex_unlock(&wq);
    return idle ? OK : CUDA_ERROR_NOT_READY;
}
CUresult cuStreamGetId(CUstream s, unsigned long long *id)
{
    MAYBE_FAIL();
    lock_big(__func__);
    int ok = check_stream(s, "cuStreamGetId");
    pthread_mutex_unlock(&big);
    if (s == CU_STREAM_PER_THREAD) {
        *id = this_threads_stream_id();
    } else if (special_stream(s))
        *id = 1;
    else
        *id = (unsigned long long)(uintptr_t)s;
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}

/* `clock`: with HUNT_ORDER, the recording stream's clock after the record (NULL: never recorded
 * outside a capture). */
struct event { unsigned long long seq; int in_capture; unsigned long long *clock; };
CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    MAYBE_FAIL();
    (void)flags;
    need_context("cuEventCreate");
    lock_big(__func__);
    *e = new_handle(K_EVENT, calloc(1, sizeof(struct event)));
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuEventDestroy(CUevent ev)
{
    MAYBE_FAIL();
    lock_big(__func__);
    struct ent *e = live(ev, K_EVENT, "cuEventDestroy");
    if (e)
        e->state = S_DEAD; /* desc kept: queued work may still look */
    pthread_mutex_unlock(&big);
    return e ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuEventRecord(CUevent ev, CUstream s)
{
    MAYBE_FAIL();
    lock_big(__func__);
    struct ent *e = live(ev, K_EVENT, "cuEventRecord");
    int ok = check_stream(s, "cuEventRecord") && e;
    int c = capturing(s);
    struct event *d = e ? e->desc : NULL;
    if (ok && c) {
        d->in_capture = 1;
        if (ncapture_events < 64)
            capture_events[ncapture_events++] = ev;
    }
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!c) {
        unsigned long long snapshot[ORDER_STREAMS];
        unsigned long long seq = enqueue_on(stream_key(s), W_NOP, NULL, NULL, "record", snapshot);
        lock_big(__func__);
        d->seq = seq;
        d->in_capture = 0;
        if (order_enabled()) {
            if (!d->clock)
                d->clock = malloc(sizeof snapshot);
            memcpy(d->clock, snapshot, sizeof snapshot);
        }
        pthread_mutex_unlock(&big);
    }
    return OK;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags)
{
    MAYBE_FAIL();
    (void)flags;
    lock_big(__func__);
    struct ent *e = live(ev, K_EVENT, "cuStreamWaitEvent");
    int ok = check_stream(s, "cuStreamWaitEvent") && e;
    if (ok && ((struct event *)e->desc)->in_capture && capture_stream && !capturing(s) && njoined < 16)
        joined[njoined++] = s; /* a fork: the stream joins the capture */
    unsigned long long clock[ORDER_STREAMS];
    int merge = ok && order_enabled() && !capturing(s) && ((struct event *)e->desc)->clock;
    if (merge)
        memcpy(clock, ((struct event *)e->desc)->clock, sizeof clock);
    pthread_mutex_unlock(&big);
    if (merge) {
        pthread_mutex_lock(&wq);
        int i = order_index(stream_key(s));
        for (int j = 0; j < ORDER_STREAMS; j++)
            if (clock[j] > order_clock[i][j])
                order_clock[i][j] = clock[j];
        pthread_mutex_unlock(&wq);
    }
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuEventQuery(CUevent ev)
{
    lock_big(__func__);
    struct ent *e = live(ev, K_EVENT, "cuEventQuery");
    unsigned long long seq = e ? ((struct event *)e->desc)->seq : 0;
    pthread_mutex_unlock(&big);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    return completed() >= seq ? OK : CUDA_ERROR_NOT_READY;
}
CUresult cuEventSynchronize(CUevent ev)
{
    lock_big(__func__);
    struct ent *e = live(ev, K_EVENT, "cuEventSynchronize");
    unsigned long long seq = e ? ((struct event *)e->desc)->seq : 0;
    pthread_mutex_unlock(&big);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (global_capture_forbids("cuEventSynchronize"))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_for(seq);
    return OK;
}
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    lock_big(__func__);
    int ok = live(a, K_EVENT, "cuEventElapsedTime") && live(b, K_EVENT, "cuEventElapsedTime");
    pthread_mutex_unlock(&big);
    *ms = 0.0f;
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}

/* ---------------------------------------------------------------- modules */
CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    need_context("cuModuleLoadData");
    (void)strlen(image); /* PTX: NUL-terminated */
    lock_big(__func__);
    *m = new_handle(K_MODULE, NULL);
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuModuleUnload(CUmodule m)
{
    lock_big(__func__);
    struct ent *e = live(m, K_MODULE, "cuModuleUnload");
    if (e)
        e->state = S_DEAD;
    pthread_mutex_unlock(&big);
    return e ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    lock_big(__func__);
    struct ent *e = live(m, K_MODULE, "cuModuleGetFunction");
    if (e) {
        struct func *fn = malloc(sizeof *fn);
        fn->layout = layout_of(name);
        fn->module = m;
        *f = new_handle(K_FUNC, fn);
    }
    pthread_mutex_unlock(&big);
    return e ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void **params, void **extra)
{
    MAYBE_FAIL();
    (void)extra;
    need_context("cuLaunchKernel");
    struct op op = {.type = OP_KERNEL, .a = (uintptr_t)f};
    lock_big(__func__);
    int ok = check_stream(s, "cuLaunchKernel");
    op.np = read_args(f, params, op.p, "cuLaunchKernel");
    int c = capturing(s);
    if (ok && c) {
        push_op(capture_desc, op);
        CUDA_KERNEL_NODE_PARAMS *k = &push_node(capture_desc, CU_GRAPH_NODE_TYPE_KERNEL, 0, 0)->p.kernel;
        k->func = f;
        k->gridDimX = gx, k->gridDimY = gy, k->gridDimZ = gz;
        k->blockDimX = bx, k->blockDimY = by, k->blockDimZ = bz;
        k->sharedMemBytes = shared;
    }
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!c)
        enqueue_on(stream_key(s), W_KERNEL, NULL, &op, "kernel", NULL);
    return OK;
}

/* Stream-ordered memsets and copies: a use of their memory when they run, or a node when the
   stream captures. */
static CUresult stream_use(CUstream s, CUdeviceptr a, CUdeviceptr b, int np, CUgraphNodeType type,
                           const char *call, const struct cnode *params)
{
    if (hooked(call))
        return CUDA_ERROR_OUT_OF_MEMORY;
    MAYBE_FAIL();
    need_context(call);
    struct op op = {.type = OP_USE, .np = np, .p = {a, b}};
    lock_big(__func__);
    int ok = check_stream(s, call);
    int c = capturing(s);
    if (ok && c) {
        push_op(capture_desc, op);
        push_node(capture_desc, type, 0, 0)->p = params->p;
    }
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!c)
        enqueue_on(stream_key(s), W_KERNEL, NULL, &op, call, NULL);
    return OK;
}
/* A 1-D memset's parameters as a captured node keeps them. */
static struct cnode memset_params(CUdeviceptr d, unsigned v, unsigned size, size_t n)
{
    struct cnode c = {.type = CU_GRAPH_NODE_TYPE_MEMSET};
    c.p.memset = (CUDA_MEMSET_NODE_PARAMS){.dst = d, .value = v, .elementSize = size, .width = n, .height = 1};
    return c;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    struct cnode p = memset_params(d, v, 1, n);
    return stream_use(s, d, 0, 1, CU_GRAPH_NODE_TYPE_MEMSET, "cuMemsetD8Async", &p);
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s)
{
    struct cnode p = memset_params(d, v, 2, n);
    return stream_use(s, d, 0, 1, CU_GRAPH_NODE_TYPE_MEMSET, "cuMemsetD16Async", &p);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    struct cnode p = memset_params(d, v, 4, n);
    return stream_use(s, d, 0, 1, CU_GRAPH_NODE_TYPE_MEMSET, "cuMemsetD32Async", &p);
}
/* A copy between unified addresses, as the driver infers the memory types. */
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s)
{
    struct cnode p = {.type = CU_GRAPH_NODE_TYPE_MEMCPY};
    p.p.memcpy = (CUDA_MEMCPY3D){.srcMemoryType = CU_MEMORYTYPE_UNIFIED, .srcDevice = src,
                                 .dstMemoryType = CU_MEMORYTYPE_UNIFIED, .dstDevice = d,
                                 .WidthInBytes = n, .Height = 1, .Depth = 1};
    return stream_use(s, d, src, 2, CU_GRAPH_NODE_TYPE_MEMCPY, "cuMemcpyAsync", &p);
}
/* Copies between pinned host memory and device memory: checked when queued and when run, or a
   memcpy node when the stream captures. */
static CUresult host_copy(CUstream s, int type, const void *host, CUdeviceptr dev, size_t n, const char *call)
{
    if (hooked(call))
        return CUDA_ERROR_OUT_OF_MEMORY;
    MAYBE_FAIL();
    need_context(call);
    struct op op = {.type = type, .a = (uintptr_t)host, .b = n, .np = 1, .p = {dev}};
    lock_big(__func__);
    int ok = check_stream(s, call);
    use_host(host, n, call);
    use_memory(dev, call);
    int c = capturing(s);
    if (ok && c) {
        push_op(capture_desc, op);
        push_node(capture_desc, CU_GRAPH_NODE_TYPE_MEMCPY, 0, 0);
    }
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!c)
        enqueue_on(stream_key(s), W_KERNEL, NULL, &op, call, NULL);
    return OK;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return host_copy(s, OP_H2D, src, dst, n, "cuMemcpyHtoDAsync");
}
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return host_copy(s, OP_D2H, dst, src, n, "cuMemcpyDtoHAsync");
}

/* ---------------------------------------------------------------- memory */
CUresult cuMemAlloc(CUdeviceptr *p, size_t bytes)
{
    MAYBE_FAIL();
    (void)bytes;
    need_context("cuMemAlloc");
    lock_big(__func__);
    *p = new_address(S_LIVE);
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t bytes, unsigned int flags)
{
    MAYBE_FAIL();
    need_context("cuMemAllocManaged");
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    size_t rounded = ((bytes ? bytes : 1) + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    unsigned char *m = aligned_alloc((size_t)1 << 20, rounded);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(m, 0xCD, rounded); /* not zeros: whatever the caller reads unwritten shows */
    lock_big(__func__);
    struct ent *e = find((uintptr_t)m, 1);
    e->kind = K_MEM;
    e->state = S_LIVE;
    if (nmanaged == capmanaged) {
        capmanaged = capmanaged ? 2 * capmanaged : 64;
        managed = realloc(managed, capmanaged * sizeof *managed);
    }
    managed[nmanaged++] = (struct hostmem){.p = m, .bytes = bytes, .live = 1};
    __atomic_add_fetch(&managed_live, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&big);
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
CUresult cuMemFree(CUdeviceptr p)
{
    need_context("cuMemFree");
    if (global_capture_forbids("cuMemFree"))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_all(); /* cuMemFree synchronizes */
    lock_big(__func__);
    struct hostmem *m = managed_find(p);
    if (m && m->live && m->p == (unsigned char *)(uintptr_t)p) {
        m->live = 0;
        memset(m->p, 0xDD, m->bytes);
        __atomic_sub_fetch(&managed_live, 1, __ATOMIC_SEQ_CST);
    }
    free_memory(p, "cuMemFree");
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n)
{
    (void)v; (void)n;
    lock_big(__func__);
    use_memory(p, "cuMemsetD8");
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
    volatile unsigned char sum = 0;
    for (size_t i = 0; i < n; i++)
        sum ^= ((const unsigned char *)src)[i];
    lock_big(__func__);
    use_memory(dst, "cuMemcpyHtoD");
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
    wait_all();
    memset(dst, 0, n);
    lock_big(__func__);
    use_memory(src, "cuMemcpyDtoH");
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags)
{
    MAYBE_FAIL();
    (void)flags;
    need_context("cuMemHostAlloc");
    size_t rounded = bytes ? (bytes + 4095) & ~(size_t)4095 : 4096;
    unsigned char *p = aligned_alloc(4096, rounded);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0xCD, rounded); /* not zeros: whatever the caller reads unwritten shows */
    lock_big(__func__);
    if (nhostmem == caphostmem) {
        caphostmem = caphostmem ? 2 * caphostmem : 64;
        hostmems = realloc(hostmems, caphostmem * sizeof *hostmems);
    }
    hostmems[nhostmem++] = (struct hostmem){.p = p, .bytes = bytes, .live = 1};
    __atomic_add_fetch(&host_live, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&big);
    *pp = p;
    return OK;
}
CUresult cuMemFreeHost(void *p)
{
    need_context("cuMemFreeHost");
    if (global_capture_forbids("cuMemFreeHost"))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    lock_big(__func__);
    struct hostmem *h = host_find(p);
    CUresult r = OK;
    if (!h || h->p != p) {
        bad("cuMemFreeHost: %p is not an allocation of cuMemHostAlloc", p);
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!h->live) {
        bad("cuMemFreeHost: %p is freed already", p);
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        /* No wait for queued copies: work that touches it later is reported when it runs. */
        h->live = 0;
        memset(h->p, 0xDD, h->bytes);
        __atomic_sub_fetch(&host_live, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&big);
    return r;
}
static CUresult alloc_async(CUdeviceptr *p, size_t bytes, CUstream s, const char *call)
{
    if (hooked(call))
        return CUDA_ERROR_OUT_OF_MEMORY;
    MAYBE_FAIL();
    need_context(call);
    lock_big(__func__);
    int ok = check_stream(s, call);
    int c = capturing(s);
    *p = new_address(c ? S_UNMAPPED : S_LIVE);
    if (ok && c) {
        push_op(capture_desc, (struct op){.type = OP_ALLOC, .a = *p});
        CUDA_MEM_ALLOC_NODE_PARAMS *a = &push_node(capture_desc, CU_GRAPH_NODE_TYPE_MEM_ALLOC, *p, bytes)->p.alloc;
        /* the default pool's properties: pinned memory on device 0, no peer access */
        a->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        a->poolProps.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
        a->bytesize = bytes;
        a->dptr = *p;
    }
    pthread_mutex_unlock(&big);
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t bytes, CUstream s) { return alloc_async(p, bytes, s, "cuMemAllocAsync"); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream s)
{
    lock_big(__func__);
    int ok = live(pool, K_POOL, "cuMemAllocFromPoolAsync") != NULL;
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    return alloc_async(p, bytes, s, "cuMemAllocFromPoolAsync");
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    MAYBE_FAIL();
    lock_big(__func__);
    int ok = check_stream(s, "cuMemFreeAsync");
    int c = capturing(s);
    if (ok && c) {
        push_op(capture_desc, (struct op){.type = OP_FREE, .a = p});
        push_node(capture_desc, CU_GRAPH_NODE_TYPE_MEM_FREE, p, 0);
    }
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!c) {
        if (order_enabled()) {
            pthread_mutex_lock(&wq);
            order_check_free(stream_key(s), p, "cuMemFreeAsync");
            pthread_mutex_unlock(&wq);
        }
        enqueue_on(stream_key(s), W_FREE, NULL, &(struct op){.a = p}, "cuMemFreeAsync", NULL);
    }
    return OK;
}
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    volatile int t = props->allocType;
    (void)t;
    lock_big(__func__);
    *pool = new_handle(K_POOL, NULL);
    pthread_mutex_unlock(&big);
    return OK;
}
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    lock_big(__func__);
    struct ent *e = live(pool, K_POOL, "cuMemPoolDestroy");
    if (e)
        e->state = S_DEAD;
    pthread_mutex_unlock(&big);
    return e ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    volatile int sum = 0;
    for (size_t i = 0; i < count; i++)
        sum += map[i].flags;
    lock_big(__func__);
    int ok = live(pool, K_POOL, "cuMemPoolSetAccess") != NULL;
    pthread_mutex_unlock(&big);
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool, CUmemLocation *location)
{
    (void)location->id;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    lock_big(__func__);
    int ok = live(pool, K_POOL, "cuMemPoolGetAccess") != NULL;
    pthread_mutex_unlock(&big);
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void *value)
{
    (void)d; (void)attr;
    memset(value, 0, 8);
    return OK;
}
CUresult cuDeviceSetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void *value)
{
    (void)d; (void)attr;
    unsigned long long v;
    memcpy(&v, value, 8);
    return v == 0 ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuDeviceGraphMemTrim(CUdevice d) { (void)d; return OK; }

/* ---------------------------------------------------------------- graphs */
CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    MAYBE_FAIL();
    (void)flags;
    lock_big(__func__);
    *g = new_handle(K_GRAPH, calloc(1, sizeof(struct gdesc)));
    pthread_mutex_unlock(&big);
    return OK;
}
/* Under `big`: the graph's desc, after checking the graph and reading the dependencies. */
static struct gdesc *graph_for_node(CUgraph g, const CUgraphNode *deps, size_t count, const char *call)
{
    for (size_t i = 0; i < count; i++)
        if (!live(deps[i], K_NODE, call))
            return NULL;
    struct ent *e = live(g, K_GRAPH, call);
    return e ? e->desc : NULL;
}
/* Adds a node after `deps`, doing `op` (NULL: none) when the graph runs; `params` gives its type
 * and the parameters it reads back with (an alloc node's access list is copied here). */
static CUresult add_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count, struct op *op,
                         const struct cnode *params, const char *call)
{
    MAYBE_FAIL();
    lock_big(__func__);
    struct gdesc *d = graph_for_node(g, deps, count, call);
    if (d) {
        if (op)
            push_op(d, *op);
        /* A node with an op names it by position (1-based), for the executable graph's setters. */
        *n = new_handle(K_NODE, op ? (void *)(uintptr_t)d->n : NULL);
        struct cnode *c = record_node(d, *n, params->type, deps, count);
        c->address = params->address;
        c->bytes = params->bytes;
        c->p = params->p;
        if (params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            size_t k = params->p.alloc.accessDescCount;
            CUmemAccessDesc *copy = k ? malloc(k * sizeof *copy) : NULL;
            if (k)
                memcpy(copy, params->p.alloc.accessDescs, k * sizeof *copy);
            c->p.alloc.accessDescs = copy;
        }
    }
    pthread_mutex_unlock(&big);
    return d ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphAddEmptyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count)
{
    struct cnode params = {.type = CU_GRAPH_NODE_TYPE_EMPTY};
    return add_node(n, g, deps, count, NULL, &params, "cuGraphAddEmptyNode");
}
CUresult cuGraphAddMemAllocNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count,
                                CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    volatile int sum = 0;
    for (size_t i = 0; i < params->accessDescCount; i++)
        sum += params->accessDescs[i].flags;
    lock_big(__func__);
    params->dptr = new_address(S_UNMAPPED);
    pthread_mutex_unlock(&big);
    struct op op = {.type = OP_ALLOC, .a = params->dptr};
    struct cnode node = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .address = params->dptr, .bytes = params->bytesize};
    node.p.alloc = *params;
    return add_node(n, g, deps, count, &op, &node, "cuGraphAddMemAllocNode");
}
CUresult cuGraphAddMemFreeNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count, CUdeviceptr p)
{
    struct op op = {.type = OP_FREE, .a = p};
    struct cnode node = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE, .address = p};
    return add_node(n, g, deps, count, &op, &node, "cuGraphAddMemFreeNode");
}
CUresult cuGraphAddKernelNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count,
                              const CUDA_KERNEL_NODE_PARAMS *p)
{
    struct op op = {.type = OP_KERNEL, .a = (uintptr_t)p->func};
    lock_big(__func__);
    op.np = read_args(p->func, p->kernelParams, op.p, "cuGraphAddKernelNode");
    pthread_mutex_unlock(&big);
    struct cnode node = {.type = CU_GRAPH_NODE_TYPE_KERNEL};
    node.p.kernel = *p;
    node.p.kernel.kernelParams = NULL;
    node.p.kernel.extra = NULL;
    return add_node(n, g, deps, count, &op, &node, "cuGraphAddKernelNode");
}
CUresult cuGraphAddHostNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count,
                            const CUDA_HOST_NODE_PARAMS *p)
{
    struct op op = {.type = OP_HOST, .a = (uintptr_t)p->fn, .b = (uintptr_t)p->userData};
    struct cnode node = {.type = CU_GRAPH_NODE_TYPE_HOST};
    return add_node(n, g, deps, count, &op, &node, "cuGraphAddHostNode");
}
CUresult cuGraphAddMemsetNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count,
                              const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c)
{
    (void)c;
    struct op op = {.type = OP_USE, .np = 1, .p = {p->dst}};
    struct cnode node = {.type = CU_GRAPH_NODE_TYPE_MEMSET};
    node.p.memset = *p;
    return add_node(n, g, deps, count, &op, &node, "cuGraphAddMemsetNode");
}
CUresult cuGraphAddMemcpyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count,
                              const CUDA_MEMCPY3D *p, CUcontext c)
{
    (void)c;
    struct cnode node = {.type = CU_GRAPH_NODE_TYPE_MEMCPY};
    node.p.memcpy = *p;
    int h2d = p->srcMemoryType == CU_MEMORYTYPE_HOST, d2h = p->dstMemoryType == CU_MEMORYTYPE_HOST;
    if (h2d && d2h)
        return CUDA_ERROR_NOT_SUPPORTED; /* host to host: not in this stub */
    if (h2d || d2h) {
        size_t bytes = p->WidthInBytes * p->Height * p->Depth;
        const void *host = h2d ? p->srcHost : p->dstHost;
        struct op op = {.type = h2d ? OP_H2D : OP_D2H, .a = (uintptr_t)host, .b = bytes, .np = 1,
                        .p = {h2d ? p->dstDevice : p->srcDevice}};
        lock_big(__func__);
        int ok = use_host(host, bytes, "cuGraphAddMemcpyNode");
        pthread_mutex_unlock(&big);
        if (!ok)
            return CUDA_ERROR_INVALID_VALUE;
        return add_node(n, g, deps, count, &op, &node, "cuGraphAddMemcpyNode");
    }
    struct op op = {.type = OP_USE, .np = 2, .p = {p->srcDevice, p->dstDevice}};
    return add_node(n, g, deps, count, &op, &node, "cuGraphAddMemcpyNode");
}
static CUresult add_event_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count, CUevent ev,
                               CUgraphNodeType type, const char *call)
{
    lock_big(__func__);
    int ok = live(ev, K_EVENT, call) != NULL;
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    struct op op = {.type = OP_EVENT, .a = (uintptr_t)ev};
    struct cnode node = {.type = type};
    return add_node(n, g, deps, count, &op, &node, call);
}
CUresult cuGraphAddEventRecordNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count, CUevent ev)
{
    return add_event_node(n, g, deps, count, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD, "cuGraphAddEventRecordNode");
}
CUresult cuGraphAddEventWaitNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count, CUevent ev)
{
    return add_event_node(n, g, deps, count, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT, "cuGraphAddEventWaitNode");
}
/* Under `big`: appends `child`'s work to `parent`. */
static void append_ops(struct gdesc *parent, const struct gdesc *child)
{
    for (size_t i = 0; i < child->n; i++)
        push_op(parent, child->ops[i]);
}
CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t count, CUgraph child)
{
    lock_big(__func__);
    struct ent *c = live(child, K_GRAPH, "cuGraphAddChildGraphNode");
    struct gdesc *d = c ? graph_for_node(g, deps, count, "cuGraphAddChildGraphNode") : NULL;
    if (d) {
        append_ops(d, c->desc);
        *n = new_handle(K_NODE, NULL);
        record_node(d, *n, CU_GRAPH_NODE_TYPE_GRAPH, deps, count);
    }
    pthread_mutex_unlock(&big);
    return d ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                        size_t count, CUgraphNodeParams *p)
{
    (void)edges;
    if (p->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_NOT_SUPPORTED;
    lock_big(__func__);
    struct ent *c = live(p->graph.graph, K_GRAPH, "cuGraphAddNode");
    struct gdesc *d = c ? graph_for_node(g, deps, count, "cuGraphAddNode") : NULL;
    if (d) {
        struct gdesc *cd = c->desc;
        append_ops(d, cd);
        if (p->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) {
            for (size_t i = 0; i < cd->nobj; i++)
                push_obj(d, cd->objs[i].o, cd->objs[i].count);
            cd->nobj = 0;
            c->state = S_MOVED;
        }
        *n = new_handle(K_NODE, NULL);
        record_node(d, *n, CU_GRAPH_NODE_TYPE_GRAPH, deps, count);
    }
    pthread_mutex_unlock(&big);
    return d ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphAddDependencies(CUgraph g, const CUgraphNode *from, const CUgraphNode *to,
                                const CUgraphEdgeData *data, size_t count)
{
    (void)data;
    lock_big(__func__);
    struct ent *e = live(g, K_GRAPH, "cuGraphAddDependencies");
    int ok = e != NULL;
    for (size_t i = 0; ok && i < count; i++)
        ok = live(from[i], K_NODE, "cuGraphAddDependencies") && live(to[i], K_NODE, "cuGraphAddDependencies");
    for (size_t i = 0; ok && i < count; i++) {
        struct cnode *f = node_in(e->desc, from[i]), *t = node_in(e->desc, to[i]);
        if (!f || !t) {
            bad("cuGraphAddDependencies: a node of another graph");
            ok = 0;
        } else
            add_dep(t, from[i]);
    }
    pthread_mutex_unlock(&big);
    return ok ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphDestroy(CUgraph g)
{
    lock_big(__func__);
    struct ent *e = live(g, K_GRAPH, "cuGraphDestroy");
    struct gdesc *d = NULL;
    if (e) {
        e->state = S_DEAD;
        d = e->desc;
        e->desc = NULL;
    }
    pthread_mutex_unlock(&big);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (sync_destroy()) {
        release_objs(d);
        free_desc(d);
    } else
        enqueue(W_RELEASE, d, NULL, "graph destroy");
    return OK;
}
static CUresult instantiate(CUgraphExec *x, CUgraph g, unsigned long long flags, const char *call)
{
    MAYBE_FAIL();
    lock_big(__func__);
    struct ent *e = live(g, K_GRAPH, call);
    if (e) {
        struct gdesc *d = e->desc;
        struct gdesc *xd = calloc(1, sizeof *xd);
        append_ops(xd, d);
        for (size_t i = 0; i < d->nobj; i++) {
            __atomic_add_fetch(&d->objs[i].o->refs, 1, __ATOMIC_ACQ_REL);
            push_obj(xd, d->objs[i].o, 1);
        }
        xd->flags = flags;
        xd->graph = g;
        *x = new_handle(K_EXEC, xd);
    }
    pthread_mutex_unlock(&big);
    return e ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *x, CUgraph g, unsigned long long flags)
{
    return instantiate(x, g, flags, "cuGraphInstantiateWithFlags");
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *x, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    lock_big(__func__);
    int ok = check_stream(p->hUploadStream, "cuGraphInstantiateWithParams");
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = instantiate(x, g, p->flags, "cuGraphInstantiateWithParams");
    p->hErrNode_out = NULL;
    p->result_out = r == OK ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}
CUresult cuGraphLaunch(CUgraphExec x, CUstream s)
{
    MAYBE_FAIL();
    need_context("cuGraphLaunch");
    lock_big(__func__);
    struct ent *e = live(x, K_EXEC, "cuGraphLaunch");
    int ok = check_stream(s, "cuGraphLaunch") && e;
    int c = capturing(s);
    if (ok && !c && order_enabled()) {
        /* Its free nodes, and its alloc nodes (which free the previous launch's allocation
         * under AutoFreeOnLaunch, or map the address again). */
        const struct gdesc *xd = e->desc;
        pthread_mutex_lock(&wq);
        for (size_t i = 0; i < xd->n; i++)
            if (xd->ops[i].type == OP_FREE || xd->ops[i].type == OP_ALLOC)
                order_check_free(stream_key(s), xd->ops[i].a, "cuGraphLaunch (a free or alloc node)");
        pthread_mutex_unlock(&wq);
    }
    if (ok && !c)
        enqueue_on(stream_key(s), W_EXEC, e->desc, NULL, "launch", NULL); /* under `big`: before any destroy of it */
    pthread_mutex_unlock(&big);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (c)
        return CUDA_ERROR_NOT_SUPPORTED; /* no child-graph capture in this stub */
    return OK;
}
CUresult cuGraphUpload(CUgraphExec x, CUstream s)
{
    lock_big(__func__);
    int ok = live(x, K_EXEC, "cuGraphUpload") && check_stream(s, "cuGraphUpload");
    pthread_mutex_unlock(&big);
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuGraphExecDestroy(CUgraphExec x)
{
    MAYBE_FAIL();
    lock_big(__func__);
    struct ent *e = live(x, K_EXEC, "cuGraphExecDestroy");
    struct gdesc *d = NULL;
    if (e) {
        e->state = S_DEAD;
        d = e->desc;
        /* Deferred after the launches queued before it, as the driver does. */
        enqueue(W_RELEASE, d, NULL, "exec destroy");
    }
    pthread_mutex_unlock(&big);
    return e ? OK : CUDA_ERROR_INVALID_HANDLE;
}
/* A kernel node's new function and arguments for later launches. Launches queued before keep
 * the ops they were queued with, as the driver's do: the executable graph gets a copy of its
 * ops (and its held objects move to it); the old copy, which queued launches read, is left
 * behind. */
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *p)
{
    MAYBE_FAIL();
    lock_big(__func__);
    struct ent *e = live(x, K_EXEC, "cuGraphExecKernelNodeSetParams");
    struct ent *ne = live(node, K_NODE, "cuGraphExecKernelNodeSetParams");
    size_t at = ne ? (size_t)(uintptr_t)ne->desc : 0;
    struct gdesc *old = e ? e->desc : NULL;
    int ok = old && at > 0 && at <= old->n && old->ops[at - 1].type == OP_KERNEL;
    if (ok) {
        struct op op = {.type = OP_KERNEL, .a = (uintptr_t)p->func};
        op.np = read_args(p->func, p->kernelParams, op.p, "cuGraphExecKernelNodeSetParams");
        struct gdesc *xd = calloc(1, sizeof *xd);
        append_ops(xd, old);
        xd->ops[at - 1] = op;
        xd->objs = old->objs, xd->nobj = old->nobj, xd->capobj = old->capobj;
        old->objs = NULL, old->nobj = old->capobj = 0;
        xd->flags = old->flags;
        xd->graph = old->graph;
        e->desc = xd;
    }
    pthread_mutex_unlock(&big);
    return ok ? OK : CUDA_ERROR_INVALID_VALUE;
}

/* Graphs read back as their nodes and edges, each node with the parameters it was made with. */
static struct gdesc *graph_desc(CUgraph g, const char *call)
{
    struct ent *e = live(g, K_GRAPH, call);
    return e ? e->desc : NULL;
}
/* Under `big`: writes the `n` nodes that `node_at(i)` gives into `out`, which has room for
 * `*count` (as the driver: a null array asks for the count; room left over is set to NULL; the
 * count becomes the number written). Room for fewer than `n` is reported: the crate asks with
 * the count it was given. */
static void write_nodes(CUgraphNode *out, size_t *count, size_t n, CUgraphNode (*node_at)(void *, size_t),
                        void *ctx, const char *call)
{
    if (!out) {
        *count = n;
        return;
    }
    if (*count < n)
        bad("%s: room for %zu nodes, %zu to write", call, *count, n);
    size_t written = n < *count ? n : *count;
    for (size_t i = 0; i < *count; i++)
        out[i] = i < written ? node_at(ctx, i) : NULL;
    *count = written;
}
static CUgraphNode graph_node_at(void *d, size_t i) { return ((struct gdesc *)d)->nodes[i].node; }
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *count)
{
    lock_big(__func__);
    struct gdesc *d = graph_desc(g, "cuGraphGetNodes");
    if (d)
        write_nodes(nodes, count, d->nnodes, graph_node_at, d, "cuGraphGetNodes");
    pthread_mutex_unlock(&big);
    return d ? OK : CUDA_ERROR_INVALID_HANDLE;
}
/* The `i`th root of a graph: its `i`th node without dependencies. */
static CUgraphNode root_at(void *d, size_t i)
{
    struct gdesc *g = d;
    for (size_t j = 0; j < g->nnodes; j++)
        if (!g->nodes[j].ndeps && i-- == 0)
            return g->nodes[j].node;
    return NULL;
}
CUresult cuGraphGetRootNodes(CUgraph g, CUgraphNode *roots, size_t *count)
{
    lock_big(__func__);
    struct gdesc *d = graph_desc(g, "cuGraphGetRootNodes");
    size_t n = 0;
    for (size_t j = 0; d && j < d->nnodes; j++)
        n += !d->nodes[j].ndeps;
    if (d)
        write_nodes(roots, count, n, root_at, d, "cuGraphGetRootNodes");
    pthread_mutex_unlock(&big);
    return d ? OK : CUDA_ERROR_INVALID_HANDLE;
}
/* Edges in the order of their targets, each target's in the order added. */
CUresult cuGraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *data, size_t *count)
{
    lock_big(__func__);
    struct gdesc *d = graph_desc(g, "cuGraphGetEdges");
    size_t n = 0;
    for (size_t j = 0; d && j < d->nnodes; j++)
        n += d->nodes[j].ndeps;
    if (from || to) {
        if (!from || !to)
            bad("cuGraphGetEdges: one of from/to is null");
        size_t i = 0;
        for (size_t j = 0; d && from && to && j < d->nnodes; j++)
            for (size_t k = 0; k < d->nodes[j].ndeps && i < *count; k++, i++) {
                from[i] = d->nodes[j].deps[k];
                to[i] = d->nodes[j].node;
                if (data)
                    memset(&data[i], 0, sizeof data[i]);
            }
    }
    *count = n;
    pthread_mutex_unlock(&big);
    return d ? OK : CUDA_ERROR_INVALID_HANDLE;
}
/* Under `big`: the entry of a node of a live graph, and that graph, or NULL. */
static struct cnode *find_node(CUgraphNode node, struct gdesc **graph)
{
    /* linear over every live graph is too slow; nodes remember nothing, so search the table */
    for (size_t i = 0; i <= tab_mask; i++)
        if (tab[i].key && tab[i].kind == K_GRAPH && tab[i].desc) {
            struct cnode *c = node_in(tab[i].desc, node);
            if (c) {
                if (graph)
                    *graph = tab[i].desc;
                return c;
            }
        }
    return NULL;
}
static struct cnode *graph_node(CUgraphNode node) { return find_node(node, NULL); }
static CUgraphNode dep_at(void *c, size_t i) { return ((struct cnode *)c)->deps[i]; }
CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, CUgraphEdgeData *data, size_t *count)
{
    lock_big(__func__);
    live(node, K_NODE, "cuGraphNodeGetDependencies");
    struct cnode *c = graph_node(node);
    if (data && !deps)
        bad("cuGraphNodeGetDependencies: edge data asked for without the dependencies");
    if (c) {
        write_nodes(deps, count, c->ndeps, dep_at, c, "cuGraphNodeGetDependencies");
        for (size_t i = 0; data && deps && i < *count; i++)
            memset(&data[i], 0, sizeof data[i]);
    }
    pthread_mutex_unlock(&big);
    return c ? OK : CUDA_ERROR_INVALID_VALUE;
}
/* The dependents of a node: the nodes of its graph that list it, in the graph's order. */
struct dependents { struct gdesc *g; CUgraphNode node; };
static int depends_on(const struct cnode *c, CUgraphNode node)
{
    for (size_t k = 0; k < c->ndeps; k++)
        if (c->deps[k] == node)
            return 1;
    return 0;
}
static CUgraphNode dependent_at(void *ctx, size_t i)
{
    struct dependents *w = ctx;
    for (size_t j = 0; j < w->g->nnodes; j++)
        if (depends_on(&w->g->nodes[j], w->node) && i-- == 0)
            return w->g->nodes[j].node;
    return NULL;
}
CUresult cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode *out, CUgraphEdgeData *data, size_t *count)
{
    lock_big(__func__);
    live(node, K_NODE, "cuGraphNodeGetDependentNodes");
    struct gdesc *g = NULL;
    struct cnode *c = find_node(node, &g);
    if (data && !out)
        bad("cuGraphNodeGetDependentNodes: edge data asked for without the nodes");
    if (c) {
        struct dependents w = {g, node};
        size_t n = 0;
        for (size_t j = 0; j < g->nnodes; j++)
            n += depends_on(&g->nodes[j], node);
        write_nodes(out, count, n, dependent_at, &w, "cuGraphNodeGetDependentNodes");
        for (size_t i = 0; data && out && i < *count; i++)
            memset(&data[i], 0, sizeof data[i]);
    }
    pthread_mutex_unlock(&big);
    return c ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
    lock_big(__func__);
    struct cnode *n = graph_node(node);
    if (n)
        *type = (CUgraphNodeType)n->type;
    pthread_mutex_unlock(&big);
    return n ? OK : CUDA_ERROR_INVALID_HANDLE;
}
/* Under `big`: the entry of `node` when it is a node of a live graph of `type`, else NULL after
 * reporting a call for another type (the crate asks by the type it read). */
static struct cnode *node_of_type(CUgraphNode node, int type, const char *call)
{
    live(node, K_NODE, call);
    struct cnode *n = graph_node(node);
    if (n && n->type != type) {
        bad("%s: node %p is of type %d, not %d", call, node, n->type, type);
        return NULL;
    }
    return n;
}
CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params)
{
    lock_big(__func__);
    struct cnode *n = node_of_type(node, CU_GRAPH_NODE_TYPE_KERNEL, "cuGraphKernelNodeGetParams");
    if (n)
        *params = n->p.kernel;
    pthread_mutex_unlock(&big);
    return n ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS *params)
{
    lock_big(__func__);
    struct cnode *n = node_of_type(node, CU_GRAPH_NODE_TYPE_MEMSET, "cuGraphMemsetNodeGetParams");
    if (n)
        *params = n->p.memset;
    pthread_mutex_unlock(&big);
    return n ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D *params)
{
    lock_big(__func__);
    struct cnode *n = node_of_type(node, CU_GRAPH_NODE_TYPE_MEMCPY, "cuGraphMemcpyNodeGetParams");
    if (n)
        *params = n->p.memcpy;
    pthread_mutex_unlock(&big);
    return n ? OK : CUDA_ERROR_INVALID_VALUE;
}
/* The access list points at the node's own copy, valid while the graph exists, as the driver's. */
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    lock_big(__func__);
    struct cnode *n = node_of_type(node, CU_GRAPH_NODE_TYPE_MEM_ALLOC, "cuGraphMemAllocNodeGetParams");
    if (n)
        *params = n->p.alloc;
    pthread_mutex_unlock(&big);
    return n ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr *address)
{
    lock_big(__func__);
    struct cnode *n = node_of_type(node, CU_GRAPH_NODE_TYPE_MEM_FREE, "cuGraphMemFreeNodeGetParams");
    if (n)
        *address = n->address;
    pthread_mutex_unlock(&big);
    return n ? OK : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphDebugDotPrint(CUgraph g, const char *path, unsigned int flags)
{
    (void)path; (void)flags;
    lock_big(__func__);
    int ok = live(g, K_GRAPH, "cuGraphDebugDotPrint") != NULL;
    pthread_mutex_unlock(&big);
    return ok ? OK : CUDA_ERROR_INVALID_HANDLE;
}

/* ---------------------------------------------------------------- user objects */
CUresult cuUserObjectCreate(CUuserObject *out, void *data, CUhostFn destroy, unsigned int count, unsigned int flags)
{
    MAYBE_FAIL();
    if (flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
        bad("cuUserObjectCreate: flags %u", flags);
    struct uobj *o = malloc(sizeof *o);
    o->destroy = destroy;
    o->data = data;
    o->refs = (int)count;
    *out = (CUuserObject)o;
    return OK;
}
CUresult cuUserObjectRetain(CUuserObject o, unsigned int count)
{
    __atomic_add_fetch(&((struct uobj *)o)->refs, (int)count, __ATOMIC_ACQ_REL);
    return OK;
}
CUresult cuUserObjectRelease(CUuserObject o, unsigned int count)
{
    if (!on_gpu_thread)
        teardown_call(__func__);
    release_obj((struct uobj *)o, (int)count);
    return OK;
}
CUresult cuGraphRetainUserObject(CUgraph g, CUuserObject o, unsigned int count, unsigned int flags)
{
    MAYBE_FAIL();
    struct uobj *obj = (struct uobj *)o;
    lock_big(__func__);
    struct ent *e = live(g, K_GRAPH, "cuGraphRetainUserObject");
    if (e) {
        if (!(flags & CU_GRAPH_USER_OBJECT_MOVE))
            __atomic_add_fetch(&obj->refs, (int)count, __ATOMIC_ACQ_REL);
        push_obj(e->desc, obj, (int)count);
    }
    pthread_mutex_unlock(&big);
    return e ? OK : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuGraphReleaseUserObject(CUgraph g, CUuserObject o, unsigned int count)
{
    lock_big(__func__);
    struct ent *e = live(g, K_GRAPH, "cuGraphReleaseUserObject");
    int found = 0;
    if (e) {
        struct gdesc *d = e->desc;
        for (size_t i = 0; i < d->nobj; i++)
            if (d->objs[i].o == (struct uobj *)o && d->objs[i].count >= (int)count) {
                d->objs[i].count -= (int)count;
                found = 1;
                break;
            }
    }
    pthread_mutex_unlock(&big);
    if (found)
        release_obj((struct uobj *)o, (int)count);
    return found ? OK : CUDA_ERROR_INVALID_VALUE;
}

/* Calls that take no lock: checked here. */
__attribute__((destructor)) static void teardown(void)
{
    const char *t = getenv("HUNT_TEARDOWN");
    if (!t || *t != '1')
        return;
    pthread_mutex_lock(&wq);
    unsigned long long pending = issued - done;
    pthread_mutex_unlock(&wq);
    fprintf(stderr, "HUNT: driver teardown at exit, %llu work items still queued\n", pending);
    __atomic_store_n(&tearing_down, 1, __ATOMIC_SEQ_CST);
    /* The GPU finishes its work; destructors run as it does. */
    pthread_mutex_lock(&wq);
    unsigned long long seq = issued;
    while (done < seq)
        pthread_cond_wait(&wq_done, &wq);
    pthread_mutex_unlock(&wq);
    usleep(300000); /* what the destructors set off has time to call in */
    fprintf(stderr, "HUNT: teardown over: %d calls arrived during it\n", __atomic_load_n(&errors_at_exit, __ATOMIC_SEQ_CST));
}
