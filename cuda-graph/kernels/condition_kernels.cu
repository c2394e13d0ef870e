// Kernels that set a conditional node's condition from the device (cudaGraphSetConditional,
// CUDA 12.4+), for the example-kernels feature's tests and examples. cudaGraphSetConditional
// comes from the device runtime (libcudadevrt), which a PTX module loaded at run time cannot
// link: ci/gen-condition-fatbin.sh compiles this file with -rdc, links it against the device
// runtime and writes condition_kernels.fatbin, SASS for each architecture it lists.
#include <cuda_runtime.h>

// Adds 1 to *counter; once it reaches `limit`, clears the condition `h` (a WHILE loop's: the
// loop ends after this iteration). One thread does the work.
extern "C" __global__ void count_to_then_clear(cudaGraphConditionalHandle h, unsigned int* counter,
                                               unsigned int limit)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned int c = ++*counter;
        if (c >= limit)
            cudaGraphSetConditional(h, 0);
    }
}

// Sets the condition `h` to `*value` (an IF's or a SWITCH's selector computed on the device).
extern "C" __global__ void set_condition_from(cudaGraphConditionalHandle h, const unsigned int* value)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        cudaGraphSetConditional(h, *value);
}
