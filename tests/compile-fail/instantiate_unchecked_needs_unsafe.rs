//! Instantiating without the lifetime checks is `unsafe`: a graph that breaks the rules reads or
//! writes memory another allocation owns when it runs.

use cuda_graph::{Device, Graph, InstantiateFlags};

fn main() -> cuda_graph::Result<()> {
    let device = Device::get(0)?;
    let graph = Graph::new(&device)?;
    let _exec = graph.instantiate_unchecked(InstantiateFlags::NONE)?;
    Ok(())
}
