//! `weir dlq`: dead letters made by a real host (the validator refuses rows
//! of two tenants and two tables for two reasons), then listed, purged and
//! replayed by the library and the `weir` binary, each only the letters its
//! filters select.

use std::io::Write as _;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use async_nats::jetstream;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use weir::delivery::{DeadLetters, LetterFilter, StoredLetter};
use weir::topology::Names;

use crate::support::{Nats, TestHost, WEIR, base_config, eventually};

const BETA_KEY: &str = "beta-key-456";

/// Tenant `beta` beside `acme`, and table `refunds`, whose validator
/// requires `ts` (where `orders` requires `id`): two reasons to die.
const EXTRA: &str = r#"
[[tenants]]
name = "beta"
api_keys = ["beta-key-456"]

[plugins.needs_ts]
wasm = "weir_validator.wasm"
world = "transform"
settings = { required = ["ts"] }

[[pipelines]]
tables = ["refunds"]
transforms = ["needs_ts"]
sink = "files"
"#;

const MISSING_ID: &str = "missing required field `id`";
const MISSING_TS: &str = "missing required field `ts`";

struct Letters {
    nats: Nats,
    /// Gone once stopped, so that nothing pulls replayed rows.
    host: Option<TestHost>,
    /// The config the `weir` binary reads, outliving the host's own dir.
    config: tempfile::TempDir,
    library: DeadLetters,
}

impl Letters {
    async fn start() -> Letters {
        let nats = Nats::start();
        let text = base_config(nats.url(), EXTRA);
        let host = TestHost::start(&text).await;
        let config = tempfile::tempdir().expect("temp dir");
        std::fs::write(config.path().join("weir.toml"), text).expect("write config");
        let library = DeadLetters::new(
            jetstream::new(nats.client().await),
            Names::new("weir", 1, 4),
        );
        Letters {
            nats,
            host: Some(host),
            config,
            library,
        }
    }

    /// Posts `body` to `table` as `tenant` and waits until the stream holds
    /// `total` dead letters.
    async fn die(&self, tenant_key: &str, table: &str, body: &str, total: usize) {
        let host = self.host.as_ref().expect("the host runs");
        let response = host
            .http
            .post(host.url(&format!("/v1/ingest/{table}")))
            .bearer_auth(tenant_key)
            .body(body.to_string())
            .send()
            .await
            .expect("front door answers");
        assert_eq!(response.status(), 202);
        eventually(
            Duration::from_secs(30),
            "the rows dead-lettered",
            || async {
                let count = self.library.count().await.ok()?;
                (count as usize >= total).then_some(())
            },
        )
        .await;
    }

    async fn list(&self, filter: LetterFilter) -> Vec<StoredLetter> {
        self.library.list(&filter).await.expect("list")
    }

    async fn stop_host(&mut self) {
        if let Some(host) = self.host.take() {
            host.shutdown().await;
        }
    }

    fn config(&self) -> std::path::PathBuf {
        self.config.path().join("weir.toml")
    }

    /// `weir dlq <args>` with stdin not a terminal.
    fn weir(&self, args: &[&str]) -> Output {
        dlq_command(&self.config(), self.nats.url(), args, Stdio::null())
    }

    /// `weir dlq <args>` on a terminal where the operator types `typed`.
    fn weir_on_terminal(&self, args: &[&str], typed: &str) -> Output {
        let (mut keyboard, stdin) = terminal();
        // The terminal keeps the line until weir reads it.
        keyboard
            .write_all(typed.as_bytes())
            .expect("type on the terminal");
        let output = dlq_command(&self.config(), self.nats.url(), args, stdin.into());
        drop(keyboard);
        output
    }
}

fn dlq_command(config: &Path, nats_url: &str, args: &[&str], stdin: Stdio) -> Output {
    tokio::task::block_in_place(|| {
        Command::new(WEIR)
            .arg("dlq")
            .args(args)
            .arg("--nats-url")
            .arg(nats_url)
            .arg("--config")
            .arg(config)
            .stdin(stdin)
            .output()
            .expect("weir runs")
    })
}

/// A pseudo-terminal: its controlling side, and the side a child reads as
/// its terminal stdin.
fn terminal() -> (std::fs::File, OwnedFd) {
    let (mut controller, mut child) = (-1, -1);
    // SAFETY: openpty only writes the two descriptors, which we then own.
    let opened = unsafe {
        libc::openpty(
            &mut controller,
            &mut child,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned by no one else.
    unsafe {
        (
            std::fs::File::from_raw_fd(controller),
            OwnedFd::from_raw_fd(child),
        )
    }
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "weir failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// (tenant, table, payload) of each letter, sorted: letters of different
/// units are stored in no fixed order.
fn rows(letters: &[StoredLetter]) -> Vec<(String, String, String)> {
    let mut rows: Vec<_> = letters
        .iter()
        .map(|l| (l.tenant.clone(), l.table.clone(), l.payload.clone()))
        .collect();
    rows.sort();
    rows
}

fn row(tenant: &str, table: &str, payload: &str) -> (String, String, String) {
    (tenant.into(), table.into(), payload.into())
}

/// Rows `{"a":N}` as the tests below post them: tenant and table of each N.
const POSTED: [(&str, &str); 6] = [
    ("acme", "orders"),
    ("acme", "orders"),
    ("acme", "refunds"),
    ("beta", "orders"),
    ("beta", "refunds"),
    ("acme", "orders"),
];

/// The rows of letters `{"a":N}` for each N in `ids`, sorted like `rows`.
fn letters_of(ids: &[usize]) -> Vec<(String, String, String)> {
    let mut rows: Vec<_> = ids
        .iter()
        .map(|&id| {
            let (tenant, table) = POSTED[id - 1];
            row(tenant, table, &format!("{{\"a\":{id}}}"))
        })
        .collect();
    rows.sort();
    rows
}

/// The JSON lines `weir dlq list` printed, as letters.
fn listed(output: &Output) -> Vec<StoredLetter> {
    stdout_of(output)
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let text = |key: &str| value[key].as_str().unwrap_or_default().to_string();
            StoredLetter {
                sequence: value["sequence"].as_u64().expect("a sequence"),
                stored_at: text("stored_at"),
                tenant: text("tenant"),
                table: text("table"),
                reason: text("reason"),
                plugin: value["plugin"].as_str().map(str::to_string),
                plugin_version: None,
                deliveries: value["deliveries"].as_u64().unwrap_or_default(),
                row_sequence: value["row_sequence"].as_u64().unwrap_or_default(),
                line: value["line"].as_u64(),
                replay_of: value["replay_of"].as_u64(),
                payload: text("payload"),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn list_returns_exactly_the_letters_of_a_tenant_table_reason_time_or_sequence() {
    let mut letters = Letters::start().await;
    letters
        .die(
            crate::support::ACME_KEY,
            "orders",
            "{\"a\":1}\n{\"a\":2}\n",
            2,
        )
        .await;
    letters
        .die(crate::support::ACME_KEY, "refunds", "{\"a\":3}\n", 3)
        .await;
    letters.die(BETA_KEY, "orders", "{\"a\":4}\n", 4).await;
    // The second wave is stored after `boundary` (same clock as the server).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let boundary = OffsetDateTime::now_utc();
    tokio::time::sleep(Duration::from_millis(300)).await;
    letters.die(BETA_KEY, "refunds", "{\"a\":5}\n", 5).await;
    letters
        .die(crate::support::ACME_KEY, "orders", "{\"a\":6}\n", 6)
        .await;

    let all = letters.list(LetterFilter::default()).await;
    assert_eq!(rows(&all), letters_of(&[1, 2, 3, 4, 5, 6]));
    assert!(
        all.windows(2).all(|w| w[0].sequence < w[1].sequence),
        "oldest first"
    );
    let list = |filter: LetterFilter| {
        let letters = &letters;
        async move { letters.list(filter).await }
    };

    let by_tenant = list(LetterFilter {
        tenant: Some("beta".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(rows(&by_tenant), letters_of(&[4, 5]));
    let by_table = list(LetterFilter {
        table: Some("refunds".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(rows(&by_table), letters_of(&[3, 5]));
    assert!(
        by_table.iter().all(|l| l.reason.contains(MISSING_TS)),
        "{by_table:?}"
    );
    let both = list(LetterFilter {
        tenant: Some("acme".into()),
        table: Some("orders".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(rows(&both), letters_of(&[1, 2, 6]));
    let by_reason = list(LetterFilter {
        reason: Some("`id`".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(rows(&by_reason), letters_of(&[1, 2, 4, 6]));
    assert!(by_reason.iter().all(|l| l.reason.contains(MISSING_ID)));
    let since = LetterFilter {
        since: Some(boundary),
        ..Default::default()
    };
    assert_eq!(rows(&list(since.clone()).await), letters_of(&[5, 6]));
    let since_and_reason = LetterFilter {
        reason: Some("`ts`".into()),
        ..since
    };
    assert_eq!(rows(&list(since_and_reason).await), letters_of(&[5]));
    let limited = list(LetterFilter {
        limit: Some(4),
        ..Default::default()
    })
    .await;
    assert_eq!(
        limited.iter().map(|l| l.sequence).collect::<Vec<_>>(),
        all[..4].iter().map(|l| l.sequence).collect::<Vec<_>>(),
        "the oldest 4"
    );
    let limited = list(LetterFilter {
        reason: Some("`id`".into()),
        limit: Some(1),
        ..Default::default()
    })
    .await;
    assert_eq!(limited.len(), 1);
    assert!(limited[0].reason.contains(MISSING_ID));
    let nobody = list(LetterFilter {
        tenant: Some("nobody".into()),
        ..Default::default()
    })
    .await;
    assert!(nobody.is_empty());

    // The binary: short flags, a duration ago, --seq fetched directly.
    let cli = listed(&letters.weir(&["list", "-t", "beta", "-T", "orders"]));
    assert_eq!(rows(&cli), letters_of(&[4]));
    assert_eq!(cli[0].plugin.as_deref(), Some("validate"));
    let cli = listed(&letters.weir(&["list", "--since", "1h", "-r", "`ts`", "-n", "5"]));
    assert_eq!(rows(&cli), letters_of(&[3, 5]));
    let since = boundary.format(&Rfc3339).unwrap();
    let cli = listed(&letters.weir(&["list", "--since", &since]));
    assert_eq!(rows(&cli), letters_of(&[5, 6]));
    let third = all[2].sequence.to_string();
    let fifth = all[4].sequence.to_string();
    let cli = listed(&letters.weir(&["list", "--seq", &fifth, "--seq", &third]));
    assert_eq!(
        cli.iter().map(|l| l.sequence).collect::<Vec<_>>(),
        [all[2].sequence, all[4].sequence]
    );
    assert_eq!(rows(&cli), rows(&[all[2].clone(), all[4].clone()]));
    // A sequence and another filter: the letter only if it also matches.
    let other_tenant = if all[2].tenant == "acme" {
        "beta"
    } else {
        "acme"
    };
    let cli = listed(&letters.weir(&["list", "--seq", &third, "-t", other_tenant]));
    assert!(cli.is_empty(), "{cli:?}");
    let missing = letters.weir(&["list", "--seq", "999"]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("no dead letter 999 in the dead-letter stream `weir_dlq`"),
        "{stderr}"
    );
    let bad_since = letters.weir(&["list", "--since", "yesterday"]);
    assert!(!bad_since.status.success());
    let stderr = String::from_utf8_lossy(&bad_since.stderr);
    assert!(
        stderr.contains("`yesterday` is neither an RFC 3339 time"),
        "{stderr}"
    );
    letters.stop_host().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_dry_run_changes_nothing_and_purge_removes_only_the_matching_letters() {
    let mut letters = Letters::start().await;
    letters
        .die(
            crate::support::ACME_KEY,
            "orders",
            "{\"a\":1}\n{\"a\":2}\n",
            2,
        )
        .await;
    letters
        .die(crate::support::ACME_KEY, "refunds", "{\"a\":3}\n", 3)
        .await;
    letters.die(BETA_KEY, "orders", "{\"a\":4}\n", 4).await;
    letters.die(BETA_KEY, "refunds", "{\"a\":5}\n", 5).await;
    letters.stop_host().await;
    let before = letters.list(LetterFilter::default()).await;

    let dry = stdout_of(&letters.weir(&["purge", "--dry-run", "-T", "orders"]));
    assert!(
        dry.contains("3 dead letters would be purged (dry run: nothing changed)"),
        "{dry}"
    );
    assert_eq!(dry.matches("would purge dead letter").count(), 3, "{dry}");
    // Without a filter a dry run asks nothing: it changes nothing.
    let dry = stdout_of(&letters.weir(&["purge", "--dry-run"]));
    assert!(dry.contains("5 dead letters would be purged"), "{dry}");
    assert_eq!(
        rows(&letters.list(LetterFilter::default()).await),
        rows(&before)
    );

    // By tenant and table: the server purges the subject.
    let done = stdout_of(&letters.weir(&["purge", "-t", "beta", "-T", "orders"]));
    assert!(done.contains("1 dead letters purged"), "{done}");
    // By reason: each letter deleted by its sequence, and named.
    let done = stdout_of(&letters.weir(&["purge", "-t", "acme", "-r", "`ts`"]));
    assert!(done.contains("1 dead letters purged"), "{done}");
    assert!(done.contains("purged dead letter"), "{done}");
    assert!(
        done.contains("(acme/refunds): missing required field `ts`"),
        "{done}"
    );
    assert_eq!(
        rows(&letters.list(LetterFilter::default()).await),
        letters_of(&[1, 2, 5])
    );

    // Without a filter, off a terminal: refused unless --yes.
    let refused = letters.weir(&["purge"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("refusing to purge every dead letter (3) without confirmation"),
        "{stderr}"
    );
    assert_eq!(letters.library.count().await.unwrap(), 3);
    let done = stdout_of(&letters.weir(&["purge", "-y"]));
    assert!(done.contains("3 dead letters purged"), "{done}");
    assert_eq!(letters.library.count().await.unwrap(), 0);
}

/// Replay or purge of every letter is asked about: off a terminal it is
/// refused without `--yes`; on one, only a `y` goes ahead.
#[tokio::test(flavor = "multi_thread")]
async fn replay_without_a_filter_asks_and_off_a_terminal_refuses_unless_told_yes() {
    let mut letters = Letters::start().await;
    letters
        .die(crate::support::ACME_KEY, "orders", "{\"a\":1}\n", 1)
        .await;
    letters.die(BETA_KEY, "refunds", "{\"a\":2}\n", 2).await;
    letters
        .die(crate::support::ACME_KEY, "refunds", "{\"a\":3}\n", 3)
        .await;
    // No host pulls the replayed rows: they stay in the partition stream.
    letters.stop_host().await;
    let client = letters.nats.client().await;
    let stored = || crate::support::stored_rows(&client);
    let queued = stored().await;

    let refused = letters.weir(&["replay"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(
            "refusing to replay every dead letter (3) without confirmation: stdin is not a terminal; pass --yes"
        ),
        "{stderr}"
    );
    // A limit alone still selects from every letter.
    assert!(!letters.weir(&["replay", "-n", "1"]).status.success());
    let dry = stdout_of(&letters.weir(&["replay", "--dry-run"]));
    assert!(dry.contains("3 dead letters would be replayed"), "{dry}");
    assert_eq!(
        letters.library.count().await.unwrap(),
        3,
        "nothing replayed"
    );
    assert_eq!(stored().await, queued);

    // On a terminal: anything but yes replays nothing.
    let declined = letters.weir_on_terminal(&["replay"], "\n");
    assert!(stdout_of(&declined).contains("nothing replayed"));
    let prompt = String::from_utf8_lossy(&declined.stderr);
    assert!(
        prompt.contains("replay all 3 dead letters? [y/N]"),
        "{prompt}"
    );
    assert_eq!(letters.library.count().await.unwrap(), 3);
    let accepted = letters.weir_on_terminal(&["replay", "-n", "1"], "y\n");
    assert!(stdout_of(&accepted).contains("1 dead letter replayed"));
    let prompt = String::from_utf8_lossy(&accepted.stderr);
    assert!(
        prompt.contains("replay the oldest 1 of 3 dead letters? [y/N]"),
        "{prompt}"
    );
    let left = letters.list(LetterFilter::default()).await;
    assert_eq!(
        rows(&left),
        [
            row("acme", "refunds", "{\"a\":3}"),
            row("beta", "refunds", "{\"a\":2}")
        ],
        "the oldest went first"
    );

    // A filter needs no confirmation; --yes replaces it.
    let done = stdout_of(&letters.weir(&["replay", "-t", "beta"]));
    assert!(done.contains("1 dead letter replayed"), "{done}");
    let done = stdout_of(&letters.weir(&["replay", "--yes"]));
    assert!(done.contains("1 dead letter replayed"), "{done}");
    assert_eq!(letters.library.count().await.unwrap(), 0);
    assert_eq!(stored().await, queued + 3, "every row back in its unit");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_stored_in_an_atomic_batch_is_dead_lettered_without_its_batch_headers() {
    let nats = Nats::start();
    // Rows keyed by a field go to their partition as atomic batches, and
    // are stored with the batch's `Nats-Batch-*` headers.
    let text = base_config(nats.url(), EXTRA).replace(
        "max_body_bytes = 1048576",
        "max_body_bytes = 1048576\nidempotency_field = \"id\"",
    );
    let host = TestHost::start(&text).await;
    let body: String = (0..3).map(|id| format!("{{\"id\":{id}}}\n")).collect();
    let response = host.ingest("refunds", body).await;
    assert_eq!(response.status(), 202);
    let client = nats.client().await;
    let letters = eventually(Duration::from_secs(30), "three dead letters", || async {
        let letters = crate::support::read_stream(&client, "weir_dlq").await;
        (letters.len() == 3).then_some(letters)
    })
    .await;
    for letter in &letters {
        let headers = letter.headers.as_ref().expect("a letter has headers");
        let reason = headers
            .get(weir::delivery::headers::REASON)
            .map(|v| v.to_string());
        assert!(
            reason.as_deref().is_some_and(|r| r.contains(MISSING_TS)),
            "{reason:?}"
        );
        let names: Vec<String> = headers.iter().map(|(name, _)| name.to_string()).collect();
        assert!(
            !names
                .iter()
                .any(|name| name.to_ascii_lowercase().starts_with("nats-batch")),
            "{names:?}"
        );
    }
    host.shutdown().await;
}
