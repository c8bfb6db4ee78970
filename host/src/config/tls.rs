//! `[tls]`: the front door (and the operator endpoints beside it) served
//! over HTTPS with a certificate and key from files, which a running host
//! reads again when they change.

use std::path::PathBuf;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use toml::Spanned;

use super::checker::Checker;
use super::keys::{Fallback, Key, Reload, keep};

/// `[tls]`: where the files are is a restart's; their contents are re-read
/// when they change.
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "tls",
        "cert",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.tls, &r.tls)),
    ),
    Key::new(
        "tls",
        "key",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.tls, &r.tls)),
    ),
];

/// The front door's certificate chain and private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why the files do not make a TLS server.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("the certificate and key do not make a TLS server: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsFiles {
    /// A rustls server for the files as they are now (HTTP/1.1 only).
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsFileError> {
        let read = |path: &PathBuf, reason: String| TlsFileError::Read {
            path: path.display().to_string(),
            reason,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|err| read(&self.cert, err.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|err| read(&self.cert, err.to_string()))?;
        if chain.is_empty() {
            return Err(TlsFileError::NoCertificate {
                path: self.cert.display().to_string(),
            });
        }
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|err| read(&self.key, err.to_string()))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The root certificates in a PEM file (a private CA a plugin's HTTPS
/// requests trust, `http_ca`): at least one.
pub fn read_roots(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let read = |reason: String| TlsFileError::Read {
        path: path.display().to_string(),
        reason,
    };
    let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|err| read(err.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|err| read(err.to_string()))?;
    if roots.is_empty() {
        return Err(TlsFileError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(roots)
}

/// `[tls]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
}

impl Checker<'_> {
    /// Both files or neither; when given, they must make a TLS server now.
    pub(super) fn tls(&self, raw: &RawTls) -> Option<TlsFiles> {
        let (cert, key) = match (&raw.cert, &raw.key) {
            (None, None) => return None,
            (Some(cert), Some(key)) => (cert, key),
            (Some(set), None) | (None, Some(set)) => {
                self.report(
                    set.span().start,
                    "[tls] needs both `cert` and `key` (PEM files)",
                );
                return None;
            }
        };
        let files = TlsFiles {
            cert: self.resolve(cert.get_ref()),
            key: self.resolve(key.get_ref()),
        };
        match files.server_config() {
            Ok(_) => Some(files),
            Err(err) => {
                let at = match &err {
                    TlsFileError::Read { path, .. } if *path == files.key.display().to_string() => {
                        key
                    }
                    _ => cert,
                };
                self.report(at.span().start, format!("[tls]: {err}"));
                None
            }
        }
    }
}
