//! The lake sink end to end (issue #63): rows posted to the front door go
//! through the shipped `lake-sink` into objects of a real SeaweedFS bucket
//! (`grants.objects`), one object per tenant, table and day, committed by
//! rows and by age, and acked only once their object stands. Counted at
//! the destination by listing the prefix, as a query engine reads it:
//! every accepted row exactly once, a row that does not fit a Parquet
//! column dead-lettered naming it, across host crashes, stops and freezes
//! of a fleet under load and a restart of the store.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path;
use weir::destination::Store;

use crate::destination_faults::{LoadedFleet, assert_exactly_once, sink_fleet_config};
use crate::seaweed_support::{ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed, ndjson_rows};
use crate::support::{Nats, TestHost, base_config, dead_letter_reasons, eventually, orders};

const PREFIX: &str = "rows";

/// The `[plugins.lake]` table: the lake sink into `seaweed`'s bucket, its
/// keys in a file under `dir`, objects of `format` (a TOML fragment).
fn lake_plugin(seaweed: &Seaweed, dir: &std::path::Path, format: &str) -> String {
    let keys = dir.join("lake-keys.toml");
    std::fs::write(
        &keys,
        format!("access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET_KEY}\"\n"),
    )
    .expect("write the keys");
    format!(
        r#"
[plugins.lake]
wasm = "weir_lake_sink.wasm"
world = "sink"

[plugins.lake.grants.objects]
bucket = "{BUCKET}"
endpoint = "{endpoint}"
prefix = "{PREFIX}"
credentials_file = "{keys}"
{format}
"#,
        endpoint = seaweed.endpoint(),
        keys = keys.display(),
    )
}

/// Every row in the visible NDJSON objects under the prefix: (tenant from
/// the key's `tenant=` segment, the row's `id`) → how many times.
async fn rows_in_objects(store: &Store) -> BTreeMap<(String, u64), usize> {
    let mut found = BTreeMap::new();
    for (key, row) in ndjson_rows(store, PREFIX).await {
        let tenant = key
            .split('/')
            .find_map(|segment| segment.strip_prefix("tenant="))
            .unwrap_or_default()
            .to_string();
        let id = row["id"].as_u64().expect("an id");
        *found.entry((tenant, id)).or_default() += 1;
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_land_once_in_parquet_objects_duckdb_reads_and_a_row_that_does_not_fit_is_dead_lettered()
 {
    let seaweed = Seaweed::start().await;
    let nats = Nats::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let plugin = lake_plugin(
        &seaweed,
        dir.path(),
        r#"format = "parquet"
max_rows = 300
max_age = "1s"
columns = [
  { name = "id", type = "int64", required = true },
  { name = "email", type = "string" },
  { name = "amount", type = "float64" },
]"#,
    );
    let config = base_config(nats.url(), &plugin)
        .replace("sink = \"files\"", "sink = \"lake\"")
        .replace(
            "[stream]\ncreate = true",
            "[stream]\ncreate = true\npartitions = 1",
        );
    let host = TestHost::start(&config).await;

    let response = host.ingest("orders", orders(0, 1000)).await;
    assert_eq!(response.status(), 202);
    // One row whose amount is text: it fits no float64 column.
    let response = host
        .ingest("orders", "{\"id\":5000,\"amount\":\"ten\"}\n")
        .await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert!(
        reasons[0].contains("column `amount` (Float64): expected a number, found a string"),
        "{reasons:?}"
    );
    let client = nats.client().await;
    eventually(Duration::from_secs(60), "every row settled", || async {
        (crate::support::backlog(&client).await == (0, 0, 0)).then_some(())
    })
    .await;
    let answer = crate::objects::duckdb_over_s3(
        &seaweed,
        &format!(
            "SELECT count(*), count(DISTINCT id), sum(amount)::BIGINT, min(tenant), min(\"table\") \
             FROM read_parquet('s3://{BUCKET}/{PREFIX}/**/*.parquet', hive_partitioning = true)"
        ),
    );
    let amounts: u64 = (0..1000u64).map(|id| id % 97).sum();
    assert_eq!(
        answer,
        [
            "1000".to_string(),
            "1000".to_string(),
            amounts.to_string(),
            "acme".to_string(),
            "orders".to_string()
        ],
        "DuckDB's count, distinct ids, sum of amounts, tenant and table"
    );
    host.shutdown().await;
}

/// A fleet host whose sink is the lake sink, NDJSON objects of at most
/// 2,000 rows or 2 s.
fn fleet_host_config(nats_url: &str, id: &str, plugin: &str) -> String {
    sink_fleet_config(nats_url, id, "lake", plugin)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_accepted_row_is_in_exactly_one_object_across_host_and_store_faults() {
    let mut seaweed = Seaweed::start().await;
    let nats = Nats::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let plugin = lake_plugin(
        &seaweed,
        dir.path(),
        "format = \"ndjson\"\nmax_rows = 2000\nmax_age = \"2s\"",
    );
    let mut fleet = LoadedFleet::start(|id| fleet_host_config(nats.url(), id, &plugin)).await;
    fleet.host_faults().await;
    // The store gone under load: commits fail and are tried again, their
    // rows wait unacked; none is lost or dead-lettered.
    seaweed.kill();
    fleet.after("SeaweedFS SIGKILLed for 5 s").await;
    seaweed.start_again().await;
    fleet.after("SeaweedFS restarted").await;

    let store = seaweed.store();
    eventually(Duration::from_secs(300), "100k rows in objects", || async {
        let rows: usize = rows_in_objects(&store).await.values().sum();
        (rows >= 100_000).then_some(())
    })
    .await;
    let (accepted, load) = fleet.stop_load().await;
    let client = nats.client().await;
    fleet.settled(&client).await;

    let found = rows_in_objects(&store).await;
    let total: usize = accepted.values().map(|ids| ids.len()).sum();
    let objects = store
        .raw()
        .list(Some(&Path::from(PREFIX)))
        .try_collect::<Vec<_>>()
        .await
        .expect("list")
        .iter()
        .filter(|meta| !meta.location.as_ref().contains("/_weir/"))
        .count();
    println!(
        "lake fleet: {total} rows accepted in {:.1} s, {} rows in {objects} objects, {} distinct tenant+id; faults: {}",
        load.as_secs_f64(),
        found.values().sum::<usize>(),
        found.len(),
        fleet.faults.join(", ")
    );
    assert_exactly_once("in objects", total, &accepted, &found, &fleet.hosts);
}

#[tokio::test(flavor = "multi_thread")]
async fn weir_check_names_the_grant_of_a_missing_bucket_refused_keys_and_an_unreachable_store() {
    let seaweed = Seaweed::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let plugin = lake_plugin(&seaweed, dir.path(), "format = \"ndjson\"");
    let check = |plugin: String| {
        let config = base_config("nats://127.0.0.1:1", &plugin)
            .replace("sink = \"files\"", "sink = \"lake\"");
        let path = dir.path().join("weir.toml");
        std::fs::write(&path, config).expect("write the config");
        let output = std::process::Command::new(crate::support::WEIR)
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .expect("weir check runs");
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        (output.status.success(), stderr)
    };
    let (ok, said) = check(plugin.clone());
    assert!(ok, "the granted store answers: {said}");

    let (ok, missing) = check(plugin.replace(
        &format!("bucket = \"{BUCKET}\""),
        "bucket = \"no-such-bucket\"",
    ));
    assert!(!ok);
    assert!(
        missing.contains("plugin `lake`: grants.objects:") && missing.contains("NoSuchBucket"),
        "{missing}"
    );
    std::fs::write(
        dir.path().join("lake-keys.toml"),
        format!("access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"wrong\"\n"),
    )
    .expect("write wrong keys");
    let (ok, refused) = check(plugin.replace(
        "credentials_file = ",
        "credentials_file_unused = 0\ncredentials_file = ",
    ));
    assert!(!ok);
    assert!(
        refused.contains("unknown field `credentials_file_unused`"),
        "{refused}"
    );
    let wrong_keys = plugin.clone();
    let (ok, refused) = check(wrong_keys);
    assert!(!ok);
    assert!(
        refused.contains("grants.objects:") && refused.contains("SignatureDoesNotMatch"),
        "{refused}"
    );
    assert!(
        !refused.contains("wrong"),
        "the secret was printed: {refused}"
    );
    let nowhere = format!("http://127.0.0.1:{}", crate::support::free_port());
    let (ok, unreachable) = check(plugin.replace(&seaweed.endpoint(), &nowhere));
    assert!(!ok);
    assert!(
        unreachable.contains("grants.objects:")
            && unreachable.contains(&nowhere.replace("http://", "")),
        "{unreachable}"
    );
    println!("missing bucket: {missing}\nrefused keys: {refused}\nunreachable: {unreachable}");
}
