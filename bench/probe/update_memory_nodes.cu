// What does cudaGraphExecUpdate do with graphs that have memory nodes? Graph A: alloc -> fill
// -> copy out -> free; graph B: the same topology and sizes, its own alloc node (so its own
// fixed address). A is instantiated and launched; then the executable graph is updated from B,
// and from a copy of A's topology whose fill writes another value but which has no memory nodes
// of its own (a plain kernel chain, so the node types differ). Prints the driver's answer to
// each, and, where an update is accepted, which address the next launch's fill writes (A's or
// B's) as seen through the copied-out values. The crate refuses updates with memory nodes on
// either side (ExecGraph::update); this shows what the driver alone does. Built and run on the
// GPU machine:
//
//   nvcc -O2 -o update_memory_nodes bench/probe/update_memory_nodes.cu && ./update_memory_nodes
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

__global__ void copy(unsigned *dst, const unsigned *src, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

static const unsigned long long N = 65536;

static cudaGraphNode_t kernel(cudaGraph_t g, cudaGraphNode_t dep, const void *f, void **args) {
    cudaKernelNodeParams p = {};
    p.func = (void *)f;
    p.gridDim = dim3((unsigned)(N / 256));
    p.blockDim = dim3(256);
    p.kernelParams = args;
    cudaGraphNode_t n;
    CK(cudaGraphAddKernelNode(&n, g, dep ? &dep : nullptr, dep ? 1 : 0, &p));
    return n;
}

// alloc -> fill(v) -> copy to out -> free; returns the allocation's address.
static void *build(cudaGraph_t *g, unsigned *out, unsigned v) {
    CK(cudaGraphCreate(g, 0));
    cudaMemAllocNodeParams ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = N * 4;
    cudaGraphNode_t alloc;
    CK(cudaGraphAddMemAllocNode(&alloc, *g, nullptr, 0, &ap));
    void *a = ap.dptr;
    unsigned long long n = N;
    void *fargs[] = {&a, &n, &v};
    cudaGraphNode_t f = kernel(*g, alloc, (const void *)fill, fargs);
    void *cargs[] = {&out, &a, &n};
    cudaGraphNode_t c = kernel(*g, f, (const void *)copy, cargs);
    cudaGraphNode_t fr;
    CK(cudaGraphAddMemFreeNode(&fr, *g, &c, 1, a));
    return a;
}

static const char *result_name(cudaGraphExecUpdateResult r) {
    switch (r) {
    case cudaGraphExecUpdateSuccess: return "Success";
    case cudaGraphExecUpdateError: return "Error";
    case cudaGraphExecUpdateErrorTopologyChanged: return "ErrorTopologyChanged";
    case cudaGraphExecUpdateErrorNodeTypeChanged: return "ErrorNodeTypeChanged";
    case cudaGraphExecUpdateErrorFunctionChanged: return "ErrorFunctionChanged";
    case cudaGraphExecUpdateErrorParametersChanged: return "ErrorParametersChanged";
    case cudaGraphExecUpdateErrorNotSupported: return "ErrorNotSupported";
    case cudaGraphExecUpdateErrorUnsupportedFunctionChange: return "ErrorUnsupportedFunctionChange";
    case cudaGraphExecUpdateErrorAttributesChanged: return "ErrorAttributesChanged";
    default: return "?";
    }
}

int main() {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned *out;
    CK(cudaMalloc((void **)&out, N * 4));
    cudaGraph_t ga, gb;
    void *a = build(&ga, out, 1);
    void *b = build(&gb, out, 2);
    printf("graph A allocates %p, graph B %p\n", a, b);
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, ga, 0));
    CK(cudaGraphLaunch(e, s));
    CK(cudaStreamSynchronize(s));
    cudaGraphExecUpdateResultInfo info;
    memset(&info, 0, sizeof info);
    cudaError_t err = cudaGraphExecUpdate(e, gb, &info);
    printf("update of A's executable graph from B (memory nodes on both sides): %s, result %s, error node %s\n",
           cudaGetErrorName(err), result_name(info.result), info.errorNode ? "set" : "none");
    (void)cudaGetLastError();
    if (err == cudaSuccess) {
        unsigned v = 0;
        CK(cudaGraphLaunch(e, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(&v, out, 4, cudaMemcpyDeviceToHost));
        printf("  the next launch copied out %u (2: B's fill ran)\n", v);
    }
    // The same through the per-node setter: A's fill node pointed at B's address.
    size_t count = 0;
    CK(cudaGraphGetNodes(ga, nullptr, &count));
    cudaGraphNode_t nodes[8];
    CK(cudaGraphGetNodes(ga, nodes, &count));
    unsigned long long n = N;
    unsigned v = 3;
    void *fargs[] = {&b, &n, &v};
    cudaKernelNodeParams p = {};
    p.func = (void *)fill;
    p.gridDim = dim3((unsigned)(N / 256));
    p.blockDim = dim3(256);
    p.kernelParams = fargs;
    for (size_t i = 0; i < count; i++) {
        cudaGraphNodeType t;
        CK(cudaGraphNodeGetType(nodes[i], &t));
        if (t == cudaGraphNodeTypeKernel) {
            err = cudaGraphExecKernelNodeSetParams(e, nodes[i], &p);
            printf("kernel node set to write B's address in A's executable graph: %s\n", cudaGetErrorName(err));
            (void)cudaGetLastError();
            break;
        }
    }
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(ga));
    CK(cudaGraphDestroy(gb));
    CK(cudaFree(out));
    CK(cudaStreamDestroy(s));
    return 0;
}
