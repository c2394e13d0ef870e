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

/// The PTX text of `kernels/graph_kernels.cu`.
pub const PTX: &str = include_str!("../kernels/graph_kernels.ptx");
