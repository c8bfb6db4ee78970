//! JSON objects read without copying their fields.
//!
//! [`Object::parse`] validates a whole JSON object but keeps each key as a
//! slice of the input (unless it has escapes) and each value as its raw
//! text, so checking fields and replacing a few costs about one allocation
//! per row instead of one per key and value. [`Object::write`] writes the
//! fields back in their order: keys re-escaped, values verbatim, so numbers
//! and nested values keep exactly the text the producer sent. A duplicated
//! key is kept as sent: [`Object::get`] reads its last value (as most
//! parsers would), [`Object::replace`] replaces every one, so a masked
//! field cannot slip through as a duplicate.
//!
//! ```
//! use weir_json::{Object, raw};
//!
//! let mask = raw("***");
//! let mut row = Object::parse(br#"{"id":1,"email":"a@b.c"}"#).unwrap();
//! assert!(row.replace("email", &mask));
//! let mut out = Vec::new();
//! row.write(&mut out);
//! assert_eq!(out, br#"{"id":1,"email":"***"}"#);
//! ```

pub mod fields;
pub mod template;

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

pub use serde_json::Error;
pub use serde_json::value::RawValue;

/// A JSON object whose keys borrow the input and whose values are raw JSON.
#[derive(Debug)]
pub struct Object<'a> {
    fields: Vec<(Key<'a>, &'a RawValue)>,
}

impl<'a> Object<'a> {
    /// Parses `json`, which must be one JSON object (surrounding whitespace allowed).
    pub fn parse(json: &'a [u8]) -> Result<Object<'a>, Error> {
        // One UTF-8 check of the whole row: parsing a `str` spares serde_json
        // from checking every key and value on its own.
        let text = std::str::from_utf8(json)
            .map_err(|err| <Error as de::Error>::custom(format_args!("not UTF-8 ({err})")))?;
        serde_json::from_str(text)
    }

    /// The raw text of field `key` (its last value if duplicated), if present.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.fields
            .iter()
            .rev()
            .find(|(name, _)| name.0 == key)
            .map(|(_, value)| value.get())
    }

    /// True when field `key` is absent or `null`.
    pub fn is_absent_or_null(&self, key: &str) -> bool {
        self.get(key).is_none_or(|value| value == "null")
    }

    /// Replaces the value of field `key` (every one, if duplicated); true if present.
    pub fn replace(&mut self, key: &str, value: &'a RawValue) -> bool {
        let mut found = false;
        for (name, slot) in &mut self.fields {
            if name.0 == key {
                *slot = value;
                found = true;
            }
        }
        found
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Appends the object, compact, to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        for (index, (key, value)) in self.fields.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            match &key.0 {
                // Borrowed means it had no escapes (and JSON strings hold no
                // raw control characters): its text goes back as it came.
                Cow::Borrowed(text) => {
                    out.push(b'"');
                    out.extend_from_slice(text.as_bytes());
                    out.push(b'"');
                }
                Cow::Owned(text) => write_string(out, text),
            }
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
        }
        out.push(b'}');
    }
}

/// A JSON string of `text`, as a raw value (e.g. a mask, made once).
pub fn raw(text: &str) -> Box<RawValue> {
    let mut json = Vec::with_capacity(text.len() + 2);
    write_string(&mut json, text);
    // Escaped by serde_json itself, so it is valid JSON and valid UTF-8.
    RawValue::from_string(String::from_utf8_lossy(&json).into_owned())
        .unwrap_or_else(|_| RawValue::NULL.to_owned())
}

fn write_string(out: &mut Vec<u8>, text: &str) {
    // Writing a str to a Vec cannot fail.
    let _ = serde_json::to_writer(out, text);
}

/// Fields most rows have, reserved up front so a row's parse allocates once.
const USUAL_FIELDS: usize = 16;

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;

        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Object<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<'de>, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(USUAL_FIELDS));
                while let Some(field) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                    fields.push(field);
                }
                Ok(Object { fields })
            }
        }

        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// A key: borrowed from the input unless it had escapes.
#[derive(Debug)]
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }

            fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_string())))
            }

            fn visit_string<E: de::Error>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }

        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(json: &str, mask: &[&str]) -> String {
        let with = raw("***");
        let mut object = Object::parse(json.as_bytes()).unwrap();
        for key in mask {
            object.replace(key, &with);
        }
        let mut out = Vec::new();
        object.write(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn writes_back_what_it_read_with_masked_fields_replaced() {
        assert_eq!(
            rewrite(
                r#" {"z": 1, "ssn": "123", "a": {"ssn": 1}} "#,
                &["ssn", "card"]
            ),
            r#"{"z":1,"ssn":"***","a":{"ssn": 1}}"#
        );
        assert_eq!(
            rewrite(r#"{"n":1.0e2,"s":"\u00e9"}"#, &[]),
            r#"{"n":1.0e2,"s":"\u00e9"}"#
        );
        assert_eq!(rewrite("{}", &["x"]), "{}");
    }

    #[test]
    fn keys_with_escapes_are_found_and_written_back_escaped() {
        let object = Object::parse(br#"{"a\"b":1,"tab\t":2}"#).unwrap();
        assert_eq!(object.get("a\"b"), Some("1"));
        assert_eq!(rewrite(r#"{"a\"b":1}"#, &["a\"b"]), r#"{"a\"b":"***"}"#);
    }

    #[test]
    fn a_duplicated_key_is_kept_read_by_its_last_value_and_masked_everywhere() {
        assert_eq!(
            rewrite(r#"{"a":1,"b":2,"a":3}"#, &[]),
            r#"{"a":1,"b":2,"a":3}"#
        );
        assert_eq!(
            rewrite(r#"{"a":1,"b":2,"a":3}"#, &["a"]),
            r#"{"a":"***","b":2,"a":"***"}"#
        );
        let object = Object::parse(br#"{"a":1,"a":null}"#).unwrap();
        assert_eq!(object.get("a"), Some("null"));
        assert!(object.is_absent_or_null("a"));
    }

    #[test]
    fn absent_null_and_present() {
        let object = Object::parse(br#"{"a":null,"b":0}"#).unwrap();
        assert!(object.is_absent_or_null("a"));
        assert!(object.is_absent_or_null("c"));
        assert!(!object.is_absent_or_null("b"));
    }

    #[test]
    fn refuses_what_is_not_one_object() {
        for bad in [
            "[1]",
            "1",
            "{oops",
            r#"{"a":1} x"#,
            r#"{"a":[1,}"#,
            "{\"a\":\"\u{1}\"}",
        ] {
            assert!(Object::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        let err = Object::parse(b"{\"a\":\"\xff\"}").unwrap_err();
        assert!(err.to_string().starts_with("not UTF-8"), "{err}");
    }

    #[test]
    fn a_mask_is_a_json_string() {
        assert_eq!(raw(r#"a"b"#).get(), r#""a\"b""#);
    }
}
