// Which graph-building driver calls need a current context: each call is made in a process of
// its own (this program run again with the case as arguments, so that a crash is reported, not
// fatal; CUresult 0 is success, 201 CUDA_ERROR_INVALID_CONTEXT) after `cuCtxSetCurrent(NULL)`, and again with another context of the same device
// current (one made with cuCtxCreate), on a graph made while the primary context was current.
// Then the rust test's sequence (safe_explicit's graph_built_where_no_context_is_current): the
// process's first alloc node added while no context is current, the other calls under the
// primary context, each step printed as it returns. Built and run on the GPU machine:
//
//   nvcc -O2 -o no_context bench/probe/no_context.cu -lcuda && ./no_context
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

#define CK(x)                                                                      \
    do {                                                                           \
        int e_ = (int)(x);                                                         \
        if (e_) { fprintf(stderr, "%s failed: %d (line %d)\n", #x, e_, __LINE__); _exit(90); } \
    } while (0)

__global__ void fill(unsigned *p, unsigned long long n, unsigned v) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

static CUcontext primary, other;
static CUfunction function;
static CUdevice device;

enum Current { NONE, OTHER };

// 1 MiB of device 0's memory.
static CUDA_MEM_ALLOC_NODE_PARAMS alloc_params() {
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.poolProps.location.id = 0;
    ap.bytesize = 1 << 20;
    return ap;
}

// `fill` over 2^18 words, with `args` (address, count, value).
static CUDA_KERNEL_NODE_PARAMS kernel_params(void **args) {
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    kp.func = function;
    kp.gridDimX = 1024; kp.gridDimY = 1; kp.gridDimZ = 1;
    kp.blockDimX = 256; kp.blockDimY = 1; kp.blockDimZ = 1;
    kp.kernelParams = args;
    return kp;
}

// Makes the graph under the primary context, switches to `current`, then makes the call named
// `what`; exits with the call's CUresult.
static int child(const char *what, Current current) {
    CK(cuCtxSetCurrent(primary));
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS ap = alloc_params();
    CUgraphNode alloc;
    CK(cuGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap));
    CK(cuCtxSetCurrent(current == NONE ? nullptr : other));
    CUgraphNode node;
    CUresult r = CUDA_SUCCESS;
    if (!strcmp(what, "cuGraphCreate")) {
        CUgraph h;
        r = cuGraphCreate(&h, 0);
    } else if (!strcmp(what, "cuGraphAddMemAllocNode")) {
        r = cuGraphAddMemAllocNode(&node, g, nullptr, 0, &ap);
    } else if (!strcmp(what, "cuGraphAddKernelNode")) {
        unsigned long long n = 1 << 18;
        unsigned v = 1;
        void *args[] = {&ap.dptr, &n, &v};
        CUDA_KERNEL_NODE_PARAMS kp = kernel_params(args);
        r = cuGraphAddKernelNode(&node, g, &alloc, 1, &kp);
    } else if (!strcmp(what, "cuGraphAddMemFreeNode")) {
        r = cuGraphAddMemFreeNode(&node, g, &alloc, 1, ap.dptr);
    } else if (!strcmp(what, "cuGraphAddEmptyNode")) {
        r = cuGraphAddEmptyNode(&node, g, &alloc, 1);
    } else if (!strcmp(what, "cuGraphAddDependencies")) {
        CUgraphNode empty;
        CK(cuGraphAddEmptyNode(&empty, g, nullptr, 0));
        r = cuGraphAddDependencies(g, &alloc, &empty, nullptr, 1);
    } else if (!strcmp(what, "cuGraphInstantiateWithFlags")) {
        CUgraphExec e;
        r = cuGraphInstantiateWithFlags(&e, g, 0);
    }
    return (int)r;
}

// The process's first alloc node made while no context is current; then, under the primary
// context, a kernel node using it, a memcpy node from it, its free node, an instantiation, a
// launch. Prints each step as it returns.
static int sequence() {
    CK(cuCtxSetCurrent(nullptr));
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS ap = alloc_params();
    CUgraphNode alloc, kernel, copy, free_node;
    int r = cuGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap);
    printf("alloc node, no context current: CUresult %d, address %#llx\n", r,
           (unsigned long long)ap.dptr);
    fflush(stdout);
    CK(cuCtxSetCurrent(primary));
    unsigned long long n = 1 << 18;
    unsigned v = 7;
    void *args[] = {&ap.dptr, &n, &v};
    CUDA_KERNEL_NODE_PARAMS kp = kernel_params(args);
    r = cuGraphAddKernelNode(&kernel, g, &alloc, 1, &kp);
    printf("kernel node: CUresult %d\n", r);
    fflush(stdout);
    CUdeviceptr out;
    CK(cuMemAlloc(&out, 1 << 20));
    CUDA_MEMCPY3D cp;
    memset(&cp, 0, sizeof cp);
    cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.srcDevice = ap.dptr;
    cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.dstDevice = out;
    cp.WidthInBytes = 1 << 20;
    cp.Height = 1;
    cp.Depth = 1;
    r = cuGraphAddMemcpyNode(&copy, g, &kernel, 1, &cp, primary);
    printf("memcpy node: CUresult %d\n", r);
    fflush(stdout);
    r = cuGraphAddMemFreeNode(&free_node, g, &copy, 1, ap.dptr);
    printf("free node: CUresult %d\n", r);
    fflush(stdout);
    CUgraphExec e;
    r = cuGraphInstantiateWithFlags(&e, g, 0);
    printf("instantiate: CUresult %d\n", r);
    fflush(stdout);
    if (r) return r;
    r = cuGraphLaunch(e, nullptr);
    int s = cuCtxSynchronize();
    unsigned first = 0;
    cuMemcpyDtoH(&first, out, 4);
    printf("launch: CUresult %d, synchronize %d, first word %u (7 expected)\n", r, s, first);
    return 0;
}

static const char *calls[] = {"cuGraphCreate", "cuGraphAddMemAllocNode", "cuGraphAddKernelNode",
                               "cuGraphAddMemFreeNode", "cuGraphAddEmptyNode",
                               "cuGraphAddDependencies", "cuGraphInstantiateWithFlags"};

int main(int argc, char **argv) {
    if (argc == 3) {
        CK(cuInit(0));
        CK(cuDeviceGet(&device, 0));
        CK(cuDevicePrimaryCtxRetain(&primary, device));
        CK(cuCtxSetCurrent(primary));
        CK(cudaGetFuncBySymbol(&function, (const void *)fill));
#if CUDA_VERSION >= 13000
        CK(cuCtxCreate(&other, nullptr, 0, device));
#else
        CK(cuCtxCreate(&other, 0, device));
#endif
        if (!strcmp(argv[1], "sequence")) return sequence();
        int r = child(argv[1], atoi(argv[2]) ? OTHER : NONE);
        printf("CUresult %d\n", r);
        return 0;
    }
    for (int current = 0; current < 2; current++) {
        for (const char *what : calls) {
            printf("%-28s with %-24s: ", what,
                   current == 0 ? "no context current" : "another context current");
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                char c[2] = {(char)('0' + current), 0};
                execl(argv[0], argv[0], what, c, (char *)nullptr);
                _exit(91);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            if (WIFSIGNALED(status)) printf("killed by signal %d\n", WTERMSIG(status));
            else if (WEXITSTATUS(status) != 0) printf("setup failed (%d)\n", WEXITSTATUS(status));
        }
    }
    printf("the sequence:\n");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[0], argv[0], "sequence", "0", (char *)nullptr);
        _exit(91);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) printf("killed by signal %d\n", WTERMSIG(status));
    return 0;
}
