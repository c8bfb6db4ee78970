//! `json-members`: where a batch's JSON-object rows keep the top-level
//! members an SDK asks for, found natively once per batch so that a Python
//! or JavaScript plugin reads a row's fields without parsing it whole.
//!
//! The promise the SDKs build on: a row answered here parses, in the
//! guest's own JSON parser, to an object whose members `names` have
//! exactly these value spans (serde_json accepts a subset of what Python's
//! and JavaScript's parsers accept: no `NaN`, no lone surrogates, no
//! duplicate of a requested name). Anything else is answered "not read",
//! and the guest parses that row itself.

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// Most names one call may ask for.
pub const MAX_NAMES: usize = 64;
/// A place of the answer that has no offset.
pub const NONE: u32 = u32::MAX;
/// u32s per row of a `batch`'s `rows` list, and where the payload's are.
const ROW_NUMBERS: usize = 8;
const PAYLOAD_AT: usize = 4;

/// The answer for every row of `rows` (a `batch`'s row table over `data`),
/// as the WIT's `json-members` describes it.
pub fn json_members(data: &[u8], rows: &[u8], names: &[String]) -> Result<Vec<u8>, String> {
    if names.len() > MAX_NAMES {
        return Err(format!(
            "json-members: {} names asked, at most {MAX_NAMES}",
            names.len()
        ));
    }
    let row_bytes = ROW_NUMBERS * 4;
    if !rows.len().is_multiple_of(row_bytes) {
        return Err(format!(
            "json-members: a batch's rows are {row_bytes} bytes each, got {}",
            rows.len()
        ));
    }
    let width = 1 + 2 * names.len();
    let mut answer = Vec::with_capacity(rows.len() / row_bytes * width * 4);
    let mut places = vec![NONE; width];
    for row in rows.chunks_exact(row_bytes) {
        let number = |at: usize| {
            let bytes = [
                row[at * 4],
                row[at * 4 + 1],
                row[at * 4 + 2],
                row[at * 4 + 3],
            ];
            u32::from_le_bytes(bytes) as usize
        };
        let (offset, len) = (number(PAYLOAD_AT), number(PAYLOAD_AT + 1));
        places.fill(NONE);
        if let Some(payload) = offset
            .checked_add(len)
            .and_then(|end| data.get(offset..end))
        {
            read_row(payload, names, &mut places);
        }
        for place in &places {
            answer.extend_from_slice(&place.to_le_bytes());
        }
    }
    Ok(answer)
}

/// Fills `places` for one payload, or leaves them all [`NONE`].
fn read_row(payload: &[u8], names: &[String], places: &mut [u32]) {
    let Ok(text) = std::str::from_utf8(payload) else {
        return;
    };
    // Offsets are u32s; a payload this large is the guest's to parse.
    if u32::try_from(text.len()).is_err() {
        return;
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let members = Members {
        text,
        names,
        spans: &mut places[1..],
    };
    if members.deserialize(&mut deserializer).is_err() || deserializer.end().is_err() {
        places.fill(NONE);
        return;
    }
    // The whole text is one object and whitespace: its last other byte is `}`.
    let closing = text.trim_end_matches([' ', '\t', '\n', '\r']).len() - 1;
    places[0] = closing as u32;
}

/// Visits one object, recording the spans of the members asked for.
struct Members<'a> {
    text: &'a str,
    names: &'a [String],
    /// Start and end per name, [`NONE`] until found.
    spans: &'a mut [u32],
}

impl<'de> DeserializeSeed<'de> for Members<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Members<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let base = self.text.as_ptr() as usize;
        while let Some(asked) = map.next_key_seed(Name(self.names))? {
            let Some(index) = asked else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let value: &RawValue = map.next_value()?;
            if self.spans[2 * index] != NONE {
                // Which of two equal names a guest's parser keeps is its own.
                return Err(de::Error::custom("a requested member twice"));
            }
            let start = (value.get().as_ptr() as usize).wrapping_sub(base);
            self.spans[2 * index] = start as u32;
            self.spans[2 * index + 1] = (start + value.get().len()) as u32;
        }
        Ok(())
    }
}

/// A member's name, as its index among the names asked for.
struct Name<'a>(&'a [String]);

impl<'de> DeserializeSeed<'de> for Name<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|asked| asked == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's `data` and `rows` holding `payloads` (tenant, table and
    /// headers empty).
    fn batch(payloads: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
        let (mut data, mut rows) = (Vec::new(), Vec::new());
        for payload in payloads {
            let numbers = [0, 0, 0, 0, data.len() as u32, payload.len() as u32, 0, 0];
            for n in numbers {
                rows.extend_from_slice(&n.to_le_bytes());
            }
            data.extend_from_slice(payload);
        }
        (data, rows)
    }

    fn answer(payloads: &[&[u8]], names: &[&str]) -> Vec<Vec<u32>> {
        let (data, rows) = batch(payloads);
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let bytes = json_members(&data, &rows, &names).expect("an answer");
        let numbers: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        numbers
            .chunks(1 + 2 * names.len())
            .map(<[u32]>::to_vec)
            .collect()
    }

    /// The text each name's span covers in `payload`, `None` when absent.
    fn values<'p>(payload: &'p str, places: &[u32]) -> Vec<Option<&'p str>> {
        places[1..]
            .chunks(2)
            .map(|span| (span[0] != NONE).then(|| &payload[span[0] as usize..span[1] as usize]))
            .collect()
    }

    #[test]
    fn spans_of_asked_members_and_the_closing_brace() {
        let payload =
            r#" { "id" : 7, "kind":"a\"b", "nested": {"id": [1, {"x": 2}]}, "n": -1.5e3 }  "#;
        let rows = answer(
            &[payload.as_bytes()],
            &["kind", "id", "missing", "nested", "n"],
        );
        assert_eq!(payload.as_bytes()[rows[0][0] as usize], b'}');
        assert_eq!(rows[0][0] as usize, payload.trim_end().len() - 1);
        assert_eq!(
            values(payload, &rows[0]),
            [
                Some(r#""a\"b""#),
                Some("7"),
                None,
                Some(r#"{"id": [1, {"x": 2}]}"#),
                Some("-1.5e3")
            ]
        );
    }

    #[test]
    fn an_escaped_name_matches_its_text() {
        let payload = r#"{"k\u0069nd":"x"}"#;
        let rows = answer(&[payload.as_bytes()], &["kind"]);
        assert_eq!(values(payload, &rows[0]), [Some(r#""x""#)]);
    }

    #[test]
    fn rows_the_guest_must_parse_itself_are_none_everywhere() {
        let payloads: [&[u8]; 8] = [
            b"[1,2]",
            b"\"text\"",
            b"{\"id\":1",
            b"{\"id\":1} x",
            b"{\"id\":NaN}",
            b"{\"id\":1,\"id\":2}",
            b"{\"id\":\"\xff\"}",
            b"",
        ];
        for (payload, places) in payloads.iter().zip(answer(&payloads, &["id"])) {
            assert_eq!(places, [NONE; 3], "{}", String::from_utf8_lossy(payload));
        }
    }

    #[test]
    fn a_repeated_name_not_asked_for_is_passed_over() {
        let payload = r#"{"a":1,"a":2,"id":3}"#;
        let rows = answer(&[payload.as_bytes()], &["id"]);
        assert_eq!(values(payload, &rows[0]), [Some("3")]);
    }

    #[test]
    fn an_empty_object_and_no_names() {
        let rows = answer(&[b"{}", b"{ }\n"], &[]);
        assert_eq!(rows, [vec![1], vec![2]]);
    }

    #[test]
    fn a_row_outside_the_data_and_bad_requests() {
        let (data, mut rows) = batch(&[b"{}"]);
        rows[20] = 9; // the payload's length, past the data
        let answer = json_members(&data, &rows, &[]).expect("an answer");
        assert_eq!(answer, NONE.to_le_bytes());
        assert!(json_members(&data, &rows[..31], &[]).is_err());
        let names = vec![String::new(); MAX_NAMES + 1];
        assert!(json_members(&data, &rows, &names).is_err());
    }
}
