//! Fuzz target: random bytes are read as a sequence of builder operations on a
//! `cuda_graph::check::Record` (add a node after some dependencies; allocate, free or use an
//! allocation; add an edge, which may close a cycle; mark an allocation freed by another graph;
//! refer to nodes and allocations that do not exist), and `check_record`'s answer is compared
//! with a brute-force oracle: reachability by a search from every node, and the rules of
//! `cuda_graph::check` applied as its documentation states them, one allocation and one pair of
//! nodes at a time. The structure of each violation is checked too (the missing edge, the
//! offending path and edge, the cycle), as is the order and uniqueness of the list.
//!
//! No GPU is needed. Run from `fuzz/`: `cargo fuzz run check_record -- -max_total_time=600`.

#![no_main]

use std::collections::BTreeSet;

use cuda_graph::NodeKind;
use cuda_graph::check::{AllocKey, Record, Rule, check_record};
use libfuzzer_sys::fuzz_target;

/// Bounds that keep the oracle (quadratic in nodes) fast.
const MAX_NODES: usize = 40;
const MAX_KEYS: usize = 10;

/// The input, read a byte at a time; zero once exhausted.
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn next(&mut self) -> Option<u8> {
        let b = self.data.get(self.at).copied();
        self.at += 1;
        b
    }
    fn byte(&mut self) -> u8 {
        self.next().unwrap_or(0)
    }
}

/// A node position: an existing node (most of the time) or, for byte 255, one past the end
/// (a dependency on a node that does not exist).
fn position(b: u8, n: usize, dangling: bool) -> Option<usize> {
    if dangling && b == 255 {
        return Some(n + 1);
    }
    (n > 0).then(|| b as usize % n)
}

/// An allocation key: an existing one, or for bytes ≥ 250 one that does not exist.
fn key(b: u8, keys: usize) -> AllocKey {
    if keys == 0 || b >= 250 {
        AllocKey(keys + (b % 3) as usize)
    } else {
        AllocKey(b as usize % keys)
    }
}

fn deps(input: &mut Bytes<'_>, n: usize) -> Vec<usize> {
    let count = input.byte() % 4;
    (0..count)
        .filter_map(|_| position(input.byte(), n, true))
        .collect()
}

fn kernel() -> NodeKind {
    NodeKind::Kernel("k".into())
}

/// Interprets the bytes as builder operations.
fn build(data: &[u8]) -> Record {
    let mut m = Record::new();
    let mut input = Bytes { data, at: 0 };
    while let Some(op) = input.next() {
        let n = m.nodes().len();
        let keys = m.allocation_count();
        match op % 10 {
            // An empty or kernel node after some dependencies.
            0 | 1 if n < MAX_NODES => {
                let d = deps(&mut input, n);
                let kind = if op % 2 == 0 {
                    NodeKind::Empty
                } else {
                    kernel()
                };
                let i = m.add_node(kind, &d);
                if op & 0x80 != 0 {
                    m.set_label(i, format!("n{i}"));
                }
            }
            // A new allocation and its alloc node.
            2 if n < MAX_NODES && keys < MAX_KEYS => {
                let d = deps(&mut input, n);
                let k = m.add_allocation(format!("allocation 'a{keys}'"));
                let i = m.add_node(NodeKind::MemAlloc, &d);
                m.allocates(i, k);
            }
            // A free node.
            3 if n < MAX_NODES => {
                let k = key(input.byte(), keys);
                let d = deps(&mut input, n);
                let i = m.add_node(NodeKind::MemFree, &d);
                m.frees(i, k);
            }
            // A kernel that uses one or two allocations.
            4 if n < MAX_NODES => {
                let k1 = key(input.byte(), keys);
                let k2 = key(input.byte(), keys);
                let d = deps(&mut input, n);
                let i = m.add_node(kernel(), &d);
                m.uses(i, k1);
                if op & 0x40 != 0 {
                    m.uses(i, k2);
                }
            }
            // An edge between existing nodes (either direction: cycles happen).
            5 => {
                let (a, b) = (input.byte(), input.byte());
                if let (Some(from), Some(to)) = (position(a, n, false), position(b, n, false)) {
                    m.add_edge(from, to);
                }
            }
            // An existing node uses an allocation.
            6 => {
                let (a, b) = (input.byte(), input.byte());
                if let Some(i) = position(a, n, false) {
                    m.uses(i, key(b, keys));
                }
            }
            // An existing node frees or allocates an allocation (again).
            7 => {
                let (a, b) = (input.byte(), input.byte());
                if let Some(i) = position(a, n, false) {
                    if op & 0x10 != 0 {
                        m.allocates(i, key(b, keys));
                    } else {
                        m.frees(i, key(b, keys));
                    }
                }
            }
            // Another graph frees an allocation.
            8 => {
                let b = input.byte();
                m.set_freed_elsewhere(key(b, keys));
            }
            // A dependency on a node that does not exist.
            9 => {
                let (a, b) = (input.byte(), input.byte());
                if let Some(i) = position(a, n, false) {
                    m.add_edge(n + b as usize % 3, i);
                }
            }
            _ => {}
        }
    }
    m
}

#[path = "../../cuda-graph/tests/oracle/mod.rs"]
mod oracle;
use oracle::{Oracle, expected, row};

/// `check_record` against the oracle; `Err` says how they differ.
fn compare(m: &Record) -> Result<(), String> {
    let got = check_record(m);
    let o = Oracle::new(m);
    let mut cycles = 0;
    let mut rows = BTreeSet::new();
    for v in &got {
        let s = v.to_string();
        if s.is_empty() || s.contains('\n') {
            return Err(format!("not one sentence: {s:?}"));
        }
        let path: Vec<usize> = v.path.iter().map(|p| p.index).collect();
        let other = v.other.as_ref().map(|p| p.index);
        match v.rule {
            Rule::Cycle => {
                cycles += 1;
                let closes = path
                    .iter()
                    .zip(path.iter().cycle().skip(1))
                    .all(|(&a, &b)| o.is_edge(a, b));
                if path.is_empty()
                    || !closes
                    || path[0] != v.node.index
                    || path.iter().min() != Some(&v.node.index)
                    || v.offending_edge != path.last().map(|&l| (l, v.node.index))
                {
                    return Err(format!("bad cycle {path:?}, {:?}: {s}", v.offending_edge));
                }
                continue;
            }
            Rule::NotAfterAlloc if v.missing_edge != other.map(|a| (a, v.node.index)) => {
                return Err(format!("missing edge {:?} of: {s}", v.missing_edge));
            }
            Rule::UnorderedWithFree | Rule::UseAfterFree
                if v.missing_edge != other.map(|f| (v.node.index, f)) =>
            {
                return Err(format!("missing edge {:?} of: {s}", v.missing_edge));
            }
            _ => {}
        }
        if v.rule == Rule::UseAfterFree {
            let f = other.unwrap_or(usize::MAX);
            let valid = path.len() >= 2
                && path[0] == f
                && path[path.len() - 1] == v.node.index
                && path.windows(2).all(|w| o.is_edge(w[0], w[1]));
            if !valid
                || o.shortest(f, v.node.index) != Some(path.len())
                || v.offending_edge != Some((path[path.len() - 2], v.node.index))
            {
                return Err(format!("bad offending path {path:?}: {s}"));
            }
        } else if !path.is_empty() {
            return Err(format!("unexpected path {path:?}: {s}"));
        }
        rows.insert(row(v));
    }
    if got.len() != rows.len() + cycles {
        return Err("duplicate violations".into());
    }
    if !got
        .windows(2)
        .all(|w| (w[0].node.index, w[0].rule) <= (w[1].node.index, w[1].rule))
    {
        return Err("violations not in node order".into());
    }
    if cycles != usize::from(o.cyclic()) {
        return Err(format!(
            "{cycles} cycle violations; the oracle finds the graph {}",
            if o.cyclic() { "cyclic" } else { "acyclic" }
        ));
    }
    let want = expected(m, &o);
    if rows != want {
        let missing: Vec<_> = want.difference(&rows).collect();
        let extra: Vec<_> = rows.difference(&want).collect();
        return Err(format!("missing {missing:?}, unexpected {extra:?}"));
    }
    if check_record(m) != got {
        return Err("two checks of one model differ".into());
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let model = build(data);
    if let Err(why) = compare(&model) {
        let got: Vec<String> = check_record(&model).iter().map(|v| v.to_string()).collect();
        panic!(
            "check_record disagrees with the oracle: {why}\nviolations: {got:#?}\nrecord: {model:#?}"
        );
    }
});
