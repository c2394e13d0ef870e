//! The project's example and test kernels (`kernels/graph_kernels.cu`), as PTX that CUDA 12 and
//! 13 drivers JIT. Examples, tests and benchmarks load them with
//! [`Module::from_ptx`](crate::Module::from_ptx).
//!
//! Only with the `example-kernels` feature (off by default). These kernels exist for the crate's
//! examples and the workspace's tests; they are not part of the stable API and may change or go
//! in any release. Your own kernels load the same way, from PTX or a cubin.
//!
//! | kernel | parameters | effect |
//! |---|---|---|
//! | `fill_u32` | `(u32* p, u64 n, u32 v)` | `p[i] = v` |
//! | `iota_u32` | `(u32* p, u64 n, u32 base)` | `p[i] = base + i` |
//! | `add_u32` | `(u32* p, u64 n, u32 v)` | `p[i] += v` |
//! | `copy_u32` | `(u32* dst, const u32* src, u64 n)` | `dst[i] = src[i]` |
//! | `axpy_u32` | `(u32* dst, const u32* src, u64 n, u32 a)` | `dst[i] += a * src[i]` |
//! | `sum_u32` | `(const u32* p, u64 n, u64* out)` | `*out += Σ p[i]` |
//! | `spin_then_fill_u32` | `(u32* p, u64 n, u32 v, u64 cycles)` | waits `cycles` clock cycles, then `p[i] = v` |
//! | `square_f32` | `(const f32* in, f32* out, u64 n)` | `out[i] = in[i] * in[i]` |
//! | `negate_f32` | `(const f32* in, f32* out, u64 n)` | `out[i] = -in[i]` |
//! | `validate_f32` | `(const f32* got, const f32* ref, u64 n, f32 variance, u32* failed)` | `*failed = 1` where `(got[i] - ref[i])² / ref[i]² > variance` |

//!
//! The kernels that set a conditional node's condition from the device
//! (`cudaGraphSetConditional`, `kernels/condition_kernels.cu`) need the device runtime, which a
//! PTX module cannot link at load time; they come as a fatbin instead, [`CONDITION_FATBIN`]:
//!
//! | kernel | parameters | effect |
//! |---|---|---|
//! | `count_to_then_clear` | `(CUgraphConditionalHandle h, u32* counter, u32 limit)` | `*counter += 1`; clears `h` once `*counter` reaches `limit` |
//! | `set_condition_from` | `(CUgraphConditionalHandle h, const u32* value)` | sets `h` to `*value` |

/// The PTX text of `kernels/graph_kernels.cu`.
pub const PTX: &str = include_str!("../kernels/graph_kernels.ptx");

/// A fatbin's image, aligned as the driver reads it.
#[repr(C, align(64))]
struct Aligned<const N: usize>([u8; N]);

static FATBIN: Aligned<{ include_bytes!("../kernels/condition_kernels.fatbin").len() }> =
    Aligned(*include_bytes!("../kernels/condition_kernels.fatbin"));

/// `kernels/condition_kernels.cu` linked against the device runtime: SASS for sm_75, sm_80,
/// sm_86, sm_89, sm_90, sm_100 and sm_120, made by the workspace's `ci/gen-condition-fatbin.sh`
/// with CUDA 13.0's nvcc (a driver older than that may refuse it). Load it with
/// [`Module::from_cubin`](crate::Module::from_cubin).
pub static CONDITION_FATBIN: &[u8] = &FATBIN.0;
