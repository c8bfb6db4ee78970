//! Objects in an object store for a sink (`grants.objects` in the
//! plugin's TOML): the host fits each record to the grant's format
//! (Parquet columns or NDJSON), fills one object per path and commits it
//! at the grant's bounds; the plugin decides which object a row goes to.
//! Only the `sink` world imports it.
//!
//! What the host promises (the WIT's `objects` interface):
//! - an append is checked at once (a record that does not fit a column, a
//!   path that is not plain and relative, a second path for one row: an
//!   error, and the plugin dead-letters or retries its row) and kept only
//!   if its row is delivered;
//! - a delivered row is acked once the object holding it stands, and after
//!   any crash or handover it is in exactly one object.
//!
//! Outside wasm (a plugin's own tests) there is no host: appends are kept
//! in a list of this thread's, read with `appended`.

fn index(row: usize) -> u32 {
    u32::try_from(row).unwrap_or(u32::MAX)
}

/// Adds `record` (one JSON value) for `row` (its index in the batch being
/// delivered) to the object of `path` (`tenant=acme/table=orders/dt=…`).
pub fn append(row: usize, path: &str, record: &[u8]) -> Result<(), String> {
    imp::append(index(row), path, record)
}

#[cfg(target_family = "wasm")]
use crate::bindings::objects as imp;

#[cfg(not(target_family = "wasm"))]
pub use imp::{Appended, appended};

/// No host: what a plugin's native tests get.
#[cfg(not(target_family = "wasm"))]
mod imp {
    use std::cell::RefCell;

    /// One append a native test made.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Appended {
        pub row: u32,
        pub path: String,
        pub record: Vec<u8>,
    }

    thread_local! {
        static APPENDED: RefCell<Vec<Appended>> = const { RefCell::new(Vec::new()) };
    }

    pub fn append(row: u32, path: &str, record: &[u8]) -> Result<(), String> {
        APPENDED.with(|appended| {
            appended.borrow_mut().push(Appended {
                row,
                path: path.to_string(),
                record: record.to_vec(),
            })
        });
        Ok(())
    }

    /// What this thread appended since the last look (native tests only).
    pub fn appended() -> Vec<Appended> {
        APPENDED.with(|appended| std::mem::take(&mut *appended.borrow_mut()))
    }
}
