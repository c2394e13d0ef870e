// What does the event the safe layer records after each launch cost a steady stream of launches,
// and would an event record node inside the graph cost less? A chain of k segments alloc
// (256 KiB) -> fill -> free, explicit nodes, launched 1000 times before one synchronize, in four
// ways, interleaved round by round:
//   plain      cudaGraphLaunch only (what C does)
//   record     cudaGraphLaunch, then cudaEventRecord of one event (timing disabled)
//   ring       cudaGraphLaunch, then cudaEventRecord of the next of 4 events in turn
//   node       the graph ends in an event record node (after the last free), cudaGraphLaunch only
//   write      cudaGraphLaunch, then cuStreamWriteValue64 of the launch's number into pinned host
//              memory (a completion marker the host can read without an event)
//   every8     cudaGraphLaunch, and cudaEventRecord after every 8th launch only
// Prints, per way, the host time to queue a launch and the time until all are done, per launch
// (medians of 9 rounds), and each way's done time over plain's, paired round by round.
// Built and run on the GPU machine:
//
//   nvcc -O2 -o launch_event bench/probe/launch_event.cu -lcuda && ./launch_event
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorName(e_), __LINE__); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__global__ void fill(unsigned *p, unsigned long long n, unsigned v) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

enum Way { PLAIN, RECORD, RING, NODE, WRITE, EVERY8, WAYS };
static const char *NAMES[WAYS] = {"plain", "record", "ring", "node", "write", "every8"};

// The pinned word `write` stores each launch's number into, and its device address.
static volatile unsigned long long *marker;
static CUdeviceptr marker_dev;

struct Setup {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    cudaEvent_t ev[4];
};

static Setup make(int k, Way way) {
    const unsigned long long n = 65536;
    Setup s;
    for (auto &e : s.ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaGraphCreate(&s.g, 0));
    cudaGraphNode_t prev = nullptr;
    for (int i = 0; i < k; i++) {
        cudaMemAllocNodeParams ap;
        memset(&ap, 0, sizeof ap);
        ap.poolProps.allocType = cudaMemAllocationTypePinned;
        ap.poolProps.location.type = cudaMemLocationTypeDevice;
        ap.poolProps.location.id = 0;
        ap.bytesize = n * 4;
        cudaGraphNode_t a, kn, f;
        CK(cudaGraphAddMemAllocNode(&a, s.g, prev ? &prev : nullptr, prev ? 1 : 0, &ap));
        void *p = ap.dptr;
        unsigned v = i;
        void *args[] = {&p, (void *)&n, &v};
        cudaKernelNodeParams kp = {};
        kp.func = (void *)fill;
        kp.gridDim = dim3(256);
        kp.blockDim = dim3(256);
        kp.kernelParams = args;
        CK(cudaGraphAddKernelNode(&kn, s.g, &a, 1, &kp));
        CK(cudaGraphAddMemFreeNode(&f, s.g, &kn, 1, p));
        prev = f;
    }
    if (way == NODE) {
        cudaGraphNode_t r;
        CK(cudaGraphAddEventRecordNode(&r, s.g, &prev, 1, s.ev[0]));
    }
    CK(cudaGraphInstantiateWithFlags(&s.ex, s.g, 0));
    return s;
}

static void destroy(Setup &s) {
    CK(cudaGraphExecDestroy(s.ex));
    CK(cudaGraphDestroy(s.g));
    for (auto &e : s.ev) CK(cudaEventDestroy(e));
}

// One round of 1000 launches; returns {enqueue, done} in microseconds per launch.
static std::pair<double, double> round_of(Setup &s, Way way, cudaStream_t st) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; i++) {
        CK(cudaGraphLaunch(s.ex, st));
        if (way == RECORD) CK(cudaEventRecord(s.ev[0], st));
        if (way == RING) CK(cudaEventRecord(s.ev[i & 3], st));
        if (way == WRITE &&
            cuStreamWriteValue64((CUstream)st, marker_dev, i + 1, CU_STREAM_WRITE_VALUE_DEFAULT) !=
                CUDA_SUCCESS) {
            fprintf(stderr, "cuStreamWriteValue64 failed\n");
            exit(1);
        }
        if (way == EVERY8 && (i & 7) == 7) CK(cudaEventRecord(s.ev[0], st));
    }
    auto t1 = std::chrono::steady_clock::now();
    CK(cudaStreamSynchronize(st));
    auto t2 = std::chrono::steady_clock::now();
    return {std::chrono::duration<double, std::micro>(t1 - t0).count() / 1000,
            std::chrono::duration<double, std::micro>(t2 - t0).count() / 1000};
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main() {
    CK(cudaSetDevice(0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *host = nullptr;
    CK(cudaHostAlloc(&host, sizeof(unsigned long long), cudaHostAllocMapped));
    marker = (volatile unsigned long long *)host;
    if (cuMemHostGetDevicePointer(&marker_dev, host, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "cuMemHostGetDevicePointer failed\n");
        return 1;
    }
    for (int k : {1, 10}) {
        Setup s[WAYS];
        for (int w = 0; w < WAYS; w++) {
            s[w] = make(k, (Way)w);
            round_of(s[w], (Way)w, st);  // warm-up
        }
        std::vector<double> enq[WAYS], done[WAYS], ratio[WAYS];
        for (int r = 0; r < 9; r++) {
            double plain = 0;
            for (int w0 = 0; w0 < WAYS; w0++) {
                int w = (w0 + r) % WAYS;  // rotate the order each round
                auto t = round_of(s[w], (Way)w, st);
                enq[w].push_back(t.first);
                done[w].push_back(t.second);
            }
            plain = done[PLAIN].back();
            for (int w = 0; w < WAYS; w++) ratio[w].push_back(done[w].back() / plain);
        }
        for (int w = 0; w < WAYS; w++) {
            printf("k=%2d %-7s enqueue %6.2f us/launch, done %6.2f us/launch, done/plain %.3f\n", k,
                   NAMES[w], median(enq[w]), median(done[w]), median(ratio[w]));
            destroy(s[w]);
        }
    }
    printf("marker after the last round: %llu (1000 expected)\n", *marker);
    return 0;
}
