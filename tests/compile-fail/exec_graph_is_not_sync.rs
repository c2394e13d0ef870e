//! Two threads launching one executable graph without a lock: CUDA does not allow concurrent
//! launches of one `CUgraphExec` from two threads, so `ExecGraph` is `Send` but not `Sync`, and
//! sharing a reference between threads does not compile. Wrap it in a `Mutex` instead.

use cuda_graph::{Device, ExecGraph, Stream};

fn launch_from_two_threads(exec: &ExecGraph, device: &Device) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let stream = Stream::new(device).unwrap();
            exec.launch(&stream).unwrap();
        });
        s.spawn(|| {
            let stream = Stream::new(device).unwrap();
            exec.launch(&stream).unwrap();
        });
    });
}

fn main() {}
