//! JetStream API requests async-nats does not offer (starting a unit
//! consumer afresh, a consumer's ack floor), reading any API reply's error,
//! and which headers are the server's own.

use async_nats::Client;
use async_nats::jetstream::consumer::IntoConsumerConfig;
use bytes::Bytes;

use super::error::{NatsError, reply_error};

/// How long each attempt to create a stream or bucket waits for the server,
/// when hosts of a fleet started together race to create the same
/// replicated streams: a clustered server answers only some of several
/// concurrent creates of one stream, and the others time out while it is
/// being made (two of three hosts started at once on an empty 3-node
/// cluster failed to boot; `tests/it/cluster.rs`). Looking again finds it,
/// so the first wait is short; the later ones give a slow server time.
pub const CREATE_TIMEOUTS: [std::time::Duration; 3] = [
    std::time::Duration::from_secs(3),
    std::time::Duration::from_secs(10),
    std::time::Duration::from_secs(10),
];

/// How long creating a stream or bucket waits out a cluster that cannot
/// place its replicas yet ("no suitable peers", 10005): a cluster just
/// booted, or a node restarting, is briefly short of peers (a host started
/// on a fresh 3-node cluster exited on it; `tests/it/cluster.rs`).
pub const PLACEMENT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
/// How often such a create is asked again meanwhile.
pub const PLACEMENT_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether a stream create or update failed only for a while: it was
/// refused because the cluster has too few peers up to place it (which
/// passes as nodes join), or it timed out (which `CREATE_TIMEOUTS` handles).
pub fn cannot_place_yet(err: &async_nats::jetstream::context::CreateStreamError) -> bool {
    use async_nats::jetstream::{ErrorCode, context::CreateStreamErrorKind};
    matches!(err.kind(), CreateStreamErrorKind::JetStream(error)
        if error.error_code() == ErrorCode::CLUSTER_NO_PEERS)
}

/// Runs `create` (a stream, bucket or consumer create, given its timeout)
/// until it succeeds, fails for good, or has used up `CREATE_TIMEOUTS` and
/// `PLACEMENT_PATIENCE`: each timeout moves on to the next, longer wait; a
/// cluster that cannot place it yet is asked again every `PLACEMENT_RETRY`.
pub async fn create_patiently<T, E, Attempt>(
    what: &str,
    mut create: impl FnMut(std::time::Duration) -> Attempt,
    timed_out: impl Fn(&E) -> bool,
    placement_pending: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    Attempt: std::future::Future<Output = Result<T, E>>,
{
    let placement_deadline = tokio::time::Instant::now() + PLACEMENT_PATIENCE;
    let mut timeouts = CREATE_TIMEOUTS.iter().copied();
    let mut timeout = timeouts
        .next()
        .unwrap_or(std::time::Duration::from_secs(10));
    loop {
        match create(timeout).await {
            Err(err)
                if placement_pending(&err) && tokio::time::Instant::now() < placement_deadline =>
            {
                tracing::warn!(%what, "the cluster cannot place it yet; asking again");
                tokio::time::sleep(PLACEMENT_RETRY).await;
            }
            Err(err) if timed_out(&err) => match timeouts.next() {
                Some(longer) => {
                    tracing::warn!(%what, ?timeout, "creating it timed out; looking again");
                    timeout = longer;
                }
                None => return Err(err),
            },
            done => return done,
        }
    }
}

/// Whether header `name` is one the server adds as it delivers a message
/// (the pin of a priority group, which unit consumers made before weir
/// dropped pins still stamp), not part of the stored row: plugins, dead
/// letters and replays never see it.
pub fn is_delivery_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(async_nats::header::NATS_PIN_ID.as_ref())
}

/// Whether header `name` is NATS's own (`Nats-Msg-Id`, `Nats-Batch-…`,
/// `Nats-Expected-…`, the pin): JetStream acts on it when a message is
/// published, so a stored row's copy says how weir stored the row and must
/// not go along when the row is published elsewhere (an atomic batch's
/// headers make a publish to a stream without atomic publish fail).
pub fn is_nats_header(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|start| start.eq_ignore_ascii_case("nats-"))
}

/// The API subject that creates consumer `name` on `stream` with the
/// filter `filter` (empty: none): what [`start_afresh`] sends, and so what
/// a host's permissions must allow.
pub fn consumer_create_subject(stream: &str, name: &str, filter: &str) -> String {
    match filter {
        "" => format!("$JS.API.CONSUMER.CREATE.{stream}.{name}"),
        filter => format!("$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter}"),
    }
}

/// JetStream's error code for a consumer that does not exist.
const CONSUMER_NOT_FOUND: u64 = 10014;

/// Deletes a unit consumer and creates it again with `config`: every pull
/// request waiting on the old one ends (nothing more reaches it), and the
/// new one hands out every row not acked yet, oldest first (partitions are
/// work-queue streams: an acked row is gone, an unacked one stays). A
/// consumer already gone is created (a claimer that died between the two).
pub async fn start_afresh(
    client: &Client,
    stream: &str,
    config: &async_nats::jetstream::consumer::pull::Config,
) -> Result<(), NatsError> {
    let name = config.durable_name.clone().unwrap_or_default();
    let delete = format!("$JS.API.CONSUMER.DELETE.{stream}.{name}");
    match request(client, delete, Bytes::new()).await {
        Ok(_) => {}
        Err(NatsError::Api { err_code, .. }) if err_code == CONSUMER_NOT_FOUND => {}
        Err(err) => return Err(err),
    }
    let create = consumer_create_subject(stream, &name, &config.filter_subject);
    let body = serde_json::json!({
        "stream_name": stream,
        "config": config.clone().into_consumer_config(),
        "action": "create",
    });
    request(client, create, body.to_string().into())
        .await
        .map(drop)
}

/// The stream sequence at and below which a consumer has every row acked
/// (0: none yet): rows there are never delivered again.
pub async fn ack_floor(client: &Client, stream: &str, consumer: &str) -> Result<u64, NatsError> {
    #[derive(serde::Deserialize)]
    struct Info {
        ack_floor: Option<Floor>,
    }
    #[derive(serde::Deserialize)]
    struct Floor {
        #[serde(default)]
        stream_seq: u64,
    }
    let payload = consumer_info(client, stream, consumer).await?;
    let info: Info = decode("consumer info", &payload)?;
    Ok(info.ack_floor.map_or(0, |f| f.stream_seq))
}

/// A consumer's info reply, an API error as the error: callers read only
/// the fields they need from it.
pub async fn consumer_info(
    client: &Client,
    stream: &str,
    consumer: &str,
) -> Result<Bytes, NatsError> {
    let subject = format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}");
    request(client, subject, Bytes::new()).await
}

/// One JetStream API request: its reply's payload, or why there is none
/// (timed out, no responders, the API's error).
pub async fn request(client: &Client, subject: String, body: Bytes) -> Result<Bytes, NatsError> {
    let reply = client.request(subject, body).await?;
    match reply_error(&reply.payload) {
        Some(error) => Err(error),
        None => Ok(reply.payload),
    }
}

/// A reply's payload read as `T`; `what` names it in the error.
pub fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    payload: &[u8],
) -> Result<T, NatsError> {
    serde_json::from_slice(payload).map_err(|source| NatsError::Decode { what, source })
}

/// The error of a JetStream API reply, if it is one, as text (for callers
/// that keep a reason as text; [`reply_error`] keeps its cause).
pub fn api_error(payload: &[u8]) -> Option<String> {
    reply_error(payload).map(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::time::Duration;

    use super::{CREATE_TIMEOUTS, PLACEMENT_PATIENCE, create_patiently};

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Refusal {
        TimedOut,
        NoPeers,
        Other,
    }

    /// Runs `create_patiently` over a scripted sequence of answers and says
    /// what it returned and which timeouts it asked with.
    async fn run(answers: Vec<Refusal>) -> (Result<(), Refusal>, Vec<Duration>) {
        let asked = RefCell::new(Vec::new());
        let answers = RefCell::new(answers.into_iter());
        let outcome = create_patiently(
            "stream S",
            |timeout| {
                asked.borrow_mut().push(timeout);
                let answer = answers.borrow_mut().next();
                async move { answer.map_or(Ok(()), Err) }
            },
            |refusal| *refusal == Refusal::TimedOut,
            |refusal| *refusal == Refusal::NoPeers,
        )
        .await;
        (outcome, asked.into_inner())
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_short_of_peers_is_asked_again_without_using_up_a_timeout() {
        let (outcome, asked) = run(vec![Refusal::NoPeers; 5]).await;
        assert_eq!(outcome, Ok(()));
        assert_eq!(asked, vec![CREATE_TIMEOUTS[0]; 6]);
    }

    #[tokio::test(start_paused = true)]
    async fn each_timeout_moves_on_to_the_next_wait_until_they_are_used_up() {
        let (outcome, asked) = run(vec![Refusal::TimedOut; 3]).await;
        assert_eq!(outcome, Err(Refusal::TimedOut));
        assert_eq!(asked, CREATE_TIMEOUTS.to_vec());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_for_good_is_returned_at_once_and_short_of_peers_only_for_so_long() {
        let (outcome, asked) = run(vec![Refusal::Other]).await;
        assert_eq!((outcome, asked.len()), (Err(Refusal::Other), 1));

        let started = tokio::time::Instant::now();
        let (outcome, _) = run(vec![Refusal::NoPeers; 1000]).await;
        assert_eq!(outcome, Err(Refusal::NoPeers));
        assert!(started.elapsed() >= PLACEMENT_PATIENCE);
        assert!(started.elapsed() < PLACEMENT_PATIENCE + Duration::from_secs(1));
    }
}
