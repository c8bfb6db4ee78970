//! The least-privilege NATS permissions a weir host needs, derived from the
//! same [`Manifest`] weir verifies: publish its rows and dead letters, read
//! its streams and consumers, pull and ack its durables (and create each
//! afresh, by its exact name, at the claim that takes its unit),
//! coordinate through its KV bucket, fetch plugins pushed to the fleet
//! (and fetch and keep the components compiled once for it),
//! publish to the subjects its sinks are granted (`grants.nats`), serve
//! the NATS door and answer its requests — and nothing that creates,
//! deletes or purges a stream. And what a producer of one tenant needs
//! to send rows through the NATS door, and nothing of another tenant's.

use serde::Serialize;

use crate::config::PluginConfig;
use crate::nats::jetstream::consumer_create_subject;
use crate::topology::manifest::Manifest;
use crate::topology::route::Names;

/// A `permissions` block for a nats-server user (JSON is valid NATS config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Permissions {
    pub publish: Allow,
    pub subscribe: Allow,
    /// May answer the requests it receives (once each), whatever their
    /// reply subject: the NATS door's answers.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_responses: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allow {
    pub allow: Vec<String>,
}

impl Permissions {
    /// Everything a host of this topology does, and nothing more.
    pub fn for_host(router: &Names, manifest: &Manifest) -> Permissions {
        let prefix = router.prefix();
        let mut publish = vec![
            // Rows at the front door, dead letters from delivery, and the
            // rows each host accepted, shared for fleet-wide usage.
            format!("{prefix}.in.>"),
            format!("{prefix}.dlq.>"),
            router.usage_subject(),
            // Readiness: a round trip through the server every 200 ms.
            router.readiness_subject(),
        ];
        for stream in &manifest.streams {
            publish.push(format!("$JS.API.STREAM.INFO.{}", stream.name));
        }
        // Usage's slow check: every partition's size in one listing.
        publish.push("$JS.API.STREAM.LIST".to_string());
        for consumer in &manifest.consumers {
            let (stream, name) = (
                &consumer.stream,
                consumer.config.name.as_deref().unwrap_or_default(),
            );
            publish.push(format!("$JS.API.CONSUMER.INFO.{stream}.{name}"));
            publish.push(format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}"));
            // Every claim deletes the unit's consumer and creates it again
            // (the fence on its previous puller): this one, by its exact name.
            publish.push(format!("$JS.API.CONSUMER.DELETE.{stream}.{name}"));
            publish.push(consumer_create_subject(
                stream,
                name,
                &consumer.config.filter_subject,
            ));
            // Acks, naks and in-progress acks go to the reply subject.
            publish.push(format!("$JS.ACK.{stream}.{name}.>"));
        }
        for stream in manifest
            .streams
            .iter()
            .filter(|s| s.name != router.dead_letter_stream())
        {
            // Backlog of every unit in one paged request.
            publish.push(format!("$JS.API.CONSUMER.LIST.{}", stream.name));
        }
        // Status and the live page read dead letters (headers, newest
        // first) through ordered consumers of their own: read-only, never
        // a delete of a letter or a purge.
        let dlq = router.dead_letter_stream();
        publish.extend([
            format!("$JS.API.CONSUMER.CREATE.{dlq}"),
            format!("$JS.API.CONSUMER.CREATE.{dlq}.>"),
            format!("$JS.API.CONSUMER.DELETE.{dlq}.>"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{dlq}.>"),
        ]);
        for bucket in &manifest.buckets {
            // Coordination: member keys and owner records (writes are
            // publishes), reads of one key, and the host's one watch (a
            // push consumer it creates and deletes, with flow control).
            let stream = format!("KV_{}", bucket.bucket);
            publish.extend([
                format!("$KV.{}.>", bucket.bucket),
                format!("$JS.API.STREAM.INFO.{stream}"),
                format!("$JS.API.DIRECT.GET.{stream}.>"),
            ]);
            // Plugin state is read key by key, never watched.
            if bucket.bucket == router.coordination_bucket() {
                publish.extend([
                    // Multi-filter consumers are created without a name token.
                    format!("$JS.API.CONSUMER.CREATE.{stream}"),
                    format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
                    format!("$JS.API.CONSUMER.DELETE.{stream}.>"),
                    format!("$JS.FC.{stream}.>"),
                ]);
            }
        }
        // Plugins pushed to the fleet, and the fleet's compiled artifacts:
        // read from their object stores (its info, the object's metadata,
        // and its chunks through an ordered consumer).
        for store in [router.plugin_store(), router.compiled_store()] {
            let objects = format!("OBJ_{store}");
            publish.extend([
                format!("$JS.API.STREAM.INFO.{objects}"),
                format!("$JS.API.STREAM.MSG.GET.{objects}"),
                format!("$JS.API.DIRECT.GET.{objects}.>"),
                format!("$JS.API.CONSUMER.CREATE.{objects}"),
                format!("$JS.API.CONSUMER.CREATE.{objects}.>"),
                format!("$JS.API.CONSUMER.DELETE.{objects}.>"),
                format!("$JS.FC.{objects}.>"),
            ]);
        }
        // A host keeps what it compiled for the others: new objects only
        // (chunks, then the metadata that makes them visible), never a purge.
        let compiled = router.compiled_store();
        publish.extend([format!("$O.{compiled}.C.>"), format!("$O.{compiled}.M.>")]);
        Permissions {
            publish: Allow { allow: publish },
            // Replies to requests and pulls.
            subscribe: Allow {
                allow: vec!["_INBOX.>".to_string(), router.usage_subject()],
            },
            allow_responses: false,
        }
    }

    /// The same, serving the NATS door: its requests, as a queue group, and
    /// an answer to each on the producer's reply subject.
    pub fn with_ingest(mut self, router: &Names) -> Permissions {
        self.subscribe.allow.push(router.ingest_subjects());
        self.allow_responses = true;
        self
    }

    /// What a producer of `tenant` needs to send rows through the NATS
    /// door: requests to its own tenant's ingest subjects, and answers on
    /// an inbox prefix of its own (`Names::tenant_inbox`), so it reads no
    /// other tenant's answers. Nothing else: no JetStream, no other
    /// tenant's subject.
    pub fn for_producer(router: &Names, tenant: &str) -> Permissions {
        Permissions {
            publish: Allow {
                allow: vec![router.tenant_ingest_subjects(tenant)],
            },
            subscribe: Allow {
                allow: vec![format!("{}.>", router.tenant_inbox(tenant))],
            },
            allow_responses: false,
        }
    }

    /// The same, with the subjects `plugins` are granted to publish to
    /// (`grants.nats.publish`). Their PubAcks come back on `_INBOX.>`,
    /// already allowed.
    pub fn with_grants<'a>(
        mut self,
        plugins: impl IntoIterator<Item = &'a PluginConfig>,
    ) -> Permissions {
        for plugin in plugins {
            let Some(grant) = &plugin.grants.nats else {
                continue;
            };
            for subject in &grant.publish {
                if !self.publish.allow.contains(subject) {
                    self.publish.allow.push(subject.clone());
                }
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Overrides};
    use std::path::Path;

    #[test]
    fn a_host_may_do_its_work_and_nothing_destructive() {
        let config = Config::parse(
            Path::new("w.toml"),
            "[stream]\npartitions = 1\nshards = 2\n",
            &Overrides::default(),
        )
        .unwrap();
        let router = Names::new("weir", 1, 2);
        let manifest = Manifest::new(&router, &config.stream, &config.delivery, None);
        let permissions = Permissions::for_host(&router, &manifest);
        let publish = &permissions.publish.allow;
        assert!(publish.contains(&"weir.in.>".to_string()));
        assert!(publish.contains(&"$JS.API.CONSUMER.MSG.NEXT.weir_in_0.weir_in_0_1".to_string()));
        assert!(publish.contains(&"$JS.ACK.weir_in_0.weir_in_0_0.>".to_string()));
        assert!(publish.contains(&"$JS.API.CONSUMER.DELETE.weir_in_0.weir_in_0_1".to_string()));
        assert!(
            publish.contains(
                &"$JS.API.CONSUMER.CREATE.weir_in_0.weir_in_0_1.weir.in.0.1.>".to_string()
            )
        );
        assert!(publish.contains(&"$KV.weir_coord.>".to_string()));
        assert!(publish.contains(&"$KV.weir_state.>".to_string()));
        for subject in publish {
            for destructive in [
                "STREAM.CREATE",
                "STREAM.DELETE",
                "PURGE",
                "UPDATE",
                "$JS.API.>",
            ] {
                assert!(!subject.contains(destructive), "{subject}");
            }
            // Consumers come and go only for the host's own watch of the
            // coordination bucket, plugin downloads, readers of dead
            // letters, and a claim's unit consumer by its exact name.
            if subject.contains("CONSUMER.CREATE") || subject.contains("CONSUMER.DELETE") {
                assert!(
                    subject.contains(".weir_in_0.weir_in_0_")
                        || subject.contains(".KV_weir_coord")
                        || subject.contains(".OBJ_weir_plugins")
                        || subject.contains(".OBJ_weir_compiled")
                        || subject.contains(".weir_dlq"),
                    "{subject}"
                );
            }
        }
        assert_eq!(
            permissions.subscribe.allow,
            ["_INBOX.>", "weir.usage.accepts"]
        );
        let serving = permissions.clone().with_ingest(&router);
        assert_eq!(
            serving.subscribe.allow,
            ["_INBOX.>", "weir.usage.accepts", "weir.ingest.>"]
        );
        assert!(serving.allow_responses);
        assert_eq!(serving.publish, permissions.publish);
        // No plugin is granted a publish: no subject outside weir's.
        let granted = permissions.clone().with_grants(config.plugins.values());
        assert_eq!(granted, permissions);
    }

    #[test]
    fn a_producer_may_send_its_own_tenants_rows_and_nothing_else() {
        let router = Names::new("weir", 4, 1);
        let producer = Permissions::for_producer(&router, "acme");
        assert_eq!(producer.publish.allow, ["weir.ingest.acme.*"]);
        assert_eq!(producer.subscribe.allow, ["_INBOX.weir.acme.>"]);
        assert!(!producer.allow_responses);
        let json = serde_json::to_value(&producer).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "publish": { "allow": ["weir.ingest.acme.*"] },
                "subscribe": { "allow": ["_INBOX.weir.acme.>"] },
            })
        );
    }

    #[test]
    fn a_host_may_publish_where_its_sinks_are_granted_and_nowhere_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.wasm"), b"").unwrap();
        let toml = format!(
            "plugins_dir = \"{}\"\n[stream]\npartitions = 1\n\
             [plugins.a]\nwasm = \"s.wasm\"\nworld = \"sink\"\n\
             grants.nats = {{ publish = [\"audit.>\", \"orders.*.created\"] }}\n\
             [plugins.b]\nwasm = \"s.wasm\"\nworld = \"sink\"\n\
             grants.nats = {{ publish = [\"audit.>\"], jetstream = false }}\n\
             [plugins.c]\nwasm = \"s.wasm\"\nworld = \"sink\"\n",
            dir.path().display()
        );
        let config = Config::parse(Path::new("w.toml"), &toml, &Overrides::default()).unwrap();
        let router = Names::new("weir", 1, 4);
        let manifest = Manifest::new(&router, &config.stream, &config.delivery, None);
        let bare = Permissions::for_host(&router, &manifest);
        let granted = bare.clone().with_grants(config.plugins.values());
        let added: Vec<&String> = granted
            .publish
            .allow
            .iter()
            .filter(|subject| !bare.publish.allow.contains(subject))
            .collect();
        assert_eq!(added, ["audit.>", "orders.*.created"]);
        // PubAcks are replies: nothing to subscribe to besides the inboxes.
        assert_eq!(granted.subscribe, bare.subscribe);
    }
}
