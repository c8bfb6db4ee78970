//! The reloader's tests: what a reload keeps, restarts and says.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::topology::route::Unit;

/// The unit every row of these tests is delivered in.
const UNIT: Unit = Unit {
    partition: 0,
    shard: 0,
};

fn parse(text: &str, overrides: &Overrides) -> Config {
    Config::parse(Path::new("/etc/weir/weir.toml"), text, overrides).unwrap()
}

#[tokio::test]
async fn a_generation_is_behind_the_fleet_only_where_a_release_names_another_version() {
    let wasm = Path::new(weir_test_artifacts::PASSTHROUGH);
    let text = format!(
        "[plugins.p]\nwasm = \"{}\"\nworld = \"transform\"\n",
        wasm.display()
    );
    let config = parse(&text, &Overrides::default());
    let sandbox = Sandbox::new(crate::telemetry::Metrics::default()).unwrap();
    let loaded = sandbox.load(&config.plugins["p"]).await.unwrap();
    let generation = Generation::new(Arc::new(config), HashMap::from([("p".into(), loaded)]));
    let release = |digest: Option<&str>| Release {
        digest: digest.map(str::to_string),
        previous: None,
        pushed_ms: 0,
        how: None,
        history: Vec::new(),
        canary: None,
        ended: None,
        last_shadow: None,
    };
    let fleet =
        |name: &str, digest: Option<&str>| BTreeMap::from([(name.to_string(), release(digest))]);
    let pushed_dir = Path::new("/var/lib/weir/pushed");
    let own = releases::digest(&std::fs::read(wasm).unwrap());

    assert_eq!(
        behind_fleet(&generation, &BTreeMap::new(), pushed_dir),
        None
    );
    assert_eq!(
        behind_fleet(&generation, &fleet("p", Some(&own)), pushed_dir),
        None
    );
    let other = "ff".repeat(32);
    let behind = behind_fleet(&generation, &fleet("p", Some(&other)), pushed_dir).unwrap();
    assert!(
        behind.contains("`p` runs") && behind.contains("ffffffffffff in the fleet"),
        "{behind}"
    );
    // A release of a plugin this host does not run is not its to follow.
    assert_eq!(
        behind_fleet(&generation, &fleet("q", Some(&other)), pushed_dir),
        None
    );
    // Back to each host's own file: behind only while it runs a pushed one.
    assert_eq!(
        behind_fleet(&generation, &fleet("p", None), pushed_dir),
        None
    );
    let pushed_here = wasm.parent().unwrap();
    let behind = behind_fleet(&generation, &fleet("p", None), pushed_here).unwrap();
    assert!(behind.contains("each host's own file"), "{behind}");
}

#[tokio::test]
async fn a_tenants_rows_run_in_the_variant_its_canary_says_and_a_missing_canary_is_behind() {
    let wasm = Path::new(weir_test_artifacts::PASSTHROUGH);
    let text = format!(
        "[plugins.p]\nwasm = \"{}\"\nworld = \"transform\"\n\n[[pipelines]]\ntables = [\"t\"]\ntransforms = [\"p\"]\n",
        wasm.display()
    );
    let config = Arc::new(parse(&text, &Overrides::default()));
    let sandbox = Sandbox::new(crate::telemetry::Metrics::default()).unwrap();
    let serving = sandbox.load(&config.plugins["p"]).await.unwrap();
    let candidate = sandbox.load(&config.plugins["p"]).await.unwrap();
    let digest = releases::digest(&std::fs::read(wasm).unwrap());
    let canary = Canary {
        digest: digest.clone(),
        share: 0,
        tenants: vec!["b".into()],
        units: Vec::new(),
        started_ms: 1,
        auto: None,
        shadow: false,
    };
    let canaries = BTreeMap::from([(
        "p".to_string(),
        CanaryVersion {
            plugin: candidate.clone(),
            canary: canary.clone(),
        },
    )]);
    let plugins = HashMap::from([("p".to_string(), serving.clone())]);
    let generation =
        Generation::with_canaries(config.clone(), plugins.clone(), canaries, Arc::default());
    assert_eq!(generation.variant_count(), 2);
    let (a, b) = (
        generation.variant_index("t", "a", UNIT).unwrap(),
        generation.variant_index("t", "b", UNIT).unwrap(),
    );
    assert_ne!(a, b);
    assert!(Arc::ptr_eq(generation.plugin_in(a, "p").unwrap(), &serving));
    assert!(Arc::ptr_eq(
        generation.plugin_in(b, "p").unwrap(),
        &candidate
    ));
    assert_eq!(generation.variant_canaries(b), [("p", true)]);
    assert_eq!(generation.variant_index("other", "a", UNIT), None);
    assert!(generation.variant_shadows(a).is_empty());
    // A shadow serves no tenant: one variant, the release's, beside
    // which the candidate runs on copies.
    let shadow = CanaryVersion {
        plugin: candidate.clone(),
        canary: Canary {
            shadow: true,
            ..canary.clone()
        },
    };
    let shadowed = Generation::with_canaries(
        config.clone(),
        plugins.clone(),
        BTreeMap::from([("p".to_string(), shadow)]),
        Arc::default(),
    );
    assert_eq!(shadowed.variant_count(), 1);
    let only = shadowed.variant_index("t", "b", UNIT).unwrap();
    assert!(Arc::ptr_eq(
        shadowed.plugin_in(only, "p").unwrap(),
        &serving
    ));
    let shadows = shadowed.variant_shadows(only);
    assert_eq!(shadows.len(), 1);
    assert!(Arc::ptr_eq(&shadows[0].1.plugin, &candidate));

    let release = Release {
        digest: None,
        previous: None,
        pushed_ms: 0,
        how: None,
        history: Vec::new(),
        canary: Some(canary),
        ended: None,
        last_shadow: None,
    };
    let fleet = BTreeMap::from([("p".to_string(), release)]);
    let pushed_dir = Path::new("/var/lib/weir/pushed");
    assert_eq!(behind_fleet(&generation, &fleet, pushed_dir), None);
    // The canary not loaded yet: behind; loaded but ended: behind too.
    let without = Generation::new(config, plugins);
    let behind = behind_fleet(&without, &fleet, pushed_dir).unwrap();
    assert!(behind.contains("no canary of"), "{behind}");
    let ended = BTreeMap::from([(
        "p".to_string(),
        Release {
            canary: None,
            ..fleet["p"].clone()
        },
    )]);
    let behind = behind_fleet(&generation, &ended, pushed_dir).unwrap();
    assert!(behind.contains("that the fleet ended"), "{behind}");
}

#[test]
fn an_edited_listen_or_data_dir_says_restart_needed_and_keeps_running() {
    let running = parse("listen = \"127.0.0.1:8081\"\n", &Overrides::default());
    let edited = "listen = \"127.0.0.1:9091\"\ndata_dir = \"/var/lib/other\"\n";
    let mut next = parse(edited, &same_overrides(&running));
    let kept = keep_restart_only(&mut next, &running);
    assert_eq!(kept, ["listen", "data_dir"]);
    assert_eq!(next.listen, running.listen);
    assert_eq!(next.data_dir, running.data_dir);
    // Nothing edited: nothing named.
    let mut same = parse("listen = \"127.0.0.1:8081\"\n", &same_overrides(&running));
    assert!(keep_restart_only(&mut same, &running).is_empty());
}

#[test]
fn the_command_line_still_wins_over_an_edited_file() {
    let overrides = Overrides {
        listen: Some("127.0.0.1:7000".parse().unwrap()),
        ..Overrides::default()
    };
    let running = parse("listen = \"127.0.0.1:8081\"\n", &overrides);
    let edited = "listen = \"127.0.0.1:9091\"\ndata_dir = \"/var/lib/other\"\n";
    let mut next = parse(edited, &same_overrides(&running));
    assert_eq!(next.listen, running.listen, "--listen is taken again");
    assert_eq!(keep_restart_only(&mut next, &running), ["data_dir"]);
}

#[test]
fn every_restart_only_key_is_kept_and_named() {
    let running = parse("", &Overrides::default());
    let edited = concat!(
        "listen = \"127.0.0.1:9091\"\ndata_dir = \"/other\"\n",
        "compile_cache_dir = \"/cache\"\ncompile_cache_max_bytes = \"8MiB\"\n",
        "max_plugin_instances = 300\n",
        "[nats]\nurl = \"nats://n:4222\"\nuser = \"u\"\npassword = \"p\"\n",
        "tls_ca = \"ca.pem\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n",
        "sync = \"periodic\"\nserver_binary = \"/bin/nats-server\"\n",
        "[stream]\nprefix = \"other\"\npartitions = 8\nshards = 2\nreplicas = 3\n",
        "create = true\nmax_bytes = \"2GiB\"\nduplicate_window = \"5m\"\n",
        "[delivery]\ndrain_timeout = \"5s\"\nack_wait = \"9s\"\n",
        "[coordination]\nhost_id = \"h\"\nmember_ttl = \"9s\"\n",
    );
    let mut next = parse(edited, &same_overrides(&running));
    let kept = keep_restart_only(&mut next, &running);
    assert_eq!(
        kept,
        [
            "listen",
            "data_dir",
            "compile_cache_dir",
            "compile_cache_max_bytes",
            "max_plugin_instances",
            "[nats]",
            "[stream]",
            "[delivery] drain_timeout",
            "[coordination]",
        ]
    );
    assert_eq!(
        (&next.listen, &next.data_dir, &next.compile_cache_dir),
        (
            &running.listen,
            &running.data_dir,
            &running.compile_cache_dir
        )
    );
    assert_eq!(
        next.compile_cache_max_bytes,
        running.compile_cache_max_bytes
    );
    assert_eq!(next.max_plugin_instances, running.max_plugin_instances);
    assert_eq!(next.nats, running.nats);
    assert_eq!(next.stream, running.stream);
    assert_eq!(next.coordination, running.coordination);
    assert_eq!(next.delivery.drain_timeout, running.delivery.drain_timeout);
    // A hot key is applied.
    assert_eq!(next.delivery.ack_wait, Duration::from_secs(9));
}
