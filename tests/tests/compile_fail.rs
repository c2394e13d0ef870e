//! Compile-fail tests (`trybuild`): misuses that the safe API makes impossible to write, each a
//! program in `tests/compile-fail/` whose compiler diagnostics are checked against the `.stderr`
//! beside it. They complete the misuse catalog of `misuse.rs`, which shows what CUDA answers to
//! the same misuse made through raw handles:
//!
//! | program | misuse |
//! |---|---|
//! | `exec_graph_is_not_sync` | two threads launching one executable graph without a lock |
//! | `graph_is_not_sync` | two threads sharing one graph under construction |
//! | `capture_used_after_end` | ending a capture twice, using it after its end |
//! | `capture_cannot_escape_its_closure` | keeping `capture`'s guard after the capture ended |
//! | `capture_is_not_sync` | using a capture guard from another thread |
//! | `graph_is_not_clone` | cloning a graph (CUDA cannot when it has memory nodes) |
//! | `free_node_needs_a_graph_allocation` | a free node for an address no graph allocated |
//! | `stream_allocation_outlives_its_stream` | a stream-ordered allocation outliving its stream |
//! | `kernel_launch_needs_unsafe` | launching a kernel without vouching for its arguments |
//! | `instantiate_unchecked_needs_unsafe` | skipping the lifetime checks without vouching for the graph |
//! | `capture_guard_needs_an_owned_stream` | a capture guard on a stream nobody drops (forgotten, it would leave the stream capturing for good) |
//! | `as_stream_is_sealed` | a stream type of one's own, whose raw handle the crate would hand the driver unchecked (a destroyed stream, or another at each call) |
//! | `device_buffer_of_reference`, `_of_bool`, `_of_char` | reading device memory back as a type that not every bit pattern is (a null reference, a `bool` of 2, a surrogate `char`) |
//!
//! The diagnostics are the compiler's, so a new Rust release may reword them: regenerate with
//! `TRYBUILD=overwrite cargo test -p cuda-graph-tests --test compile_fail` and review the diff.
//! Needs cargo: where there is none (a GPU machine running the packed suite), it prints
//! `SKIPPED` and returns, or, under `CUDA_GRAPH_REQUIRE_GPU=1`, fails, so that a GPU run never
//! counts it as passed; `ci/gpu-run.sh` excludes it by name where there is no cargo.

use std::process::Command;

/// Whether cargo can be run here (trybuild builds each program with it).
fn cargo_available() -> bool {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Command::new(cargo)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn misuses_the_safe_api_makes_impossible_do_not_compile() {
    if !cargo_available() {
        cuda_graph_tests::cannot_run(
            "misuses_the_safe_api_makes_impossible_do_not_compile",
            "no cargo to compile with",
        );
        return;
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("compile-fail/*.rs");
}
