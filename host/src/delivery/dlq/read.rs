//! The operator's side of the dead letters: listing them, replaying them
//! after a fix, and purging them (`weir dlq`, the status page).

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{DeadLetters, headers};
use crate::nats::NatsError;
use crate::nats::jetstream::is_nats_header;
use crate::topology::route::Names;

/// Which dead letters `weir dlq list|replay|purge` act on. Tenant, table and
/// `since` are applied by the server (the reading consumer's subject filter
/// and start time); `reason` is checked here; `sequences` are fetched one by
/// one instead of read from a consumer.
#[derive(Debug, Clone, Default)]
pub struct LetterFilter {
    pub tenant: Option<String>,
    pub table: Option<String>,
    /// Dead-letter stream sequences; empty means all.
    pub sequences: Vec<u64>,
    /// A substring of the letter's reason.
    pub reason: Option<String>,
    /// Only letters stored at or after this time.
    pub since: Option<OffsetDateTime>,
    /// Stop after this many matching letters, oldest first.
    pub limit: Option<usize>,
}

impl LetterFilter {
    /// True when nothing narrows the selection: every letter in the stream
    /// (up to `limit`). An operator is asked before such a replay or purge.
    pub fn selects_everything(&self) -> bool {
        self.tenant.is_none()
            && self.table.is_none()
            && self.sequences.is_empty()
            && self.reason.is_none()
            && self.since.is_none()
    }

    /// The consumer's subject filter for tenant and table.
    pub fn subject(&self, router: &Names) -> String {
        router.dead_letter_filter(self.tenant.as_deref(), self.table.as_deref())
    }

    /// True when only tenant and table select: the server can then remove
    /// the matching letters in one purge request.
    fn by_subject_only(&self) -> bool {
        self.sequences.is_empty()
            && self.reason.is_none()
            && self.since.is_none()
            && self.limit.is_none()
    }

    /// Whether a letter read by sequence (no server-side filter) passes, or
    /// one read from a filtered consumer (where this re-checks what the
    /// server already did, and checks the reason).
    fn matches(&self, letter: &StoredLetter, stored_at: OffsetDateTime) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == letter.tenant)
            && self.table.as_ref().is_none_or(|t| *t == letter.table)
            && self
                .reason
                .as_ref()
                .is_none_or(|r| letter.reason.contains(r.as_str()))
            && self.since.is_none_or(|since| stored_at >= since)
    }

    fn is_full(&self, found: usize) -> bool {
        self.limit.is_some_and(|limit| found >= limit)
    }
}

/// `--since` that is neither an RFC 3339 time nor a duration.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{0}` is neither an RFC 3339 time (like 2026-01-31T12:00:00Z) nor a duration ago (like 30m, 2h, 1d, 1h30m)"
)]
pub struct SinceError(pub String);

/// A `--since` value: an RFC 3339 time, or a duration before `now` made of
/// whole numbers with a unit each (`s`, `m`, `h`, `d`), like `1h30m`.
pub fn parse_since(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, SinceError> {
    let text = text.trim();
    if let Ok(time) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(time);
    }
    let invalid = || SinceError(text.to_string());
    let mut seconds: u64 = 0;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(invalid()),
        };
        let count: u64 = digits.parse().map_err(|_| invalid())?;
        digits.clear();
        seconds = count
            .checked_mul(unit)
            .and_then(|s| s.checked_add(seconds))
            .ok_or_else(invalid)?;
    }
    if !digits.is_empty() || text.is_empty() {
        // A number without its unit is ambiguous: refuse rather than guess.
        return Err(invalid());
    }
    let ago = time::Duration::seconds(i64::try_from(seconds).map_err(|_| invalid())?);
    now.checked_sub(ago).ok_or_else(invalid)
}

/// A dead letter as stored, for an operator to look at.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StoredLetter {
    /// Its sequence in the dead-letter stream.
    pub sequence: u64,
    /// When the dead-letter stream stored it (RFC 3339, UTC).
    pub stored_at: String,
    pub tenant: String,
    pub table: String,
    pub reason: String,
    pub plugin: Option<String>,
    pub plugin_version: Option<String>,
    pub deliveries: u64,
    /// The row's sequence in its partition stream when it died (0 for a
    /// bad line the front door dead-lettered: it was never stored).
    pub row_sequence: u64,
    /// A bad line's number in the request the front door took it from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The letter this row was replayed from, when it died again after a
    /// replay (its `Weir-Replay-Of` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<u64>,
    /// The original row (lossy UTF-8 for display).
    pub payload: String,
}

/// What `replay` did: the rows published again (their letters removed),
/// and the front door's bad lines it left in place.
#[derive(Debug, Clone, Default)]
pub struct Replayed {
    pub rows: Vec<StoredLetter>,
    pub bad_lines: Vec<StoredLetter>,
}

/// What `purge` removed.
#[derive(Debug, Clone, Default)]
pub struct Purged {
    pub count: u64,
    /// The letters removed one by one; empty when the server purged by
    /// subject (it only says how many).
    pub letters: Vec<StoredLetter>,
}

/// Why an operator command on dead letters failed.
#[derive(Debug, thiserror::Error)]
pub enum LetterError {
    #[error("cannot read the dead-letter stream `{stream}`: {reason}")]
    Read { stream: String, reason: String },
    #[error("no dead letter {sequence} in the dead-letter stream `{stream}`")]
    NotFound { stream: String, sequence: u64 },
    #[error(
        "dead letter {sequence} in `{stream}` names no tenant or table (headers {tenant_header}, {table_header}): nowhere to replay it",
        tenant_header = headers::TENANT,
        table_header = headers::TABLE
    )]
    Unroutable { stream: String, sequence: u64 },
    #[error("cannot re-publish dead letter {sequence} to `{subject}`: {source}")]
    Replay {
        sequence: u64,
        subject: String,
        source: NatsError,
    },
    #[error("re-published dead letter {sequence} but cannot remove it from `{stream}`: {source}")]
    RemoveReplayed {
        stream: String,
        sequence: u64,
        source: NatsError,
    },
    #[error("cannot remove dead letter {sequence} from `{stream}`: {source}")]
    Remove {
        stream: String,
        sequence: u64,
        source: NatsError,
    },
    #[error("cannot purge `{subject}` from the dead-letter stream `{stream}`: {reason}")]
    Purge {
        stream: String,
        subject: String,
        reason: String,
    },
}

/// A letter as read, with what a replay re-publishes.
struct Fetched {
    letter: StoredLetter,
    stored_at: OffsetDateTime,
    payload: Bytes,
    headers: Option<HeaderMap>,
}

impl Fetched {
    fn new(
        sequence: u64,
        stored_at: OffsetDateTime,
        headers: Option<HeaderMap>,
        payload: Bytes,
    ) -> Fetched {
        let header = |name: &str| {
            headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.to_string())
        };
        let number = |name: &str| header(name).and_then(|v| v.parse().ok()).unwrap_or(0);
        let letter = StoredLetter {
            sequence,
            stored_at: stored_at
                .to_offset(time::UtcOffset::UTC)
                .format(&Rfc3339)
                .unwrap_or_default(),
            tenant: header(headers::TENANT).unwrap_or_default(),
            table: header(headers::TABLE).unwrap_or_default(),
            reason: header(headers::REASON).unwrap_or_default(),
            plugin: header(headers::PLUGIN),
            plugin_version: header(headers::PLUGIN_VERSION),
            deliveries: number(headers::DELIVERIES),
            row_sequence: number(headers::SEQUENCE),
            line: header(headers::LINE).and_then(|v| v.parse().ok()),
            replay_of: header(headers::REPLAY_OF).and_then(|v| v.parse().ok()),
            payload: String::from_utf8_lossy(&payload).into_owned(),
        };
        Fetched {
            letter,
            stored_at,
            payload,
            headers,
        }
    }

    /// The row's own headers: the letter's minus weir's and NATS's (the
    /// letter's message id; the replay has its own).
    fn original_headers(&self) -> HeaderMap {
        let mut original = HeaderMap::new();
        for (name, values) in self.headers.iter().flat_map(|h| h.iter()) {
            let text: &str = name.as_ref();
            if !text.starts_with("Weir-") && !is_nats_header(text) {
                for value in values {
                    original.append(name.clone(), value.as_str());
                }
            }
        }
        original
    }
}

/// How long a listing waits for the next letter the server said was
/// pending; past it, the letter was removed meanwhile (by another replay).
const IDLE_READ: Duration = Duration::from_secs(5);

impl DeadLetters {
    fn read_error(&self, reason: impl ToString) -> LetterError {
        LetterError::Read {
            stream: self.router.dead_letter_stream(),
            reason: reason.to_string(),
        }
    }

    async fn stream(&self) -> Result<jetstream::stream::Stream, LetterError> {
        self.js
            .get_stream(self.router.dead_letter_stream())
            .await
            .map_err(|e| self.read_error(e))
    }

    /// How many dead letters the stream holds.
    pub async fn count(&self) -> Result<u64, LetterError> {
        Ok(self.stream().await?.cached_info().state.messages)
    }

    /// Every stored dead letter that passes `filter`, oldest first.
    pub async fn list(&self, filter: &LetterFilter) -> Result<Vec<StoredLetter>, LetterError> {
        let stream = self.stream().await?;
        let found = self.read(&stream, filter).await?;
        Ok(found.into_iter().map(|fetched| fetched.letter).collect())
    }

    async fn read(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &LetterFilter,
    ) -> Result<Vec<Fetched>, LetterError> {
        if filter.sequences.is_empty() {
            self.read_filtered(stream, filter).await
        } else {
            self.read_sequences(stream, filter).await
        }
    }

    /// Each asked-for sequence fetched by itself: no scan of the stream.
    async fn read_sequences(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &LetterFilter,
    ) -> Result<Vec<Fetched>, LetterError> {
        use jetstream::stream::RawMessageErrorKind;
        let mut sequences = filter.sequences.clone();
        sequences.sort_unstable();
        sequences.dedup();
        let mut found = Vec::new();
        for sequence in sequences {
            if filter.is_full(found.len()) {
                break;
            }
            let message = stream
                .get_raw_message(sequence)
                .await
                .map_err(|e| match e.kind() {
                    RawMessageErrorKind::NoMessageFound => LetterError::NotFound {
                        stream: self.router.dead_letter_stream(),
                        sequence,
                    },
                    _ => self.read_error(format!("dead letter {sequence}: {e}")),
                })?;
            let fetched = Fetched::new(
                message.sequence,
                message.time,
                Some(message.headers),
                message.payload,
            );
            if filter.matches(&fetched.letter, fetched.stored_at) {
                found.push(fetched);
            }
        }
        Ok(found)
    }

    /// Reads through an ordered consumer that the server filters by subject
    /// (tenant, table) and start time (`since`), so only those letters
    /// travel; it ends where the server says nothing more is pending.
    async fn read_filtered(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &LetterFilter,
    ) -> Result<Vec<Fetched>, LetterError> {
        use futures::StreamExt;
        let deliver_policy = match filter.since {
            Some(start_time) => DeliverPolicy::ByStartTime { start_time },
            None => DeliverPolicy::All,
        };
        let reader = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: filter.subject(&self.router),
                deliver_policy,
                description: Some("weir dlq: an operator reading dead letters".into()),
                ..Default::default()
            })
            .await
            .map_err(|e| self.read_error(format!("cannot create a reader: {e}")))?;
        let mut pending = reader.cached_info().num_pending;
        let mut found = Vec::new();
        if pending == 0 || filter.is_full(0) {
            return Ok(found);
        }
        let mut messages = reader.messages().await.map_err(|e| self.read_error(e))?;
        while pending > 0 && !filter.is_full(found.len()) {
            let message = match tokio::time::timeout(IDLE_READ, messages.next()).await {
                Ok(Some(message)) => message.map_err(|e| self.read_error(e))?,
                Ok(None) | Err(_) => break,
            };
            let info = message
                .info()
                .map_err(|e| self.read_error(format!("a message without its metadata: {e}")))?;
            pending = info.pending;
            let fetched = Fetched::new(
                info.stream_sequence,
                info.published,
                message.headers.clone(),
                message.payload.clone(),
            );
            if filter.matches(&fetched.letter, fetched.stored_at) {
                found.push(fetched);
            }
        }
        Ok(found)
    }

    /// Re-publishes each matching dead letter to its table's unit (with its
    /// original headers), then removes it from the dead-letter stream. A
    /// replay is idempotent within the duplicate window.
    pub async fn replay(&self, filter: &LetterFilter) -> Result<Replayed, LetterError> {
        let stream = self.stream().await?;
        let letters = self.read(&stream, filter).await?;
        let mut replayed = Replayed::default();
        for fetched in letters {
            let sequence = fetched.letter.sequence;
            // A bad line was never a row: published to a partition it would
            // reach a plugin as one. It stays, for a fix and a new request.
            if fetched.letter.line.is_some() {
                replayed.bad_lines.push(fetched.letter);
                continue;
            }
            let (tenant, table) = (&fetched.letter.tenant, &fetched.letter.table);
            if tenant.is_empty() || table.is_empty() {
                return Err(LetterError::Unroutable {
                    stream: self.router.dead_letter_stream(),
                    sequence,
                });
            }
            let subject = self
                .router
                .subject(self.router.route(tenant, table), tenant, table);
            let replay_error =
                |err: async_nats::jetstream::context::PublishError| LetterError::Replay {
                    sequence,
                    subject: subject.clone(),
                    source: err.into(),
                };
            let mut headers = fetched.original_headers();
            headers.insert(headers::REPLAY_OF, sequence.to_string().as_str());
            let publish = PublishMessage::build()
                .payload(fetched.payload.clone())
                .headers(headers)
                .message_id(format!("weir-replay:{sequence}"));
            let ack = self
                .js
                .send_publish(subject.clone(), publish)
                .await
                .map_err(replay_error)?;
            ack.await.map_err(replay_error)?;
            self.remove(&stream, sequence)
                .await
                .map_err(|source| LetterError::RemoveReplayed {
                    stream: self.router.dead_letter_stream(),
                    sequence,
                    source,
                })?;
            replayed.rows.push(fetched.letter);
        }
        Ok(replayed)
    }

    /// Removes the matching dead letters for good. Selected by tenant and
    /// table only, the server purges them in one request; otherwise each
    /// matching letter is deleted by its sequence.
    pub async fn purge(&self, filter: &LetterFilter) -> Result<Purged, LetterError> {
        let stream = self.stream().await?;
        if filter.by_subject_only() {
            let subject = filter.subject(&self.router);
            let response =
                stream
                    .purge()
                    .filter(subject.clone())
                    .await
                    .map_err(|e| LetterError::Purge {
                        stream: self.router.dead_letter_stream(),
                        subject,
                        reason: e.to_string(),
                    })?;
            return Ok(Purged {
                count: response.purged,
                letters: Vec::new(),
            });
        }
        let letters = self.read(&stream, filter).await?;
        let mut purged = Purged::default();
        for fetched in letters {
            let sequence = fetched.letter.sequence;
            self.remove(&stream, sequence)
                .await
                .map_err(|source| LetterError::Remove {
                    stream: self.router.dead_letter_stream(),
                    sequence,
                    source,
                })?;
            purged.count += 1;
            purged.letters.push(fetched.letter);
        }
        Ok(purged)
    }

    async fn remove(
        &self,
        stream: &jetstream::stream::Stream,
        sequence: u64,
    ) -> Result<(), NatsError> {
        match stream.delete_message(sequence).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(NatsError::NotDone { what: "delete it" }),
            Err(err) => Err(err.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_time_or_a_duration_ago() {
        let now = OffsetDateTime::parse("2026-02-01T12:00:00Z", &Rfc3339).unwrap();
        let at = |text: &str| parse_since(text, now).map(|t| t.format(&Rfc3339).unwrap());
        assert_eq!(at("2026-01-31T08:30:00Z").unwrap(), "2026-01-31T08:30:00Z");
        assert_eq!(
            at("2026-01-31T09:30:00+01:00").unwrap(),
            "2026-01-31T09:30:00+01:00"
        );
        assert_eq!(at("30m").unwrap(), "2026-02-01T11:30:00Z");
        assert_eq!(at("2h").unwrap(), "2026-02-01T10:00:00Z");
        assert_eq!(at("1d").unwrap(), "2026-01-31T12:00:00Z");
        assert_eq!(at("1h30m15s").unwrap(), "2026-02-01T10:29:45Z");
        for bad in [
            "",
            "30",
            "m",
            "2x",
            "-1h",
            "yesterday",
            "99999999999999999999d",
        ] {
            let err = at(bad).unwrap_err();
            assert!(err.to_string().contains("RFC 3339"), "{bad}: {err}");
        }
    }

    fn letter(tenant: &str, table: &str, reason: &str) -> StoredLetter {
        StoredLetter {
            sequence: 1,
            stored_at: String::new(),
            tenant: tenant.into(),
            table: table.into(),
            reason: reason.into(),
            plugin: None,
            plugin_version: None,
            deliveries: 1,
            row_sequence: 1,
            line: None,
            replay_of: None,
            payload: String::new(),
        }
    }

    #[test]
    fn a_filter_selects_by_tenant_table_reason_and_time() {
        let now = OffsetDateTime::parse("2026-02-01T12:00:00Z", &Rfc3339).unwrap();
        let filter = LetterFilter {
            tenant: Some("acme".into()),
            reason: Some("`ts`".into()),
            since: Some(now),
            ..Default::default()
        };
        let later = now + time::Duration::seconds(1);
        assert!(filter.matches(
            &letter("acme", "orders", "missing required field `ts`"),
            later
        ));
        assert!(filter.matches(&letter("acme", "x", "`ts`"), now));
        assert!(!filter.matches(&letter("beta", "orders", "`ts`"), later));
        assert!(!filter.matches(&letter("acme", "orders", "missing `id`"), later));
        assert!(!filter.matches(
            &letter("acme", "orders", "`ts`"),
            now - time::Duration::seconds(1)
        ));
        let router = Names::new("weir", 1, 1);
        assert_eq!(filter.subject(&router), "weir.dlq.acme.*");
        assert!(!filter.selects_everything() && !filter.by_subject_only());
    }

    #[test]
    fn only_no_filter_at_all_selects_everything() {
        let limited = LetterFilter {
            limit: Some(3),
            ..Default::default()
        };
        assert!(LetterFilter::default().selects_everything());
        assert!(limited.selects_everything(), "a limit only bounds it");
        assert!(!limited.by_subject_only(), "the server purges no prefix");
        let by_table = LetterFilter {
            table: Some("orders".into()),
            ..Default::default()
        };
        assert!(!by_table.selects_everything() && by_table.by_subject_only());
        let by_seq = LetterFilter {
            sequences: vec![4],
            ..Default::default()
        };
        assert!(!by_seq.selects_everything() && !by_seq.by_subject_only());
    }
}
