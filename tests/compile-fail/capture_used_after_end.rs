//! `Capture::end` consumes the guard: a capture cannot be ended twice, nor used after its end
//! (where CUDA would answer CUDA_ERROR_ILLEGAL_STATE, or capture into nothing).

use cuda_graph::{Capture, CaptureMode, Stream};

fn end_twice(stream: &Stream) -> cuda_graph::Result<()> {
    let cap = Capture::begin(stream, CaptureMode::Global)?;
    let _graph = cap.end()?;
    let _again = cap.malloc_async(1024)?;
    cap.end()?;
    Ok(())
}

fn main() {}
