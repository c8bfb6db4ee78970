//! Key prefixes of a watch: validated, folded so that no two overlap, and
//! turned into the consumer's filter subjects — pure functions.
//!
//! A prefix is token-wise, like NATS subjects: `plugins.` (ending with a
//! dot) covers every key whose first tokens are `plugins` — `plugins.a`,
//! `plugins.a.b` — and becomes the filter `$KV.<bucket>.plugins.>`. A prefix
//! without the trailing dot is an exact key: `plugins` covers the key
//! `plugins` only (`$KV.<bucket>.plugins`), never `pluginsX` nor
//! `plugins.a`. There is no way to spell "the whole bucket": the empty
//! prefix is refused, so an empty list can never grow into a bucket-wide watch.

use super::KvError;

/// Validates `prefixes` and folds them: duplicates go, and so does every
/// prefix or key that another prefix already covers (`plugins.a.` under
/// `plugins.`). The server refuses overlapping filters (error 10138), so this
/// runs before any of them reach it. The result is sorted.
pub fn fold_prefixes<P: AsRef<str>>(prefixes: &[P]) -> Result<Vec<String>, KvError> {
    let mut sorted = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        let prefix = prefix.as_ref();
        check_prefix(prefix)?;
        sorted.push(prefix.to_string());
    }
    sorted.sort();
    sorted.dedup();
    // Everything a prefix covers sorts right after it, in one contiguous run,
    // so one pass that remembers the last kept dotted prefix folds them all.
    let mut folded: Vec<String> = Vec::with_capacity(sorted.len());
    let mut cover: Option<String> = None;
    for prefix in sorted {
        if cover
            .as_deref()
            .is_some_and(|cover| prefix.starts_with(cover))
        {
            continue;
        }
        if prefix.ends_with('.') {
            cover = Some(prefix.clone());
        }
        folded.push(prefix);
    }
    Ok(folded)
}

/// The filter subject of one (valid) prefix in `bucket`.
pub fn filter_subject(bucket: &str, prefix: &str) -> String {
    if prefix.ends_with('.') {
        format!("$KV.{bucket}.{prefix}>")
    } else {
        format!("$KV.{bucket}.{prefix}")
    }
}

/// Whether `key` is under `prefix` (the same rule the filter subject applies).
pub fn covers(prefix: &str, key: &str) -> bool {
    if prefix.ends_with('.') {
        key.starts_with(prefix) && key.len() > prefix.len()
    } else {
        key == prefix
    }
}

/// A prefix is a key, or a key followed by a dot: tokens of the characters
/// NATS KV allows in keys, no empty token, no wildcard.
fn check_prefix(prefix: &str) -> Result<(), KvError> {
    let invalid = |reason: &'static str| KvError::InvalidPrefix {
        prefix: prefix.to_string(),
        reason,
    };
    if prefix.is_empty() {
        return Err(invalid(
            "empty (a watch names what it follows; there is no whole-bucket prefix)",
        ));
    }
    let body = prefix.strip_suffix('.').unwrap_or(prefix);
    if body.is_empty() || body.split('.').any(str::is_empty) {
        return Err(invalid("empty token (leading dot or two dots in a row)"));
    }
    if !body.chars().all(is_key_char) {
        return Err(invalid(
            "keys use only letters, digits and `-/_=.` (no wildcards)",
        ));
    }
    Ok(())
}

/// Checks a whole key for a write: the same characters, no trailing dot.
pub fn check_key(key: &str) -> Result<(), KvError> {
    let valid =
        !key.is_empty() && !key.split('.').any(str::is_empty) && key.chars().all(is_key_char);
    if valid {
        Ok(())
    } else {
        Err(KvError::InvalidKey {
            key: key.to_string(),
        })
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '/' | '_' | '=' | '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(prefixes: &[&str]) -> Vec<String> {
        fold_prefixes(prefixes).expect("valid prefixes")
    }

    #[test]
    fn overlapping_prefixes_fold_into_the_widest() {
        assert_eq!(fold(&["plugins.", "plugins.a."]), ["plugins."]);
        assert_eq!(fold(&["plugins.a.", "plugins."]), ["plugins."]);
        assert_eq!(fold(&["plugins.", "plugins.a.b"]), ["plugins."]);
        assert_eq!(
            fold(&["a.b.", "a.", "a.b.c", "b", "b.", "b.x", "a"]),
            ["a", "a.", "b", "b."]
        );
    }

    #[test]
    fn duplicates_fold_and_the_result_is_sorted() {
        assert_eq!(fold(&["b.", "a.", "b.", "a."]), ["a.", "b."]);
        assert_eq!(fold(&["k", "k"]), ["k"]);
    }

    #[test]
    fn prefixes_are_token_wise() {
        // `plug.` does not cover `plugins.` and an exact key covers nothing else.
        assert_eq!(fold(&["plug.", "plugins."]), ["plug.", "plugins."]);
        assert_eq!(fold(&["plugins", "plugins.a."]), ["plugins", "plugins.a."]);
        assert!(covers("plugins.", "plugins.a"));
        assert!(!covers("plugins.", "plugins"));
        assert!(!covers("plugins.", "pluginsx.a"));
        assert!(covers("plugins", "plugins"));
        assert!(!covers("plugins", "plugins.a"));
    }

    #[test]
    fn an_empty_list_stays_empty() {
        assert!(fold(&[]).is_empty());
    }

    #[test]
    fn folding_agrees_with_pairwise_overlap() {
        // Every subset of a small universe: what is left never overlaps, and
        // every input is covered by something that is left.
        let universe = ["a", "a.", "a.b", "a.b.", "a.b.c", "ab.", "b.", "b.a"];
        for mask in 0u32..(1 << universe.len()) {
            let input: Vec<&str> = (0..universe.len())
                .filter(|bit| mask & (1 << bit) != 0)
                .map(|bit| universe[bit])
                .collect();
            let folded = fold(&input);
            for (i, left) in folded.iter().enumerate() {
                for right in &folded[i + 1..] {
                    let overlap = (left.ends_with('.') && right.starts_with(left.as_str()))
                        || (right.ends_with('.') && left.starts_with(right.as_str()));
                    assert!(!overlap, "{left} and {right} overlap in {folded:?}");
                }
            }
            for prefix in &input {
                let covered = folded.iter().any(|kept| {
                    kept == prefix || (kept.ends_with('.') && prefix.starts_with(kept.as_str()))
                });
                assert!(covered, "{prefix} lost from {input:?} → {folded:?}");
            }
        }
    }

    #[test]
    fn filters_follow_the_prefix_kind() {
        assert_eq!(filter_subject("cfg", "plugins."), "$KV.cfg.plugins.>");
        assert_eq!(filter_subject("cfg", "plugins.a"), "$KV.cfg.plugins.a");
    }

    #[test]
    fn bad_prefixes_are_refused_with_the_reason() {
        for bad in ["", ".", ".a", "a..b", "a.*", "a.>", "a b", "é."] {
            let err = fold_prefixes(&[bad]).expect_err(bad);
            assert!(
                matches!(&err, KvError::InvalidPrefix { prefix, .. } if prefix == bad),
                "{bad}: {err}"
            );
        }
        assert!(check_key("a.b").is_ok());
        for bad in ["", "a.", ".a", "a..b", "a.>"] {
            assert!(check_key(bad).is_err(), "{bad}");
        }
    }
}
