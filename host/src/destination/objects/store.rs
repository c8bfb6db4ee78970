//! The object store a sink is granted: any store that speaks S3 (AWS,
//! SeaweedFS, MinIO, R2, …), opened from its endpoint, bucket, region and
//! keys. Create-only writes (`If-None-Match: *`) are what the unit's log
//! (`log.rs`) commits with, so a store that ignores them cannot be used.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};

/// How long one request may take (a whole object's upload included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a sink's objects go, and with which keys. `Debug` never shows
/// the secret.
#[derive(Clone)]
pub struct StoreSettings {
    /// `http(s)://host:port` of an S3-compatible store; `None` for AWS's
    /// own endpoint of `region`.
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
    /// Access key id and secret; `None` takes them from the usual
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`) environment variables.
    pub keys: Option<(String, String)>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key_id", &self.keys.as_ref().map(|(id, _)| id))
            .finish_non_exhaustive()
    }
}

/// Why a store cannot be used: what was asked of it and what it said.
/// Never names the secret.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("bucket `{bucket}` at {at}: {reason}")]
    Setup {
        bucket: String,
        at: String,
        reason: String,
    },
    #[error("bucket `{bucket}` at {at}: {doing}: {said}")]
    Request {
        bucket: String,
        at: String,
        doing: String,
        /// What the store answered (its status, error code and message),
        /// or why nothing answered.
        said: String,
        #[source]
        source: Box<object_store::Error>,
    },
}

/// What a failed request's answer says, in a line: `403 Forbidden:
/// SignatureDoesNotMatch: The request signature …` from S3's XML error, or
/// the client's own words when nothing answered.
fn said(err: &object_store::Error) -> String {
    let text = err.to_string();
    let between = |open: &str, close: &str| {
        let start = text.find(open)? + open.len();
        let end = text[start..].find(close)? + start;
        Some(text[start..end].trim().to_string())
    };
    match (
        between("<Code>", "</Code>"),
        between("<Message>", "</Message>"),
    ) {
        (Some(code), Some(message)) => match between("status code: ", ": <") {
            Some(status) => format!("{status}: {code}: {message}"),
            None => format!("{code}: {message}"),
        },
        _ => text,
    }
}

/// An opened store and what its messages call it.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<dyn ObjectStore>,
    bucket: String,
    at: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store(bucket `{}` at {})", self.bucket, self.at)
    }
}

impl Store {
    /// The store of `settings`. Nothing is sent until a request needs it
    /// (`probe` asks at once).
    pub fn open(settings: &StoreSettings) -> Result<Store, StoreError> {
        // The process may not have chosen rustls's provider (a test, a
        // library user): ring, as everywhere else in weir.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let at = settings
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("AWS S3 ({})", settings.region));
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&settings.bucket)
            .with_region(&settings.region)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT),
            )
            // A refused or unreachable store is retried by the caller,
            // which keeps the rows; a request is retried here only briefly.
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: Duration::from_secs(10),
                ..RetryConfig::default()
            });
        if let Some(endpoint) = &settings.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        if let Some((id, secret)) = &settings.keys {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        let inner = builder.build().map_err(|err| StoreError::Setup {
            bucket: settings.bucket.clone(),
            at: at.clone(),
            reason: err.to_string(),
        })?;
        Ok(Store {
            inner: Arc::new(inner),
            bucket: settings.bucket.clone(),
            at,
        })
    }

    /// Asks the store for one listing under `prefix`: an unreachable
    /// endpoint, refused keys or a missing bucket say so here.
    pub async fn probe(&self, prefix: &str) -> Result<(), StoreError> {
        use futures::StreamExt;
        let prefix = Path::from(prefix);
        let mut listing = self.inner.list(Some(&prefix));
        match listing.next().await {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(source)) => Err(self.failed(format!("listing `{prefix}`"), source)),
        }
    }

    /// The store itself, for what weir's own requests do not cover (tests
    /// and tools reading what a sink wrote).
    pub fn raw(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// A request's failure, saying what was asked.
    pub(crate) fn failed(&self, doing: String, source: object_store::Error) -> StoreError {
        StoreError::Request {
            bucket: self.bucket.clone(),
            at: self.at.clone(),
            doing,
            said: said(&source),
            source: Box::new(source),
        }
    }

    /// Reads a whole object; `None` if there is none under `key`.
    pub(crate) async fn read(&self, key: &Path) -> Result<Option<bytes::Bytes>, StoreError> {
        let got = async { self.inner.get(key).await?.bytes().await };
        match got.await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(self.failed(format!("reading `{key}`"), source)),
        }
    }

    /// What stands under `key`: nothing, an object, or a void one.
    pub(crate) async fn standing(&self, key: &Path) -> Result<Standing, StoreError> {
        let head = object_store::GetOptions {
            head: true,
            ..Default::default()
        };
        match self.inner.get_opts(key, head).await {
            Ok(got) if got.attributes.get(&void_mark()).is_some() => Ok(Standing::Void),
            Ok(_) => Ok(Standing::Written),
            Err(object_store::Error::NotFound { .. }) => Ok(Standing::Missing),
            Err(source) => Err(self.failed(format!("looking for `{key}`"), source)),
        }
    }

    /// Writes `bytes` under `key` only if nothing stands there: `false`
    /// when something does (the store answered 412).
    pub(crate) async fn create(&self, key: &Path, bytes: bytes::Bytes) -> Result<bool, StoreError> {
        self.create_with(key, bytes, object_store::Attributes::new())
            .await
    }

    /// [`Store::create`] of a void object: one that holds no rows and
    /// says so in its metadata (`x-amz-meta-weir-void`), so it is told
    /// from an object written with rows.
    pub(crate) async fn create_void(
        &self,
        key: &Path,
        empty: bytes::Bytes,
    ) -> Result<bool, StoreError> {
        let mut attributes = object_store::Attributes::new();
        attributes.insert(void_mark(), "true".into());
        self.create_with(key, empty, attributes).await
    }

    async fn create_with(
        &self,
        key: &Path,
        bytes: bytes::Bytes,
        attributes: object_store::Attributes,
    ) -> Result<bool, StoreError> {
        let create = object_store::PutOptions {
            mode: object_store::PutMode::Create,
            attributes,
            ..Default::default()
        };
        match self.inner.put_opts(key, bytes.into(), create).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(source) => Err(self.failed(format!("creating `{key}`"), source)),
        }
    }
}

/// What stands under an object's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    Missing,
    Written,
    /// Written empty by a new owner so that a late writer's object can
    /// never appear there ([`crate::destination::UnitLog::take_over`]).
    Void,
}

/// The metadata that marks a void object.
fn void_mark() -> object_store::Attribute {
    object_store::Attribute::Metadata("weir-void".into())
}
