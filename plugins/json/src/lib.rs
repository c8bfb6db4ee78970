//! JSON objects read without copying their fields.
//!
//! [`Object::parse`] validates a whole JSON object but keeps each key as a
//! slice of the input (unless it has escapes) and each value as its raw
//! text, so checking fields and replacing a few costs about one allocation
//! per row instead of one per key and value. [`Object::write`] writes the
//! fields back in their order: keys re-escaped, values verbatim, so numbers
//! and nested values keep exactly the text the producer sent. A duplicated
//! key keeps its first position and its last value, as `serde_json`'s
//! ordered map does.
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

use std::borrow::{Borrow, Cow};
use std::fmt;

use indexmap::IndexMap;
use serde::de::{self, Deserialize, Deserializer, Visitor};

pub use serde_json::Error;
pub use serde_json::value::RawValue;

/// A JSON object whose keys borrow the input and whose values are raw JSON.
#[derive(Debug)]
pub struct Object<'a> {
    fields: IndexMap<Key<'a>, &'a RawValue>,
}

impl<'a> Object<'a> {
    /// Parses `json`, which must be one JSON object (surrounding whitespace allowed).
    pub fn parse(json: &'a [u8]) -> Result<Object<'a>, Error> {
        let fields = serde_json::from_slice(json)?;
        Ok(Object { fields })
    }

    /// The raw text of field `key`, if present.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.fields.get(key).map(|value| value.get())
    }

    /// True when field `key` is absent or `null`.
    pub fn is_absent_or_null(&self, key: &str) -> bool {
        self.get(key).is_none_or(|value| value == "null")
    }

    /// Replaces the value of field `key` if present; true if it was.
    pub fn replace(&mut self, key: &str, value: &'a RawValue) -> bool {
        match self.fields.get_mut(key) {
            Some(slot) => {
                *slot = value;
                true
            }
            None => false,
        }
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
            write_string(out, &key.0);
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

/// A key: borrowed from the input unless it had escapes.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Key<'a>(Cow<'a, str>);

// `Cow<str>` hashes and compares as the `str` it holds, so lookups by `&str` agree.
impl Borrow<str> for Key<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

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
    fn a_duplicate_key_keeps_its_first_place_and_last_value() {
        assert_eq!(rewrite(r#"{"a":1,"b":2,"a":3}"#, &[]), r#"{"a":3,"b":2}"#);
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
        for bad in ["[1]", "1", "{oops", r#"{"a":1} x"#, r#"{"a":[1,}"#] {
            assert!(Object::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_mask_is_a_json_string() {
        assert_eq!(raw(r#"a"b"#).get(), r#""a\"b""#);
    }
}
