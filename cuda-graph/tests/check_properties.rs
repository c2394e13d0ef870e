//! Property tests of `check_record`: random graphs (DAGs, DAGs with a cycle added, chains of
//! allocations like real programs) with random alloc, free and use placements, compared with a
//! brute-force oracle that computes reachability by a search from every node and applies the
//! rules as the module documents them, one allocation and one pair of nodes at a time.
//!
//! A small xorshift generator makes every case reproducible from its seed; a failure prints the
//! seed and the record. `CUDA_GRAPH_PROPERTY_SCALE=<n>` multiplies the number of cases.

use std::collections::BTreeSet;

use cuda_graph::NodeKind;
use cuda_graph::check::{AllocKey, Record, Rule, check_record};

/// xorshift64: small, fast, reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64) / ((1u64 << 53) as f64) < p
    }
    fn pick(&mut self, items: &[usize]) -> Option<usize> {
        (!items.is_empty()).then(|| items[self.below(items.len())])
    }
}

fn scale() -> usize {
    std::env::var("CUDA_GRAPH_PROPERTY_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// A graph before its nodes get their final positions: nodes in creation order.
#[derive(Default, Clone)]
struct Spec {
    deps: Vec<Vec<usize>>,
    allocs: Vec<Vec<usize>>,
    frees: Vec<Vec<usize>>,
    uses: Vec<Vec<usize>>,
    allocations: usize,
    elsewhere: Vec<usize>,
}

impl Spec {
    fn with_nodes(n: usize) -> Spec {
        Spec {
            deps: vec![Vec::new(); n],
            allocs: vec![Vec::new(); n],
            frees: vec![Vec::new(); n],
            uses: vec![Vec::new(); n],
            ..Spec::default()
        }
    }

    fn add_node(&mut self, deps: Vec<usize>) -> usize {
        self.deps.push(deps);
        self.allocs.push(Vec::new());
        self.frees.push(Vec::new());
        self.uses.push(Vec::new());
        self.deps.len() - 1
    }

    fn len(&self) -> usize {
        self.deps.len()
    }

    /// The record, with node `i` at position `perm[i]` (dangling dependencies stay as they are).
    fn model(&self, perm: &[usize]) -> Record {
        let n = self.len();
        let mut at = vec![0; n];
        for (i, &p) in perm.iter().enumerate() {
            at[p] = i;
        }
        let mut m = Record::new();
        for k in 0..self.allocations {
            m.add_allocation(format!("allocation 'a{k}'"));
        }
        for &old in &at {
            let kind = if !self.allocs[old].is_empty() {
                NodeKind::MemAlloc
            } else if !self.frees[old].is_empty() {
                NodeKind::MemFree
            } else if self.uses[old].is_empty() {
                NodeKind::Empty
            } else {
                NodeKind::Kernel("k".into())
            };
            let deps: Vec<usize> = self.deps[old]
                .iter()
                .map(|&d| if d < n { perm[d] } else { d })
                .collect();
            let i = m.add_node(kind, &deps);
            if old % 3 == 0 {
                m.set_label(i, format!("n{old}"));
            }
            for &k in &self.allocs[old] {
                m.allocates(i, AllocKey(k));
            }
            for &k in &self.frees[old] {
                m.frees(i, AllocKey(k));
            }
            for &k in &self.uses[old] {
                m.uses(i, AllocKey(k));
            }
        }
        for &k in &self.elsewhere {
            m.set_freed_elsewhere(AllocKey(k));
        }
        m
    }
}

fn permutation(rng: &mut Rng, n: usize, shuffle: bool) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    if shuffle {
        for i in (1..n).rev() {
            let j = rng.below(i + 1);
            p.swap(i, j);
        }
    }
    p
}

mod oracle;
use oracle::{Oracle, expected, row};

/// Compares `check_record` with the oracle on one record; checks the edges and paths too.
fn compare(seed: u64, m: &Record) -> Result<(), String> {
    let got = check_record(m);
    let o = Oracle::new(m);
    let fail = |what: String| {
        Err(format!(
            "seed {seed}: {what}\nviolations: {:#?}\nrecord: {m:#?}",
            got.iter().map(|v| v.to_string()).collect::<Vec<_>>()
        ))
    };
    let mut cycles = 0;
    let mut rows = BTreeSet::new();
    for v in &got {
        let s = v.to_string();
        if s.contains('\n') || s.is_empty() {
            return fail(format!("not one sentence: {s:?}"));
        }
        match v.rule {
            Rule::Cycle => {
                cycles += 1;
                let path: Vec<usize> = v.path.iter().map(|n| n.index).collect();
                let lowest = path.iter().min().copied();
                let closes = path
                    .iter()
                    .zip(path.iter().cycle().skip(1))
                    .all(|(&a, &b)| o.is_edge(a, b));
                let last = path.last().copied();
                if path.is_empty()
                    || !closes
                    || lowest != Some(v.node.index)
                    || path[0] != v.node.index
                    || v.offending_edge != last.map(|l| (l, v.node.index))
                {
                    return fail(format!("bad cycle {path:?}, {:?}", v.offending_edge));
                }
                continue;
            }
            Rule::NotAfterAlloc => {
                let a = v.other.as_ref().map(|o| o.index);
                if v.missing_edge != a.map(|a| (a, v.node.index)) {
                    return fail(format!("missing edge of {s}"));
                }
            }
            Rule::UnorderedWithFree | Rule::UseAfterFree => {
                let f = v.other.as_ref().map(|o| o.index);
                if v.missing_edge != f.map(|f| (v.node.index, f)) {
                    return fail(format!("missing edge of {s}"));
                }
            }
            _ => {}
        }
        if v.rule == Rule::UseAfterFree {
            let path: Vec<usize> = v.path.iter().map(|n| n.index).collect();
            let f = v.other.as_ref().map(|o| o.index).unwrap_or(usize::MAX);
            let valid = path.len() >= 2
                && path[0] == f
                && path[path.len() - 1] == v.node.index
                && path.windows(2).all(|w| o.is_edge(w[0], w[1]));
            if !valid
                || o.shortest(f, v.node.index) != Some(path.len())
                || v.offending_edge != Some((path[path.len() - 2], v.node.index))
            {
                return fail(format!("bad offending path {path:?} for {s}"));
            }
        } else if v.rule != Rule::Cycle && !v.path.is_empty() {
            return fail(format!("unexpected path in {s}"));
        }
        rows.insert(row(v));
    }
    if got.len() != rows.len() + cycles {
        return fail("duplicate violations".into());
    }
    let sorted = got
        .windows(2)
        .all(|w| (w[0].node.index, w[0].rule) <= (w[1].node.index, w[1].rule));
    if !sorted {
        return fail("not in node order".into());
    }
    if cycles != usize::from(o.cyclic()) {
        return fail(format!(
            "{cycles} cycle violations, oracle cyclic: {}",
            o.cyclic()
        ));
    }
    let want = expected(m, &o);
    if rows != want {
        let missing: Vec<_> = want.difference(&rows).collect();
        let extra: Vec<_> = rows.difference(&want).collect();
        return fail(format!("missing {missing:?}, unexpected {extra:?}"));
    }
    Ok(())
}

/// A random DAG over `n` nodes (edges from earlier to later creation order, density `p`) with
/// random placements of `allocations` allocations; uses and frees are placed after the alloc
/// node most of the time, so legal and illegal placements both occur often.
fn random_dag(rng: &mut Rng, n: usize, p: f64, allocations: usize) -> Spec {
    let mut s = Spec::with_nodes(n);
    for i in 1..n {
        for j in 0..i {
            if rng.chance(p) {
                s.deps[i].push(j);
            }
        }
    }
    // Descendants (in creation order, later nodes) for biased placement.
    let mut children = vec![Vec::new(); n];
    for (j, deps) in s.deps.iter().enumerate() {
        for &i in deps {
            children[i].push(j);
        }
    }
    let mut desc = vec![vec![false; n]; n];
    for i in (0..n).rev() {
        for &j in &children[i] {
            desc[i][j] = true;
            let (head, tail) = desc.split_at_mut(j);
            for (d, &r) in head[i].iter_mut().zip(&tail[0]) {
                *d |= r;
            }
        }
    }
    let after = |a: usize| -> Vec<usize> { (0..n).filter(|&j| desc[a][j]).collect() };
    s.allocations = allocations;
    for k in 0..allocations {
        let a = (rng.chance(0.85)).then(|| rng.below(n));
        if let Some(a) = a {
            s.allocs[a].push(k);
            if rng.chance(0.03) {
                let b = rng.below(n);
                s.allocs[b].push(k);
            }
        }
        let mut placed = Vec::new();
        for _ in 0..rng.below(5) {
            let u = match a {
                Some(a) if rng.chance(0.75) => rng.pick(&after(a)).unwrap_or(a),
                _ => rng.below(n),
            };
            s.uses[u].push(k);
            placed.push(u);
        }
        let frees = match rng.below(10) {
            0..=2 => 0,
            3..=8 => 1,
            _ => 2,
        };
        for _ in 0..frees {
            // Often a common descendant of every user, sometimes anywhere.
            let common: Vec<usize> = (0..n)
                .filter(|&j| placed.iter().all(|&u| desc[u][j]))
                .filter(|&j| a.is_none_or(|a| desc[a][j]))
                .collect();
            let f = if rng.chance(0.6) {
                rng.pick(&common).unwrap_or_else(|| rng.below(n))
            } else {
                rng.below(n)
            };
            s.frees[f].push(k);
        }
        if rng.chance(0.05) {
            s.elsewhere.push(k);
        }
    }
    s
}

/// Rare damage: unknown keys, dangling dependencies, repeated references.
fn damage(rng: &mut Rng, s: &mut Spec) {
    let n = s.len();
    if n == 0 {
        return;
    }
    if rng.chance(0.02) {
        let i = rng.below(n);
        s.uses[i].push(s.allocations + rng.below(3));
    }
    if rng.chance(0.02) {
        let i = rng.below(n);
        s.frees[i].push(s.allocations + rng.below(3));
    }
    if rng.chance(0.02) {
        let i = rng.below(n);
        s.deps[i].push(n + rng.below(3));
    }
    if rng.chance(0.02) && s.allocations > 0 {
        let i = rng.below(n);
        let k = rng.below(s.allocations);
        s.uses[i].push(k);
        s.uses[i].push(k);
    }
}

/// Adds an edge against the creation order, which makes a cycle when the reverse path exists.
fn maybe_back_edge(rng: &mut Rng, s: &mut Spec) {
    let n = s.len();
    if n >= 1 {
        let to = rng.below(n);
        let from = to + rng.below(n - to);
        if !s.deps[to].contains(&from) {
            s.deps[to].push(from);
        }
    }
}

/// A program-like graph: `lanes` streams of chains alloc → 1–3 users → free, each chain after
/// the previous one of its lane; then random cross edges, stray uses and removed edges.
fn program(rng: &mut Rng, lanes: usize, chains: usize) -> Spec {
    let mut s = Spec::default();
    let mut tail: Vec<Option<usize>> = vec![None; lanes];
    for k in 0..chains {
        let lane = rng.below(lanes);
        let al = s.add_node(tail[lane].into_iter().collect());
        s.allocs[al].push(k);
        let mut last = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let u = s.add_node(vec![al]);
            s.uses[u].push(k);
            if rng.chance(0.3) {
                let v = s.add_node(vec![u]);
                s.uses[v].push(k);
                last.push(v);
            } else {
                last.push(u);
            }
        }
        let fr = s.add_node(last);
        s.frees[fr].push(k);
        tail[lane] = Some(fr);
    }
    s.allocations = chains;
    let n = s.len();
    for _ in 0..rng.below(1 + n / 20) {
        // A forward cross edge keeps the graph acyclic.
        let to = 1 + rng.below(n - 1);
        let from = rng.below(to);
        if !s.deps[to].contains(&from) {
            s.deps[to].push(from);
        }
    }
    for _ in 0..rng.below(4) {
        let i = rng.below(n);
        let k = rng.below(chains);
        s.uses[i].push(k);
    }
    for _ in 0..rng.below(4) {
        let i = rng.below(n);
        if !s.deps[i].is_empty() {
            let j = rng.below(s.deps[i].len());
            s.deps[i].remove(j);
        }
    }
    s
}

/// A wide graph that is legal by construction: a random DAG between a source and a sink, and
/// allocations allocated right after the source, used anywhere in the middle (with edges from
/// the alloc node and to the free node), freed just before the sink; then, rarely, one of those
/// edges is dropped.
fn wide_legal(rng: &mut Rng, middle: usize, allocations: usize) -> Spec {
    let mut s = Spec::default();
    let source = s.add_node(Vec::new());
    let alloc_nodes: Vec<usize> = (0..allocations)
        .map(|k| {
            let a = s.add_node(vec![source]);
            s.allocs[a].push(k);
            a
        })
        .collect();
    let first = s.len();
    for i in 0..middle {
        let mut deps = vec![source];
        for _ in 0..rng.below(3) {
            if i > 0 {
                deps.push(first + rng.below(i));
            }
        }
        deps.sort_unstable();
        deps.dedup();
        s.add_node(deps);
    }
    let mut free_deps = vec![Vec::new(); allocations];
    for k in 0..allocations {
        for _ in 0..1 + rng.below(4) {
            let u = first + rng.below(middle);
            s.uses[u].push(k);
            if !rng.chance(0.01) && !s.deps[u].contains(&alloc_nodes[k]) {
                s.deps[u].push(alloc_nodes[k]);
            }
            if !rng.chance(0.01) {
                free_deps[k].push(u);
            }
        }
    }
    let frees: Vec<usize> = free_deps
        .into_iter()
        .enumerate()
        .map(|(k, mut deps)| {
            deps.sort_unstable();
            deps.dedup();
            let f = s.add_node(deps);
            s.frees[f].push(k);
            f
        })
        .collect();
    s.add_node(frees);
    s.allocations = allocations;
    s
}

/// Runs `cases` seeds of `make`, stopping at the first failure; returns the violation count.
fn run(name: &str, first_seed: u64, cases: usize, make: impl Fn(&mut Rng) -> Spec) -> usize {
    let mut violations = 0;
    let mut clean = 0;
    for c in 0..cases as u64 {
        let seed = first_seed + c;
        let mut rng = Rng::new(seed);
        let spec = make(&mut rng);
        let shuffle = rng.chance(0.5);
        let perm = permutation(&mut rng, spec.len(), shuffle);
        let m = spec.model(&perm);
        if let Err(e) = compare(seed, &m) {
            panic!("{name}: {e}");
        }
        let v = check_record(&m).len();
        violations += v;
        clean += usize::from(v == 0);
    }
    println!("{name}: {cases} cases, {clean} without violations, {violations} violations in all");
    assert!(
        clean > 0 && clean < cases,
        "{name}: the generator lacks variety"
    );
    violations
}

#[test]
fn small_random_dags_match_the_oracle() {
    run("small DAGs", 1, 12_000 * scale(), |rng| {
        let n = 1 + rng.below(16);
        let p = [0.1, 0.25, 0.5][rng.below(3)];
        let k = rng.below(5);
        let mut s = random_dag(rng, n, p, k);
        damage(rng, &mut s);
        s
    });
}

#[test]
fn medium_random_dags_match_the_oracle() {
    run("medium DAGs", 1_000_000, 2_500 * scale(), |rng| {
        let n = 16 + rng.below(64);
        let p = [0.03, 0.08, 0.2][rng.below(3)];
        let k = 1 + rng.below(24);
        let mut s = random_dag(rng, n, p, k);
        damage(rng, &mut s);
        s
    });
}

#[test]
fn graphs_with_cycles_match_the_oracle() {
    run("DAGs with a back edge", 2_000_000, 3_000 * scale(), |rng| {
        let n = 1 + rng.below(24);
        let k = rng.below(5);
        let mut s = random_dag(rng, n, 0.2, k);
        maybe_back_edge(rng, &mut s);
        s
    });
}

#[test]
fn program_like_graphs_with_many_allocations_match_the_oracle() {
    // Up to 200 allocations: several batches of 64 per pass.
    run("programs", 3_000_000, 150 * scale(), |rng| {
        let lanes = 1 + rng.below(8);
        let chains = 1 + rng.below(200);
        program(rng, lanes, chains)
    });
}

#[test]
fn wide_graphs_with_long_lived_allocations_match_the_oracle() {
    // Allocations whose users spread over the whole graph: every batch spans nearly all
    // positions.
    run("wide", 4_000_000, 150 * scale(), |rng| {
        let middle = 50 + rng.below(200);
        let k = 1 + rng.below(160);
        wide_legal(rng, middle, k)
    });
}

#[test]
fn sparse_random_dags_with_many_allocations_match_the_oracle() {
    run("sparse DAGs", 5_000_000, 60 * scale(), |rng| {
        let n = 100 + rng.below(200);
        let k = if rng.chance(0.2) {
            1
        } else {
            64 + rng.below(100)
        };
        random_dag(rng, n, 4.0 / n as f64, k)
    });
}
