// What the driver does with conditional nodes, in plain CUDA, and what compute-sanitizer's
// memcheck makes of them. Built and run on the GPU machine (the WHILE body's kernel sets the
// condition with cudaGraphSetConditional, which the device runtime provides):
//
//   nvcc -O2 -rdc=true -o conditional_nodes bench/probe/conditional_nodes.cu -lcuda -lcudadevrt
//   ./conditional_nodes && compute-sanitizer --tool memcheck ./conditional_nodes
//   ./conditional_nodes cuda-graph/kernels/condition_kernels.fatbin   # it loads, with its kernels
//
// Cases, each launched once and its output checked:
//   if        an IF node, condition defaulting to 1 at every launch, whose body fills a buffer
//   while     a WHILE node, condition defaulting to 1, whose body adds 1 to a counter and
//             clears the condition from the device once the counter reaches 10
//   if-ptx    (with PROBE_PTX=path) the IF case with fill_u32 of that PTX file, JIT-compiled by
//             cuModuleLoadData and added with cuGraphAddKernelNode, as the crate does; with
//             PROBE_ROUNDS=R, R times, each round as the crate's test `conditional_kinds_run_the_
//             body_the_condition_selects` does it: a new stream, a new zeroed 1 MiB buffer, a new
//             graph instantiated, launched, synchronized, read back and destroyed
// Prints one line per case: ok, or what it found.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                  \
    do {                                                                                       \
        int e_ = (int)(x);                                                                     \
        if (e_) { fprintf(stderr, "%s failed: %d (line %d)\n", #x, e_, __LINE__); exit(1); }   \
    } while (0)

__global__ void fill(unsigned *p, unsigned long long n, unsigned v) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

__global__ void count_to(cudaGraphConditionalHandle h, unsigned *counter, unsigned limit) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned c = ++*counter;
        if (c >= limit) cudaGraphSetConditional(h, 0);
    }
}

// Adds a conditional node of `type` to `g`; returns its body.
static cudaGraph_t conditional(cudaGraph_t g, cudaGraphConditionalHandle h, cudaGraphConditionalNodeType type) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = 1;
    cudaGraphNode_t node;
#if CUDART_VERSION >= 13000
    CK(cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &p));
#else
    CK(cudaGraphAddNode(&node, g, nullptr, 0, &p));
#endif
    return p.conditional.phGraph_out[0];
}

int main(int argc, char **argv) {
    if (argc > 1) {
        // A fatbin of ci/gen-condition-fatbin.sh: it loads, and has its kernels.
        FILE *f = fopen(argv[1], "rb");
        if (!f) { perror(argv[1]); return 1; }
        static char image[1 << 22];
        size_t len = fread(image, 1, sizeof image, f);
        fclose(f);
        CK(cudaFree(0));
        CUmodule m;
        CUfunction fn;
        CK(cuModuleLoadData(&m, image));
        CK(cuModuleGetFunction(&fn, m, "count_to_then_clear"));
        CK(cuModuleGetFunction(&fn, m, "set_condition_from"));
        printf("conditional probe: %s (%zu bytes) loads with cuModuleLoadData and has its kernels\n", argv[1], len);
        return 0;
    }
    const unsigned long long n = 1 << 16;
    unsigned *buf, *counter;
    CK(cudaMalloc(&buf, n * 4));
    CK(cudaMalloc(&counter, 4));
    CK(cudaMemset(buf, 0, n * 4));
    CK(cudaMemset(counter, 0, 4));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));

    {
        cudaGraph_t g;
        CK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        cudaGraph_t body = conditional(g, h, cudaGraphCondTypeIf);
        cudaKernelNodeParams k = {};
        unsigned v = 7;
        void *args[] = {&buf, (void *)&n, &v};
        k.func = (void *)fill;
        k.gridDim = dim3((unsigned)(n / 256));
        k.blockDim = dim3(256);
        k.kernelParams = args;
        cudaGraphNode_t kn;
        CK(cudaGraphAddKernelNode(&kn, body, nullptr, 0, &k));
        cudaGraphExec_t x;
        CK(cudaGraphInstantiate(&x, g, 0));
        CK(cudaGraphLaunch(x, s));
        cudaError_t e = cudaStreamSynchronize(s);
        unsigned first = 0;
        if (e == cudaSuccess) CK(cudaMemcpy(&first, buf + n - 1, 4, cudaMemcpyDeviceToHost));
        printf("conditional probe: if: %s (last word %u, want 7)\n",
               e != cudaSuccess ? cudaGetErrorName(e) : first == 7 ? "ok" : "WRONG", first);
        if (e != cudaSuccess) return 1;
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
    }
    if (const char *path = getenv("PROBE_PTX")) {
        FILE *f = fopen(path, "rb");
        if (!f) { perror(path); return 1; }
        static char ptx[1 << 22];
        ptx[fread(ptx, 1, sizeof ptx - 1, f)] = 0;
        fclose(f);
        CUmodule m;
        CUfunction fn;
        CK(cuModuleLoadData(&m, ptx));
        CK(cuModuleGetFunction(&fn, m, "fill_u32"));
        const char *r_env = getenv("PROBE_ROUNDS");
        int rounds = r_env ? atoi(r_env) : 1;
        const unsigned long long words = 1 << 18;  // 1 MiB, as the crate's tests
        static unsigned host[1 << 18];
        for (int r = 0; r < rounds; r++) {
            cudaStream_t rs;
            CK(cudaStreamCreate(&rs));
            unsigned *out;
            CK(cudaMalloc(&out, words * 4));
            CK(cudaMemset(out, 0, words * 4));
            cudaGraph_t g;
            CK(cudaGraphCreate(&g, 0));
            cudaGraphConditionalHandle h;
            CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
            cudaGraph_t body = conditional(g, h, cudaGraphCondTypeIf);
            unsigned v = 100 + r;
            CUdeviceptr d = (CUdeviceptr)out;
            void *args[] = {&d, (void *)&words, &v};
            CUDA_KERNEL_NODE_PARAMS k = {};
            k.func = fn;
            k.gridDimX = (unsigned)(words / 256), k.gridDimY = 1, k.gridDimZ = 1;
            k.blockDimX = 256, k.blockDimY = 1, k.blockDimZ = 1;
            k.kernelParams = args;
            CUgraphNode kn;
            CK(cuGraphAddKernelNode(&kn, body, nullptr, 0, &k));
            cudaGraphExec_t x;
            CK(cudaGraphInstantiate(&x, g, 0));
            CK(cudaGraphLaunch(x, rs));
            cudaError_t e = cudaStreamSynchronize(rs);
            if (e != cudaSuccess) {
                printf("conditional probe: if-ptx: %s in round %d of %d\n", cudaGetErrorName(e), r + 1, rounds);
                return 1;
            }
            CK(cudaMemcpy(host, out, words * 4, cudaMemcpyDeviceToHost));
            for (unsigned long long i = 0; i < words; i++) {
                if (host[i] != v) {
                    printf("conditional probe: if-ptx: WRONG in round %d of %d (word %llu is %u, want %u)\n",
                           r + 1, rounds, i, host[i], v);
                    return 1;
                }
            }
            CK(cudaGraphExecDestroy(x));
            CK(cudaGraphDestroy(g));
            CK(cudaFree(out));
            CK(cudaStreamDestroy(rs));
        }
        printf("conditional probe: if-ptx: ok in %d of %d rounds\n", rounds, rounds);
    }
    {
        cudaGraph_t g;
        CK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        cudaGraph_t body = conditional(g, h, cudaGraphCondTypeWhile);
        cudaKernelNodeParams k = {};
        unsigned limit = 10;
        void *args[] = {&h, &counter, &limit};
        k.func = (void *)count_to;
        k.gridDim = dim3(1);
        k.blockDim = dim3(32);
        k.kernelParams = args;
        cudaGraphNode_t kn;
        CK(cudaGraphAddKernelNode(&kn, body, nullptr, 0, &k));
        cudaGraphExec_t x;
        CK(cudaGraphInstantiate(&x, g, 0));
        CK(cudaGraphLaunch(x, s));
        cudaError_t e = cudaStreamSynchronize(s);
        unsigned c = 0;
        if (e == cudaSuccess) CK(cudaMemcpy(&c, counter, 4, cudaMemcpyDeviceToHost));
        printf("conditional probe: while: %s (counter %u, want 10)\n",
               e != cudaSuccess ? cudaGetErrorName(e) : c == 10 ? "ok" : "WRONG", c);
        if (e != cudaSuccess) return 1;
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
    }
    return 0;
}
