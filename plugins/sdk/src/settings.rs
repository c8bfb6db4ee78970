//! Parsing of the JSON settings the host passes to `init`, with errors that name the offending field.

use serde::de::DeserializeOwned;

/// Parses a plugin's settings (the JSON object the host passes to `init`).
///
/// An empty string is read as `{}`. An error names the field at fault, e.g.
/// ``settings.fsync: invalid type: string "yes", expected a boolean``,
/// ``settings.colour: unknown field `colour`, expected `dir` or `fsync` ``
/// or ``settings: missing field `mode` ``.
pub fn settings<T: DeserializeOwned>(json: &str) -> Result<T, String> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    let mut de = serde_json::Deserializer::from_str(json);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| describe(&e))?;
    de.end()
        .map_err(|e| format!("settings: not valid JSON: {e}"))?;
    Ok(value)
}

fn describe(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let inner = e.inner();
    if inner.is_syntax() || inner.is_eof() {
        return format!("settings: not valid JSON: {inner}");
    }
    let message = strip_position(inner);
    match e.path().to_string().as_str() {
        "." => format!("settings: {message}"),
        path if path.starts_with('[') => format!("settings{path}: {message}"),
        path => format!("settings.{path}: {message}"),
    }
}

/// serde_json's message without its " at line L column C" suffix, which
/// means little for settings written in TOML.
fn strip_position(e: &serde_json::Error) -> String {
    let message = e.to_string();
    match message.rfind(" at line ") {
        Some(i) if e.line() != 0 => message[..i].to_string(),
        _ => message,
    }
}

#[cfg(test)]
mod tests {
    use super::settings;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct S {
        #[serde(default)]
        fsync: bool,
        #[serde(default)]
        inner: Inner,
    }

    #[derive(serde::Deserialize, Debug, Default)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        #[serde(default)]
        names: Vec<String>,
    }

    #[test]
    fn names_the_field() {
        let e = settings::<S>(r#"{"fsync": "yes"}"#).unwrap_err();
        assert!(e.starts_with("settings.fsync: invalid type"), "{e}");
        let e = settings::<S>(r#"{"inner": {"names": [1]}}"#).unwrap_err();
        assert!(
            e.starts_with("settings.inner.names[0]: invalid type"),
            "{e}"
        );
        let e = settings::<S>(r#"{"colour": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `colour`"), "{e}");
        assert!(settings::<S>("").is_ok());
        assert!(settings::<S>("{} x").is_err());
        let e = settings::<S>("{").unwrap_err();
        assert!(e.starts_with("settings: not valid JSON: EOF"), "{e}");
        let e = settings::<Vec<u32>>("[1, \"x\"]").unwrap_err();
        assert!(e.starts_with("settings[1]: invalid type"), "{e}");
    }
}
