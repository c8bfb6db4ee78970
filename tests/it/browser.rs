//! The live page at `/` (issue #21): its JSON and login over plain HTTP,
//! and the page itself in a real headless Chromium, driven over the Chrome
//! DevTools Protocol, while a fleet of two `weir` processes loses one.
//!
//! Chromium comes from Debian's `chromium` package (`. .ci/setup` installs
//! it when missing); without it the browser test fails, naming what to do.
//! Screenshots land in `target/browser-artifacts/`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{ACME_KEY, Host, Nats, TestHost, base_config, eventually};

const ADMIN_KEY: &str = "admin-key-page-21";
const PARTITIONS: u32 = 2;
const SHARDS: u32 = 4;
/// Short, so a killed member's units move within seconds.
const MEMBER_TTL_SECS: u64 = 3;

/// The base config with an admin key, over `PARTITIONS` × `SHARDS` units,
/// as member `id`.
fn page_config(nats_url: &str, id: &str) -> String {
    base_config(
        nats_url,
        &format!("\n[coordination]\nhost_id = \"{id}\"\nmember_ttl_secs = {MEMBER_TTL_SECS}\n"),
    )
    .replace(
        "max_body_bytes = 1048576\n",
        &format!("max_body_bytes = 1048576\nadmin_api_keys = [\"{ADMIN_KEY}\"]\n"),
    )
    .replace(
        "[stream]\ncreate = true\n",
        &format!("[stream]\ncreate = true\npartitions = {PARTITIONS}\nshards = {SHARDS}\n"),
    )
}

/// Where screenshots and Chromium's log go.
fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("browser-artifacts");
    std::fs::create_dir_all(&dir).expect("create target/browser-artifacts");
    // Printed paths read `…/target/…`, not `…/host/../target/…`.
    dir.canonicalize().unwrap_or(dir)
}

/// The Chromium binary: `$WEIR_CHROMIUM`, else the first of Debian's and
/// others' names on PATH.
fn chromium_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("WEIR_CHROMIUM") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "the browser test needs Chromium and found none on PATH: run `. .ci/setup` \
         (as root it runs `apt-get install -y chromium`), or set WEIR_CHROMIUM to a \
         Chromium or Chrome binary"
    );
}

/// A headless Chromium with a throwaway profile, killed on drop.
struct Chromium {
    child: Child,
    profile: tempfile::TempDir,
}

impl Chromium {
    fn launch(log: &Path) -> Chromium {
        let binary = chromium_binary();
        let profile = tempfile::tempdir().expect("temp dir");
        let log = std::fs::File::create(log).expect("chromium log file");
        let child = Command::new(&binary)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1440,1400",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            // Chromium picks its own port and writes it to the profile: a
            // port picked here could be taken by another test's server
            // before Chromium binds it.
            .arg("--remote-debugging-port=0")
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", binary.display()));
        Chromium { child, profile }
    }

    /// The DevTools session of the browser's first tab.
    async fn first_tab(&mut self) -> Tab {
        let active_port = self.profile.path().join("DevToolsActivePort");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "chromium exited at start ({status}); see its log in target/browser-artifacts"
                );
            }
            // Its first line is the port, once Chromium listens.
            let port = std::fs::read_to_string(&active_port)
                .ok()
                .and_then(|text| text.lines().next()?.trim().parse::<u16>().ok());
            let targets: Option<Vec<Value>> = match port {
                Some(port) => match http
                    .get(format!("http://127.0.0.1:{port}/json/list"))
                    .send()
                    .await
                {
                    Ok(response) => response.json().await.ok(),
                    Err(_) => None,
                },
                None => None,
            };
            let page = targets.into_iter().flatten().find(|t| t["type"] == "page");
            if let Some(url) =
                page.and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_string))
            {
                break url;
            }
            assert!(
                Instant::now() < deadline,
                "chromium's DevTools did not answer within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (socket, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("connect to chromium's DevTools");
        Tab { socket, next_id: 0 }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One tab spoken to over CDP: a request is answered by the message with
/// its id; events in between are dropped (none is subscribed to).
struct Tab {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Tab {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({ "id": id, "method": method, "params": params }).to_string();
        self.socket
            .send(Message::text(request))
            .await
            .expect("send to chromium");
        let answer = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(message) = self.socket.next().await {
                let Ok(Message::Text(text)) = message else {
                    continue;
                };
                let Ok(value) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if value["id"] == id {
                    return value;
                }
            }
            panic!("chromium closed the DevTools connection");
        })
        .await
        .unwrap_or_else(|_| panic!("chromium did not answer {method} within 30 s"));
        assert!(answer["error"].is_null(), "{method} failed: {answer}");
        answer["result"].clone()
    }

    async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
    }

    /// The value of a JavaScript expression in the page.
    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        assert!(
            result["exceptionDetails"].is_null(),
            "{expression} threw: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` (a JSON string) until `check` accepts it.
    async fn until<T: for<'de> Deserialize<'de>, R>(
        &mut self,
        timeout: Duration,
        what: &str,
        expression: &str,
        mut check: impl FnMut(&T) -> Option<R>,
    ) -> R {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.eval(expression).await;
            if let Some(text) = last.as_str()
                && let Ok(seen) = serde_json::from_str::<T>(text)
                && let Some(found) = check(&seen)
            {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for the page to show {what}; it showed {last}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn screenshot(&mut self, path: &Path) {
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let data = shot["data"].as_str().expect("screenshot data");
        let png = data_encoding::BASE64
            .decode(data.as_bytes())
            .expect("screenshot is base64");
        std::fs::write(path, png).expect("write screenshot");
        println!("browser screenshot: {}", path.display());
    }
}

/// What the page shows of the fleet, read from its DOM.
#[derive(Debug, Deserialize)]
struct Shown {
    members: BTreeSet<String>,
    /// (unit, owner; empty: unowned)
    cells: Vec<(String, String)>,
}

const SHOWN: &str = "JSON.stringify({
    members: [...document.querySelectorAll('#members .member')].map(e => e.dataset.member),
    cells: [...document.querySelectorAll('#grid .cell')].map(e => [e.dataset.unit, e.dataset.owner]),
})";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_shows_the_fleet_and_a_killed_hosts_units_moving_in_a_browser() {
    let started = Instant::now();
    let artifacts = artifacts_dir();
    // Fail first, before any host starts, if there is no browser.
    let mut chromium = Chromium::launch(&artifacts.join("chromium.log"));
    let nats = Nats::start();
    let a = Host::spawn_with("host-a", page_config(nats.url(), "host-a"));
    let mut b = Host::spawn_with("host-b", page_config(nats.url(), "host-b"));
    let units = (PARTITIONS * SHARDS) as usize;

    let mut tab = chromium.first_tab().await;
    tab.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 1440, "height": 1400, "deviceScaleFactor": 1, "mobile": false }),
    )
    .await;
    tab.navigate(&format!("{}/", a.url)).await;
    let both: BTreeSet<String> = ["host-a", "host-b"].map(String::from).into();
    let b_units = tab
        .until(
            Duration::from_secs(60),
            "both members and every unit owned by one of them",
            SHOWN,
            |shown: &Shown| {
                let owners: BTreeSet<&str> = shown.cells.iter().map(|(_, o)| o.as_str()).collect();
                let b_units: Vec<String> = shown
                    .cells
                    .iter()
                    .filter(|(_, owner)| owner == "host-b")
                    .map(|(unit, _)| unit.clone())
                    .collect();
                (shown.members == both
                    && shown.cells.len() == units
                    && owners == ["host-a", "host-b"].into()
                    && !b_units.is_empty())
                .then_some(b_units)
            },
        )
        .await;
    tab.screenshot(&artifacts.join("fleet-two-members.png"))
        .await;

    let killed = Instant::now();
    b.child.kill().expect("kill host-b");
    b.child.wait().expect("host-b exits");
    tab.until(
        Duration::from_secs(60),
        "host-b gone and its units owned by host-a",
        SHOWN,
        |shown: &Shown| {
            (shown.members == ["host-a".to_string()].into()
                && shown.cells.len() == units
                && shown.cells.iter().all(|(_, owner)| owner == "host-a"))
            .then_some(())
        },
    )
    .await;
    println!(
        "the page showed host-b's {} units on host-a {:.1?} after the kill",
        b_units.len(),
        killed.elapsed()
    );

    // An operator logs in through the form: the tenant section appears,
    // and a dead letter's replay button works (its POST passes the
    // page's own Origin check with the session cookie).
    let rejected = reqwest::Client::new()
        .post(format!("{}/v1/ingest/orders", a.url))
        .bearer_auth(ACME_KEY)
        .body("{\"email\":\"no-id@example.com\"}\n")
        .send()
        .await
        .expect("front door answers");
    assert_eq!(rejected.status(), 202);
    tab.eval(&format!(
        "document.getElementById('key').value = '{ADMIN_KEY}'; \
         document.getElementById('login').requestSubmit(); 'ok'"
    ))
    .await;
    let sequence: u64 = tab
        .until(
            Duration::from_secs(60),
            "the tenant section and the dead letter",
            "JSON.stringify({
                tenants: !document.getElementById('tenants').hidden,
                letters: [...document.querySelectorAll('#letter-rows tr[data-sequence]')]
                    .map(r => [Number(r.dataset.sequence), r.textContent]),
            })",
            |seen: &Value| {
                let letters = seen["letters"].as_array()?;
                let (sequence, text) = (letters.first()?.get(0)?, letters.first()?.get(1)?);
                (seen["tenants"] == true && text.as_str()?.contains("missing required field `id`"))
                    .then(|| sequence.as_u64())
                    .flatten()
            },
        )
        .await;
    tab.screenshot(&artifacts.join("fleet.png")).await;
    // The same page on a wall screen (large type) and on a phone.
    tab.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 1920, "height": 1080, "deviceScaleFactor": 1, "mobile": false }),
    )
    .await;
    tab.eval("document.getElementById('wall').click(); 'ok'")
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tab.screenshot(&artifacts.join("fleet-wall.png")).await;
    tab.eval("document.getElementById('wall').click(); 'ok'")
        .await;
    tab.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true }),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tab.screenshot(&artifacts.join("fleet-phone.png")).await;
    tab.eval(&format!(
        "document.querySelector('#letter-rows tr[data-sequence=\"{sequence}\"] button').click(); 'ok'"
    ))
    .await;
    tab.until(
        Duration::from_secs(30),
        "the replay done",
        "JSON.stringify(document.getElementById('message').textContent)",
        |message: &String| message.contains("replayed").then_some(()),
    )
    .await;
    drop(a);
    println!(
        "browser test took {:.1?} (chromium: {})",
        started.elapsed(),
        chromium_binary().display()
    );
}

/// A response's `Set-Cookie` values.
fn set_cookies(response: &reqwest::Response) -> Vec<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_json_and_login_work_without_a_browser_and_show_tenants_only_to_an_admin_session()
{
    let nats = Nats::start();
    let host = TestHost::start(&page_config(nats.url(), "host-solo")).await;
    let http = reqwest::Client::new();
    let origin = format!("http://{}", host.host.http_addr());
    let login = |key: &str, origin: Option<&str>| {
        let mut request = http
            .post(host.url("/v1/login"))
            .header("content-type", "application/json")
            .body(json!({ "key": key }).to_string());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };

    // The page itself: embedded, locked down.
    let index = http.get(host.url("/")).send().await.expect("GET /");
    assert_eq!(index.status(), 200);
    let csp = index.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(index.text().await.unwrap().contains("/page/app.js"));
    for asset in ["/page/app.js", "/page/style.css"] {
        assert_eq!(
            http.get(host.url(asset)).send().await.unwrap().status(),
            200,
            "{asset}"
        );
    }

    // Anyone sees the fleet, never a tenant.
    let state: Value = eventually(Duration::from_secs(30), "every unit owned", || async {
        let state: Value = http
            .get(host.url("/v1/page"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let units = state["units"].as_array()?;
        (units.len() == (PARTITIONS * SHARDS) as usize
            && units.iter().all(|u| u["owner"] == "host-solo"))
        .then_some(state)
    })
    .await;
    assert_eq!(state["admin"], false);
    assert!(state.get("tenants").is_none(), "{state}");
    assert_eq!(state["fleet"]["members"][0]["id"], "host-solo");
    assert_eq!(
        (state["partitions"].clone(), state["shards"].clone()),
        (json!(2), json!(4))
    );

    // A wrong key: 401 and no cookie; a right key from elsewhere: 403.
    let wrong = login("not-the-key", Some(&origin))
        .await
        .expect("login answers");
    assert_eq!(wrong.status(), 401);
    assert!(set_cookies(&wrong).is_empty());
    let tenant_key = login(ACME_KEY, Some(&origin)).await.expect("login answers");
    assert_eq!(tenant_key.status(), 401, "a tenant key is not an admin key");
    for bad_origin in [None, Some("http://evil.example")] {
        let refused = login(ADMIN_KEY, bad_origin).await.expect("login answers");
        assert_eq!(refused.status(), 403, "origin {bad_origin:?}");
        assert!(set_cookies(&refused).is_empty());
    }

    // The right admin key: a random token in an HttpOnly, SameSite=Strict
    // cookie, not the key.
    let admin = login(ADMIN_KEY, Some(&origin))
        .await
        .expect("login answers");
    assert_eq!(admin.status(), 200);
    let cookies = set_cookies(&admin);
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let cookie = &cookies[0];
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains(ADMIN_KEY), "{cookie}");
    let session = cookie.split(';').next().unwrap().to_string();
    let token = session
        .strip_prefix("weir_session=")
        .expect("the session cookie");
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token}"
    );

    // With the cookie: tenants (acme's rows show as recent usage).
    let response = host.ingest("orders", crate::support::orders(0, 50)).await;
    assert_eq!(response.status(), 202);
    eventually(
        Duration::from_secs(10),
        "acme's usage on the page",
        || async {
            let state: Value = http
                .get(host.url("/v1/page"))
                .header("cookie", &session)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            assert_eq!(state["admin"], true);
            let tenants = state["tenants"].as_array()?;
            tenants.iter().any(|t| t["tenant"] == "acme").then_some(())
        },
    )
    .await;
    let forged: Value = http
        .get(host.url("/v1/page"))
        .header("cookie", format!("weir_session={}", "0".repeat(64)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(forged["admin"], false);
    assert!(forged.get("tenants").is_none());

    // Dead letters: only with the session; a replay needs the page's origin.
    let no_session = http
        .get(host.url("/v1/page/dead-letters"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_session.status(), 401);
    let response = host
        .ingest("orders", "{\"email\":\"no-id@example.com\"}\n")
        .await;
    assert_eq!(response.status(), 202);
    let letter: Value = eventually(
        Duration::from_secs(30),
        "the dead letter listed",
        || async {
            let listed: Value = http
                .get(host.url("/v1/page/dead-letters"))
                .header("cookie", &session)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            listed["letters"].as_array()?.first().cloned()
        },
    )
    .await;
    assert_eq!(letter["plugin"], "validate", "{letter}");
    assert!(
        letter["reason"]
            .as_str()
            .unwrap()
            .contains("missing required field `id`")
    );
    let replay = |origin: Option<&str>, cookie: Option<&str>| {
        let mut request = http
            .post(host.url("/v1/page/replay"))
            .header("content-type", "application/json")
            .body(json!({ "sequence": letter["sequence"] }).to_string());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send()
    };
    assert_eq!(replay(None, Some(&session)).await.unwrap().status(), 403);
    assert_eq!(
        replay(Some("http://evil.example"), Some(&session))
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(replay(Some(&origin), None).await.unwrap().status(), 401);
    let replayed = replay(Some(&origin), Some(&session)).await.unwrap();
    assert_eq!(replayed.status(), 200);
    assert_eq!(replayed.json::<Value>().await.unwrap()["replayed"], 1);
    assert_eq!(
        replay(Some(&origin), Some(&session))
            .await
            .unwrap()
            .status(),
        404,
        "gone once replayed"
    );

    // Logout ends the session on the server, not only in the browser.
    let logout = http
        .post(host.url("/v1/logout"))
        .header("origin", &origin)
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), 200);
    assert!(set_cookies(&logout)[0].contains("Max-Age=0"));
    let after: Value = http
        .get(host.url("/v1/page"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(after["admin"], false);
    assert!(after.get("tenants").is_none());

    // Guessing is slowed as for API keys: past 20 wrong keys a minute, 429
    // without a look at the key, the right one included.
    let mut wrong_keys = 2; // the tenant's and "not-the-key" above
    loop {
        let answer = login("guess", Some(&origin)).await.expect("login answers");
        if answer.status() == 429 {
            break;
        }
        assert_eq!(answer.status(), 401);
        wrong_keys += 1;
        assert!(wrong_keys <= 20, "still 401 after {wrong_keys} wrong keys");
    }
    assert_eq!(wrong_keys, 20);
    let blocked = login(ADMIN_KEY, Some(&origin))
        .await
        .expect("login answers");
    assert_eq!(blocked.status(), 429);
    assert!(set_cookies(&blocked).is_empty());
    host.shutdown().await;
}

/// The queued-rows chart is kept by the host: a page opened only after rows
/// came and went still shows them (the browser kept it before, so a fresh
/// wall screen started empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_opened_after_rows_came_and_went_shows_them_in_its_history() {
    let nats = Nats::start();
    // A slow transform keeps the rows queued for a few seconds.
    let config = page_config(nats.url(), "host-history").replace(
        "transforms = [\"validate\"]",
        "transforms = [\"validate\", \"slow\"]",
    ) + "\n[plugins.slow]\nwasm = \"weir_chaos.wasm\"\nworld = \"transform\"\n\
         deadline_ms = 10000\nsettings = { mode = \"slow\", slow_ms = 3000 }\n";
    let host = TestHost::start(&config).await;
    let body: String = (0..40)
        .map(|id| format!("{{\"id\":{id},\"email\":\"u{id}@example.com\"}}\n"))
        .collect();
    assert_eq!(host.ingest("orders", body).await.status(), 202);
    eventually(Duration::from_secs(60), "every row delivered", || async {
        (host.sink_lines("orders").len() == 40).then_some(())
    })
    .await;

    // The first page state ever asked for.
    let (history, moved) = eventually(Duration::from_secs(30), "the queue back to 0", || async {
        let state: Value = reqwest::get(host.url("/v1/page"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let samples = state["queued_history"].as_array()?;
        let queued: Vec<u64> = samples
            .iter()
            .filter_map(|s| s["queued_rows"].as_u64())
            .collect();
        let sum = |key: &str| samples.iter().filter_map(|s| s[key].as_u64()).sum::<u64>();
        let moved = (sum("accepted_rows"), sum("delivered_rows"));
        // The sample after the last delivery carries its count.
        (queued.last() == Some(&0) && moved.1 == 40).then_some((queued, moved))
    })
    .await;
    let queued_at_most = history.iter().copied().max().unwrap_or(0);
    assert!(
        queued_at_most >= 40,
        "the 40 rows queued for seconds show in the host's history: {history:?}"
    );
    assert_eq!(
        moved,
        (40, 40),
        "the host's rate history counts each row accepted and delivered once"
    );
}

/// How long the host is under load before the page is opened: the chart's
/// whole window, and a few seconds more.
const LOADED_FOR: Duration = Duration::from_secs(305);
/// Rows posted each second: enough to show, too few to cost CPU.
const ROWS_PER_SECOND: usize = 2;
/// What the page promises: the last five minutes.
const WINDOW: Duration = Duration::from_secs(300);

/// What the page's two charts say they cover, read from the DOM.
#[derive(Debug, Deserialize)]
struct ChartsShown {
    /// Per chart (queued, rates): samples, first and last sample's time.
    covered: Vec<(u64, u64, u64)>,
    /// Rows accepted and delivered over the rates chart's window.
    accepted: u64,
    delivered: u64,
    span: String,
}

/// Empty (read again) until the page drew its first state.
const CHARTS_SHOWN: &str = "(() => {
    const [lag, rates] = ['lag', 'rates'].map(id => document.getElementById(id));
    if (!lag || !rates || !rates.dataset.samples) return '';
    return JSON.stringify({
        covered: [lag, rates].map(c => c.dataset)
            .map(d => [Number(d.samples), Number(d.fromMs), Number(d.toMs)]),
        accepted: Number(rates.dataset.accepted),
        delivered: Number(rates.dataset.delivered),
        span: document.getElementById('history-span').textContent,
    });
})()";

/// A wall screen switched on after five minutes of load shows those five
/// minutes: the queued and rate charts are drawn from the host's history,
/// not from what the page saw (it saw nothing before it opened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_opened_after_five_minutes_of_load_shows_five_minutes_of_history_in_a_browser() {
    // Fail first, before five minutes go by, if there is no browser.
    chromium_binary();
    let nats = Nats::start();
    let host = TestHost::start(&page_config(nats.url(), "host-wall")).await;
    let started = Instant::now();
    let load = {
        let url = host.url("/v1/ingest/orders");
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            for second in 0.. {
                tick.tick().await;
                let body = crate::support::orders(second * ROWS_PER_SECOND, ROWS_PER_SECOND);
                // A refused request shows as fewer accepted rows below.
                let _ = http
                    .post(&url)
                    .bearer_auth(ACME_KEY)
                    .body(body)
                    .send()
                    .await;
            }
        })
    };
    tokio::time::sleep_until((started + LOADED_FOR).into()).await;

    let artifacts = artifacts_dir();
    let mut chromium = Chromium::launch(&artifacts.join("chromium-wall.log"));
    let mut tab = chromium.first_tab().await;
    tab.navigate(&format!("{}/", host.url(""))).await;
    let window = WINDOW;
    // Rows of the window's first minute were posted long before the page
    // opened: their counts can only come from the host.
    let least = (window.as_secs() as usize * ROWS_PER_SECOND / 2) as u64;
    let shown = tab
        .until(
            Duration::from_secs(30),
            "both charts covering five minutes of load",
            CHARTS_SHOWN,
            |shown: &ChartsShown| {
                let full = shown.covered.iter().all(|&(samples, from, to)| {
                    samples as u128 >= window.as_secs() as u128 - 5
                        && u128::from(to.saturating_sub(from)) >= window.as_millis() - 5_000
                });
                (full && shown.accepted >= least && shown.delivered >= least).then(|| {
                    format!(
                        "{:?}, {} rows accepted and {} delivered, \"{}\"",
                        shown.covered, shown.accepted, shown.delivered, shown.span
                    )
                })
            },
        )
        .await;
    tab.screenshot(&artifacts.join("fleet-after-five-minutes.png"))
        .await;
    load.abort();
    println!(
        "the page opened after {:.0?} of load shows {shown}",
        started.elapsed()
    );
    host.shutdown().await;
}
