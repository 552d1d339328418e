//! Which servers and server binaries the backend tests can use on this machine. Read by the
//! package's build script (build.rs), which turns the answers into `cfg` flags that mark the
//! tests that cannot run as ignored, and by [`super::stores`] and [`super::servers`], which
//! find the same servers and binaries when the tests run.
//!
//! Only `std`: a build script has no other dependency.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A shared server the backend tests use, found at its variable's URL or else at its default.
pub struct Server {
    /// The environment variable that names it: one URL, or several separated by commas.
    pub var: &'static str,
    /// Where it is looked for when the variable is unset: the address a local install or
    /// `.ci/run` listens on.
    pub default: &'static str,
    /// The `cfg` flag the build script sets when it answers.
    pub cfg: &'static str,
    /// The library's feature that the tests using it need: the build script looks for the
    /// server only when the library is built with it.
    pub feature: &'static str,
}

/// The shared servers, in the order the build script reports them.
pub const SERVERS: [Server; 4] = [
    Server {
        var: "REDIS_URL",
        default: "redis://127.0.0.1:6379",
        cfg: "backend_redis",
        feature: "redis",
    },
    Server {
        var: "REDIS_CLUSTER_URLS",
        // The ports of .ci/redis-cluster.sh.
        default: "redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003",
        cfg: "backend_redis_cluster",
        feature: "redis-cluster",
    },
    Server {
        var: "DATABASE_URL",
        default: "postgres://postgres@127.0.0.1:5432/test",
        cfg: "backend_postgres",
        feature: "postgres",
    },
    Server {
        var: "MYSQL_URL",
        default: "mysql://root@127.0.0.1:3306/test",
        cfg: "backend_mysql",
        feature: "mysql",
    },
];

/// The `cfg` flag set when `redis-server` and `redis-cli` are on `PATH`.
pub const REDIS_BINARIES_CFG: &str = "backend_redis_binaries";
/// The `cfg` flag set when PostgreSQL's server binaries can be run (see
/// [`postgres_binaries`]).
pub const POSTGRES_BINARIES_CFG: &str = "backend_postgres_binaries";

/// How long a server has to accept a connection before it counts as absent.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

impl Server {
    /// The URL the tests use: the variable's, when set and not empty, else the default.
    pub fn url(&self) -> String {
        match std::env::var(self.var) {
            Ok(url) if !url.is_empty() => url,
            _ => self.default.to_owned(),
        }
    }

    /// Whether the variable names the server (set and not empty).
    pub fn configured(&self) -> bool {
        std::env::var(self.var).is_ok_and(|url| !url.is_empty())
    }

    /// Whether the tests start a server of their own in its place when none answers at the
    /// default address and the variable is unset: a Redis Cluster, from `redis-server` and
    /// `redis-cli` ([`super::servers::RedisCluster`]), so that its tests run on a machine
    /// with Redis installed and no cluster set up.
    pub fn own_instead(&self) -> bool {
        self.cfg == "backend_redis_cluster" && !self.configured() && redis_binaries()
    }

    /// Whether every server of [`url`](Self::url) accepts a TCP connection. A URL whose
    /// address cannot be read (a key-value connection string, say) counts as answering: the
    /// test then runs and says what is wrong.
    pub fn answers(&self) -> bool {
        self.url().split(',').all(|url| match address(url.trim()) {
            Some(addresses) => addresses
                .iter()
                .any(|a| TcpStream::connect_timeout(a, CONNECT_TIMEOUT).is_ok()),
            None => true,
        })
    }
}

/// The socket addresses of a `scheme://[user[:password]@]host[:port][/...]` URL, with the
/// scheme's default port; `None` when it has no such shape.
fn address(url: &str) -> Option<Vec<SocketAddr>> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let default_port = match scheme {
        "redis" | "rediss" => 6379,
        "postgres" | "postgresql" => 5432,
        "mysql" => 3306,
        _ => return None,
    };
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        match after.strip_prefix(':') {
            Some(port) => (host, port.parse().ok()?),
            None => (host, default_port),
        }
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().ok()?),
            None => (host_port, default_port),
        }
    };
    Some((host, port).to_socket_addrs().ok()?.collect())
}

/// The path of the executable `name` on `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Whether `redis-server` and `redis-cli` are on `PATH`, for the servers of the tests' own.
pub fn redis_binaries() -> bool {
    on_path("redis-server").is_some() && on_path("redis-cli").is_some()
}

/// Whether a PostgreSQL cluster of the tests' own can be started: the server binaries are
/// found, and, as PostgreSQL refuses to run as root, `runuser` when we are root.
pub fn postgres_binaries() -> bool {
    postgres_bindir().is_some() && (!running_as_root() || on_path("runuser").is_some())
}

/// Whether this process runs as root.
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// PostgreSQL's server binaries: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian installs them off `PATH`), else `PATH`.
pub fn postgres_bindir() -> Option<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Some(dir);
    }
    on_path("initdb").and_then(|p| p.parent().map(Path::to_path_buf))
}

/// The `cfg` flag set when the Python fakes of the SES tests (moto's server mode) run.
pub const MOTO_CFG: &str = "backend_moto";
/// The `cfg` flag set when the Python fakes of the SMTP tests (aiosmtpd) run.
pub const AIOSMTPD_CFG: &str = "backend_aiosmtpd";
/// Names the Python that has the fakes, instead of `target/python-fakes/bin/python`.
pub const PYTHON_VAR: &str = "TOWER_IDEMPOTENCY_PYTHON";

/// The Python that `.ci/python-fakes.sh` installs the fakes into: [`PYTHON_VAR`], else the
/// repository's `target/python-fakes` venv.
pub fn python() -> PathBuf {
    match std::env::var_os(PYTHON_VAR) {
        Some(python) if !python.is_empty() => PathBuf::from(python),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/python-fakes/bin/python"),
    }
}

/// Whether [`python`] runs and imports `module`.
pub fn python_has(module: &str) -> bool {
    Command::new(python())
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Whether moto's server mode can be started.
pub fn moto() -> bool {
    python_has("moto.server")
}

/// Whether aiosmtpd can be started.
pub fn aiosmtpd() -> bool {
    python_has("aiosmtpd.smtp")
}
