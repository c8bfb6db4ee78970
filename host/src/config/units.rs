//! Durations and sizes as people write them: `"30s"`, `"1m30s"`, `"500GB"`,
//! `"64MiB"`. Sizes are binary (K = 1024), as nats-server's own config
//! reads them, so the same text means the same bytes in both files.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A duration written as a string (`"250ms"`, `"30s"`, `"2m"`, `"1h30m"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(HumanDuration)
            .map_err(de::Error::custom)
    }
}

/// `"30s"` → 30 s; the units are ms, s, m, h and d (and their long names).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|err| {
        format!(
            "`{text}` is not a duration ({err}): write e.g. \"500ms\", \"30s\", \"5m\" or \"1h30m\""
        )
    })
}

/// How a duration is shown in messages: `30s`, `1m 30s`.
pub fn show_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A byte count written as an integer or a string with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", show_size(self.0))
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes, or a string such as \"64MiB\" or \"500GB\"")
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Size, E> {
                u64::try_from(value)
                    .map(Size)
                    .map_err(|_| E::custom(format!("a size cannot be negative ({value})")))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Size, E> {
                Ok(Size(value))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Size, E> {
                parse_size(text).map(Size).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// `"500GB"` → 500 × 1024³. Units: B, K/KB/KiB, M/MB/MiB, G/GB/GiB,
/// T/TB/TiB (any case); none means bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "`{text}` is not a size: write bytes, or a number with K, M, G or T (KB, MiB… are the same, binary)"
            ));
        }
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size: it must start with a whole number"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// How a size is shown in messages: `16 MiB`, `1000 bytes`.
pub fn show_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    match bytes {
        1 => "1 byte".to_string(),
        _ => format!("{bytes} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_nats_server_reads_them() {
        assert_eq!(parse_size("500GB"), Ok(500 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size("1 K"), Ok(1024));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("12B"), Ok(12));
        assert!(parse_size("5 XB").is_err());
        assert!(parse_size("GB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(show_size(16 << 20), "16 MiB");
        assert_eq!(show_size(1000), "1000 bytes");
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(show_duration(Duration::from_secs(90)), "1m 30s");
    }
}
