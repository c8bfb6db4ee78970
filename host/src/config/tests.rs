//! The parser's and the checker's tests: positions, defaults, limits.

use std::time::Duration;

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(
        Path::new("/etc/weir/weir.toml"),
        text,
        &Overrides::default(),
    )
}

fn problems(text: &str) -> Vec<String> {
    match parse(text) {
        Err(ConfigError::Invalid(Problems(list))) => list.iter().map(ToString::to_string).collect(),
        other => panic!("expected problems, got {other:?}"),
    }
}

#[test]
fn unknown_key_is_refused_with_its_position() {
    let found = problems("listen = \"127.0.0.1:1\"\n\n[delivery]\nbatch_rowz = 3\n");
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("/etc/weir/weir.toml:4:1: unknown field `batch_rowz`"),
        "{found:?}"
    );
}

#[test]
fn syntax_error_names_line_and_column() {
    let found =
        problems("listen = \"127.0.0.1:1\"\ntenants = [\n  { name = \"a\" api_keys = [] },\n]\n");
    assert!(found[0].starts_with("/etc/weir/weir.toml:3:"), "{found:?}");
}

#[test]
fn every_semantic_problem_is_reported_at_once() {
    let found = problems(concat!(
        "[[tenants]]\nname = \"bad\ttenant\"\napi_keys = [\"short\"]\n",
        "[[pipelines]]\ntables = [\"orders\"]\ntransforms = [\"nope\"]\n",
    ));
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].contains(":2:8: tenant `bad\ttenant`"), "{found:?}");
    assert!(found[1].contains(":3:13: an api key must be"), "{found:?}");
    assert!(
        found[2].contains(":6:15: pipeline uses unknown plugin `nope`"),
        "{found:?}"
    );
}

#[test]
fn the_instance_pool_is_sized_from_units_steps_and_isolation() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    for wasm in ["v.wasm", "s.wasm"] {
        std::fs::write(dir.path().join("plugins").join(wasm), b"").unwrap();
    }
    let text = |top: &str| {
        format!(
            "{top}\n[stream]\npartitions = 1\nshards = 120\n\
             [plugins.v]\nwasm = \"v.wasm\"\nworld = \"transform\"\n\
             [plugins.s]\nwasm = \"s.wasm\"\nworld = \"sink\"\n\
             [[pipelines]]\ntables = [\"a\"]\ntransforms = [\"v\", \"v\"]\nsink = \"s\"\n"
        )
    };
    let load = |top: &str| {
        Config::parse(
            &dir.path().join("weir.toml"),
            &text(top),
            &Overrides::default(),
        )
    };
    // 120 units × 3 steps, and 8 lanes × 3 steps for 8 units, twice.
    let sized = load("").unwrap();
    assert_eq!(sized.plugin_instances(8, 8), 2 * (360 + 8 * 8 * 3));
    // Never below the old fixed pool, never past the ceiling.
    assert_eq!(load("").unwrap().plugin_instances(0, 0), 2 * 360);
    assert_eq!(sized.plugin_instances(1000, 1000), MAX_PLUGIN_INSTANCES);
    let set = load("max_plugin_instances = 300").unwrap();
    assert_eq!(set.plugin_instances(8, 8), 300);
    let Err(ConfigError::Invalid(Problems(found))) = load("max_plugin_instances = 9000") else {
        panic!("a pool past the ceiling is refused");
    };
    assert!(
        found[0]
            .to_string()
            .contains(":1:24: max_plugin_instances must be between 1 and 8192"),
        "{found:?}"
    );
}

#[test]
fn limits_out_of_range_are_reported_where_they_are_written() {
    let found = problems(concat!(
        "max_body_bytes = 0\n",
        "admin_api_keys = [\"x\", \"tenant-key-1\"]\n",
        "[stream]\nmax_bytes = 0\n",
        "[delivery]\nbatch_rows = 0\nmax_deliveries = 0\nack_wait_secs = 0\n",
        "failure_delay_ms = 5000\nfailure_delay_cap_ms = 100\n",
        "[[tenants]]\nname = \"t\"\napi_keys = [\"tenant-key-1\"]\n",
    ));
    let expected = [
        ":1:18: max_body_bytes must be between 1 byte and 4 GiB",
        ":4:13: max_bytes must be at least 1 byte",
        ":6:14: batch_rows must be at least 1",
        ":10:24: failure_delay_cap (the retry delay's cap, at least failure_delay) must be at least 5s",
        ":8:17: ack_wait must be at least 1s",
        ":7:18: max_deliveries must be at least 1",
        ":2:19: an admin api key must be at least 8 characters",
        ":2:24: this admin api key is also a tenant's api key",
    ];
    for want in expected {
        assert!(
            found.iter().any(|p| p.contains(want)),
            "no `{want}` in {found:#?}"
        );
    }
}

#[test]
fn durations_and_sizes_take_units_and_the_older_keys_still_work() {
    let config = parse(concat!(
        "max_body_bytes = \"4MiB\"\n",
        "[nats]\nurl = \"nats://a:4222,nats://b:4222\"\n",
        "[stream]\nmax_bytes = \"500GB\"\nduplicate_window = \"5m\"\nreplicas = 3\n",
        "[delivery]\nack_wait = \"1m30s\"\nfailure_delay_ms = 250\ndrain_timeout = \"10s\"\n",
        "[coordination]\nmember_ttl_secs = 7\n",
    ))
    .unwrap();
    assert_eq!(config.max_body_bytes, 4 << 20);
    assert_eq!(config.stream.max_bytes, 500 << 30);
    assert_eq!(config.stream.duplicate_window, Duration::from_secs(300));
    assert_eq!(config.stream.replicas, 3);
    assert_eq!(config.delivery.ack_wait, Duration::from_secs(90));
    assert_eq!(config.delivery.failure_delay, Duration::from_millis(250));
    assert_eq!(config.delivery.drain_timeout, Duration::from_secs(10));
    assert_eq!(config.coordination.member_ttl, Duration::from_secs(7));
    // A batch closes early by default, as soon as no further row is waiting.
    assert_eq!(config.delivery.batch_idle, Duration::ZERO);
    let eager = parse("[delivery]\nbatch_wait = \"20ms\"\nbatch_idle = \"1ms\"\n").unwrap();
    assert_eq!(eager.delivery.batch_wait, Duration::from_millis(20));
    assert_eq!(eager.delivery.batch_idle, Duration::from_millis(1));
    let patient = parse("[delivery]\nbatch_idle = \"5ms\"\n").unwrap();
    assert_eq!(patient.delivery.batch_idle, patient.delivery.batch_wait);
    // The default topology: four partitions of one shard.
    assert_eq!((config.stream.partitions, config.stream.shards), (4, 1));

    let found = problems(concat!(
        "[stream]\nreplicas = 2\n",
        "[delivery]\nack_wait = \"30s\"\nack_wait_secs = 30\n",
    ));
    assert!(
        found
            .iter()
            .any(|p| p.contains(":2:12: replicas must be 1, 3 or 5")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains(":5:17: ack_wait_secs and ack_wait are the same setting")),
        "{found:?}"
    );
    for (text, position) in [
        ("[delivery]\nack_wait = \"soon\"\n", ":2:12:"),
        ("[stream]\nmax_bytes = \"5XB\"\n", ":2:13:"),
        ("[stream]\nmax_bytes = -5\n", ":2:13:"),
    ] {
        let found = problems(text);
        assert!(found[0].contains(position), "{text}: {found:?}");
    }
}

#[test]
fn api_keys_can_come_from_files_kept_out_of_the_toml() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("acme.keys"),
        "# rotated by a reload\nacme-key-from-file\n\nsecond-acme-key\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("admin.keys"), "admin-key-from-file\n").unwrap();
    let text = "admin_api_keys_file = \"admin.keys\"\n\
                [[tenants]]\nname = \"acme\"\napi_keys_file = \"acme.keys\"\n";
    let path = dir.path().join("weir.toml");
    let config = Config::parse(&path, text, &Overrides::default()).unwrap();
    assert_eq!(
        config.tenants[0].api_keys,
        vec!["acme-key-from-file", "second-acme-key"]
    );
    assert_eq!(config.admin_api_keys, vec!["admin-key-from-file"]);

    let missing = text.replace("acme.keys", "nowhere.keys");
    let Err(ConfigError::Invalid(Problems(found))) =
        Config::parse(&path, &missing, &Overrides::default())
    else {
        panic!("a missing keys file is refused");
    };
    assert!(
        found
            .iter()
            .any(|problem| problem.to_string().contains(":4:17: cannot read keys file")),
        "{found:?}"
    );
}

#[test]
fn missing_wasm_names_the_path() {
    let found = problems("[plugins.v]\nwasm = \"v.wasm\"\nworld = \"transform\"\n");
    assert!(
        found[0].contains("/etc/weir/plugins/v.wasm does not exist"),
        "{found:?}"
    );
    assert!(
        found[0].starts_with("/etc/weir/weir.toml:2:8:"),
        "{found:?}"
    );
}

#[test]
fn policies_name_plugins_of_their_world() {
    let found = problems(concat!(
        "[plugins.s]\nwasm = \"s.wasm\"\nworld = \"sink\"\n",
        "[policies]\nbudget = \"s\"\nrouter = \"nope\"\n",
    ));
    let policy: Vec<&String> = found
        .iter()
        .filter(|p| !p.contains("does not exist"))
        .collect();
    assert_eq!(policy.len(), 2, "{found:?}");
    assert!(
        policy[0].starts_with(
            "/etc/weir/weir.toml:5:10: plugin `s` is a sink but is used here as a budget"
        ),
        "{found:?}"
    );
    assert!(
        policy[1].starts_with("/etc/weir/weir.toml:6:10: policies uses unknown plugin `nope`"),
        "{found:?}"
    );
}

#[test]
fn a_pipeline_has_at_most_one_plugin_granted_state() {
    let found = problems(concat!(
        "[plugins.w]\nwasm = \"w.wasm\"\nworld = \"transform\"\ngrants.state = {}\n",
        "[plugins.x]\nwasm = \"w.wasm\"\nworld = \"transform\"\ngrants.state = {}\n",
        "[[pipelines]]\ntables = [\"t\"]\ntransforms = [\"w\", \"x\"]\n",
    ));
    assert!(
        found.iter().any(|p| p.starts_with(
            "/etc/weir/weir.toml:11:20: pipeline #1 has two \
             plugins granted state, `w` and `x`"
        )),
        "{found:?}"
    );
}

#[test]
fn an_objects_sink_is_refused_beside_state_or_postgres_and_its_grant_is_checked_at_its_lines() {
    let lake = "[plugins.lake.grants.objects]\nbucket = \"lake\"\n";
    let found = problems(&format!(
        "[plugins.w]\nwasm = \"w.wasm\"\nworld = \"transform\"\ngrants.state = {{}}\n\
         [plugins.lake]\nwasm = \"l.wasm\"\nworld = \"sink\"\n{lake}format = \"parquet\"\n\
         max_rows = 20000\ncolumns = [{{ name = \"1id\", type = \"int64\" }}]\n\
         [plugins.both]\nwasm = \"l.wasm\"\nworld = \"sink\"\n\
         grants.postgres = {{ url = \"postgres://weir@127.0.0.1/app\" }}\n\
         grants.objects = {{ bucket = \"lake\", format = \"csv\", endpoint = \"s3.example\" }}\n\
         [[pipelines]]\ntables = [\"t\"]\ntransforms = [\"w\"]\nsink = \"lake\"\n\
         [[pipelines]]\ntables = [\"u\"]\nsink = \"both\"\n"
    ));
    let says = |text: &str| found.iter().any(|p| p.contains(text));
    assert!(
        says("pipeline #1: sink `lake` is granted objects and `w` keeps state"),
        "{found:?}"
    );
    assert!(
        says("pipeline #2: sink `both` is granted objects and it is also granted postgres"),
        "{found:?}"
    );
    assert!(
        says("grants.objects.max_rows must be between 1 and 15000"),
        "{found:?}"
    );
    assert!(says("grants.objects.columns[0].name `1id`"), "{found:?}");
    assert!(
        says("grants.objects.format `csv` is not one weir writes"),
        "{found:?}"
    );
    assert!(
        says("grants.objects.endpoint `s3.example` is not an http:// or https:// URL"),
        "{found:?}"
    );
}

#[test]
fn state_grants_have_limits_in_range() {
    let found = problems(concat!(
        "[plugins.w]\nwasm = \"w.wasm\"\nworld = \"transform\"\n",
        "grants.state = { max_keys = 0, max_bytes = \"2MiB\" }\n",
    ));
    let state: Vec<&String> = found
        .iter()
        .filter(|p| p.contains("grants.state"))
        .collect();
    assert_eq!(state.len(), 2, "{found:?}");
    assert!(
        state[0].starts_with("/etc/weir/weir.toml:4:29:")
            && state[0].contains("max_keys must be between 1 and 100000"),
        "{found:?}"
    );
    assert!(
        state[1].starts_with(
            "/etc/weir/weir.toml:4:44: grants.state.max_bytes must be between 1 byte and 768 KiB"
        ),
        "{found:?}"
    );
}

#[test]
fn http_grants_are_host_port_authorities() {
    let found = problems(concat!(
        "[plugins.h]\nwasm = \"h.wasm\"\nworld = \"sink\"\n",
        "grants.http = [\"127.0.0.1:8123\", \"API.example.com:443\", \"[::1]:80\",\n",
        "  \"no-port.example.com\", \"bad host:80\", \"x:0\"]\n",
    ));
    let http: Vec<&String> = found.iter().filter(|p| p.contains("grants.http")).collect();
    assert_eq!(http.len(), 3, "{found:?}");
    assert!(
        http[0].starts_with("/etc/weir/weir.toml:5:3: plugin `h`: grants.http entry `no-port.example.com` is not `host:port`"),
        "{found:?}"
    );
    assert!(
        http[1].contains("`bad host:80` has no valid host"),
        "{found:?}"
    );
    assert!(http[2].contains("`x:0` has no port"), "{found:?}");
    assert_eq!(
        parse_authority("API.example.com:443").as_deref(),
        Ok("api.example.com:443")
    );
    assert_eq!(parse_authority("[::1]:80").as_deref(), Ok("[::1]:80"));
}

#[test]
fn http_max_in_flight_is_bounded_where_it_is_written() {
    let found = problems(concat!(
        "[plugins.h]\nwasm = \"h.wasm\"\nworld = \"transform\"\n",
        "http_max_in_flight = 0\n",
        "[plugins.g]\nwasm = \"g.wasm\"\nworld = \"transform\"\n",
        "http_max_in_flight = 1025\n",
    ));
    let bounded: Vec<&String> = found
        .iter()
        .filter(|p| p.contains("http_max_in_flight must be between 1 and 1024"))
        .collect();
    assert_eq!(bounded.len(), 2, "{found:?}");
    assert!(
        bounded
            .iter()
            .any(|p| p.starts_with("/etc/weir/weir.toml:4:22: plugin `h`")),
        "{found:?}"
    );
}

#[test]
fn unknown_grant_is_refused() {
    let found = problems("[plugins.h]\nwasm = \"h.wasm\"\nworld = \"sink\"\ngrants.htp = []\n");
    assert!(
        found
            .iter()
            .any(|p| p.contains(":4:8: unknown field `htp`")),
        "{found:?}"
    );
}

#[test]
fn backoff_doubles_up_to_its_cap_with_bounded_jitter() {
    let config =
        parse("[delivery]\nfailure_delay_ms = 100\nfailure_delay_cap_ms = 1000\n").unwrap();
    let delivery = &config.delivery;
    for (attempt, nominal) in [
        (1, 100),
        (2, 200),
        (3, 400),
        (4, 800),
        (5, 1000),
        (40, 1000),
    ] {
        for sequence in 0..50 {
            let delay = delivery.backoff(attempt, sequence).as_millis() as u64;
            assert!(
                (nominal * 8 / 10..=nominal * 12 / 10).contains(&delay),
                "attempt {attempt}: {delay} ms"
            );
        }
    }
    let spread: std::collections::HashSet<_> = (0..50).map(|s| delivery.backoff(3, s)).collect();
    assert!(spread.len() > 10, "jitter spreads retries");
}

#[test]
fn defaults_and_overrides() {
    let overrides = Overrides {
        nats_url: Some("nats://127.0.0.1:4222".into()),
        ..Default::default()
    };
    let config = Config::parse(Path::new("w.toml"), "", &overrides).unwrap();
    assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(config.nats.url.as_deref(), Some("nats://127.0.0.1:4222"));
    assert_eq!(config.nats.embedded.sync, SyncPolicy::Always);
    assert_eq!(config.data_dir, Path::new("./data"));
    assert_eq!(config.stream.prefix, "weir");
}

#[test]
fn postgres_grants_are_for_sinks_and_never_show_the_password() {
    let found = problems(concat!(
        "[plugins.t]\nwasm = \"t.wasm\"\nworld = \"transform\"\n",
        "grants.postgres = { url = \"postgres://weir@127.0.0.1/app\" }\n",
        "[plugins.s]\nwasm = \"s.wasm\"\nworld = \"sink\"\n",
        "grants.postgres = { url = \"postgres://weir:S3cret@127.0.0.1:notaport/app\", max_connections = 0, password_file = \"nope\" }\n",
    ));
    let postgres: Vec<&String> = found
        .iter()
        .filter(|p| p.contains("grants.postgres"))
        .collect();
    assert_eq!(postgres.len(), 4, "{found:?}");
    let says = |text: &str| postgres.iter().any(|p| p.contains(text));
    assert!(
        says("/etc/weir/weir.toml:4:27: plugin `t`: grants.postgres is for sinks"),
        "{found:?}"
    );
    assert!(
        says(
            "grants.postgres.url `postgres://weir:***@127.0.0.1:notaport/app` is not a PostgreSQL connection URL"
        ),
        "{found:?}"
    );
    assert!(
        found.iter().all(|p| !p.contains("S3cret")),
        "a problem shows the password: {found:?}"
    );
    assert!(
        says("8:113: plugin `s`: grants.postgres.password_file /etc/weir/nope is not a file"),
        "{found:?}"
    );
    assert!(
        says("8:94: grants.postgres.max_connections must be between 1 and 256"),
        "{found:?}"
    );
    assert_eq!(
        redact_url("postgres://u:p%40ss@db:5432/app?password=x&sslmode=disable"),
        "postgres://u:***@db:5432/app?password=***&sslmode=disable"
    );
    assert_eq!(
        redact_url("host=db user=u password=secret dbname=app"),
        "host=db user=u password=*** dbname=app"
    );
}

#[test]
fn nats_grants_are_for_sinks_and_never_reach_weirs_own_subjects() {
    let found = problems(concat!(
        "[plugins.t]\nwasm = \"t.wasm\"\nworld = \"transform\"\n",
        "grants.nats = { publish = [\"audit.>\"] }\n",
        "[plugins.s]\nwasm = \"s.wasm\"\nworld = \"sink\"\n",
        "grants.nats = { publish = [\"audit.>\", \"weir.in.x\", \">\", \"*.x\", \"$JS.API.>\", \"_INBOX.x\", \"a.>.b\", \"a..b\", \"a b\", \"a.b*\"] }\n",
        "[plugins.e]\nwasm = \"e.wasm\"\nworld = \"sink\"\n",
        "grants.nats = { publish = [] }\n",
    ));
    let nats: Vec<&String> = found.iter().filter(|p| p.contains("grants.nats")).collect();
    let says = |text: &str| nats.iter().any(|p| p.contains(text));
    assert!(
        says("4:27: plugin `t`: grants.nats is for sinks"),
        "{found:?}"
    );
    assert!(
        says("plugin `e`: grants.nats.publish names no subject"),
        "{found:?}"
    );
    for (entry, problem) in [
        ("weir.in.x", "reaches weir's own subjects (`weir.…`)"),
        (">", "reaches weir's own subjects"),
        ("*.x", "reaches weir's own subjects"),
        ("$JS.API.>", "reaches NATS's own subjects"),
        ("_INBOX.x", "reaches NATS's own subjects"),
        ("a.>.b", "has `>` before its last token"),
        ("a..b", "has an empty token"),
        ("a b", "holds whitespace"),
        ("a.b*", "holds `*` or `>` inside a token"),
    ] {
        assert!(
            says(&format!(
                "plugin `s`: grants.nats.publish entry `{entry}` {problem}"
            )),
            "{entry}: {found:?}"
        );
    }
    assert!(!says("entry `audit.>`"), "{found:?}");
    assert_eq!(nats.len(), 11, "{found:?}");

    let grant = NatsGrant {
        publish: vec!["audit.>".into(), "orders.*.created".into(), "one".into()],
        jetstream: true,
    };
    for allowed in ["audit.x", "audit.x.y", "orders.7.created", "one"] {
        assert!(grant.allows(allowed), "{allowed}");
    }
    for refused in [
        "audit",
        "orders.7.created.x",
        "orders.created",
        "one.two",
        "x.audit.y",
    ] {
        assert!(!grant.allows(refused), "{refused}");
    }
}

/// Four mistakes and a bad world, each a kind serde alone stops at (a bad
/// duration, an unknown key, a bad size) or the checker finds (an unknown
/// plugin, an unknown world): one run reports all five, each where it is.
const FIVE_MISTAKES: &str = r#"listen = "127.0.0.1:1"
max_body_bytes = "lots"

[delivery]
batch_rowz = 3
batch_wait = "soon"

[[tenants]]
name = "acme"
api_keys = ["acme-key-123"]

[plugins.files]
wasm = "s.wasm"
world = "sinkk"

[[pipelines]]
tables = ["orders"]
transforms = ["ghost"]
sink = "files"
"#;

#[test]
fn every_mistake_of_a_file_is_reported_in_one_run_at_its_position() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins").join("s.wasm"), b"").unwrap();
    let found = match Config::parse(
        &dir.path().join("weir.toml"),
        FIVE_MISTAKES,
        &Overrides::default(),
    ) {
        Err(ConfigError::Invalid(problems)) => problems.to_string(),
        other => panic!("expected problems, got {other:?}"),
    };
    println!("{found}");
    let lines: Vec<&str> = found.lines().collect();
    let at = |position: &str, what: &str| {
        assert!(
            lines.iter().any(
                |line| line.contains(&format!("weir.toml:{position}: ")) && line.contains(what)
            ),
            "no `{what}` at {position}:\n{found}"
        );
    };
    at("2:18", "lots");
    at("5:1", "unknown field `batch_rowz`");
    at("6:14", "soon");
    at("14:9", "unknown world `sinkk`");
    at("18:15", "unknown plugin `ghost`");
    assert_eq!(
        lines.len(),
        5,
        "one line per problem, nothing else:\n{found}"
    );
}

#[test]
fn an_empty_pipeline_is_reported_at_its_line() {
    let found = problems("listen = \"127.0.0.1:1\"\n\n[[pipelines]]\ntables = []\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("weir.toml:4:10: pipeline #1 takes no tables"),
        "{found:?}"
    );
}

#[test]
fn api_keys_with_whitespace_around_them_are_refused() {
    let found = problems(concat!(
        "admin_api_keys = [\"admin-key-123 \"]\n",
        "[[tenants]]\nname = \"acme\"\napi_keys = [\" acme-key-123\", \"acme-key-456\"]\n",
    ));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains(":1:19: this admin api key has whitespace"),
        "{found:?}"
    );
    assert!(
        found[1].contains(":4:13: this api key has whitespace"),
        "{found:?}"
    );
}

#[test]
fn a_required_key_that_is_wrong_is_one_problem_not_two() {
    // `tables` is required: taking it out must not add "missing field".
    let found = problems("[[pipelines]]\ntables = \"orders\"\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains(":2:10: "), "{found:?}");
}

#[test]
fn an_http_ca_that_is_not_a_pem_file_is_named_at_its_key() {
    let found = problems(
        "[plugins.h]\nwasm = \"h.wasm\"\nworld = \"sink\"\ngrants.http = [\"localhost:1\"]\nhttp_ca = \"/nonexistent/ca.pem\"\n",
    );
    let ca: Vec<&String> = found.iter().filter(|p| p.contains("http_ca")).collect();
    assert_eq!(ca.len(), 1, "{found:?}");
    assert!(
        ca[0].starts_with(
            "/etc/weir/weir.toml:5:11: plugin `h`: http_ca: cannot read /nonexistent/ca.pem"
        ),
        "{found:?}"
    );
}

#[test]
fn a_tenant_without_api_keys_sends_over_the_nats_door_of_an_operators_server() {
    let tenant = "[[tenants]]\nname = \"acme\"\n";
    let config = parse(&format!(
        "[nats]\nurl = \"nats://127.0.0.1:4222\"\n{tenant}"
    ))
    .unwrap();
    assert_eq!(config.tenants[0].name, "acme");
    assert!(config.tenants[0].api_keys.is_empty());

    let found = problems(&format!(
        "[nats]\nurl = \"nats://127.0.0.1:4222\"\ningest = false\n{tenant}"
    ));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(":5:8: tenant `acme` has no api_keys and the NATS door is off"),
        "{found:?}"
    );
    // The embedded server lets no producer in.
    let found = problems(tenant);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(
            ":2:8: tenant `acme` has no api_keys and the NATS door is on the embedded nats-server"
        ),
        "{found:?}"
    );
}
