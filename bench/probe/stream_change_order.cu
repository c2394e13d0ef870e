// A graph that leaves its allocation live (alloc -> copy -> add, no free node, instantiated
// with AutoFreeOnLaunch), relaunched into a different stream each round while another thread
// uses the same streams, runs out of the order that the events set: a consumer of the previous
// launch reads the relaunch's value, or a consumer after the relaunch reads the previous value.
// Observed on an H200, driver 580: this program, shared 27 bad rounds of 3000, home 0, own 0;
// the same sequence through the driver API from Rust, shared 63-111 of 3000, own 0,
// same_stream 0, host_wait 0-1 (three processes at once), explicit_free 3, home 0 of 18000
// (three processes at once); locked_launch 6-21 of 3000, locked_round 0 of 3000. Built and run
// on the GPU machine:
//
//   nvcc -O2 -o stream_change_order bench/probe/stream_change_order.cu -lcuda && ./stream_change_order
//   ./stream_change_order [MODE] [ROUNDS]     (one mode: shared own same_stream host_wait
//                                              explicit_free home; rounds per thread, 1500)
//
// Modes: shared, both threads on streams 0..3; own, thread t on streams 4t..4t+3; same_stream,
// the relaunch on the first launch's stream; host_wait, the host waits for the consumer before
// the relaunch; explicit_free, no AutoFreeOnLaunch, cudaFreeAsync before each relaunch; home,
// every launch of the graph goes through one stream of the thread's own, bridged by events;
// locked_launch, shared with every cudaGraphLaunch under one process-wide mutex; locked_round,
// shared with each thread's steps 1-7 (kernel, waits, launches, records) under it.
#include <cuda_runtime.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <vector>

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s failed: %s: %s (line %d)\n", #x, cudaGetErrorName(e_), \
                    cudaGetErrorString(e_), __LINE__);                                \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

__global__ void copy_u32(unsigned *dst, const unsigned *src, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

__global__ void add_u32(unsigned *p, unsigned long long n, unsigned v) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}

__global__ void spin(unsigned long long cycles) {
    long long t0 = clock64();
    while ((unsigned long long)(clock64() - t0) < cycles) {
    }
}

static const unsigned long long W = 16384;  // words
static const unsigned BLOCK = 256;
static const int THREADS = 2, NSTREAMS = 8;

enum Mode { SHARED, OWN, SAME_STREAM, HOST_WAIT, EXPLICIT_FREE, HOME, LOCKED_LAUNCH, LOCKED_ROUND, MODES };
static const char *mode_names[] = {"shared", "own", "same_stream", "host_wait", "explicit_free", "home", "locked_launch", "locked_round"};
static std::mutex launch_mu;  // LOCKED_LAUNCH: held across every cudaGraphLaunch; LOCKED_ROUND: across steps 1-7

struct Thr {
    unsigned *src = nullptr, *o3 = nullptr, *o4 = nullptr;
    void *a = nullptr;  // the producer graph's allocation
    cudaGraph_t gp = nullptr, g3a = nullptr, g3b = nullptr;
    cudaGraphExec_t p = nullptr, c3a = nullptr, c3b = nullptr;
    cudaEvent_t ep1 = nullptr, ec = nullptr, ep2 = nullptr, bin = nullptr, bout = nullptr;
    cudaStream_t home = nullptr;
};

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

static void build(Thr &T, int t, Mode m) {
    for (unsigned **q : {&T.src, &T.o3, &T.o4}) CK(cudaMalloc((void **)q, W * 4));
    std::vector<unsigned> init(W, (unsigned)t << 28);
    CK(cudaMemcpy(T.src, init.data(), W * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(T.o3, 0xff, W * 4));
    CK(cudaMemset(T.o4, 0xff, W * 4));
    unsigned long long n = W;
    unsigned one = 1;
    unsigned grid = (unsigned)((W + BLOCK - 1) / BLOCK);

    // Producer P: alloc -> copy_u32(a, src) -> add_u32(src, 1); no free node.
    CK(cudaGraphCreate(&T.gp, 0));
    cudaMemAllocNodeParams ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = W * 4;
    cudaGraphNode_t alloc;
    CK(cudaGraphAddMemAllocNode(&alloc, T.gp, nullptr, 0, &ap));
    T.a = ap.dptr;
    void *cargs[] = {&T.a, &T.src, &n};
    cudaGraphNode_t copy = add_kernel(T.gp, &alloc, (const void *)copy_u32, grid, BLOCK, cargs);
    void *aargs[] = {&T.src, &n, &one};
    add_kernel(T.gp, &copy, (const void *)add_u32, grid, BLOCK, aargs);
    unsigned long long flags = m == EXPLICIT_FREE ? 0 : cudaGraphInstantiateFlagAutoFreeOnLaunch;
    CK(cudaGraphInstantiateWithFlags(&T.p, T.gp, flags));

    // C3a: spin -> copy_u32(o3, a). C3b: copy_u32(o4, a).
    unsigned long long cyc = 4000000;
    void *sargs[] = {&cyc};
    CK(cudaGraphCreate(&T.g3a, 0));
    cudaGraphNode_t sp = add_kernel(T.g3a, nullptr, (const void *)spin, 1, 1, sargs);
    void *a3args[] = {&T.o3, &T.a, &n};
    add_kernel(T.g3a, &sp, (const void *)copy_u32, grid, BLOCK, a3args);
    CK(cudaGraphInstantiateWithFlags(&T.c3a, T.g3a, 0));
    CK(cudaGraphCreate(&T.g3b, 0));
    void *b3args[] = {&T.o4, &T.a, &n};
    add_kernel(T.g3b, nullptr, (const void *)copy_u32, grid, BLOCK, b3args);
    CK(cudaGraphInstantiateWithFlags(&T.c3b, T.g3b, 0));

    for (cudaEvent_t *e : {&T.ep1, &T.ec, &T.ep2}) CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    if (m == HOME) {
        CK(cudaStreamCreateWithFlags(&T.home, cudaStreamNonBlocking));
        for (cudaEvent_t *e : {&T.bin, &T.bout}) CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
}

static void launchP(Thr &T, Mode m, cudaStream_t s) {
    if (m == HOME) {
        CK(cudaEventRecord(T.bin, s));
        CK(cudaStreamWaitEvent(T.home, T.bin, 0));
        CK(cudaGraphLaunch(T.p, T.home));
        CK(cudaEventRecord(T.bout, T.home));
        CK(cudaStreamWaitEvent(s, T.bout, 0));
    } else if (m == LOCKED_LAUNCH) {
        std::lock_guard<std::mutex> g(launch_mu);
        CK(cudaGraphLaunch(T.p, s));
    } else {
        CK(cudaGraphLaunch(T.p, s));
    }
}

static std::atomic<int> bad{0};
static std::mutex print_mu;

static void glaunch(Mode m, cudaGraphExec_t e, cudaStream_t s) {
    if (m == LOCKED_LAUNCH) {
        std::lock_guard<std::mutex> g(launch_mu);
        CK(cudaGraphLaunch(e, s));
    } else {
        CK(cudaGraphLaunch(e, s));
    }
}

static void worker(int t, Mode m, int rounds, Thr *T, cudaStream_t *streams) {
    CK(cudaSetDevice(0));
    cudaStream_t *s = streams + (m == OWN ? 4 * t : 0);
    cudaStream_t prev = nullptr;  // the previous round's relaunch stream
    for (int r = 0; r < rounds; r++) {
        int rot = (r + 2 * t) % 4;
        cudaStream_t prod = s[rot], con = s[(rot + 1) % 4], fr = s[(rot + 2) % 4],
                     other = s[(rot + 3) % 4];
        if (m == SAME_STREAM) fr = prod;
        std::unique_lock<std::mutex> round_lock(launch_mu, std::defer_lock);
        if (m == LOCKED_ROUND) round_lock.lock();
        // 1. keep prod busy so that what follows queues up behind it
        unsigned long long cyc = 8000000;
        void *args[] = {&cyc};
        CK(cudaLaunchKernel((const void *)spin, dim3(1), dim3(1), args, 0, prod));
        // 2. order after the previous round's relaunch
        if (r > 0 && prev != prod) CK(cudaStreamWaitEvent(prod, T->ep2, 0));
        if (m == EXPLICIT_FREE && r > 0) CK(cudaFreeAsync(T->a, prod));
        // 3. first launch
        launchP(*T, m, prod);
        CK(cudaEventRecord(T->ep1, prod));
        // 4. consumer of the first launch (spins, then reads a into o3)
        CK(cudaStreamWaitEvent(con, T->ep1, 0));
        glaunch(m, T->c3a, con);
        CK(cudaEventRecord(T->ec, con));
        // 5. the relaunch waits for the first launch and its consumer
        CK(cudaStreamWaitEvent(fr, T->ep1, 0));
        CK(cudaStreamWaitEvent(fr, T->ec, 0));
        if (m == HOST_WAIT) CK(cudaEventSynchronize(T->ec));
        if (m == EXPLICIT_FREE) CK(cudaFreeAsync(T->a, fr));
        // 6. relaunch
        launchP(*T, m, fr);
        CK(cudaEventRecord(T->ep2, fr));
        prev = fr;
        // 7. consumer of the relaunch (reads a into o4)
        CK(cudaStreamWaitEvent(other, T->ep2, 0));
        glaunch(m, T->c3b, other);
        if (round_lock.owns_lock()) round_lock.unlock();
        // 8. check
        for (int i = 0; i < 4; i++) CK(cudaStreamSynchronize(s[i]));
        if (T->home) CK(cudaStreamSynchronize(T->home));
        unsigned v3 = 0, v4 = 0;
        CK(cudaMemcpy(&v3, T->o3, 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&v4, T->o4, 4, cudaMemcpyDeviceToHost));
        unsigned n = ((unsigned)t << 28) + 2u * (unsigned)r;
        if (v3 != n || v4 != n + 1) {
            int k = bad.fetch_add(1);
            if (k < 3) {
                std::lock_guard<std::mutex> g(print_mu);
                printf("  %s: thread %d round %d: o3 %#x (want %#x), o4 %#x (want %#x)\n",
                       mode_names[m], t, r, v3, n, v4, n + 1);
            }
        }
    }
}

static void run_mode(Mode m, int rounds) {
    cudaStream_t streams[NSTREAMS];
    for (int i = 0; i < NSTREAMS; i++) CK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    Thr T[THREADS];
    for (int t = 0; t < THREADS; t++) build(T[t], t, m);
    CK(cudaDeviceSynchronize());
    bad = 0;
    std::vector<std::thread> th;
    for (int t = 0; t < THREADS; t++) th.emplace_back(worker, t, m, rounds, &T[t], streams);
    for (auto &x : th) x.join();
    printf("%s: %d bad rounds of %d (%d threads, %d rounds each)\n", mode_names[m], bad.load(),
           THREADS * rounds, THREADS, rounds);
    fflush(stdout);

    // The last relaunch left a live: free it, then tear everything down.
    for (int t = 0; t < THREADS; t++) CK(cudaFreeAsync(T[t].a, streams[0]));
    CK(cudaDeviceSynchronize());
    for (int t = 0; t < THREADS; t++) {
        Thr &x = T[t];
        for (cudaGraphExec_t e : {x.p, x.c3a, x.c3b}) CK(cudaGraphExecDestroy(e));
        for (cudaGraph_t g : {x.gp, x.g3a, x.g3b}) CK(cudaGraphDestroy(g));
        for (cudaEvent_t e : {x.ep1, x.ec, x.ep2, x.bin, x.bout})
            if (e) CK(cudaEventDestroy(e));
        if (x.home) CK(cudaStreamDestroy(x.home));
        for (unsigned *q : {x.src, x.o3, x.o4}) CK(cudaFree(q));
    }
    for (int i = 0; i < NSTREAMS; i++) CK(cudaStreamDestroy(streams[i]));
    CK(cudaDeviceSynchronize());
    CK(cudaDeviceGraphMemTrim(0));
}

int main(int argc, char **argv) {
    int rounds = 1500, only = -1;
    for (int i = 1; i < argc; i++) {
        int k = 0;
        for (; k < MODES; k++)
            if (!strcmp(argv[i], mode_names[k])) break;
        if (k < MODES) {
            only = k;
        } else if (atoi(argv[i]) > 0) {
            rounds = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: %s [MODE] [ROUNDS]; modes: shared own same_stream host_wait "
                            "explicit_free home locked_launch locked_round\n", argv[0]);
            return 2;
        }
    }
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0, rt = 0;
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    printf("%s, driver API %d, runtime %d\n", prop.name, drv, rt);
    for (int k = 0; k < MODES; k++)
        if (only < 0 || only == k) run_mode((Mode)k, rounds);
    return 0;
}
