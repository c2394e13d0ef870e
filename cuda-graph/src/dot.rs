//! Our own DOT rendering of a graph's record, marking each allocation's lifetime: its alloc
//! node, the nodes that use it, and its free node share a colour, and dashed edges trace
//! alloc → users → free. (The driver's own DOT is [`Graph::debug_dot_print`].)

use std::fmt::Write;

use crate::graph::Graph;
use crate::record::{AllocKey, MemRole};

const COLOURS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

impl Graph {
    /// The graph as DOT text, with allocation lifetimes marked. Render with
    /// `dot -Tsvg graph.dot -o graph.svg`. Allocation `A{k}` is the record's key `k`.
    #[must_use]
    pub fn to_dot(&self) -> String {
        let record = &self.record;
        let mut out = String::from(
            "digraph cuda_graph {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\"];\n",
        );
        // Per key: its alloc node, its users, its free node.
        let mut lifetimes: Vec<(Option<usize>, Vec<usize>, Option<usize>)> =
            vec![(None, Vec::new(), None); record.allocation_count()];
        for (i, node) in record.nodes().iter().enumerate() {
            let mut lines = vec![match node.label() {
                Some(label) => format!("{}: {}", escape(label), escape(&node.kind().to_string())),
                None => format!("#{i} {}", escape(&node.kind().to_string())),
            }];
            let mut colour = None;
            let mut names = Vec::new();
            for &(role, AllocKey(k)) in node.refs() {
                let Some(lifetime) = lifetimes.get_mut(k) else {
                    continue;
                };
                match role {
                    MemRole::Alloc => {
                        lifetime.0 = Some(i);
                        lines.push(format!("alloc A{k}"));
                    }
                    MemRole::Free => {
                        lifetime.2 = Some(i);
                        lines.push(format!("free A{k}"));
                    }
                    MemRole::Use => {
                        lifetime.1.push(i);
                        names.push(format!("A{k}"));
                    }
                }
                colour.get_or_insert(COLOURS[k % COLOURS.len()]);
            }
            if !names.is_empty() {
                lines.push(format!("uses {}", names.join(", ")));
            }
            let _ = writeln!(
                out,
                "  n{i} [label=\"{}\", color=\"{}\", penwidth={}];",
                lines.join("\\n"),
                colour.unwrap_or("black"),
                if colour.is_some() { 2 } else { 1 }
            );
        }
        for (i, node) in record.nodes().iter().enumerate() {
            for d in node.deps() {
                let _ = writeln!(out, "  n{d} -> n{i};");
            }
        }
        for (k, (alloc, users, free)) in lifetimes.iter().enumerate() {
            let colour = COLOURS[k % COLOURS.len()];
            let mut chain: Vec<usize> = alloc.iter().copied().collect();
            chain.extend(users);
            chain.extend(free);
            for pair in chain.windows(2) {
                let _ = writeln!(
                    out,
                    "  n{} -> n{} [style=dashed, color=\"{colour}\", constraint=false, arrowhead=none];",
                    pair[0], pair[1]
                );
            }
        }
        out.push_str("  legend [shape=note, fillcolor=\"#f8f8f8\", label=\"");
        for k in 0..record.allocation_count() {
            let _ = write!(out, "A{k}: {}\\l", escape(&record.describe(AllocKey(k))));
        }
        out.push_str("\"];\n}\n");
        out
    }
}

/// `text` as the inside of a DOT string: it cannot end the string (quotes and backslashes are
/// escaped, so a label ending in a backslash cannot swallow the closing quote), line breaks
/// become graphviz's `\n`, and NUL and other control characters, which DOT files must not
/// hold, are dropped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escaped_text_cannot_leave_its_string() {
        let hostile = "x\\\"]; injected [URL=<javascript:alert(1)>]; //\n\0tail\\";
        let escaped = escape(hostile);
        // Every quote is preceded by an odd run of backslashes: none ends the string.
        let bytes = escaped.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'"' {
                let run = bytes[..i].iter().rev().take_while(|&&c| c == b'\\').count();
                assert_eq!(run % 2, 1, "unescaped quote at {i} in {escaped}");
            }
        }
        // A trailing backslash is doubled, so a closing quote after it stays a quote.
        assert!(escaped.ends_with("\\\\"));
        assert!(!escaped.contains('\n') && !escaped.contains('\0'));
        assert_eq!(escape("plain"), "plain");
    }
}
