//! Device memory is read back only as types valid for every bit pattern: a `bool` is not (a
//! byte of 2 written by a memset or a kernel is not a `bool`).

use cuda_graph::{Device, DeviceBuffer};

fn main() -> cuda_graph::Result<()> {
    let device = Device::get(0)?;
    let buffer = DeviceBuffer::<bool>::zeroed(&device, 4)?;
    let values: Vec<bool> = buffer.to_vec()?;
    println!("{}", values[0]);
    Ok(())
}
