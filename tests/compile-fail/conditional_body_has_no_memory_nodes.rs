// A conditional node's body cannot hold memory nodes (whether it runs is decided on the GPU):
// `Body` offers no alloc or free node.
use cuda_graph::{AllocParams, ConditionalKind, Device, Graph};

fn main() {
    let device = Device::get(0).unwrap();
    let mut graph = Graph::new(&device).unwrap();
    let condition = graph.add_condition(Some(1)).unwrap();
    let _ = graph.add_conditional_node(&[], &condition, ConditionalKind::If, |bodies| {
        bodies[0].add_mem_alloc_node(&[], &AllocParams::new(&device, 1024))?;
        Ok(())
    });
}
