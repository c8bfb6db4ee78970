//! Splitting a body into rows: NDJSON (each row keeps its line number) or a
//! JSON array of objects (each keeps its position in the array), every row
//! sharing the body's buffer (no copy per row). One pass over each row both
//! checks it is a JSON object and, when asked, picks out the row's
//! idempotency and routing fields.

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

/// A line (or array element) that is not a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {line}: {reason}", if *.in_array { "row" } else { "line" })]
pub struct BadLine {
    /// 1-based: the line of an NDJSON body, the element of an array.
    pub line: usize,
    pub reason: String,
    /// The bad row's bytes as sent (empty when the array itself broke).
    pub payload: Bytes,
    /// The body was a JSON array: `line` counts its elements.
    pub in_array: bool,
}

/// How a body holds its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Ndjson,
    /// One JSON array of objects (`Content-Type: application/json`).
    JsonArray,
}

/// A body's rows and its bad rows, each in body order.
#[derive(Debug, Default)]
pub struct Split {
    pub rows: Vec<Line>,
    pub bad: Vec<BadLine>,
}

impl Split {
    /// Checks one row and files it as a row or a bad line; false when bad.
    fn take(&mut self, number: usize, payload: Bytes, fields: Fields<'_>, in_array: bool) -> bool {
        match scan(&payload, fields) {
            Ok((key, route_key)) => {
                self.rows.push(Line {
                    number,
                    payload,
                    key,
                    route_key,
                });
                true
            }
            Err(reason) => {
                self.bad.push(BadLine {
                    line: number,
                    reason,
                    payload,
                    in_array,
                });
                false
            }
        }
    }
}

/// Splits `body` into rows. Blank lines are skipped; a `\r` before `\n` is
/// dropped. `fields` names top-level fields whose values (string or
/// number) become the row's keys.
pub fn split(body: &Bytes, fields: Fields<'_>) -> Result<Vec<Line>, BadLine> {
    let split = split_body(body, Format::Ndjson, fields, true)?;
    match split.bad.into_iter().next() {
        Some(bad) => Err(bad),
        None => Ok(split.rows),
    }
}

/// Splits `body` in `format` into its rows and its bad rows; with
/// `first_bad_only`, stops at the first bad row (a request refused whole
/// needs no more). Only an array whose syntax breaks is an error: past it
/// there is no telling where the next element starts.
pub fn split_body(
    body: &Bytes,
    format: Format,
    fields: Fields<'_>,
    first_bad_only: bool,
) -> Result<Split, BadLine> {
    match format {
        Format::Ndjson => Ok(split_lines(body, fields, first_bad_only)),
        Format::JsonArray => split_array(body, fields, first_bad_only),
    }
}

fn split_lines(body: &Bytes, fields: Fields<'_>, first_bad_only: bool) -> Split {
    let mut split = Split::default();
    let mut start = 0;
    for (index, line) in body.split(|b| *b == b'\n').enumerate() {
        let end = start + line.len();
        let trimmed = line.strip_suffix(b"\r").unwrap_or(line);
        if !trimmed.iter().all(u8::is_ascii_whitespace) {
            let number = index + 1;
            let payload = body.slice(start..start + trimmed.len());
            if !split.take(number, payload, fields, false) && first_bad_only {
                break;
            }
        }
        start = end + 1;
    }
    split
}

/// A JSON array's elements, each checked as a row is. The array is read
/// for its elements' extents only (borrowed, not parsed into values).
fn split_array(body: &Bytes, fields: Fields<'_>, first_bad_only: bool) -> Result<Split, BadLine> {
    // The whole body is checked once: a row must be text, and an element's
    // position is all an error inside it could name.
    if let Err(err) = std::str::from_utf8(body) {
        let at = err.valid_up_to();
        let row = count_elements_before(&body[..at]);
        return Err(array_broken(
            row,
            format!("not valid UTF-8 (at byte {} of the body)", at + 1),
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let extents = ArrayExtents::default()
        .deserialize(&mut deserializer)
        .and_then(|extents| deserializer.end().map(|()| extents));
    let extents = match extents {
        Ok(extents) => extents,
        Err(err) => {
            let at = byte_offset(body, err.line(), err.column());
            let row = count_elements_before(&body[..at.min(body.len())]);
            return Err(array_broken(row, format!("invalid JSON array: {err}")));
        }
    };
    let mut split = Split::default();
    let base = body.as_ptr() as usize;
    for (index, (address, length)) in extents.0.into_iter().enumerate() {
        let number = index + 1;
        let start = address.wrapping_sub(base);
        let Some(payload) = start
            .checked_add(length)
            .filter(|end| *end <= body.len())
            .map(|end| body.slice(start..end))
        else {
            return Err(array_broken(number, "an element outside the body".into()));
        };
        if !split.take(number, payload, fields, true) && first_bad_only {
            break;
        }
    }
    Ok(split)
}

fn array_broken(row: usize, reason: String) -> BadLine {
    BadLine {
        line: row.max(1),
        reason,
        payload: Bytes::new(),
        in_array: true,
    }
}

/// The byte offset of serde_json's 1-based line and column.
fn byte_offset(body: &[u8], line: usize, column: usize) -> usize {
    let line_start: usize = body
        .split(|b| *b == b'\n')
        .take(line.saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    line_start + column.saturating_sub(1)
}

/// Which element (1-based) the byte at the end of `prefix` falls in: the
/// top-level commas before it, outside strings, plus one.
fn count_elements_before(prefix: &[u8]) -> usize {
    let (mut depth, mut in_string, mut escaped, mut commas) = (0usize, false, false, 0);
    for &byte in prefix {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => commas += 1,
            _ => {}
        }
    }
    commas + 1
}

/// Each element's address and length: borrowed from the body, so its
/// address less the body's is its offset.
#[derive(Default)]
struct ArrayExtents(Vec<(usize, usize)>);

impl<'de> DeserializeSeed<'de> for ArrayExtents {
    type Value = ArrayExtents;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ArrayExtents {
    type Value = ArrayExtents;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of objects")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<Self::Value, A::Error> {
        while let Some(raw) = seq.next_element::<&'de serde_json::value::RawValue>()? {
            self.0.push((raw.get().as_ptr() as usize, raw.get().len()));
        }
        Ok(self)
    }
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

    #[test]
    fn an_array_body_gives_each_element_its_position_and_names_a_bad_one() {
        let body = Bytes::from_static(
            b" [ {\"id\":\"a\"},\n{\"id\": [1, 2]} , [1], \"x\" ,{\"b\":{\"c\":\"]\"}} ] ",
        );
        let id = Fields {
            key: Some("id"),
            route: None,
        };
        let split = split_body(&body, Format::JsonArray, id, false).unwrap();
        let rows: Vec<(usize, &[u8])> = split
            .rows
            .iter()
            .map(|l| (l.number, &l.payload[..]))
            .collect();
        assert_eq!(
            rows,
            vec![
                (1, &b"{\"id\":\"a\"}"[..]),
                (5, &b"{\"b\":{\"c\":\"]\"}}"[..])
            ]
        );
        let bad: Vec<String> = split.bad.iter().map(ToString::to_string).collect();
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(
            bad[0].starts_with("row 2: invalid JSON: field `id`"),
            "{bad:?}"
        );
        assert_eq!(bad[1], "row 3: a row must be a JSON object");
        assert_eq!(&split.bad[2].payload[..], b"\"x\"");
        let first = split_body(&body, Format::JsonArray, id, true).unwrap();
        assert_eq!((first.rows.len(), first.bad.len()), (1, 1));

        // A broken array cannot be split further: named by the element.
        let broken = Bytes::from_static(b"[{\"a\":1},{\"b\":\"x,\"},\n{\"c\": nope}]");
        let bad = split_body(&broken, Format::JsonArray, id, false).unwrap_err();
        assert_eq!(bad.line, 3, "{bad}");
        assert!(
            bad.to_string().starts_with("row 3: invalid JSON array"),
            "{bad}"
        );
        let bad = split_body(
            &Bytes::from_static(b"{\"a\":1}"),
            Format::JsonArray,
            id,
            false,
        )
        .unwrap_err();
        assert!(bad.reason.contains("a JSON array of objects"), "{bad}");
        let bad = split_body(
            &Bytes::from_static(b"[{\"a\":\"\xff\"}]"),
            Format::JsonArray,
            id,
            false,
        )
        .unwrap_err();
        assert!(bad.reason.contains("not valid UTF-8"), "{bad}");
        assert!(
            split_body(&Bytes::from_static(b"[]"), Format::JsonArray, id, false)
                .unwrap()
                .rows
                .is_empty()
        );
    }

    #[test]
    fn every_bad_line_is_found_when_asked() {
        let body = Bytes::from_static(b"{\"a\":1}\nnope\n{\"b\":2}\n[3]\n");
        let split = split_body(&body, Format::Ndjson, Fields::default(), false).unwrap();
        let lines: Vec<usize> = split.rows.iter().map(|l| l.number).collect();
        let bad: Vec<(usize, &[u8])> = split.bad.iter().map(|b| (b.line, &b.payload[..])).collect();
        assert_eq!(lines, vec![1, 3]);
        assert_eq!(bad, vec![(2, &b"nope"[..]), (4, &b"[3]"[..])]);
    }
}
