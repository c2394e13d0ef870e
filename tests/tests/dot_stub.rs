//! Untrusted text stays text (the design guide's "The safety model"): `Graph::to_dot` with
//! labels made to break out of their DOT strings, on real graphs without a GPU (this binary
//! loads `stub-driver/null_cuda.c` as its driver, as `record_stub.rs` does).
//!
//! The DOT text is read back by a small tokenizer and parser written here, with the lexical
//! rules of the DOT language: a quoted string ends at the first `"` not escaped by a backslash,
//! and a backslash escapes the character after it (so `\\` is one backslash and the `"` after it
//! closes the string). The test asserts that every string closes where the renderer meant it
//! to, that the statements are exactly the graph's nodes and edges, and that nothing the labels
//! say becomes a statement.
//!
//! Where the stub is missing (a suite packed on one machine and run on another), the test
//! prints `SKIPPED ...` and passes.

mod stub_common;

use std::collections::BTreeMap;

use cuda_graph::{AllocParams, Graph, KernelArgs};
use stub_common::{BYTES, N, config, stub};

/// A label that closes its string if backslashes are not escaped, injects a node with a link,
/// and comments out the rest of the line; then a raw newline that starts a new statement, a
/// NUL byte, and a backslash at the end.
const INJECTION: &str =
    "x\\\"]; injected [URL=<javascript:alert(1)>]; //\nn0 -> n0 [color=red]; \0 tail\\";

/// A DOT token.
#[derive(Clone, Debug, PartialEq)]
enum Token {
    /// An identifier or a number.
    Id(String),
    /// A quoted string, unescaped (`\"` → `"`, `\\` → `\`; other escapes such as `\n` and `\l`
    /// are kept as written, as graphviz does).
    Quoted(String),
    /// An HTML string `<...>`, without its outer brackets.
    Html(String),
    /// `[`, `]`, `{`, `}`, `;`, `,`, `=`, `:`, `->` or `--`.
    Punct(&'static str),
}

/// Splits DOT text into tokens, skipping white space and comments. Fails on an unterminated
/// string, a raw newline or NUL inside a quoted string (the renderer must escape them), and on
/// a character DOT does not allow outside strings.
fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let line_of = |at: usize| chars[..at].iter().filter(|&&c| c == '\n').count() + 1;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                let start = i;
                i += 2;
                while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                    i += 1;
                }
                if i + 1 >= chars.len() {
                    return Err(format!(
                        "line {}: unterminated comment /* ... (it swallows the rest of the file)",
                        line_of(start)
                    ));
                }
                i += 2;
            }
            '#' if i == 0 || chars[i - 1] == '\n' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '"' => {
                let start = i;
                i += 1;
                let mut value = String::new();
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err(format!(
                            "line {}: unterminated quoted string (it swallows the rest of the file)",
                            line_of(start)
                        ));
                    };
                    match c {
                        '"' => {
                            i += 1;
                            break;
                        }
                        '\\' => {
                            let Some(&next) = chars.get(i + 1) else {
                                return Err(format!(
                                    "line {}: a backslash ends the file inside a string",
                                    line_of(start)
                                ));
                            };
                            if next == '\n' || next == '\0' {
                                return Err(format!(
                                    "line {}: an escaped raw {} inside a quoted string",
                                    line_of(i),
                                    if next == '\n' { "newline" } else { "NUL" }
                                ));
                            }
                            if next == '"' || next == '\\' {
                                value.push(next);
                            } else {
                                value.push('\\');
                                value.push(next);
                            }
                            i += 2;
                        }
                        '\n' => {
                            return Err(format!(
                                "line {}: a raw newline inside a quoted string (labels must escape it)",
                                line_of(i)
                            ));
                        }
                        '\0' => {
                            return Err(format!(
                                "line {}: a NUL byte inside a quoted string",
                                line_of(i)
                            ));
                        }
                        c => {
                            value.push(c);
                            i += 1;
                        }
                    }
                }
                tokens.push(Token::Quoted(value));
            }
            '<' => {
                let start = i;
                let mut depth = 0usize;
                let mut value = String::new();
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err(format!("line {}: unterminated HTML string", line_of(start)));
                    };
                    i += 1;
                    match c {
                        '<' => depth += 1,
                        '>' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        break;
                    }
                    if !(c == '<' && depth == 1) {
                        value.push(c);
                    }
                }
                tokens.push(Token::Html(value));
            }
            '-' if matches!(chars.get(i + 1), Some('>') | Some('-')) => {
                tokens.push(Token::Punct(if chars[i + 1] == '>' { "->" } else { "--" }));
                i += 2;
            }
            '[' | ']' | '{' | '}' | ';' | ',' | '=' | ':' => {
                tokens.push(Token::Punct(match c {
                    '[' => "[",
                    ']' => "]",
                    '{' => "{",
                    '}' => "}",
                    ';' => ";",
                    ',' => ",",
                    '=' => "=",
                    _ => ":",
                }));
                i += 1;
            }
            c if c.is_alphanumeric() || c == '_' || c == '.' || c == '-' || !c.is_ascii() => {
                let mut id = String::new();
                while let Some(&c) = chars.get(i) {
                    let part = c.is_alphanumeric()
                        || c == '_'
                        || c == '.'
                        || (c == '-' && id.is_empty())
                        || (!c.is_ascii() && !c.is_whitespace());
                    if !part {
                        break;
                    }
                    id.push(c);
                    i += 1;
                }
                tokens.push(Token::Id(id));
            }
            other => {
                return Err(format!(
                    "line {}: character {other:?} is not DOT outside a string",
                    line_of(i)
                ));
            }
        }
    }
    Ok(tokens)
}

/// The statements of a DOT graph: node statements (by name, with their attributes), edges
/// (from, to, attributes), and the names of default-attribute statements and graph attributes.
#[derive(Debug, Default)]
struct Dot {
    nodes: Vec<(String, BTreeMap<String, String>)>,
    edges: Vec<(String, String, BTreeMap<String, String>)>,
    other: Vec<String>,
}

/// Reads `digraph NAME { statements }` from the tokens.
fn parse(tokens: &[Token]) -> Result<Dot, String> {
    let mut at = 0;
    let next = |at: &mut usize| -> Result<Token, String> {
        let t = tokens
            .get(*at)
            .cloned()
            .ok_or_else(|| "unexpected end of the DOT text".to_string())?;
        *at += 1;
        Ok(t)
    };
    let expect = |at: &mut usize, want: Token| -> Result<(), String> {
        let got = next(at)?;
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "token {}: expected {want:?}, found {got:?}",
                *at - 1
            ))
        }
    };
    let id = |t: Token, at: usize| -> Result<String, String> {
        match t {
            Token::Id(s) | Token::Quoted(s) => Ok(s),
            other => Err(format!("token {at}: expected a name, found {other:?}")),
        }
    };
    let attributes = |at: &mut usize| -> Result<BTreeMap<String, String>, String> {
        let mut map = BTreeMap::new();
        while tokens.get(*at) == Some(&Token::Punct("[")) {
            *at += 1;
            loop {
                match next(at)? {
                    Token::Punct("]") => break,
                    Token::Punct(",") | Token::Punct(";") => {}
                    Token::Id(key) => {
                        expect(at, Token::Punct("="))?;
                        let value = match next(at)? {
                            Token::Id(v) | Token::Quoted(v) | Token::Html(v) => v,
                            other => {
                                return Err(format!(
                                    "token {}: attribute {key} has no value ({other:?})",
                                    *at - 1
                                ));
                            }
                        };
                        map.insert(key, value);
                    }
                    other => {
                        return Err(format!(
                            "token {}: expected an attribute, found {other:?}",
                            *at - 1
                        ));
                    }
                }
            }
        }
        Ok(map)
    };

    expect(&mut at, Token::Id("digraph".into()))?;
    if matches!(tokens.get(at), Some(Token::Id(_)) | Some(Token::Quoted(_))) {
        at += 1;
    }
    expect(&mut at, Token::Punct("{"))?;
    let mut dot = Dot::default();
    loop {
        let first = next(&mut at)?;
        match first {
            Token::Punct("}") => break,
            Token::Punct(";") => continue,
            first => {
                let name = id(first, at - 1)?;
                match tokens.get(at) {
                    Some(Token::Punct("=")) => {
                        at += 1;
                        next(&mut at)?;
                        dot.other.push(name);
                    }
                    Some(Token::Punct("->")) => {
                        let mut chain = vec![name];
                        while tokens.get(at) == Some(&Token::Punct("->")) {
                            at += 1;
                            chain.push(id(next(&mut at)?, at - 1)?);
                        }
                        let attrs = attributes(&mut at)?;
                        for pair in chain.windows(2) {
                            dot.edges
                                .push((pair[0].clone(), pair[1].clone(), attrs.clone()));
                        }
                    }
                    _ => {
                        let attrs = attributes(&mut at)?;
                        if ["node", "edge", "graph"].contains(&name.as_str()) {
                            dot.other.push(name);
                        } else {
                            dot.nodes.push((name, attrs));
                        }
                    }
                }
            }
        }
    }
    if at != tokens.len() {
        return Err(format!(
            "{} tokens after the graph's closing brace: {:?}",
            tokens.len() - at,
            &tokens[at..]
        ));
    }
    Ok(dot)
}

/// Labels made to escape their strings, on every kind of text `to_dot` prints (node labels,
/// allocation labels in nodes and in the legend), come back as the graph's own nodes and edges
/// and nothing else: every string closes where it should, there is one node statement per node
/// of the graph and one plain edge per dependency, no statement names the injected node, and
/// the label's text survives the escaping.
#[test]
fn to_dot_keeps_adversarial_labels_inside_their_strings() {
    let Some((device, fill, _module)) =
        stub("to_dot_keeps_adversarial_labels_inside_their_strings")
    else {
        return;
    };
    let mut graph = Graph::new(&device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(
            &[],
            &AllocParams::new(&device, BYTES).label("alloc \" } \\\" \\"),
        )
        .unwrap();
    let args = KernelArgs::new().ptr(&buf).value(N).value(1u32);
    // SAFETY: the stub driver runs nothing; the arguments match fill_u32(p, n, v).
    let kernel = unsafe { graph.add_kernel_node(&[alloc], &fill, config(), &args) }.unwrap();
    graph.set_label(kernel, INJECTION).unwrap();
    let free = graph.add_mem_free_node(&[kernel], &buf).unwrap();
    graph.set_label(free, "\\").unwrap();
    let empty = graph.add_empty_node(&[kernel]).unwrap();
    graph.set_label(empty, "*/ /* \" # \n#").unwrap();
    graph.add_dependency(alloc, empty).unwrap();

    let dot = graph.to_dot();
    println!("{dot}");
    let tokens = tokenize(&dot).unwrap_or_else(|e| {
        panic!("the DOT text does not tokenize (a label left its string): {e}")
    });
    let parsed = parse(&tokens)
        .unwrap_or_else(|e| panic!("the DOT text does not parse (a label left its string): {e}"));
    assert!(!dot.contains('\0'), "the DOT text contains a NUL byte");

    let names: Vec<&str> = parsed.nodes.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        !names.contains(&"injected")
            && !parsed
                .edges
                .iter()
                .any(|(f, t, _)| f == "injected" || t == "injected"),
        "a label injected a node: {names:?}"
    );
    let expected: Vec<String> = (0..graph.nodes().len()).map(|i| format!("n{i}")).collect();
    let mut graph_nodes: Vec<&str> = names.iter().copied().filter(|n| *n != "legend").collect();
    graph_nodes.sort();
    let mut expected_sorted: Vec<&str> = expected.iter().map(String::as_str).collect();
    expected_sorted.sort();
    assert_eq!(
        graph_nodes, expected_sorted,
        "node statements (besides the legend) are not exactly the graph's nodes"
    );

    let mut plain: Vec<(String, String)> = parsed
        .edges
        .iter()
        .filter(|(_, _, attrs)| attrs.get("style").map(String::as_str) != Some("dashed"))
        .map(|(f, t, _)| (f.clone(), t.clone()))
        .collect();
    plain.sort();
    let mut deps: Vec<(String, String)> = graph
        .nodes()
        .iter()
        .enumerate()
        .flat_map(|(i, n)| {
            n.deps()
                .iter()
                .map(move |&d| (format!("n{d}"), format!("n{i}")))
        })
        .collect();
    deps.sort();
    assert_eq!(
        deps.len(),
        4,
        "the graph has the four dependencies it was built with"
    );
    assert_eq!(
        plain, deps,
        "the plain edges are not exactly the graph's dependencies"
    );

    let label = |node: usize| {
        parsed
            .nodes
            .iter()
            .find(|(n, _)| *n == format!("n{node}"))
            .and_then(|(_, attrs)| attrs.get("label").cloned())
            .unwrap_or_else(|| panic!("node n{node} has no label"))
    };
    let kernel_label = label(kernel.index());
    assert!(
        kernel_label.contains("x\\\"]; injected [URL=<javascript:alert(1)>]; //"),
        "the kernel node's label lost its text: {kernel_label:?}"
    );
    assert!(
        label(alloc.index()).contains("alloc \" } \\\" \\"),
        "the alloc node's label lost its text: {:?}",
        label(alloc.index())
    );
}
