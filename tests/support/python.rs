//! The Python fakes, started by the tests on 127.0.0.1 and a free port, and stopped when
//! dropped: moto's server mode (an independent implementation of Amazon SES v2) and aiosmtpd
//! with the handler in `tests/support/smtp_server.py`. `.ci/python-fakes.sh` installs both,
//! pinned; [`super::probe::python`] finds them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::probe;

/// The longest a fake has to say it listens.
const STARTUP: Duration = Duration::from_secs(30);

/// A fake's process, killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `args` under the fakes' Python and waits (bounded) for the line of its output, on
/// stdout or stderr, that `port_of` reads a port from.
fn start(args: &[&str], port_of: fn(&str) -> Option<u16>) -> (Process, SocketAddr) {
    let mut child = Command::new(probe::python())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {args:?} (run .ci/python-fakes.sh): {e}"));
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    for stream in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            // Read to the end, so a chatty server never blocks on a full pipe.
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Some(port) = port_of(&line) {
                    let _ = tx.send(port);
                }
            }
        });
    }
    let process = Process(child);
    let port = rx
        .recv_timeout(STARTUP)
        .unwrap_or_else(|_| panic!("{args:?} did not say its port within {STARTUP:?}"));
    (process, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// moto's server mode, every service, on a free port.
pub struct Moto {
    _process: Process,
    pub addr: SocketAddr,
}

impl Moto {
    pub fn start() -> Self {
        // werkzeug says " * Running on http://127.0.0.1:<port>".
        let (process, addr) = start(
            &["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            |line| {
                line.split("Running on http://127.0.0.1:")
                    .nth(1)?
                    .trim()
                    .parse()
                    .ok()
            },
        );
        Self {
            _process: process,
            addr,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// aiosmtpd with the tests' handler, and the journal of the messages it took.
pub struct SmtpServer {
    _process: Process,
    pub addr: SocketAddr,
    journal: PathBuf,
}

impl SmtpServer {
    pub fn start() -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let journal = std::env::temp_dir().join(format!(
            "tower-idempotency-smtp-{}-{n}.jsonl",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&journal);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_server.py");
        let script = script.to_str().expect("a UTF-8 path");
        let journal_arg = journal.to_str().expect("a UTF-8 path");
        let (process, addr) = start(&[script, journal_arg], |line| {
            line.strip_prefix("port ")?.trim().parse().ok()
        });
        Self {
            _process: process,
            addr,
            journal,
        }
    }

    /// The messages taken, in order: one JSON object each.
    pub fn taken(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.journal)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a journal line is JSON"))
            .collect()
    }

    /// How many messages were taken with `message_id` (angle brackets included).
    pub fn taken_with_id(&self, message_id: &str) -> usize {
        self.taken()
            .iter()
            .filter(|m| m["message_id"] == message_id)
            .count()
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.journal);
    }
}
