//! Plugin authors: `weir plugin new` projects in Rust, Python and
//! JavaScript build outside the repository, pass their own test, and give
//! the same outcomes on the same fixture rows in `weir plugin test` (no
//! NATS) and in a real host; a Python
//! exception dead-letters its row naming itself and its line; a JS error in
//! `init` refuses the plugin with its message.
//!
//! The Python and JS builds need componentize-py on PATH and
//! componentize-js under WEIR_COMPONENTIZE_JS: `.ci/setup` installs both.
//! Each project is built once per test run (a componentize build takes
//! 10–60 s) into a temp dir outside the repository, and the tests of what
//! an author's code does in a host share one plugin per language
//! ([`PYTHON_APP`], [`JS_PLUGIN`]), which their settings steer: a build
//! less is a minute less of the suite.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use weir::host::StartError;
use weir::sandbox::LoadError;

use crate::support::{
    Nats, TestHost, WEIR, base_config, built_for_0_2_0, dead_letter_reasons, eventually,
    start_error,
};

/// Where projects are written and built: outside the repository, for the run.
fn workspace() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
}

/// `weir plugin new NAME --lang LANG --dir …`, its project's folder.
fn scaffold(name: &str, lang: &str, world: &str) -> PathBuf {
    let dir = workspace().join(name);
    let output = Command::new(WEIR)
        .args([
            "plugin", "new", name, "--lang", lang, "--world", world, "--dir",
        ])
        .arg(&dir)
        .output()
        .expect("weir runs");
    assert!(
        output.status.success(),
        "weir plugin new {name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}

/// Runs `script` (`./build.sh`, `./test.sh`) in `dir`, panicking with its
/// output when it fails.
fn run_script(dir: &Path, script: &str) -> String {
    run_script_with(dir, script, &[])
}

/// [`run_script`] with `envs` set for the script.
fn run_script_with(dir: &Path, script: &str, envs: &[(&str, &str)]) -> String {
    let mut command = Command::new(dir.join(script));
    command.current_dir(dir);
    // Rust projects share one target folder, so that every run after the
    // first builds only the plugin itself.
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/authors");
    command.env("CARGO_TARGET_DIR", target);
    command.env("CARGO_NET_OFFLINE", "true");
    command.envs(envs.iter().copied());
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{script} in {}: {e}", dir.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{script} in {} failed ({}). Did `. .ci/setup` run?\n{text}",
        dir.display(),
        output.status
    );
    text
}

/// `./build.sh` in `dir` without JS ahead-of-time compilation
/// (`WEIR_JS_AOT=0`, which Python's build ignores): about 20 s less per
/// build, and nothing these tests check depends on it. The scaffold test
/// ([`built_transform`]) builds with it, as a user's project does.
fn build_plain(dir: &Path) {
    run_script_with(dir, "build.sh", &[("WEIR_JS_AOT", "0")]);
}

/// The `.wasm` of project `name`, built by `build` once per run: every
/// test asking for `name` gets that build (a componentize build takes
/// 10–60 s).
fn built_once(name: &str, build: impl FnOnce() -> PathBuf) -> PathBuf {
    static BUILT: OnceLock<Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    // One build at a time: they are CPU-bound, and two at once only race.
    let mut built = built
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(wasm) = built.get(name) {
        return wasm.clone();
    }
    let wasm = build();
    assert!(wasm.is_file(), "{} was not built", wasm.display());
    built.insert(name.to_string(), wasm.clone());
    wasm
}

/// The file of a `lang` scaffold (Python or JS) that holds the plugin's code.
fn code_file(lang: &str) -> &'static str {
    if lang == "python" {
        "app.py"
    } else {
        "plugin.js"
    }
}

/// Project `name` of the `lang` scaffold for `world`, with `code` as its
/// [`code_file`], built once per run ([`build_plain`]): its `.wasm`.
pub(crate) fn written_project(name: &str, lang: &str, world: &str, code: &str) -> PathBuf {
    built_once(name, || {
        let dir = scaffold(name, lang, world);
        std::fs::write(dir.join(code_file(lang)), code).expect("write the plugin's code");
        build_plain(&dir);
        dir.join(format!("{name}.wasm"))
    })
}

/// The transform scaffold of `lang`, tested and built once per run: its `.wasm`.
fn built_transform(lang: &'static str) -> PathBuf {
    let name = format!("enrich-{lang}");
    built_once(&name, || {
        let dir = scaffold(&name, lang, "transform");
        run_script(&dir, "test.sh");
        run_script(&dir, "build.sh");
        dir.join(format!("{name}.wasm"))
    })
}

/// A transform plugin `name` at `wasm` in a pipeline of table `name` into the file sink.
fn pipeline(name: &str, wasm: &Path) -> String {
    format!(
        "\n[plugins.{name}]\nwasm = \"{}\"\nworld = \"transform\"\n\n\
         [[pipelines]]\ntables = [\"{name}\"]\ntransforms = [\"{name}\"]\nsink = \"files\"\n",
        wasm.display()
    )
}

/// `pipeline` with `lines` (settings, grants) added to its plugin's table.
fn with_settings(pipeline: String, lines: &str) -> String {
    pipeline.replacen(
        "world = \"transform\"\n",
        &format!("world = \"transform\"\n{lines}\n"),
        1,
    )
}

const ROWS: &str = include_str!("../../host/templates/fixtures/rows.ndjson");
const EXPECTED: &str = include_str!("../../host/templates/fixtures/transform.expected.ndjson");

/// What the sink should hold and what the dead-letter stream should say
/// for the fixture rows, from the expected outcomes.
fn expected() -> (Vec<String>, Vec<String>) {
    let (mut lines, mut reasons) = (Vec::new(), Vec::new());
    for (row, outcome) in ROWS.lines().zip(EXPECTED.lines()) {
        let outcome: serde_json::Value = serde_json::from_str(outcome).expect("expected JSON");
        match outcome["outcome"].as_str() {
            Some("ok") => lines.push(row.to_string()),
            Some("emit") => lines.extend(
                outcome["rows"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|row| row["payload"].as_str().unwrap_or_default().to_string()),
            ),
            Some("dead_letter") => {
                reasons.push(outcome["reason"].as_str().unwrap_or_default().to_string())
            }
            _ => {}
        }
    }
    (lines, reasons)
}

/// The rows of `weir plugin test --json` for `wasm` on `rows`, written to
/// `file` in the workspace: one report per row, emitted JSON payloads
/// parsed.
fn plugin_test_rows(wasm: &Path, file: &str, rows: &str) -> Vec<serde_json::Value> {
    let path = workspace().join(file);
    std::fs::write(&path, rows).expect("write the rows");
    // The tests' compiled cache: a host started after loads what this compiled.
    let output = Command::new(WEIR)
        .args(["plugin", "test", "--json", "--rows"])
        .arg(&path)
        .arg(wasm)
        .env("WEIR_CACHE_DIR", crate::support::compile_cache_dir())
        .env_remove("WEIR_LOG")
        .output()
        .expect("weir runs");
    assert!(
        output.status.success(),
        "weir plugin test {}: {}",
        wasm.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("weir plugin test --json prints JSON");
    report["rows"].as_array().cloned().unwrap_or_default()
}

/// Each row's outcome as `weir plugin test --json` reports it, in the
/// fixture's shape (emitted payloads parsed, so key order does not matter).
fn plugin_test_outcomes(wasm: &Path) -> Vec<serde_json::Value> {
    plugin_test_rows(wasm, "fixture-rows.ndjson", ROWS)
        .into_iter()
        .map(|row| match row["outcome"].as_str() {
            Some("emit") => serde_json::json!({
                "outcome": "emit",
                "rows": row["emitted"].as_array().into_iter().flatten()
                    .map(|out| serde_json::json!({ "payload": out["payload"] }))
                    .collect::<Vec<_>>(),
            }),
            _ => {
                let mut row = row;
                if let Some(fields) = row.as_object_mut() {
                    fields.remove("line");
                }
                row
            }
        })
        .collect()
}

/// The fixture's expected outcomes, emitted payloads parsed.
fn expected_outcomes() -> Vec<serde_json::Value> {
    EXPECTED
        .lines()
        .map(|line| {
            let mut outcome: serde_json::Value = serde_json::from_str(line).expect("expected JSON");
            let emitted = outcome
                .get_mut("rows")
                .and_then(serde_json::Value::as_array_mut);
            for row in emitted.into_iter().flatten() {
                let payload = row["payload"].as_str().unwrap_or_default();
                row["payload"] = serde_json::from_str(payload).expect("a JSON payload");
            }
            outcome
        })
        .collect()
}

/// Each transform of `plugins` (a name, which is also its table, its
/// `.wasm` and its pipeline's sink) gives the fixture's expected outcomes
/// in `weir plugin test` (no NATS) and then in one host, whose config ends
/// with `sinks`: the same rows in the sink, the same dead letters.
async fn give_the_fixtures_outcomes(plugins: Vec<(String, PathBuf, &str)>, sinks: &str) {
    let mut extra = sinks.to_string();
    for (name, wasm, sink) in &plugins {
        let outcomes = tokio::task::spawn_blocking({
            let wasm = wasm.clone();
            move || plugin_test_outcomes(&wasm)
        })
        .await
        .expect("weir plugin test");
        assert_eq!(outcomes, expected_outcomes(), "{name}: weir plugin test");
        extra.push_str(
            &pipeline(name, wasm).replace("sink = \"files\"", &format!("sink = \"{sink}\"")),
        );
    }
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;
    let (lines, reasons) = expected();
    for (name, _, _) in &plugins {
        let response = host.ingest(name, ROWS).await;
        assert_eq!(
            response.status(),
            202,
            "{name}: {:?}",
            response.text().await
        );
        let got = eventually(Duration::from_secs(30), "the emitted rows", || async {
            let got = host.sink_lines(name);
            (got.len() >= lines.len()).then_some(got)
        })
        .await;
        assert_eq!(got, lines, "{name}: the rows in the sink");
    }
    let mut got = dead_letter_reasons(&nats, reasons.len() * plugins.len()).await;
    got.sort();
    let mut want: Vec<String> = plugins.iter().flat_map(|_| reasons.clone()).collect();
    want.sort();
    assert_eq!(got, want, "one dead letter per plugin, with its reason");
    host.shutdown().await;
}

/// A new scaffold in each language, and the same scaffold as built for the
/// previous world version (0.2.0) before an upgrade, into the file sink as
/// built for 0.2.0 too: all six give the fixture's outcomes, so a 0.2.0
/// build runs as its rebuild does.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_transform_and_its_0_2_0_build_in_each_language_give_the_expected_outcomes() {
    let old_sink = format!(
        "\n[plugins.files_v0_2_0]\nwasm = \"{}\"\nworld = \"sink\"\n\
         grants.dirs = [{{ host = \"out\", guest = \"/out\", writable = true }}]\n",
        built_for_0_2_0("sink-rust").display()
    );
    let mut plugins = Vec::new();
    for lang in ["rust", "python", "js"] {
        let wasm = tokio::task::spawn_blocking(move || built_transform(lang))
            .await
            .expect("build");
        plugins.push((lang.to_string(), wasm, "files"));
        let old = built_for_0_2_0(&format!("transform-{lang}"));
        plugins.push((format!("{lang}_v0_2_0"), old, "files_v0_2_0"));
    }
    give_the_fixtures_outcomes(plugins, &old_sink).await;
}

/// `weir plugin test WASM --rows FILE --expect FILE` in `dir`: its exit
/// code and stdout.
fn plugin_test_expect(dir: &Path, wasm: &Path, expected: &str) -> (Option<i32>, String) {
    let output = Command::new(WEIR)
        .args([
            "plugin",
            "test",
            "--rows",
            "rows.ndjson",
            "--expect",
            expected,
        ])
        .arg(wasm)
        .current_dir(dir)
        .env("WEIR_CACHE_DIR", crate::support::compile_cache_dir())
        .env_remove("WEIR_LOG")
        .output()
        .expect("weir runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// The scaffold's expected outcomes with each emitted payload's keys in
/// reverse order and written with spaces: the same outcomes as JSON.
fn reordered(expected: &str) -> String {
    let mut out = String::new();
    for line in expected.lines().filter(|line| !line.trim().is_empty()) {
        let mut outcome: serde_json::Value = serde_json::from_str(line).expect("expected JSON");
        let emitted = outcome
            .get_mut("rows")
            .and_then(serde_json::Value::as_array_mut);
        for row in emitted.into_iter().flatten() {
            let payload: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(row["payload"].as_str().unwrap_or_default())
                    .expect("a JSON object payload");
            let fields: Vec<String> = payload
                .iter()
                .rev()
                .map(|(key, value)| format!("{key:?}: {value}"))
                .collect();
            row["payload"] = format!("{{ {} }}", fields.join(", ")).into();
        }
        out.push_str(&format!("{outcome}\n"));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_test_expect_passes_each_scaffold_and_names_a_changed_outcome() {
    for lang in ["rust", "python", "js"] {
        tokio::task::spawn_blocking(move || {
            let wasm = built_transform(lang);
            let dir = wasm.parent().expect("the project folder").to_path_buf();
            let (code, stdout) = plugin_test_expect(&dir, &wasm, "expected.ndjson");
            assert_eq!(code, Some(0), "{lang}: {stdout}");
            assert!(stdout.contains("every row as expected"), "{lang}: {stdout}");

            // Key order and spacing are not differences, for weir and for
            // the project's own test.sh alike.
            let expected = std::fs::read_to_string(dir.join("expected.ndjson")).expect("read");
            std::fs::write(dir.join("expected.ndjson"), reordered(&expected)).expect("write");
            let (code, stdout) = plugin_test_expect(&dir, &wasm, "expected.ndjson");
            assert_eq!(code, Some(0), "{lang}, keys reordered: {stdout}");
            run_script(&dir, "test.sh");

            // One changed outcome: exit code 7 and the line and field said.
            let changed = expected.replacen("missing id", "no id", 1);
            std::fs::write(dir.join("changed.ndjson"), changed).expect("write");
            let (code, stdout) = plugin_test_expect(&dir, &wasm, "changed.ndjson");
            assert_eq!(code, Some(7), "{lang}: {stdout}");
            assert!(
                stdout.contains("line 2: reason: got \"missing id\", expected \"no id\""),
                "{lang}: {stdout}"
            );
            std::fs::copy(dir.join("changed.ndjson"), dir.join("expected.ndjson")).expect("copy");
            let mut test = Command::new(dir.join("test.sh"));
            test.current_dir(&dir)
                .env(
                    "CARGO_TARGET_DIR",
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/authors"),
                )
                .env("CARGO_NET_OFFLINE", "true");
            let output = test.output().expect("test.sh runs");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                !output.status.success(),
                "{lang}: test.sh passed a changed outcome"
            );
            assert!(
                text.contains("line 2"),
                "{lang}: test.sh names the line: {text}"
            );
            std::fs::write(dir.join("expected.ndjson"), expected).expect("restore");
        })
        .await
        .expect("the scaffold's checks");
    }
}

/// One Python transform for the tests that check what an author's code
/// does in a host (each build takes ~40 s): its settings' `mode` picks
/// what `row` does. `keys` indexes a missing key; `count` counts rows per
/// user in durable state; by default (`weir plugin test` passes no
/// settings) it reads and sets fields through the row: what it read, the
/// row it emits (set fields spliced into the payload) and the row's
/// `json()` afterwards. Line numbers are in the tests' expected reasons.
const PYTHON_APP: &str = r#"import weir_plugin as weir


class Plugin(weir.Transform):
    def init(self, settings):
        self.mode = settings.get("mode", "fields")

    def row(self, row):
        return getattr(self, self.mode)(row)

    def keys(self, row):
        data = row.json()
        data["seen"] = data["id"]
        return weir.emit(data)

    def count(self, row):
        user = row.json()["user"]
        seen = int(weir.state.get(row, user) or b"0") + 1
        weir.state.set(row, user, str(seen))
        return weir.emit({"user": user, "seen": seen})

    def fields(self, row):
        read = [row.get("s"), "n" in row, row.get("n"), row.get("f"), row.get("t"),
                row.get("z", "absent"), row.get("missing", "dflt")]
        nested = row.get("o")
        if isinstance(nested, dict):
            nested["added"] = 1
        elif isinstance(nested, list):
            nested.append("added")
        row["n"] = 42
        row["new"] = "é\n"
        first = weir.Out(row)
        return weir.emit(first, {"read": read, "json": row.json()})


WitWorld = weir.export(Plugin)
"#;

/// [`PYTHON_APP`], built once per run.
fn python_app() -> PathBuf {
    written_project("app-python", "python", "transform", PYTHON_APP)
}

/// One JS transform for the same tests: `init` throws an Error when its
/// settings say `boom`; with `mode = "count"` it counts rows per user in
/// durable state, else its `row` reads `user.name`, which throws on rows
/// without a `user`.
const JS_PLUGIN: &str = r#"import * as weir from "./weir/index.js";
import * as state from "./weir/state.js";

let counting = false;

export const { init, transform } = weir.transform({
  init(settings) {
    if (settings.boom) throw new Error("boom");
    counting = settings.mode === "count";
  },
  row(row) {
    const data = row.json();
    if (!counting) return weir.emit({ id: data.id, name: data.user.name });
    const seen = Number(state.getText(row, data.user) ?? "0") + 1;
    state.set(row, data.user, String(seen));
    return weir.emit({ user: data.user, seen });
  },
});
"#;

/// [`JS_PLUGIN`], built once per run.
fn js_plugin() -> PathBuf {
    written_project("plugin-js", "js", "transform", JS_PLUGIN)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_exception_dead_letters_its_row_naming_it_and_its_line() {
    let wasm = tokio::task::spawn_blocking(python_app)
        .await
        .expect("build");
    let nats = Nats::start();
    let config = with_settings(pipeline("keys", &wasm), "settings = { mode = \"keys\" }");
    let host = TestHost::start(&base_config(nats.url(), &config)).await;
    let response = host.ingest("keys", "{\"id\":1}\n{\"no\":2}\n").await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(reasons, vec!["KeyError: 'id' (app.py line 13)"]);
    let lines = eventually(Duration::from_secs(30), "the good row", || async {
        let lines = host.sink_lines("keys");
        (!lines.is_empty()).then_some(lines)
    })
    .await;
    assert_eq!(
        lines,
        vec!["{\"id\":1,\"seen\":1}"],
        "the other row of the batch went on"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_plugin_keeps_state_across_batches_and_a_limit_dead_letters_its_row() {
    keeps_state_and_dead_letters_past_its_limit(python_app, "app.py line 19").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_js_plugin_keeps_state_across_batches_and_a_limit_dead_letters_its_row() {
    keeps_state_and_dead_letters_past_its_limit(js_plugin, "plugin.js line 15").await;
}

/// A plugin `built` counting in its `count` mode, granted two keys:
/// counts carry over from one batch to the next, and the third user's
/// write dead-letters its row, the reason naming `place`.
async fn keeps_state_and_dead_letters_past_its_limit(built: fn() -> PathBuf, place: &str) {
    let wasm = tokio::task::spawn_blocking(built).await.expect("build");
    let nats = Nats::start();
    let config = with_settings(
        pipeline("counts", &wasm),
        "settings = { mode = \"count\" }\ngrants.state = { max_keys = 2 }",
    );
    let host = TestHost::start(&base_config(nats.url(), &config)).await;
    let rows = |users: &[&str]| {
        users
            .iter()
            .map(|user| format!("{{\"user\":\"{user}\"}}\n"))
            .collect::<String>()
    };
    let sunk = |count: usize| {
        let host = &host;
        eventually(
            Duration::from_secs(30),
            "the counted rows",
            move || async move {
                let lines = host.sink_lines("counts");
                (lines.len() >= count).then_some(lines)
            },
        )
    };
    assert_eq!(
        host.ingest("counts", rows(&["a", "a", "b"])).await.status(),
        202
    );
    sunk(3).await;
    // The next batch reads what the last one stored; a third user is one
    // key too many.
    assert_eq!(host.ingest("counts", rows(&["a", "c"])).await.status(), 202);
    let lines = sunk(4).await;
    assert_eq!(
        lines,
        [
            "{\"user\":\"a\",\"seen\":1}",
            "{\"user\":\"a\",\"seen\":2}",
            "{\"user\":\"b\",\"seen\":1}",
            "{\"user\":\"a\",\"seen\":3}",
        ]
    );
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(
        reasons,
        [format!(
            "StateError: the state is full: grants.state.max_keys is 2 keys ({place})"
        )]
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_js_error_refuses_the_plugin_in_init_and_dead_letters_its_row_in_row() {
    let wasm = tokio::task::spawn_blocking(js_plugin).await.expect("build");
    let nats = Nats::start();
    let refused = with_settings(pipeline("thrower", &wasm), "settings = { boom = true }");
    let err = start_error(&base_config(nats.url(), &refused)).await;
    assert!(
        matches!(err, StartError::Plugin(LoadError::Init { .. })),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("init refused its settings: boom"),
        "{message}"
    );
    assert_eq!(message.matches("boom").count(), 1, "said once: {message}");

    let host = TestHost::start(&base_config(nats.url(), &pipeline("thrower", &wasm))).await;
    let response = host
        .ingest(
            "thrower",
            "{\"id\":1,\"user\":{\"name\":\"ann\"}}\n{\"id\":2}\n",
        )
        .await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].starts_with("TypeError: ") && reasons[0].ends_with(" (plugin.js line 13)"),
        "{reasons:?}"
    );
    let lines = eventually(Duration::from_secs(30), "the good row", || async {
        let lines = host.sink_lines("thrower");
        (!lines.is_empty()).then_some(lines)
    })
    .await;
    assert_eq!(lines, vec!["{\"id\":1,\"name\":\"ann\"}"]);
    host.shutdown().await;
}

/// A Python sink POSTing each batch through `wasi:http` (the bindings
/// componentize-py generates for `sink-http`), one request per batch;
/// a failed request dead-letters the batch with its error code.
const HTTP_SINK_APP: &str = r#"import weir_plugin as weir
from wit_world.imports import outgoing_handler, wasi_http_types as types
from componentize_py_types import Err


def post(authority, body):
    headers = types.Fields.from_list([
        ("content-type", b"application/x-ndjson"),
        ("content-length", str(len(body)).encode()),
    ])
    request = types.OutgoingRequest(headers)
    request.set_method(types.Method_Post())
    request.set_scheme(types.Scheme_Http())
    request.set_authority(authority)
    request.set_path_with_query("/ingest")
    outgoing = request.body()
    future = outgoing_handler.handle(request, None)
    try:
        with outgoing.write() as stream:
            for start in range(0, len(body), 4096):
                stream.blocking_write_and_flush(body[start:start + 4096])
        types.OutgoingBody.finish(outgoing, None)
    except Err:
        pass  # a refused request closes its body: the response says why
    with future.subscribe() as ready:
        ready.block()
    answer = future.get().value
    if isinstance(answer, Err):
        raise RuntimeError(repr(answer.value))
    return answer.value.status()


class Plugin(weir.Sink):
    def init(self, settings):
        self.authority = settings["authority"]

    def batch(self, rows):
        body = b"".join(row.payload + b"\n" for row in rows)
        try:
            status = post(self.authority, body)
        except Exception as error:
            return [weir.dead_letter("HTTP request failed: %r" % (error,)) for _ in rows]
        if status >= 300:
            return [weir.retry(100) for _ in rows]
        return [weir.ok() for _ in rows]


WitWorld = weir.export(Plugin)
"#;

/// The same sink in JavaScript, on the `wasi:http` imports as componentize-js
/// binds them (synchronous: `fetch` would return a promise weir never awaits).
const HTTP_SINK_JS: &str = r#"import * as weir from "./weir/index.js";
import { handle } from "wasi:http/outgoing-handler@0.2.12";
import { Fields, OutgoingRequest, OutgoingBody } from "wasi:http/types@0.2.12";

const encoder = new TextEncoder();

function post(authority, body) {
  const request = new OutgoingRequest(Fields.fromList([
    ["content-type", encoder.encode("application/x-ndjson")],
    ["content-length", encoder.encode(String(body.length))],
  ]));
  request.setMethod({ tag: "post" });
  request.setScheme({ tag: "HTTP" });
  request.setAuthority(authority);
  request.setPathWithQuery("/ingest");
  const outgoing = request.body();
  const future = handle(request, undefined);
  try {
    const stream = outgoing.write();
    for (let start = 0; start < body.length; start += 4096) {
      stream.blockingWriteAndFlush(body.subarray(start, start + 4096));
    }
    stream[Symbol.dispose]();
    OutgoingBody.finish(outgoing, undefined);
  } catch {
    // A refused request closes its body: the response says why.
  }
  future.subscribe().block();
  const answer = future.get();
  if (answer.tag === "err") throw new Error("the response was taken already");
  if (answer.val.tag === "err") throw new Error(JSON.stringify(answer.val.val));
  return answer.val.val.status();
}

export const { init, deliver } = weir.sink({
  init(settings) {
    this.authority = settings.authority;
  },
  batch(rows) {
    const body = encoder.encode(rows.map((row) => row.text() + "\n").join(""));
    let status;
    try {
      status = post(this.authority, body);
    } catch (error) {
      return rows.map(() => weir.deadLetter(`HTTP request failed: ${error.message ?? error}`));
    }
    if (status >= 300) return rows.map(() => weir.retry(100));
    return rows.map(() => weir.ok());
  },
});
"#;

/// A sink project in `lang` whose code is `code`, built for `sink-http`
/// with weir's `plugins/wasi-http` WIT: its `.wasm`.
fn built_http_sink(lang: &str, code: &str) -> PathBuf {
    let name = format!("http-{lang}");
    let dir = scaffold(&name, lang, "sink");
    let (from, to) = match lang {
        "python" => ("-w sink ", "-w sink-http "),
        _ => ("-n sink -d http fetch-event", "-n sink-http"),
    };
    std::fs::write(dir.join(code_file(lang)), code).expect("write the plugin's code");
    let build = std::fs::read_to_string(dir.join("build.sh")).expect("build.sh");
    assert!(build.contains(from), "{lang} build.sh: {build}");
    std::fs::write(dir.join("build.sh"), build.replace(from, to)).expect("build.sh");
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/wasi-http");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(wit.join("http.wit"))
        .arg(wit.join("deps"))
        .arg(dir.join("wit"))
        .status()
        .expect("cp runs");
    assert!(copied.success(), "copy {}", wit.display());
    build_plain(&dir);
    let wasm = dir.join(format!("{name}.wasm"));
    assert!(wasm.is_file(), "{} was not built", wasm.display());
    wasm
}

/// An endpoint on 127.0.0.1 answering 200 to every POST, keeping the bodies.
async fn recording_endpoint() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new()
        .route(
            "/ingest",
            axum::routing::post(
                |axum::extract::State(bodies): axum::extract::State<Arc<Mutex<Vec<String>>>>,
                 body: String| async move {
                    bodies.lock().unwrap().push(body);
                    "ok"
                },
            ),
        )
        .with_state(bodies.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the endpoint");
    let addr = listener.local_addr().expect("endpoint address");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("endpoint serves");
    });
    (addr, bodies)
}

/// A Python or JS sink reaches a granted endpoint through `wasi:http`, and
/// the same component without `grants.http` is refused every request.
async fn an_http_sink_posts_through_its_grant_and_is_refused_without(lang: &'static str) {
    let code = if lang == "python" {
        HTTP_SINK_APP
    } else {
        HTTP_SINK_JS
    };
    let wasm = tokio::task::spawn_blocking(move || built_http_sink(lang, code))
        .await
        .expect("build");
    let (addr, bodies) = recording_endpoint().await;
    let mut extra = String::new();
    for (table, grant) in [
        ("granted", format!("grants.http = [\"{addr}\"]\n")),
        ("ungranted", String::new()),
    ] {
        extra.push_str(&format!(
            "\n[plugins.{table}]\nwasm = \"{}\"\nworld = \"sink\"\nsettings = {{ authority = \"{addr}\" }}\n{grant}\n\
             [[pipelines]]\ntables = [\"{table}\"]\nsink = \"{table}\"\n",
            wasm.display()
        ));
    }
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;
    let lines: Vec<&str> = ROWS
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    for table in ["granted", "ungranted"] {
        let response = host.ingest(table, ROWS).await;
        assert_eq!(response.status(), 202, "{lang} {table}");
    }
    let got = eventually(Duration::from_secs(30), "the rows posted", || async {
        let got: Vec<String> = bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|body| body.lines().map(str::to_string).collect::<Vec<_>>())
            .collect();
        (got.len() >= lines.len()).then_some(got)
    })
    .await;
    assert_eq!(got, lines, "{lang}: the rows the endpoint received");
    let reasons = dead_letter_reasons(&nats, lines.len()).await;
    assert_eq!(reasons.len(), lines.len(), "{lang}: {reasons:?}");
    for reason in &reasons {
        let plain: String = reason
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect::<String>()
            .to_ascii_lowercase();
        assert!(
            reason.contains("HTTP request failed") && plain.contains("httprequestdenied"),
            "{lang}: {reason}"
        );
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sink_posts_through_its_http_grant_and_is_refused_without() {
    an_http_sink_posts_through_its_grant_and_is_refused_without("python").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_js_sink_posts_through_its_http_grant_and_is_refused_without() {
    an_http_sink_posts_through_its_grant_and_is_refused_without("js").await;
}

/// Rows whose fields sit in every way JSON allows: escapes, spaces around
/// tokens, an empty object, a repeated name, nested values, non-ASCII text.
const FIELDS_ROWS: &str = r#"{"s":"plain","n":1,"f":1.5,"t":true,"z":null,"o":{"k":[1,2]}}
{ "s" : "esc\"aped \u00e9" , "n" : -7 , "f" : 1e3 , "t" : false }
{}
{"n":1,"n":2,"s":"twice"}
{"s":"é ünïcode","o":[1,{"a":2}],"x":"\ud83d\ude00"}
"#;

/// What [`PYTHON_APP`] must answer by default for `row`, worked out from the row parsed whole.
fn fields_expected(row: &str) -> serde_json::Value {
    let mut data: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(row).expect("a fixture row");
    let field = |name: &str| data.get(name).cloned().unwrap_or(serde_json::Value::Null);
    let read = serde_json::json!([
        field("s"),
        data.contains_key("n"),
        field("n"),
        field("f"),
        field("t"),
        data.get("z")
            .cloned()
            .unwrap_or(serde_json::json!("absent")),
        "dflt",
    ]);
    match data.get_mut("o") {
        Some(serde_json::Value::Object(nested)) => {
            nested.insert("added".into(), serde_json::json!(1));
        }
        Some(serde_json::Value::Array(nested)) => nested.push(serde_json::json!("added")),
        _ => {}
    }
    data.insert("n".into(), serde_json::json!(42));
    data.insert("new".into(), serde_json::json!("é\n"));
    let edited = serde_json::Value::Object(data);
    serde_json::json!([edited.clone(), { "read": read, "json": edited }])
}

#[tokio::test(flavor = "multi_thread")]
async fn python_fields_read_and_set_through_the_row_answer_as_the_row_parsed_whole() {
    let wasm = tokio::task::spawn_blocking(python_app)
        .await
        .expect("build");
    let answered = plugin_test_rows(&wasm, "fields-rows.ndjson", FIELDS_ROWS);
    assert_eq!(answered.len(), FIELDS_ROWS.lines().count(), "{answered:?}");
    for (row, answer) in FIELDS_ROWS.lines().zip(&answered) {
        assert_eq!(answer["outcome"], "emit", "{row}: {answer}");
        let emitted: Vec<serde_json::Value> = answer["emitted"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|out| out["payload"].clone())
            .collect();
        assert_eq!(
            serde_json::Value::Array(emitted),
            fields_expected(row),
            "{row}"
        );
    }
}
