//! A `Capture` guard of its own exists only for an owned `Stream`, whose drop ends a capture that
//! a forgotten guard left open. On a borrowed stream (here the per-thread default stream, which
//! nobody drops) a forgotten guard would keep the stream capturing, and every release the crate
//! puts off during a capture waiting, for the rest of the process: such streams capture through
//! `cuda_graph::capture`, whose closure cannot lose the guard.

use cuda_graph::{BorrowedStream, Capture, CaptureMode, Device};

fn main() -> cuda_graph::Result<()> {
    let device = Device::get(0)?;
    let per_thread = BorrowedStream::per_thread(&device);
    std::mem::forget(Capture::begin(&per_thread, CaptureMode::Global)?);
    Ok(())
}
