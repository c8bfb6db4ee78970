//! Where a value lies in a row's JSON payload (a column's for the postgres
//! sink, a subject token's for the NATS sink), and reading it out
//! as the producer wrote it (its JSON text, not a re-encoding: a number
//! keeps every digit).

use std::collections::HashMap;

use serde_json::value::RawValue;

/// A field of the payload: `"."` the whole payload, a JSON pointer
/// (`"/order/amount"`, RFC 6901, for keys holding dots) or dotted keys
/// (`"order.amount"`); an array is indexed by a number (`"items.0"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The keys from the payload down; none for the whole payload.
    keys: Vec<String>,
}

impl Field {
    pub fn parse(spec: &str) -> Result<Field, String> {
        let keys = if spec == "." {
            Vec::new()
        } else if let Some(pointer) = spec.strip_prefix('/') {
            pointer
                .split('/')
                .map(|key| key.replace("~1", "/").replace("~0", "~"))
                .collect()
        } else if spec.is_empty() {
            return Err("an empty field (`.` is the whole payload)".to_string());
        } else if spec.split('.').any(str::is_empty) {
            return Err(format!(
                "the field {spec:?} has an empty key (a leading, trailing or doubled `.`; \
                 a JSON pointer `/a/b` names keys with dots)"
            ));
        } else {
            spec.split('.').map(str::to_string).collect()
        };
        Ok(Field { keys })
    }

    /// The field's JSON text in `payload`, a JSON object; `None` if a key is
    /// missing, or names into a value that is neither an object nor an array.
    pub fn get<'a>(&self, payload: &Payload<'a>) -> Option<&'a RawValue> {
        let Some((first, rest)) = self.keys.split_first() else {
            return Some(payload.whole);
        };
        let mut value = *payload.members.get(first.as_str())?;
        for key in rest {
            value = member(value, key)?;
        }
        Some(value)
    }
}

/// A payload read as a JSON object, its members' text borrowed from it.
pub struct Payload<'a> {
    whole: &'a RawValue,
    members: HashMap<String, &'a RawValue>,
}

impl<'a> Payload<'a> {
    /// `payload` as a JSON object, or why it is not one.
    pub fn parse(payload: &'a [u8]) -> Result<Payload<'a>, String> {
        let whole: &RawValue =
            serde_json::from_slice(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
        if !whole.get().starts_with('{') {
            return Err("payload is not a JSON object".to_string());
        }
        let members = serde_json::from_str(whole.get())
            .map_err(|e| format!("payload is not a JSON object: {e}"))?;
        Ok(Payload { whole, members })
    }
}

/// The member `key` of `value` if it is an object, or its element at index
/// `key` if it is an array.
fn member<'a>(value: &'a RawValue, key: &str) -> Option<&'a RawValue> {
    let text = value.get();
    if text.starts_with('{') {
        let mut members: HashMap<String, &RawValue> = serde_json::from_str(text).ok()?;
        members.remove(key)
    } else if text.starts_with('[') {
        let index: usize = key.parse().ok()?;
        // RFC 6901: no sign, no leading zero.
        if index.to_string() != key {
            return None;
        }
        let elements: Vec<&RawValue> = serde_json::from_str(text).ok()?;
        elements.get(index).copied()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(spec: &str, payload: &str) -> Option<String> {
        let object = Payload::parse(payload.as_bytes()).unwrap();
        Field::parse(spec)
            .unwrap()
            .get(&object)
            .map(|raw| raw.get().to_string())
    }

    #[test]
    fn reads_fields_as_written() {
        let payload = r#" {"id": 7, "order": {"amount": 12.3400000000000000001, "a.b": [1, {"c": "x"}]},
            "tags": ["p", "q"], "nothing": null, "a/b": true, "t~": 1} "#;
        assert_eq!(get("id", payload).as_deref(), Some("7"));
        assert_eq!(
            get("order.amount", payload).as_deref(),
            Some("12.3400000000000000001")
        );
        assert_eq!(
            get("/order/amount", payload).as_deref(),
            Some("12.3400000000000000001")
        );
        assert_eq!(get("/order/a.b/1/c", payload).as_deref(), Some("\"x\""));
        assert_eq!(get("tags.1", payload).as_deref(), Some("\"q\""));
        assert_eq!(get("nothing", payload).as_deref(), Some("null"));
        assert_eq!(get("/a~1b", payload).as_deref(), Some("true"));
        assert_eq!(get("/t~0", payload).as_deref(), Some("1"));
        assert_eq!(get(".", payload).as_deref(), Some(payload.trim()));
        for missing in [
            "absent",
            "order.absent",
            "id.x",
            "tags.2",
            "tags.01",
            "nothing.x",
        ] {
            assert_eq!(get(missing, payload), None, "{missing}");
        }
    }

    #[test]
    fn refuses_fields_without_keys() {
        for bad in ["", "a..b", ".a", "a."] {
            assert!(Field::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Field::parse("/").is_ok(), "the key \"\"");
    }

    #[test]
    fn a_payload_must_be_an_object() {
        let reason = |payload: &str| Payload::parse(payload.as_bytes()).err();
        assert_eq!(reason("{}\n"), None);
        assert_eq!(
            reason("[1]").as_deref(),
            Some("payload is not a JSON object")
        );
        assert_eq!(reason("3").as_deref(), Some("payload is not a JSON object"));
        assert!(reason("{").unwrap().starts_with("payload is not JSON"));
        assert!(reason("{} {}").unwrap().starts_with("payload is not JSON"));
    }
}
