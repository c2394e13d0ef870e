// CUDA kernels used by the cuda-graph tests, examples and benchmarks.
//
// Every kernel is a grid-stride loop over 32-bit unsigned elements, so any
// launch configuration covers all `n` elements. Element counts and indices are
// 64-bit (`unsigned long long`). The PTX built from this file is checked in as
// graph_kernels.ptx; regenerate it with ci/gen-ptx.sh after editing.

// Sets every element to `v`: p[i] = v.
extern "C" __global__ void fill_u32(unsigned int* p, unsigned long long n, unsigned int v)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        p[i] = v;
    }
}

// Writes an ascending sequence: p[i] = base + i (wrapping modulo 2^32).
extern "C" __global__ void iota_u32(unsigned int* p, unsigned long long n, unsigned int base)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        p[i] = base + (unsigned int)i;
    }
}

// Adds `v` to every element in place: p[i] += v (wrapping).
extern "C" __global__ void add_u32(unsigned int* p, unsigned long long n, unsigned int v)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        p[i] += v;
    }
}

// Copies `n` elements: dst[i] = src[i]. The buffers must not overlap.
extern "C" __global__ void copy_u32(unsigned int* dst, const unsigned int* src, unsigned long long n)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = src[i];
    }
}

// Scaled accumulate: dst[i] += a * src[i] (wrapping). The buffers must not overlap.
extern "C" __global__ void axpy_u32(unsigned int* dst, const unsigned int* src, unsigned long long n, unsigned int a)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] += a * src[i];
    }
}

// Sums all elements into *out as a 64-bit value: each thread accumulates a
// partial sum over its elements, then adds it to *out with one atomicAdd.
// The caller must zero *out before the launch.
extern "C" __global__ void sum_u32(const unsigned int* p, unsigned long long n, unsigned long long* out)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long partial = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        partial += p[i];
    }
    if (partial != 0) {
        atomicAdd(out, partial);
    }
}

// Busy-waits for roughly `spins` clock64() ticks per thread, then sets every
// element to `v`. The delay keeps the kernel running long enough that a buffer
// freed or reused too early is observably overwritten (lifetime-violation tests).
extern "C" __global__ void spin_then_fill_u32(unsigned int* p, unsigned long long n, unsigned int v,
                                              unsigned long long spins)
{
    const long long start = clock64();
    while ((unsigned long long)(clock64() - start) < spins) {
        // spin
    }
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        p[i] = v;
    }
}

// The graphMemoryNodes sample's kernels, on 32-bit floats (grid-stride like the others):
// out[i] = in[i] * in[i].
extern "C" __global__ void square_f32(const float* in, float* out, unsigned long long n)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = in[i] * in[i];
    }
}

// out[i] = -in[i].
extern "C" __global__ void negate_f32(const float* in, float* out, unsigned long long n)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = -in[i];
    }
}

// Sets *failed to 1 where got[i] differs from ref[i] by a relative squared error above
// `variance` ((got - ref)^2 / ref^2 > variance); leaves it alone otherwise.
extern "C" __global__ void validate_f32(const float* got, const float* ref, unsigned long long n, float variance,
                                        unsigned int* failed)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float diff = got[i] - ref[i];
        if ((diff * diff) / (ref[i] * ref[i]) > variance) {
            *failed = 1;
        }
    }
}
