//! `[dead_letters]`: the stream keeps letters only as long and as much as
//! configured, named fields never reach it, and a row replayed from a
//! letter that dies again links back to that letter.

use std::time::Duration;

use async_nats::jetstream;
use weir::delivery::{DeadLetters, LetterFilter};
use weir::topology::Names;

use crate::support::{Nats, TestHost, base_config, eventually, read_stream};

const RETENTION: &str = r#"
[dead_letters]
max_age = "4s"
max_bytes = "64MiB"
redact = ["card", "email"]
"#;

/// A row the validator dead-letters (no `id`), with a card number in it.
const DYING: &str =
    "{\"card\":\"4111111111111111\",\"email\":\"ann@example.com\",\"kind\":\"refund\"}\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_letter_is_stored_redacted_and_is_gone_after_max_age() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), RETENTION)).await;
    let client = nats.client().await;
    let js = jetstream::new(client.clone());
    let config = js
        .get_stream("weir_dlq")
        .await
        .expect("the dead-letter stream")
        .info()
        .await
        .expect("its info")
        .config
        .clone();
    assert_eq!(config.max_age, Duration::from_secs(4));
    assert_eq!(config.max_bytes, 64 << 20);

    assert_eq!(host.ingest("orders", DYING).await.status(), 202);
    let letters = eventually(Duration::from_secs(30), "the dead letter", || async {
        let letters = read_stream(&client, "weir_dlq").await;
        (!letters.is_empty()).then_some(letters)
    })
    .await;
    let stored: serde_json::Value =
        serde_json::from_slice(&letters[0].payload).expect("a JSON letter");
    assert_eq!(stored["card"], "[redacted]", "{stored}");
    assert_eq!(stored["email"], "[redacted]", "{stored}");
    assert_eq!(
        stored["kind"], "refund",
        "the other fields are kept: {stored}"
    );
    let raw = String::from_utf8_lossy(&letters[0].payload);
    assert!(!raw.contains("4111") && !raw.contains("ann@"), "{raw}");

    eventually(Duration::from_secs(30), "the letter expired", || async {
        read_stream(&client, "weir_dlq")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_row_that_dies_again_names_the_letter_it_came_from() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let letters = DeadLetters::new(
        jetstream::new(nats.client().await),
        Names::new("weir", weir::config::DEFAULT_PARTITIONS, 1),
    );
    assert_eq!(
        host.ingest("orders", "{\"kind\":\"x\"}\n").await.status(),
        202
    );
    let first = eventually(Duration::from_secs(30), "the first letter", || async {
        let listed = letters.list(&LetterFilter::default()).await.ok()?;
        listed.into_iter().next()
    })
    .await;
    assert_eq!(first.replay_of, None);

    let replayed = letters
        .replay(&LetterFilter {
            sequences: vec![first.sequence],
            ..LetterFilter::default()
        })
        .await
        .expect("replay");
    assert_eq!(replayed.rows.len(), 1);
    let again = eventually(Duration::from_secs(30), "the second letter", || async {
        let listed = letters.list(&LetterFilter::default()).await.ok()?;
        listed.into_iter().find(|l| l.sequence != first.sequence)
    })
    .await;
    assert_eq!(again.replay_of, Some(first.sequence), "{again:?}");
    host.shutdown().await;
}
