//! The validator's masking (`email` and `card` → `"***"`) behind the naive
//! `list<list<u8>>` interface of `wit/naive.wit`: every row crosses the
//! boundary as its own list, with a guest allocation each way. The
//! `boundary` bench measures it beside weir's packed batches, as the
//! reference the targets were set against. The masking is the
//! validator's (`weir_json`), so only the interface differs.

use std::sync::OnceLock;

use weir_json::{Object, RawValue};

wit_bindgen::generate!({
    path: "wit",
    world: "naive",
});

const MASKED_FIELDS: [&str; 2] = ["email", "card"];
const MASK_WITH: &str = "***";

struct NaiveMask;

impl Guest for NaiveMask {
    fn mask(rows: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        static MASK: OnceLock<Box<RawValue>> = OnceLock::new();
        let mask = MASK.get_or_init(|| weir_json::raw(MASK_WITH));
        rows.iter()
            .map(|row| {
                // A row that is not an object passes unchanged, as the validator's `ok`.
                let Ok(mut object) = Object::parse(row) else {
                    return row.clone();
                };
                for field in MASKED_FIELDS {
                    object.replace(field, mask);
                }
                let mut masked = Vec::with_capacity(row.len());
                object.write(&mut masked);
                masked
            })
            .collect()
    }
}

export!(NaiveMask);
