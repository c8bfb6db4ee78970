//! The boundary bench's transform as an Extism plugin: NDJSON rows in, the
//! same rows out with `email` and `card` replaced by `"***"` (field order
//! kept), exactly what weir's validator does with `mask = ["email", "card"]`.
//!
//! One export, `mask`: called with one row it is Extism's per-row mode,
//! with many NDJSON lines its batched mode. Built for
//! `wasm32-unknown-unknown` (Extism runs core modules, not components).

use extism_pdk::{FnResult, plugin_fn};
use serde_json::{Map, Value};

const MASKED_FIELDS: [&str; 2] = ["email", "card"];
const MASK_WITH: &str = "***";

#[plugin_fn]
pub fn mask(input: Vec<u8>) -> FnResult<Vec<u8>> {
    let mut output = Vec::with_capacity(input.len());
    for line in input.split(|b| *b == b'\n').filter(|line| !line.is_empty()) {
        let mut object: Map<String, Value> = serde_json::from_slice(line)?;
        for field in MASKED_FIELDS {
            if let Some(value) = object.get_mut(field) {
                *value = Value::String(MASK_WITH.to_string());
            }
        }
        serde_json::to_writer(&mut output, &object)?;
        output.push(b'\n');
    }
    Ok(output)
}
