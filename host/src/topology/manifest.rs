//! The JetStream objects weir needs — N partition streams, the dead-letter
//! stream, one durable pull consumer per unit — described once as a
//! [`Manifest`]. The same manifest is created (embedded default or
//! `--create-topology`), verified against an operator's NATS (each
//! difference named, required or recommended), and printed by
//! `weir mq manifests`.

use std::fmt;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, object_store, stream};
use futures::StreamExt;
use futures::future::join_all;
use serde::Serialize;

use crate::config::{
    DEFAULT_DEAD_LETTER_MAX_AGE, DEFAULT_DEAD_LETTER_MAX_BYTES, DeadLettersConfig, DeliveryConfig,
    StreamConfig,
};
use crate::nats::kv::{BucketOptions, NatsKv};
use crate::topology::route::{Names, Unit};

/// Rows a unit may have delivered but not yet acked.
pub(crate) const MAX_ACK_PENDING: i64 = 20_000;
/// How long the fleet keeps a compiled artifact.
const COMPILED_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long the marker of an expired coordination key is kept: a watch
/// resuming after a longer outage would miss the expiry.
const COORDINATION_MARKER_TTL: Duration = Duration::from_secs(3600);
/// Share of a `--file-store` budget given to the dead-letter stream.
const DEAD_LETTER_SHARE_PERCENT: i64 = 10;
/// Revisions the state bucket keeps per key: the last whole scope and the
/// changes written since (`state::store::MAX_CHAIN` + 1).
pub const STATE_HISTORY: i64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot create stream `{stream}`: {reason}")]
    Stream { stream: String, reason: String },
    #[error("cannot create KV bucket `{bucket}`: {reason}")]
    Bucket { bucket: String, reason: String },
    #[error("cannot create consumer `{consumer}` on stream `{stream}`: {reason}")]
    Consumer {
        stream: String,
        consumer: String,
        reason: String,
    },
    #[error(
        "the NATS topology does not match what weir needs (apply `weir mq manifests`, or start with --create-topology):\n{}",
        .0.iter().map(|m| format!("  {m}")).collect::<Vec<_>>().join("\n")
    )]
    Mismatch(Vec<Mismatch>),
    #[error(
        "the NATS server holds units of another topology, whose rows this config would never \
         deliver. weir's default topology was 1 partition × 4 shards before it became 4 \
         partitions × 1 shard: to keep a topology made with the old default, set `[stream] \
         partitions = 1` and `shards = 4`; to change it, drain it first (docs/deployment.md, \
         \"Changing the topology\"):\n{}",
        .0.iter().map(|m| format!("  {m}")).collect::<Vec<_>>().join("\n")
    )]
    OtherTopology(Vec<Mismatch>),
}

/// Every stream, consumer, KV bucket and object store of a topology.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub streams: Vec<stream::Config>,
    pub consumers: Vec<ConsumerManifest>,
    /// The coordination bucket (members, unit owners).
    pub buckets: Vec<BucketOptions>,
    /// The store of plugins pushed to the fleet.
    pub object_stores: Vec<object_store::Config>,
    /// The dead-letter stream's share of a `--file-store` budget.
    dead_letter_share: Option<i64>,
}

/// One object of a manifest as a file an operator applies on its own.
#[derive(Debug, Clone)]
pub struct ManifestFile {
    /// `stream-<name>.json`, `consumer-<stream>-<name>.json`, …
    pub name: String,
    pub json: serde_json::Value,
}

/// A durable consumer and the stream it belongs to.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerManifest {
    pub stream: String,
    pub config: consumer::pull::Config,
    /// A filter that selects the same rows as `config`'s: the one weir set
    /// on a partition's only shard before it left such consumers unfiltered.
    #[serde(skip)]
    pub same_rows_filter: Option<String>,
}

/// A unit's durable pull consumer. Every claim of the unit creates it
/// afresh from this (`coordination::claim`), which is what fences the
/// unit's previous puller: no priority group, no pin.
pub fn unit_consumer(router: &Names, unit: Unit, ack_wait: Duration) -> consumer::pull::Config {
    let durable = router.unit_consumer(unit);
    consumer::pull::Config {
        durable_name: Some(durable.clone()),
        name: Some(durable),
        // A partition's only shard takes all its rows: with no filter the
        // server skips matching each row.
        filter_subject: match router.shards() {
            1 => String::new(),
            _ => router.unit_filter(unit),
        },
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_ack_pending: MAX_ACK_PENDING,
        // weir counts deliveries itself and dead-letters past its limit;
        // the server must never drop a row.
        max_deliver: -1,
        ..Default::default()
    }
}

impl Manifest {
    /// The dead-letter stream's retention from `[dead_letters]` (within a
    /// `--file-store` budget's share, when one was given).
    pub fn with_dead_letters(mut self, router: &Names, config: &DeadLettersConfig) -> Manifest {
        let name = router.dead_letter_stream();
        if let Some(stream) = self.streams.iter_mut().find(|s| s.name == name) {
            stream.max_age = config.max_age;
            // The server refuses a duplicate window longer than the age.
            stream.duplicate_window = stream.duplicate_window.min(config.max_age);
            stream.max_bytes = match self.dead_letter_share {
                Some(share) => config.max_bytes.min(share),
                None => config.max_bytes,
            };
        }
        self
    }

    /// The topology for a router's N × V units. `file_store` (bytes), when
    /// given, is split between the streams instead of `max_bytes` each.
    pub fn new(
        router: &Names,
        streams: &StreamConfig,
        delivery: &DeliveryConfig,
        file_store: Option<i64>,
    ) -> Manifest {
        let partitions = i64::from(router.partitions());
        let (partition_bytes, dead_letter_bytes) = match file_store {
            Some(budget) => {
                let dead_letters = budget * DEAD_LETTER_SHARE_PERCENT / 100;
                ((budget - dead_letters) / partitions, dead_letters)
            }
            None => (streams.max_bytes, DEFAULT_DEAD_LETTER_MAX_BYTES as i64),
        };
        let dead_letter_share = file_store.map(|_| dead_letter_bytes);
        let units = router.units();
        let replicas = usize::try_from(streams.replicas).unwrap_or(1);
        let mut manifest = Manifest {
            dead_letter_share,
            streams: vec![stream::Config {
                name: router.dead_letter_stream(),
                subjects: vec![router.dead_letter_subjects()],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                max_bytes: dead_letter_bytes,
                max_age: DEFAULT_DEAD_LETTER_MAX_AGE,
                duplicate_window: streams.duplicate_window,
                description: Some("weir dead letters: rows no pipeline could deliver".into()),
                num_replicas: replicas,
                ..Default::default()
            }],
            consumers: Vec::new(),
            buckets: vec![
                BucketOptions {
                    description: "weir coordination: members and unit owners".into(),
                    limit_markers: Some(COORDINATION_MARKER_TTL),
                    replicas,
                    ..BucketOptions::new(router.coordination_bucket())
                },
                BucketOptions {
                    description: "weir plugin state: one key per tenant, plugin and table".into(),
                    // A key's changes chain back to its last whole value
                    // (`state::store`): the chain must fit the history.
                    history: STATE_HISTORY,
                    replicas,
                    ..BucketOptions::new(router.state_bucket())
                },
            ],
            object_stores: vec![
                object_store::Config {
                    bucket: router.plugin_store(),
                    description: Some("weir plugins pushed to the fleet".into()),
                    num_replicas: replicas,
                    ..Default::default()
                },
                object_store::Config {
                    bucket: router.compiled_store(),
                    description: Some(
                        "weir plugins compiled once for the fleet (written by hosts only)".into(),
                    ),
                    // Artifacts of past releases and engines go on their
                    // own; a host that needs one again compiles it again.
                    max_age: COMPILED_MAX_AGE,
                    num_replicas: replicas,
                    ..Default::default()
                },
            ],
        };
        for partition in 0..router.partitions() {
            let name = router.partition_stream(partition);
            manifest.streams.push(stream::Config {
                name: name.clone(),
                subjects: vec![router.partition_subjects(partition)],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::New,
                max_bytes: partition_bytes,
                // nats-server 2.15 caps a stream at 1000 consumers even when
                // unlimited is asked for: weir says how many it needs.
                max_consumers: i32::try_from(units.len()).unwrap_or(i32::MAX).max(1) * 2,
                duplicate_window: streams.duplicate_window,
                // The front door stores a request's rows as fast batches,
                // or atomic ones where some may be stored already.
                allow_atomic_publish: true,
                allow_batch_publish: true,
                description: Some(format!("weir rows of partition {partition}")),
                num_replicas: replicas,
                ..Default::default()
            });
            for unit in units.iter().filter(|u| u.partition == partition) {
                manifest.consumers.push(ConsumerManifest {
                    stream: name.clone(),
                    same_rows_filter: (router.shards() == 1).then(|| router.unit_filter(*unit)),
                    config: unit_consumer(router, *unit, delivery.ack_wait),
                });
            }
        }
        manifest
    }

    /// The manifest as NATS Kubernetes controller (nack) resources: a `List`
    /// of `Stream` and `Consumer` objects (JSON, which `kubectl apply` takes).
    pub fn to_nack(&self) -> serde_json::Value {
        use serde_json::json;
        let k8s_name = |name: &str| name.to_lowercase().replace('_', "-");
        let duration = |d: Duration| format!("{}s", d.as_secs());
        let mut items = Vec::new();
        for stream in &self.streams {
            let retention = match stream.retention {
                stream::RetentionPolicy::WorkQueue => "workqueue",
                stream::RetentionPolicy::Interest => "interest",
                stream::RetentionPolicy::Limits => "limits",
            };
            let discard = match stream.discard {
                stream::DiscardPolicy::New => "new",
                stream::DiscardPolicy::Old => "old",
            };
            items.push(json!({
                "apiVersion": "jetstream.nats.io/v1beta2",
                "kind": "Stream",
                "metadata": { "name": k8s_name(&stream.name) },
                "spec": {
                    "name": stream.name,
                    "description": stream.description,
                    "subjects": stream.subjects,
                    "retention": retention,
                    "storage": "file",
                    "discard": discard,
                    "maxBytes": stream.max_bytes,
                    "maxAge": if stream.max_age.is_zero() { String::new() } else { duration(stream.max_age) },
                    "maxConsumers": if stream.max_consumers == 0 { -1 } else { stream.max_consumers },
                    "duplicateWindow": duration(stream.duplicate_window),
                    "replicas": stream.num_replicas.max(1),
                    // nack's Stream has no `allow_batched` (fast batch) yet:
                    // docs/deployment.md says how to set it.
                    "allowAtomicPublish": stream.allow_atomic_publish,
                }
            }));
        }
        for consumer in &self.consumers {
            let name = consumer.config.name.clone().unwrap_or_default();
            items.push(json!({
                "apiVersion": "jetstream.nats.io/v1beta2",
                "kind": "Consumer",
                "metadata": { "name": k8s_name(&name) },
                "spec": {
                    "streamName": consumer.stream,
                    "durableName": name,
                    "filterSubject": consumer.config.filter_subject,
                    "deliverPolicy": "all",
                    "ackPolicy": "explicit",
                    "ackWait": duration(consumer.config.ack_wait),
                    "maxAckPending": consumer.config.max_ack_pending,
                    "maxDeliver": consumer.config.max_deliver,
                }
            }));
        }
        for bucket in &self.buckets {
            items.push(json!({
                "apiVersion": "jetstream.nats.io/v1beta2",
                "kind": "KeyValue",
                "metadata": { "name": k8s_name(&bucket.bucket) },
                "spec": {
                    "bucket": bucket.bucket,
                    "description": bucket.description,
                    "history": bucket.history,
                    "storage": "file",
                    // Per-key TTLs (server >= 2.11): member keys expire.
                    "limitMarkerTtl": bucket.limit_markers.map(duration),
                    "replicas": bucket.replicas,
                }
            }));
        }
        for store in &self.object_stores {
            items.push(json!({
                "apiVersion": "jetstream.nats.io/v1beta2",
                "kind": "ObjectStore",
                "metadata": { "name": k8s_name(&store.bucket) },
                "spec": {
                    "bucket": store.bucket,
                    "description": store.description,
                    "storage": "file",
                    "ttl": (!store.max_age.is_zero()).then(|| duration(store.max_age)),
                    "replicas": store.num_replicas.max(1),
                }
            }));
        }
        json!({ "apiVersion": "v1", "kind": "List", "items": items })
    }

    /// The whole manifest as the JetStream API's JSON: every stream (the
    /// bucket and the store as the streams they are) and every consumer.
    pub fn to_json(&self) -> serde_json::Value {
        let streams: Vec<serde_json::Value> = self.stream_files().map(|file| file.json).collect();
        let consumers: Vec<serde_json::Value> = self
            .consumers
            .iter()
            .map(|c| serde_json::json!({ "stream": c.stream, "config": c.config }))
            .collect();
        serde_json::json!({ "streams": streams, "consumers": consumers })
    }

    /// One file per object, each as `nats stream add --config FILE` and
    /// `nats consumer add STREAM --config FILE` (the JetStream API) take it.
    pub fn files(&self) -> Vec<ManifestFile> {
        let mut files: Vec<ManifestFile> = self.stream_files().collect();
        for consumer in &self.consumers {
            let name = consumer.config.name.clone().unwrap_or_default();
            files.push(ManifestFile {
                name: format!("consumer-{}-{name}.json", consumer.stream),
                json: serde_json::to_value(&consumer.config).unwrap_or_default(),
            });
        }
        files
    }

    /// One file per object of the nack output (`kubectl apply -f DIR`).
    pub fn nack_files(&self) -> Vec<ManifestFile> {
        let nack = self.to_nack();
        let items = nack["items"].as_array().cloned().unwrap_or_default();
        items
            .into_iter()
            .map(|item| ManifestFile {
                name: format!(
                    "{}-{}.json",
                    item["kind"].as_str().unwrap_or("object").to_lowercase(),
                    item["metadata"]["name"].as_str().unwrap_or("unnamed")
                ),
                json: item,
            })
            .collect()
    }

    /// Every object as verification names it: `stream NAME`,
    /// `consumer STREAM/NAME`.
    pub fn objects(&self) -> Vec<String> {
        let streams = self
            .stream_files()
            .map(|file| format!("stream {}", file.json["name"].as_str().unwrap_or_default()));
        let consumers = self.consumers.iter().map(|c| {
            let name = c.config.name.as_deref().unwrap_or_default();
            format!("consumer {}/{name}", c.stream)
        });
        streams.chain(consumers).collect()
    }

    fn stream_files(&self) -> impl Iterator<Item = ManifestFile> + '_ {
        let buckets = self.buckets.iter().map(bucket_stream);
        let stores = self.object_stores.iter().map(object_store_stream);
        self.streams
            .iter()
            .cloned()
            .chain(buckets)
            .chain(stores)
            .map(|config| ManifestFile {
                name: format!("stream-{}.json", config.name),
                json: serde_json::to_value(&config).unwrap_or_default(),
            })
    }

    /// Creates every stream and consumer, or updates it to this manifest.
    pub async fn create(&self, js: &jetstream::Context) -> Result<(), TopologyError> {
        // Checked before anything changes: updating this topology's
        // consumers next to another's would fail halfway.
        let others = self.other_topologys_units(js).await;
        if !others.is_empty() {
            return Err(TopologyError::OtherTopology(others));
        }
        for config in &self.streams {
            create_or_update_stream(js, config.clone()).await?;
        }
        for wanted in &self.consumers {
            create_or_update_consumer(js, wanted).await?;
        }
        for bucket in &self.buckets {
            NatsKv::open_or_create(&js.client(), bucket)
                .await
                .map_err(|err| TopologyError::Bucket {
                    bucket: bucket.bucket.clone(),
                    reason: err.to_string(),
                })?;
        }
        // The store is the stream async-nats would make for it; created or
        // updated like the others, so `replicas` reaches it too.
        for store in &self.object_stores {
            create_or_update_stream(js, object_store_stream(store)).await?;
        }
        Ok(())
    }

    /// Every difference between this manifest and what NATS has. Objects
    /// are read concurrently, so a slow or refusing server costs one timeout.
    pub async fn verify(&self, js: &jetstream::Context) -> Vec<Mismatch> {
        let streams = self.streams.iter().map(|wanted| async move {
            let mut found = Vec::new();
            match js.get_stream(&wanted.name).await {
                Ok(mut stream) => match stream.info().await {
                    Ok(info) => compare_stream(wanted, &info.config, &mut found),
                    Err(err) => found.push(Mismatch::unreadable("stream", &wanted.name, err)),
                },
                Err(err) => found.push(Mismatch::missing("stream", &wanted.name, err)),
            }
            found
        });
        let consumers = self.consumers.iter().map(|wanted| async move {
            let mut found = Vec::new();
            let name = wanted.config.name.clone().unwrap_or_default();
            let object = format!("{}/{name}", wanted.stream);
            let read = || async {
                match js.get_stream(&wanted.stream).await {
                    Ok(stream) => stream.consumer_info(&name).await.map_err(|e| e.to_string()),
                    Err(err) => Err(err.to_string()),
                }
            };
            // A claim creates its unit's consumer afresh (delete, then
            // create): one missing is looked for again before it counts.
            let info = match read().await {
                Ok(info) => Ok(info),
                Err(_) => {
                    tokio::time::sleep(RECREATE_GRACE).await;
                    read().await
                }
            };
            match info {
                Ok(info) => compare_consumer(&object, wanted, &info.config, &mut found),
                Err(err) => found.push(Mismatch::missing("consumer", &object, err)),
            }
            found
        });
        let buckets = self.buckets.iter().map(|wanted| async move {
            let mut found = Vec::new();
            let name = format!("KV_{}", wanted.bucket);
            match js.get_stream(&name).await {
                Ok(mut stream) => match stream.info().await {
                    Ok(info) => {
                        let object = format!("stream {name}");
                        // Member keys expire by per-key TTL: without it a
                        // crashed host would own its units forever.
                        if wanted.limit_markers.is_some() {
                            check(
                                &mut found,
                                Severity::Required,
                                &object,
                                "allow_msg_ttl (KV limit markers)",
                                true,
                                info.config.allow_message_ttl,
                            );
                        }
                        check_replicas(&mut found, &object, wanted.replicas, &info.config);
                    }
                    Err(err) => found.push(Mismatch::unreadable("stream", &name, err)),
                },
                Err(err) => found.push(Mismatch::missing("stream", &name, err)),
            }
            found
        });
        let stores = self.object_stores.iter().map(|wanted| async move {
            let mut found = Vec::new();
            let name = format!("OBJ_{}", wanted.bucket);
            // Only `weir plugin push` needs the store, and it creates it.
            match js.get_stream(&name).await {
                Ok(mut stream) => match stream.info().await {
                    Ok(info) => check_replicas(
                        &mut found,
                        &format!("stream {name}"),
                        wanted.num_replicas,
                        &info.config,
                    ),
                    Err(err) => found.push(Mismatch::unreadable("stream", &name, err)),
                },
                Err(err) => found.push(Mismatch {
                    severity: Severity::Recommended,
                    ..Mismatch::missing("stream", &name, err)
                }),
            }
            found
        });
        let mut found: Vec<Mismatch> = join_all(streams).await.into_iter().flatten().collect();
        found.extend(join_all(consumers).await.into_iter().flatten());
        found.extend(self.other_topologys_units(js).await);
        found.extend(join_all(buckets).await.into_iter().flatten());
        found.extend(join_all(stores).await.into_iter().flatten());
        found
    }
}

impl Manifest {
    /// Unit consumers on this topology's partition streams that are not its
    /// units: left by a topology with more shards (weir's old default was
    /// 1 partition × 4 shards). Their rows would never be delivered, and a
    /// work queue refuses this topology's consumers next to them.
    async fn other_topologys_units(&self, js: &jetstream::Context) -> Vec<Mismatch> {
        let mut streams: Vec<&str> = self.consumers.iter().map(|c| c.stream.as_str()).collect();
        streams.dedup();
        let lists = streams.into_iter().map(|stream| async move {
            let Ok(handle) = js.get_stream(stream).await else {
                return Vec::new(); // not there yet: nothing of another topology
            };
            // Listed with their info (`CONSUMER.LIST`, which a host's
            // permissions allow for its backlog), not `CONSUMER.NAMES`.
            let mut listed = handle.consumers();
            let mut names = Vec::new();
            while let Some(info) = listed.next().await {
                match info {
                    Ok(info) => names.push(info.name),
                    Err(err) => {
                        tracing::warn!(%stream, error = %err, "cannot list the stream's consumers: units of another topology, if any, go unseen");
                        break;
                    }
                }
            }
            let unit_prefix = format!("{stream}_");
            names
                .into_iter()
                .filter(|name| {
                    name.strip_prefix(&unit_prefix)
                        .is_some_and(|shard| shard.parse::<u32>().is_ok())
                })
                .filter(|name| {
                    !self.consumers.iter().any(|wanted| {
                        wanted.stream == stream && wanted.config.name.as_deref() == Some(name)
                    })
                })
                .map(|name| Mismatch {
                    severity: Severity::Required,
                    object: format!("consumer {stream}/{name}"),
                    field: "existence".into(),
                    expected: "absent (not a unit of this topology)".into(),
                    found: "present".into(),
                })
                .collect::<Vec<_>>()
        });
        join_all(lists).await.into_iter().flatten().collect()
    }
}

/// Whether weir can run with a difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// weir would lose, reorder or silently drop rows: it refuses to start.
    Required,
    /// weir works, with less margin than intended: a warning.
    Recommended,
}

impl Severity {
    /// Lowercase, as in the JSON, the docs and the metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Required => "required",
            Severity::Recommended => "recommended",
        }
    }
}

/// One difference between the manifest and the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    pub severity: Severity,
    /// `stream NAME` or `consumer STREAM/NAME`.
    pub object: String,
    pub field: String,
    pub expected: String,
    pub found: String,
}

impl Mismatch {
    fn missing(kind: &str, name: &str, err: impl fmt::Display) -> Mismatch {
        Mismatch {
            severity: Severity::Required,
            object: format!("{kind} {name}"),
            field: "existence".into(),
            expected: "present".into(),
            found: format!("missing ({err})"),
        }
    }

    /// The server refused weir's user an operation it needs.
    pub fn refused(violation: &str) -> Mismatch {
        Mismatch {
            severity: Severity::Required,
            object: "NATS user".into(),
            field: "permissions".into(),
            expected: "every subject `weir mq permissions` lists allowed".into(),
            found: violation.trim().to_string(),
        }
    }

    fn unreadable(kind: &str, name: &str, err: impl fmt::Display) -> Mismatch {
        Mismatch {
            found: format!("unreadable ({err})"),
            ..Mismatch::missing(kind, name, "")
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Required => "required",
            Severity::Recommended => "recommended",
        };
        write!(
            f,
            "{}: {} expected {}, found {} ({severity})",
            self.object, self.field, self.expected, self.found
        )
    }
}

/// Records a difference when `expected != found`.
fn check<T: PartialEq + fmt::Debug>(
    found: &mut Vec<Mismatch>,
    severity: Severity,
    object: &str,
    field: &str,
    expected: T,
    actual: T,
) {
    if expected != actual {
        found.push(Mismatch {
            severity,
            object: object.to_string(),
            field: field.to_string(),
            expected: format!("{expected:?}"),
            found: format!("{actual:?}"),
        });
    }
}

/// Fewer copies than the config asks for loses rows a node failure would
/// not have lost: weir refuses it. More is fine.
fn check_replicas(found: &mut Vec<Mismatch>, object: &str, wanted: usize, actual: &stream::Config) {
    if actual.num_replicas.max(1) < wanted.max(1) {
        check(
            found,
            Severity::Required,
            object,
            "num_replicas ([stream] replicas)",
            wanted.max(1),
            actual.num_replicas.max(1),
        );
    }
}

/// The stream a KV bucket is, as async-nats' `create_key_value` makes it:
/// an operator can create it with `nats stream add --config`.
fn bucket_stream(bucket: &BucketOptions) -> stream::Config {
    stream::Config {
        name: format!("KV_{}", bucket.bucket),
        description: Some(bucket.description.clone()),
        subjects: vec![format!("$KV.{}.>", bucket.bucket)],
        max_messages_per_subject: bucket.history.max(1),
        storage: bucket.storage,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        num_replicas: bucket.replicas.max(1),
        discard: stream::DiscardPolicy::New,
        allow_message_ttl: bucket.limit_markers.is_some(),
        subject_delete_marker_ttl: bucket.limit_markers,
        ..Default::default()
    }
}

/// The stream an object store is, as async-nats' `create_object_store`
/// makes it.
fn object_store_stream(store: &object_store::Config) -> stream::Config {
    stream::Config {
        name: format!("OBJ_{}", store.bucket),
        description: store.description.clone(),
        subjects: vec![
            format!("$O.{}.C.>", store.bucket),
            format!("$O.{}.M.>", store.bucket),
        ],
        storage: store.storage,
        max_age: store.max_age,
        num_replicas: store.num_replicas.max(1),
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    }
}

fn compare_stream(wanted: &stream::Config, actual: &stream::Config, found: &mut Vec<Mismatch>) {
    use Severity::{Recommended, Required};
    let object = format!("stream {}", wanted.name);
    let object = object.as_str();
    check_replicas(found, object, wanted.num_replicas, actual);
    check(
        found,
        Required,
        object,
        "subjects",
        &wanted.subjects,
        &actual.subjects,
    );
    // Limits retention on a partition would keep every row forever; interest
    // retention would drop rows no consumer covers yet.
    check(
        found,
        Required,
        object,
        "retention",
        wanted.retention,
        actual.retention,
    );
    // Discard-old on a full partition silently deletes accepted rows.
    check(
        found,
        Required,
        object,
        "discard",
        wanted.discard,
        actual.discard,
    );
    // Without them every multi-row request is refused (an older
    // nats-server does not have them and reports false).
    if wanted.allow_atomic_publish {
        check(
            found,
            Required,
            object,
            "allow_atomic (atomic batch publish, nats-server 2.12+)",
            true,
            actual.allow_atomic_publish,
        );
    }
    if wanted.allow_batch_publish {
        check(
            found,
            Required,
            object,
            "allow_batched (fast batch publish, nats-server 2.14+)",
            true,
            actual.allow_batch_publish,
        );
    }
    check(
        found,
        Recommended,
        object,
        "storage",
        wanted.storage,
        actual.storage,
    );
    if wanted.max_consumers > 0
        && actual.max_consumers > 0
        && actual.max_consumers < wanted.max_consumers
    {
        check(
            found,
            Required,
            object,
            "max_consumers",
            wanted.max_consumers,
            actual.max_consumers,
        );
    }
    check(
        found,
        Recommended,
        object,
        "max_bytes",
        wanted.max_bytes,
        actual.max_bytes,
    );
    // Letters kept longer than asked (or forever) fill the disk and keep
    // what an operator meant to expire.
    if wanted.max_age > Duration::ZERO
        && (actual.max_age == Duration::ZERO || actual.max_age > wanted.max_age)
    {
        check(
            found,
            Recommended,
            object,
            "max_age",
            wanted.max_age,
            actual.max_age,
        );
    }
    if actual.duplicate_window < wanted.duplicate_window {
        check(
            found,
            Recommended,
            object,
            "duplicate_window",
            wanted.duplicate_window,
            actual.duplicate_window,
        );
    }
}

fn compare_consumer(
    object: &str,
    manifest: &ConsumerManifest,
    actual: &consumer::Config,
    found: &mut Vec<Mismatch>,
) {
    use Severity::{Recommended, Required};
    let wanted = &manifest.config;
    let object = format!("consumer {object}");
    let object = object.as_str();
    let actual_filters: Vec<&str> = if actual.filter_subjects.is_empty() {
        vec![actual.filter_subject.as_str()]
    } else {
        actual.filter_subjects.iter().map(String::as_str).collect()
    };
    // The same rows, only slower to match: weir runs, and says so.
    let same_rows = manifest
        .same_rows_filter
        .as_deref()
        .is_some_and(|filter| actual_filters == [filter]);
    check(
        found,
        if same_rows { Recommended } else { Required },
        object,
        "filter_subject",
        vec![wanted.filter_subject.as_str()],
        actual_filters,
    );
    check(
        found,
        Required,
        object,
        "ack_policy",
        wanted.ack_policy,
        actual.ack_policy,
    );
    check(
        found,
        Required,
        object,
        "deliver_subject (must be a pull consumer)",
        None,
        actual.deliver_subject.as_deref(),
    );
    // A server-side delivery limit drops rows weir would have dead-lettered.
    check(
        found,
        Required,
        object,
        "max_deliver",
        normalize_unlimited(wanted.max_deliver),
        normalize_unlimited(actual.max_deliver),
    );
    check(
        found,
        Recommended,
        object,
        "ack_wait",
        wanted.ack_wait,
        actual.ack_wait,
    );
    check(
        found,
        Recommended,
        object,
        "max_ack_pending",
        wanted.max_ack_pending,
        actual.max_ack_pending,
    );
}

/// The server reports "unlimited" as -1 or 0 depending on how it was set.
fn normalize_unlimited(value: i64) -> i64 {
    if value <= 0 { -1 } else { value }
}

/// How long a consumer found missing is given to appear before it counts
/// as missing: a claim deletes and creates its unit's consumer in one go.
const RECREATE_GRACE: Duration = Duration::from_secs(1);

/// How often a running host re-checks the topology it verified at boot.
pub const RECHECK_PERIOD: Duration = Duration::from_secs(60);

mod create;

use create::{create_or_update_consumer, create_or_update_stream};

#[cfg(test)]
mod tests;
