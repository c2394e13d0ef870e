//! A stream-ordered allocation is freed on its stream: it borrows the stream, which must
//! outlive it.

use cuda_graph::{Device, Stream, StreamAllocation};

fn outlive(device: &Device) {
    let allocation = {
        let stream = Stream::new(device).unwrap();
        StreamAllocation::new(&stream, 1024).unwrap()
    };
    drop(allocation);
}

fn main() {}
