//! Progress of long steps (downloads, conversions, model loads) on stderr: an indicatif bar or
//! spinner when stderr is a terminal; otherwise one plain line when the step starts and one when
//! it ends, so logs and pipes get no carriage returns or escape codes.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    /// What is being done ("loading model.gguf"), for the plain lines.
    what: String,
    /// Drawn only on a terminal.
    bar: Option<ProgressBar>,
    started: Instant,
    /// Say nothing at all (callers that asked for no progress).
    silent: bool,
}

/// Counts steps from another thread (the engine thread, while it converts tensors).
#[derive(Clone)]
pub struct Ticker(Option<ProgressBar>);

impl Ticker {
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(n);
        }
    }
}

impl Progress {
    /// A bar of bytes (a download); `total` unknown draws a bar without an end.
    pub fn bytes(what: &str, total: Option<u64>) -> Self {
        Self::start(what, "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}", total)
    }

    /// A bar of `total` steps (tensors converted).
    pub fn steps(what: &str, total: u64) -> Self {
        Self::start(what, "{msg} {bar:30} {pos}/{len} {elapsed}", Some(total))
    }

    /// A spinner with the time elapsed, for a step whose size is not known ahead.
    pub fn spinner(what: &str) -> Self {
        Self::start(what, "{spinner} {msg} {elapsed}", None)
    }

    /// Reports nothing.
    pub fn silent() -> Self {
        Progress { what: String::new(), bar: None, started: Instant::now(), silent: true }
    }

    fn start(what: &str, template: &str, total: Option<u64>) -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let bar = match total {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::new_spinner(),
            };
            bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
            bar.set_message(what.to_owned());
            // A spinner must move while the step gives no news (a model load on another thread).
            bar.enable_steady_tick(Duration::from_millis(120));
            Some(bar)
        } else {
            eprintln!("mlx-bun: {what} ...");
            None
        };
        Progress { what: what.to_owned(), bar, started: Instant::now(), silent: false }
    }

    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    pub fn ticker(&self) -> Ticker {
        Ticker(self.bar.clone())
    }

    /// Ends the step with one line: what was done and how long it took.
    pub fn finish(mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if !self.silent {
            eprintln!("mlx-bun: {}: done in {:.1} s", self.what, self.started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Progress {
    /// A step that failed leaves no bar behind; its error is reported by the caller.
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
