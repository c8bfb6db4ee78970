//! Splitting an NDJSON body into rows: each keeps its line number (for a
//! 400 that names it) and shares the body's buffer (no copy per row). One
//! pass over each line both checks it is a JSON object and, when asked,
//! picks out the row's idempotency field.

use std::fmt;

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// One row of a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// 1-based line number in the body.
    pub number: usize,
    pub payload: Bytes,
    /// The value of the configured idempotency field, when the row has one.
    pub key: Option<String>,
}

/// The first line that is not a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct BadLine {
    pub line: usize,
    pub reason: String,
}

/// Splits `body` into rows. Blank lines are skipped; a `\r` before `\n` is
/// dropped. `key_field` names a top-level field whose value (string or
/// number) becomes the row's key.
pub fn split(body: &Bytes, key_field: Option<&str>) -> Result<Vec<Line>, BadLine> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (index, line) in body.split(|b| *b == b'\n').enumerate() {
        let end = start + line.len();
        let trimmed = line.strip_suffix(b"\r").unwrap_or(line);
        if !trimmed.iter().all(u8::is_ascii_whitespace) {
            let number = index + 1;
            let key = scan(trimmed, key_field).map_err(|reason| BadLine {
                line: number,
                reason,
            })?;
            lines.push(Line {
                number,
                payload: body.slice(start..start + trimmed.len()),
                key,
            });
        }
        start = end + 1;
    }
    Ok(lines)
}

/// Checks that `line` is one JSON object and returns its `key_field` value.
fn scan(line: &[u8], key_field: Option<&str>) -> Result<Option<String>, String> {
    let first = line.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err("a row must be a JSON object".into());
    }
    let mut deserializer = serde_json::Deserializer::from_slice(line);
    let key = ObjectScan { key_field }
        .deserialize(&mut deserializer)
        .and_then(|key| deserializer.end().map(|()| key))
        .map_err(|err| format!("invalid JSON: {err}"))?;
    Ok(key)
}

/// Walks an object's entries, skipping every value but the key field's.
struct ObjectScan<'f> {
    key_field: Option<&'f str>,
}

impl<'de> DeserializeSeed<'de> for ObjectScan<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectScan<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if found.is_none() && self.key_field == Some(name.as_ref()) {
                found = match map.next_value::<serde_json::Value>()? {
                    serde_json::Value::String(text) => Some(text),
                    serde_json::Value::Number(number) => Some(number.to_string()),
                    serde_json::Value::Null => None,
                    _ => {
                        return Err(de::Error::custom(format!(
                            "field `{name}` must be a string or a number to serve as the row's idempotency key"
                        )));
                    }
                };
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_their_line_numbers_and_skip_blanks() {
        let body = Bytes::from_static(b"{\"a\":1}\r\n\n  \n{\"b\":2}");
        let lines = split(&body, None).unwrap();
        let seen: Vec<(usize, &[u8])> = lines.iter().map(|l| (l.number, &l.payload[..])).collect();
        assert_eq!(seen, vec![(1, &b"{\"a\":1}"[..]), (4, &b"{\"b\":2}"[..])]);
    }

    #[test]
    fn the_first_bad_line_is_named() {
        let body = Bytes::from_static(b"{\"a\":1}\n{\"b\":\n[1]\n");
        let bad = split(&body, None).unwrap_err();
        assert_eq!(bad.line, 2);
        assert!(bad.to_string().starts_with("line 2: invalid JSON"), "{bad}");
        let bad = split(&Bytes::from_static(b"[1]"), None).unwrap_err();
        assert_eq!(bad.to_string(), "line 1: a row must be a JSON object");
        let bad = split(&Bytes::from_static(b"{\"a\":1} {\"b\":2}"), None).unwrap_err();
        assert!(bad.reason.contains("trailing characters"), "{bad}");
    }

    #[test]
    fn the_key_field_is_picked_out_of_each_row() {
        let body = Bytes::from_static(
            b"{\"x\":{\"id\":\"nested\"},\"id\":\"e-1\"}\n{\"id\":42}\n{\"other\":1}\n{\"id\":null}\n{\"i\\u0064\":\"escaped\"}",
        );
        let keys: Vec<Option<String>> = split(&body, Some("id"))
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect();
        assert_eq!(
            keys,
            vec![
                Some("e-1".to_string()),
                Some("42".to_string()),
                None,
                None,
                Some("escaped".to_string())
            ]
        );
        let bad = split(&Bytes::from_static(b"{\"id\":[1]}"), Some("id")).unwrap_err();
        assert!(bad.reason.contains("must be a string or a number"), "{bad}");
    }
}
