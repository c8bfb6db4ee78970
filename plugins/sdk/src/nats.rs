//! NATS subjects for a sink (`grants.nats` in the plugin's TOML): the host
//! publishes on its own connection, the plugin decides what and where.
//! Only the `sink` world imports it.
//!
//! What the host promises (the WIT's `nats` interface):
//! - a publish is checked at once (a subject the grant does not name, a
//!   malformed header, a message larger than the server takes: an error,
//!   and the plugin dead-letters or retries its row) and sent after the
//!   call, only if its row was delivered;
//! - with `jetstream` (the default), the rows are acked after every
//!   PubAck; a publish that fails makes the batch run again;
//! - each message carries a `Nats-Msg-Id` from its row's partition
//!   stream, the row's sequence and its index among the row's publishes
//!   (every `Nats-…` header a plugin sets is dropped), so a JetStream target drops a
//!   redelivered row's copies within its `duplicate_window`.
//!
//! Outside wasm (a plugin's own tests) there is no host: publishes are
//! kept in a list of this thread's, read with `published`.

fn index(row: usize) -> u32 {
    u32::try_from(row).unwrap_or(u32::MAX)
}

/// Publishes `payload` with `headers` to `subject` for `row` (its index in
/// the batch being delivered).
pub fn publish(
    row: usize,
    subject: &str,
    headers: &[(String, String)],
    payload: &[u8],
) -> Result<(), String> {
    imp::publish(index(row), subject, headers, payload)
}

#[cfg(target_family = "wasm")]
use crate::bindings::nats as imp;

#[cfg(not(target_family = "wasm"))]
pub use imp::{Published, published};

/// No host: what a plugin's native tests get.
#[cfg(not(target_family = "wasm"))]
mod imp {
    use std::cell::RefCell;

    /// One publish a native test made.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Published {
        pub row: u32,
        pub subject: String,
        pub headers: Vec<(String, String)>,
        pub payload: Vec<u8>,
    }

    thread_local! {
        static PUBLISHED: RefCell<Vec<Published>> = const { RefCell::new(Vec::new()) };
    }

    pub fn publish(
        row: u32,
        subject: &str,
        headers: &[(String, String)],
        payload: &[u8],
    ) -> Result<(), String> {
        PUBLISHED.with(|published| {
            published.borrow_mut().push(Published {
                row,
                subject: subject.to_string(),
                headers: headers.to_vec(),
                payload: payload.to_vec(),
            })
        });
        Ok(())
    }

    /// What this thread published since the last look (native tests only).
    pub fn published() -> Vec<Published> {
        PUBLISHED.with(|published| std::mem::take(&mut *published.borrow_mut()))
    }
}
