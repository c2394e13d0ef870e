//! Kernel arguments are untyped at the ABI: launching a kernel, directly or into a capture or a
//! graph, is `unsafe`, and the caller vouches for the argument list.

use cuda_graph::{Function, KernelArgs, LaunchConfig, Stream};

fn launch(function: &Function, stream: &Stream) {
    let _ = function.launch(stream, LaunchConfig::for_elements(1, 1), &KernelArgs::new());
}

fn main() {}
