//! Where a row goes: the unit (partition stream and shard) that stores a
//! table's rows, the subject it is published on, and back from a subject to
//! its tenant and table.
//!
//! Subjects are `<prefix>.in.<partition>.<shard>.<tenant>.<table>`. The
//! default route hashes tenant and table: one 64-bit hash picks the partition
//! with jump consistent hashing, an independent one picks the shard. Every
//! table lives in exactly one unit, so its rows keep their order.
//!
//! Architecture invariant: the mapping never changes between versions for
//! the same N and V (golden vectors below pin it) — a rolling upgrade must
//! never move a table.

use std::borrow::Cow;
use std::fmt::Write as _;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the partition hash. Changing it moves every table.
const PARTITION_SEED: u64 = 0x7765_6972_5f70_6172; // "weir_par"
/// Seed of the shard hash: independent of the partition hash, or the shards
/// of a partition would only see the tables that hash to it alike.
const SHARD_SEED: u64 = 0x7765_6972_5f73_6864; // "weir_shd"
/// Separates tenant from table in the hashed key; cannot occur in either
/// (names are UTF-8 and this byte is invalid UTF-8).
const KEY_SEPARATOR: u8 = 0xff;
/// Escapes a byte in an encoded subject token: `~` + two hex digits.
const ESCAPE: char = '~';

/// Header names a dead letter carries, whoever writes it (delivery for a
/// row its pipeline gave up on, the front door for a bad line). The
/// original row's headers are kept beside them unchanged.
pub mod letter_headers {
    pub const TENANT: &str = "Weir-Tenant";
    pub const TABLE: &str = "Weir-Table";
    pub const REASON: &str = "Weir-Reason";
    pub const PLUGIN: &str = "Weir-Plugin";
    pub const PLUGIN_VERSION: &str = "Weir-Plugin-Version";
    pub const DELIVERIES: &str = "Weir-Deliveries";
    pub const SEQUENCE: &str = "Weir-Sequence";
    /// The bad line's number in its request (front-door letters only).
    pub const LINE: &str = "Weir-Line";
    /// On a replayed row (and on a letter made of it again): the sequence
    /// of the dead letter it was replayed from.
    pub const REPLAY_OF: &str = "Weir-Replay-Of";

    /// Longest reason kept: a plugin's reason is its own text, so bound it;
    /// room for a failed call's message and the guest's stderr it quotes (4 KiB).
    pub const MAX_REASON_BYTES: usize = 8192;

    /// What a redacted field's value becomes in a letter.
    pub const REDACTED: &str = "[redacted]";

    /// What a letter stores of `payload`: a JSON object's `redact` fields
    /// with their values replaced (`[dead_letters] redact`); anything else
    /// as it is.
    pub fn redacted(payload: &bytes::Bytes, redact: &[String]) -> bytes::Bytes {
        if redact.is_empty() {
            return payload.clone();
        }
        let Ok(serde_json::Value::Object(mut row)) = serde_json::from_slice(payload) else {
            return payload.clone();
        };
        let mut changed = false;
        for field in redact {
            if let Some(value) = row.get_mut(field) {
                *value = serde_json::Value::from(REDACTED);
                changed = true;
            }
        }
        match changed {
            true => serde_json::to_vec(&row).map_or_else(|_| payload.clone(), bytes::Bytes::from),
            false => payload.clone(),
        }
    }

    /// A header value is one line: fold line breaks and bound its length.
    pub fn header_safe(text: &str) -> String {
        let mut folded: String = text
            .chars()
            .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
            .collect();
        if folded.len() > MAX_REASON_BYTES {
            let mut cut = MAX_REASON_BYTES;
            while !folded.is_char_boundary(cut) {
                cut -= 1;
            }
            folded.truncate(cut);
        }
        folded
    }
}

/// One shard's slice of a partition stream: what a durable consumer pulls.
/// Written `<partition>.<shard>` (`1.2`), as in the coordination bucket.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Unit {
    pub partition: u32,
    pub shard: u32,
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.partition, self.shard)
    }
}

/// Why a unit's text is not `<partition>.<shard>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a unit: write it <partition>.<shard>, such as 0.1")]
pub struct NotAUnit {
    pub text: String,
}

impl std::str::FromStr for Unit {
    type Err = NotAUnit;

    fn from_str(text: &str) -> Result<Unit, NotAUnit> {
        let error = || NotAUnit {
            text: text.to_string(),
        };
        let (partition, shard) = text.trim().split_once('.').ok_or_else(error)?;
        Ok(Unit {
            partition: partition.parse().map_err(|_| error())?,
            shard: shard.parse().map_err(|_| error())?,
        })
    }
}

/// Names every subject, stream and consumer weir uses under one prefix, for
/// a topology of `partitions` × `shards` units, and gives a table's default
/// route. (Not a router plugin: those are `World::Router`, asked by
/// `ingest/policy.rs`.)
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
    partitions: u32,
    shards: u32,
}

/// A subject that is not one of weir's row subjects.
#[derive(Debug, thiserror::Error)]
#[error("subject `{0}` is not a weir row subject")]
pub struct NotARowSubject(pub String);

impl Names {
    /// `partitions` and `shards` are at least 1 (config validation sees to it).
    pub fn new(prefix: &str, partitions: u32, shards: u32) -> Self {
        Names {
            prefix: prefix.to_string(),
            partitions: partitions.max(1),
            shards: shards.max(1),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Every unit of the topology, partition-major.
    pub fn units(&self) -> Vec<Unit> {
        (0..self.partitions)
            .flat_map(|partition| (0..self.shards).map(move |shard| Unit { partition, shard }))
            .collect()
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The unit that stores a table's rows (the default route).
    pub fn route(&self, tenant: &str, table: &str) -> Unit {
        let mut key = Vec::with_capacity(tenant.len() + table.len() + 1);
        key.extend_from_slice(tenant.as_bytes());
        key.push(KEY_SEPARATOR);
        key.extend_from_slice(table.as_bytes());
        Unit {
            partition: jump_hash(xxh3_64_with_seed(&key, PARTITION_SEED), self.partitions),
            shard: jump_hash(xxh3_64_with_seed(&key, SHARD_SEED), self.shards),
        }
    }

    /// The subject a row of `tenant`/`table` is published on.
    pub fn subject(&self, unit: Unit, tenant: &str, table: &str) -> String {
        let (tenant, table) = (encode_token(tenant), encode_token(table));
        let mut subject =
            String::with_capacity(self.prefix.len() + tenant.len() + table.len() + 24);
        let _ = write!(
            subject,
            "{}.in.{}.{}.{tenant}.{table}",
            self.prefix, unit.partition, unit.shard
        );
        subject
    }

    /// Tenant and table of a row subject, decoded.
    pub fn parse<'s>(
        &self,
        subject: &'s str,
    ) -> Result<(Cow<'s, str>, Cow<'s, str>), NotARowSubject> {
        let not_row = || NotARowSubject(subject.to_string());
        let rest = subject
            .strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.strip_prefix(".in."))
            .ok_or_else(not_row)?;
        let mut tokens = rest.splitn(4, '.');
        let (_partition, _shard) = (tokens.next(), tokens.next());
        match (tokens.next(), tokens.next()) {
            (Some(tenant), Some(table)) if !tenant.is_empty() && !table.is_empty() => Ok((
                decode_token(tenant).ok_or_else(not_row)?,
                decode_token(table).ok_or_else(not_row)?,
            )),
            _ => Err(not_row()),
        }
    }

    /// The stream that holds a partition's rows.
    pub fn partition_stream(&self, partition: u32) -> String {
        format!("{}_in_{partition}", self.prefix)
    }

    /// Every subject of a partition stream.
    pub fn partition_subjects(&self, partition: u32) -> String {
        format!("{}.in.{partition}.>", self.prefix)
    }

    /// The durable consumer of a unit. Named by partition and shard only, so
    /// adding shards never renames an existing durable.
    pub fn unit_consumer(&self, unit: Unit) -> String {
        format!("{}_in_{}_{}", self.prefix, unit.partition, unit.shard)
    }

    /// The subjects a unit's consumer takes.
    pub fn unit_filter(&self, unit: Unit) -> String {
        format!("{}.in.{}.{}.>", self.prefix, unit.partition, unit.shard)
    }

    /// The dead-letter stream.
    pub fn dead_letter_stream(&self) -> String {
        format!("{}_dlq", self.prefix)
    }

    /// The subject a dead row of `tenant`/`table` goes to.
    pub fn dead_letter_subject(&self, tenant: &str, table: &str) -> String {
        format!(
            "{}.dlq.{}.{}",
            self.prefix,
            encode_token(tenant),
            encode_token(table)
        )
    }

    /// The dead-letter subjects of one tenant, one table (of any tenant),
    /// or both; every dead-letter subject when neither is given. Names are
    /// encoded, so a name cannot widen the filter with `*` or `>`.
    pub fn dead_letter_filter(&self, tenant: Option<&str>, table: Option<&str>) -> String {
        match (tenant, table) {
            (None, None) => self.dead_letter_subjects(),
            (tenant, table) => format!(
                "{}.dlq.{}.{}",
                self.prefix,
                tenant.map_or(Cow::Borrowed("*"), encode_token),
                table.map_or(Cow::Borrowed("*"), encode_token)
            ),
        }
    }

    /// The object store of plugins pushed to the fleet.
    pub fn plugin_store(&self) -> String {
        format!("{}_plugins", self.prefix)
    }

    /// The object store of components compiled for the fleet: written
    /// only by hosts (and a `weir plugin push` run with a host's
    /// credentials), never by tenants.
    pub fn compiled_store(&self) -> String {
        format!("{}_compiled", self.prefix)
    }

    /// The KV bucket of members and unit owners.
    pub fn coordination_bucket(&self) -> String {
        format!("{}_coord", self.prefix)
    }

    /// The KV bucket of plugin state: one value per (tenant, plugin, table).
    pub fn state_bucket(&self) -> String {
        format!("{}_state", self.prefix)
    }

    /// What the readiness probe asks: a subject nobody serves, so the
    /// server itself answers (no responders) on the host's inbox.
    pub fn readiness_subject(&self) -> String {
        format!("{}.readyz", self.prefix)
    }

    /// Where hosts share the rows they accepted, for fleet-wide usage.
    pub fn usage_subject(&self) -> String {
        format!("{}.usage.accepts", self.prefix)
    }

    /// Every dead-letter subject.
    pub fn dead_letter_subjects(&self) -> String {
        format!("{}.dlq.>", self.prefix)
    }

    /// The subject a producer sends `tenant`'s rows of `table` to, as a
    /// request (the NATS door): `<prefix>.ingest.<tenant>.<table>`.
    pub fn ingest_subject(&self, tenant: &str, table: &str) -> String {
        format!(
            "{}.ingest.{}.{}",
            self.prefix,
            encode_token(tenant),
            encode_token(table)
        )
    }

    /// Every ingest subject: what hosts serve, as one queue group. Wider
    /// than a producer may send to, so that a malformed subject is
    /// answered rather than left without a responder.
    pub fn ingest_subjects(&self) -> String {
        format!("{}.ingest.>", self.prefix)
    }

    /// One tenant's ingest subjects: what its producers may publish to.
    pub fn tenant_ingest_subjects(&self, tenant: &str) -> String {
        format!("{}.ingest.{}.*", self.prefix, encode_token(tenant))
    }

    /// The queue group of the hosts serving the ingest subjects.
    pub fn ingest_queue(&self) -> String {
        format!("{}_ingest", self.prefix)
    }

    /// The inbox prefix a producer of `tenant` takes its answers on: a
    /// prefix of its own, so that no tenant may read another's answers.
    pub fn tenant_inbox(&self, tenant: &str) -> String {
        format!("_INBOX.{}.{}", self.prefix, encode_token(tenant))
    }

    /// Tenant and table of an ingest subject, decoded; `None` for a subject
    /// that is not `<prefix>.ingest.<tenant>.<table>`.
    pub fn parse_ingest<'s>(&self, subject: &'s str) -> Option<(Cow<'s, str>, Cow<'s, str>)> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".ingest.")?;
        let (tenant, table) = rest.split_once('.')?;
        if tenant.is_empty() || table.is_empty() || table.contains('.') {
            return None;
        }
        Some((decode_token(tenant)?, decode_token(table)?))
    }
}

/// Jump consistent hashing (Lamping & Veach, 2014): maps a key to one of
/// `buckets`, moving only 1/n of the keys when a bucket is added.
pub fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// Makes any name a valid subject token, reversibly: `A-Z a-z 0-9 _ -` stay,
/// every other byte becomes `~XX`. Plain names are borrowed unchanged.
pub fn encode_token(name: &str) -> Cow<'_, str> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    if !name.is_empty() && name.bytes().all(plain) {
        return Cow::Borrowed(name);
    }
    let mut encoded = String::with_capacity(name.len() * 3);
    for byte in name.bytes() {
        if plain(byte) {
            encoded.push(byte as char);
        } else {
            let _ = write!(encoded, "{ESCAPE}{byte:02X}");
        }
    }
    Cow::Owned(encoded)
}

/// The inverse of [`encode_token`]; `None` for a token it cannot have made.
pub fn decode_token(token: &str) -> Option<Cow<'_, str>> {
    if !token.contains(ESCAPE) {
        return Some(Cow::Borrowed(token));
    }
    let bytes = token.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == ESCAPE as u8 {
            let hex = token.get(index + 1..index + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok().map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn ingest_subjects_round_trip_and_stay_in_their_tenant() {
        let router = Names::new("weir", 4, 1);
        let subject = router.ingest_subject("acme corp", "orders.eu");
        assert_eq!(subject, "weir.ingest.acme~20corp.orders~2Eeu");
        let (tenant, table) = router.parse_ingest(&subject).unwrap();
        assert_eq!(
            (tenant.as_ref(), table.as_ref()),
            ("acme corp", "orders.eu")
        );
        assert_eq!(
            router.tenant_ingest_subjects("a.>"),
            "weir.ingest.a~2E~3E.*",
            "a name cannot widen the filter"
        );
        assert_eq!(router.tenant_inbox("acme"), "_INBOX.weir.acme");
        for wrong in [
            "weir.ingest.acme",
            "weir.ingest.acme.orders.extra",
            "weir.ingest..orders",
            "weir.in.0.0.acme.orders",
            "other.ingest.acme.orders",
            "weir.ingest.ac~ZZme.orders",
        ] {
            assert!(router.parse_ingest(wrong).is_none(), "{wrong}");
        }
    }

    #[test]
    fn subject_round_trips() {
        let router = Names::new("weir", 4, 8);
        let unit = router.route("acme", "orders");
        let subject = router.subject(unit, "acme", "orders");
        assert_eq!(
            subject,
            format!("weir.in.{}.{}.acme.orders", unit.partition, unit.shard)
        );
        let (tenant, table) = router.parse(&subject).unwrap();
        assert_eq!((tenant.as_ref(), table.as_ref()), ("acme", "orders"));
        assert_eq!(
            router.unit_consumer(Unit {
                partition: 2,
                shard: 5
            }),
            "weir_in_2_5"
        );
        assert_eq!(
            router.unit_filter(Unit {
                partition: 2,
                shard: 5
            }),
            "weir.in.2.5.>"
        );
    }

    #[test]
    fn any_name_is_encoded_reversibly_and_never_mixed_up() {
        for name in [
            "orders", "a.b", "a*b", "a>b", "a b", "~", "~7E", "über", "ta\tble", "x-y_z",
        ] {
            let encoded = encode_token(name);
            assert!(
                encoded
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-~".contains(c)),
                "{encoded}"
            );
            assert_eq!(decode_token(&encoded).as_deref(), Some(name));
        }
        // Two names that differ stay different after encoding.
        assert_ne!(encode_token("~7E"), encode_token("~"));
        let router = Names::new("weir", 2, 2);
        let unit = router.route("t.1", "my table");
        let subject = router.subject(unit, "t.1", "my table");
        assert_eq!(subject.split('.').count(), 6, "{subject}");
        let (tenant, table) = router.parse(&subject).unwrap();
        assert_eq!((tenant.as_ref(), table.as_ref()), ("t.1", "my table"));
        assert!(decode_token("~ZZ").is_none());
        assert!(decode_token("~F").is_none());
    }

    #[test]
    fn foreign_subjects_are_refused() {
        let router = Names::new("weir", 1, 1);
        assert!(router.parse("other.in.0.0.a.b").is_err());
        assert!(router.parse("weir.in.0.0.a").is_err());
        assert!(router.parse("weir.dlq.a.b").is_err());
    }

    #[test]
    fn dead_letter_filters_name_a_tenant_a_table_or_both() {
        let router = Names::new("weir", 1, 1);
        assert_eq!(router.dead_letter_filter(None, None), "weir.dlq.>");
        assert_eq!(
            router.dead_letter_filter(Some("acme"), None),
            "weir.dlq.acme.*"
        );
        assert_eq!(
            router.dead_letter_filter(None, Some("orders")),
            "weir.dlq.*.orders"
        );
        assert_eq!(
            router.dead_letter_filter(Some("a.b"), Some("*")),
            "weir.dlq.a~2Eb.~2A"
        );
        assert_eq!(
            router.dead_letter_filter(Some("acme"), Some("orders")),
            router.dead_letter_subject("acme", "orders")
        );
    }

    /// Golden vectors: these exact units, forever, for these N and V. If this
    /// test fails, a rolling upgrade would move tables between units.
    #[test]
    fn golden_routes() {
        let router = Names::new("weir", 4, 8);
        let golden = [
            ("acme", "orders", 2, 7),
            ("acme", "clicks", 3, 5),
            ("globex", "orders", 3, 1),
            ("initech", "tps_reports", 3, 0),
            ("umbrella", "samples", 2, 1),
            ("a", "b", 0, 6),
        ];
        let found: Vec<_> = golden
            .iter()
            .map(|(tenant, table, _, _)| {
                let unit = router.route(tenant, table);
                (*tenant, *table, unit.partition, unit.shard)
            })
            .collect();
        assert_eq!(found, golden);
        // The reference implementation's published vectors.
        assert_eq!(
            [
                jump_hash(1, 1),
                jump_hash(42, 57),
                jump_hash(0xDEAD10CC, 666),
                jump_hash(256, 1024)
            ],
            [0, 43, 361, 520]
        );
    }

    #[test]
    fn routes_spread_evenly_over_units() {
        let router = Names::new("weir", 4, 8);
        let mut counts: HashMap<Unit, usize> = HashMap::new();
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            // xorshift: a fixed pseudo-random sequence of tenant/table names.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..10_000 {
            let (tenant, table) = (
                format!("tenant{}", next() % 500),
                format!("table{}", next()),
            );
            *counts.entry(router.route(&tenant, &table)).or_default() += 1;
        }
        assert_eq!(counts.len(), 32, "every unit gets tables");
        let mean = 10_000.0 / 32.0;
        for (unit, count) in counts {
            let off = (count as f64 - mean).abs() / mean;
            assert!(
                off <= 0.25,
                "{unit:?} has {count} tables, {:.0}% off the mean",
                off * 100.0
            );
        }
    }

    #[test]
    fn adding_a_shard_moves_few_tables() {
        let (before, after) = (Names::new("weir", 4, 8), Names::new("weir", 4, 9));
        let moved = (0..9_000)
            .filter(|i| {
                let table = format!("table{i}");
                before.route("acme", &table) != after.route("acme", &table)
            })
            .count();
        // Jump hashing moves about 1/9 of the tables to the new shard.
        assert!((700..=1300).contains(&moved), "{moved} of 9000 moved");
    }
}
