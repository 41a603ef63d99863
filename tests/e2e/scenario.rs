//! Failure reporting for the end-to-end scenarios: every failure names the step it happened in
//! and shows the logs of every container started so far (the supervisor's log first of all),
//! whether it comes from a check here or from a panic deeper down.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How much of each log a failure shows (the end of it, where the cause usually is).
const LOG_TAIL_LINES: usize = 400;

pub struct Scenario {
    name: &'static str,
    step: RefCell<String>,
    logs: RefCell<Vec<(String, PathBuf)>>,
    started: Instant,
    reported: Cell<bool>,
}

impl Scenario {
    pub fn new(name: &'static str) -> Scenario {
        Scenario {
            name,
            step: RefCell::new("setup".into()),
            logs: RefCell::new(Vec::new()),
            started: Instant::now(),
            reported: Cell::new(false),
        }
    }

    /// Enter a step; later failures are attributed to it.
    pub fn step(&self, name: &str) {
        eprintln!(
            "[{} +{:.1}s] step: {name}",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
        *self.step.borrow_mut() = name.to_owned();
    }

    /// Show this log on failure.
    pub fn watch_log(&self, label: &str, path: &Path) {
        self.logs
            .borrow_mut()
            .push((label.to_owned(), path.to_owned()));
    }

    /// Fail the current step.
    pub fn fail(&self, msg: impl std::fmt::Display) -> ! {
        self.reported.set(true);
        panic!(
            "e2e {}: step `{}` failed: {msg}\n{}",
            self.name,
            self.step.borrow(),
            self.logs_text()
        );
    }

    /// Unwrap a result, failing the current step with the error and its causes.
    pub fn ok<T>(&self, r: anyhow::Result<T>) -> T {
        r.unwrap_or_else(|e| self.fail(format!("{e:#}")))
    }

    pub fn check(&self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.fail(msg());
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn logs_text(&self) -> String {
        let mut out = String::new();
        for (label, path) in self.logs.borrow().iter() {
            let text = std::fs::read_to_string(path)
                .map(|t| strip_ansi(&t))
                .unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()));
            let lines: Vec<&str> = text.lines().collect();
            let skip = lines.len().saturating_sub(LOG_TAIL_LINES);
            out.push_str(&format!(
                "----- log of {label} ({}){} -----\n",
                path.display(),
                if skip > 0 {
                    format!(", last {LOG_TAIL_LINES} lines")
                } else {
                    String::new()
                }
            ));
            for l in &lines[skip..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        if out.is_empty() {
            out.push_str("(no container was started yet)\n");
        }
        out
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        // A panic that did not come through `fail` (an unwrap in shared support code, say)
        // still gets its step and the logs.
        if std::thread::panicking() && !self.reported.get() {
            eprintln!(
                "e2e {}: panicked during step `{}`\n{}",
                self.name,
                self.step.borrow(),
                self.logs_text()
            );
        }
    }
}

/// Logs are read by people here: drop terminal colour sequences (ESC [ ... letter).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Poll `f` until it yields a value. The limit only stops a broken run from hanging the
/// suite; it asserts nothing about speed. The error names what never happened.
pub async fn wait_for<T>(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("{what}: still not the case after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
