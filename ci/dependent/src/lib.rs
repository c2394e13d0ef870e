//! Compile-checks the code of the crates' README.md files (`cargo test --doc`): blocks marked
//! `no_run` are compiled against the packages as a dependent sees them, `ignore` ones are not.

#[cfg(doctest)]
#[doc = include_str!("../../../cuda-graph-sys/README.md")]
pub struct CudaGraphSysReadme;

#[cfg(doctest)]
#[doc = include_str!("../../../cuda-graph/README.md")]
pub struct CudaGraphReadme;
