//! Creating or updating one stream or consumer of a [`super::Manifest`],
//! patiently: hosts of a fleet started together race to create the same
//! replicated objects, and a clustered server answers only some of them
//! at first (`nats::jetstream::create_patiently`).

use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind};
use async_nats::jetstream::{self, stream};

use super::{ConsumerManifest, TopologyError};

/// Creates or updates a stream, looking again when the server does not
/// answer in time (`CREATE_TIMEOUTS`: hosts started together race).
pub(super) async fn create_or_update_stream(
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, TopologyError> {
    use crate::nats::jetstream::{cannot_place_yet, create_patiently};
    let what = format!("stream {}", config.name);
    create_patiently(
        &what,
        |timeout| {
            let mut js = js.clone();
            js.set_timeout(timeout);
            let config = config.clone();
            async move { create_or_update_stream_once(&js, config).await }
        },
        |err: &CreateStreamError| err.kind() == CreateStreamErrorKind::TimedOut,
        cannot_place_yet,
    )
    .await
    .map_err(|err| TopologyError::Stream {
        stream: config.name.clone(),
        reason: err.to_string(),
    })
}

async fn create_or_update_stream_once(
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, CreateStreamError> {
    let name = config.name.clone();
    match js.get_stream(&name).await {
        Ok(_) => {
            js.update_stream(config).await?;
            js.get_stream(&name)
                .await
                .map_err(|err| CreateStreamError::with_source(CreateStreamErrorKind::Response, err))
        }
        Err(_) => js.create_stream(config).await,
    }
}

/// Creates consumer `wanted`, or updates it, as patiently as a stream: a
/// replicated consumer's create times out while the cluster elects its
/// leader (a host of three started at once on a 3-node cluster exited on
/// it; `tests/it/cluster.rs`). Creating it again with the same config is
/// harmless when the first attempt did land after all.
pub(super) async fn create_or_update_consumer(
    js: &jetstream::Context,
    wanted: &ConsumerManifest,
) -> Result<(), TopologyError> {
    use crate::nats::jetstream::create_patiently;
    let name = wanted.config.name.clone().unwrap_or_default();
    let what = format!("consumer {}/{name}", wanted.stream);
    create_patiently(
        &what,
        |timeout| {
            let mut js = js.clone();
            js.set_timeout(timeout);
            async move { create_or_update_consumer_once(&js, wanted).await }
        },
        |err: &ConsumerAttemptError| matches!(err, ConsumerAttemptError::TimedOut(_)),
        |err: &ConsumerAttemptError| matches!(err, ConsumerAttemptError::NoPeers(_)),
    )
    .await
    .map_err(|err| TopologyError::Consumer {
        stream: wanted.stream.clone(),
        consumer: name,
        reason: err.to_string(),
    })
}

/// Why one attempt at a consumer failed, sorted as `create_patiently` asks.
#[derive(Debug, thiserror::Error)]
enum ConsumerAttemptError {
    #[error("{0}")]
    TimedOut(String),
    #[error("{0}")]
    NoPeers(String),
    #[error("{0}")]
    Failed(String),
}

impl From<stream::ConsumerError> for ConsumerAttemptError {
    fn from(err: stream::ConsumerError) -> Self {
        use async_nats::jetstream::ErrorCode;
        use async_nats::jetstream::stream::ConsumerErrorKind;
        match err.kind() {
            ConsumerErrorKind::TimedOut => Self::TimedOut(err.to_string()),
            ConsumerErrorKind::JetStream(error)
                if error.error_code() == ErrorCode::CLUSTER_NO_PEERS =>
            {
                Self::NoPeers(err.to_string())
            }
            _ => Self::Failed(err.to_string()),
        }
    }
}

async fn create_or_update_consumer_once(
    js: &jetstream::Context,
    wanted: &ConsumerManifest,
) -> Result<(), ConsumerAttemptError> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    let stream = js.get_stream(&wanted.stream).await.map_err(|err| {
        match err.kind() {
            // Its request timing out or going unanswered, as a create's.
            GetStreamErrorKind::Request => ConsumerAttemptError::TimedOut(err.to_string()),
            _ => ConsumerAttemptError::Failed(err.to_string()),
        }
    })?;
    let Err(err) = stream.create_consumer(wanted.config.clone()).await else {
        return Ok(());
    };
    // A consumer made while units were pinned cannot be updated to drop its
    // priority group. Recreating it loses nothing: in a work queue every row
    // not yet acked is still in the stream and delivered again.
    let name = wanted.config.name.clone().unwrap_or_default();
    let outdated = stream
        .consumer_info(&name)
        .await
        .is_ok_and(|info| info.config.priority_policy != wanted.config.priority_policy);
    if !outdated {
        return Err(err.into());
    }
    tracing::warn!(consumer = %name, "recreating a consumer made while units were pinned");
    stream
        .delete_consumer(&name)
        .await
        .map_err(ConsumerAttemptError::from)?;
    stream.create_consumer(wanted.config.clone()).await?;
    Ok(())
}
