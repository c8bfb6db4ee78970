//! Taking a unit: its consumer is created afresh, which fences whoever
//! pulled it before. Every pull request still waiting on the old consumer
//! ends (a frozen or released owner's, one a dead owner's server kept), and
//! every row delivered and never acked comes back at once, oldest first,
//! ahead of newer ones — instead of after a full ack wait.

use async_nats::Client;
use async_nats::jetstream::consumer;
use serde::Deserialize;

use crate::nats::NatsError;
use crate::nats::jetstream::{consumer_info, decode, start_afresh};

/// What the server says about a unit consumer before it is taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerState {
    /// Rows delivered and not acked; a row nakked with a delay counts
    /// (measured on nats-server 2.15), one terminated does not.
    pub ack_pending: u64,
    /// Pull requests waiting on the server (a previous owner's).
    pub waiting: u64,
    /// The stream sequence at and below which every row of the unit was
    /// settled (acked or ended) before the consumer was created again.
    /// A row acked but still stored (the likeliest reading of a planned
    /// handover that repeated 20 rows in `tests/it/fleet.rs`: the ack
    /// confirmed by the consumer before the work-queue stream removed the
    /// row) would be handed out again by the new consumer, so the new
    /// owner acks such rows unrun.
    pub settled_through: u64,
}

#[derive(Deserialize)]
struct InfoReply {
    #[serde(default)]
    num_ack_pending: u64,
    #[serde(default)]
    num_waiting: u64,
    #[serde(default)]
    delivered: Sequences,
    #[serde(default)]
    ack_floor: Sequences,
}

#[derive(Deserialize, Default)]
struct Sequences {
    #[serde(default)]
    stream_seq: u64,
}

impl InfoReply {
    /// Nothing delivered is pending (a row nakked with a delay is), so
    /// every row up to the last delivered was settled; else only those up
    /// to the ack floor are known to be.
    fn settled_through(&self) -> u64 {
        match self.num_ack_pending {
            0 => self.delivered.stream_seq,
            _ => self.ack_floor.stream_seq,
        }
    }
}

/// Reads a unit consumer's state (one request); a consumer not there (its
/// last claimer died between deleting and creating it) left nothing.
async fn inspect(client: &Client, stream: &str, consumer: &str) -> ConsumerState {
    let info = match consumer_info(client, stream, consumer).await {
        Ok(payload) => decode::<InfoReply>("info", &payload),
        Err(err) => Err(err),
    };
    match info {
        Ok(info) => ConsumerState {
            ack_pending: info.num_ack_pending,
            waiting: info.num_waiting,
            settled_through: info.settled_through(),
        },
        Err(err) => {
            tracing::debug!(%consumer, error = %err, "cannot read the unit's state before taking it");
            ConsumerState::default()
        }
    }
}

/// Takes the unit: its consumer created afresh from `config`. Says what the
/// previous puller left (for the log and the takeover count).
pub async fn take(
    client: &Client,
    stream: &str,
    config: &consumer::pull::Config,
) -> Result<ConsumerState, NatsError> {
    let name = config.durable_name.as_deref().unwrap_or_default();
    let left = inspect(client, stream, name).await;
    start_afresh(client, stream, config).await?;
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::InfoReply;

    fn settled_through(info: &str) -> u64 {
        serde_json::from_str::<InfoReply>(info)
            .map(|info| info.settled_through())
            .unwrap_or(u64::MAX)
    }

    #[test]
    fn with_nothing_pending_every_row_delivered_was_settled() {
        let info = r#"{"num_ack_pending":0,"num_waiting":1,
            "delivered":{"consumer_seq":30,"stream_seq":57},
            "ack_floor":{"consumer_seq":28,"stream_seq":51}}"#;
        assert_eq!(settled_through(info), 57);
    }

    #[test]
    fn with_rows_pending_only_those_up_to_the_ack_floor_were() {
        let info = r#"{"num_ack_pending":2,"num_waiting":0,
            "delivered":{"consumer_seq":30,"stream_seq":57},
            "ack_floor":{"consumer_seq":28,"stream_seq":51}}"#;
        assert_eq!(settled_through(info), 51);
    }

    #[test]
    fn a_consumer_that_never_delivered_settled_nothing() {
        let info = r#"{"num_ack_pending":0,"num_waiting":0,
            "delivered":{"consumer_seq":0,"stream_seq":0},"ack_floor":{"consumer_seq":0,"stream_seq":0}}"#;
        assert_eq!(settled_through(info), 0);
        assert_eq!(settled_through(r#"{"num_ack_pending":0}"#), 0);
    }
}
