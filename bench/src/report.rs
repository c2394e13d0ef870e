//! The results as rows of a table, and the table as Markdown and CSV.

use std::fmt::Write as _;

use cuda_graph::Bytes;

use crate::footprint::Scenario;
use crate::measure::{Metric, Samples, Workload};
use crate::stats::Stats;
use crate::workload::{Mode, PathId};

/// The target for steady launch and launch + synchronize: safe/C at most this.
pub const TARGET_LAUNCH: f64 = 1.02;
/// The target for build + instantiate with the checks on.
pub const TARGET_BUILD: f64 = 1.05;

/// What a row's figures are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Nanoseconds.
    Time,
    /// A dimensionless factor (speedups).
    Factor,
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
    /// Time or factor.
    pub unit: Unit,
    /// The target for safe/C, if this row has one.
    pub target: Option<f64>,
}

impl Row {
    /// `path`'s figure over C's: the median of the paired ratios where there are some, else
    /// the ratio of the medians.
    pub fn ratio(&self, path: PathId) -> Option<f64> {
        let i = index(path);
        if let Some(paired) = &self.paired[i] {
            return Some(paired.median);
        }
        match (&self.cells[i], &self.cells[2]) {
            (Some(a), Some(c)) if c.median > 0.0 => Some(a.median / c.median),
            _ => None,
        }
    }

    /// Whether safe/C meets the target (`None` without a target or a ratio).
    pub fn meets_target(&self) -> Option<bool> {
        Some(self.ratio(PathId::Safe)? <= self.target?)
    }
}

fn index(path: PathId) -> usize {
    match path {
        PathId::Safe => 0,
        PathId::Raw => 1,
        PathId::C => 2,
    }
}

/// A row to build: label, key, the metric of each path (safe, raw, C), target.
type RowSpec = (String, &'static str, [Option<Metric>; 3], Option<f64>);

/// Builds the rows from the samples, in table order.
pub fn rows(samples: &Samples, ks: &[u32], launches_for: impl Fn(u32) -> u32) -> Vec<Row> {
    let stats = |w: Workload, k: u32, m: Metric, p: PathId| {
        samples.get(&(w, k, m, p)).and_then(|v| Stats::of(v))
    };
    let mut rows = Vec::new();
    for mode in Mode::ALL {
        let w = Workload::Graph(mode);
        for &k in ks {
            let launches = launches_for(k);
            let specs: [RowSpec; 9] = [
                ("build".into(), "build", [Some(Metric::Build); 3], None),
                (
                    "instantiate (safe: checks on)".into(),
                    "instantiate",
                    [Some(Metric::Instantiate); 3],
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
                ),
                (
                    "lifetime check alone (safe, part of instantiate)".into(),
                    "check",
                    [Some(Metric::Check), None, None],
                    None,
                ),
                (
                    "build + instantiate (checks on)".into(),
                    "build_instantiate",
                    [Some(Metric::BuildInstantiate); 3],
                    Some(TARGET_BUILD),
                ),
                (
                    "first launch + sync".into(),
                    "first_launch",
                    [Some(Metric::FirstLaunch); 3],
                    None,
                ),
                (
                    format!("steady launch, per launch ({launches} launches, 1 sync)"),
                    "steady_launch",
                    [Some(Metric::Steady); 3],
                    Some(TARGET_LAUNCH),
                ),
                (
                    "launch enqueue, per launch (host only)".into(),
                    "launch_enqueue",
                    [Some(Metric::SteadyEnqueue); 3],
                    None,
                ),
                (
                    "launch + sync, per launch".into(),
                    "launch_sync",
                    [Some(Metric::LaunchSync); 3],
                    Some(TARGET_LAUNCH),
                ),
            ];
            for (label, key, metrics, target) in specs {
                let mut cells = [None, None, None];
                let mut paired = [None, None, None];
                for (i, path) in PathId::ALL.into_iter().enumerate() {
                    cells[i] = metrics[i].and_then(|m| stats(w, k, m, path));
                    if path == PathId::C {
                        continue;
                    }
                    // Paired round by round where measured so.
                    paired[i] = metrics[i].and_then(|m| stats(w, k, m.paired()?, path));
                }
                rows.push(Row {
                    workload: w,
                    k,
                    label,
                    key,
                    cells,
                    paired,
                    unit: Unit::Time,
                    target,
                });
            }
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
        Unit::Time => {
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
        (Some(t), Some(true)) => format!("≤ {t:.2} ✓"),
        (Some(t), Some(false)) => format!("≤ {t:.2} ✗ **missed**"),
        (Some(t), None) => format!("≤ {t:.2} (no figure)"),
        (None, _) => String::new(),
    }
}

/// What each measurement is, for the report.
pub const LEGEND: &str = "\
- **build**, **instantiate**, **build + instantiate**: cycles of build, instantiate, destroy, without a launch; each repetition runs up to `--cycles` rounds (fewer for long chains), every path once a round in rotating order, and contributes each path's median over its rounds. build: explicit graph: `Graph::new` / `cuGraphCreate` / `cudaGraphCreate` and 3k nodes; captured graph: begin capture, k × (stream-ordered alloc, kernel launch, stream-ordered free), end capture (for the safe API, with reading the captured graph into its record). instantiate: `Graph::instantiate` (lifetime checks, then `cuGraphInstantiateWithFlags`), `cuGraphInstantiateWithFlags`, `cudaGraphInstantiate`. **checks off**: `Graph::instantiate_unchecked`, as a further path in the same rounds. build + instantiate: the median of the per-cycle sums.
- **lifetime check alone**: `Graph::check` on the launched workload's graph, once per repetition, timed on its own.
- **first launch + sync**: the first launch of the new executable graph (maps its memory) and a stream synchronize.
- **steady launch**: N launches and one synchronize, divided by N. **launch enqueue**: the same launches' host time before the synchronize.
- **launch + sync**: launch and synchronize, repeated, per iteration.
- **no graph**: the same k segments as stream-ordered allocation (`cuMemAllocAsync` / `cudaMallocAsync`), kernel launch and free on the stream, N iterations and one synchronize, per iteration; the safe path allocates with raw `cuMemAllocAsync` (the safe API has no stream-ordered allocation outside a capture) and launches with `Function::launch`. **graph speedup**: that time over the explicit graph's steady launch, per path.
";

/// The timing table in Markdown.
pub fn timing_table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(LEGEND);
    s.push('\n');
    s.push_str(
        "Median [min–max] over the repetitions. Ratios with a target are paired (the host's speed drifts between repetitions by more than the differences measured): each round runs every path back to back, and a repetition contributes the median of each path's time over C's in the same round (build + instantiate: up to 100 cycles; steady launch: up to 5 rounds of N launches and a synchronize, 1 at k = 1000; launch + sync: 10 rounds of a tenth of the iterations). Other ratios are of the medians. safe = cuda-graph, raw = cuda-graph-sys driver calls, C = runtime API (c/graph_bench.c).\n\n",
    );
    s.push_str(
        "| workload | k | measurement | safe | raw | C | safe/C | raw/C | target (safe/C) |\n",
    );
    s.push_str("|---|---:|---|---:|---:|---:|---:|---:|---|\n");
    for row in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.workload.name(),
            row.k,
            row.label,
            cell(&row.cells[0], row.unit),
            cell(&row.cells[1], row.unit),
            cell(&row.cells[2], row.unit),
            ratio_cell(row.ratio(PathId::Safe)),
            ratio_cell(row.ratio(PathId::Raw)),
            target_cell(row),
        );
    }
    s
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
        "- Timing: {} of {} targeted figures meet their target (steady launch and launch + sync: safe/C ≤ {TARGET_LAUNCH}; build + instantiate with checks on: safe/C ≤ {TARGET_BUILD}).",
        targeted.len() - missed.len(),
        targeted.len()
    );
    for r in missed {
        let _ = writeln!(
            s,
            "  - missed: {}, k = {}, {}: safe/C = {} (target ≤ {:.2})",
            r.workload.name(),
            r.k,
            r.label,
            ratio_cell(r.ratio(PathId::Safe)),
            r.target.unwrap_or(f64::NAN)
        );
    }
    if scenarios.is_empty() {
        s.push_str("- Footprint: not run (--skip-footprint).\n");
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
        "workload,k,measurement,key,path,unit,reps,median,min,max,q1,q3,ratio_to_c,target\n",
    );
    for row in rows {
        for path in PathId::ALL {
            let Some(st) = &row.cells[index(path)] else {
                continue;
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_field(row.workload.name()),
                row.k,
                csv_field(&row.label),
                row.key,
                path.name(),
                match row.unit {
                    Unit::Time => "ns",
                    Unit::Factor => "factor",
                },
                st.n,
                st.median,
                st.min,
                st.max,
                st.q1,
                st.q3,
                row.ratio(path).map(|r| r.to_string()).unwrap_or_default(),
                row.target.map(|t| t.to_string()).unwrap_or_default(),
            );
        }
    }
    s
}

/// Every sample as CSV.
pub fn samples_csv(samples: &Samples) -> String {
    // Nanoseconds, except for the *VsC metrics (factors).
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
            (PathId::Safe, 101.0),
            (PathId::Raw, 99.0),
            (PathId::C, 100.0),
        ] {
            samples.insert((w, 1, Metric::Steady, p), vec![v, v]);
        }
        let rows = rows(&samples, &[1], |_| 1000);
        let steady = rows.iter().find(|r| r.key == "steady_launch").unwrap();
        assert!((steady.ratio(PathId::Safe).unwrap() - 1.01).abs() < 1e-9);
        assert_eq!(steady.meets_target(), Some(true));
        let build = rows.iter().find(|r| r.key == "build").unwrap();
        assert_eq!(build.meets_target(), None);
        assert!(timing_table(&rows).contains("≤ 1.02 ✓"));
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
            // Medians of 120 and 100 (1.2, a miss), but round by round safe took 1.01 of C's
            // time (the median of the repetitions' ratios).
            let mut samples = Samples::new();
            for (p, v) in [(PathId::Safe, 120.0), (PathId::C, 100.0)] {
                samples.insert((w, 10, metric, p), vec![v; 3]);
                samples.insert((w, 10, Metric::Build, p), vec![v; 3]);
            }
            samples.insert((w, 10, vs_c, PathId::Safe), vec![1.00, 1.01, 1.05]);
            let rows = rows(&samples, &[10], |_| 1000);
            let row = |key| rows.iter().find(|r| r.key == key && r.workload == w);
            let paired = row(key).unwrap();
            assert!((paired.ratio(PathId::Safe).unwrap() - 1.01).abs() < 1e-9);
            assert_eq!(paired.meets_target(), Some(true), "{key}");
            // Without paired ratios (build alone), the ratio of the medians.
            let build = row("build").unwrap();
            assert!((build.ratio(PathId::Safe).unwrap() - 1.2).abs() < 1e-9);
        }
    }
}
