#!/usr/bin/env python3
"""The module graph of the cuda-graph crate, and a check that it has no cycle.

Reads cuda-graph/src/**/*.rs. Each top-level module of the crate (declared with `mod` in lib.rs)
is a node; a file under src/<module>/ belongs to <module>. An edge A -> B means code of A names
B: a `crate::B...` path (in `use` or anywhere in code), an item of `use crate::{B, ...}`, a
`super::` path that climbs to the crate root, or a name lib.rs re-exports from B
(`crate::Device` is device's). Comments, doc comments (so intra-doc links) and string literals
are not code and are skipped, and so are `#[cfg(test)]` modules (unit tests may use any layer:
they are not part of the crate a user builds). lib.rs itself is the facade over every module,
not a node.
Names outside the crate's modules (`crate::sys`, the re-exported cuda-graph-sys, and
`crate::bytemuck`) are the floor below every module and are left out.

Finds the strongly connected components (Tarjan) and exits 1 when one of them has more than one
module: a cycle. Output, by option:

  (none)      the edges, one `A -> B` a line, then the cycles
  --why       the edges with the places that make them (file:line: path)
  --dot       the graph as Graphviz DOT source (modules of one cycle in one cluster)
  --layers    a text layering: layer 0 names only the floor, layer n modules whose highest
              dependency is in layer n-1
  --reduced   with --dot or the edge list, when there is no cycle: only the edges that no
              longer path implies (the transitive reduction: the same order, fewer lines)
  --src DIR   another source directory (default: cuda-graph/src beside this script's ci/)

The exit status is 1 when there is a cycle whatever the output asked for, 2 on a usage error.
"""

import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_test_modules(code):
    """`code` (already without comments and strings) with every `#[cfg(test)] mod x { .. }`
    blanked (newlines kept)."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", code):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        out.append(code[i:m.start()])
        out.append("".join("\n" if c == "\n" else " " for c in code[m.start():j]))
        i = j
    out.append(code[i:])
    return "".join(out)


def strip_non_code(text):
    """The text with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.compile(r'(?:b|c)?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1) and
                          (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            j = i + (1 if c == '"' else 2)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(blank(text[i:j]))
            i = j
        elif c == "'" and (m := re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'").match(text, i)):
            out.append(blank(m.group(0)))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def group_heads(code, start):
    """The first path segment of each item of the `{...}` group whose `{` is at `start`, with
    the offset of each."""
    heads, depth, i, expect = [], 0, start, True
    while i < len(code):
        c = code[i]
        if c == "{":
            depth += 1
            expect = depth == 1
            i += 1
        elif c == "}":
            depth -= 1
            i += 1
            if depth == 0:
                break
        elif c == "," and depth == 1:
            expect = True
            i += 1
        elif c.isspace():
            i += 1
        elif expect and depth == 1 and (m := re.compile(IDENT).match(code, i)):
            heads.append((m.group(0), i))
            expect = False
            i = m.end()
        else:
            expect = False
            i += 1
    return heads


def inline_mod_depths(code):
    """For each offset, how many inline `mod x { ... }` blocks enclose it: a list of
    (start, end) spans of inline module bodies."""
    spans = []
    for m in re.finditer(r"\bmod\s+" + IDENT + r"\s*\{", code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        spans.append((m.end(), j))
    return spans


def module_of(path, src):
    rel = os.path.relpath(path, src).replace(os.sep, "/")
    parts = rel[:-3].split("/")
    if parts == ["lib"]:
        return None, 0
    # src/x.rs and src/x/mod.rs are x at depth 0; src/x/y.rs is x's submodule y, depth 1.
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts[0], len(parts) - 1


def read_lib(src):
    code = strip_non_code(open(os.path.join(src, "lib.rs"), encoding="utf-8").read())
    modules = re.findall(r"\bmod\s+(" + IDENT + r")\s*;", code)
    reexports = {}
    for m in re.finditer(r"\bpub\s+use\s+(" + IDENT + r")::", code):
        head = m.group(1)
        if head not in modules:
            continue
        rest = code[m.end():code.find(";", m.end())]
        for name in re.findall(IDENT, rest.replace("self", "")):
            reexports.setdefault(name, head)
    return modules, reexports


def scan(src):
    modules, reexports = read_lib(src)
    edges = defaultdict(list)  # (from, to) -> ["file:line: text"]
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            this, file_depth = module_of(path, src)
            if this is None:
                continue
            if this not in modules:
                print(f"module-graph: {path} belongs to no module of lib.rs", file=sys.stderr)
                continue
            code = strip_test_modules(strip_non_code(open(path, encoding="utf-8").read()))
            spans = inline_mod_depths(code)
            rel = os.path.relpath(path, os.path.dirname(os.path.dirname(src)))

            def add(name, at, shown):
                target = name if name in modules else reexports.get(name)
                if target is None or target == this:
                    return
                line = code.count("\n", 0, at) + 1
                edges[(this, target)].append(f"{rel}:{line}: {shown}")

            def refs_at_root(m_end, at, prefix):
                if code.startswith("{", m_end):
                    for head, off in group_heads(code, m_end):
                        add(head, off, f"{prefix}{{{head}, ..}}")
                elif (h := re.compile(IDENT).match(code, m_end)):
                    add(h.group(0), at, prefix + h.group(0))

            for m in re.finditer(r"(?<![A-Za-z0-9_$])crate\s*::\s*", code):
                refs_at_root(m.end(), m.start(), "crate::")
            for m in re.finditer(r"(?<![A-Za-z0-9_:$])((?:super\s*::\s*)+)", code):
                climbs = m.group(1).count("super")
                depth = file_depth + sum(1 for s, e in spans if s <= m.start() < e)
                if climbs == depth + 1:  # up to the crate root: the next name is a module
                    refs_at_root(m.end(), m.start(), "super::" * climbs)
    return modules, edges


def tarjan(nodes, succ):
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return comps


def layers(nodes, succ, comps):
    comp_of = {v: i for i, c in enumerate(comps) for v in c}
    level = {}

    def lvl(ci):
        if ci not in level:
            level[ci] = 1 + max(
                (lvl(comp_of[w]) for v in comps[ci] for w in succ.get(v, ()) if comp_of[w] != ci),
                default=0,
            )
        return level[ci]

    by_level = defaultdict(list)
    for ci, comp in enumerate(comps):
        by_level[lvl(ci)].append(comp)
    return by_level


def shortest_cycle_through(v, succ, allowed):
    """A shortest cycle v -> ... -> v inside `allowed` (breadth first)."""
    prev, frontier = {v: None}, [v]
    while frontier:
        nxt = []
        for a in frontier:
            for b in sorted(succ.get(a, ())):
                if b == v:
                    path = [a]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [v]
                if b in allowed and b not in prev:
                    prev[b] = a
                    nxt.append(b)
        frontier = nxt
    return None


def implied(edge, succ):
    """Whether a path of two edges or more leads from edge's source to its target."""
    a, b = edge
    seen, todo = set(), [w for w in succ.get(a, ()) if w != b]
    while todo:
        v = todo.pop()
        if v == b:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(succ.get(v, ()))
    return False


def main(argv):
    args = argv[1:]
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cuda-graph", "src")
    if "--src" in args:
        i = args.index("--src")
        if i + 1 >= len(args):
            print("module-graph: --src needs a directory", file=sys.stderr)
            return 2
        src = args[i + 1]
        del args[i:i + 2]
    known = {"--why", "--dot", "--layers", "--reduced"}
    if any(a not in known for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    src = os.path.normpath(src)
    modules, edges = scan(src)
    # Named from the repository root (cuda-graph/src), as the edges' places are.
    shown = os.path.relpath(src, os.path.dirname(os.path.dirname(src)))
    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    comps = tarjan(sorted(modules), succ)
    cycles = [c for c in comps if len(c) > 1]
    total = len(edges)
    if "--reduced" in args and not cycles:
        edges = {e: w for e, w in edges.items() if not implied(e, succ)}

    if "--dot" in args:
        # Top to bottom: a module above the modules it depends on, the floor at the bottom.
        print("digraph modules {")
        print('  node [shape=box, fontname="monospace"];')
        for i, c in enumerate(cycles):
            print(f'  subgraph cluster_cycle{i} {{ label="cycle {i + 1}"; color=red; '
                  + " ".join(f'"{m}";' for m in c) + " }")
        for lvl, comps_at in sorted(layers(sorted(modules), succ, comps).items()):
            alone = sorted(c[0] for c in comps_at if len(c) == 1)
            if alone:
                print(f"  {{ rank=same; " + " ".join(f'"{m}";' for m in alone) + f" }}  // layer {lvl}")
        for a, b in sorted(edges):
            print(f'  "{a}" -> "{b}";')
        print("}")
    elif "--layers" in args:
        print("layer 0: cuda-graph-sys (crate::sys), bytemuck, std")
        for lvl, comps_at in sorted(layers(sorted(modules), succ, comps).items()):
            names = ", ".join(("{" + " ".join(c) + "} (cycle)") if len(c) > 1 else c[0]
                              for c in sorted(comps_at))
            print(f"layer {lvl}: {names}")
    else:
        for (a, b), why in sorted(edges.items()):
            print(f"{a} -> {b}")
            if "--why" in args:
                for w in why:
                    print(f"    {w}")

    out = sys.stdout if not cycles else sys.stderr
    if cycles:
        for i, c in enumerate(cycles, 1):
            inside = set(c)
            print(f"cycle {i}: {len(c)} modules: {' '.join(c)}", file=out)
            for a, b in sorted(edges):
                if a in inside and b in inside:
                    print(f"    {a} -> {b}  ({edges[(a, b)][0]})", file=out)
            seen = set()
            for v in c:
                loop = shortest_cycle_through(v, succ, inside)
                key = frozenset(loop)
                if loop and key not in seen:
                    seen.add(key)
                    print(f"    loop: {' -> '.join(loop)}", file=out)
        print(f"module-graph: {len(cycles)} cycle(s) among the modules of {shown}", file=out)
        return 1
    counted = f"{total} edges" + (f" ({len(edges)} in the reduction)" if len(edges) != total else "")
    print(f"module-graph: {shown}: {len(modules)} modules, {counted}, no cycle", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
