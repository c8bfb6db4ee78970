//! `[tls]`: the front door speaks HTTPS with the configured certificate,
//! refuses plain HTTP, takes a renewed certificate from its files without
//! a restart, and marks the page's session cookie `Secure`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::nats_auth::tls::tls_files;
use crate::support::{ACME_KEY, Nats, TestHost, base_config, eventually};

/// One HTTP/1.1 request over TLS to `addr`, trusting only `ca`: the
/// response's head and body, or why the connection failed.
async fn https(addr: SocketAddr, ca: &Path, request: &str) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| e.to_string())? {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut stream = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

fn ingest_request(body: &str) -> String {
    format!(
        "POST /v1/ingest/orders HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ACME_KEY}\r\n\
         Content-Type: application/x-ndjson\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_front_door_serves_https_and_takes_a_renewed_certificate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = tls_files(&dir.path().join("first"));
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(&first.server_cert, &cert).unwrap();
    std::fs::copy(&first.server_key, &key).unwrap();
    let nats = Nats::start();
    let config = base_config(
        nats.url(),
        &format!(
            "\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    )
    .replace(
        "max_body_bytes = 1048576\n",
        "max_body_bytes = 1048576\nadmin_api_keys = [\"admin-key-789\"]\n",
    );
    let host = TestHost::start(&config).await;
    let addr = host.host.http_addr();

    let answer = https(addr, &first.ca, &ingest_request("{\"id\":1}\n{\"id\":2}\n"))
        .await
        .expect("an HTTPS request");
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let lines = eventually(Duration::from_secs(30), "the rows delivered", || async {
        let lines = host.sink_lines("orders");
        (lines.len() == 2).then_some(lines)
    })
    .await;
    assert_eq!(lines.len(), 2);

    // Plain HTTP on the TLS port is not served.
    let plain = reqwest::Client::new()
        .get(format!("http://{addr}/livez"))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(
        plain.as_ref().map_or(true, |r| !r.status().is_success()),
        "{plain:?}"
    );

    // The page's session cookie is Secure over TLS.
    let login = "{\"key\":\"admin-key-789\"}";
    let answer = https(
        addr,
        &first.ca,
        &format!(
            "POST /v1/login HTTP/1.1\r\nHost: 127.0.0.1:{0}\r\nOrigin: https://127.0.0.1:{0}\r\n\
             Content-Type: application/json\r\nContent-Length: {1}\r\nConnection: close\r\n\r\n{login}",
            addr.port(),
            login.len()
        ),
    )
    .await
    .expect("a login");
    let cookie = answer
        .lines()
        .find(|line| line.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {answer}"));
    assert!(cookie.contains("; Secure"), "{cookie}");

    // A certificate of another CA, written over the files: new connections
    // get it, and a client of the old CA no longer trusts the host.
    let second = tls_files(&dir.path().join("second"));
    std::fs::copy(&second.server_key, &key).unwrap();
    std::fs::copy(&second.server_cert, &cert).unwrap();
    eventually(
        Duration::from_secs(20),
        "the renewed certificate",
        || async {
            https(addr, &second.ca, &ingest_request("{\"id\":3}\n"))
                .await
                .ok()
                .filter(|answer| answer.starts_with("HTTP/1.1 202"))
        },
    )
    .await;
    let old = https(addr, &first.ca, &ingest_request("{\"id\":4}\n")).await;
    assert!(old.is_err(), "the old CA's client still connects: {old:?}");
    host.shutdown().await;
}

#[test]
fn a_tls_key_that_is_not_a_key_is_named_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let files = tls_files(&dir.path().join("pki"));
    let path = dir.path().join("weir.toml");
    std::fs::write(
        &path,
        format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            files.server_cert.display(),
            files.ca.display()
        ),
    )
    .unwrap();
    let err = weir::config::Config::load(&path, &weir::config::Overrides::default())
        .expect_err("a certificate is no key");
    let text = err.to_string();
    assert!(
        text.contains(&format!("{}:3:7: [tls]", path.display())),
        "{text}"
    );
}

/// `weir send` and `weir status` speak HTTPS to a `[tls]` host: with
/// `--ca` naming the test-made CA they are served; without it the host's
/// certificate is not trusted and they say so (exit code 4).
#[tokio::test(flavor = "multi_thread")]
async fn weir_send_and_status_speak_https_trusting_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls_files(&dir.path().join("pki"));
    let nats = Nats::start();
    let config = base_config(
        nats.url(),
        &format!(
            "\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            pki.server_cert.display(),
            pki.server_key.display()
        ),
    );
    let host = TestHost::start(&config).await;
    let url = format!("https://{}", host.host.http_addr());
    let rows = dir.path().join("rows.ndjson");
    std::fs::write(&rows, crate::support::orders(0, 30)).unwrap();
    let weir = |args: &[&str]| {
        std::process::Command::new(crate::support::WEIR)
            .args(args)
            .env_remove("WEIR_CA")
            .output()
            .unwrap()
    };
    let ca = pki.ca.to_str().unwrap();
    let rows = rows.to_str().unwrap();

    let sent = weir(&[
        "send", "--url", &url, "--ca", ca, "--key", ACME_KEY, "-t", "orders", rows,
    ]);
    let stdout = String::from_utf8_lossy(&sent.stdout);
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(stdout.starts_with("30 rows accepted"), "{stdout}");

    let status = weir(&["status", "--url", &url, "--ca", ca, "--key", ACME_KEY]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );

    // Without the CA, the host's certificate is nobody's the system trusts.
    for args in [
        &[
            "send", "--url", &url, "--key", ACME_KEY, "-t", "orders", rows,
        ][..],
        &["status", "--url", &url, "--key", ACME_KEY][..],
    ] {
        let refused = weir(args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(4), "{args:?}: {stderr}");
        assert!(stderr.contains("certificate"), "{args:?}: {stderr}");
    }
    // A --ca that holds no certificate is said as such.
    let refused = weir(&["status", "--url", &url, "--ca", rows, "--key", ACME_KEY]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot trust --ca {rows}: no PEM certificate in it"
        )),
        "{stderr}"
    );
    host.shutdown().await;
}
