//! Durable state (`grants.state` in the plugin's TOML): this plugin's keys
//! for a row's tenant and the table the row was ingested to, named by the
//! row's index in the batch being handled. What the host promises (writes
//! durable with the batch's acks, a redelivered row not handed over twice)
//! is in the WIT's `state` interface.

use crate::bindings::transform::weir::plugin::state as raw;

fn index(row: usize) -> u32 {
    u32::try_from(row).unwrap_or(u32::MAX)
}

/// The value of `key` in `row`'s scope, as of this batch's writes.
pub fn get(row: usize, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
    raw::get(index(row), key)
}

/// Sets `key` in `row`'s scope; refused past the grant's limits.
pub fn set(row: usize, key: &[u8], value: &[u8]) -> Result<(), String> {
    raw::set(index(row), key, value)
}

pub fn delete(row: usize, key: &[u8]) -> Result<(), String> {
    raw::delete(index(row), key)
}

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Every key of `row`'s scope starting with `prefix`, with its value.
pub fn list(row: usize, prefix: &[u8]) -> Result<Vec<Entry>, String> {
    raw::list(index(row), prefix)
}
