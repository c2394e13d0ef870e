// What the driver calls that the safe capture adds cost on a GPU, per captured segment
// (alloc -> kernel -> free), against the bare capture. Built and run on the GPU machine:
//
//   nvcc -O2 -o capture_calls bench/probe/capture_calls.cu -lcuda && ./capture_calls
//
// Variants, interleaved round by round, medians over the rounds:
//   bare      begin, k x (cudaMallocAsync, kernel, cudaFreeAsync), end, destroy
//   info      bare + cuStreamGetCaptureInfo after each captured call (what Capture does)
//   readback  bare + cuGraphGetNodes and cuGraphGetEdges (count, then lists) after the end
//   types     readback + cuGraphNodeGetType on every node and the params of every memory node
//   both      info + readback (what Capture::end does when every node was reported)
//   nodes     bare + cuGraphGetNodes alone (count, then list) after the end
//   edges     bare + cuGraphGetEdges alone (count, then lists) after the end
//   guard     bare + the calls the safe capture on an owned stream makes: before the begin
//             cuCtxGetCurrent and cuStreamIsCapturing, after it cuStreamGetCaptureInfo (the
//             capture's id); cuCtxGetCurrent before each kernel launch; cuStreamGetCaptureInfo
//             (the last dependencies) before the end, and after it one cuGraphGetNodes into a
//             list with room for one node more than captured
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

static void info(cudaStream_t s) {
    CUstreamCaptureStatus st;
    const CUgraphNode *deps = nullptr;
    size_t n = 0;
    CK(cuStreamGetCaptureInfo((CUstream)s, &st, nullptr, nullptr, &deps, nullptr, &n));
}

static void nodes_only(cudaGraph_t g) {
    size_t n = 0;
    CK(cuGraphGetNodes((CUgraph)g, nullptr, &n));
    std::vector<CUgraphNode> nodes(n);
    CK(cuGraphGetNodes((CUgraph)g, nodes.data(), &n));
}

static void edges_only(cudaGraph_t g) {
    size_t e = 0;
    CK(cuGraphGetEdges((CUgraph)g, nullptr, nullptr, nullptr, &e));
    std::vector<CUgraphNode> from(e), to(e);
    if (e) CK(cuGraphGetEdges((CUgraph)g, from.data(), to.data(), nullptr, &e));
}

static void readback(cudaGraph_t g, bool types) {
    size_t n = 0, e = 0;
    CK(cuGraphGetNodes((CUgraph)g, nullptr, &n));
    std::vector<CUgraphNode> nodes(n);
    CK(cuGraphGetNodes((CUgraph)g, nodes.data(), &n));
    CK(cuGraphGetEdges((CUgraph)g, nullptr, nullptr, nullptr, &e));
    std::vector<CUgraphNode> from(e), to(e);
    if (e) CK(cuGraphGetEdges((CUgraph)g, from.data(), to.data(), nullptr, &e));
    if (!types) return;
    for (CUgraphNode node : nodes) {
        CUgraphNodeType t;
        CK(cuGraphNodeGetType(node, &t));
        if (t == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            CK(cuGraphMemAllocNodeGetParams(node, &p));
        } else if (t == CU_GRAPH_NODE_TYPE_MEM_FREE) {
            CUdeviceptr p;
            CK(cuGraphMemFreeNodeGetParams(node, &p));
        }
    }
}

enum Variant { BARE, INFO, READBACK, TYPES, BOTH, NODES, EDGES, GUARD, VARIANTS };
static const char *names[] = {"bare", "info", "readback", "types", "both", "nodes", "edges", "guard"};

static void current() {
    CUcontext c;
    CK(cuCtxGetCurrent(&c));
}

static double cycle(cudaStream_t s, int k, Variant v) {
    const unsigned long long n = 65536;
    double t0 = now_ns();
    bool guard = v == GUARD;
    if (guard) {
        current();
        CUstreamCaptureStatus st;
        CK(cuStreamIsCapturing((CUstream)s, &st));
    }
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (guard) {
        CUstreamCaptureStatus st;
        cuuint64_t id;
        CK(cuStreamGetCaptureInfo((CUstream)s, &st, &id, nullptr, nullptr, nullptr, nullptr));
    }
    bool q = v == INFO || v == BOTH;
    for (int i = 0; i < k; i++) {
        unsigned *p;
        CK(cudaMallocAsync((void **)&p, n * 4, s));
        if (q) info(s);
        if (guard) current();
        fill<<<256, 256, 0, s>>>(p, n, i);
        if (q) info(s);
        CK(cudaFreeAsync(p, s));
        if (q) info(s);
    }
    if (guard) info(s);
    cudaGraph_t g;
    CK(cudaStreamEndCapture(s, &g));
    if (guard) {
        std::vector<CUgraphNode> nodes(3 * k + 1);
        size_t room = nodes.size();
        CK(cuGraphGetNodes((CUgraph)g, nodes.data(), &room));
    }
    if (v == READBACK || v == BOTH) readback(g, false);
    if (v == TYPES) readback(g, true);
    if (v == NODES) nodes_only(g);
    if (v == EDGES) edges_only(g);
    double t = now_ns() - t0;
    CK(cudaGraphDestroy(g));
    return t;
}

int main() {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s\n", prop.name);
    for (int k : {1, 10, 100, 1000}) {
        int rounds = std::max(5, std::min(200, 20000 / k));
        for (int v = 0; v < VARIANTS; v++) cycle(s, k, (Variant)v);  // warm-up
        std::vector<double> t[VARIANTS];
        for (int r = 0; r < rounds; r++)
            for (int j = 0; j < VARIANTS; j++) {
                int v = (j + r) % VARIANTS;
                t[v].push_back(cycle(s, k, (Variant)v));
            }
        double med[VARIANTS];
        for (int v = 0; v < VARIANTS; v++) {
            std::sort(t[v].begin(), t[v].end());
            med[v] = t[v][t[v].size() / 2];
        }
        printf("k=%4d rounds=%3d", k, rounds);
        for (int v = 0; v < VARIANTS; v++)
            printf("  %s %.0f ns/seg (+%.0f)", names[v], med[v] / k, (med[v] - med[BARE]) / k);
        printf("\n");
    }
    // One cuStreamGetCaptureInfo, repeated, in a capture of 1000 segments.
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 1000; i++) {
        unsigned *p;
        CK(cudaMallocAsync((void **)&p, 1024, s));
        CK(cudaFreeAsync(p, s));
    }
    double t0 = now_ns();
    for (int i = 0; i < 100000; i++) info(s);
    printf("cuStreamGetCaptureInfo alone: %.1f ns a call\n", (now_ns() - t0) / 100000);
    cudaGraph_t g;
    CK(cudaStreamEndCapture(s, &g));
    size_t n = 0;
    CK(cuGraphGetNodes((CUgraph)g, nullptr, &n));
    std::vector<CUgraphNode> nodes(n);
    CK(cuGraphGetNodes((CUgraph)g, nodes.data(), &n));
    t0 = now_ns();
    for (int r = 0; r < 100; r++)
        for (CUgraphNode node : nodes) {
            CUgraphNodeType ty;
            CK(cuGraphNodeGetType(node, &ty));
        }
    printf("cuGraphNodeGetType alone: %.1f ns a call\n", (now_ns() - t0) / (100.0 * n));
    CK(cudaGraphDestroy(g));
    return 0;
}
