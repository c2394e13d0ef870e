/*
 * The do-nothing driver of tests/stub-driver/null_cuda.c, with the calls a launch needs that it
 * lacks: cuGraphLaunch, and for the safe API's slow launch path (graphs whose allocations
 * escape) cuEventRecord and cuStreamWaitEvent; and, for the update paths, cuEventQuery (every
 * event is complete) and, for their buffer (a DeviceBuffer), cuMemAlloc, cuMemsetD8 and
 * cuMemFree. Like the rest of the stub, they do no
 * work and return CUDA_SUCCESS, so what remains of a launch or an update is what the caller
 * does on the host. bench/host-overhead/run.sh builds this for the host_overhead example's
 * launch and update paths.
 */
#include "../../tests/stub-driver/null_cuda.c"

CUresult cuGraphLaunch(void *exec, void *stream) { (void)exec; (void)stream; return 0; }
CUresult cuEventRecord(void *event, void *stream) { (void)event; (void)stream; return 0; }
CUresult cuStreamWaitEvent(void *stream, void *event, unsigned flags)
{
    (void)stream; (void)event; (void)flags;
    return 0;
}
CUresult cuEventQuery(void *event) { (void)event; return 0; }
CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes)
{
    (void)bytes;
    *p = __atomic_add_fetch(&next_address, 1 << 20, __ATOMIC_RELAXED);
    return 0;
}
CUresult cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n)
{
    (void)p; (void)v; (void)n;
    return 0;
}
CUresult cuMemFree_v2(unsigned long long p) { (void)p; return 0; }
