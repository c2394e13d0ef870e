//! The measurement loop: every workload through every path, interleaved, several repetitions.
//!
//! One repetition runs, for each k:
//! - build + instantiate cycles: for each mode, rounds in which every path builds the chain,
//!   instantiates it and destroys both (the safe path twice, with and without its lifetime
//!   checks); each path's median over the rounds is that repetition's sample. Build and
//!   instantiate take tens of microseconds at small k and vary by tens of percent from one call
//!   to the next, so one call per repetition would measure the noise;
//! - the explicit and the captured graph workload through the three paths (launches);
//! - the workload without graphs through the three paths.
//!
//! The order of the paths rotates from one round, workload and repetition to the next, so no
//! path always runs first (on a cold cache) or last. A warm-up repetition with few launches and
//! rounds comes first and is not recorded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::stats::Stats;
use crate::workload::{Counts, GraphRun, Mode, PathId, Result, Shape, StreamRun, Workloads};

/// Which workload a sample belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Workload {
    /// A graph workload built in this mode.
    Graph(Mode),
    /// The same work without a graph.
    Stream,
}

impl Workload {
    /// The name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Graph(mode) => mode.name(),
            Workload::Stream => "no graph",
        }
    }
}

/// What a sample measures. Per-launch and per-iteration metrics are totals divided by the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// Building the graph.
    Build,
    /// The safe path's lifetime check alone (`Graph::check`).
    Check,
    /// Instantiation (the safe path: with the checks).
    Instantiate,
    /// The safe path's instantiation without the checks.
    InstantiateUnchecked,
    /// Build plus instantiation with the checks, per repetition.
    BuildInstantiate,
    /// Build plus instantiation with the checks over C's in the same round (the paths of a
    /// round run back to back): per repetition, the median over its rounds. A factor.
    BuildInstantiateVsC,
    /// The first launch and a synchronize.
    FirstLaunch,
    /// Per launch, of `launches` launches and one synchronize.
    Steady,
    /// Per launch, the host time of queueing `launches` launches.
    SteadyEnqueue,
    /// Per iteration of launch + synchronize.
    LaunchSync,
    /// Launch + synchronize over C's in the same round (the paths' blocks of a round run back
    /// to back): per repetition, the median over its rounds. A factor.
    LaunchSyncVsC,
    /// Per iteration of the workload without graphs (k segments), with its share of the final
    /// synchronize.
    StreamIteration,
    /// Per iteration, the host time of queueing it.
    StreamEnqueue,
}

impl Metric {
    /// The ratio to C that is recorded round by round for this metric, if any.
    pub fn paired(self) -> Option<Metric> {
        match self {
            Metric::BuildInstantiate => Some(Metric::BuildInstantiateVsC),
            Metric::LaunchSync => Some(Metric::LaunchSyncVsC),
            _ => None,
        }
    }
}

/// Every sample, in nanoseconds, by workload, k, metric and path.
pub type Samples = BTreeMap<(Workload, u32, Metric, PathId), Vec<f64>>;

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Chain lengths.
    pub ks: Vec<u32>,
    /// Repetitions wanted.
    pub reps: usize,
    /// Launches and iterations per run (before the cap).
    pub counts: Counts,
    /// Stop adding repetitions when the next one would end after this much time.
    pub budget: Duration,
    /// At most this many segments (k × launches) per steady measurement; 0: no cap.
    pub segment_cap: u64,
    /// The kernel's shape.
    pub shape: Shape,
    /// Build + instantiate cycles per variant and repetition, at most (fewer for long chains).
    pub cycles: u32,
}

impl Plan {
    /// Build + instantiate rounds for chains of `k` segments: `cycles`, capped so that the rounds
    /// build about 20,000 segments per variant, and at least 3.
    pub fn cycle_rounds(&self, k: u32) -> u32 {
        self.cycles.min(20_000 / k.max(1)).max(3)
    }

    /// The counts for chains of `k` segments: `launches` capped so that k × launches stays
    /// within the segment cap (at least 10 launches).
    pub fn counts_for(&self, k: u32) -> Counts {
        let mut counts = self.counts;
        if self.segment_cap > 0 && u64::from(counts.launches) * u64::from(k) > self.segment_cap {
            counts.launches = (self.segment_cap / u64::from(k)).max(10) as u32;
        }
        counts
    }
}

/// What the loop measured.
#[derive(Debug)]
pub struct Outcome {
    /// The samples.
    pub samples: Samples,
    /// Repetitions recorded.
    pub reps_done: usize,
    /// Why fewer repetitions than planned were recorded, if so.
    pub stopped_early: Option<String>,
    /// Time the loop took, warm-up included.
    pub elapsed: Duration,
}

fn record_graph(samples: &mut Samples, mode: Mode, k: u32, path: PathId, c: Counts, r: &GraphRun) {
    let w = Workload::Graph(mode);
    let ns = |d: Duration| d.as_nanos() as f64;
    let mut put = |metric: Metric, value: f64| {
        samples.entry((w, k, metric, path)).or_default().push(value);
    };
    if let Some(d) = r.check {
        put(Metric::Check, ns(d));
    }
    put(Metric::FirstLaunch, ns(r.first_launch));
    let launches = f64::from(c.launches.max(1));
    put(Metric::Steady, ns(r.steady) / launches);
    put(Metric::SteadyEnqueue, ns(r.steady_enqueue) / launches);
}

fn record_stream(samples: &mut Samples, k: u32, path: PathId, iters: u32, r: &StreamRun) {
    let iters = f64::from(iters.max(1));
    let mut put = |metric: Metric, value: f64| {
        samples
            .entry((Workload::Stream, k, metric, path))
            .or_default()
            .push(value);
    };
    put(Metric::StreamIteration, r.total.as_nanos() as f64 / iters);
    put(Metric::StreamEnqueue, r.enqueue.as_nanos() as f64 / iters);
}

/// One way of instantiating in the build + instantiate cycles: a path, with or without the
/// safe path's lifetime checks.
#[derive(Clone, Copy, Debug)]
struct Variant {
    path: usize,
    checked: bool,
}

/// The median of `values` (0 when there are none).
fn median(values: &[f64]) -> f64 {
    Stats::of(values).map_or(0.0, |s| s.median)
}

/// The median over rounds of a path's time over C's in the same round.
fn median_ratio(times: &[f64], c: &[f64]) -> f64 {
    let ratios: Vec<f64> = times
        .iter()
        .zip(c)
        .filter(|(_, c)| **c > 0.0)
        .map(|(t, c)| t / c)
        .collect();
    median(&ratios)
}

/// The build + instantiate cycles of one workload: `rounds` rounds, each running every variant
/// once in an order that rotates from round to round; each variant's median over the rounds
/// becomes one sample.
fn cycles(
    paths: &mut [&mut dyn Workloads],
    mode: Mode,
    k: u32,
    shape: Shape,
    rounds: u32,
    rotation: usize,
    samples: Option<&mut Samples>,
) -> Result<()> {
    let mut variants = Vec::new();
    for (path, p) in paths.iter().enumerate() {
        variants.push(Variant {
            path,
            checked: true,
        });
        if p.has_unchecked() {
            variants.push(Variant {
                path,
                checked: false,
            });
        }
    }
    let n = variants.len();
    let mut build = vec![Vec::new(); n];
    let mut instantiate = vec![Vec::new(); n];
    let mut sum = vec![Vec::new(); n];
    for round in 0..rounds as usize {
        for v in rotated(n, rotation + round) {
            let Variant { path, checked } = variants[v];
            let run = paths[path]
                .build_instantiate(mode, k, shape, checked)
                .map_err(|e| {
                    e.context(format_args!(
                        "{} path, {}, k = {k}, build + instantiate",
                        paths[path].id().name(),
                        mode.name()
                    ))
                })?;
            let (b, i) = (
                run.build.as_nanos() as f64,
                run.instantiate.as_nanos() as f64,
            );
            build[v].push(b);
            instantiate[v].push(i);
            sum[v].push(b + i);
        }
    }
    let Some(samples) = samples else {
        return Ok(());
    };
    let w = Workload::Graph(mode);
    let c = variants
        .iter()
        .position(|v| v.checked && paths[v.path].id() == PathId::C);
    for (v, variant) in variants.iter().enumerate() {
        let id = paths[variant.path].id();
        if let Some(c) = c.filter(|_| variant.checked) {
            samples
                .entry((w, k, Metric::BuildInstantiateVsC, id))
                .or_default()
                .push(median_ratio(&sum[v], &sum[c]));
        }
        let mut put = |metric: Metric, values: &[f64]| {
            samples
                .entry((w, k, metric, id))
                .or_default()
                .push(median(values));
        };
        if variant.checked {
            put(Metric::Build, &build[v]);
            put(Metric::Instantiate, &instantiate[v]);
            put(Metric::BuildInstantiate, &sum[v]);
        } else {
            put(Metric::InstantiateUnchecked, &instantiate[v]);
        }
    }
    Ok(())
}

/// Launch + synchronize of the chains `graph_chain` left, in rounds: each round runs every path's
/// block of iterations back to back, in an order that rotates from round to round, so a round's
/// paths see the same host; `iters` iterations per path in all. A path's sample is its time per
/// iteration; its paired sample, the median over the rounds of its block's time over C's.
fn launch_sync_rounds(
    paths: &mut [&mut dyn Workloads],
    mode: Mode,
    k: u32,
    iters: u32,
    rotation: usize,
    samples: Option<&mut Samples>,
) -> Result<()> {
    let iters = iters.max(1);
    let rounds = iters.min(LAUNCH_SYNC_ROUNDS);
    let n = paths.len();
    let mut times = vec![Vec::with_capacity(rounds as usize); n];
    let mut counts = vec![0u32; n];
    for round in 0..rounds {
        // The first rounds take the remainder, so the blocks add up to `iters`.
        let block = iters / rounds + u32::from(round < iters % rounds);
        for i in rotated(n, rotation + round as usize) {
            let t = paths[i].launch_sync(block).map_err(|e| {
                e.context(format_args!(
                    "{} path, {}, k = {k}, launch + sync",
                    paths[i].id().name(),
                    mode.name()
                ))
            })?;
            times[i].push(t.as_nanos() as f64 / f64::from(block));
            counts[i] += block;
        }
    }
    let Some(samples) = samples else {
        return Ok(());
    };
    let w = Workload::Graph(mode);
    let c = paths.iter().position(|p| p.id() == PathId::C);
    for (i, path) in paths.iter().enumerate() {
        let id = path.id();
        let total: f64 = times[i].iter().sum::<f64>();
        let per_iteration = total / f64::from(rounds);
        samples
            .entry((w, k, Metric::LaunchSync, id))
            .or_default()
            .push(per_iteration);
        if let Some(c) = c.filter(|&c| c != i) {
            samples
                .entry((w, k, Metric::LaunchSyncVsC, id))
                .or_default()
                .push(median_ratio(&times[i], &times[c]));
        }
        debug_assert_eq!(counts[i], iters);
    }
    Ok(())
}

/// Rounds of launch + synchronize per repetition (fewer when there are fewer iterations).
const LAUNCH_SYNC_ROUNDS: u32 = 10;

/// The paths in the order of `rotation`.
fn rotated(n: usize, rotation: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |j| (j + rotation) % n)
}

/// One pass over every workload; records into `samples` unless it is `None` (the warm-up).
fn one_rep(
    plan: &Plan,
    paths: &mut [&mut dyn Workloads],
    rep: usize,
    warm_up: bool,
    mut samples: Option<&mut Samples>,
) -> Result<()> {
    let n = paths.len();
    for (ki, &k) in plan.ks.iter().enumerate() {
        let mut counts = plan.counts_for(k);
        if warm_up {
            counts.launches = counts.launches.min(20);
            counts.sync_iters = counts.sync_iters.min(5);
        }
        let rounds = if warm_up { 2 } else { plan.cycle_rounds(k) };
        for (mi, &mode) in Mode::ALL.iter().enumerate() {
            cycles(
                paths,
                mode,
                k,
                plan.shape,
                rounds,
                rep + ki + mi,
                samples.as_deref_mut(),
            )?;
        }
        for (mi, &mode) in Mode::ALL.iter().enumerate() {
            for i in rotated(n, rep + ki + mi) {
                let path = &mut paths[i];
                let id = path.id();
                let run = path
                    .graph_chain(mode, k, plan.shape, counts.launches)
                    .map_err(|e| {
                        e.context(format_args!("{} path, {}, k = {k}", id.name(), mode.name()))
                    })?;
                if let Some(s) = samples.as_deref_mut() {
                    record_graph(s, mode, k, id, counts, &run);
                }
            }
            let synced = launch_sync_rounds(
                paths,
                mode,
                k,
                counts.sync_iters,
                rep + ki + mi,
                samples.as_deref_mut(),
            );
            let released = paths.iter_mut().try_for_each(|p| p.release_chain());
            synced?;
            released?;
        }
        for i in rotated(n, rep + ki + 2) {
            let path = &mut paths[i];
            let id = path.id();
            let run = path
                .stream_chain(k, plan.shape, counts.launches)
                .map_err(|e| e.context(format_args!("{} path, no graph, k = {k}", id.name())))?;
            if let Some(s) = samples.as_deref_mut() {
                record_stream(s, k, id, counts.launches, &run);
            }
        }
    }
    Ok(())
}

/// Runs the plan: a warm-up, then repetitions until `plan.reps` or the time budget.
/// `after_rep` sees the samples after each repetition (to save them as it goes).
pub fn run(
    plan: &Plan,
    paths: &mut [&mut dyn Workloads],
    mut after_rep: impl FnMut(&Samples) -> Result<()>,
) -> Result<Outcome> {
    let start = Instant::now();
    eprintln!("cuda-graph-bench: warm-up");
    one_rep(plan, paths, 0, true, None)?;
    let mut samples = Samples::new();
    let mut reps_done = 0;
    let mut stopped_early = None;
    for rep in 0..plan.reps {
        let t = Instant::now();
        one_rep(plan, paths, rep, false, Some(&mut samples))?;
        reps_done += 1;
        let took = t.elapsed();
        after_rep(&samples)?;
        eprintln!(
            "cuda-graph-bench: repetition {}/{} took {:.1} s ({:.0} s so far)",
            rep + 1,
            plan.reps,
            took.as_secs_f64(),
            start.elapsed().as_secs_f64()
        );
        if reps_done < plan.reps && start.elapsed() + took > plan.budget {
            stopped_early = Some(format!(
                "stopped after {reps_done} of {} repetitions: another would pass the time budget of {} s (--budget)",
                plan.reps,
                plan.budget.as_secs()
            ));
            break;
        }
    }
    Ok(Outcome {
        samples,
        reps_done,
        stopped_early,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    use super::{Metric, Samples, Workload, launch_sync_rounds};
    use crate::workload::{CycleRun, GraphRun, Mode, PathId, Result, Shape, StreamRun, Workloads};

    /// A path whose launch + sync takes `ns` per iteration, times a host speed that changes
    /// from one round of the three paths to the next, and ten times as long in the 7th call
    /// (a hiccup of the host); `log` lists the calls.
    struct Fake {
        id: PathId,
        ns: f64,
        log: Rc<RefCell<Vec<(PathId, u32)>>>,
    }

    impl Workloads for Fake {
        fn id(&self) -> PathId {
            self.id
        }
        fn graph_chain(&mut self, _: Mode, _: u32, _: Shape, _: u32) -> Result<GraphRun> {
            unreachable!()
        }
        fn launch_sync(&mut self, iters: u32) -> Result<Duration> {
            let mut log = self.log.borrow_mut();
            let call = log.len();
            log.push((self.id, iters));
            let round = call / 3;
            let hiccup = if call == 6 { 10.0 } else { 1.0 };
            let speed = (1.0 + round as f64 * 0.5) * hiccup;
            Ok(Duration::from_nanos(
                (self.ns * f64::from(iters) * speed) as u64,
            ))
        }
        fn release_chain(&mut self) -> Result<()> {
            Ok(())
        }
        fn build_instantiate(&mut self, _: Mode, _: u32, _: Shape, _: bool) -> Result<CycleRun> {
            unreachable!()
        }
        fn stream_chain(&mut self, _: u32, _: Shape, _: u32) -> Result<StreamRun> {
            unreachable!()
        }
    }

    #[test]
    fn launch_sync_pairs_each_round_with_c() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let fake = |id, ns| Fake {
            id,
            ns,
            log: log.clone(),
        };
        let (mut safe, mut raw, mut c) = (
            fake(PathId::Safe, 1010.0),
            fake(PathId::Raw, 990.0),
            fake(PathId::C, 1000.0),
        );
        let mut paths: [&mut dyn Workloads; 3] = [&mut safe, &mut raw, &mut c];
        let mut samples = Samples::new();
        launch_sync_rounds(&mut paths, Mode::Explicit, 10, 25, 1, Some(&mut samples)).unwrap();

        let log = log.borrow();
        // 10 rounds of every path; the blocks add up to 25 iterations a path (3 + 3 + 3 + 3 + 3
        // + 2 + 2 + 2 + 2 + 2), and the first path of a round rotates.
        assert_eq!(log.len(), 30);
        for id in PathId::ALL {
            let total: u32 = log.iter().filter(|(p, _)| *p == id).map(|(_, n)| n).sum();
            assert_eq!(total, 25, "{id:?}");
        }
        let firsts: Vec<PathId> = log.chunks(3).map(|round| round[0].0).collect();
        assert_eq!(firsts[..3], [PathId::Raw, PathId::C, PathId::Safe]);

        // The host's speed changes 5-fold over the rounds, and one block of the safe path (the
        // 7th call: round 2 starts with it) took ten times as long; the paired ratio does not
        // see either.
        let w = Workload::Graph(Mode::Explicit);
        let ratio = samples[&(w, 10, Metric::LaunchSyncVsC, PathId::Safe)][0];
        assert!((ratio - 1.01).abs() < 1e-3, "{ratio}");
        let ratio = samples[&(w, 10, Metric::LaunchSyncVsC, PathId::Raw)][0];
        assert!((ratio - 0.99).abs() < 1e-3, "{ratio}");
        assert!(!samples.contains_key(&(w, 10, Metric::LaunchSyncVsC, PathId::C)));
        // Per iteration: the mean over the rounds of the block's time per iteration.
        let raw = samples[&(w, 10, Metric::LaunchSync, PathId::Raw)][0];
        assert!((raw - 990.0 * 3.25).abs() < 1.0, "{raw}");
    }
}
