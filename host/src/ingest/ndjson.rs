//! Splitting an NDJSON body into rows: each keeps its line number (for a
//! 400 that names it) and shares the body's buffer (no copy per row). One
//! pass over each line both checks it is a JSON object and, when asked,
//! picks out the row's idempotency and routing fields.

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
    /// The value of the configured routing field, when the row has one.
    pub route_key: Option<String>,
}

/// The top-level fields picked out of each row.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fields<'f> {
    /// Its value dedupes the row (its message id).
    pub key: Option<&'f str>,
    /// Its value is the row's routing key.
    pub route: Option<&'f str>,
}

/// The first line that is not a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct BadLine {
    pub line: usize,
    pub reason: String,
}

/// Splits `body` into rows. Blank lines are skipped; a `\r` before `\n` is
/// dropped. `fields` names top-level fields whose values (string or
/// number) become the row's keys.
pub fn split(body: &Bytes, fields: Fields<'_>) -> Result<Vec<Line>, BadLine> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (index, line) in body.split(|b| *b == b'\n').enumerate() {
        let end = start + line.len();
        let trimmed = line.strip_suffix(b"\r").unwrap_or(line);
        if !trimmed.iter().all(u8::is_ascii_whitespace) {
            let number = index + 1;
            let (key, route_key) = scan(trimmed, fields).map_err(|reason| BadLine {
                line: number,
                reason,
            })?;
            lines.push(Line {
                number,
                payload: body.slice(start..start + trimmed.len()),
                key,
                route_key,
            });
        }
        start = end + 1;
    }
    Ok(lines)
}

/// The values of a row's idempotency and routing fields.
type Keys = (Option<String>, Option<String>);

/// Checks that `line` is one JSON object and returns its fields' values.
fn scan(line: &[u8], fields: Fields<'_>) -> Result<Keys, String> {
    // serde_json skips the strings it ignores without checking them: a
    // sink would get bytes that are not text.
    if let Err(err) = std::str::from_utf8(line) {
        return Err(format!(
            "not valid UTF-8 (at byte {} of the line)",
            err.valid_up_to() + 1
        ));
    }
    let first = line.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err("a row must be a JSON object".into());
    }
    let mut deserializer = serde_json::Deserializer::from_slice(line);
    let keys = ObjectScan { fields }
        .deserialize(&mut deserializer)
        .and_then(|keys| deserializer.end().map(|()| keys))
        .map_err(|err| format!("invalid JSON: {err}"))?;
    Ok(keys)
}

/// Walks an object's entries, skipping every value but the fields'.
struct ObjectScan<'f> {
    fields: Fields<'f>,
}

impl<'de> DeserializeSeed<'de> for ObjectScan<'_> {
    type Value = Keys;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectScan<'_> {
    type Value = Keys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut key, mut route) = (None, None);
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let name = name.as_ref();
            let (is_key, is_route) = (
                key.is_none() && self.fields.key == Some(name),
                route.is_none() && self.fields.route == Some(name),
            );
            if !is_key && !is_route {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let role = if is_key { "idempotency" } else { "routing" };
            let value = match map.next_value::<serde_json::Value>()? {
                serde_json::Value::String(text) => Some(text),
                serde_json::Value::Number(number) => Some(number.to_string()),
                serde_json::Value::Null => None,
                _ => {
                    return Err(de::Error::custom(format!(
                        "field `{name}` must be a string or a number to serve as the row's {role} key"
                    )));
                }
            };
            // One field may be both; only then is its value copied.
            match (is_key, is_route) {
                (true, true) => {
                    key = value.clone();
                    route = value;
                }
                (true, false) => key = value,
                _ => route = value,
            }
        }
        Ok((key, route))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_their_line_numbers_and_skip_blanks() {
        let body = Bytes::from_static(b"{\"a\":1}\r\n\n  \n{\"b\":2}");
        let lines = split(&body, Fields::default()).unwrap();
        let seen: Vec<(usize, &[u8])> = lines.iter().map(|l| (l.number, &l.payload[..])).collect();
        assert_eq!(seen, vec![(1, &b"{\"a\":1}"[..]), (4, &b"{\"b\":2}"[..])]);
    }

    #[test]
    fn the_first_bad_line_is_named() {
        let body = Bytes::from_static(b"{\"a\":1}\n{\"b\":\n[1]\n");
        let bad = split(&body, Fields::default()).unwrap_err();
        assert_eq!(bad.line, 2);
        assert!(bad.to_string().starts_with("line 2: invalid JSON"), "{bad}");
        let bad = split(&Bytes::from_static(b"[1]"), Fields::default()).unwrap_err();
        assert_eq!(bad.to_string(), "line 1: a row must be a JSON object");
        let bad = split(
            &Bytes::from_static(b"{\"a\":1} {\"b\":2}"),
            Fields::default(),
        )
        .unwrap_err();
        assert!(bad.reason.contains("trailing characters"), "{bad}");
    }

    #[test]
    fn invalid_utf8_anywhere_in_a_row_is_refused_naming_its_line() {
        let body = Bytes::from_static(b"{\"a\":1}\n{\"name\":\"caf\xe9\"}\n");
        let bad = split(&body, Fields::default()).unwrap_err();
        assert_eq!(bad.line, 2);
        assert_eq!(
            bad.to_string(),
            "line 2: not valid UTF-8 (at byte 13 of the line)"
        );
    }

    #[test]
    fn the_key_field_is_picked_out_of_each_row() {
        let body = Bytes::from_static(
            b"{\"x\":{\"id\":\"nested\"},\"id\":\"e-1\"}\n{\"id\":42}\n{\"other\":1}\n{\"id\":null}\n{\"i\\u0064\":\"escaped\"}",
        );
        let id = Fields {
            key: Some("id"),
            route: None,
        };
        let keys: Vec<Option<String>> = split(&body, id)
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
        let bad = split(&Bytes::from_static(b"{\"id\":[1]}"), id).unwrap_err();
        assert!(bad.reason.contains("must be a string or a number"), "{bad}");
    }

    #[test]
    fn the_routing_field_is_picked_out_too_even_when_it_is_the_key_field() {
        let body = Bytes::from_static(b"{\"id\":\"e-1\",\"user\":7}\n{\"id\":\"e-2\"}");
        let fields = Fields {
            key: Some("id"),
            route: Some("user"),
        };
        let rows: Vec<(Option<String>, Option<String>)> = split(&body, fields)
            .unwrap()
            .into_iter()
            .map(|l| (l.key, l.route_key))
            .collect();
        assert_eq!(
            rows,
            vec![
                (Some("e-1".into()), Some("7".into())),
                (Some("e-2".into()), None)
            ]
        );
        let same = Fields {
            key: Some("id"),
            route: Some("id"),
        };
        let line = &split(&body, same).unwrap()[0];
        assert_eq!(
            (line.key.as_deref(), line.route_key.as_deref()),
            (Some("e-1"), Some("e-1"))
        );
        let bad = split(&Bytes::from_static(b"{\"user\":{}}"), fields).unwrap_err();
        assert!(bad.reason.contains("routing key"), "{bad}");
    }
}
