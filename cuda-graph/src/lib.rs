//! Safe CUDA graphs with graph-owned memory (skeleton; the safe layer lands with its own issue).

pub use cuda_graph_sys as sys;
