//! The JetStream objects weir needs: N partition streams, the dead-letter
//! stream, and one durable pull consumer per unit (V per partition). Created at boot (the
//! embedded default creates everything; verification against an operator's
//! NATS comes with the partitioned topology).

use async_nats::jetstream::{self, consumer, stream};

use crate::config::{DeliveryConfig, StreamConfig};
use crate::route::Router;

/// Consumers a partition stream allows. nats-server 2.15 caps streams at
/// 1000 consumers even when unlimited is asked for, so weir sets it explicitly.
const MAX_CONSUMERS_PER_STREAM: i32 = 256;
/// Rows a unit may have delivered but not yet acked.
const MAX_ACK_PENDING: i64 = 20_000;

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot create stream `{stream}`: {reason}")]
    Stream { stream: String, reason: String },
    #[error("cannot create consumer `{consumer}` on stream `{stream}`: {reason}")]
    Consumer {
        stream: String,
        consumer: String,
        reason: String,
    },
}

/// Creates (or updates to the wanted config) every stream and consumer.
pub async fn ensure(
    js: &jetstream::Context,
    router: &Router,
    streams: &StreamConfig,
    delivery: &DeliveryConfig,
) -> Result<(), TopologyError> {
    let dead_letters = stream::Config {
        name: router.dead_letter_stream(),
        subjects: vec![router.dead_letter_subjects()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        duplicate_window: streams.duplicate_window,
        description: Some("weir dead letters: rows no pipeline could deliver".into()),
        ..Default::default()
    };
    create_or_update_stream(js, dead_letters).await?;

    for partition in 0..router.partitions() {
        let name = router.partition_stream(partition);
        let partition_config = stream::Config {
            name: name.clone(),
            subjects: vec![router.partition_subjects(partition)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::New,
            max_bytes: streams.max_bytes,
            max_consumers: MAX_CONSUMERS_PER_STREAM,
            duplicate_window: streams.duplicate_window,
            description: Some(format!("weir rows of partition {partition}")),
            ..Default::default()
        };
        let stream = create_or_update_stream(js, partition_config).await?;
        for unit in router
            .units()
            .into_iter()
            .filter(|u| u.partition == partition)
        {
            let consumer_name = router.unit_consumer(unit);
            let config = consumer::pull::Config {
                durable_name: Some(consumer_name.clone()),
                filter_subject: router.unit_filter(unit),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: delivery.ack_wait,
                max_ack_pending: MAX_ACK_PENDING,
                // weir counts deliveries itself and dead-letters past its limit;
                // the server must never silently drop a row.
                max_deliver: -1,
                ..Default::default()
            };
            stream
                .create_consumer(config)
                .await
                .map_err(|err| TopologyError::Consumer {
                    stream: name.clone(),
                    consumer: consumer_name,
                    reason: err.to_string(),
                })?;
        }
    }
    Ok(())
}

async fn create_or_update_stream(
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, TopologyError> {
    let name = config.name.clone();
    let error = |err: String| TopologyError::Stream {
        stream: name.clone(),
        reason: err,
    };
    match js.get_stream(&name).await {
        Ok(_) => {
            js.update_stream(config)
                .await
                .map_err(|err| error(err.to_string()))?;
            js.get_stream(&name)
                .await
                .map_err(|err| error(err.to_string()))
        }
        Err(_) => js
            .create_stream(config)
            .await
            .map_err(|err| error(err.to_string())),
    }
}
