/*
 * The do-nothing driver of tests/stub-driver/null_cuda.c, with the calls a launch needs that it
 * lacks: cuGraphLaunch, and for the safe API's slow launch path (graphs whose allocations
 * escape) cuEventRecord and cuStreamWaitEvent. Like the rest of the stub, they do no work and
 * return CUDA_SUCCESS, so what remains of a launch is what the caller does on the host.
 * bench/host-overhead/run.sh builds this for the host_overhead example's launch paths.
 */
#include "../../tests/stub-driver/null_cuda.c"

CUresult cuGraphLaunch(void *exec, void *stream) { (void)exec; (void)stream; return 0; }
CUresult cuEventRecord(void *event, void *stream) { (void)event; (void)stream; return 0; }
CUresult cuStreamWaitEvent(void *stream, void *event, unsigned flags)
{
    (void)stream; (void)event; (void)flags;
    return 0;
}
