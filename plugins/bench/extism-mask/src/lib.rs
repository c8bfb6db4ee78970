//! The boundary bench's transform as an Extism plugin: NDJSON rows in, the
//! same rows out with `email` and `card` replaced by `"***"` (field order
//! kept), exactly what weir's validator does with `mask = ["email", "card"]`,
//! with the same code (`weir_json`).
//!
//! One export, `mask`: called with one row it is Extism's per-row mode,
//! with many NDJSON lines its batched mode. Built for
//! `wasm32-unknown-unknown` (Extism runs core modules, not components).

use std::sync::OnceLock;

use extism_pdk::{FnResult, plugin_fn};
use weir_json::{Object, RawValue};

const MASKED_FIELDS: [&str; 2] = ["email", "card"];
const MASK_WITH: &str = "***";

#[plugin_fn]
pub fn mask(input: Vec<u8>) -> FnResult<Vec<u8>> {
    static MASK: OnceLock<Box<RawValue>> = OnceLock::new();
    let mask = MASK.get_or_init(|| weir_json::raw(MASK_WITH));
    let mut output = Vec::with_capacity(input.len());
    for line in input.split(|b| *b == b'\n').filter(|line| !line.is_empty()) {
        let mut object = Object::parse(line)?;
        for field in MASKED_FIELDS {
            object.replace(field, mask);
        }
        object.write(&mut output);
        output.push(b'\n');
    }
    Ok(output)
}
