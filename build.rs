//! The tests' probe: finds the servers the backend tests need, so that a test that cannot run
//! is reported as ignored, never as passed.
//!
//! libtest cannot ignore a test at run time, so the probe runs here, when the library is
//! built: for each shared server (tests/support/probe.rs), its variable's URL (`REDIS_URL`,
//! `REDIS_CLUSTER_URLS`, `DATABASE_URL`, `MYSQL_URL`) or else its default local address is
//! tried with a short connect timeout, and the server binaries for the tests' own servers are
//! looked for.
//! Each that is there sets a `cfg` flag; each backend test carries
//! `#[cfg_attr(not(<flag>), ignore = "...")]`. A Redis Cluster is the one shared server the
//! tests can stand in for: with `REDIS_CLUSTER_URLS` unset, nothing on 7001-7003 and
//! `redis-server` and `redis-cli` installed, its flag is set too, and the tests start a
//! private 3-node cluster on free ports when they first need it.
//!
//! Only a build with the feature a server serves looks for it (`CARGO_FEATURE_REDIS` for
//! Redis and `redis-server`, `CARGO_FEATURE_REDIS_CLUSTER`, `CARGO_FEATURE_POSTGRES` for
//! PostgreSQL and its binaries, `CARGO_FEATURE_MYSQL` for MySQL or MariaDB,
//! `CARGO_FEATURE_SES` and `CARGO_FEATURE_SMTP` for the Python fakes: moto's server and
//! aiosmtpd, in the Python that `TOWER_IDEMPOTENCY_PYTHON` names or the venv
//! `.ci/python-fakes.sh` makes in `target/python-fakes`). The tests' builds have every
//! feature (the package's dev-dependency on itself), so they look for every server; the
//! quickstart's build
//! (`sqlite` only) and a plain `cargo build` connect to nothing. The published crate leaves
//! this file out (the `include` list in Cargo.toml), so no user runs it.
//!
//! The trade-off: the answer is as old as the build. Cargo runs this script again when one of
//! the variables it names changes, not when a server starts or stops. A server started after
//! the build leaves its tests ignored (their reason says so) until the library is built
//! again: set `TOWER_IDEMPOTENCY_PROBE` to a new value, or touch this file. A server stopped
//! after the build makes its tests fail, never pass. With `TOWER_IDEMPOTENCY_REQUIRE_BACKENDS`
//! set (as `.ci/run` does) nothing is probed and every flag is set: every backend test runs,
//! and fails when its server is missing.

#[path = "tests/support/probe.rs"]
mod probe;

const REQUIRE_BACKENDS_VAR: &str = "TOWER_IDEMPOTENCY_REQUIRE_BACKENDS";

/// Whether the library is being built with `feature` (cargo sets `CARGO_FEATURE_<NAME>`).
fn built_with(feature: &str) -> bool {
    let name = feature.to_uppercase().replace('-', "_");
    std::env::var_os(format!("CARGO_FEATURE_{name}")).is_some()
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=tests/support/probe.rs");
    println!("cargo::rerun-if-env-changed={REQUIRE_BACKENDS_VAR}");
    println!("cargo::rerun-if-env-changed=TOWER_IDEMPOTENCY_PROBE");
    println!("cargo::rerun-if-env-changed={}", probe::PYTHON_VAR);
    let required = std::env::var_os(REQUIRE_BACKENDS_VAR).is_some();

    for server in &probe::SERVERS {
        println!("cargo::rustc-check-cfg=cfg({})", server.cfg);
        if required {
            println!("cargo::rustc-cfg={}", server.cfg);
        } else if built_with(server.feature) {
            println!("cargo::rerun-if-env-changed={}", server.var);
            if server.answers() {
                println!("cargo::rustc-cfg={}", server.cfg);
            } else if server.own_instead() {
                // The tests start a private one (tests/support/servers.rs).
                println!("cargo::rustc-cfg={}", server.cfg);
            } else {
                let instead = if server.cfg == "backend_redis_cluster" && !server.configured() {
                    ", and no redis-server and redis-cli to start one"
                } else {
                    ""
                };
                println!(
                    "cargo::warning=no server answers at {} ({}){instead}: its tests are ignored",
                    server.url(),
                    server.var
                );
            }
        }
    }

    // The binaries are looked for only when their feature is built: `found` is called then.
    for (cfg, feature, found, what) in [
        (
            probe::REDIS_BINARIES_CFG,
            "redis",
            probe::redis_binaries as fn() -> bool,
            "redis-server and redis-cli",
        ),
        (
            probe::POSTGRES_BINARIES_CFG,
            "postgres",
            probe::postgres_binaries,
            "PostgreSQL's initdb and pg_ctl",
        ),
        (
            probe::MOTO_CFG,
            "ses",
            probe::moto,
            "moto's server (Python; .ci/python-fakes.sh installs it)",
        ),
        (
            probe::AIOSMTPD_CFG,
            "smtp",
            probe::aiosmtpd,
            "aiosmtpd (Python; .ci/python-fakes.sh installs it)",
        ),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if required || (built_with(feature) && found()) {
            println!("cargo::rustc-cfg={cfg}");
        } else if built_with(feature) {
            println!("cargo::warning={what} not found: the tests that start their own are ignored");
        }
    }
}
