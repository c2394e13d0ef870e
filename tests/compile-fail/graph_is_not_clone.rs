//! CUDA cannot clone a graph that has memory nodes (cuGraphClone: CUDA_ERROR_NOT_SUPPORTED), and
//! a copy would duplicate the record's allocations: `Graph` is not `Clone`.

use cuda_graph::Graph;

fn duplicate(graph: &Graph) -> Graph {
    graph.clone()
}

fn main() {}
