/* The headers cuda-graph-sys binds: the driver API and the runtime API. */
#include <cuda.h>
#include <cuda_runtime.h>
