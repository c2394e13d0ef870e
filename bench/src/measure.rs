//! The measurement loop: every workload through every path, interleaved, several repetitions.
//!
//! One repetition runs, for each k:
//! - build + instantiate cycles: for the explicit and the captured chain, rounds in which every
//!   path builds the chain, instantiates it and destroys both (the safe path twice, with and
//!   without its lifetime checks); each path's median over the rounds is that repetition's
//!   sample. Build and instantiate take tens of microseconds at small k and vary by tens of
//!   percent from one call to the next, so one call per repetition would measure the noise;
//! - the kernel chain's update steps: rounds in which every path builds a chain of k kernel nodes
//!   (no memory nodes) with new values, updates its executable graph in place from it, builds it
//!   again and instantiates that graph, then launches the updated executable graph and checks
//!   the result; each path's median over the rounds is that repetition's sample, and so is the
//!   median over the rounds of its instantiation over its update;
//! - the explicit and the captured graph workload, and the escaping one (its allocations outlive
//!   each launch: the safe API's slow launch path), through the three paths (launches);
//! - the workload without graphs through the three paths.
//!
//! The order of the paths rotates from one round, workload and repetition to the next, forward
//! and backward ([`rotated`]), so no path always runs first (on a cold cache) or last, and each
//! path runs before each other as often as after it. A warm-up repetition with few launches and
//! rounds comes first and is not recorded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::stats::Stats;
use crate::workload::{
    Counts, GraphRun, Mode, PathId, Result, Shape, SteadyRun, StreamRun, UpdateRun, Workloads,
};

/// Which workload a sample belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Workload {
    /// A graph workload built in this mode.
    Graph(Mode),
    /// The same work without a graph.
    Stream,
    /// A chain of kernel nodes without memory nodes, updated in place at every step
    /// ([`Workloads::update_step`]).
    Update,
}

impl Workload {
    /// The name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Graph(mode) => mode.name(),
            Workload::Stream => "no graph",
            Workload::Update => "kernel chain",
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
    /// Steady launch over C's in the same round: per repetition, the median over its rounds.
    /// A factor.
    SteadyVsC,
    /// Per launch, the host time of queueing `launches` launches.
    SteadyEnqueue,
    /// Launch enqueue over C's in the same round: per repetition, the median over its rounds.
    /// A factor.
    SteadyEnqueueVsC,
    /// Launch enqueue over the raw path's in the same round: per repetition, the median over
    /// its rounds. A factor.
    SteadyEnqueueVsRaw,
    /// Launch enqueue minus the raw path's in the same round, per launch: per repetition, the
    /// median over its rounds. Nanoseconds; what the layer above the driver adds.
    SteadyEnqueueOverRaw,
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
    /// The kernel chain: updating the executable graph in place from the step's new graph.
    Update,
    /// The build over the raw path's in the same round: per repetition, the median over its
    /// rounds. A factor.
    BuildVsRaw,
    /// Update over C's in the same round: per repetition, the median over its rounds. A factor.
    UpdateVsC,
    /// Update over the raw path's in the same round, the same way. A factor.
    UpdateVsRaw,
    /// The kernel chain: instantiating a graph built as the step's new graph.
    UpdateInstantiate,
    /// That instantiation over C's in the same round, the same way. A factor.
    UpdateInstantiateVsC,
    /// That instantiation over the raw path's in the same round, the same way. A factor.
    UpdateInstantiateVsRaw,
    /// The kernel chain: a path's instantiation over its own update in the same step (how many
    /// times faster the update is): per repetition, the median over its rounds. A factor.
    UpdateSpeedup,
}

impl Metric {
    /// The ratio to C that is recorded round by round for this metric, if any.
    pub fn paired(self) -> Option<Metric> {
        match self {
            Metric::BuildInstantiate => Some(Metric::BuildInstantiateVsC),
            Metric::Steady => Some(Metric::SteadyVsC),
            Metric::SteadyEnqueue => Some(Metric::SteadyEnqueueVsC),
            Metric::LaunchSync => Some(Metric::LaunchSyncVsC),
            Metric::Update => Some(Metric::UpdateVsC),
            Metric::UpdateInstantiate => Some(Metric::UpdateInstantiateVsC),
            _ => None,
        }
    }

    /// The ratio to the raw path that is recorded round by round for this metric, if any.
    pub fn paired_raw(self) -> Option<Metric> {
        match self {
            Metric::Build => Some(Metric::BuildVsRaw),
            Metric::SteadyEnqueue => Some(Metric::SteadyEnqueueVsRaw),
            Metric::Update => Some(Metric::UpdateVsRaw),
            Metric::UpdateInstantiate => Some(Metric::UpdateInstantiateVsRaw),
            _ => None,
        }
    }

    /// The difference to the raw path that is recorded round by round for this metric, if any.
    pub fn over_raw(self) -> Option<Metric> {
        match self {
            Metric::SteadyEnqueue => Some(Metric::SteadyEnqueueOverRaw),
            _ => None,
        }
    }
}

/// Every sample, in nanoseconds, by workload, k, metric and path.
pub type Samples = BTreeMap<(Workload, u32, Metric, PathId), Vec<f64>>;

/// Segments launched in the steady rounds of one workload and repetition, at most (beyond the
/// first round).
const STEADY_SEGMENTS: u64 = 1_000_000;

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
    /// Build + instantiate cycles per variant and repetition, at most (fewer for long chains);
    /// also the kernel chain's update steps per path and repetition.
    pub cycles: u32,
    /// Only the kernel chain's update steps (no other workload).
    pub update_only: bool,
}

impl Plan {
    /// Steady launch rounds for chains of `k` segments launched `launches` times a round: up
    /// to 5, as far as they launch at most a million segments a repetition (one round at
    /// k = 1000, where a round of 1000 launches takes about a second).
    pub fn steady_rounds(&self, k: u32, launches: u32) -> u32 {
        let per_round = u64::from(k.max(1)) * u64::from(launches.max(1));
        (STEADY_SEGMENTS / per_round).clamp(1, 5) as u32
    }

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

fn record_graph(samples: &mut Samples, mode: Mode, k: u32, path: PathId, r: &GraphRun) {
    let w = Workload::Graph(mode);
    let ns = |d: Duration| d.as_nanos() as f64;
    let mut put = |metric: Metric, value: f64| {
        samples.entry((w, k, metric, path)).or_default().push(value);
    };
    if let Some(d) = r.check {
        put(Metric::Check, ns(d));
    }
    put(Metric::FirstLaunch, ns(r.first_launch));
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

/// The median over rounds of a path's time minus the reference's in the same round.
fn median_difference(times: &[f64], reference: &[f64]) -> f64 {
    let differences: Vec<f64> = times.iter().zip(reference).map(|(t, r)| t - r).collect();
    median(&differences)
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
    let of = |path: PathId| {
        variants
            .iter()
            .position(|v| v.checked && paths[v.path].id() == path)
    };
    let (c, raw) = (of(PathId::C), of(PathId::Raw));
    for (v, variant) in variants.iter().enumerate() {
        let id = paths[variant.path].id();
        if let Some(c) = c.filter(|_| variant.checked) {
            samples
                .entry((w, k, Metric::BuildInstantiateVsC, id))
                .or_default()
                .push(median_ratio(&sum[v], &sum[c]));
        }
        if let Some(raw) = raw.filter(|&r| variant.checked && r != v) {
            samples
                .entry((w, k, Metric::BuildVsRaw, id))
                .or_default()
                .push(median_ratio(&build[v], &build[raw]));
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

/// The kernel chain's update steps at one k: every path sets up its chain
/// ([`Workloads::update_chain`]), then `rounds` rounds each run every path's next step
/// ([`Workloads::update_step`], steps 1, 2, ...) in an order that rotates from round to round;
/// every path releases its chain, also after an error. Each path's median over the rounds of
/// the build, the update and the instantiation becomes one sample, and so do the medians over
/// the rounds of its update and instantiation over C's and the raw path's in the same round
/// and of its instantiation over its update in the same step.
fn update_cycles(
    paths: &mut [&mut dyn Workloads],
    k: u32,
    shape: Shape,
    rounds: u32,
    rotation: usize,
    samples: Option<&mut Samples>,
) -> Result<()> {
    let what =
        |id: PathId, step: &str| format!("{} path, kernel chain, k = {k}, {step}", id.name());
    let n = paths.len();
    let mut runs: Vec<Vec<UpdateRun>> = vec![Vec::with_capacity(rounds as usize); n];
    let mut measured = || -> Result<()> {
        for i in rotated(n, rotation) {
            let id = paths[i].id();
            paths[i]
                .update_chain(k, shape)
                .map_err(|e| e.context(what(id, "set-up")))?;
        }
        for round in 0..rounds {
            let step = round + 1;
            for i in rotated(n, rotation + round as usize) {
                let id = paths[i].id();
                let run = paths[i]
                    .update_step(step)
                    .map_err(|e| e.context(what(id, &format!("update step {step}"))))?;
                runs[i].push(run);
            }
        }
        Ok(())
    };
    let measured = measured();
    let released = paths.iter_mut().try_for_each(|p| {
        let id = p.id();
        p.release_update()
            .map_err(|e| e.context(what(id, "release")))
    });
    measured?;
    released?;
    let Some(samples) = samples else {
        return Ok(());
    };
    let ns = |f: fn(&UpdateRun) -> Duration| -> Vec<Vec<f64>> {
        runs.iter()
            .map(|r| r.iter().map(|run| f(run).as_nanos() as f64).collect())
            .collect()
    };
    let (build, update, instantiate) = (ns(|r| r.build), ns(|r| r.update), ns(|r| r.instantiate));
    let ids: Vec<PathId> = paths.iter().map(|p| p.id()).collect();
    let position = |path: PathId| ids.iter().position(|&id| id == path);
    let (c, raw) = (position(PathId::C), position(PathId::Raw));
    let w = Workload::Update;
    for (i, &id) in ids.iter().enumerate() {
        let mut put = |m: Metric, value: f64| samples.entry((w, k, m, id)).or_default().push(value);
        put(Metric::Build, median(&build[i]));
        put(Metric::Update, median(&update[i]));
        put(Metric::UpdateInstantiate, median(&instantiate[i]));
        put(
            Metric::UpdateSpeedup,
            median_ratio(&instantiate[i], &update[i]),
        );
        for (metric, times) in [
            (Metric::Update, &update),
            (Metric::UpdateInstantiate, &instantiate),
        ] {
            if let (Some(vs_c), Some(c)) = (metric.paired(), c.filter(|&c| c != i)) {
                put(vs_c, median_ratio(&times[i], &times[c]));
            }
            if let (Some(vs_raw), Some(raw)) = (metric.paired_raw(), raw.filter(|&r| r != i)) {
                put(vs_raw, median_ratio(&times[i], &times[raw]));
            }
        }
    }
    Ok(())
}

/// Runs `rounds` rounds on the chains `graph_chain` left: each round runs `block` once for
/// every path, back to back, in an order that rotates from round to round, so the paths of a
/// round see the same host. `block` gets the path and the round and returns its figures; the
/// result holds them by path, then round. `what` names the measurement in errors.
fn in_rounds<T>(
    paths: &mut [&mut dyn Workloads],
    rounds: u32,
    rotation: usize,
    what: impl Fn(PathId) -> String,
    mut block: impl FnMut(&mut dyn Workloads, u32) -> Result<T>,
) -> Result<Vec<Vec<T>>> {
    let n = paths.len();
    let mut out: Vec<Vec<T>> = (0..n)
        .map(|_| Vec::with_capacity(rounds as usize))
        .collect();
    for round in 0..rounds {
        for i in rotated(n, rotation + round as usize) {
            let id = paths[i].id();
            out[i].push(block(&mut *paths[i], round).map_err(|e| e.context(what(id)))?);
        }
    }
    Ok(out)
}

/// Records, for each path, the mean of its per-round figures under `metric` and the medians over
/// the rounds of what `metric` pairs round by round: for all but C, its figure over C's
/// ([`Metric::paired`]); for all but the raw path, its figure over the raw path's
/// ([`Metric::paired_raw`]) and minus it ([`Metric::over_raw`]).
fn record_rounds(
    samples: &mut Samples,
    key: (Workload, u32),
    ids: &[PathId],
    per_round: &[Vec<f64>],
    metric: Metric,
) {
    let (w, k) = key;
    let position = |path: PathId| ids.iter().position(|&id| id == path);
    let (c, raw) = (position(PathId::C), position(PathId::Raw));
    for (i, &id) in ids.iter().enumerate() {
        let values = &per_round[i];
        let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
        let mut put = |m: Metric, value: f64| samples.entry((w, k, m, id)).or_default().push(value);
        put(metric, mean);
        if let (Some(vs_c), Some(c)) = (metric.paired(), c.filter(|&c| c != i)) {
            put(vs_c, median_ratio(values, &per_round[c]));
        }
        if let Some(raw) = raw.filter(|&r| r != i) {
            if let Some(vs_raw) = metric.paired_raw() {
                put(vs_raw, median_ratio(values, &per_round[raw]));
            }
            if let Some(over) = metric.over_raw() {
                put(over, median_difference(values, &per_round[raw]));
            }
        }
    }
}

/// Steady launch and launch + synchronize of the chains `graph_chain` left, in rounds
/// ([`in_rounds`]): `steady_rounds` rounds of `launches` launches and one synchronize each, then
/// 10 rounds (fewer when there are fewer iterations) that add up to `sync_iters` iterations of
/// launch + synchronize. A path's samples are its means per launch or iteration, its paired
/// samples the medians over the rounds of its time over C's (and, for the enqueue, over and
/// minus the raw path's).
fn launch_rounds(
    paths: &mut [&mut dyn Workloads],
    (mode, k): (Mode, u32),
    counts: Counts,
    steady_rounds: u32,
    rotation: usize,
    samples: Option<&mut Samples>,
) -> Result<()> {
    let what = |name: &'static str| {
        move |id: PathId| format!("{} path, {}, k = {k}, {name}", id.name(), mode.name())
    };
    let launches = counts.launches.max(1);
    let steady = in_rounds(
        paths,
        steady_rounds.max(1),
        rotation,
        what("steady launch"),
        |p, _| p.steady(launches),
    )?;
    let iters = counts.sync_iters.max(1);
    let rounds = iters.min(LAUNCH_SYNC_ROUNDS);
    // The first rounds take the remainder, so the blocks add up to `iters`.
    let block = |round: u32| iters / rounds + u32::from(round < iters % rounds);
    let synced = in_rounds(
        paths,
        rounds,
        rotation,
        what("launch + sync"),
        |p, round| {
            let n = block(round);
            Ok(p.launch_sync(n)?.as_nanos() as f64 / f64::from(n))
        },
    )?;
    let Some(samples) = samples else {
        return Ok(());
    };
    let ids: Vec<PathId> = paths.iter().map(|p| p.id()).collect();
    let key = (Workload::Graph(mode), k);
    let per_launch = |f: fn(&SteadyRun) -> Duration| -> Vec<Vec<f64>> {
        steady
            .iter()
            .map(|runs| {
                runs.iter()
                    .map(|r| f(r).as_nanos() as f64 / f64::from(launches))
                    .collect()
            })
            .collect()
    };
    let totals = per_launch(|r| r.total);
    let enqueues = per_launch(|r| r.enqueue);
    record_rounds(samples, key, &ids, &totals, Metric::Steady);
    record_rounds(samples, key, &ids, &enqueues, Metric::SteadyEnqueue);
    record_rounds(samples, key, &ids, &synced, Metric::LaunchSync);
    Ok(())
}

/// Rounds of launch + synchronize per repetition (fewer when there are fewer iterations).
const LAUNCH_SYNC_ROUNDS: u32 = 10;

/// The paths in the order of `rotation`: rotations `2m` and `2m + 1` start from path `m % n`
/// and run forward and backward, so that over any two consecutive rotations beginning at an
/// even one, each path runs before each other path as often as after it. (A rotation alone
/// does not: with three paths, path 0 runs before path 2 in only one rotation of three, so
/// anything that slows the later paths of a round would count against path 2 in every ratio
/// to path 0.)
fn rotated(n: usize, rotation: usize) -> impl Iterator<Item = usize> {
    let start = rotation / 2;
    let backward = rotation % 2 == 1;
    (0..n).map(move |j| (if backward { n - 1 - j } else { j } + start) % n)
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
        update_cycles(
            paths,
            k,
            plan.shape,
            rounds,
            rep + ki,
            samples.as_deref_mut(),
        )?;
        if plan.update_only {
            continue;
        }
        for (mi, &mode) in Mode::FREED.iter().enumerate() {
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
        let steady_rounds = if warm_up {
            1
        } else {
            plan.steady_rounds(k, counts.launches)
        };
        for (mi, &mode) in Mode::ALL.iter().enumerate() {
            for i in rotated(n, rep + ki + mi) {
                let path = &mut paths[i];
                let id = path.id();
                let run = path.graph_chain(mode, k, plan.shape).map_err(|e| {
                    e.context(format_args!("{} path, {}, k = {k}", id.name(), mode.name()))
                })?;
                if let Some(s) = samples.as_deref_mut() {
                    record_graph(s, mode, k, id, &run);
                }
            }
            let launched = launch_rounds(
                paths,
                (mode, k),
                counts,
                steady_rounds,
                rep + ki + mi,
                samples.as_deref_mut(),
            );
            let released = paths.iter_mut().try_for_each(|p| p.release_chain());
            launched?;
            released?;
        }
        for i in rotated(n, rep + ki + Mode::ALL.len()) {
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

    use super::{Metric, Plan, Samples, Workload, launch_rounds, one_rep, rotated, update_cycles};
    use crate::workload::{
        BenchError, Counts, CycleRun, GraphRun, Mode, PathId, Result, Shape, SteadyRun, StreamRun,
        UpdateRun, Workloads,
    };

    /// Every order holds every path once; over two consecutive rotations from an even one, each
    /// path runs before each other path exactly as often as after it, and over `2n` of them
    /// each path runs first twice.
    #[test]
    fn rotations_are_balanced_in_pairs() {
        for n in 1..=5 {
            for from in (0..12).step_by(2) {
                let mut before = vec![vec![0i32; n]; n];
                let mut first = vec![0; n];
                for rotation in from..from + 2 * n {
                    let order: Vec<usize> = rotated(n, rotation).collect();
                    let mut sorted = order.clone();
                    sorted.sort_unstable();
                    assert_eq!(
                        sorted,
                        (0..n).collect::<Vec<_>>(),
                        "n = {n}, rotation {rotation}"
                    );
                    first[order[0]] += 1;
                    for (i, &a) in order.iter().enumerate() {
                        for &b in &order[i + 1..] {
                            before[a][b] += 1;
                            before[b][a] -= 1;
                        }
                    }
                    if rotation % 2 == 1 {
                        assert!(
                            before.iter().flatten().all(|&d| d == 0),
                            "n = {n}, rotations {from}..={rotation}: {before:?}"
                        );
                    }
                }
                assert!(first.iter().all(|&f| f == 2), "n = {n}: firsts {first:?}");
            }
        }
    }

    /// A path whose launches take `ns` each, times a host speed that changes from one round of
    /// the three paths to the next, and ten times as long in call `hiccup` (counted over all
    /// paths and both measurements); `log` lists the calls: path, steady or not, count.
    struct Fake {
        id: PathId,
        ns: f64,
        hiccup: usize,
        log: Rc<RefCell<Vec<(PathId, bool, u32)>>>,
    }

    impl Fake {
        fn time(&self, steady: bool, n: u32) -> Duration {
            let mut log = self.log.borrow_mut();
            let call = log.len();
            log.push((self.id, steady, n));
            let hiccup = if call == self.hiccup { 10.0 } else { 1.0 };
            let speed = (1.0 + (call / 3) as f64 * 0.5) * hiccup;
            Duration::from_nanos((self.ns * f64::from(n) * speed) as u64)
        }
    }

    impl Workloads for Fake {
        fn id(&self) -> PathId {
            self.id
        }
        fn graph_chain(&mut self, _: Mode, _: u32, _: Shape) -> Result<GraphRun> {
            unreachable!()
        }
        fn steady(&mut self, launches: u32) -> Result<SteadyRun> {
            let total = self.time(true, launches);
            Ok(SteadyRun {
                enqueue: total / 2,
                total,
            })
        }
        fn launch_sync(&mut self, iters: u32) -> Result<Duration> {
            Ok(self.time(false, iters))
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
        fn update_chain(&mut self, _: u32, _: Shape) -> Result<()> {
            unreachable!()
        }
        fn update_step(&mut self, _: u32) -> Result<UpdateRun> {
            unreachable!()
        }
        fn release_update(&mut self) -> Result<()> {
            unreachable!()
        }
    }

    #[test]
    fn launches_pair_each_round_with_c() {
        let log = Rc::new(RefCell::new(Vec::new()));
        // Calls 0-8: 3 steady rounds; 9-38: 10 launch + sync rounds. Call 15 is the first of
        // launch + sync round 2, the safe path's.
        let fake = |id, ns| Fake {
            id,
            ns,
            hiccup: 15,
            log: log.clone(),
        };
        let (mut safe, mut raw, mut c) = (
            fake(PathId::Safe, 1010.0),
            fake(PathId::Raw, 990.0),
            fake(PathId::C, 1000.0),
        );
        let mut paths: [&mut dyn Workloads; 3] = [&mut safe, &mut raw, &mut c];
        let mut samples = Samples::new();
        let counts = Counts {
            launches: 100,
            sync_iters: 25,
        };
        let key = (Mode::Explicit, 10);
        launch_rounds(&mut paths, key, counts, 3, 1, Some(&mut samples)).unwrap();

        let log = log.borrow();
        assert_eq!(log.len(), 39);
        assert!(log[..9].iter().all(|&(_, steady, n)| steady && n == 100));
        // 10 rounds of launch + sync; the blocks add up to 25 iterations a path (3 + 3 + 3 + 3
        // + 3 + 2 + 2 + 2 + 2 + 2), and the first path of a round rotates (forward, then backward).
        for id in PathId::ALL {
            let mine = log[9..].iter().filter(|(p, steady, _)| *p == id && !steady);
            assert_eq!(mine.map(|(_, _, n)| n).sum::<u32>(), 25, "{id:?}");
        }
        let firsts: Vec<PathId> = log[9..].chunks(3).map(|round| round[0].0).collect();
        assert_eq!(firsts[..3], [PathId::C, PathId::Raw, PathId::Safe]);
        assert_eq!(log[15].0, PathId::Safe);

        // The host's speed changes several-fold over the rounds and one block of the safe path
        // took ten times as long; the paired ratios see neither.
        let w = Workload::Graph(Mode::Explicit);
        let get = |m, p| samples[&(w, 10, m, p)][0];
        for (m, p, want) in [
            (Metric::SteadyVsC, PathId::Safe, 1.01),
            (Metric::SteadyVsC, PathId::Raw, 0.99),
            (Metric::LaunchSyncVsC, PathId::Safe, 1.01),
            (Metric::LaunchSyncVsC, PathId::Raw, 0.99),
        ] {
            assert!(
                (get(m, p) - want).abs() < 1e-3,
                "{m:?} {p:?}: {}",
                get(m, p)
            );
        }
        assert!(!samples.contains_key(&(w, 10, Metric::LaunchSyncVsC, PathId::C)));
        // The enqueue (half of each steady time here) paired with the raw path's as well: the
        // ratio sees no drift; the difference per launch is the median over the rounds (speeds
        // 1, 1.5, 2: safe 10, 15, 20 ns over raw; C 5, 7.5, 10).
        for (m, p, want) in [
            (Metric::SteadyEnqueueVsC, PathId::Safe, 1.01),
            (Metric::SteadyEnqueueVsRaw, PathId::Safe, 1010.0 / 990.0),
            (Metric::SteadyEnqueueVsRaw, PathId::C, 1000.0 / 990.0),
            (Metric::SteadyEnqueueOverRaw, PathId::Safe, 15.0),
            (Metric::SteadyEnqueueOverRaw, PathId::C, 7.5),
        ] {
            assert!(
                (get(m, p) - want).abs() < 1e-3,
                "{m:?} {p:?}: {}",
                get(m, p)
            );
        }
        for m in [Metric::SteadyEnqueueVsRaw, Metric::SteadyEnqueueOverRaw] {
            assert!(!samples.contains_key(&(w, 10, m, PathId::Raw)), "{m:?}");
        }
        // Only the enqueue is paired with the raw path: one ratio and one difference for each
        // of safe and C.
        let with_raw = samples
            .keys()
            .filter(|key| {
                matches!(
                    key.2,
                    Metric::SteadyEnqueueVsRaw | Metric::SteadyEnqueueOverRaw
                )
            })
            .count();
        assert_eq!(with_raw, 4);
        // Per launch or iteration: the mean over the rounds (speeds 1, 1.5, 2 for steady
        // launch; 2.5 to 7 for launch + sync).
        assert!((get(Metric::Steady, PathId::Safe) - 1010.0 * 1.5).abs() < 1.0);
        assert!((get(Metric::SteadyEnqueue, PathId::Safe) - 505.0 * 1.5).abs() < 1.0);
        assert!((get(Metric::LaunchSync, PathId::Raw) - 990.0 * 4.75).abs() < 1.0);
    }

    /// The calls a [`Logger`] saw: path, call, chain.
    type CallLog = Rc<RefCell<Vec<(PathId, &'static str, Option<Mode>)>>>;

    /// A path that times nothing and logs which chains it was asked for.
    struct Logger {
        id: PathId,
        log: CallLog,
        kept: Option<Mode>,
    }

    impl Logger {
        fn note(&self, what: &'static str, mode: Option<Mode>) {
            self.log.borrow_mut().push((self.id, what, mode));
        }
    }

    impl Workloads for Logger {
        fn id(&self) -> PathId {
            self.id
        }
        fn graph_chain(&mut self, mode: Mode, _: u32, _: Shape) -> Result<GraphRun> {
            self.note("graph_chain", Some(mode));
            self.kept = Some(mode);
            Ok(GraphRun::default())
        }
        fn steady(&mut self, _: u32) -> Result<SteadyRun> {
            self.note("steady", self.kept);
            Ok(SteadyRun {
                enqueue: Duration::from_micros(1),
                total: Duration::from_micros(2),
            })
        }
        fn launch_sync(&mut self, _: u32) -> Result<Duration> {
            self.note("launch_sync", self.kept);
            Ok(Duration::from_micros(3))
        }
        fn release_chain(&mut self) -> Result<()> {
            let kept = self.kept.take();
            self.note("release_chain", kept);
            Ok(())
        }
        fn build_instantiate(&mut self, mode: Mode, _: u32, _: Shape, _: bool) -> Result<CycleRun> {
            self.note("build_instantiate", Some(mode));
            Ok(CycleRun::default())
        }
        fn stream_chain(&mut self, _: u32, _: Shape, _: u32) -> Result<StreamRun> {
            self.note("stream_chain", None);
            Ok(StreamRun::default())
        }
        fn update_chain(&mut self, _: u32, _: Shape) -> Result<()> {
            self.note("update_chain", None);
            Ok(())
        }
        fn update_step(&mut self, _: u32) -> Result<UpdateRun> {
            self.note("update_step", None);
            Ok(UpdateRun {
                build: Duration::from_micros(1),
                update: Duration::from_micros(1),
                instantiate: Duration::from_micros(4),
            })
        }
        fn release_update(&mut self) -> Result<()> {
            self.note("release_update", None);
            Ok(())
        }
    }

    #[test]
    fn the_escaping_chain_is_launched_and_released_but_not_cycled() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let logger = |id| Logger {
            id,
            log: log.clone(),
            kept: None,
        };
        let (mut safe, mut raw, mut c) =
            (logger(PathId::Safe), logger(PathId::Raw), logger(PathId::C));
        let mut paths: [&mut dyn Workloads; 3] = [&mut safe, &mut raw, &mut c];
        let plan = Plan {
            ks: vec![1],
            reps: 1,
            counts: Counts {
                launches: 10,
                sync_iters: 2,
            },
            budget: Duration::from_secs(1),
            segment_cap: 0,
            shape: Shape {
                elements: 1,
                grid: 1,
                block: 1,
            },
            cycles: 3,
            update_only: false,
        };
        let mut samples = Samples::new();
        one_rep(&plan, &mut paths, 0, false, Some(&mut samples)).unwrap();

        let log = log.borrow();
        let modes = |what: &str| -> Vec<Mode> {
            let mut m: Vec<Mode> = log
                .iter()
                .filter(|(_, w, _)| *w == what)
                .filter_map(|(_, _, mode)| *mode)
                .collect();
            m.dedup();
            m.sort();
            m.dedup();
            m
        };
        assert_eq!(modes("build_instantiate"), Mode::FREED);
        assert_eq!(modes("graph_chain"), Mode::ALL);
        assert_eq!(modes("steady"), Mode::ALL);
        assert_eq!(modes("release_chain"), Mode::ALL);
        // Every path's chain is released after its launches, before the next chain.
        for id in PathId::ALL {
            let mine: Vec<_> = log
                .iter()
                .filter(|(p, w, _)| *p == id && (*w == "graph_chain" || *w == "release_chain"))
                .map(|(_, w, m)| (*w, *m))
                .collect();
            let want: Vec<_> = Mode::ALL
                .iter()
                .flat_map(|&m| [("graph_chain", Some(m)), ("release_chain", Some(m))])
                .collect();
            assert_eq!(mine, want, "{id:?}");
        }
        // The kernel chain: set up, 3 steps (the cycles' rounds) and released, by every path.
        for id in PathId::ALL {
            let calls: Vec<&str> = log
                .iter()
                .filter(|(p, w, _)| *p == id && w.contains("update"))
                .map(|(_, w, _)| *w)
                .collect();
            assert_eq!(
                calls,
                [
                    "update_chain",
                    "update_step",
                    "update_step",
                    "update_step",
                    "release_update"
                ],
                "{id:?}"
            );
            let speedup = &samples[&(Workload::Update, 1, Metric::UpdateSpeedup, id)];
            assert_eq!(speedup, &[4.0], "{id:?}");
        }
        // The build is paired with the raw path's, round by round, for safe and C.
        for mode in Mode::FREED {
            let w = Workload::Graph(mode);
            for (path, paired) in [
                (PathId::Safe, true),
                (PathId::C, true),
                (PathId::Raw, false),
            ] {
                assert_eq!(
                    samples.contains_key(&(w, 1, Metric::BuildVsRaw, path)),
                    paired,
                    "{mode:?} {path:?}"
                );
            }
        }
        let w = Workload::Graph(Mode::Escaping);
        for (metric, path) in [
            (Metric::Steady, PathId::Safe),
            (Metric::SteadyEnqueueVsRaw, PathId::Safe),
            (Metric::SteadyEnqueueOverRaw, PathId::C),
            (Metric::LaunchSyncVsC, PathId::Raw),
        ] {
            assert!(
                samples.contains_key(&(w, 1, metric, path)),
                "{metric:?} {path:?}"
            );
        }
        assert!(
            !samples
                .keys()
                .any(|key| key.0 == w && key.2 == Metric::BuildInstantiate)
        );
    }

    #[test]
    fn update_only_runs_the_kernel_chain_alone() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let logger = |id| Logger {
            id,
            log: log.clone(),
            kept: None,
        };
        let (mut safe, mut raw, mut c) =
            (logger(PathId::Safe), logger(PathId::Raw), logger(PathId::C));
        let mut paths: [&mut dyn Workloads; 3] = [&mut safe, &mut raw, &mut c];
        let plan = Plan {
            ks: vec![1, 10],
            reps: 1,
            counts: Counts {
                launches: 10,
                sync_iters: 2,
            },
            budget: Duration::from_secs(1),
            segment_cap: 0,
            shape: Shape {
                elements: 1,
                grid: 1,
                block: 1,
            },
            cycles: 3,
            update_only: true,
        };
        let mut samples = Samples::new();
        one_rep(&plan, &mut paths, 0, false, Some(&mut samples)).unwrap();
        assert!(log.borrow().iter().all(|(_, w, _)| w.contains("update")));
        assert_eq!(log.borrow().len(), 2 * 3 * 5);
        assert!(samples.keys().all(|key| key.0 == Workload::Update));
        assert!(samples.contains_key(&(Workload::Update, 10, Metric::UpdateVsC, PathId::Safe)));
    }

    /// The calls an [`Updater`] saw: path, call, step.
    type UpdateLog = Rc<RefCell<Vec<(PathId, &'static str, u32)>>>;

    /// A path whose update steps take `update` ns and its instantiations `instantiate` ns,
    /// times a host speed that changes from one round of the three paths to the next; it fails
    /// at step `fail_at`, and logs its calls (path, call, step).
    struct Updater {
        id: PathId,
        update: f64,
        instantiate: f64,
        fail_at: Option<u32>,
        log: UpdateLog,
    }

    impl Workloads for Updater {
        fn id(&self) -> PathId {
            self.id
        }
        fn graph_chain(&mut self, _: Mode, _: u32, _: Shape) -> Result<GraphRun> {
            unreachable!()
        }
        fn steady(&mut self, _: u32) -> Result<SteadyRun> {
            unreachable!()
        }
        fn launch_sync(&mut self, _: u32) -> Result<Duration> {
            unreachable!()
        }
        fn release_chain(&mut self) -> Result<()> {
            unreachable!()
        }
        fn build_instantiate(&mut self, _: Mode, _: u32, _: Shape, _: bool) -> Result<CycleRun> {
            unreachable!()
        }
        fn stream_chain(&mut self, _: u32, _: Shape, _: u32) -> Result<StreamRun> {
            unreachable!()
        }
        fn update_chain(&mut self, _: u32, _: Shape) -> Result<()> {
            self.log.borrow_mut().push((self.id, "update_chain", 0));
            Ok(())
        }
        fn update_step(&mut self, step: u32) -> Result<UpdateRun> {
            self.log.borrow_mut().push((self.id, "update_step", step));
            if self.fail_at == Some(step) {
                return Err(BenchError("wrong result".into()));
            }
            let speed = f64::from(step);
            let ns = |v: f64| Duration::from_nanos((v * speed) as u64);
            Ok(UpdateRun {
                build: ns(2.0 * self.instantiate),
                update: ns(self.update),
                instantiate: ns(self.instantiate),
            })
        }
        fn release_update(&mut self) -> Result<()> {
            self.log.borrow_mut().push((self.id, "release_update", 0));
            Ok(())
        }
    }

    #[test]
    fn update_steps_pair_each_round_and_give_each_path_its_speedup() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let updater = |id, update, instantiate| Updater {
            id,
            update,
            instantiate,
            fail_at: None,
            log: log.clone(),
        };
        let (mut safe, mut raw, mut c) = (
            updater(PathId::Safe, 1_020.0, 4_000.0),
            updater(PathId::Raw, 1_000.0, 3_900.0),
            updater(PathId::C, 1_000.0, 4_100.0),
        );
        let mut paths: [&mut dyn Workloads; 3] = [&mut safe, &mut raw, &mut c];
        let shape = Shape {
            elements: 1,
            grid: 1,
            block: 1,
        };
        let mut samples = Samples::new();
        update_cycles(&mut paths, 1000, shape, 4, 0, Some(&mut samples)).unwrap();

        // Set-up, steps 1 to 4 of every path (rotating), release.
        let log = log.borrow();
        assert_eq!(log.len(), 3 + 12 + 3);
        assert!(log[..3].iter().all(|e| e.1 == "update_chain"));
        assert!(log[15..].iter().all(|e| e.1 == "release_update"));
        for (round, calls) in log[3..15].chunks(3).enumerate() {
            assert!(
                calls
                    .iter()
                    .all(|e| e.1 == "update_step" && e.2 == round as u32 + 1)
            );
        }
        let firsts: Vec<PathId> = log[3..15].chunks(3).map(|r| r[0].0).collect();
        assert_eq!(firsts[..3], [PathId::Safe, PathId::C, PathId::Raw]);

        // The host's speed changes four-fold over the rounds; paired ratios and speed-ups do not
        // see it, the medians of the times do.
        let w = Workload::Update;
        let get = |m, p| samples[&(w, 1000, m, p)][0];
        for (m, p, want) in [
            (Metric::UpdateVsC, PathId::Safe, 1.02),
            (Metric::UpdateVsRaw, PathId::Safe, 1.02),
            (Metric::UpdateVsC, PathId::Raw, 1.0),
            (
                Metric::UpdateInstantiateVsC,
                PathId::Safe,
                4_000.0 / 4_100.0,
            ),
            (Metric::UpdateInstantiateVsRaw, PathId::C, 4_100.0 / 3_900.0),
            (Metric::UpdateSpeedup, PathId::Safe, 4_000.0 / 1_020.0),
            (Metric::UpdateSpeedup, PathId::Raw, 3.9),
            (Metric::UpdateSpeedup, PathId::C, 4.1),
            (Metric::Update, PathId::Safe, 1_020.0 * 2.5),
            (Metric::UpdateInstantiate, PathId::C, 4_100.0 * 2.5),
            (Metric::Build, PathId::Raw, 7_800.0 * 2.5),
        ] {
            assert!(
                (get(m, p) - want).abs() < 1e-2,
                "{m:?} {p:?}: {}",
                get(m, p)
            );
        }
        for m in [Metric::UpdateVsC, Metric::UpdateInstantiateVsC] {
            assert!(!samples.contains_key(&(w, 1000, m, PathId::C)), "{m:?}");
        }
        for m in [Metric::UpdateVsRaw, Metric::UpdateInstantiateVsRaw] {
            assert!(!samples.contains_key(&(w, 1000, m, PathId::Raw)), "{m:?}");
        }
    }

    #[test]
    fn a_failed_update_step_still_releases_every_chain() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let updater = |id, fail_at| Updater {
            id,
            update: 1.0,
            instantiate: 4.0,
            fail_at,
            log: log.clone(),
        };
        let (mut safe, mut raw, mut c) = (
            updater(PathId::Safe, None),
            updater(PathId::Raw, Some(2)),
            updater(PathId::C, None),
        );
        let mut paths: [&mut dyn Workloads; 3] = [&mut safe, &mut raw, &mut c];
        let shape = Shape {
            elements: 1,
            grid: 1,
            block: 1,
        };
        let mut samples = Samples::new();
        let e = update_cycles(&mut paths, 10, shape, 3, 0, Some(&mut samples)).unwrap_err();
        assert_eq!(
            e.0,
            "raw path, kernel chain, k = 10, update step 2: wrong result"
        );
        assert!(samples.is_empty());
        let released: Vec<PathId> = log
            .borrow()
            .iter()
            .filter(|e| e.1 == "release_update")
            .map(|e| e.0)
            .collect();
        assert_eq!(released, PathId::ALL);
    }
}
