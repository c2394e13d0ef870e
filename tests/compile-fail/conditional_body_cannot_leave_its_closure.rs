// A conditional node's body cannot leave its build closure: the closure sees `Body`, which gives
// no mutable access to the graph inside, so the graph cannot be swapped for a stand-in.
use cuda_graph::{ConditionalKind, Device, Graph};

fn main() {
    let device = Device::get(0).unwrap();
    let mut parent = Graph::new(&device).unwrap();
    let condition = parent.add_condition(Some(1)).unwrap();
    let mut escaped = None;
    let _ = parent.add_conditional_node(&[], &condition, ConditionalKind::If, |bodies| {
        let stand_in = Graph::new(&device)?;
        escaped = Some(std::mem::replace(&mut *bodies[0], stand_in));
        Ok(())
    });
}
