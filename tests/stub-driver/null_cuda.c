/*
 * A stand-in for libcuda.so.1 that does no work: the functions below return CUDA_SUCCESS and
 * hand out made-up handles and addresses. Loaded through CUDA_GRAPH_LIBCUDA, it lets what the
 * safe layer does on the host run on a machine without a GPU:
 *   - tests/tests/record_stub.rs: the builder's record and the lifetime checks on real Graphs,
 *     in CI (tests/build.rs builds this file);
 *   - bench/host-overhead/run.sh: the safe layer's host cost against raw cuda-graph-sys calls.
 * Nothing here runs a kernel or touches memory: device results are the GPU suite's to test.
 * A function it lacks makes the loader return CUDA_ERROR_NOT_FOUND, naming it.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;

static uintptr_t next_handle = 0x1000;
static unsigned long long next_address = 0x700000000000ull;

static void *handle(void) { return (void *)(next_handle += 16); }

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)0x42; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }

static void *current;
CUresult cuCtxGetCurrent(void **c) { *c = current; return 0; }
CUresult cuCtxSetCurrent(void *c) { current = c; return 0; }

CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)140 << 30; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) { (void)attribute; (void)d; *v = 1; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    strncpy(name, "null driver", (size_t)len);
    return 0;
}

CUresult cuGraphCreate(void **g, unsigned flags) { (void)flags; *g = handle(); return 0; }
CUresult cuGraphDestroy(void *g) { (void)g; return 0; }

/* CUDA_MEM_ALLOC_NODE_PARAMS: CUmemPoolProps (88 bytes), accessDescs, accessDescCount,
 * bytesize, then dptr. */
CUresult cuGraphAddMemAllocNode(void **n, void *g, void *deps, size_t count, void *params)
{
    (void)g; (void)deps; (void)count;
    unsigned long long *dptr = (unsigned long long *)((char *)params + 88 + 3 * 8);
    *dptr = (next_address += 1 << 20);
    *n = handle();
    return 0;
}
CUresult cuGraphAddKernelNode_v2(void **n, void *g, void *deps, size_t count, const void *p)
{
    (void)g; (void)deps; (void)count; (void)p;
    *n = handle();
    return 0;
}
CUresult cuGraphAddMemFreeNode(void **n, void *g, void *deps, size_t count, unsigned long long p)
{
    (void)g; (void)deps; (void)count; (void)p;
    *n = handle();
    return 0;
}
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long flags)
{
    (void)g; (void)flags;
    *e = handle();
    return 0;
}
CUresult cuGraphExecDestroy(void *e) { (void)e; return 0; }
CUresult cuGraphAddEmptyNode(void **n, void *g, void *deps, size_t count)
{
    (void)g; (void)deps; (void)count;
    *n = handle();
    return 0;
}
CUresult cuGraphAddDependencies_v2(void *g, const void *from, const void *to, const void *data,
                                   size_t count)
{
    (void)g; (void)from; (void)to; (void)data; (void)count;
    return 0;
}

CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = handle(); return 0; }
CUresult cuEventDestroy_v2(void *e) { (void)e; return 0; }

CUresult cuModuleLoadData(void **m, const void *image) { (void)image; *m = handle(); return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
    (void)m; (void)name;
    *f = handle();
    return 0;
}
CUresult cuModuleUnload(void *m) { (void)m; return 0; }

CUresult cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_UNKNOWN"; return 0; }
CUresult cuGetErrorString(int e, const char **s) { (void)e; *s = "null driver"; return 0; }
