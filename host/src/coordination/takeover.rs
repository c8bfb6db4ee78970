//! Taking over a unit whose owner died: its rows that were delivered and
//! never acked come back at once (the consumer is reset to its ack floor)
//! instead of after a full ack wait — but never while someone is still
//! consuming the unit, judged by the server's clock.

use std::time::Duration;

use async_nats::Client;
use serde::Deserialize;

use crate::nats::NatsError;
use crate::nats::jetstream::{PIN_GROUP, consumer_info, decode, request, unpin};

/// What the server says about a unit consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerState {
    /// Rows delivered and not acked (nor nakked with a delay).
    pub ack_pending: u64,
    /// Whether a client holds the unit's pin.
    pub pinned: bool,
    /// Time since the last delivery, by the server's clock; `None` if the
    /// consumer never delivered.
    pub idle_for: Option<Duration>,
    /// Pull requests waiting on the server: before the new owner pulls,
    /// the old owner's (one sent without a pin outlives the unpin).
    pub waiting: u64,
}

/// What a new owner does before it pulls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// Nothing was left in flight: pull (after unpinning a dead holder).
    Start,
    /// Rows were left in flight by a dead owner: reset to the ack floor so
    /// they come back now, then pull.
    Reset,
    /// Someone pulled within `quiet`: not ours to reset yet; look again.
    Wait,
}

/// The decision, from the consumer's state alone. `quiet` is how long a
/// consumer must have delivered nothing before it counts as abandoned; a
/// dead owner stopped pulling at least that long before its member key
/// expired (it steps down early on its own clock).
pub fn decide(state: &ConsumerState, quiet: Duration) -> Takeover {
    let recently_active = state.idle_for.is_some_and(|idle| idle < quiet);
    if state.pinned && recently_active {
        Takeover::Wait
    } else if state.ack_pending > 0 {
        Takeover::Reset
    } else {
        Takeover::Start
    }
}

/// For a unit nobody of its own pulls: rows delivered and unacked come
/// back from the ack floor, else it just starts.
pub fn rows_back(state: &ConsumerState) -> Takeover {
    match state.ack_pending {
        0 => Takeover::Start,
        _ => Takeover::Reset,
    }
}

#[derive(Deserialize)]
struct InfoReply {
    /// The server's time when it answered.
    ts: Option<String>,
    #[serde(default)]
    num_ack_pending: u64,
    #[serde(default)]
    num_waiting: u64,
    delivered: Option<Delivered>,
    #[serde(default)]
    priority_groups: Vec<GroupState>,
}

#[derive(Deserialize)]
struct Delivered {
    last_active: Option<String>,
}

#[derive(Deserialize)]
struct GroupState {
    group: String,
    pinned_client_id: Option<String>,
}

/// Reads a unit consumer's state (one request; the reply carries the
/// server's clock, so no clock of this host is compared with the server's).
pub async fn inspect(
    client: &Client,
    stream: &str,
    consumer: &str,
) -> Result<ConsumerState, NatsError> {
    let payload = consumer_info(client, stream, consumer).await?;
    let info: InfoReply = decode("info", &payload)?;
    let parse = |text: &str| {
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
    };
    let now = info.ts.as_deref().and_then(parse);
    let last = info
        .delivered
        .and_then(|d| d.last_active)
        .as_deref()
        .and_then(parse);
    let idle_for = match (now, last) {
        (Some(now), Some(last)) => Some((now - last).try_into().unwrap_or(Duration::ZERO)),
        _ => None,
    };
    Ok(ConsumerState {
        ack_pending: info.num_ack_pending,
        pinned: info
            .priority_groups
            .iter()
            .any(|g| g.group == PIN_GROUP && g.pinned_client_id.is_some()),
        idle_for,
        waiting: info.num_waiting,
    })
}

/// Frees a dead owner's pin and, for [`Takeover::Reset`], sends its
/// unacked rows back from the ack floor (they count as first deliveries
/// again).
pub async fn apply(
    client: &Client,
    stream: &str,
    consumer: &str,
    state: &ConsumerState,
    action: Takeover,
) -> Result<(), NatsError> {
    if state.pinned {
        unpin(client, stream, consumer).await?;
    }
    if action == Takeover::Reset {
        let subject = format!("$JS.API.CONSUMER.RESET.{stream}.{consumer}");
        request(client, subject, r#"{"seq":0}"#.into()).await?;
    }
    Ok(())
}

/// Takes a unit back from a pull request its old owner left waiting, for
/// a new owner that holds no pin and has received nothing yet: any pin now
/// is that request's (it took the unit with the first row since the
/// takeover), so it is unpinned, which ends it, and the rows it was sent
/// come back from the ack floor, ahead of newer ones. Says how many rows
/// were sent back (`None`: nobody held the unit).
pub async fn reclaim_from_stale_request(
    client: &Client,
    stream: &str,
    consumer: &str,
) -> Result<Option<u64>, NatsError> {
    let state = inspect(client, stream, consumer).await?;
    if !state.pinned {
        return Ok(None);
    }
    apply(client, stream, consumer, &state, rows_back(&state)).await?;
    Ok(Some(state.ack_pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_secs(1);

    fn state(ack_pending: u64, pinned: bool, idle_ms: Option<u64>) -> ConsumerState {
        ConsumerState {
            ack_pending,
            pinned,
            idle_for: idle_ms.map(Duration::from_millis),
            waiting: 0,
        }
    }

    #[test]
    fn a_unit_someone_consumes_is_never_reset() {
        assert_eq!(decide(&state(10, true, Some(200)), QUIET), Takeover::Wait);
        assert_eq!(decide(&state(0, true, Some(200)), QUIET), Takeover::Wait);
    }

    #[test]
    fn rows_left_by_a_quiet_owner_come_back() {
        assert_eq!(decide(&state(10, true, Some(1500)), QUIET), Takeover::Reset);
        // An unpinned consumer has no puller at all, however recent.
        assert_eq!(decide(&state(10, false, Some(10)), QUIET), Takeover::Reset);
    }

    #[test]
    fn nothing_in_flight_just_starts() {
        assert_eq!(decide(&state(0, false, None), QUIET), Takeover::Start);
        assert_eq!(decide(&state(0, true, Some(5000)), QUIET), Takeover::Start);
    }
}
