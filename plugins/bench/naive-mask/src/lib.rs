//! The validator's masking (`email` and `card` → `"***"`) behind the naive
//! `list<list<u8>>` interface of `wit/naive.wit`: every row crosses the
//! boundary as its own list, with a guest allocation each way. The
//! `boundary` bench measures it beside weir's packed batches, as the
//! reference the targets were set against.

use serde_json::{Map, Value};

wit_bindgen::generate!({
    path: "wit",
    world: "naive",
});

const MASKED_FIELDS: [&str; 2] = ["email", "card"];
const MASK_WITH: &str = "***";

struct NaiveMask;

impl Guest for NaiveMask {
    fn mask(rows: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        rows.iter()
            .map(|row| {
                // A row that is not an object passes unchanged, as the validator's `ok`.
                let Ok(mut object) = serde_json::from_slice::<Map<String, Value>>(row) else {
                    return row.clone();
                };
                for field in MASKED_FIELDS {
                    if let Some(value) = object.get_mut(field) {
                        *value = Value::String(MASK_WITH.to_string());
                    }
                }
                serde_json::to_vec(&object).unwrap_or_else(|_| row.clone())
            })
            .collect()
    }
}

export!(NaiveMask);
