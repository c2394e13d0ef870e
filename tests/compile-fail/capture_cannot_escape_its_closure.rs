//! The guard that `capture` hands its closure cannot be kept after the closure returns, when
//! `capture` has already ended the capture.

use cuda_graph::{Capture, CaptureMode, Stream, capture};

fn keep_the_guard(stream: &Stream) {
    let mut kept: Option<&Capture<'_, Stream>> = None;
    let _ = capture(stream, CaptureMode::Global, |cap| {
        kept = Some(cap);
        Ok(())
    });
    let _ = kept.unwrap().malloc_async(1024);
}

fn main() {}
