//! cuda-graph-bench: the same graph-memory workloads through the safe API (`cuda-graph`), raw
//! `cuda-graph-sys` driver calls, and C written with the runtime API (`c/graph_bench.c`, built
//! by `build.rs` with the `cc` crate), in one process, interleaved, over several repetitions.
//!
//! Workloads: a chain of k segments alloc → kernel → free (k = 1, 10, 100, 1000), built with
//! explicit nodes and by stream capture; for each, build, instantiate (the safe API with its
//! lifetime checks on and off), first launch, steady launch (1000 launches, one synchronize; and
//! its host-only enqueue) and launch + synchronize. A chain of k segments alloc → kernel whose
//! allocations escape the graph, instantiated with AutoFreeOnLaunch, for the safe API's slow
//! launch path (the same launch figures). The same work without graphs (stream-ordered
//! allocation on a stream) for the graph speedup. A chain of k kernel nodes without memory
//! nodes, rebuilt with new values every step, for updating an executable graph in place against
//! instantiating the new graph. Before those, the footprint scenarios of NVIDIA's
//! graphMemoryFootprint sample, through the safe API and through C.
//!
//! Output, in `--out DIR` (default `target/bench`): `results.md` (the tables, also printed on
//! stdout), `bench.csv`, `samples.csv`, `footprint.csv` and `bench.svg`. Without a GPU it prints
//! one line, `cuda-graph-bench: needs a CUDA GPU: <reason>`, on stderr and exits with status 2.

mod c_path;
mod footprint;
mod measure;
mod plot;
mod raw_path;
mod report;
mod safe_path;
mod stats;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cuda_graph::{Bytes, Device, sys};

use crate::c_path::CPath;
use crate::measure::{Plan, Workload};
use crate::raw_path::RawPath;
use crate::safe_path::SafePath;
use crate::workload::{BenchError, Counts, Result, Shape, Workloads};

const USAGE: &str = "\
usage: cuda-graph-bench [options]

Measures graph-memory workloads through the safe API (cuda-graph), raw cuda-graph-sys calls and
C with the CUDA runtime API, in one process, and writes results.md, bench.csv, samples.csv,
footprint.csv and bench.svg.

options:
  --out DIR           output directory (default: target/bench)
  --quick             a short run: 3 repetitions, 100 launches, 20 launch+sync iterations
  --reps N            repetitions (default 7; quick 3)
  --launches N        launches per steady measurement, and iterations without graphs (default 1000)
  --sync-iters N      iterations of launch + synchronize (default 100; quick 20)
  --k LIST            chain lengths, comma-separated (default 1,10,100,1000)
  --segment-cap N     at most N segments (k x launches) per steady measurement; 0 = no cap
                      (default 0; quick 20000)
  --cycles N          build + instantiate cycles per path and repetition, at most (default 100;
                      quick 20; fewer for long chains: about 20000 segments, at least 3)
  --budget SECS       add no repetition that would end after SECS (default 480; quick 240)
  --elements N        32-bit elements per allocation (default 65536, i.e. 256 KiB)
  --device N          the GPU (default 0)
  --skip-footprint    do not run the footprint scenarios
  --update-only       only the kernel chain's update in place against instantiation (no other
                      workload, no footprint scenarios, no plot)
  --strict            exit with status 3 when a target is missed or a footprint differs from C's
  -h, --help          this text

exit status: 0 done; 1 a CUDA or I/O error (printed with the call that failed); 2 no usable GPU
(one line on stderr); 3 with --strict, a target missed; 64 bad options.
";

/// The command line.
#[derive(Clone, Debug)]
struct Options {
    out: PathBuf,
    quick: bool,
    reps: usize,
    launches: u32,
    sync_iters: u32,
    ks: Vec<u32>,
    segment_cap: u64,
    cycles: u32,
    budget: u64,
    elements: u64,
    device: usize,
    skip_footprint: bool,
    update_only: bool,
    strict: bool,
    command: String,
}

impl Options {
    /// `Ok(None)` for `--help`.
    fn parse(args: &[String]) -> std::result::Result<Option<Options>, String> {
        let quick = args.iter().any(|a| a == "--quick");
        let mut o = Options {
            out: PathBuf::from("target/bench"),
            quick,
            reps: if quick { 3 } else { 7 },
            launches: if quick { 100 } else { 1000 },
            sync_iters: if quick { 20 } else { 100 },
            ks: vec![1, 10, 100, 1000],
            segment_cap: if quick { 20_000 } else { 0 },
            cycles: if quick { 20 } else { 100 },
            budget: if quick { 240 } else { 480 },
            elements: 1 << 16,
            device: 0,
            skip_footprint: false,
            update_only: false,
            strict: false,
            command: std::iter::once("cuda-graph-bench")
                .chain(args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            fn number<T: std::str::FromStr>(name: &str, v: &str) -> std::result::Result<T, String> {
                v.parse()
                    .map_err(|_| format!("{name}: '{v}' is not a valid number"))
            }
            match arg.as_str() {
                "-h" | "--help" => return Ok(None),
                "--quick" => {}
                "--out" => o.out = PathBuf::from(value("--out")?),
                "--reps" => o.reps = number("--reps", &value("--reps")?)?,
                "--launches" => o.launches = number("--launches", &value("--launches")?)?,
                "--sync-iters" => o.sync_iters = number("--sync-iters", &value("--sync-iters")?)?,
                "--segment-cap" => {
                    o.segment_cap = number("--segment-cap", &value("--segment-cap")?)?
                }
                "--cycles" => o.cycles = number("--cycles", &value("--cycles")?)?,
                "--budget" => o.budget = number("--budget", &value("--budget")?)?,
                "--elements" => o.elements = number("--elements", &value("--elements")?)?,
                "--device" => o.device = number("--device", &value("--device")?)?,
                "--skip-footprint" => o.skip_footprint = true,
                "--update-only" => o.update_only = true,
                "--strict" => o.strict = true,
                "--k" => {
                    let list = value("--k")?;
                    o.ks = list
                        .split(',')
                        .map(|k| number::<u32>("--k", k.trim()))
                        .collect::<std::result::Result<_, _>>()?;
                }
                other => return Err(format!("unknown option '{other}'")),
            }
        }
        if o.reps == 0 || o.launches == 0 || o.sync_iters == 0 || o.cycles == 0 {
            return Err("--reps, --launches, --sync-iters and --cycles must be at least 1".into());
        }
        if o.ks.is_empty() || o.ks.contains(&0) {
            return Err("--k needs chain lengths of at least 1".into());
        }
        if o.elements == 0 || o.elements > (1 << 28) {
            return Err("--elements must be between 1 and 2^28".into());
        }
        o.ks.sort_unstable();
        o.ks.dedup();
        Ok(Some(o))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("cuda-graph-bench: {message} (see --help)");
            return ExitCode::from(64);
        }
    };
    let device = match usable_gpu(options.device) {
        Ok(device) => device,
        Err(reason) => {
            eprintln!(
                "cuda-graph-bench: needs a CUDA GPU: {}",
                reason.replace('\n', " ")
            );
            return ExitCode::from(2);
        }
    };
    match run(&options, &device) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("cuda-graph-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The device, when the driver and a GPU with memory pools are there; otherwise why not.
fn usable_gpu(ordinal: usize) -> std::result::Result<Device, String> {
    let device = Device::get(ordinal).map_err(|e| e.to_string())?;
    let pools = device.supports_memory_pools().map_err(|e| e.to_string())?;
    if !pools {
        let name = device.name().unwrap_or_else(|_| "unnamed".into());
        return Err(format!(
            "device {ordinal} ({name}) does not support memory pools, which graph memory nodes need"
        ));
    }
    Ok(device)
}

/// Runs everything; `Ok(false)` when `--strict` and a target was missed.
fn run(options: &Options, device: &Device) -> Result<bool> {
    std::fs::create_dir_all(&options.out).map_err(|e| {
        BenchError(format!(
            "creating the output directory {}: {e}",
            options.out.display()
        ))
    })?;
    let ordinal = options.device;
    let mut safe = SafePath::new(device).map_err(|e| e.context("safe path, set-up"))?;
    let mut raw = RawPath::new(ordinal).map_err(|e| e.context("raw path, set-up"))?;
    let mut c = CPath::new(ordinal).map_err(|e| e.context("C path, set-up"))?;
    let environment = environment(options, device, &c)?;
    eprintln!("cuda-graph-bench: {}", environment.subtitle);

    let scenarios = if options.skip_footprint || options.update_only {
        Vec::new()
    } else {
        eprintln!("cuda-graph-bench: footprint scenarios");
        footprint::run(&safe, &mut c)?
    };

    let block = 256;
    let shape = Shape {
        elements: options.elements,
        grid: options.elements.div_ceil(u64::from(block)).clamp(1, 65_535) as u32,
        block,
    };
    let plan = Plan {
        ks: options.ks.clone(),
        reps: options.reps,
        counts: Counts {
            launches: options.launches,
            sync_iters: options.sync_iters,
        },
        budget: Duration::from_secs(options.budget),
        segment_cap: options.segment_cap,
        shape,
        cycles: options.cycles,
        update_only: options.update_only,
    };
    let outcome = {
        let mut paths: [&mut dyn Workloads; 3] = [&mut safe, &mut raw, &mut c];
        // samples.csv after every repetition: a run cut short still leaves its figures.
        let samples_file = options.out.join("samples.csv");
        measure::run(&plan, &mut paths, |samples| {
            write(&samples_file, &report::samples_csv(samples))
        })?
    };
    c.close().map_err(|e| e.context("C path, closing"))?;
    drop(raw);
    drop(safe);

    let mut rows = report::rows(&outcome.samples, &plan.ks, |k| plan.counts_for(k).launches);
    if plan.update_only {
        // The other workloads were not run: their rows would be empty and their targets missed.
        rows.retain(|r| r.workload == Workload::Update);
    }
    let mut md = String::new();
    md.push_str(&format!("# cuda-graph-bench, {}\n\n", environment.date));
    for (name, value) in &environment.items {
        md.push_str(&format!("- {name}: {value}\n"));
    }
    md.push_str(&format!(
        "- Run{}: {} of {} repetitions recorded after a warm-up, interleaved (path order rotates, forward and backward), {:.0} s{}\n",
        if options.quick { " (--quick)" } else { "" },
        outcome.reps_done,
        plan.reps,
        outcome.elapsed.as_secs_f64(),
        outcome
            .stopped_early
            .as_ref()
            .map(|s| format!("; {s}"))
            .unwrap_or_default()
    ));
    if !plan.update_only {
        md.push_str(&format!(
            "- Workload: chain of k segments alloc ({}) → fill_u32 ({} × {} threads) → free, each after the previous free (explicit and captured graph); the escaping graph: k segments alloc → fill_u32, each after the previous kernel, no free (k allocations escape each launch; AutoFreeOnLaunch); {} sync iterations; launches per steady measurement (× rounds per repetition): {}\n",
            Bytes(shape.bytes() as u64),
            shape.grid,
            shape.block,
            plan.counts.sync_iters,
            plan.ks
                .iter()
                .map(|&k| {
                    let launches = plan.counts_for(k).launches;
                    let rounds = plan.steady_rounds(k, launches);
                    format!("{launches} × {rounds} at k = {k}")
                })
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    md.push_str(&format!(
        "- Kernel chain{}: k kernel nodes add_u32 ({} × {} threads) over one {} buffer, each after the previous one, no memory nodes, rebuilt with new values every step; the executable graph updated in place from it, against instantiating the same new graph; each update launched and its result checked; steps per repetition: {}\n",
        if plan.update_only { " (--update-only: the only workload run)" } else { "" },
        shape.grid,
        shape.block,
        Bytes(shape.bytes() as u64),
        plan.ks
            .iter()
            .map(|&k| format!("{} at k = {k}", plan.cycle_rounds(k)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    md.push_str("\n## Targets\n\n");
    md.push_str(&report::targets(&rows, &scenarios));
    md.push_str("\n## Timing\n\n");
    md.push_str(&report::timing_table(&rows));
    if !scenarios.is_empty() {
        md.push_str("\n## Footprint (graphMemoryFootprint scenarios)\n\n");
        md.push_str(&report::footprint_table(&scenarios));
    }

    let out = &options.out;
    write(&out.join("results.md"), &md)?;
    write(&out.join("bench.csv"), &report::rows_csv(&rows))?;
    write(
        &out.join("samples.csv"),
        &report::samples_csv(&outcome.samples),
    )?;
    if !scenarios.is_empty() {
        write(
            &out.join("footprint.csv"),
            &report::footprint_csv(&scenarios),
        )?;
    }
    if !plan.update_only {
        plot::svg(
            &out.join("bench.svg"),
            &outcome.samples,
            &plan.ks,
            &environment.subtitle,
        )?;
    }
    print!("{md}");
    eprintln!(
        "cuda-graph-bench: wrote results.md, bench.csv, samples.csv{}{} to {}",
        if scenarios.is_empty() {
            ""
        } else {
            ", footprint.csv"
        },
        if plan.update_only { "" } else { ", bench.svg" },
        out.display()
    );

    let all_met = rows
        .iter()
        .filter(|r| r.target.is_some())
        .all(|r| r.meets_target() == Some(true))
        && scenarios.iter().all(|s| s.identical());
    Ok(all_met || !options.strict)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| BenchError(format!("writing {}: {e}", path.display())))
}

/// What the report says about the machine and the build.
struct Environment {
    date: String,
    subtitle: String,
    items: Vec<(&'static str, String)>,
}

fn dotted(version: i32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

fn environment(options: &Options, device: &Device, c: &CPath) -> Result<Environment> {
    let name = device.name()?;
    let (major, minor) = device.compute_capability()?;
    let memory = device.total_memory()?;
    let mut driver_version = 0;
    workload::driver(
        // SAFETY: valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) },
        "cuDriverGetVersion",
    )?;
    let runtime = c.runtime_version()?;
    let date = utc_now();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let items = vec![
        (
            "GPU",
            format!(
                "{name} (device {}, compute capability {major}.{minor}, {})",
                options.device,
                Bytes(memory as u64)
            ),
        ),
        (
            "CUDA",
            format!(
                "driver supports {}, runtime {} ({} in this binary), headers {} (cuda-graph-sys bindings: {})",
                dotted(driver_version),
                dotted(runtime),
                sys::CUDART_LINKAGE,
                dotted(sys::CUDA_VERSION as i32),
                sys::BINDINGS_SOURCE
            ),
        ),
        ("CPU", cpu),
        ("C baseline", c_path::BUILD_NOTE.to_string()),
        (
            "Build",
            if cfg!(debug_assertions) {
                "debug (figures are not representative: build with --release)".into()
            } else {
                "release".into()
            },
        ),
        ("Command", format!("`{}`", options.command)),
    ];
    Ok(Environment {
        subtitle: format!("{name}, CUDA driver {}, {date}", dotted(driver_version)),
        date,
        items,
    })
}

/// The current time in UTC, `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<Option<Options>, String> {
        Options::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options() {
        let o = parse(&[]).unwrap().unwrap();
        assert_eq!(
            (o.reps, o.launches, o.ks.clone()),
            (7, 1000, vec![1, 10, 100, 1000])
        );
        assert_eq!(o.out, PathBuf::from("target/bench"));
        let q = parse(&["--quick", "--out", "x", "--k", "10,1"])
            .unwrap()
            .unwrap();
        assert_eq!((q.reps, q.launches, q.ks.clone()), (3, 100, vec![1, 10]));
        assert_eq!(q.out, PathBuf::from("x"));
        assert!(!q.update_only);
        assert!(parse(&["--update-only"]).unwrap().unwrap().update_only);
        assert!(parse(&["--help"]).unwrap().is_none());
        assert!(parse(&["--reps"]).is_err());
        assert!(parse(&["--k", "0"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
