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
    /// Rows delivered and not acked (nor nakked with a delay).
    pub ack_pending: u64,
    /// Pull requests waiting on the server (a previous owner's).
    pub waiting: u64,
}

#[derive(Deserialize)]
struct InfoReply {
    #[serde(default)]
    num_ack_pending: u64,
    #[serde(default)]
    num_waiting: u64,
}

/// Reads a unit consumer's state (one request); a consumer not there (its
/// last claimer died between deleting and creating it) left nothing.
async fn inspect(client: &Client, stream: &str, consumer: &str) -> ConsumerState {
    match consumer_info(client, stream, consumer).await {
        Ok(payload) => match decode::<InfoReply>("info", &payload) {
            Ok(info) => ConsumerState {
                ack_pending: info.num_ack_pending,
                waiting: info.num_waiting,
            },
            Err(_) => ConsumerState::default(),
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
