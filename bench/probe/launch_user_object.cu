// Does a user object retained by a graph change what a launch of its executable graph costs on
// the host? A chain of k segments alloc (256 KiB) -> fill -> free, explicit nodes, instantiated
// plain and with one user object moved into the graph (cudaGraphRetainUserObject) before the
// instantiation, as the crate does to keep what its nodes refer to. Prints the host time to
// queue 1000 launches (median of 5 rounds) per launch, and the time until they are done.
// Built and run on the GPU machine:
//
//   nvcc -O2 -o launch_user_object bench/probe/launch_user_object.cu && ./launch_user_object
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

static void CUDART_CB dtor(void *) {}

static double run(int k, int mode, cudaStream_t s) {
    const unsigned long long n = 65536;
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t prev = nullptr;
    for (int i = 0; i < k; i++) {
        cudaMemAllocNodeParams ap;
        memset(&ap, 0, sizeof ap);
        ap.poolProps.allocType = cudaMemAllocationTypePinned;
        ap.poolProps.location.type = cudaMemLocationTypeDevice;
        ap.poolProps.location.id = 0;
        ap.bytesize = n * 4;
        cudaGraphNode_t a, kn, f;
        CK(cudaGraphAddMemAllocNode(&a, g, prev ? &prev : nullptr, prev ? 1 : 0, &ap));
        void *p = ap.dptr;
        unsigned v = i;
        void *args[] = {&p, (void *)&n, &v};
        cudaKernelNodeParams kp = {};
        kp.func = (void *)fill;
        kp.gridDim = dim3(256);
        kp.blockDim = dim3(256);
        kp.kernelParams = args;
        CK(cudaGraphAddKernelNode(&kn, g, &a, 1, &kp));
        CK(cudaGraphAddMemFreeNode(&f, g, &kn, 1, p));
        prev = f;
    }
    if (mode >= 1) {
        cudaUserObject_t obj;
        CK(cudaUserObjectCreate(&obj, nullptr, dtor, 1, cudaUserObjectNoDestructorSync));
        CK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));
    }
    cudaGraphExec_t ex;
    CK(cudaGraphInstantiateWithFlags(&ex, g, 0));
    CK(cudaGraphLaunch(ex, s));
    CK(cudaStreamSynchronize(s));
    std::vector<double> enq;
    double total = 0;
    for (int r = 0; r < 5; r++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 1000; i++) CK(cudaGraphLaunch(ex, s));
        auto t1 = std::chrono::steady_clock::now();
        CK(cudaStreamSynchronize(s));
        auto t2 = std::chrono::steady_clock::now();
        enq.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 1000);
        total = std::chrono::duration<double, std::micro>(t2 - t0).count() / 1000;
    }
    std::sort(enq.begin(), enq.end());
    CK(cudaGraphExecDestroy(ex));
    CK(cudaGraphDestroy(g));
    printf("k=%4d %-12s enqueue %8.2f us/launch, done %8.2f us/launch\n", k,
           mode ? "user object" : "plain", enq[2], total);
    return enq[2];
}

int main() {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int k : {1, 10, 100})
        for (int mode = 0; mode < 2; mode++) run(k, mode, s);
    for (int k : {1, 10, 100})
        for (int mode = 1; mode >= 0; mode--) run(k, mode, s);
    return 0;
}
