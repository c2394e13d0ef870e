//! A free node frees a graph allocation: an address that no alloc node returned (here, a
//! `cuMemAlloc` buffer) cannot even be passed (raw, CUDA answers CUDA_ERROR_INVALID_VALUE).

use cuda_graph::{DeviceBuffer, Graph};

fn free_a_buffer(graph: &mut Graph, buffer: &DeviceBuffer<u32>) {
    let _ = graph.add_mem_free_node(&[], buffer);
}

fn main() {}
