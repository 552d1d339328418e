//! A fresh clone is fast: `cargo run --example quickstart` compiles the library and what the
//! quickstart needs, not the test suite's web servers, benches and backends.
//!
//! The crates counted are those `cargo tree` lists under the root package when it resolves the
//! workspace's default members together, with dev-dependencies: cargo unifies the features of
//! a crate across every package a command selects, and `cargo run` selects the default
//! members, so the suite's features on a shared crate (tokio's `net` for the backends, say)
//! reach the quickstart's build too. Measured against a build in an empty target dir, this
//! set is exactly the crates that build compiles (one `Compiling` line each). `cargo tree`
//! compiles nothing, so the check costs a second.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The most crates a fresh `cargo run --example quickstart` may compile: issue 14's target,
/// met exactly (see BENCHMARKS.md, "A fresh clone"), so any crate a change or a `cargo
/// update` adds fails this test with the list. What it took to get there:
/// - the suite uses no tokio feature that brings crates the library does not need
///   (`process` brought signal-hook-registry and errno: tests spawn children with
///   `std::process`);
/// - `rusqlite` without its statement cache (hashlink, hashbrown, foldhash): `SqliteStore`
///   prepares its statements once on its own thread;
/// - tokens read the OS's random source a block at a time instead of uuid's `fast-rng`
///   (rand, chacha20, cpufeatures);
/// - a token is a UUID v4 of the crate's own: `uuid` comes only with `postgres` (or the
///   `uuid` feature), which left room for `hashbrown` in `MemoryStore`.
///
/// SQLite compiled in is 11 of the 60; the suite's features on crates the library shares
/// (tokio `net` and `macros`, futures-util's macros and io, tracing's attributes, tower's
/// `limit`) add about 10 through cargo's feature unification across the default members.
const TARGET: usize = 60;

/// The crates (`name version`) a fresh `cargo run --example quickstart` compiles, this
/// package's own library among them.
fn quickstart_crates() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO"))
        .current_dir(&root)
        // Every line starts with its depth; `0` marks the root of each member's tree.
        .args([
            "tree",
            "--locked",
            "-e",
            "normal,build,dev",
            "--prefix",
            "depth",
        ])
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut lines = stdout.lines();
    let first = lines.next().expect("cargo tree printed a tree");
    assert!(
        first.starts_with("0tower-idempotency v"),
        "the first tree is the root package's: {first}"
    );
    std::iter::once(first)
        .chain(lines.take_while(|line| !line.starts_with('0')))
        .filter_map(|line| {
            let mut words = line
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .split(' ');
            Some(format!("{} {}", words.next()?, words.next()?))
        })
        .collect()
}

#[test]
fn quickstart_on_a_fresh_clone_compiles_at_most_the_target_number_of_crates() {
    let crates = quickstart_crates();
    assert!(
        crates.iter().any(|c| c.starts_with("tokio ")),
        "the set has the quickstart's runtime: {crates:?}"
    );
    assert!(
        crates.len() <= TARGET,
        "the quickstart compiles {} crates, more than {TARGET}:\n{}",
        crates.len(),
        crates.iter().cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn quickstart_compiles_none_of_the_suites_heavy_dependencies() {
    let crates = quickstart_crates();
    for heavy in [
        "axum ",
        "hyper ",
        "reqwest ",
        "criterion ",
        "proptest ",
        "redis ",
    ] {
        assert!(
            !crates.iter().any(|c| c.starts_with(heavy)),
            "the quickstart compiles {heavy}: {crates:?}"
        );
    }
}
