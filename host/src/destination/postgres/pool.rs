//! The connections of a sink granted `grants.postgres`: one pool per loaded
//! plugin version, opened lazily, with TLS when the grant asks for it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::OnceCell;

use crate::config::{PostgresGrant, PostgresTls};

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a granted database cannot be used. Never names the password.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("plugin `{plugin}`: grants.postgres.url `{url}`: {reason}")]
    Url {
        plugin: String,
        url: String,
        reason: String,
    },
    #[error("plugin `{plugin}`: cannot read grants.postgres.{key} {path}: {source}")]
    File {
        plugin: String,
        key: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("plugin `{plugin}`: grants.postgres: {reason}")]
    Setup { plugin: String, reason: String },
}

/// A granted database: the pool, and whether weir's own tables exist yet.
pub struct PgPool {
    pub(crate) pool: Pool,
    /// The URL without its password, for messages.
    pub(crate) shown: String,
    pub(crate) schema: OnceCell<()>,
}

impl std::fmt::Debug for PgPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgPool").field("url", &self.shown).finish()
    }
}

impl PgPool {
    /// The pool of `plugin`'s grant. Nothing connects until a statement
    /// needs a connection.
    pub fn new(plugin: &str, grant: &PostgresGrant) -> Result<Arc<PgPool>, PoolError> {
        let shown = grant.shown_url();
        let mut config: tokio_postgres::Config =
            grant
                .url
                .parse()
                .map_err(|err: tokio_postgres::Error| PoolError::Url {
                    plugin: plugin.to_string(),
                    url: shown.clone(),
                    reason: err.to_string(),
                })?;
        if let Some(path) = &grant.password_file {
            let password = std::fs::read_to_string(path).map_err(|source| PoolError::File {
                plugin: plugin.to_string(),
                key: "password_file",
                path: path.display().to_string(),
                source,
            })?;
            config.password(password.trim_end_matches(['\n', '\r']));
        }
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("weir");
        // A host frozen inside a transaction must not hold its locks (and so
        // the unit's next owner) for longer than this.
        config.options(format!(
            "-c idle_in_transaction_session_timeout={}",
            grant.idle_in_transaction.as_millis()
        ));
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match grant.tls {
            PostgresTls::Disable => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                Manager::from_config(config, tokio_postgres::NoTls, manager_config)
            }
            PostgresTls::VerifyFull => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                let tls = tls_connector(plugin, grant)?;
                Manager::from_config(config, tls, manager_config)
            }
        };
        let pool = Pool::builder(manager)
            .max_size(grant.max_connections.max(1))
            .build()
            .map_err(|err| PoolError::Setup {
                plugin: plugin.to_string(),
                reason: err.to_string(),
            })?;
        Ok(Arc::new(PgPool {
            pool,
            shown,
            schema: OnceCell::new(),
        }))
    }
}

/// rustls with the system's roots and the grant's `ca_file`.
fn tls_connector(
    plugin: &str,
    grant: &PostgresGrant,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PoolError> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system certificate rustls cannot read is one fewer root, not an error.
        let _ = roots.add(cert);
    }
    if let Some(path) = &grant.ca_file {
        let file_error = |source: std::io::Error| PoolError::File {
            plugin: plugin.to_string(),
            key: "ca_file",
            path: path.display().to_string(),
            source,
        };
        let pem = std::fs::read(path).map_err(file_error)?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|err| PoolError::Setup {
                plugin: plugin.to_string(),
                reason: format!("ca_file {}: {err}", path.display()),
            })?;
            roots.add(cert).map_err(|err| PoolError::Setup {
                plugin: plugin.to_string(),
                reason: format!("ca_file {}: {err}", path.display()),
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| PoolError::Setup {
            plugin: plugin.to_string(),
            reason: err.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

impl PgPool {
    /// A pooled connection, once weir's own tables exist in the database.
    pub(crate) async fn ready_client(
        &self,
    ) -> Result<deadpool_postgres::Object, super::error::Failure> {
        use super::error::Failure;
        let client = self.pool.get().await.map_err(|err| match err {
            deadpool_postgres::PoolError::Backend(db) => Failure::Db(db),
            other => Failure::Pool(format!("{} : {other}", self.shown)),
        })?;
        self.schema
            .get_or_try_init(|| super::ledger::create_tables(&client))
            .await?;
        Ok(client)
    }
}
