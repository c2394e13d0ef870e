//! What the lifetime check costs, against what the driver takes to instantiate the same graph.
//!
//! The graph: 10,000 nodes, 3,000 allocations of 64 KiB, in 8 lanes. Chain `i` runs in lane
//! `i % 8` after the lane's previous chain (so the driver may reuse addresses, G.4.1): an alloc
//! node, a `fill_u32` kernel that uses the allocation and, for every third chain, a second kernel
//! beside it (fan-out), then a free node after the kernels. 3,000 + 3,000 + 1,000 + 3,000 nodes.
//!
//! Measured (median of several runs):
//! - `check_record` on the same shape built as a pure `Record`, and on a wide shape where every
//!   allocation lives across the whole graph (the check's worst case); no GPU needed;
//! - with a GPU, the same graph built with the real `Graph` API: `graph.check()` (the fast check
//!   on the record, or the general one when it declines), `graph.instantiate_unchecked()` (the
//!   driver alone), and `graph.instantiate()` (both), and the ratio.
//!
//! Without a GPU it prints the model figures and one line saying the comparison needs a GPU, and
//! exits 0. Run: `cargo run --release -p cuda-graph --example check_cost --features
//! example-kernels`.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_graph::check::{AllocKey, Record, check_record};
use cuda_graph::{
    AllocParams, AsStream, Device, Graph, InstantiateFlags, KernelArgs, LaunchConfig, Module,
    NodeKind, Stream,
};

const CHAINS: usize = 3_000;
const LANES: usize = 8;
const BYTES: usize = 64 * 1024;
const CHECK_RUNS: usize = 15;
const INSTANTIATE_RUNS: usize = 5;

/// One node of the benchmark shape.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Alloc,
    Kernel,
    Free,
}

struct Step {
    op: Op,
    deps: Vec<usize>,
    allocation: usize,
}

/// The chains of the module docs, as steps in the order nodes are added.
fn shape() -> Vec<Step> {
    let mut steps = Vec::new();
    let mut tail: [Option<usize>; LANES] = [None; LANES];
    let push = |steps: &mut Vec<Step>, op, deps: Vec<usize>, allocation| {
        steps.push(Step {
            op,
            deps,
            allocation,
        });
        steps.len() - 1
    };
    for i in 0..CHAINS {
        let lane = i % LANES;
        let alloc = push(&mut steps, Op::Alloc, tail[lane].into_iter().collect(), i);
        let mut users = vec![push(&mut steps, Op::Kernel, vec![alloc], i)];
        if i % 3 == 0 {
            users.push(push(&mut steps, Op::Kernel, vec![alloc], i));
        }
        tail[lane] = Some(push(&mut steps, Op::Free, users, i));
    }
    steps
}

fn model_of(steps: &[Step]) -> Record {
    let mut m = Record::new();
    for i in 0..CHAINS {
        m.add_allocation(format!("allocation 'c{i}'"));
    }
    for s in steps {
        let kind = match s.op {
            Op::Alloc => NodeKind::MemAlloc,
            Op::Kernel => NodeKind::Kernel("fill_u32".into()),
            Op::Free => NodeKind::MemFree,
        };
        let n = m.add_node(kind, &s.deps);
        let k = AllocKey(s.allocation);
        match s.op {
            Op::Alloc => m.allocates(n, k),
            Op::Kernel => m.uses(n, k),
            Op::Free => m.frees(n, k),
        }
    }
    m
}

/// The worst case: 3,000 allocations made at the start, 4,000 kernels in 8 lanes each using two
/// allocations, and every free after a join of all lanes, so every allocation spans the graph.
fn wide_model() -> Record {
    let mut m = Record::new();
    let allocs: Vec<usize> = (0..CHAINS)
        .map(|i| {
            let k = m.add_allocation(format!("allocation 'w{i}'"));
            let n = m.add_node(NodeKind::MemAlloc, &[]);
            m.allocates(n, k);
            n
        })
        .collect();
    let mut tail: [Option<usize>; LANES] = [None; LANES];
    for j in 0..4_000 {
        let (k1, k2) = ((j * 7) % CHAINS, (j * 13 + 5) % CHAINS);
        let mut deps: Vec<usize> = tail[j % LANES].into_iter().collect();
        deps.push(allocs[k1]);
        if k2 != k1 {
            deps.push(allocs[k2]);
        }
        let n = m.add_node(NodeKind::Kernel("k".into()), &deps);
        m.uses(n, AllocKey(k1));
        m.uses(n, AllocKey(k2));
        tail[j % LANES] = Some(n);
    }
    let tails: Vec<usize> = tail.iter().flatten().copied().collect();
    let join = m.add_node(NodeKind::Empty, &tails);
    for k in 0..CHAINS {
        let n = m.add_node(NodeKind::MemFree, &[join]);
        m.frees(n, AllocKey(k));
    }
    m
}

/// Median wall time of `runs` calls of `f`.
fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn edges(m: &Record) -> usize {
    m.nodes().iter().map(|n| n.deps().len()).sum()
}

fn main() -> ExitCode {
    let steps = shape();
    let chains = model_of(&steps);
    let wide = wide_model();
    println!(
        "lifetime check cost: {} nodes, {} edges, {} allocations of {} KiB in {LANES} lanes",
        chains.nodes().len(),
        edges(&chains),
        CHAINS,
        BYTES / 1024
    );
    assert!(check_record(&chains).is_empty() && check_record(&wide).is_empty());
    let model_chains = median(CHECK_RUNS, || {
        black_box(check_record(black_box(&chains)));
    });
    let model_wide = median(CHECK_RUNS, || {
        black_box(check_record(black_box(&wide)));
    });
    println!(
        "check_record, chains (no GPU):                {:>12}",
        ms(model_chains)
    );
    println!(
        "check_record, wide worst case ({} nodes, {} edges): {}",
        wide.nodes().len(),
        edges(&wide),
        ms(model_wide)
    );
    let device = match Device::get(0) {
        Ok(device) => device,
        Err(e) => {
            println!("instantiate comparison: needs a GPU, none is usable here ({e})");
            return ExitCode::SUCCESS;
        }
    };
    match on_gpu(&device, &steps) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("check_cost: {e}");
            ExitCode::FAILURE
        }
    }
}

fn on_gpu(device: &Device, steps: &[Step]) -> cuda_graph::Result<()> {
    let module = Module::from_ptx(device, cuda_graph::kernels::PTX)?;
    let fill = module.function("fill_u32")?;
    let words = (BYTES / 4) as u64;
    let config = LaunchConfig::for_elements(words, 256);

    let built = Instant::now();
    let mut graph = Graph::new(device)?;
    let mut nodes = Vec::with_capacity(steps.len());
    let mut allocations = Vec::with_capacity(CHAINS);
    for s in steps {
        let deps: Vec<_> = s.deps.iter().map(|&d| nodes[d]).collect();
        let node = match s.op {
            Op::Alloc => {
                let (node, allocation) =
                    graph.add_mem_alloc_node(&deps, &AllocParams::new(device, BYTES))?;
                allocations.push(allocation);
                node
            }
            Op::Kernel => {
                let args = KernelArgs::new()
                    .ptr(&allocations[s.allocation])
                    .value(words)
                    .value(s.allocation as u32);
                // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) gets a pointer
                // to `words` 32-bit words of a live allocation, a u64 and a u32.
                unsafe { graph.add_kernel_node(&deps, &fill, config, &args)? }
            }
            Op::Free => graph.add_mem_free_node(&deps, &allocations[s.allocation])?,
        };
        nodes.push(node);
    }
    let built = built.elapsed();
    graph.check()?;

    let check = median(CHECK_RUNS, || {
        black_box(black_box(&graph).check()).expect("the benchmark graph is legal");
    });
    let mut failed = None;
    let unchecked = median(INSTANTIATE_RUNS, || {
        // SAFETY: the graph passed `Graph::check` above (the same record).
        match unsafe { graph.instantiate_unchecked(InstantiateFlags::NONE) } {
            Ok(exec) => drop(black_box(exec)),
            Err(e) => failed = Some(e),
        }
    });
    let checked = median(INSTANTIATE_RUNS, || {
        match graph.instantiate(InstantiateFlags::NONE) {
            Ok(exec) => drop(black_box(exec)),
            Err(e) => failed = Some(e),
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    // The graph is real: launch it once.
    let stream = Stream::new(device)?;
    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    let launched = Instant::now();
    exec.launch(&stream)?;
    stream.synchronize()?;
    let launched = launched.elapsed();

    let name = device.name().unwrap_or_else(|_| "an unnamed GPU".into());
    println!("on {name} (device {}):", device.ordinal());
    println!(
        "  building the graph ({} driver calls):      {:>12}",
        steps.len(),
        ms(built)
    );
    println!(
        "  graph.check():                             {:>12}",
        ms(check)
    );
    println!(
        "  graph.instantiate_unchecked():             {:>12}",
        ms(unchecked)
    );
    println!(
        "  graph.instantiate() (check + driver):      {:>12}",
        ms(checked)
    );
    println!(
        "  first launch + synchronize:                {:>12}",
        ms(launched)
    );
    println!(
        "  check / instantiate_unchecked = {:.4} (the check takes {:.2}% of the driver's instantiation; the driver takes {:.1}x as long as the check)",
        check.as_secs_f64() / unchecked.as_secs_f64(),
        100.0 * check.as_secs_f64() / unchecked.as_secs_f64(),
        unchecked.as_secs_f64() / check.as_secs_f64()
    );
    Ok(())
}
