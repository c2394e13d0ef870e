//! Device memory is read back only as types valid for every bit pattern: a `char` is not (a
//! word such as 0xD800, a surrogate, is not a `char`).

use cuda_graph::{Device, DeviceBuffer};

fn main() -> cuda_graph::Result<()> {
    let device = Device::get(0)?;
    let buffer = DeviceBuffer::<char>::zeroed(&device, 4)?;
    let values: Vec<char> = buffer.to_vec()?;
    println!("{}", values[0]);
    Ok(())
}
