#!/usr/bin/env python3
"""Checks docs/CUDA_CALLS.md, the map of CUDA's graph calls, against cuda.h and cuda-graph/src.

From the cuda.h given by --header (default: .cuda/13.0/include/cuda.h, as ci/fetch-cuda.sh
makes it), it takes the functions the map covers, by the symbol the header really declares
(its `#define`s applied, as a C compiler sees them without CUDA_API_PER_THREAD_DEFAULT_STREAM):
every `cuGraph*` (not `cuGraphics*`), the capture calls (`cuStreamBeginCapture*`,
`cuStreamEndCapture`, `cuStreamGetCaptureInfo*`, `cuStreamIsCapturing`,
`cuStreamUpdateCaptureDependencies*`), the graph-memory calls of the device
(`cuDeviceGraphMemTrim`, `cuDevice{Get,Set}GraphMemAttribute`), the stream-ordered allocator
(`cuMemAllocAsync`, `cuMemFreeAsync`, `cuMemAllocFromPoolAsync`, `cuMemPool*`) and
`cuUserObject*`. Then it reads the map's tables, whose rows are

    | `symbol` | `macro` (or empty) | `cudaRuntimeName` (or empty) | safe API, or "none: why" |

and fails when:
  - a function of the header has no row, or a row names a function the header lacks (or that
    falls outside the list above), or two rows name one function;
  - the macro column differs from the public names the header `#define`s to the symbol;
  - the runtime column names a function that cuda_runtime_api.h (beside cuda.h) does not
    declare, or is empty while the runtime name by convention (cuX -> cudaX, cuMemAllocAsync ->
    cudaMallocAsync, ...) is declared there;
  - a row names safe methods but no `sys::<symbol>` or `sys::<macro>` is in cuda-graph/src
    (comments aside), or says "none:" while cuda-graph/src has one;
  - a method it names (`Type::method`, `drop(Type)`, `cuda_graph::function`) is not in
    cuda-graph/src.

On success it prints one line starting with "cuda-calls: ". --list prints the functions the
header gives, with macro, runtime name and where cuda-graph/src refers to them, and checks
nothing. Python 3 standard library only.
"""

import argparse
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEFAULT_HEADER = os.path.join(".cuda", "13.0", "include", "cuda.h")
DEFAULT_DOC = os.path.join("docs", "CUDA_CALLS.md")
DEFAULT_SRC = os.path.join("cuda-graph", "src")

# The functions the map covers, by the symbol the header declares.
COVERED = re.compile(
    r"^(?:cuGraph(?!ics)\w*"
    r"|cuStreamBeginCapture\w*|cuStreamEndCapture|cuStreamGetCaptureInfo\w*"
    r"|cuStreamIsCapturing|cuStreamUpdateCaptureDependencies\w*"
    r"|cuDeviceGraphMemTrim|cuDeviceGetGraphMemAttribute|cuDeviceSetGraphMemAttribute"
    r"|cuMemAllocAsync|cuMemFreeAsync|cuMemAllocFromPoolAsync|cuMemPool\w*"
    r"|cuUserObject\w*)$"
)

# Runtime names that do not follow cuX -> cudaX.
RUNTIME_EXCEPTIONS = {
    "cuMemAllocAsync": "cudaMallocAsync",
    "cuMemFreeAsync": "cudaFreeAsync",
    "cuMemAllocFromPoolAsync": "cudaMallocFromPoolAsync",
}

# Macros a C compiler for Linux defines, for the header's #if lines; everything else is
# undefined (no CUDA_API_PER_THREAD_DEFAULT_STREAM, no __CUDA_API_VERSION_INTERNAL).
PREDEFINED = {"__linux__": "1", "__GNUC__": "12", "__LP64__": "1", "__STDC_VERSION__": "201710L"}


class Failure(Exception):
    pass


def strip_c_comments(text):
    """Comments blanked (their newlines kept, so line numbers stay), string literals kept."""

    def blank(m):
        if m.group(1):
            return m.group(1)
        return "\n" * m.group(0).count("\n") or " "

    return re.sub(r'("(?:\\.|[^"\\\n])*")|/\*.*?\*/|//[^\n]*', blank, text, flags=re.S)


def eval_condition(expr, macros, where):
    """The value of a #if expression: defined(), !, &&, ||, comparisons, integers."""
    expr = re.sub(
        r"\bdefined\s*(?:\(\s*(\w+)\s*\)|(\w+))",
        lambda m: "1" if (m.group(1) or m.group(2)) in macros else "0",
        expr,
    )

    def ident(m):
        word = m.group(0)
        value = macros.get(word)
        if isinstance(value, str) and re.fullmatch(r"\d+[uUlL]*", value.strip()):
            return value.strip()
        return "0"

    expr = re.sub(r"\b[A-Za-z_]\w*\b", ident, expr)
    expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr)
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    if not re.fullmatch(r"[\d\s()<>=!andotr]*", expr):
        raise Failure(f"{where}: cannot evaluate the #if expression '{expr.strip()}'")
    try:
        return bool(eval(expr, {"__builtins__": {}}, {}))  # noqa: S307 (digits and operators only)
    except SyntaxError as e:
        raise Failure(f"{where}: cannot evaluate the #if expression '{expr.strip()}': {e}")


def preprocess(path):
    """The header as a compiler sees it, to the extent needed: the text of the active lines
    (directives removed, no #include followed) and the macros defined at the end, as
    {name: body} for object-like macros and {name: (params, body)} for function-like ones."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    text = strip_c_comments(text)
    text = re.sub(r"\\\n", " ", text)
    macros = dict(PREDEFINED)
    active_lines = []
    stack = []  # (active before this #if, a branch taken, this branch active)
    active = True
    for number, line in enumerate(text.split("\n"), 1):
        where = f"{path}:{number}"
        m = re.match(r"\s*#\s*(\w+)\s*(.*)$", line)
        if not m:
            if active:
                active_lines.append(line)
            continue
        directive, rest = m.group(1), m.group(2).strip()
        if directive in ("if", "ifdef", "ifndef"):
            if not active:
                stack.append((False, True, False))
            else:
                if directive == "ifdef":
                    value = rest.split()[0] in macros
                elif directive == "ifndef":
                    value = rest.split()[0] not in macros
                else:
                    value = eval_condition(rest, macros, where)
                stack.append((True, value, value))
            active = stack[-1][2]
        elif directive == "elif":
            if not stack:
                raise Failure(f"{where}: #elif without #if")
            outer, taken, _ = stack[-1]
            value = outer and not taken and eval_condition(rest, macros, where)
            stack[-1] = (outer, taken or value, value)
            active = value
        elif directive == "else":
            if not stack:
                raise Failure(f"{where}: #else without #if")
            outer, taken, _ = stack[-1]
            stack[-1] = (outer, True, outer and not taken)
            active = stack[-1][2]
        elif directive == "endif":
            if not stack:
                raise Failure(f"{where}: #endif without #if")
            active = stack.pop()[0]
        elif not active:
            continue
        elif directive == "define":
            d = re.match(r"(\w+)(\(([^)]*)\))?\s*(.*)$", rest)
            if not d:
                raise Failure(f"{where}: cannot read the #define '{rest}'")
            if d.group(2):
                params = [p.strip() for p in d.group(3).split(",") if p.strip()]
                macros[d.group(1)] = (params, d.group(4).strip())
            else:
                macros[d.group(1)] = d.group(4).strip()
        elif directive == "undef":
            macros.pop(rest.split()[0], None)
    if stack:
        raise Failure(f"{path}: {len(stack)} #if without #endif")
    return "\n".join(active_lines), macros


def expand(name, macros):
    """The identifier a name becomes after macro expansion (object-like macros whose body is
    an identifier or a call of a function-like macro with identifier arguments, as cuda.h's
    `#define cuX __CUDA_API_PTSZ(cuX_v2)`), or None when it is not an identifier then."""
    seen = set()
    text = name
    while True:
        if re.fullmatch(r"[A-Za-z_]\w*", text):
            if text in seen:
                return text
            seen.add(text)
            body = macros.get(text)
            if not isinstance(body, str):
                return text
            text = body
            continue
        call = re.fullmatch(r"(\w+)\s*\(([^()]*)\)", text)
        if not call or not isinstance(macros.get(call.group(1)), tuple):
            return None
        params, body = macros[call.group(1)]
        args = [a.strip() for a in call.group(2).split(",")]
        if len(args) != len(params):
            return None
        for p, a in zip(params, args):
            body = re.sub(rf"\b{re.escape(p)}\b", a, body)
        text = re.sub(r"\s*##\s*", "", body).strip()


def header_functions(header):
    """{symbol: sorted public macro names} for the covered functions cuda.h declares, and the
    header's CUDA_VERSION."""
    text, macros = preprocess(header)
    found = {}
    for m in re.finditer(r"\bCUDAAPI\s+([A-Za-z_]\w*)\s*\(", text):
        symbol = expand(m.group(1), macros)
        if symbol is None:
            raise Failure(f"{header}: the declaration of {m.group(1)} does not expand to a name")
        if COVERED.match(symbol):
            found.setdefault(symbol, set())
    for name, body in macros.items():
        if isinstance(body, str) and name.startswith("cu"):
            symbol = expand(name, macros)
            if symbol != name and symbol in found:
                found[symbol].add(name)
    if not found:
        raise Failure(f"{header}: no function of the list found (is it cuda.h?)")
    version = macros.get("CUDA_VERSION", "?")
    return {s: sorted(m) for s, m in found.items()}, version


def runtime_functions(header):
    """The functions cuda_runtime_api.h declares (names after CUDARTAPI)."""
    with open(header, encoding="utf-8", errors="replace") as f:
        text = strip_c_comments(f.read())
    return set(re.findall(r"\bCUDARTAPI\s+(cuda\w+)\s*\(", text))


def runtime_candidates(symbol, macros):
    """The runtime names by convention, best first: from the symbol without its _vN suffix
    (cuGraphInstantiateWithFlags -> cudaGraphInstantiateWithFlags), then from each macro."""
    names = []
    for public in [re.sub(r"_v\d+$", "", symbol)] + macros:
        name = RUNTIME_EXCEPTIONS.get(public, "cuda" + public[2:])
        if name not in names:
            names.append(name)
    return names


def read_sources(src):
    """[(path, text without comments)] of the .rs files under src."""
    files = []
    for directory, _, names in os.walk(src):
        for name in sorted(names):
            if name.endswith(".rs"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                # Rust comments (line, doc and block); strings kept.
                text = re.sub(
                    r'("(?:\\.|[^"\\])*")|/\*.*?\*/|//[^\n]*',
                    lambda m: m.group(1) or "\n" * m.group(0).count("\n"),
                    text,
                    flags=re.S,
                )
                files.append((path, text))
    return sorted(files)


def sys_references(sources, names):
    """'path:line' of each `sys::<name>` in the sources, for any of names."""
    pattern = re.compile(r"\bsys::(" + "|".join(map(re.escape, names)) + r")(?![\w])")
    hits = []
    for path, text in sources:
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            hits.append(f"{os.path.relpath(path, ROOT)}:{line}")
    return hits


def parse_doc(doc):
    """[(line number, symbol, macros, runtime names, safe text)] of the doc's table rows whose
    first cell is a backticked cu* name."""
    rows = []
    with open(doc, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
        if not re.match(r"\s*\|\s*`cu\w*`", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            raise Failure(
                f"{doc}:{number}: a row has {len(cells)} cells, not 4 "
                "(driver | macro | runtime | safe API); no '|' inside a cell"
            )
        symbol = re.fullmatch(r"`(cu\w+)`", cells[0])
        if not symbol:
            raise Failure(f"{doc}:{number}: the first cell is not one backticked name: '{cells[0]}'")

        def names(cell, what):
            found = re.findall(r"`([^`]*)`", cell)
            rest = re.sub(r"`[^`]*`", "", cell).replace(",", "").strip()
            if rest or not all(re.fullmatch(r"\w+", n) for n in found):
                raise Failure(f"{doc}:{number}: the {what} cell holds other than backticked names: '{cell}'")
            return found

        rows.append(
            (number, symbol.group(1), names(cells[1], "macro"), names(cells[2], "runtime"), cells[3])
        )
    return rows


def check_safe_items(doc, number, text, sources):
    """The backticked names of a safe-API cell, each found in the sources."""
    items = re.findall(r"`([^`]+)`", text)
    if not items:
        raise Failure(
            f"{doc}:{number}: the safe API cell names no method in backticks and does not start "
            f"with 'none:': '{text}'"
        )
    everything = "\n".join(t for _, t in sources)
    for item in items:
        m = re.fullmatch(r"drop\((\w+)\)", item)
        if m:
            kinds = [("pub (?:struct|enum)", m.group(1))]
        elif re.fullmatch(r"cuda_graph::(\w+)", item):
            kinds = [("pub fn", item.split("::")[1])]
        elif re.fullmatch(r"(\w+)::(\w+)", item):
            owner, member = item.split("::")
            kinds = [("pub (?:struct|enum|trait)", owner)]
            kinds.append(("const" if member.isupper() else "fn", member))
        else:
            raise Failure(
                f"{doc}:{number}: '{item}' is not Type::method, drop(Type) or cuda_graph::function"
            )
        for keyword, name in kinds:
            if not re.search(rf"\b{keyword}\s+{re.escape(name)}\b", everything):
                raise Failure(f"{doc}:{number}: {item}: no '{keyword} {name}' in cuda-graph/src")
    return items


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--header", help=f"cuda.h (default: {DEFAULT_HEADER} under the repository)")
    parser.add_argument("--doc", default=os.path.join(ROOT, DEFAULT_DOC))
    parser.add_argument("--src", default=os.path.join(ROOT, DEFAULT_SRC))
    parser.add_argument("--list", action="store_true", help="print the header's functions, check nothing")
    args = parser.parse_args()
    header = args.header or os.path.join(ROOT, DEFAULT_HEADER)
    if not os.path.isfile(header):
        raise Failure(
            f"no cuda.h at {header}: run ci/fetch-cuda.sh 13.0, or pass --header path/to/cuda.h"
        )
    functions, version = header_functions(header)
    runtime_header = os.path.join(os.path.dirname(header), "cuda_runtime_api.h")
    if not os.path.isfile(runtime_header):
        raise Failure(f"no cuda_runtime_api.h beside {header}: the runtime names cannot be checked")
    runtime = runtime_functions(runtime_header)
    sources = read_sources(args.src)
    if not sources:
        raise Failure(f"no .rs file under {args.src}")

    def expected_runtime(symbol):
        return next((n for n in runtime_candidates(symbol, functions[symbol]) if n in runtime), None)

    if args.list:
        for symbol in sorted(functions):
            refs = sys_references(sources, [symbol] + functions[symbol])
            print(
                "\t".join(
                    [symbol, ",".join(functions[symbol]), expected_runtime(symbol) or "", " ".join(refs)]
                )
            )
        return 0

    rows = parse_doc(args.doc)
    doc = os.path.relpath(args.doc, ROOT)
    if doc.startswith(".."):
        doc = args.doc
    problems = []
    seen = {}
    wrapped = unwrapped = runtime_named = 0
    for number, symbol, macros, runtime_names, safe in rows:
        where = f"{doc}:{number}: {symbol}"
        if symbol in seen:
            problems.append(f"{where}: listed twice (also line {seen[symbol]})")
            continue
        seen[symbol] = number
        if symbol not in functions:
            problems.append(f"{where}: the doc lists it, {header} declares no such function of the list")
            continue
        if macros != functions[symbol]:
            want = ", ".join(functions[symbol]) or "none"
            problems.append(f"{where}: macro column {macros or 'empty'}, the header #defines {want} to it")
        want_runtime = expected_runtime(symbol)
        for name in runtime_names:
            if name not in runtime:
                problems.append(f"{where}: runtime name {name} is not declared in {runtime_header}")
        if len(runtime_names) > 1:
            problems.append(f"{where}: more than one runtime name")
        if not runtime_names and want_runtime:
            problems.append(f"{where}: runtime column empty, {runtime_header} declares {want_runtime}")
        runtime_named += bool(runtime_names)
        refs = sys_references(sources, [symbol] + functions[symbol])
        if safe.startswith("none:"):
            if len(safe) <= len("none:") + 1:
                problems.append(f"{where}: 'none:' without a reason")
            if refs:
                problems.append(
                    f"{where}: the doc says none, cuda-graph/src refers to it: {', '.join(refs)}"
                )
            unwrapped += 1
        else:
            try:
                check_safe_items(doc, number, safe, sources)
            except Failure as e:
                problems.append(str(e))
            if not refs:
                names = " or ".join(f"sys::{n}" for n in [symbol] + functions[symbol])
                problems.append(f"{where}: the doc names safe methods, cuda-graph/src has no {names}")
            wrapped += 1
    for symbol in sorted(set(functions) - set(seen)):
        problems.append(f"{doc}: {symbol} (declared in {header}) is missing")
    # The counts the doc states, as counted here.
    with open(args.doc, encoding="utf-8") as f:
        counts = re.findall(
            r"^Counts \(CUDA [\d.]+\): (\d+) functions; (\d+) made by the safe layer, (\d+) not\.$",
            f.read(),
            flags=re.M,
        )
    found = (str(len(functions)), str(wrapped), str(unwrapped))
    if len(counts) != 1:
        problems.append(
            f"{doc}: expected one line 'Counts (CUDA x.y): {found[0]} functions; {found[1]} made by "
            f"the safe layer, {found[2]} not.', found {len(counts)}"
        )
    elif counts[0] != found:
        problems.append(
            f"{doc}: the counts line says {counts[0][0]} functions, {counts[0][1]} made, "
            f"{counts[0][2]} not; the header and the rows give {found[0]}, {found[1]}, {found[2]}"
        )
    if problems:
        for p in problems:
            print(f"cuda-calls: {p}", file=sys.stderr)
        print(f"cuda-calls: FAILED, {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(
        f"cuda-calls: {len(functions)} functions of cuda.h (CUDA_VERSION {version}), each in {doc} "
        f"once; {wrapped} made by the safe layer (each found as sys::<name> in cuda-graph/src), "
        f"{unwrapped} not; {runtime_named} runtime names declared in cuda_runtime_api.h"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"cuda-calls: {e}", file=sys.stderr)
        sys.exit(1)
