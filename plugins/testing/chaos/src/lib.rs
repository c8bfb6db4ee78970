//! A weir transform that misbehaves on purpose, so the host's tests can watch it being contained.
//!
//! Settings (unknown keys are refused):
//!
//! | key       | type   | meaning                                                       |
//! |-----------|--------|---------------------------------------------------------------|
//! | `mode`    | string | required: what to do (below)                                  |
//! | `trigger` | string | a batch is triggered only if some row's payload contains it; absent: every batch is |
//! | `tag`     | string | the value `tag` mode adds (required by that mode)             |
//! | `grow_mb` | u32    | MiB `grow` mode allocates, default 1024                       |
//! | `slow_ms` | u64    | milliseconds `slow` mode works for, default 1000              |
//! | `leak_kb` | u32    | KiB `leak` mode leaks per call, default 64                    |
//! | `target`  | string | the path `open-file` reads / the address `connect` dials      |
//!
//! Modes:
//!
//! - `pass`: every row `ok`.
//! - `trap-first-attempt`: panics (a trap) on a triggered batch holding a
//!   row on its first attempt; otherwise every row `ok`.
//! - `spin`: loops forever on a triggered batch; otherwise `ok`.
//! - `trap`: panics on every triggered batch; otherwise every row `ok`.
//! - `traceback`: on a triggered batch, writes a Python-like traceback
//!   (several stderr lines, naming `trigger`) and then panics, as an
//!   interpreter does before it traps; otherwise every row `ok`.
//! - `retry`: asks for a retry (10 ms) of every row holding `trigger` (of
//!   every row without one); other rows `ok`.
//! - `leak`: leaks `leak_kb` KiB per call (never freed), then every row `ok`.
//! - `open-file`: tries to read the file `target`; every row is `ok` if it
//!   could, else dead-lettered with the error (what a sandbox should say).
//! - `connect`: tries a TCP connection to `target` (host:port); `ok` if it
//!   connected, else dead-lettered with the error.
//! - `env`: dead-letters every row with the value of the environment
//!   variable `target` (or "unset"), so a test can see what was granted.
//! - `slow`: on a triggered batch, keeps busy for `slow_ms` (a long but
//!   successful call), then every row `ok`.
//! - `grow`: on a triggered batch, allocates and touches `grow_mb` MiB in
//!   1 MiB chunks, then answers `ok` (the host's memory cap should kill it
//!   first); otherwise `ok`.
//! - `tag`: replaces each JSON-object row by one with the field
//!   `"tag": <tag>` added; other rows `ok`. Ignores `trigger`.
//! - `noisy`: per call, logs a message holding a newline and a forged log
//!   line, and adds to 100 counters of distinct names plus one with a
//!   1000-byte name; then every row `ok`.
//! - `trap-init`: `init` panics.
//! - `fail-init`: `init` returns `Err("chaos: init refused")`.

use std::hint::black_box;

use serde::Deserialize;
use serde_json::{Map, Value};
use weir_plugin::{Outcomes, Row, Rows, Transform};

const MIB: usize = 1 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    mode: Mode,
    #[serde(default)]
    trigger: Option<String>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default = "default_grow_mb")]
    grow_mb: u32,
    #[serde(default = "default_slow_ms")]
    slow_ms: u64,
    #[serde(default = "default_leak_kb")]
    leak_kb: u32,
    #[serde(default)]
    target: Option<String>,
}

fn default_leak_kb() -> u32 {
    64
}

fn default_slow_ms() -> u64 {
    1000
}

fn default_grow_mb() -> u32 {
    1024
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    Pass,
    TrapFirstAttempt,
    Spin,
    Leak,
    OpenFile,
    Connect,
    Env,
    Trap,
    Traceback,
    Retry,
    Slow,
    Grow,
    Tag,
    Noisy,
    TrapInit,
    FailInit,
}

struct Chaos {
    settings: Settings,
}

impl Transform for Chaos {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        match settings.mode {
            Mode::TrapInit => panic!("chaos: trapping in init on purpose"),
            Mode::FailInit => return Err("chaos: init refused".to_string()),
            Mode::Tag if settings.tag.is_none() => {
                return Err("chaos: mode `tag` needs the `tag` setting".to_string());
            }
            _ => {}
        }
        weir_plugin::log::debug(&format!("chaos: mode {:?}", settings.mode));
        Ok(Chaos { settings })
    }

    fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
        let settings = &self.settings;
        let triggered = match &settings.trigger {
            None => true,
            Some(needle) => rows
                .iter()
                .any(|row| contains(row.payload, needle.as_bytes())),
        };
        match settings.mode {
            Mode::TrapFirstAttempt if triggered && rows.iter().any(|row| row.attempt == 1) => {
                panic!("chaos: trapping on a first attempt on purpose")
            }
            Mode::Spin if triggered => spin(),
            Mode::Trap if triggered => panic!("chaos: trapping on purpose"),
            Mode::Traceback if triggered => {
                let needle = settings.trigger.as_deref().unwrap_or("id");
                eprintln!("Traceback (most recent call last):");
                eprintln!("  File \"app.py\", line 12, in transform");
                eprintln!("    value = row[\"{needle}\"]");
                eprintln!("KeyError: '{needle}'");
                panic!("chaos: Python function threw an unexpected exception")
            }
            Mode::Leak => {
                let leaked: &'static mut [u8] = vec![1u8; settings.leak_kb as usize * 1024].leak();
                black_box(leaked);
            }
            Mode::OpenFile | Mode::Connect | Mode::Env => {
                let target = settings.target.as_deref().unwrap_or("");
                let verdict = match settings.mode {
                    Mode::OpenFile => std::fs::read(target)
                        .map(|_| ())
                        .map_err(|e| format!("open {target}: {e}")),
                    Mode::Connect => std::net::TcpStream::connect(target)
                        .map(|_| ())
                        .map_err(|e| format!("connect {target}: {e}")),
                    _ => Err(format!(
                        "env {target}={}",
                        std::env::var(target).unwrap_or_else(|_| "unset".into())
                    )),
                };
                for _ in 0..rows.len() {
                    match &verdict {
                        Ok(()) => out.ok(),
                        Err(reason) => out.dead_letter(reason.as_str()),
                    }
                }
                return;
            }
            Mode::Slow if triggered => busy_for(settings.slow_ms),
            Mode::Retry => {
                let needle = settings.trigger.as_deref().unwrap_or("").as_bytes();
                for row in rows.iter() {
                    if contains(row.payload, needle) {
                        out.retry(10);
                    } else {
                        out.ok();
                    }
                }
                return;
            }
            Mode::Grow if triggered => grow(settings.grow_mb),
            Mode::Noisy => {
                weir_plugin::log::warn(
                    "chaos: noisy\n2026-01-01T00:00:00Z  INFO weir::host: FORGED weir is running",
                );
                for n in 0..100 {
                    weir_plugin::counter(&format!("noisy_{n}"), 1);
                }
                weir_plugin::counter(&"n".repeat(1000), 1);
            }
            Mode::Tag => {
                let tag = settings.tag.as_deref().expect("checked by init");
                for row in rows.iter() {
                    add_tag(&row, tag, out);
                }
                return;
            }
            _ => {}
        }
        for _ in 0..rows.len() {
            out.ok();
        }
    }
}

weir_plugin::export_transform!(Chaos);

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Keeps the CPU busy for `ms` milliseconds of the host's monotonic clock.
fn busy_for(ms: u64) {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    let mut n: u64 = 0;
    while std::time::Instant::now() < until {
        n = black_box(n.wrapping_add(1));
    }
}

/// Never returns: the host must interrupt it.
fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

/// Allocates and touches `mb` MiB, kept alive until the function returns.
fn grow(mb: u32) {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for i in 0..mb as usize {
        let chunk = vec![(i % 251) as u8 + 1; MIB];
        chunks.push(black_box(chunk));
    }
    weir_plugin::log::info(&format!("chaos: grew {mb} MiB and lived"));
    black_box(&chunks);
}

fn add_tag(row: &Row<'_>, tag: &str, out: &mut Outcomes) {
    let Ok(mut object) = serde_json::from_slice::<Map<String, Value>>(row.payload) else {
        return out.ok();
    };
    object.insert("tag".to_string(), Value::String(tag.to_string()));
    out.replace_with(row, |payload| {
        serde_json::to_writer(payload, &object).expect("a JSON map always serializes")
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::RowData;
    use weir_plugin::transform::Outcome;

    fn tag(payload: &str) -> Outcome {
        let mut input = RowData::new(payload);
        input.headers.push(("h".into(), "v".into()));
        let rows = Rows::pack([&input]);
        let mut out = Outcomes::with_capacity(1);
        add_tag(&rows.get(0).unwrap(), "seen", &mut out);
        out.decided().pop().unwrap()
    }

    #[test]
    fn settings() {
        let s: Settings = weir_plugin::settings(r#"{"mode": "trap-first-attempt"}"#).unwrap();
        assert_eq!(s.mode, Mode::TrapFirstAttempt);
        assert_eq!(s.grow_mb, 1024);
        let e = weir_plugin::settings::<Settings>("{}").unwrap_err();
        assert_eq!(e, "settings: missing field `mode`");
    }

    #[test]
    fn substring() {
        assert!(contains(b"hello boom world", b"boom"));
        assert!(!contains(b"hello", b"boom"));
        assert!(contains(b"", b""));
    }

    #[test]
    fn tags_objects_only() {
        match tag(r#"{"a":1}"#) {
            Outcome::Emit(rows) => {
                assert_eq!(rows[0].payload, br#"{"a":1,"tag":"seen"}"#);
                assert_eq!(rows[0].headers, vec![("h".to_string(), "v".to_string())]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(tag("[1]"), Outcome::Ok);
    }
}
