//! A graph under construction may be moved to another thread (`Send`), but not shared between
//! threads: the builder and its record are not synchronized.

use cuda_graph::{Graph, InstantiateFlags};

fn instantiate_on_two_threads(graph: &Graph) {
    std::thread::scope(|s| {
        s.spawn(|| graph.instantiate(InstantiateFlags::NONE));
        s.spawn(|| graph.instantiate(InstantiateFlags::NONE));
    });
}

fn main() {}
