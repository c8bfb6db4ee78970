//! A text made from a row: literal text, `{name}` placeholders the caller
//! fills (`{tenant}`, `{table}`, …) and `{field}` placeholders read from
//! the row's JSON payload (a [`Field`]: dotted keys or a JSON pointer). A
//! NATS sink's subject and a lake sink's object path are made this way.

use crate::fields::{Field, Payload};

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// One of the caller's names.
    Named(usize),
    Field {
        spec: String,
        field: Field,
    },
}

/// A parsed template (see the module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// `text` with `{…}` placeholders: each of `names` is the caller's, any
    /// other a payload field. `what` names the setting in an error
    /// (`nats sink: subject`).
    pub fn parse(text: &str, what: &str, names: &[&str]) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| format!("{what} `{text}` has a `{{` without its `}}`"))?;
            let name = &after[..close];
            pieces.push(match names.iter().position(|known| *known == name) {
                Some(index) => Piece::Named(index),
                None => Piece::Field {
                    spec: name.to_string(),
                    field: Field::parse(name).map_err(|e| format!("{what} `{text}`: {e}"))?,
                },
            });
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err(format!("{what} `{text}` has a `}}` without its `{{`"));
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        if pieces.is_empty() {
            return Err(format!("{what} is empty"));
        }
        Ok(Template { pieces })
    }

    /// Whether it reads a payload field (the payload must be JSON).
    pub fn reads_payload(&self) -> bool {
        self.pieces
            .iter()
            .any(|piece| matches!(piece, Piece::Field { .. }))
    }

    /// Whether it uses the caller's name number `index`.
    pub fn uses(&self, index: usize) -> bool {
        self.pieces.contains(&Piece::Named(index))
    }

    /// The text for one row: `named(i)` fills the caller's name `i`, a
    /// field is read from `payload` (a string gives its text, a number or
    /// a boolean its JSON). Why it cannot be made, naming the field.
    pub fn render<'a>(
        &self,
        named: impl Fn(usize) -> &'a str,
        payload: Option<&Payload<'_>>,
    ) -> Result<String, String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match (piece, payload) {
                (Piece::Text(text), _) => out.push_str(text),
                (Piece::Named(index), _) => out.push_str(named(*index)),
                (Piece::Field { spec, field }, Some(payload)) => {
                    let value = field
                        .get(payload)
                        .ok_or_else(|| format!("the payload has no field `{spec}`"))?;
                    out.push_str(&token(spec, value.get())?);
                }
                (Piece::Field { .. }, None) => {}
            }
        }
        Ok(out)
    }
}

/// A field's JSON as text: a string's text, a number's or a boolean's JSON.
fn token(spec: &str, json: &str) -> Result<String, String> {
    if json.starts_with('"') {
        return serde_json::from_str::<String>(json)
            .map_err(|e| format!("the field `{spec}`: {e}"));
    }
    if matches!(json, "null") || json.starts_with('{') || json.starts_with('[') {
        return Err(format!(
            "the field `{spec}` is {json:.40}, not a string, a number or a boolean"
        ));
    }
    Ok(json.to_string())
}
