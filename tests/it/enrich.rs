//! Enrichment through the `http-batch` interface: the `enrich` plugin
//! looks each row's key up against a local service that answers after
//! 20 ms and counts the requests it holds at once. A batch's lookups go
//! out together, never more than `http_max_in_flight` at a time; a lookup
//! that times out dead-letters its row alone; without `grants.http` every
//! lookup is refused with the documented reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};

use crate::support::{Nats, TestHost, base_config, dead_letter_reasons, eventually, orders};

/// How long the service takes to answer a lookup.
const ANSWER_AFTER: Duration = Duration::from_millis(20);
/// The key the service never answers in time.
const SLOW_KEY: &str = "slow";
/// The key the service answers at once with [`BIG_BYTES`] of JSON.
const BIG_KEY: &str = "big";
const BIG_BYTES: usize = 8 << 20;

/// What the service saw.
#[derive(Default)]
struct Counts {
    /// Requests being answered now.
    now: AtomicUsize,
    /// The most it held at once.
    most: AtomicUsize,
    /// Requests received in all.
    received: AtomicUsize,
}

/// A lookup service on 127.0.0.1: `GET /k/{key}` answers `{"key":…}`
/// after [`ANSWER_AFTER`] ([`SLOW_KEY`] after a minute).
struct Lookup {
    addr: SocketAddr,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Lookup {
    async fn start() -> Lookup {
        let counts = Arc::new(Counts::default());
        let app = axum::Router::new()
            .route("/k/{key}", axum::routing::get(lookup))
            .with_state(counts.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the lookup service");
        let addr = listener.local_addr().expect("lookup address");
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("lookup service serves");
        });
        Lookup { addr, counts, task }
    }

    fn most_at_once(&self) -> usize {
        self.counts.most.load(Ordering::SeqCst)
    }

    fn received(&self) -> usize {
        self.counts.received.load(Ordering::SeqCst)
    }
}

impl Drop for Lookup {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn lookup(State(counts): State<Arc<Counts>>, Path(key): Path<String>) -> String {
    counts.received.fetch_add(1, Ordering::SeqCst);
    if key == BIG_KEY {
        return format!("\"{}\"", "x".repeat(BIG_BYTES));
    }
    let now = counts.now.fetch_add(1, Ordering::SeqCst) + 1;
    counts.most.fetch_max(now, Ordering::SeqCst);
    let wait = if key == SLOW_KEY {
        Duration::from_secs(60)
    } else {
        ANSWER_AFTER
    };
    tokio::time::sleep(wait).await;
    counts.now.fetch_sub(1, Ordering::SeqCst);
    serde_json::json!({ "key": key }).to_string()
}

/// The enrich plugin on table `lookups` into the file sink; `plugin_extra`
/// goes into its plugin table (grants, limits).
fn enrich_pipeline(lookup: &Lookup, timeout_ms: u32, plugin_extra: &str) -> String {
    format!(
        r#"
[plugins.enrich]
wasm = "weir_enrich.wasm"
world = "transform"
settings = {{ url = "http://{addr}/k/{{key}}", key_field = "id", into = "info", timeout_ms = {timeout_ms} }}
{plugin_extra}

[[pipelines]]
tables = ["lookups"]
transforms = ["enrich"]
sink = "files"
"#,
        addr = lookup.addr
    )
}

/// A test's parts: a NATS server, the lookup service, and a host running
/// the enrich plugin on table `lookups`.
struct Enrich {
    nats: Nats,
    lookup: Lookup,
    host: TestHost,
}

/// Starts them: lookups time out after `timeout_ms`; with `granted` the
/// plugin holds `grants.http` for the service; `plugin_extra` goes into
/// its plugin table (limits).
async fn enrich_host(timeout_ms: u32, granted: bool, plugin_extra: &str) -> Enrich {
    let nats = Nats::start();
    let lookup = Lookup::start().await;
    let grant = match granted {
        true => format!("grants.http = [\"{}\"]\n{plugin_extra}", lookup.addr),
        false => plugin_extra.to_string(),
    };
    let extra = enrich_pipeline(&lookup, timeout_ms, &grant);
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;
    Enrich { nats, lookup, host }
}

/// The rows the file sink wrote for `table`, once there are at least `rows`.
async fn sink_rows(host: &TestHost, table: &str, rows: usize, what: &str) -> Vec<String> {
    eventually(Duration::from_secs(60), what, || async {
        let lines = host.sink_lines(table);
        (lines.len() >= rows).then_some(lines)
    })
    .await
}

/// The dead letter of a lookup of `key` at `lookup` that timed out.
fn timed_out(lookup: SocketAddr, key: &str) -> String {
    format!("enrich: lookup of http://{lookup}/k/{key} timed out")
}

/// 256 rows, one lookup each, are enriched concurrently: the service saw
/// more than one request at once, never more than `http_max_in_flight`.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_looks_its_rows_up_at_once_within_max_in_flight() {
    const ROWS: usize = 256;
    const MAX_IN_FLIGHT: usize = 8;
    let Enrich {
        nats: _nats,
        lookup,
        host,
    } = enrich_host(
        1_000,
        true,
        &format!("http_max_in_flight = {MAX_IN_FLIGHT}"),
    )
    .await;

    let started = Instant::now();
    let response = host.ingest("lookups", orders(0, ROWS)).await;
    assert_eq!(response.status(), 202);
    let lines = sink_rows(&host, "lookups", ROWS, "every row enriched").await;
    let elapsed = started.elapsed();

    assert_eq!(lines.len(), ROWS, "{lines:?}");
    for line in &lines {
        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON row");
        let id = row["id"].as_u64().expect("an id");
        assert_eq!(row["info"]["key"], id.to_string(), "{line}");
    }
    let most = lookup.most_at_once();
    println!(
        "enrich: {ROWS} rows, one {} ms lookup each, in {} ms ({} ms one after another); at most {most} lookups at once (http_max_in_flight = {MAX_IN_FLIGHT}); {} requests",
        ANSWER_AFTER.as_millis(),
        elapsed.as_millis(),
        ROWS as u128 * ANSWER_AFTER.as_millis(),
        lookup.received(),
    );
    assert!(most > 1, "the lookups went one at a time");
    assert!(
        most <= MAX_IN_FLIGHT,
        "{most} lookups at once, past http_max_in_flight = {MAX_IN_FLIGHT}"
    );
    host.shutdown().await;
}

/// A lookup past its timeout dead-letters its own row; the batch's other
/// rows are enriched.
#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_that_times_out_dead_letters_only_its_row() {
    let Enrich { nats, lookup, host } = enrich_host(300, true, "").await;

    let mut body = orders(0, 10);
    body.push_str(&format!("{{\"id\":\"{SLOW_KEY}\"}}\n"));
    body.push_str(&orders(10, 10));
    let response = host.ingest("lookups", body).await;
    assert_eq!(response.status(), 202);

    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(reasons, [timed_out(lookup.addr, SLOW_KEY)]);
    let lines = sink_rows(&host, "lookups", 20, "the other rows").await;
    assert_eq!(lines.len(), 20, "{lines:?}");
    assert!(lines.iter().all(|line| line.contains("\"info\":{\"key\":")));
    assert_eq!(dead_letter_reasons(&nats, 1).await.len(), 1);
    let metrics = host.get_text("/metrics").await;
    assert_eq!(http_requests(&metrics, "timeout"), 1, "{metrics}");
    assert!(http_requests(&metrics, "response") >= 20, "{metrics}");
    assert_eq!(http_requests(&metrics, "refused"), 0, "{metrics}");
    host.shutdown().await;
}

/// `weir_plugin_http_requests_total` of plugin `enrich` with `result`.
fn http_requests(metrics: &str, result: &str) -> u64 {
    let prefix =
        format!("weir_plugin_http_requests_total{{plugin=\"enrich\",result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |value| {
            value.trim().parse::<f64>().expect("a counter's value") as u64
        })
}

/// A lookup with no timeout of its own ends with the call's deadline, less
/// the tenth of it left for the plugin to answer: its row alone is
/// dead-lettered, the call does not run past its deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_without_a_timeout_ends_before_the_calls_deadline() {
    let Enrich { nats, lookup, host } = enrich_host(0, true, "deadline = \"1s\"").await;

    let mut body = orders(0, 5);
    body.push_str(&format!("{{\"id\":\"{SLOW_KEY}\"}}\n"));
    assert_eq!(host.ingest("lookups", body).await.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(reasons, [timed_out(lookup.addr, SLOW_KEY)]);
    let lines = sink_rows(&host, "lookups", 5, "the other rows").await;
    assert_eq!(lines.len(), 5, "{lines:?}");
    host.shutdown().await;
}

/// `dedupe` (the enrich plugin's default): rows of a batch with the same
/// key share one lookup, each still enriched.
#[tokio::test(flavor = "multi_thread")]
async fn rows_of_a_batch_with_the_same_key_share_one_lookup() {
    const ROWS: usize = 40;
    let Enrich {
        nats: _nats,
        lookup,
        host,
    } = enrich_host(1_000, true, "").await;

    let body: String = (0..ROWS)
        .map(|n| format!("{{\"id\":\"k{}\",\"n\":{n}}}\n", n % 2))
        .collect();
    assert_eq!(host.ingest("lookups", body).await.status(), 202);
    let lines = sink_rows(&host, "lookups", ROWS, "every row enriched").await;
    for line in &lines {
        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON row");
        assert_eq!(row["info"]["key"], row["id"], "{line}");
    }
    // Two keys: two lookups per batch, however the rows were batched.
    let received = lookup.received();
    println!("enrich: {ROWS} rows over 2 keys took {received} lookups");
    assert!(
        received < ROWS,
        "{received} lookups for {ROWS} rows of 2 keys"
    );
    host.shutdown().await;
}

/// A call's responses together get at most the plugin's memory cap (the
/// host holds no more for it): a larger answer fails its own lookup, and
/// the plugin goes on enriching.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_larger_than_the_plugins_memory_fails_its_lookup_alone() {
    let Enrich { nats, lookup, host } = enrich_host(5_000, true, "memory = \"4MiB\"").await;

    let body = format!("{{\"id\":\"{BIG_KEY}\"}}\n");
    assert_eq!(host.ingest("lookups", body).await.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(
        reasons,
        [format!(
            "enrich: lookup of http://{}/k/{BIG_KEY} failed: the responses of this call are larger than the plugin's memory cap",
            lookup.addr
        )]
    );
    assert_eq!(host.ingest("lookups", orders(0, 3)).await.status(), 202);
    let lines = sink_rows(&host, "lookups", 3, "the next rows").await;
    assert!(
        lines.iter().all(|line| line.contains("\"info\":{\"key\":")),
        "{lines:?}"
    );
    host.shutdown().await;
}

/// Without `grants.http` the plugin loads, and every lookup is refused
/// (never sent) with the reason the interface documents.
#[tokio::test(flavor = "multi_thread")]
async fn without_grants_http_every_lookup_is_refused_and_its_row_dead_lettered() {
    let Enrich { nats, lookup, host } = enrich_host(1_000, false, "").await;

    let response = host.ingest("lookups", orders(0, 3)).await;
    assert_eq!(response.status(), 202);
    let mut reasons = dead_letter_reasons(&nats, 3).await;
    reasons.sort();
    let expected: Vec<String> = (0..3)
        .map(|id| {
            format!(
                "enrich: lookup of http://{addr}/k/{id} refused: `{addr}` is not in plugin `enrich`'s grants.http",
                addr = lookup.addr
            )
        })
        .collect();
    assert_eq!(reasons, expected);
    assert_eq!(lookup.received(), 0, "a refused lookup reached the service");
    assert!(host.sink_lines("lookups").is_empty());
    let metrics = host.get_text("/metrics").await;
    assert_eq!(http_requests(&metrics, "refused"), 3, "{metrics}");
    assert_eq!(http_requests(&metrics, "response"), 0, "{metrics}");
    host.shutdown().await;
}

/// The same enrichment in Python: one `weir.http.fetch_all` per batch.
const ENRICH_PY: &str = r#"import weir_plugin as weir


class Plugin(weir.Transform):
    def init(self, settings):
        self.url = settings["url"]
        self.timeout_ms = settings["timeout_ms"]

    def batch(self, rows):
        urls = [self.url.replace("{key}", str(row.json()["id"])) for row in rows]
        answers = weir.http.fetch_all([weir.http.get(url) for url in urls], timeout_ms=self.timeout_ms)
        outcomes = []
        for row, url, answer in zip(rows, urls, answers):
            if isinstance(answer, weir.HttpError):
                outcomes.append(weir.dead_letter("enrich: lookup of %s %s" % (url, answer)))
            else:
                data = row.json()
                data["info"] = answer.json()
                outcomes.append(weir.emit(data))
        return outcomes


WitWorld = weir.export(Plugin)
"#;

/// The same enrichment in JavaScript: one `http.fetchAll` per batch.
const ENRICH_JS: &str = r#"import * as weir from "./weir/index.js";
import * as http from "./weir/http.js";

export const { init, transform } = weir.transform({
  init(settings) {
    this.url = settings.url;
    this.timeoutMs = settings.timeout_ms;
  },
  batch(rows) {
    const urls = rows.map((row) => this.url.replace("{key}", String(row.json().id)));
    const answers = http.fetchAll(urls.map((url) => http.get(url)), { timeoutMs: this.timeoutMs });
    return rows.map((row, i) => {
      const answer = answers[i];
      if (answer instanceof http.HttpError) return weir.deadLetter(`enrich: lookup of ${urls[i]} ${answer.message}`);
      return weir.emit({ ...row.json(), info: answer.json() });
    });
  },
});
"#;

/// A transform project in `lang` whose code is `code`, built: its `.wasm`.
fn built_enrich(lang: &str, code: &str) -> std::path::PathBuf {
    let name = format!("enrich-batch-{lang}");
    crate::authors::written_project(&name, lang, "transform", code)
}

/// The plugin at `wasm` as plugin and table `name`, looking up at
/// `lookup` (a generous deadline: an interpreter's batch of 256 rows).
fn table_of(
    name: &str,
    wasm: &std::path::Path,
    lookup: &Lookup,
    timeout_ms: u32,
    extra: &str,
) -> String {
    format!(
        r#"
[plugins.{name}]
wasm = "{wasm}"
world = "transform"
deadline = "10s"
settings = {{ url = "http://{addr}/k/{{key}}", timeout_ms = {timeout_ms} }}
{extra}

[[pipelines]]
tables = ["{name}"]
transforms = ["{name}"]
sink = "files"
"#,
        wasm = wasm.display(),
        addr = lookup.addr
    )
}

/// The three enrichment cases for a Python or JS component, in one host:
/// 256 lookups concurrent within `http_max_in_flight`, a timeout
/// dead-lettering its row alone, no grant refusing every lookup.
async fn enrichment_in(lang: &'static str, code: &'static str) {
    const ROWS: usize = 256;
    const MAX_IN_FLIGHT: usize = 8;
    let wasm = tokio::task::spawn_blocking(move || built_enrich(lang, code))
        .await
        .expect("build");
    let (fast, slow, refused) = (
        Lookup::start().await,
        Lookup::start().await,
        Lookup::start().await,
    );
    let mut extra = table_of(
        "fast",
        &wasm,
        &fast,
        1_000,
        &format!(
            "grants.http = [\"{}\"]\nhttp_max_in_flight = {MAX_IN_FLIGHT}",
            fast.addr
        ),
    );
    extra.push_str(&table_of(
        "slow",
        &wasm,
        &slow,
        300,
        &format!("grants.http = [\"{}\"]", slow.addr),
    ));
    extra.push_str(&table_of("refused", &wasm, &refused, 1_000, ""));
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let started = Instant::now();
    assert_eq!(host.ingest("fast", orders(0, ROWS)).await.status(), 202);
    let lines = sink_rows(&host, "fast", ROWS, "every row enriched").await;
    let elapsed = started.elapsed();
    assert_eq!(lines.len(), ROWS);
    for line in &lines {
        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON row");
        let id = row["id"].as_u64().expect("an id");
        assert_eq!(row["info"]["key"], id.to_string(), "{lang}: {line}");
    }
    let most = fast.most_at_once();
    println!(
        "enrich ({lang}): {ROWS} rows, one {} ms lookup each, in {} ms ({} ms one after another); at most {most} lookups at once (http_max_in_flight = {MAX_IN_FLIGHT})",
        ANSWER_AFTER.as_millis(),
        elapsed.as_millis(),
        ROWS as u128 * ANSWER_AFTER.as_millis(),
    );
    assert!(most > 1, "{lang}: the lookups went one at a time");
    assert!(most <= MAX_IN_FLIGHT, "{lang}: {most} lookups at once");

    let mut body = orders(0, 10);
    body.push_str(&format!("{{\"id\":\"{SLOW_KEY}\"}}\n"));
    assert_eq!(host.ingest("slow", body).await.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(reasons, [timed_out(slow.addr, SLOW_KEY)], "{lang}");
    sink_rows(&host, "slow", 10, "the other rows").await;

    assert_eq!(host.ingest("refused", orders(0, 2)).await.status(), 202);
    let mut reasons: Vec<String> = dead_letter_reasons(&nats, 3)
        .await
        .into_iter()
        .filter(|reason| reason.contains(&refused.addr.to_string()))
        .collect();
    reasons.sort();
    let expected: Vec<String> = (0..2)
        .map(|id| {
            format!(
                "enrich: lookup of http://{addr}/k/{id} refused: `{addr}` is not in plugin `refused`'s grants.http",
                addr = refused.addr
            )
        })
        .collect();
    assert_eq!(reasons, expected, "{lang}");
    assert_eq!(refused.received(), 0, "{lang}: a refused lookup was sent");
    assert_eq!(host.sink_lines("slow").len(), 10, "{lang}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_transform_looks_its_rows_up_at_once_within_its_grant() {
    enrichment_in("python", ENRICH_PY).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_js_transform_looks_its_rows_up_at_once_within_its_grant() {
    enrichment_in("js", ENRICH_JS).await;
}
