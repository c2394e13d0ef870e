//! Device memory is read back only as types valid for every bit pattern: a reference is not
//! (zeroed device memory would come back as a null reference).

use cuda_graph::{Device, DeviceBuffer};

fn main() -> cuda_graph::Result<()> {
    let device = Device::get(0)?;
    let buffer = DeviceBuffer::<&'static u64>::zeroed(&device, 4)?;
    let values: Vec<&'static u64> = buffer.to_vec()?;
    println!("{}", values[0]);
    Ok(())
}
