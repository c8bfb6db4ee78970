//! One compile per fleet: hosts loading a component none of them compiled
//! compile it once between them and share the native code through the
//! `weir_compiled` object store, under exactly the permissions weir prints
//! for a host. An artifact is loaded only if it is this component's, made
//! by this engine, and whole: altered bytes, another engine's code or
//! another engine's claim are refused and the component compiled afresh.
//! A tenant's user cannot write an artifact at all.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use weir::config::{Config, Overrides, PluginConfig};
use weir::reload::releases::FleetCompiled;
use weir::sandbox::{Origin, Sandbox, shared};
use weir::topology::Names;

use crate::nats_ingest::{Server, config};
use crate::support::eventually;

const STORE: &str = "weir_compiled";

/// A sandbox with a compiled cache of its own (an empty one: a fresh
/// machine) sharing through `fleet`.
fn sandbox(cache: &Path, fleet: Arc<FleetCompiled>) -> Sandbox {
    Sandbox::new(weir::telemetry::Metrics::default())
        .unwrap()
        .with_cache(cache.to_path_buf(), 1 << 30)
        .with_fleet(fleet)
}

/// `(from the cache, from the fleet, compiled here)` of a sandbox's loads.
fn origins(sandbox: &Sandbox) -> [u64; 3] {
    [Origin::Cache, Origin::Fleet, Origin::Compiled].map(|origin| sandbox.loaded_from(origin))
}

/// The names and contents of every artifact in the store.
async fn artifacts(admin: &async_nats::Client) -> Vec<(String, Vec<u8>)> {
    let store = jetstream::new(admin.clone())
        .get_object_store(STORE)
        .await
        .unwrap();
    let mut names = Vec::new();
    let mut listing = store.list().await.unwrap();
    while let Some(info) = listing.next().await {
        names.push(info.unwrap().name);
    }
    let mut found = Vec::new();
    for name in names {
        let mut bytes = Vec::new();
        let mut object = store.get(&name).await.unwrap();
        object.read_to_end(&mut bytes).await.unwrap();
        found.push((name, bytes));
    }
    found
}

/// Replaces the artifact `name` with `bytes`, as an admin could.
async fn replace(admin: &async_nats::Client, name: &str, bytes: Vec<u8>) {
    let store = jetstream::new(admin.clone())
        .get_object_store(STORE)
        .await
        .unwrap();
    store.delete(name).await.unwrap();
    store.put(name, &mut bytes.as_slice()).await.unwrap();
}

/// Puts `bytes` in place of the artifact `name`, then loads `plugin` on
/// `host` (an empty cache): the plugin, and where its component came from.
async fn load_in_place_of(
    admin: &async_nats::Client,
    name: &str,
    bytes: Vec<u8>,
    host: &Sandbox,
    plugin: &PluginConfig,
) -> (Arc<weir::sandbox::Plugin>, [u64; 3]) {
    replace(admin, name, bytes).await;
    let loaded = host.load(plugin).await.unwrap();
    (loaded, origins(host))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_compiles_a_component_once_and_loads_only_an_artifact_that_is_its_own() {
    let template = config("nats://127.0.0.1:1", "");
    let server = Server::start(&template);
    let admin = server.admin().await;
    let config_text = config(&server.url("weir"), "");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, &config_text).unwrap();
    let config = Config::load(&path, &Overrides::default()).unwrap();
    let plugin: PluginConfig = config.plugins["validate"].clone();
    let wasm = std::fs::read(&plugin.wasm).unwrap();
    let router = Names::new("weir", config.stream.partitions, config.stream.shards);
    // Each "host" connects as the hosts' user: what it reads and keeps,
    // the printed permissions allow.
    let fleet = |who: &'static str| {
        let (url, router) = (server.url("weir"), router.clone());
        async move {
            let client = async_nats::ConnectOptions::with_user_and_password(
                "weir".into(),
                "weir-secret".into(),
            )
            .connect(url.replace("weir:weir-secret@", ""))
            .await
            .unwrap();
            FleetCompiled::open(&client, &router, who)
                .await
                .expect("the topology has the fleet's store")
        }
    };
    let caches: Vec<tempfile::TempDir> = (0..6).map(|_| tempfile::tempdir().unwrap()).collect();

    // Two hosts, neither has compiled it, load it at once: one compiles,
    // the other loads what it kept.
    let (first, second) = (
        sandbox(caches[0].path(), fleet("host-a").await),
        sandbox(caches[1].path(), fleet("host-b").await),
    );
    let (a, b) = tokio::join!(first.load(&plugin), second.load(&plugin));
    a.unwrap();
    b.unwrap();
    let mut seen = [origins(&first), origins(&second)];
    seen.sort();
    assert_eq!(seen, [[0, 0, 1], [0, 1, 0]], "one compiled, one loaded");
    let kept = artifacts(&admin).await;
    assert_eq!(kept.len(), 1, "one artifact for the fleet");
    let (name, sealed) = &kept[0];
    let wasm_digest: String = Sha256::digest(&wasm)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(name.starts_with(&wasm_digest), "{name}");
    assert!(sealed.starts_with(shared::MAGIC));

    // A third, later, loads it too, compiling nothing.
    let third = sandbox(caches[2].path(), fleet("host-c").await);
    third.load(&plugin).await.unwrap();
    assert_eq!(origins(&third), [0, 1, 0]);

    // Altered bytes: refused, compiled afresh, and it runs.
    let mut altered = sealed.clone();
    let middle = altered.len() / 2;
    altered[middle] ^= 0x01;
    let fourth = sandbox(caches[3].path(), fleet("host-d").await);
    let (loaded, from) = load_in_place_of(&admin, name, altered, &fourth, &plugin).await;
    assert_eq!(from, [0, 0, 1], "an altered artifact is refused");
    loaded.instantiate().await.unwrap();

    // Another engine's native code, sealed as this engine's (its digest
    // recomputed, as a forger would): wasmtime's own check refuses it.
    let header = 16 + 32 + 32;
    let foreign = wasmtime::Engine::default()
        .precompile_component(&wasm)
        .unwrap();
    let forged = [
        &sealed[..header],
        Sha256::digest(&foreign).as_slice(),
        &foreign,
    ]
    .concat();
    let fifth = sandbox(caches[4].path(), fleet("host-e").await);
    let (_, from) = load_in_place_of(&admin, name, forged, &fifth, &plugin).await;
    assert_eq!(from, [0, 0, 1], "another engine's code is refused");

    // An artifact that says another engine made it, under this key.
    let mut other_engine = sealed.clone();
    other_engine[16 + 32] ^= 0xff;
    let sixth = sandbox(caches[5].path(), fleet("host-f").await);
    let (_, from) = load_in_place_of(&admin, name, other_engine, &sixth, &plugin).await;
    assert_eq!(from, [0, 0, 1], "another engine's claim is refused");

    // A tenant's producer cannot write into the store: its publish is
    // refused by the server and nothing lands.
    let before = jetstream::new(admin.clone())
        .get_stream(format!("OBJ_{STORE}"))
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    let (acme, mut errors) = server.producer("acme").await;
    for subject in [
        format!("$O.{STORE}.C.forged"),
        format!("$O.{STORE}.M.{}", name.replace('.', "_")),
    ] {
        acme.publish(subject.clone(), "native code".into())
            .await
            .unwrap();
        acme.flush().await.unwrap();
        let refusal = loop {
            let error = tokio::time::timeout(Duration::from_secs(10), errors.recv())
                .await
                .expect("the server refuses the tenant's publish")
                .unwrap();
            if error.contains(&subject) {
                break error;
            }
        };
        assert!(refusal.contains("Permissions Violation"), "{refusal}");
    }
    eventually(Duration::from_secs(5), "the store unchanged", || async {
        let mut stream = jetstream::new(admin.clone())
            .get_stream(format!("OBJ_{STORE}"))
            .await
            .ok()?;
        (stream.info().await.ok()?.state.messages == before).then_some(())
    })
    .await;
}
