//! A capture records its allocations and uses in unsynchronized cells: another thread cannot
//! use the guard (to capture from another thread, fork a stream into the capture).

use cuda_graph::{CaptureMode, Stream, capture};

fn allocate_from_another_thread(stream: &Stream) {
    let _ = capture(stream, CaptureMode::Global, |cap| {
        std::thread::scope(|s| {
            s.spawn(|| cap.malloc_async(1024));
        });
        Ok(())
    });
}

fn main() {}
