//! In-progress answers: rows being worked on (a batch running, batches
//! held, rows received for the next batches) are answered "in progress"
//! every third of the ack wait, so JetStream does not redeliver them under
//! the worker's feet.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::{Client, Message};
use tokio::time::Instant;

use crate::coordination::Lease;
use crate::delivery::pull::Puller;
use crate::nats::ack;

/// Shortest interval between in-progress acks of a running batch.
const MIN_PROGRESS_PERIOD: Duration = Duration::from_millis(100);

/// How often rows being worked on are answered "in progress": a third of
/// the ack wait, so a row is answered in time even when a tick comes late.
pub(super) fn progress_period(ack_wait: Duration) -> Duration {
    (ack_wait / 3).max(MIN_PROGRESS_PERIOD)
}

/// Runs `work` while telling JetStream every third of the ack wait that
/// `rows` (the batch's and those held), and those received for the next
/// batches, are still being worked on, so a long batch is not redelivered
/// under its own feet.
pub(super) async fn keep_alive<'m, F: std::future::Future>(
    rows: impl Iterator<Item = &'m Message> + Clone,
    client: &Client,
    mut puller: Option<&mut Puller>,
    ack_wait: Duration,
    lease: &Lease,
    work: F,
) -> F::Output {
    let period = progress_period(ack_wait);
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    tokio::pin!(work);
    loop {
        tokio::select! {
            output = &mut work => return output,
            // Past the lease a row's ack wait is the next owner's to run.
            _ = ticker.tick(), if lease.held() => {
                for message in rows.clone() {
                    if let Err(err) = ack::reply(client, message, AckKind::Progress).await {
                        tracing::debug!(error = %err, "cannot extend a row's ack wait");
                    }
                }
                if let Some(puller) = puller.as_deref_mut() {
                    puller.keep_received_alive().await;
                }
            }
        }
    }
}
