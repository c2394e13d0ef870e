//! `AsStream` is sealed: the crate hands its raw handle to the driver and orders work by it, so
//! a safe implementation could name a destroyed stream, or a different stream at each call (one
//! that is not capturing for the crate's check, a capturing one for the driver call). Streams
//! made elsewhere are borrowed with the `unsafe` `BorrowedStream::from_raw`.

use cuda_graph::{AsStream, Device, sys};

struct Dangling {
    raw: sys::CUstream,
    device: Device,
}

impl AsStream for Dangling {
    fn as_raw_stream(&self) -> sys::CUstream {
        self.raw
    }
    fn device(&self) -> &Device {
        &self.device
    }
}

fn main() {}
