//! The results as rows of a table, and the table as Markdown and CSV.

use std::fmt::Write as _;

use cuda_graph::Bytes;

use crate::footprint::Scenario;
use crate::measure::{Metric, Samples, Workload};
use crate::stats::Stats;
use crate::workload::{Mode, PathId};

/// Steady launch of the chains whose allocations do not escape (the safe API's fast launch
/// path): safe/C at most this (the safety model's bookkeeping costs the launch path under 1%). GPU-bound at
/// k ≥ 10, so it cannot see the host's share there: [`TARGET_ENQUEUE`] does.
pub const TARGET_STEADY: f64 = 1.01;
/// Launch + synchronize of the same chains: safe/C at most this.
pub const TARGET_LAUNCH_SYNC: f64 = 1.02;
/// Build + instantiate with the checks on, explicit chain: safe/C at most this.
pub const TARGET_BUILD_EXPLICIT: f64 = 1.02;
/// Build + instantiate with the checks on, captured chain: safe/C at most this (a checked
/// capture also reads the graph back from the driver).
pub const TARGET_BUILD_CAPTURED: f64 = 1.05;
/// The build alone, explicit chain: safe/raw at most this (the builder's record against the
/// same driver calls).
pub const TARGET_BUILD_ALONE_EXPLICIT: f64 = 1.05;
/// The build alone, captured chain: safe/raw at most this (the capture's record and the
/// read-back against a bare capture).
pub const TARGET_BUILD_ALONE_CAPTURED: f64 = 1.10;

/// The targets of the build (safe/raw) and of build + instantiate (safe/C) of a chain built in
/// `mode`.
pub fn build_targets(mode: Mode) -> (f64, f64) {
    match mode {
        Mode::Capture => (TARGET_BUILD_ALONE_CAPTURED, TARGET_BUILD_CAPTURED),
        Mode::Explicit | Mode::Escaping => (TARGET_BUILD_ALONE_EXPLICIT, TARGET_BUILD_EXPLICIT),
    }
}
/// Launch enqueue (host only) of the chains whose allocations do not escape: safe/raw at most
/// this, at every k. The figure the safe layer can move: the GPU does not bound it.
pub const TARGET_ENQUEUE: f64 = 1.05;
/// Launch enqueue of the escaping chain (the safe API's slow launch path) at
/// [`ESCAPING_TARGET_K`]: safe/raw at most this. The slow path adds a lock and an event record
/// per escaping allocation (and a stream-id query per launch) to a `cuGraphLaunch` that itself
/// costs a few microseconds on the host: half a launch more is the budget. At larger k the
/// bookkeeping grows with the number of escaping allocations and the launch hardly does, so the
/// ratio there says how the bookkeeping scales, not whether it is light: it is reported (with
/// the absolute cost per launch and per allocation), without a target.
pub const TARGET_ESCAPING_ENQUEUE: f64 = 1.5;
/// The chain length at which [`TARGET_ESCAPING_ENQUEUE`] applies: one escaping allocation.
pub const ESCAPING_TARGET_K: u32 = 1;

/// The kernel chain's update in place: safe/C at most this (the safe API's checks before
/// `cuGraphExecUpdate` cost under 5% of the runtime's update), at [`UPDATE_TARGET_K`].
pub const TARGET_UPDATE: f64 = 1.05;
/// The kernel chain's speed-up of updating in place over instantiating the same new graph: the
/// safe path's at least this, at [`UPDATE_TARGET_K`]. Updating a rebuilt graph is what makes
/// rebuilding every step affordable; it has to beat instantiation by a wide margin to be worth
/// offering.
pub const TARGET_UPDATE_SPEEDUP: f64 = 3.0;
/// The chain length at which [`TARGET_UPDATE`] and [`TARGET_UPDATE_SPEEDUP`] apply: a long
/// chain, where instantiation's cost per node dominates.
pub const UPDATE_TARGET_K: u32 = 1000;

/// A target on the safe path's figure of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// The safe path's figure over `against`'s at most `max`.
    Ratio {
        /// The bound.
        max: f64,
        /// The path the safe path is compared with: C or raw.
        against: PathId,
    },
    /// The safe path's own figure (a factor) at least `min`.
    AtLeast {
        /// The bound.
        min: f64,
    },
}

impl Target {
    /// safe/C ≤ `max`.
    pub const fn vs_c(max: f64) -> Target {
        Target::Ratio {
            max,
            against: PathId::C,
        }
    }

    /// safe/raw ≤ `max`.
    pub const fn vs_raw(max: f64) -> Target {
        Target::Ratio {
            max,
            against: PathId::Raw,
        }
    }

    /// safe ≥ `min`, for a factor.
    pub const fn at_least(min: f64) -> Target {
        Target::AtLeast { min }
    }

    /// The bound.
    pub fn bound(&self) -> f64 {
        match *self {
            Target::Ratio { max, .. } => max,
            Target::AtLeast { min } => min,
        }
    }

    /// The path a ratio target compares with; none for a bound on the safe figure itself.
    pub fn against(&self) -> Option<PathId> {
        match *self {
            Target::Ratio { against, .. } => Some(against),
            Target::AtLeast { .. } => None,
        }
    }

    /// What the bounded figure is called: `safe/C`, or `safe` for the safe figure itself.
    pub fn figure(&self) -> String {
        match self.against() {
            Some(against) => format!("safe/{}", against.name()),
            None => "safe".into(),
        }
    }

    /// `safe/C ≤ 1.01`, `safe ≥ 3.00×`.
    pub fn describe(&self) -> String {
        match *self {
            Target::Ratio { max, .. } => format!("{} ≤ {max:.2}", self.figure()),
            Target::AtLeast { min } => format!("{} ≥ {min:.2}×", self.figure()),
        }
    }
}

/// What a row's figures are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Nanoseconds.
    Time,
    /// A dimensionless factor (speedups).
    Factor,
    /// Nanoseconds, a path's time minus another's: no ratios.
    Difference,
}

/// One row of the table: one measurement of one workload at one k, for the three paths.
#[derive(Clone, Debug)]
pub struct Row {
    /// The workload.
    pub workload: Workload,
    /// Chain length.
    pub k: u32,
    /// What is measured, for people.
    pub label: String,
    /// What is measured, as a stable key (CSV).
    pub key: &'static str,
    /// Safe, raw, C.
    pub cells: [Option<Stats>; 3],
    /// Where the paths ran back to back: each path's time over C's in the same round, which
    /// [`Row::ratio`] then reports instead of the ratio of medians (safe, raw, C).
    pub paired: [Option<Stats>; 3],
    /// The same over the raw path's, for [`Row::ratio_raw`] (safe, raw, C).
    pub paired_raw: [Option<Stats>; 3],
    /// Time, factor or difference.
    pub unit: Unit,
    /// The target, if this row has one.
    pub target: Option<Target>,
}

impl Row {
    /// `path`'s figure over C's: the median of the paired ratios where there are some, else
    /// the ratio of the medians.
    pub fn ratio(&self, path: PathId) -> Option<f64> {
        self.ratio_to(path, PathId::C)
    }

    /// `path`'s figure over the raw path's, the same way.
    pub fn ratio_raw(&self, path: PathId) -> Option<f64> {
        self.ratio_to(path, PathId::Raw)
    }

    /// `path`'s figure over `against`'s: the median of the paired ratios where there are some,
    /// else the ratio of the medians; none for a path against itself or for differences.
    pub fn ratio_to(&self, path: PathId, against: PathId) -> Option<f64> {
        if path == against || self.unit == Unit::Difference {
            return None;
        }
        let (i, j) = (index(path), index(against));
        let paired = match against {
            PathId::C => &self.paired[i],
            PathId::Raw => &self.paired_raw[i],
            PathId::Safe => &None,
        };
        if let Some(paired) = paired {
            return Some(paired.median);
        }
        match (&self.cells[i], &self.cells[j]) {
            (Some(a), Some(b)) if b.median > 0.0 => Some(a.median / b.median),
            _ => None,
        }
    }

    /// The safe path's figure that the target bounds: its ratio to the path a ratio target
    /// names, or its own median for a lower bound.
    pub fn target_figure(&self) -> Option<f64> {
        match self.target? {
            Target::Ratio { against, .. } => self.ratio_to(PathId::Safe, against),
            Target::AtLeast { .. } => self.cells[index(PathId::Safe)].map(|s| s.median),
        }
    }

    /// Whether the safe path meets the target (`None` without a target or a figure).
    pub fn meets_target(&self) -> Option<bool> {
        let figure = self.target_figure()?;
        Some(match self.target? {
            Target::Ratio { max, .. } => figure <= max,
            Target::AtLeast { min } => figure >= min,
        })
    }
}

fn index(path: PathId) -> usize {
    match path {
        PathId::Safe => 0,
        PathId::Raw => 1,
        PathId::C => 2,
    }
}

/// A row to build: label, key, the metric of each path (safe, raw, C), target, unit.
type RowSpec = (
    String,
    &'static str,
    [Option<Metric>; 3],
    Option<Target>,
    Unit,
);

/// The rows of a graph workload at one k, in table order.
fn graph_specs(mode: Mode, k: u32, launches: u32) -> Vec<RowSpec> {
    let time = |label: &str, key, metric, target| {
        (
            label.to_string(),
            key,
            [Some(metric); 3],
            target,
            Unit::Time,
        )
    };
    let steady_label = format!("steady launch, per launch ({launches} launches, 1 sync)");
    let over_raw = (
        "launch enqueue over raw, per launch (safe − raw; C − raw)".to_string(),
        "launch_enqueue_over_raw",
        [
            Some(Metric::SteadyEnqueueOverRaw),
            None,
            Some(Metric::SteadyEnqueueOverRaw),
        ],
        None,
        Unit::Difference,
    );
    if mode.escapes() {
        let enqueue_target =
            (k == ESCAPING_TARGET_K).then(|| Target::vs_raw(TARGET_ESCAPING_ENQUEUE));
        return vec![
            time(
                "first launch + sync",
                "first_launch",
                Metric::FirstLaunch,
                None,
            ),
            time(&steady_label, "steady_launch", Metric::Steady, None),
            time(
                "launch enqueue, per launch (host only)",
                "launch_enqueue",
                Metric::SteadyEnqueue,
                enqueue_target,
            ),
            over_raw,
            time(
                "launch + sync, per launch",
                "launch_sync",
                Metric::LaunchSync,
                None,
            ),
        ];
    }
    let (build_alone, build) = build_targets(mode);
    vec![
        time(
            "build",
            "build",
            Metric::Build,
            Some(Target::vs_raw(build_alone)),
        ),
        time(
            "instantiate (safe: checks on)",
            "instantiate",
            Metric::Instantiate,
            None,
        ),
        (
            "instantiate, safe with checks off".into(),
            "instantiate_unchecked",
            [
                Some(Metric::InstantiateUnchecked),
                Some(Metric::Instantiate),
                Some(Metric::Instantiate),
            ],
            None,
            Unit::Time,
        ),
        (
            "lifetime check alone (safe, part of instantiate)".into(),
            "check",
            [Some(Metric::Check), None, None],
            None,
            Unit::Time,
        ),
        time(
            "build + instantiate (checks on)",
            "build_instantiate",
            Metric::BuildInstantiate,
            Some(Target::vs_c(build)),
        ),
        time(
            "first launch + sync",
            "first_launch",
            Metric::FirstLaunch,
            None,
        ),
        time(
            &steady_label,
            "steady_launch",
            Metric::Steady,
            Some(Target::vs_c(TARGET_STEADY)),
        ),
        time(
            "launch enqueue, per launch (host only)",
            "launch_enqueue",
            Metric::SteadyEnqueue,
            Some(Target::vs_raw(TARGET_ENQUEUE)),
        ),
        over_raw,
        time(
            "launch + sync, per launch",
            "launch_sync",
            Metric::LaunchSync,
            Some(Target::vs_c(TARGET_LAUNCH_SYNC)),
        ),
    ]
}

/// The rows of the kernel chain's update at one k, in table order.
fn update_specs(k: u32) -> Vec<RowSpec> {
    let targeted = k == UPDATE_TARGET_K;
    let spec = |label: &str, key, metric, target, unit| {
        (label.to_string(), key, [Some(metric); 3], target, unit)
    };
    vec![
        spec(
            "build the new graph (k kernel nodes, no memory nodes)",
            "update_build",
            Metric::Build,
            None,
            Unit::Time,
        ),
        spec(
            "update in place from it (safe: checks on)",
            "update",
            Metric::Update,
            targeted.then_some(Target::vs_c(TARGET_UPDATE)),
            Unit::Time,
        ),
        spec(
            "instantiate the same new graph instead (safe: checks on)",
            "update_instantiate",
            Metric::UpdateInstantiate,
            None,
            Unit::Time,
        ),
        spec(
            "speed-up: instantiate ÷ update, per path",
            "update_speedup",
            Metric::UpdateSpeedup,
            targeted.then_some(Target::at_least(TARGET_UPDATE_SPEEDUP)),
            Unit::Factor,
        ),
    ]
}

/// Builds the rows from the samples, in table order.
pub fn rows(samples: &Samples, ks: &[u32], launches_for: impl Fn(u32) -> u32) -> Vec<Row> {
    let stats = |w: Workload, k: u32, m: Metric, p: PathId| {
        samples.get(&(w, k, m, p)).and_then(|v| Stats::of(v))
    };
    let row = |w: Workload, k: u32, (label, key, metrics, target, unit): RowSpec| {
        let mut cells = [None, None, None];
        let mut paired = [None, None, None];
        let mut paired_raw = [None, None, None];
        for (i, path) in PathId::ALL.into_iter().enumerate() {
            let Some(m) = metrics[i] else { continue };
            cells[i] = stats(w, k, m, path);
            // Paired round by round where measured so.
            if path != PathId::C {
                paired[i] = m.paired().and_then(|p| stats(w, k, p, path));
            }
            if path != PathId::Raw {
                paired_raw[i] = m.paired_raw().and_then(|p| stats(w, k, p, path));
            }
        }
        Row {
            workload: w,
            k,
            label,
            key,
            cells,
            paired,
            paired_raw,
            unit,
            target,
        }
    };
    let mut rows = Vec::new();
    for mode in Mode::ALL {
        let w = Workload::Graph(mode);
        for &k in ks {
            for spec in graph_specs(mode, k, launches_for(k)) {
                rows.push(row(w, k, spec));
            }
        }
    }
    for &k in ks {
        for spec in update_specs(k) {
            rows.push(row(Workload::Update, k, spec));
        }
    }
    for &k in ks {
        let launches = launches_for(k);
        let w = Workload::Stream;
        let per_path = |m: Metric| PathId::ALL.map(|p| stats(w, k, m, p));
        rows.push(Row {
            workload: w,
            k,
            label: format!(
                "per iteration: k × (alloc, kernel, free), {launches} iterations, 1 sync"
            ),
            key: "stream_iteration",
            cells: per_path(Metric::StreamIteration),
            paired: [None, None, None],
            paired_raw: [None, None, None],
            unit: Unit::Time,
            target: None,
        });
        rows.push(Row {
            workload: w,
            k,
            label: "enqueue per iteration (host only)".into(),
            key: "stream_enqueue",
            cells: per_path(Metric::StreamEnqueue),
            paired: [None, None, None],
            paired_raw: [None, None, None],
            unit: Unit::Time,
            target: None,
        });
        // Per repetition: the iteration without a graph over the explicit graph's steady launch
        // (samples of one repetition share an index).
        let speedup = PathId::ALL.map(|p| {
            paired_ratios(
                samples.get(&(w, k, Metric::StreamIteration, p)),
                samples.get(&(Workload::Graph(Mode::Explicit), k, Metric::Steady, p)),
            )
        });
        rows.push(Row {
            workload: w,
            k,
            label: "graph speedup: no graph ÷ explicit graph's steady launch".into(),
            key: "graph_speedup",
            cells: speedup,
            paired: [None, None, None],
            paired_raw: [None, None, None],
            unit: Unit::Factor,
            target: None,
        });
    }
    rows
}

/// The ratios of `a`'s samples to `b`'s of the same repetition (samples of one repetition
/// share an index).
pub fn paired_ratios(a: Option<&Vec<f64>>, b: Option<&Vec<f64>>) -> Option<Stats> {
    let ratios: Vec<f64> = a?
        .iter()
        .zip(b?)
        .filter(|(_, b)| **b > 0.0)
        .map(|(a, b)| a / b)
        .collect();
    Stats::of(&ratios)
}

/// The unit a time is shown in: (nanoseconds per unit, unit).
fn time_unit(ns: f64) -> (f64, &'static str) {
    let ns = ns.abs();
    if ns < 1e3 {
        (1.0, "ns")
    } else if ns < 1e6 {
        (1e3, "µs")
    } else if ns < 1e9 {
        (1e6, "ms")
    } else {
        (1e9, "s")
    }
}

/// A number with three significant digits (at least the integer part).
fn digits(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// A median with its range, in the median's unit: `12.3 µs [12.1–13.0]`.
fn cell(stats: &Option<Stats>, unit: Unit) -> String {
    let Some(s) = stats else {
        return "—".into();
    };
    let (scale, suffix) = match unit {
        Unit::Time | Unit::Difference => {
            let (scale, u) = time_unit(s.median);
            (scale, format!(" {u}"))
        }
        Unit::Factor => (1.0, "×".to_string()),
    };
    let median = format!("{}{suffix}", digits(s.median / scale));
    if s.n == 1 {
        median
    } else {
        format!(
            "{median} [{}–{}]",
            digits(s.min / scale),
            digits(s.max / scale)
        )
    }
}

fn ratio_cell(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.3}")).unwrap_or_else(|| "—".into())
}

fn target_cell(row: &Row) -> String {
    match (row.target, row.meets_target()) {
        (Some(t), Some(true)) => format!("{} ✓", t.describe()),
        (Some(t), Some(false)) => format!("{} ✗ **missed**", t.describe()),
        (Some(t), None) => format!("{} (no figure)", t.describe()),
        (None, _) => String::new(),
    }
}

/// What each measurement is, for the report.
pub const LEGEND: &str = "\
- **build**, **instantiate**, **build + instantiate**: cycles of build, instantiate, destroy, without a launch; each repetition runs up to `--cycles` rounds (fewer for long chains), every path once a round in rotating order, and contributes each path's median over its rounds. build: explicit graph: `Graph::new` / `cuGraphCreate` / `cudaGraphCreate` and 3k nodes; captured graph: begin capture, k × (stream-ordered alloc, kernel launch, stream-ordered free), end capture (for the safe API, with reading the captured graph into its record). instantiate: `Graph::instantiate` (lifetime checks, then `cuGraphInstantiateWithFlags`), `cuGraphInstantiateWithFlags`, `cudaGraphInstantiate`. **checks off**: `Graph::instantiate_unchecked`, as a further path in the same rounds. build + instantiate: the median of the per-cycle sums.
- **lifetime check alone**: `Graph::check` on the launched workload's graph, once per repetition, timed on its own.
- **first launch + sync**: the first launch of the new executable graph (maps its memory) and a stream synchronize.
- **steady launch**: N launches and one synchronize, divided by N; GPU-bound from k = 10 on (the GPU takes longer to run the chain than the host to queue it), so it shows the host's share only at small k. **launch enqueue**: the same launches' host time before the synchronize, which the GPU does not bound: the figure the safe layer can move. **launch enqueue over raw**: a path's enqueue per launch minus the raw path's in the same round (median over the rounds): what the layer above the driver adds per launch, the safe API's or, for C, the runtime API's.
- **launch + sync**: launch and synchronize, repeated, per iteration.
- **escaping graph**: a chain of k segments alloc → kernel (explicit nodes), each after the previous kernel, with no free node: all k allocations outlive each launch (G.3.3). Instantiated with AutoFreeOnLaunch, so each launch first frees the k allocations the previous one left (the driver does that inside `cuGraphLaunch`, in all three paths). The safe API launches it on its slow path (`ExecGraph::launch` with allocations that escape: it locks them, orders the previous launch's frees after their known uses, and after `cuGraphLaunch` records an event per allocation, for later uses and frees on other streams to wait for); raw and C make the same `cuGraphLaunch` / `cudaGraphLaunch` and nothing else. Released after its launches: the live allocations freed with `GraphAllocation::free_async` / `cuMemFreeAsync` / `cudaFreeAsync`.
- **no graph**: the same k segments as stream-ordered allocation, kernel launch and free on the stream, N iterations and one synchronize, per iteration: the safe path through the safe API (`StreamAllocation::new`, `Function::launch`, `StreamAllocation::free_async`), raw through `cuMemAllocAsync` / `cuLaunchKernel` / `cuMemFreeAsync`, C through `cudaMallocAsync` / `cudaLaunchKernel` / `cudaFreeAsync`. **graph speedup**: that time over the explicit graph's steady launch, per path.
- **kernel chain**: k kernel nodes `add_u32` over one device buffer, each after the previous one, no memory nodes (`ExecGraph::update` refuses graphs with memory nodes: an alloc node's address is fixed for the life of its graph), rebuilt every step with new values (node i adds step + i). Each repetition runs up to `--cycles` steps (fewer for long chains), every path once a step in rotating order, and contributes each path's median over its steps. **build the new graph**: `Graph::new` / `cuGraphCreate` / `cudaGraphCreate` and the k kernel nodes. **update in place**: the executable graph made from step 0's chain updated from that graph: `ExecGraph::update` (lifetime checks, then `cuGraphExecUpdate`), `cuGraphExecUpdate`, `cudaGraphExecUpdate`. **instantiate the same new graph**: a second graph built the same way (not timed), instantiated (`Graph::instantiate` with its checks, `cuGraphInstantiateWithFlags`, `cudaGraphInstantiate`) and destroyed without a launch. **speed-up**: a path's instantiation over its own update in the same step, median over the steps. After each step the buffer is zeroed, the updated executable graph launched and the buffer read back and checked (every element the sum of the step's k values), so every update measured is known to have taken effect.
";

/// The timing table in Markdown.
pub fn timing_table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(LEGEND);
    s.push('\n');
    s.push_str(
        "Median [min–max] over the repetitions. The ratios of build + instantiate, steady launch, launch enqueue, launch + sync and the kernel chain's update and instantiation are paired (the host's speed drifts between repetitions by more than the differences measured): each round runs every path back to back, and a repetition contributes the median of each path's time over C's (launch enqueue, update, instantiation of the kernel chain: also over the raw path's) in the same round (build + instantiate, and the kernel chain's steps: up to 100 rounds; steady launch and its enqueue: up to 5 rounds of N launches and a synchronize, 1 at k = 1000; launch + sync: 10 rounds of a tenth of the iterations). Other ratios are of the medians. safe = cuda-graph, raw = cuda-graph-sys driver calls, C = runtime API (c/graph_bench.c).\n\n",
    );
    s.push_str(
        "| workload | k | measurement | safe | raw | C | safe/C | raw/C | safe/raw | target |\n",
    );
    s.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
    for row in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.workload.name(),
            row.k,
            row.label,
            cell(&row.cells[0], row.unit),
            cell(&row.cells[1], row.unit),
            cell(&row.cells[2], row.unit),
            ratio_cell(row.ratio(PathId::Safe)),
            ratio_cell(row.ratio(PathId::Raw)),
            ratio_cell(row.ratio_raw(PathId::Safe)),
            target_cell(row),
        );
    }
    s
}

/// The targets, in words, for the report.
pub fn targets_text() -> String {
    format!(
        "chains without escaping allocations: steady launch safe/C ≤ {TARGET_STEADY}, launch enqueue safe/raw ≤ {TARGET_ENQUEUE} at every k, launch + sync safe/C ≤ {TARGET_LAUNCH_SYNC}, build + instantiate with checks on safe/C ≤ {TARGET_BUILD_EXPLICIT} (explicit) and ≤ {TARGET_BUILD_CAPTURED} (captured), the build alone safe/raw ≤ {TARGET_BUILD_ALONE_EXPLICIT} (explicit) and ≤ {TARGET_BUILD_ALONE_CAPTURED} (captured); escaping graph (slow launch path): launch enqueue safe/raw ≤ {TARGET_ESCAPING_ENQUEUE} at k = {ESCAPING_TARGET_K}; kernel chain: update in place safe/C ≤ {TARGET_UPDATE} and instantiate ÷ update safe ≥ {TARGET_UPDATE_SPEEDUP}× at k = {UPDATE_TARGET_K}"
    )
}

/// A signed time with its unit: `+1.52 µs`, `−40.0 ns`.
fn signed_time(ns: f64) -> String {
    let (scale, unit) = time_unit(ns);
    let sign = if ns < 0.0 { "−" } else { "+" };
    format!("{sign}{} {unit}", digits(ns.abs() / scale))
}

/// What the escaping graph's launches cost over raw driver calls, per k, in one line (`None`
/// when it was not measured).
fn slow_path_summary(rows: &[Row]) -> Option<String> {
    let w = Workload::Graph(Mode::Escaping);
    let find = |k: u32, key: &str| {
        rows.iter()
            .find(|r| r.workload == w && r.k == k && r.key == key)
    };
    let mut ks: Vec<u32> = rows
        .iter()
        .filter(|r| r.workload == w)
        .map(|r| r.k)
        .collect();
    ks.dedup();
    let mut safe = Vec::new();
    let mut c = Vec::new();
    let mut steady = Vec::new();
    for k in ks {
        if let Some(over) = find(k, "launch_enqueue_over_raw") {
            if let Some(st) = &over.cells[index(PathId::Safe)] {
                let ratio =
                    ratio_cell(find(k, "launch_enqueue").and_then(|r| r.ratio_raw(PathId::Safe)));
                safe.push(if k > 1 {
                    format!(
                        "{} at k = {k} ({} per allocation; safe/raw {ratio})",
                        signed_time(st.median),
                        signed_time(st.median / f64::from(k))
                    )
                } else {
                    format!("{} at k = {k} (safe/raw {ratio})", signed_time(st.median))
                });
            }
            if let Some(st) = &over.cells[index(PathId::C)] {
                c.push(format!("{} at k = {k}", signed_time(st.median)));
            }
        }
        if let Some(r) = find(k, "steady_launch").and_then(|r| r.ratio(PathId::Safe)) {
            steady.push(format!("{r:.3} at k = {k}"));
        }
    }
    if safe.is_empty() && steady.is_empty() {
        return None;
    }
    let mut line = String::from(
        "- Slow launch path (escaping graph: k allocations escape each launch, AutoFreeOnLaunch):",
    );
    if !safe.is_empty() {
        line.push_str(&format!(
            " the safe API's launch enqueue adds, per launch, over raw driver calls, {}",
            safe.join(", ")
        ));
    }
    if !c.is_empty() {
        line.push_str(&format!("; C's runtime API adds {}", c.join(", ")));
    }
    if !steady.is_empty() {
        line.push_str(&format!("; steady launch safe/C {}", steady.join(", ")));
    }
    line.push_str(".\n");
    Some(line)
}

/// A factor: `4.10×`.
fn factor_cell(f: Option<f64>) -> String {
    f.map(|f| format!("{f:.2}×")).unwrap_or_else(|| "—".into())
}

/// The kernel chain's update in place, per k, in one line: each path's speed-up of the update
/// over instantiating the same new graph, and the update's safe/C (`None` when it was not
/// measured). Says so when C's own speed-up misses the speed-up target, so that a miss of the
/// safe path's can be read against what the runtime reaches.
fn update_summary(rows: &[Row]) -> Option<String> {
    let w = Workload::Update;
    let find = |k: u32, key: &str| {
        rows.iter()
            .find(|r| r.workload == w && r.k == k && r.key == key)
    };
    let mut ks: Vec<u32> = rows
        .iter()
        .filter(|r| r.workload == w)
        .map(|r| r.k)
        .collect();
    ks.dedup();
    let mut speedups = Vec::new();
    let mut vs_c = Vec::new();
    let mut c_below = None;
    for k in ks {
        if let Some(row) = find(k, "update_speedup") {
            let own = |path| row.cells[index(path)].map(|s| s.median);
            if own(PathId::Safe).is_some() || own(PathId::C).is_some() {
                speedups.push(format!(
                    "safe {}, raw {}, C {} at k = {k}",
                    factor_cell(own(PathId::Safe)),
                    factor_cell(own(PathId::Raw)),
                    factor_cell(own(PathId::C))
                ));
            }
            if let (Some(Target::AtLeast { min }), Some(c)) = (row.target, own(PathId::C)) {
                if c < min {
                    c_below = Some((k, c, min));
                }
            }
        }
        if let Some(r) = find(k, "update").and_then(|r| r.ratio(PathId::Safe)) {
            vs_c.push(format!("{r:.3} at k = {k}"));
        }
    }
    if speedups.is_empty() && vs_c.is_empty() {
        return None;
    }
    let mut line = String::from(
        "- Update in place (kernel chain: k kernel nodes, no memory nodes, rebuilt with new values every step):",
    );
    if !speedups.is_empty() {
        line.push_str(&format!(
            " instantiate ÷ update of the same new graph {}",
            speedups.join("; ")
        ));
    }
    if !vs_c.is_empty() {
        line.push_str(&format!("; update safe/C {}", vs_c.join(", ")));
    }
    if let Some((k, c, min)) = c_below {
        line.push_str(&format!(
            "; C's own speed-up at k = {k}, {}, is below the {min:.0}× target too",
            factor_cell(Some(c))
        ));
    }
    line.push_str(".\n");
    Some(line)
}

/// The targets, met and missed, in Markdown.
pub fn targets(rows: &[Row], scenarios: &[Scenario]) -> String {
    let mut s = String::new();
    let targeted: Vec<&Row> = rows.iter().filter(|r| r.target.is_some()).collect();
    let missed: Vec<&&Row> = targeted
        .iter()
        .filter(|r| r.meets_target() != Some(true))
        .collect();
    let _ = writeln!(
        s,
        "- Timing: {} of {} targeted figures meet their target ({}).",
        targeted.len() - missed.len(),
        targeted.len(),
        targets_text()
    );
    for r in missed {
        let Some(target) = r.target else { continue };
        let (figure, others) = match target {
            Target::Ratio { .. } => (ratio_cell(r.target_figure()), String::new()),
            // A bound on the safe path's own factor: the other paths' own figures beside it.
            Target::AtLeast { .. } => (
                factor_cell(r.target_figure()),
                format!(
                    "; raw {}, C {}",
                    factor_cell(r.cells[index(PathId::Raw)].map(|s| s.median)),
                    factor_cell(r.cells[index(PathId::C)].map(|s| s.median))
                ),
            ),
        };
        let _ = writeln!(
            s,
            "  - missed: {}, k = {}, {}: {} = {figure} (target {}){others}",
            r.workload.name(),
            r.k,
            r.label,
            target.figure(),
            target.describe()
        );
    }
    if let Some(line) = slow_path_summary(rows) {
        s.push_str(&line);
    }
    if let Some(line) = update_summary(rows) {
        s.push_str(&line);
    }
    if scenarios.is_empty() {
        s.push_str("- Footprint: not run (--skip-footprint or --update-only).\n");
        return s;
    }
    let same = scenarios.iter().filter(|sc| sc.identical()).count();
    let _ = writeln!(
        s,
        "- Footprint: used and reserved memory identical to C's at every step in {same} of {} scenarios{}.",
        scenarios.len(),
        if same == scenarios.len() {
            ""
        } else {
            " (**not all**)"
        }
    );
    s
}

/// The footprint scenarios in Markdown.
pub fn footprint_table(scenarios: &[Scenario]) -> String {
    let mut s = String::new();
    s.push_str("Graph memory of the device after each step (CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT and RESERVED_MEM_CURRENT), 64 MiB allocations.\n");
    for sc in scenarios {
        let _ = writeln!(
            s,
            "\n**{}**: {}. Identical to C: {}.",
            sc.name,
            sc.expect,
            if sc.identical() { "yes" } else { "**no**" }
        );
        if let Some((what, safe, c)) = sc.property {
            let _ = writeln!(
                s,
                "{what}: safe {}, C {}.",
                if safe { "yes" } else { "no" },
                if c { "yes" } else { "no" }
            );
        }
        s.push_str(
            "\n| step | safe used | safe reserved | C used | C reserved | same |\n|---|---:|---:|---:|---:|---|\n",
        );
        for (i, step) in sc.steps.iter().enumerate() {
            let (a, b) = (sc.safe.get(i), sc.c.get(i));
            let fmt = |m: Option<u64>| m.map(|v| Bytes(v).to_string()).unwrap_or("—".into());
            let same = matches!((a, b), (Some(a), Some(b)) if a.used == b.used && a.reserved == b.reserved);
            let _ = writeln!(
                s,
                "| {step} | {} | {} | {} | {} | {} |",
                fmt(a.map(|m| m.used)),
                fmt(a.map(|m| m.reserved)),
                fmt(b.map(|m| m.used)),
                fmt(b.map(|m| m.reserved)),
                if same { "yes" } else { "**no**" }
            );
        }
    }
    s
}

/// Quotes a CSV field when it needs it.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The rows as CSV: one line per row and path.
pub fn rows_csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "workload,k,measurement,key,path,unit,reps,median,min,max,q1,q3,ratio_to_c,target,ratio_to_raw,target_against\n",
    );
    for row in rows {
        for path in PathId::ALL {
            let Some(st) = &row.cells[index(path)] else {
                continue;
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_field(row.workload.name()),
                row.k,
                csv_field(&row.label),
                row.key,
                path.name(),
                match row.unit {
                    Unit::Time => "ns",
                    Unit::Factor => "factor",
                    Unit::Difference => "ns_over_raw",
                },
                st.n,
                st.median,
                st.min,
                st.max,
                st.q1,
                st.q3,
                row.ratio(path).map(|r| r.to_string()).unwrap_or_default(),
                row.target
                    .map(|t| t.bound().to_string())
                    .unwrap_or_default(),
                row.ratio_raw(path)
                    .map(|r| r.to_string())
                    .unwrap_or_default(),
                row.target
                    .map(|t| t.against().map_or("at_least", PathId::name))
                    .unwrap_or_default(),
            );
        }
    }
    s
}

/// Every sample as CSV.
pub fn samples_csv(samples: &Samples) -> String {
    // Nanoseconds, except for the *VsC and *VsRaw metrics and UpdateSpeedup (factors).
    let mut s = String::from("workload,k,metric,path,rep,value\n");
    for ((w, k, m, p), values) in samples {
        for (rep, v) in values.iter().enumerate() {
            let _ = writeln!(
                s,
                "{},{k},{m:?},{},{rep},{v}",
                csv_field(w.name()),
                p.name()
            );
        }
    }
    s
}

/// The footprint scenarios as CSV.
pub fn footprint_csv(scenarios: &[Scenario]) -> String {
    let mut s = String::from(
        "scenario,step_index,step,path,used,reserved,used_high,reserved_high,identical_to_c\n",
    );
    for sc in scenarios {
        for (i, step) in sc.steps.iter().enumerate() {
            for (path, figures) in [("safe", &sc.safe), ("C", &sc.c)] {
                let Some(m) = figures.get(i) else { continue };
                let same = matches!((sc.safe.get(i), sc.c.get(i)), (Some(a), Some(b)) if a.used == b.used && a.reserved == b.reserved);
                let _ = writeln!(
                    s,
                    "{},{i},{},{path},{},{},{},{},{}",
                    csv_field(sc.name),
                    csv_field(step),
                    m.used,
                    m.reserved,
                    m.used_high,
                    m.reserved_high,
                    same
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_well() {
        let one = |v: f64| cell(&Stats::of(&[v]), Unit::Time);
        assert_eq!(one(850.0), "850 ns");
        assert_eq!(one(12_345.0), "12.3 µs");
        assert_eq!(one(4_560_000.0), "4.56 ms");
        assert_eq!(one(1.5e9), "1.50 s");
        let s = Stats::of(&[12_100.0, 12_345.0, 13_000.0]);
        assert_eq!(cell(&s, Unit::Time), "12.3 µs [12.1–13.0]");
        assert_eq!(cell(&None, Unit::Time), "—");
    }

    #[test]
    fn csv_quotes_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a, b"), "\"a, b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
    }

    #[test]
    fn rows_have_ratios_and_targets() {
        let mut samples = Samples::new();
        let w = Workload::Graph(Mode::Explicit);
        for (p, v) in [
            (PathId::Safe, 100.5),
            (PathId::Raw, 99.0),
            (PathId::C, 100.0),
        ] {
            samples.insert((w, 1, Metric::Steady, p), vec![v, v]);
        }
        let rows = rows(&samples, &[1], |_| 1000);
        let steady = rows
            .iter()
            .find(|r| r.key == "steady_launch" && r.workload == w)
            .unwrap();
        assert!((steady.ratio(PathId::Safe).unwrap() - 1.005).abs() < 1e-9);
        assert_eq!(steady.target, Some(Target::vs_c(1.01)));
        assert_eq!(steady.meets_target(), Some(true));
        let build = rows.iter().find(|r| r.key == "build").unwrap();
        assert_eq!(build.meets_target(), None);
        let table = timing_table(&rows);
        assert!(
            table.contains("| 1.005 | 0.990 | 1.015 | safe/C ≤ 1.01 ✓ |"),
            "{table}"
        );
        // 1.012 misses the steady-launch target of 1.01.
        let mut samples = samples.clone();
        samples.insert((w, 1, Metric::Steady, PathId::Safe), vec![101.2]);
        let rows = super::rows(&samples, &[1], |_| 1000);
        let steady = rows.iter().find(|r| r.key == "steady_launch").unwrap();
        assert_eq!(steady.meets_target(), Some(false));
        assert!(targets(&rows, &[]).contains(
            "  - missed: explicit graph, k = 1, steady launch, per launch (1000 launches, 1 sync): safe/C = 1.012 (target safe/C ≤ 1.01)"
        ));
    }

    #[test]
    fn enqueue_is_bounded_against_raw() {
        let w = Workload::Graph(Mode::Capture);
        let mut samples = Samples::new();
        // Medians: safe 3.3 µs, raw 3.0, C 3.1 (safe/raw 1.1, a miss); round by round safe
        // took 1.04 of raw's time (met).
        for (p, v) in [
            (PathId::Safe, 3300.0),
            (PathId::Raw, 3000.0),
            (PathId::C, 3100.0),
        ] {
            samples.insert((w, 1000, Metric::SteadyEnqueue, p), vec![v; 3]);
        }
        samples.insert(
            (w, 1000, Metric::SteadyEnqueueVsRaw, PathId::Safe),
            vec![1.03, 1.04, 1.2],
        );
        samples.insert(
            (w, 1000, Metric::SteadyEnqueueOverRaw, PathId::Safe),
            vec![90.0, 120.0, 600.0],
        );
        samples.insert(
            (w, 1000, Metric::SteadyEnqueueOverRaw, PathId::C),
            vec![100.0, 100.0, 100.0],
        );
        let rows = rows(&samples, &[1000], |_| 1000);
        let row = |key| {
            rows.iter()
                .find(|r| r.key == key && r.workload == w)
                .unwrap()
        };
        let enqueue = row("launch_enqueue");
        assert_eq!(enqueue.target, Some(Target::vs_raw(TARGET_ENQUEUE)));
        assert!((enqueue.ratio_raw(PathId::Safe).unwrap() - 1.04).abs() < 1e-9);
        assert!((enqueue.target_figure().unwrap() - 1.04).abs() < 1e-9);
        assert_eq!(enqueue.meets_target(), Some(true));
        // Against C, the ratio of the medians (no paired figure given).
        assert!((enqueue.ratio(PathId::Safe).unwrap() - 3300.0 / 3100.0).abs() < 1e-9);
        let over = row("launch_enqueue_over_raw");
        assert_eq!(over.unit, Unit::Difference);
        assert_eq!(over.ratio(PathId::Safe), None);
        assert_eq!(over.ratio_raw(PathId::Safe), None);
        assert_eq!(over.target, None);
        let table = timing_table(&rows);
        assert!(
            table.contains("| 120 ns [90.0–600] | — | 100 ns [100–100] | — | — | — |  |"),
            "{table}"
        );
        assert!(table.contains("safe/raw ≤ 1.05 ✓"), "{table}");
    }

    #[test]
    fn the_escaping_graph_has_its_own_target_and_summary() {
        let w = Workload::Graph(Mode::Escaping);
        let mut samples = Samples::new();
        for (k, over, ratio) in [(1, 1500.0, 1.45), (10, 9000.0, 3.9)] {
            for (p, v) in [
                (PathId::Safe, 3000.0 + over),
                (PathId::Raw, 3000.0),
                (PathId::C, 3100.0),
            ] {
                samples.insert((w, k, Metric::SteadyEnqueue, p), vec![v]);
                samples.insert((w, k, Metric::Steady, p), vec![v]);
            }
            samples.insert(
                (w, k, Metric::SteadyEnqueueVsRaw, PathId::Safe),
                vec![ratio],
            );
            samples.insert(
                (w, k, Metric::SteadyEnqueueOverRaw, PathId::Safe),
                vec![over],
            );
            samples.insert((w, k, Metric::SteadyEnqueueOverRaw, PathId::C), vec![-40.0]);
            samples.insert((w, k, Metric::SteadyVsC, PathId::Safe), vec![1.0]);
        }
        let rows = rows(&samples, &[1, 10], |_| 1000);
        let escaping: Vec<&Row> = rows.iter().filter(|r| r.workload == w).collect();
        // Launches only (no build + instantiate cycles); the enqueue target only at k = 1.
        let keys: Vec<&str> = escaping
            .iter()
            .filter(|r| r.k == 1)
            .map(|r| r.key)
            .collect();
        assert_eq!(
            keys,
            [
                "first_launch",
                "steady_launch",
                "launch_enqueue",
                "launch_enqueue_over_raw",
                "launch_sync"
            ]
        );
        let targeted: Vec<(u32, Target)> = escaping
            .iter()
            .filter_map(|r| Some((r.k, r.target?)))
            .collect();
        assert_eq!(targeted, [(1, Target::vs_raw(TARGET_ESCAPING_ENQUEUE))]);
        assert_eq!(escaping[2].meets_target(), Some(true));
        let text = targets(&rows, &[]);
        assert!(
            text.contains("the safe API's launch enqueue adds, per launch, over raw driver calls, +1.50 µs at k = 1 (safe/raw 1.450), +9.00 µs at k = 10 (+900 ns per allocation; safe/raw 3.900); C's runtime API adds −40.0 ns at k = 1, −40.0 ns at k = 10; steady launch safe/C 1.000 at k = 1, 1.000 at k = 10."),
            "{text}"
        );
        // The chains measured here meet their one target (the other workloads, not measured
        // here, have no figures and count as missed).
        assert!(!text.contains("missed: escaping graph"), "{text}");
    }

    #[test]
    fn the_kernel_chain_has_its_targets_at_k_1000() {
        let w = Workload::Update;
        let mut samples = Samples::new();
        // k = 1000: safe updates in 1.03 of C's time (met) and 2.8 times faster than it
        // instantiates (missed), C 2.9 times, raw 3.2 times.
        for k in [10, 1000] {
            for (p, update, speedup) in [
                (PathId::Safe, 1030.0, 2.8),
                (PathId::Raw, 1000.0, 3.2),
                (PathId::C, 1000.0, 2.9),
            ] {
                samples.insert((w, k, Metric::Build, p), vec![5000.0]);
                samples.insert((w, k, Metric::Update, p), vec![update]);
                samples.insert((w, k, Metric::UpdateInstantiate, p), vec![update * speedup]);
                samples.insert((w, k, Metric::UpdateSpeedup, p), vec![speedup]);
            }
            samples.insert((w, k, Metric::UpdateVsC, PathId::Safe), vec![1.03]);
            samples.insert((w, k, Metric::UpdateVsRaw, PathId::Safe), vec![1.03]);
        }
        let rows = rows(&samples, &[10, 1000], |_| 1000);
        let mine: Vec<&Row> = rows.iter().filter(|r| r.workload == w).collect();
        let keys: Vec<&str> = mine.iter().filter(|r| r.k == 10).map(|r| r.key).collect();
        assert_eq!(
            keys,
            [
                "update_build",
                "update",
                "update_instantiate",
                "update_speedup"
            ]
        );
        let targeted: Vec<(u32, &str, Target)> = mine
            .iter()
            .filter_map(|r| Some((r.k, r.key, r.target?)))
            .collect();
        assert_eq!(
            targeted,
            [
                (1000, "update", Target::vs_c(TARGET_UPDATE)),
                (
                    1000,
                    "update_speedup",
                    Target::at_least(TARGET_UPDATE_SPEEDUP)
                ),
            ]
        );
        let update = mine
            .iter()
            .find(|r| r.k == 1000 && r.key == "update")
            .unwrap();
        assert_eq!(update.meets_target(), Some(true));
        assert!((update.ratio_raw(PathId::Safe).unwrap() - 1.03).abs() < 1e-9);
        let speedup = mine
            .iter()
            .find(|r| r.k == 1000 && r.key == "update_speedup")
            .unwrap();
        assert_eq!(speedup.unit, Unit::Factor);
        assert!((speedup.target_figure().unwrap() - 2.8).abs() < 1e-9);
        assert_eq!(speedup.meets_target(), Some(false));

        let text = targets(&rows, &[]);
        assert!(
            text.contains("  - missed: kernel chain, k = 1000, speed-up: instantiate ÷ update, per path: safe = 2.80× (target safe ≥ 3.00×); raw 3.20×, C 2.90×"),
            "{text}"
        );
        assert!(
            text.contains("- Update in place (kernel chain: k kernel nodes, no memory nodes, rebuilt with new values every step): instantiate ÷ update of the same new graph safe 2.80×, raw 3.20×, C 2.90× at k = 10; safe 2.80×, raw 3.20×, C 2.90× at k = 1000; update safe/C 1.030 at k = 10, 1.030 at k = 1000; C's own speed-up at k = 1000, 2.90×, is below the 3× target too."),
            "{text}"
        );
        let table = timing_table(&rows);
        assert!(
            table.contains("| kernel chain | 1000 | speed-up: instantiate ÷ update, per path | 2.80× | 3.20× | 2.90× | 0.966 | 1.103 | 0.875 | safe ≥ 3.00× ✗ **missed** |"),
            "{table}"
        );
        let csv = rows_csv(&rows);
        let line = csv
            .lines()
            .find(|l| l.starts_with("kernel chain,1000,") && l.contains(",update_speedup,safe,"))
            .unwrap();
        // ..., ratio_to_c, target (the lower bound), ratio_to_raw, target_against.
        let fields: Vec<&str> = line.rsplitn(4, ',').collect();
        assert_eq!(
            fields[..3],
            ["at_least", "0.8749999999999999", "3"],
            "{line}"
        );
    }

    #[test]
    fn csv_has_both_ratios_and_the_target() {
        let w = Workload::Graph(Mode::Explicit);
        let mut samples = Samples::new();
        for (p, v) in [(PathId::Safe, 3.0), (PathId::Raw, 2.0), (PathId::C, 4.0)] {
            samples.insert((w, 1, Metric::SteadyEnqueue, p), vec![v]);
        }
        let csv = rows_csv(&rows(&samples, &[1], |_| 1000));
        let header = csv.lines().next().unwrap();
        assert!(header.ends_with(",ratio_to_c,target,ratio_to_raw,target_against"));
        let safe = csv
            .lines()
            .find(|l| l.contains(",launch_enqueue,safe,"))
            .unwrap();
        assert!(safe.ends_with(",0.75,1.05,1.5,raw"), "{safe}");
        // Separators outside the quoted label.
        let fields = |line: &str| {
            let mut quoted = false;
            1 + line
                .chars()
                .filter(|&ch| {
                    quoted ^= ch == '"';
                    ch == ',' && !quoted
                })
                .count()
        };
        assert_eq!(fields(safe), fields(header), "{safe}");
    }

    #[test]
    fn targeted_rows_report_the_paired_ratio() {
        let w = Workload::Graph(Mode::Capture);
        for (metric, vs_c, key) in [
            (
                Metric::BuildInstantiate,
                Metric::BuildInstantiateVsC,
                "build_instantiate",
            ),
            (Metric::LaunchSync, Metric::LaunchSyncVsC, "launch_sync"),
            (Metric::Steady, Metric::SteadyVsC, "steady_launch"),
        ] {
            // Medians of 120 and 100 (1.2, a miss), but round by round safe took 1.005 of C's
            // time (the median of the repetitions' ratios).
            let mut samples = Samples::new();
            for (p, v) in [(PathId::Safe, 120.0), (PathId::C, 100.0)] {
                samples.insert((w, 10, metric, p), vec![v; 3]);
                samples.insert((w, 10, Metric::Build, p), vec![v; 3]);
            }
            samples.insert((w, 10, vs_c, PathId::Safe), vec![0.99, 1.005, 1.05]);
            let rows = rows(&samples, &[10], |_| 1000);
            let row = |key| rows.iter().find(|r| r.key == key && r.workload == w);
            let paired = row(key).unwrap();
            assert!((paired.ratio(PathId::Safe).unwrap() - 1.005).abs() < 1e-9);
            assert_eq!(paired.meets_target(), Some(true), "{key}");
            // Without paired ratios (build alone), the ratio of the medians.
            let build = row("build").unwrap();
            assert!((build.ratio(PathId::Safe).unwrap() - 1.2).abs() < 1e-9);
        }
    }
}
