// Which sequence leaves graph memory reserved after every allocation is freed and memory
// trimmed. Each cycle builds a graph whose 1 MiB allocation escapes it (alloc -> spin -> fill,
// no free node), instantiates it, launches it on a stream, drops the graph and its exec either
// while the launch still runs or after it, and frees the allocation outside the graph, either
// once everything is idle or at once on another stream ordered after the launch. After the
// cycles, cudaDeviceSynchronize, cudaDeviceGraphMemTrim(0), then used and reserved graph memory.
// Seen from a Rust library: reserved stayed at 32 MiB per 50 cycles (used 0) when such a graph
// was destroyed while its launch ran and the allocation freed afterwards; the same in raw calls,
// explicit graph, no user object, left reserved 0. Built and run on the GPU machine:
//
//   nvcc -O2 -o escaped_reserve bench/probe/escaped_reserve.cu -lcuda && ./escaped_reserve [CYCLES]
//
// Axes, every combination, CYCLES cycles each (50):
//   build  explicit (cudaGraphAddMemAllocNode + kernel nodes) or captured (cudaMallocAsync and
//          kernels under global-mode stream capture)
//   user   none, or uo (a user object, destructor counts, moved into the graph)
//   drop   in_flight (exec and graph destroyed right after the launch) or after_sync
//   then   (last 8 lines, in_flight free_now only) trim_mid: a trim right after the free, the
//          graph perhaps still running; probe_trim_mid: a probe graph allocating as much on a
//          third stream, synchronized, a trim, the probe freed (the crate's stress test's order)
//   free   free_later (launch stream idle and, for uo, destructor run; then cudaFreeAsync on
//          another stream and synchronize) or free_now (cudaFreeAsync on another stream that
//          waits for an event recorded after the launch, no host wait)
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <thread>

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s failed: %s: %s (line %d)\n", #x, cudaGetErrorName(e_), \
                    cudaGetErrorString(e_), __LINE__);                                \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

__global__ void spin(unsigned long long cycles) {
    long long t0 = clock64();
    while ((unsigned long long)(clock64() - t0) < cycles) {
    }
}

__global__ void fill(unsigned *p, unsigned long long n, unsigned v) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += stride)
        p[i] = v;
}

static const size_t BYTES = 1 << 20;
static const unsigned long long WORDS = BYTES / 4, SPIN = 2000000;
static const unsigned GRID = 256, BLOCK = 256;

static std::atomic<int> destroyed{0};
static void CUDART_CB dtor(void *) { destroyed.fetch_add(1); }

static unsigned long long attr(cudaGraphMemAttributeType a) {
    unsigned long long v = 0;
    CK(cudaDeviceGetGraphMemAttribute(0, a, &v));
    return v;
}

static cudaGraphNode_t add_kernel(cudaGraph_t g, const cudaGraphNode_t *dep, const void *func,
                                  unsigned grid, unsigned block, void **args) {
    cudaKernelNodeParams p = {};
    p.func = (void *)func;
    p.gridDim = dim3(grid);
    p.blockDim = dim3(block);
    p.kernelParams = args;  // copied by cudaGraphAddKernelNode
    cudaGraphNode_t node;
    CK(cudaGraphAddKernelNode(&node, g, dep, dep ? 1 : 0, &p));
    return node;
}

// alloc -> spin -> fill(p), no free node; *ptr gets the allocation's address.
static cudaGraph_t build(bool captured, cudaStream_t cs, void **ptr, unsigned v) {
    unsigned long long cyc = SPIN, n = WORDS;
    cudaGraph_t g;
    if (captured) {
        CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        CK(cudaMallocAsync(ptr, BYTES, cs));
        spin<<<1, 1, 0, cs>>>(cyc);
        CK(cudaGetLastError());
        fill<<<GRID, BLOCK, 0, cs>>>((unsigned *)*ptr, n, v);
        CK(cudaGetLastError());
        CK(cudaStreamEndCapture(cs, &g));
        return g;
    }
    CK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = BYTES;
    cudaGraphNode_t alloc;
    CK(cudaGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap));
    *ptr = ap.dptr;
    void *sargs[] = {&cyc};
    cudaGraphNode_t sp = add_kernel(g, &alloc, (const void *)spin, 1, 1, sargs);
    void *fargs[] = {ptr, &n, &v};
    add_kernel(g, &sp, (const void *)fill, GRID, BLOCK, fargs);
    return g;
}

// Waits (at most 1 s) for the user-object destructor count to reach want.
static bool wait_destroyed(int want) {
    auto t0 = std::chrono::steady_clock::now();
    while (destroyed.load() < want) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(1)) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
}

// What happens between the free and the next cycle: nothing, a trim while the graph may
// still run, or (as the crate's stress test does) a probe graph on a third stream that
// allocates as much, synchronized, then a trim, then the probe's free.
enum Mid { MID_NONE, MID_TRIM, MID_PROBE_TRIM };
static const char *mid_names[] = {"", " trim_mid", " probe_trim_mid"};

static void combo(bool captured, bool uo, bool in_flight, bool free_now, int cycles,
                  Mid mid = MID_NONE) {
    char name[80];
    snprintf(name, sizeof name, "%s %s %s %s%s", captured ? "captured" : "explicit",
             uo ? "uo" : "none", in_flight ? "in_flight" : "after_sync",
             free_now ? "free_now" : "free_later", mid_names[mid]);
    CK(cudaDeviceSynchronize());
    CK(cudaDeviceGraphMemTrim(0));
    unsigned long long used0 = attr(cudaGraphMemAttrUsedMemCurrent),
                       res0 = attr(cudaGraphMemAttrReservedMemCurrent);
    if (res0)
        printf("warning: %s starts with used %llu reserved %llu (a previous combination leaked; "
               "its figure includes that)\n", name, used0, res0);

    cudaStream_t s, other, cs, ps;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking));
    // The probe: alloc -> spin -> fill, no free node (freed by cudaFreeAsync after the trim).
    void *probe_ptr = nullptr;
    cudaGraph_t pg = build(false, cs, &probe_ptr, 0xC0FFEEu);
    cudaGraphExec_t pex;
    CK(cudaGraphInstantiateWithFlags(&pex, pg, 0));
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    destroyed = 0;
    int late = 0;  // uo destructors not run within 1 s in free_later

    for (int c = 0; c < cycles; c++) {
        void *ptr = nullptr;
        cudaGraph_t g = build(captured, cs, &ptr, (unsigned)c);
        if (uo) {
            cudaUserObject_t obj;
            CK(cudaUserObjectCreate(&obj, nullptr, dtor, 1, cudaUserObjectNoDestructorSync));
            CK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));
        }
        cudaGraphExec_t ex;
        CK(cudaGraphInstantiateWithFlags(&ex, g, 0));
        CK(cudaGraphLaunch(ex, s));
        CK(cudaEventRecord(ev, s));
        if (!in_flight) CK(cudaStreamSynchronize(s));
        CK(cudaGraphExecDestroy(ex));
        CK(cudaGraphDestroy(g));
        if (free_now) {
            CK(cudaStreamWaitEvent(other, ev, 0));
            CK(cudaFreeAsync(ptr, other));
        } else {
            CK(cudaStreamSynchronize(s));
            if (uo && !wait_destroyed(c + 1)) late++;
            CK(cudaFreeAsync(ptr, other));
            CK(cudaStreamSynchronize(other));
        }
        if (mid == MID_TRIM) CK(cudaDeviceGraphMemTrim(0));
        if (mid == MID_PROBE_TRIM) {
            CK(cudaGraphLaunch(pex, ps));
            CK(cudaStreamSynchronize(ps));
            CK(cudaDeviceGraphMemTrim(0));
            CK(cudaFreeAsync(probe_ptr, ps));
            CK(cudaStreamSynchronize(ps));
        }
    }
    CK(cudaGraphExecDestroy(pex));
    CK(cudaGraphDestroy(pg));

    CK(cudaDeviceSynchronize());
    CK(cudaDeviceGraphMemTrim(0));
    unsigned long long used = attr(cudaGraphMemAttrUsedMemCurrent),
                       res = attr(cudaGraphMemAttrReservedMemCurrent);
    printf("%s: used %llu reserved %llu (after %d cycles)", name, used, res, cycles);
    if (res0) printf(" [delta: used %lld reserved %lld]", (long long)(used - used0),
                     (long long)(res - res0));
    printf("\n");
    if (uo) {
        int at_trim = destroyed.load();
        if (late || at_trim != cycles)
            printf("  uo: %d destructors had run at the trim (of %d); %d late past 1 s\n",
                   at_trim, cycles, late);
    }
    if (res != res0) {
        // Transient or stuck: wait for any pending destructors, trim again.
        if (uo) wait_destroyed(cycles);
        std::this_thread::sleep_for(std::chrono::seconds(1));
        CK(cudaDeviceSynchronize());
        CK(cudaDeviceGraphMemTrim(0));
        printf("  1 s later, trimmed again: used %llu reserved %llu\n",
               attr(cudaGraphMemAttrUsedMemCurrent), attr(cudaGraphMemAttrReservedMemCurrent));
    }
    fflush(stdout);
    CK(cudaEventDestroy(ev));
    for (cudaStream_t x : {s, other, cs, ps}) CK(cudaStreamDestroy(x));
}

int main(int argc, char **argv) {
    int cycles = argc > 1 ? atoi(argv[1]) : 50;
    if (cycles <= 0) {
        fprintf(stderr, "usage: %s [CYCLES]\n", argv[0]);
        return 2;
    }
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0, rt = 0;
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    printf("%s, driver API %d, runtime %d\n", prop.name, drv, rt);
    for (int captured = 0; captured < 2; captured++)
        for (int uo = 0; uo < 2; uo++)
            for (int in_flight = 1; in_flight >= 0; in_flight--)
                for (int free_now = 0; free_now < 2; free_now++)
                    combo(captured, uo, in_flight, free_now, cycles);
    // The sequence of the crate's stress test (in flight, freed at once, then a trim, with and
    // without a probe allocation first), both builds, with and without a user object.
    for (int captured = 0; captured < 2; captured++)
        for (int uo = 0; uo < 2; uo++)
            for (Mid mid : {MID_TRIM, MID_PROBE_TRIM}) combo(captured, uo, true, true, cycles, mid);
    return 0;
}
