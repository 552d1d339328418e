//! A fresh clone's first command stays fast: `cargo run -p quickstart` builds the library with
//! `sqlite` and the quickstart's own few dependencies, never one of the crates the library's
//! tests, benches and examples depend on (web servers and clients, criterion, proptest, ...).
//!
//! The quickstart is a package of its own (examples/quickstart), so cargo resolves its build
//! without the library's dev-dependencies; this checks that it stays so. `cargo tree -p
//! quickstart -e normal,build` lists the crates that `cargo run -p quickstart` compiles (cargo
//! unifies features over the packages a command selects, here the quickstart alone) and
//! compiles nothing, so the check costs about a second.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const LIBRARY: &str = "tower-idempotency";

/// The standard output of `cargo <args>`, run in the repository.
fn cargo(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO"))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args(args)
        .output()
        .expect("run cargo");
    assert!(
        output.status.success(),
        "cargo {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("cargo prints UTF-8")
}

/// The names of the crates a build of `package` with `features` compiles: its normal and
/// build dependencies, transitively, and itself.
fn build_set(package: &str, features: &[&str]) -> BTreeSet<String> {
    let features = features.join(",");
    let mut args = vec!["tree", "--locked", "-p", package, "-e", "normal,build"];
    if !features.is_empty() {
        args.extend(["--features", &features]);
    }
    args.extend(["--prefix", "none", "--no-dedupe"]);
    cargo(&args)
        .lines()
        .filter_map(|line| line.split(' ').next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The names of the library's dev-dependencies, from its manifest, but the library itself
/// (it dev-depends on itself with every feature).
fn dev_dependencies() -> BTreeSet<String> {
    let metadata: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--locked",
        "--no-deps",
        "--format-version",
        "1",
    ]))
    .expect("cargo metadata prints JSON");
    let library = metadata["packages"]
        .as_array()
        .expect("a package list")
        .iter()
        .find(|package| package["name"] == LIBRARY)
        .expect("the library is a package of the workspace");
    library["dependencies"]
        .as_array()
        .expect("a dependency list")
        .iter()
        .filter(|dependency| dependency["kind"] == "dev")
        .map(|dependency| dependency["name"].as_str().expect("a name").to_owned())
        .filter(|name| name != LIBRARY)
        .collect()
}

#[test]
fn the_quickstart_builds_none_of_the_librarys_dev_dependencies() {
    let quickstart = build_set("quickstart", &[]);
    assert!(
        quickstart.contains(LIBRARY) && quickstart.contains("rusqlite"),
        "the quickstart's build has the library and its store: {quickstart:?}"
    );
    // What the library needs itself with the quickstart's feature: a dev-dependency found
    // there (tokio, tower, libc under getrandom) is not one that the tests brought in.
    let library = build_set(LIBRARY, &["sqlite"]);
    let dev = dev_dependencies();
    assert!(!dev.is_empty(), "the library has dev-dependencies");
    let leaked: Vec<_> = dev
        .iter()
        .filter(|name| quickstart.contains(*name) && !library.contains(*name))
        .collect();
    assert!(
        leaked.is_empty(),
        "`cargo run -p quickstart` compiles the library's dev-dependencies {leaked:?}"
    );
}
