// What the driver accepts of managed memory, plainly and in graph memory: each step prints the
// CUresult name of every driver call it makes, so that the output says which calls accept
// CU_MEM_ALLOCATION_TYPE_MANAGED on this driver (the headers of CUDA 13.0 declare it; the
// docs of cuMemPoolCreate and cuGraphAddMemAllocNode do not say whether they take it). The crate
// offers managed memory only as ManagedBuffer (cuMemAllocManaged), whatever this prints; its
// alloc nodes and pools stay pinned. Built and run on the GPU machine:
//
//   nvcc -o /tmp/p bench/probe/managed_memory.cu -lcuda && /tmp/p
//
// Steps:
//   1 plain    cuMemAllocManaged (CU_MEM_ATTACH_GLOBAL), a kernel writes it, the host reads it
//              after cuStreamSynchronize (the graphMemoryNodes sample's result flag)
//   2 pool     cuMemPoolCreate with allocType MANAGED, location device 0, then host, then none;
//              cuMemAllocFromPoolAsync from each pool that was made, a kernel write, a host read
//   3 node     cuGraphAddMemAllocNode with poolProps.allocType MANAGED (location device 0),
//              instantiate, launch: a kernel node writes it, a memcpy node copies it out
//   4 capture  cuMemAllocFromPoolAsync from a managed pool (step 2's device pool) under stream
//              capture, a kernel, cuMemFreeAsync; end, instantiate, launch
// Every step runs whatever the one before printed; a failing call ends only its step.
#include <cuda.h>
#include <cstdio>
#include <cstring>

// The CUresult name, or the number when the driver has none.
static const char *name(CUresult r) {
    const char *s = nullptr;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == nullptr) {
        static char buf[32];
        snprintf(buf, sizeof buf, "CUresult %d", (int)r);
        return buf;
    }
    return s;
}

// Prints `call: NAME` and returns whether it succeeded.
static bool said(const char *step, const char *call, CUresult r) {
    printf("%-8s %-58s %s\n", step, call, name(r));
    return r == CUDA_SUCCESS;
}

#define TRY(step, x) said(step, #x, (x))

// A kernel that writes `v` into p[0], as PTX (this probe links no runtime: cuModuleLoadData).
static const char *PTX = R"(
.version 8.0
.target sm_75
.address_size 64
.visible .entry put(.param .u64 p, .param .u32 v)
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [v];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r1;
    ret;
}
)";

static CUfunction put;

// Launches put(p, v) on `s`.
static CUresult launch_put(CUdeviceptr p, unsigned v, CUstream s) {
    void *args[] = {&p, &v};
    return cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
}

// A pool of managed memory at `location` (nullptr when cuMemPoolCreate refuses it).
static CUmemoryPool managed_pool(const char *step, const char *where, CUmemLocationType type, int id) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = type;
    props.location.id = id;
    CUmemoryPool pool = nullptr;
    char call[96];
    snprintf(call, sizeof call, "cuMemPoolCreate(MANAGED, %s)", where);
    return said(step, call, cuMemPoolCreate(&pool, &props)) ? pool : nullptr;
}

// Allocates from `pool` on `s`, writes 7 with a kernel, reads it on the host.
static void use_pool(const char *step, const char *where, CUmemoryPool pool, CUstream s) {
    CUdeviceptr p = 0;
    char call[96];
    snprintf(call, sizeof call, "cuMemAllocFromPoolAsync(%s pool)", where);
    if (!said(step, call, cuMemAllocFromPoolAsync(&p, 4, pool, s)))
        return;
    bool ok = TRY(step, launch_put(p, 7, s)) && TRY(step, cuStreamSynchronize(s));
    if (ok)
        printf("%-8s host read of the pool's allocation: %u (7 expected)\n", step, *(volatile unsigned *)p);
    TRY(step, cuMemFreeAsync(p, s));
    TRY(step, cuStreamSynchronize(s));
}

int main() {
    CUdevice dev;
    CUcontext ctx;
    int version = 0;
    if (!TRY("setup", cuInit(0)) || !TRY("setup", cuDeviceGet(&dev, 0)) ||
        !TRY("setup", cuDevicePrimaryCtxRetain(&ctx, dev)) || !TRY("setup", cuCtxSetCurrent(ctx)))
        return 1;
    cuDriverGetVersion(&version);
    char devname[128] = {0};
    cuDeviceGetName(devname, sizeof devname, dev);
    int concurrent = -1, managed = -1, pools = -1;
    cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev);
    cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, dev);
    cuDeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev);
    printf("device 0: %s, driver %d, headers %d; managed memory %d, concurrent managed access %d, memory pools %d\n",
           devname, version, CUDA_VERSION, managed, concurrent, pools);
    CUmodule module;
    CUstream s;
    if (!TRY("setup", cuModuleLoadData(&module, PTX)) || !TRY("setup", cuModuleGetFunction(&put, module, "put")) ||
        !TRY("setup", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)))
        return 1;

    // 1: plain managed memory.
    {
        CUdeviceptr flag = 0;
        if (TRY("plain", cuMemAllocManaged(&flag, sizeof(unsigned), CU_MEM_ATTACH_GLOBAL))) {
            *(volatile unsigned *)flag = 0;
            if (TRY("plain", launch_put(flag, 1, s)) && TRY("plain", cuStreamSynchronize(s)))
                printf("%-8s host read after the kernel: %u (1 expected)\n", "plain", *(volatile unsigned *)flag);
            TRY("plain", cuMemFree(flag));
        }
    }

    // 2: managed pools.
    CUmemoryPool device_pool = managed_pool("pool", "device 0", CU_MEM_LOCATION_TYPE_DEVICE, 0);
    if (device_pool)
        use_pool("pool", "device", device_pool, s);
    CUmemoryPool host_pool = managed_pool("pool", "host", CU_MEM_LOCATION_TYPE_HOST, 0);
    if (host_pool) {
        use_pool("pool", "host", host_pool, s);
        TRY("pool", cuMemPoolDestroy(host_pool));
    }
    CUmemoryPool none_pool = managed_pool("pool", "no location", CU_MEM_LOCATION_TYPE_NONE, 0);
    if (none_pool) {
        use_pool("pool", "no-location", none_pool, s);
        TRY("pool", cuMemPoolDestroy(none_pool));
    }

    // 3: an alloc node of managed memory.
    {
        CUgraph g;
        if (TRY("node", cuGraphCreate(&g, 0))) {
            CUDA_MEM_ALLOC_NODE_PARAMS ap;
            memset(&ap, 0, sizeof ap);
            ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
            ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            ap.poolProps.location.id = 0;
            ap.bytesize = 1 << 20;
            CUgraphNode alloc, kernel, copy, freen;
            CUdeviceptr out = 0;
            bool ok = TRY("node", cuGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap)) &&
                      TRY("node", cuMemAllocManaged(&out, sizeof(unsigned), CU_MEM_ATTACH_GLOBAL));
            if (ok) {
                CUdeviceptr p = ap.dptr;
                unsigned v = 5;
                void *args[] = {&p, &v};
                CUDA_KERNEL_NODE_PARAMS kp;
                memset(&kp, 0, sizeof kp);
                kp.func = put;
                kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
                kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
                kp.kernelParams = args;
                CUDA_MEMCPY3D cp;
                memset(&cp, 0, sizeof cp);
                cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
                cp.srcDevice = p;
                cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
                cp.dstDevice = out;
                cp.WidthInBytes = sizeof(unsigned);
                cp.Height = cp.Depth = 1;
                CUgraphExec x;
                ok = TRY("node", cuGraphAddKernelNode(&kernel, g, &alloc, 1, &kp)) &&
                     TRY("node", cuGraphAddMemcpyNode(&copy, g, &kernel, 1, &cp, ctx)) &&
                     TRY("node", cuGraphAddMemFreeNode(&freen, g, &copy, 1, p)) &&
                     TRY("node", cuGraphInstantiate(&x, g, 0));
                if (ok) {
                    *(volatile unsigned *)out = 0;
                    if (TRY("node", cuGraphLaunch(x, s)) && TRY("node", cuStreamSynchronize(s)))
                        printf("%-8s copied out of the managed alloc node: %u (5 expected)\n", "node",
                               *(volatile unsigned *)out);
                    TRY("node", cuGraphExecDestroy(x));
                }
                TRY("node", cuMemFree(out));
            }
            TRY("node", cuGraphDestroy(g));
        }
    }

    // 4: stream capture of an allocation from a managed pool.
    if (device_pool) {
        CUgraph g = nullptr;
        CUdeviceptr p = 0;
        if (TRY("capture", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL))) {
            bool ok = TRY("capture", cuMemAllocFromPoolAsync(&p, 1 << 20, device_pool, s)) &&
                      TRY("capture", launch_put(p, 9, s)) && TRY("capture", cuMemFreeAsync(p, s));
            (void)ok;
            CUresult ended = cuStreamEndCapture(s, &g);
            said("capture", "cuStreamEndCapture(s, &g)", ended);
            if (ended == CUDA_SUCCESS && g) {
                CUgraphExec x;
                if (TRY("capture", cuGraphInstantiate(&x, g, 0))) {
                    TRY("capture", cuGraphLaunch(x, s));
                    TRY("capture", cuStreamSynchronize(s));
                    TRY("capture", cuGraphExecDestroy(x));
                }
                TRY("capture", cuGraphDestroy(g));
            }
        }
    } else {
        printf("%-8s skipped: no managed pool on device 0 (step 2)\n", "capture");
    }
    if (device_pool)
        TRY("pool", cuMemPoolDestroy(device_pool));
    TRY("cleanup", cuStreamDestroy(s));
    TRY("cleanup", cuModuleUnload(module));
    return 0;
}
