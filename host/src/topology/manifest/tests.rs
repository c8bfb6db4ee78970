//! The manifest's own tests: its streams and units, its storage budget, and
//! how a difference from a server is named.

use super::*;
use crate::config::{Config, Overrides};
use std::path::Path;

fn manifest(file_store: Option<i64>) -> Manifest {
    let config = Config::parse(
        Path::new("w.toml"),
        "[stream]\npartitions = 2\nshards = 3\nmax_bytes = 1000\n",
        &Overrides::default(),
    )
    .unwrap();
    let router = Names::new("weir", 2, 3);
    Manifest::new(&router, &config.stream, &config.delivery, file_store)
}

#[test]
fn the_manifest_has_every_stream_and_unit() {
    let manifest = manifest(None);
    let names: Vec<&str> = manifest.streams.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["weir_dlq", "weir_in_0", "weir_in_1"]);
    assert_eq!(manifest.consumers.len(), 6);
    assert_eq!(manifest.consumers[4].stream, "weir_in_1");
    assert_eq!(manifest.consumers[4].config.filter_subject, "weir.in.1.1.>");
    assert_eq!(manifest.streams[1].max_bytes, 1000);
}

#[test]
fn a_file_store_budget_adds_up() {
    let manifest = manifest(Some(10_000));
    let total: i64 = manifest.streams.iter().map(|s| s.max_bytes).sum();
    assert_eq!(total, 10_000);
    assert_eq!(manifest.streams[0].max_bytes, 1_000);
}

#[test]
fn differences_are_named_with_their_severity() {
    let manifest = manifest(None);
    let mut actual = manifest.streams[1].clone();
    actual.retention = stream::RetentionPolicy::Limits;
    actual.max_bytes = 5;
    let mut found = Vec::new();
    compare_stream(&manifest.streams[1], &actual, &mut found);
    let text: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "stream weir_in_0: retention expected WorkQueue, found Limits (required)",
            "stream weir_in_0: max_bytes expected 1000, found 5 (recommended)",
        ]
    );
}

#[test]
fn a_partitions_only_shard_is_unfiltered_and_its_old_filter_only_recommended_away() {
    let config = Config::parse(Path::new("w.toml"), "", &Overrides::default()).unwrap();
    let router = Names::new("weir", 4, 1);
    let manifest = Manifest::new(&router, &config.stream, &config.delivery, None);
    let unit = &manifest.consumers[3];
    assert_eq!(unit.config.filter_subject, "", "no filter to match per row");
    let filtered = |filter: &str| {
        let wanted = &unit.config;
        let actual = consumer::Config {
            filter_subject: filter.to_string(),
            ack_policy: wanted.ack_policy,
            max_deliver: wanted.max_deliver,
            ack_wait: wanted.ack_wait,
            max_ack_pending: wanted.max_ack_pending,
            ..Default::default()
        };
        let mut found = Vec::new();
        compare_consumer("weir_in_3/weir_in_3_0", unit, &actual, &mut found);
        found
    };
    assert!(filtered("").is_empty());
    let old = filtered("weir.in.3.0.>");
    assert_eq!(old.len(), 1, "{old:?}");
    assert_eq!(old[0].severity, Severity::Recommended, "the same rows");
    let other = filtered("weir.in.3.1.>");
    assert_eq!(other[0].severity, Severity::Required, "other rows");
}

#[test]
fn the_dead_letter_stream_keeps_what_dead_letters_says_and_a_longer_keep_is_named() {
    let config = Config::parse(
        Path::new("w.toml"),
        "[dead_letters]\nmax_age = \"1h\"\nmax_bytes = \"10MiB\"\n",
        &Overrides::default(),
    )
    .unwrap();
    let router = Names::new("weir", 2, 1);
    let manifest = Manifest::new(&router, &config.stream, &config.delivery, Some(50_000_000))
        .with_dead_letters(&router, &config.dead_letters);
    let letters = &manifest.streams[0];
    assert_eq!(letters.max_age, Duration::from_secs(3600));
    // A tenth of the file store (5 MB) is less than the 10 MiB asked for.
    assert_eq!(letters.max_bytes, 5_000_000);

    let mut actual = letters.clone();
    actual.max_age = Duration::ZERO;
    let mut found = Vec::new();
    compare_stream(letters, &actual, &mut found);
    let text: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        ["stream weir_dlq: max_age expected 3600s, found 0ns (recommended)"]
    );
}
