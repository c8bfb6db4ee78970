//! `weir send`'s progress bar and its rate of rows.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Rows per second over `elapsed`.
pub(super) fn rate(rows: u64, elapsed: Duration) -> u64 {
    (rows as f64 / elapsed.as_secs_f64().max(0.001)).round() as u64
}

/// The progress bar: by bytes (with an ETA) for a file of known size, a
/// spinner for stdin; hidden unless asked for.
pub(super) struct Progress {
    pub(super) bar: ProgressBar,
    by_bytes: bool,
    started: Instant,
}

impl Progress {
    pub(super) fn new(enabled: bool, size: Option<u64>) -> Progress {
        let bar = match (enabled, size) {
            (false, _) => ProgressBar::hidden(),
            (true, Some(size)) => ProgressBar::new(size).with_style(style(
                "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg} (ETA {eta})",
            )),
            (true, None) => {
                ProgressBar::new_spinner().with_style(style("{spinner} [{elapsed_precise}] {msg}"))
            }
        };
        bar.set_message("0 rows sent");
        bar.enable_steady_tick(Duration::from_millis(100));
        Progress {
            bar,
            by_bytes: size.is_some(),
            started: Instant::now(),
        }
    }

    pub(super) fn chunk_done(&self, accepted: u64, rows: u64, bytes: u64) {
        self.bar.inc(if self.by_bytes { bytes } else { rows });
        self.bar.set_message(format!(
            "{accepted} rows sent, {} rows/s",
            rate(accepted, self.started.elapsed())
        ));
    }
}

fn style(template: &str) -> ProgressStyle {
    // The templates are ours and valid; the fallback only keeps a typo
    // from becoming a panic.
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}
