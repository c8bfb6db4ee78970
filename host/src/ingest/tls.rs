//! HTTPS at the front door (`[tls]`): the server certificate the listener
//! hands each new connection, read again from its files when they change,
//! so a renewed certificate needs no restart.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::{TlsFileError, TlsFiles};

/// How often the files' modification times are looked at.
const CHECK_PERIOD: Duration = Duration::from_secs(2);

/// The front door's TLS server, as of the files' last good contents.
pub struct FrontDoorTls {
    files: TlsFiles,
    current: RwLock<TlsAcceptor>,
}

impl FrontDoorTls {
    pub fn load(files: TlsFiles) -> Result<Arc<FrontDoorTls>, TlsFileError> {
        let acceptor = TlsAcceptor::from(Arc::new(files.server_config()?));
        Ok(Arc::new(FrontDoorTls {
            files,
            current: RwLock::new(acceptor),
        }))
    }

    /// What a new connection's handshake uses.
    pub fn acceptor(&self) -> TlsAcceptor {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the files again whenever either changes, until `stop`; a pair
    /// that does not load is logged and the last good one kept.
    pub async fn follow(self: Arc<Self>, stop: CancellationToken) {
        let mut seen = self.stamps();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(CHECK_PERIOD) => {}
            }
            let now = self.stamps();
            if now == seen {
                continue;
            }
            seen = now;
            match self.files.server_config() {
                Ok(config) => {
                    let acceptor = TlsAcceptor::from(Arc::new(config));
                    match self.current.write() {
                        Ok(mut current) => *current = acceptor,
                        Err(poisoned) => *poisoned.into_inner() = acceptor,
                    }
                    tracing::info!(cert = %self.files.cert.display(), "front door certificate reloaded");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "front door certificate not reloaded; the last good one stays")
                }
            }
        }
    }

    fn stamps(&self) -> (Option<SystemTime>, Option<SystemTime>) {
        let modified =
            |path: &std::path::Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
        (modified(&self.files.cert), modified(&self.files.key))
    }
}
