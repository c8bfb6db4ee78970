//! The fleet's compiled components on NATS (`sandbox::shared` says what an
//! artifact is and how it is checked): sealed artifacts in the
//! `<prefix>_compiled` object store, and the claim to compile one as a
//! key `compiling.<artifact>` of the coordination bucket, which lapses on
//! its own if its holder dies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, object_store};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::AsyncReadExt;

use crate::nats::kv::{KvError, KvWrite, NatsKv};
use crate::sandbox::{Claim, FleetArtifacts};
use crate::topology::route::Names;

/// Key prefix of the claims to compile in the coordination bucket.
const COMPILING: &str = "compiling.";
/// A claim outlives its holder by at most this much.
const CLAIM_TTL: Duration = Duration::from_secs(30);
/// How often a holder renews its claim while it compiles.
const CLAIM_RENEW: Duration = Duration::from_secs(10);
/// Chunks of an artifact (tens of MB for a Python component): fewer round
/// trips than the default 128 KiB, within any server's max payload.
const CHUNK: usize = 512 * 1024;

/// The fleet's artifacts, for a process named `who` in the claims it takes.
pub struct FleetCompiled {
    store: object_store::ObjectStore,
    bucket: String,
    kv: NatsKv,
    who: String,
}

impl FleetCompiled {
    /// The fleet's store, if the topology has one (`weir mq apply` makes
    /// it); without it, or unreadable, `None` with the reason logged: each
    /// host then compiles for itself.
    pub async fn open(
        client: &async_nats::Client,
        router: &Names,
        who: &str,
    ) -> Option<Arc<FleetCompiled>> {
        let bucket = router.compiled_store();
        let opened = async {
            let store = jetstream::new(client.clone())
                .get_object_store(&bucket)
                .await
                .map_err(|err| err.to_string())?;
            let kv = NatsKv::open(client, &router.coordination_bucket())
                .await
                .map_err(|err| err.to_string())?;
            Ok::<_, String>((store, kv))
        };
        match opened.await {
            Ok((store, kv)) => Some(Arc::new(FleetCompiled {
                store,
                bucket,
                kv,
                who: who.to_string(),
            })),
            Err(reason) => {
                tracing::warn!(store = %bucket, %reason, "no object store of the fleet's compiled plugins (`weir mq apply` creates it): each host compiles its plugins itself");
                None
            }
        }
    }

    fn claim_key(artifact: &str) -> String {
        format!("{COMPILING}{artifact}")
    }

    /// Who holds the claim on `artifact` now, if anyone.
    async fn claimant(&self, artifact: &str) -> Result<Option<String>, String> {
        let entry = self
            .kv
            .entry(&Self::claim_key(artifact))
            .await
            .map_err(|err| err.to_string())?;
        Ok(entry
            .filter(|entry| entry.operation.is_put())
            .map(|entry| String::from_utf8_lossy(&entry.value).into_owned()))
    }
}

impl FleetArtifacts for FleetCompiled {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>> {
        async move {
            let mut object = match self.store.get(key).await {
                Ok(object) => object,
                Err(err) if err.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
                Err(err) => return Err(format!("object store `{}`: {err}", self.bucket)),
            };
            let mut sealed = Vec::with_capacity(object.info().size);
            object
                .read_to_end(&mut sealed)
                .await
                .map_err(|err| format!("object store `{}`: {key}: {err}", self.bucket))?;
            Ok(Some(sealed))
        }
        .boxed()
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        header: &'a [u8],
        code: &'a mut (dyn tokio::io::AsyncRead + Unpin + Send),
    ) -> BoxFuture<'a, Result<(), String>> {
        async move {
            let meta = object_store::ObjectMetadata {
                name: key.to_string(),
                description: Some(format!("compiled by {}", self.who)),
                chunk_size: Some(CHUNK),
                ..Default::default()
            };
            self.store
                .put(meta, &mut header.chain(code))
                .await
                .map(|_| ())
                .map_err(|err| format!("object store `{}`: {err}", self.bucket))
        }
        .boxed()
    }

    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Claim, String>> {
        async move {
            let claim = Self::claim_key(key);
            let taken = self
                .kv
                .create_with_ttl(&claim, self.who.clone().into(), CLAIM_TTL)
                .await;
            match taken {
                Ok(revision) => Ok(Claim::Taken(Box::new(Held::renewing(
                    self.kv.clone(),
                    claim,
                    self.who.clone(),
                    revision,
                )))),
                Err(KvError::AlreadyExists { .. }) => Ok(Claim::HeldBy(
                    self.claimant(key)
                        .await?
                        .unwrap_or_else(|| "another host".into()),
                )),
                Err(err) => Err(err.to_string()),
            }
        }
        .boxed()
    }
}

/// A claim held: renewed while it lives, given up when dropped.
struct Held {
    renewal: tokio::task::JoinHandle<()>,
    kv: NatsKv,
    key: String,
    revision: Arc<AtomicU64>,
}

impl Held {
    fn renewing(kv: NatsKv, key: String, who: String, revision: u64) -> Held {
        let revision = Arc::new(AtomicU64::new(revision));
        let (renewer, key_renewed, last) = (kv.clone(), key.clone(), revision.clone());
        let renewal = tokio::spawn(async move {
            loop {
                tokio::time::sleep(CLAIM_RENEW).await;
                let at = last.load(Ordering::Relaxed);
                match renewer
                    .update_with_ttl(&key_renewed, who.clone().into(), at, CLAIM_TTL)
                    .await
                {
                    Ok(renewed) => last.store(renewed, Ordering::Relaxed),
                    // Lost (expired and taken): the other compiles too; the
                    // artifacts are the same, whichever is kept.
                    Err(err) => {
                        tracing::debug!(claim = %key_renewed, error = %err, "claim to compile lost");
                        return;
                    }
                }
            }
        });
        Held {
            renewal,
            kv,
            key,
            revision,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.renewal.abort();
        let (kv, key) = (self.kv.clone(), std::mem::take(&mut self.key));
        let revision = self.revision.load(Ordering::Relaxed);
        // The waiters look for the artifact first: deleting the claim only
        // lets them stop waiting sooner when none was kept.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = kv.delete_at(&key, revision).await;
            });
        }
    }
}
