// What the safe builder's context checks cost on a GPU: an explicit chain of k segments
// (alloc node -> kernel node -> free node, each after the previous free) built with driver
// calls and instantiated, with no, one or two cuCtxGetCurrent per segment (the safe builder
// makes one before the alloc node and one before the kernel node, `Device::bind`, where the
// context is already current). Built and run on the GPU machine:
//
//   nvcc -O2 -o node_binds bench/probe/node_binds.cu -lcuda && ./node_binds
//
// Variants, interleaved round by round (the order rotates), medians over the rounds, build +
// instantiate per segment:
//   bare   cuGraphCreate, k x (cuGraphAddMemAllocNode, cuGraphAddKernelNode,
//          cuGraphAddMemFreeNode), cuGraphInstantiateWithFlags
//   one    bare + cuCtxGetCurrent before each kernel node
//   two    bare + cuCtxGetCurrent before each alloc node and each kernel node
// Then cuCtxGetCurrent alone, a million calls.
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#define CK(x)                                                                      \
    do {                                                                           \
        int e_ = (int)(x);                                                         \
        if (e_) { fprintf(stderr, "%s failed: %d (line %d)\n", #x, e_, __LINE__); exit(1); } \
    } while (0)

__global__ void fill(unsigned *p, unsigned long long n, unsigned v) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

static double now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void current() {
    CUcontext c;
    CK(cuCtxGetCurrent(&c));
}

enum Variant { BARE, ONE, TWO, VARIANTS };
static const char *names[] = {"bare", "one", "two"};

static double cycle(CUfunction f, int k, Variant v) {
    unsigned long long n = 65536;
    unsigned value = 0;
    CUdeviceptr ptr = 0;
    void *args[] = {&ptr, &n, &value};
    double t0 = now_ns();
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUgraphNode last = nullptr;
    for (int i = 0; i < k; i++) {
        CUDA_MEM_ALLOC_NODE_PARAMS ap = {};
        ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        ap.poolProps.location.id = 0;
        ap.bytesize = n * 4;
        CUgraphNode alloc, kernel, free_node;
        if (v == TWO) current();
        CK(cuGraphAddMemAllocNode(&alloc, g, last ? &last : nullptr, last ? 1 : 0, &ap));
        ptr = ap.dptr;
        value = i;
        CUDA_KERNEL_NODE_PARAMS kp = {};
        kp.func = f;
        kp.gridDimX = 256;
        kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = 256;
        kp.blockDimY = kp.blockDimZ = 1;
        kp.kernelParams = args;
        if (v != BARE) current();
        CK(cuGraphAddKernelNode(&kernel, g, &alloc, 1, &kp));
        CK(cuGraphAddMemFreeNode(&free_node, g, &kernel, 1, ap.dptr));
        last = free_node;
    }
    CUgraphExec e;
    CK(cuGraphInstantiateWithFlags(&e, g, 0));
    double t = now_ns() - t0;
    CK(cuGraphExecDestroy(e));
    CK(cuGraphDestroy(g));
    return t;
}

int main() {
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    cudaFunction_t rf;
    CK(cudaGetFuncBySymbol(&rf, (const void *)fill));
    CUfunction f = (CUfunction)rf;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s\n", prop.name);
    for (int k : {1, 10, 100, 1000}) {
        int rounds = std::max(5, std::min(300, 30000 / k));
        for (int v = 0; v < VARIANTS; v++) cycle(f, k, (Variant)v);  // warm-up
        std::vector<double> t[VARIANTS];
        for (int r = 0; r < rounds; r++)
            for (int j = 0; j < VARIANTS; j++) {
                int v = (r % 2 ? j + r : VARIANTS - 1 - j + r) % VARIANTS;
                t[v].push_back(cycle(f, k, (Variant)v));
            }
        double med[VARIANTS];
        for (int v = 0; v < VARIANTS; v++) {
            std::sort(t[v].begin(), t[v].end());
            med[v] = t[v][t[v].size() / 2];
        }
        printf("k=%4d rounds=%3d", k, rounds);
        for (int v = 0; v < VARIANTS; v++)
            printf("  %s %.0f ns/seg (%+.1f, x%.4f)", names[v], med[v] / k, (med[v] - med[BARE]) / k,
                   med[v] / med[BARE]);
        printf("\n");
    }
    double t0 = now_ns();
    for (int i = 0; i < 1000000; i++) current();
    printf("cuCtxGetCurrent alone: %.1f ns a call\n", (now_ns() - t0) / 1e6);
    return 0;
}
