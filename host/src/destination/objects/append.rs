//! A sink's objects on one unit (`grants.objects`): what one call appends
//! ([`ObjectsCall`], held by the sandbox while the call runs: each record
//! fitted to the format at once, so a refusal reaches the plugin), and
//! the step that hands the rows the call delivered to the unit's objects
//! once every row has its verdict ([`ObjectsStep`]): what the batch then
//! waits for before those rows are acked.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::config::ObjectsGrant;
use crate::destination::objects::encode::Record;
use crate::destination::objects::filling::{Delivered, UnitObjects, Waiting, check_path};
use crate::destination::objects::store::{Store, StoreSettings};
use crate::destination::outcome::{Fenced, Finished};
use crate::fence::Fence;

/// Most records one input row may add (an explode past this is a bug).
const MAX_RECORDS_PER_ROW: usize = 10_000;
/// The least a call may append, whatever `max_bytes`: a small object
/// bound rolls objects over, it does not refuse the rows of a batch.
const MIN_CALL_BYTES: usize = 64 << 20;

/// A sink's granted store, opened when the plugin loads (nothing is sent
/// until a request needs it), with what goes there.
#[derive(Debug, Clone)]
pub struct ObjectsDestination {
    pub store: Store,
    pub grant: Arc<ObjectsGrant>,
}

/// `grants.objects.credentials_file`: the keys, in TOML.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    access_key_id: String,
    secret_access_key: String,
}

impl ObjectsDestination {
    /// The store of `grant` for sink `sink`, its keys read from the
    /// credentials file (or the `AWS_*` environment without one).
    pub fn open(sink: &str, grant: &ObjectsGrant) -> Result<ObjectsDestination, String> {
        let keys = match &grant.credentials_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|err| {
                    format!(
                        "sink `{sink}`: grants.objects.credentials_file {}: {err}",
                        path.display()
                    )
                })?;
                let keys: Credentials = toml::from_str(&text).map_err(|err| {
                    format!(
                        "sink `{sink}`: grants.objects.credentials_file {} holds no `access_key_id` and `secret_access_key`: {}",
                        path.display(),
                        err.message()
                    )
                })?;
                Some((keys.access_key_id, keys.secret_access_key))
            }
            None => None,
        };
        let settings = StoreSettings {
            endpoint: grant.endpoint.clone(),
            bucket: grant.bucket.clone(),
            region: grant.region.clone(),
            keys,
        };
        let store = Store::open(&settings).map_err(|err| format!("sink `{sink}`: {err}"))?;
        Ok(ObjectsDestination {
            store,
            grant: Arc::new(grant.clone()),
        })
    }
}

/// What one call of a sink granted `objects` appended, per input row.
pub struct ObjectsCall {
    sink: String,
    grant: Arc<ObjectsGrant>,
    /// Per row given to the call, its input row.
    origins: Vec<usize>,
    rows: BTreeMap<usize, (String, Vec<Record>)>,
    bytes: usize,
}

impl ObjectsCall {
    /// Fits `record` to the format and keeps it for row `row`'s object
    /// of `path`; refused with the reason the plugin is to give the row.
    pub fn append(&mut self, row: u32, path: String, record: &[u8]) -> Result<(), String> {
        let sink = &self.sink;
        let input = usize::try_from(row)
            .ok()
            .and_then(|row| self.origins.get(row).copied())
            .ok_or_else(|| {
                format!(
                    "sink `{sink}`: objects append names row {row}, and the batch has {} rows",
                    self.origins.len()
                )
            })?;
        check_path(&path).map_err(|problem| format!("sink `{sink}`: {problem}"))?;
        let fitted = self
            .grant
            .target
            .format
            .fit(record)
            .map_err(|refused| refused.to_string())?;
        // What a call appends stays in the host until the call ends: bounded
        // so a plugin cannot grow it without end, yet far above a batch.
        let max_bytes = self.grant.target.rolling.max_bytes.max(MIN_CALL_BYTES);
        if self.bytes + fitted.size() > max_bytes {
            return Err(format!(
                "sink `{sink}`: one call appended more than {max_bytes} bytes (grants.objects.max_bytes, at least 64 MiB)"
            ));
        }
        let (row_path, records) = self
            .rows
            .entry(input)
            .or_insert_with(|| (path.clone(), Vec::new()));
        if *row_path != path {
            return Err(format!(
                "sink `{sink}`: row {row}'s records go to `{row_path}`, not `{path}`: a row's records go to one object"
            ));
        }
        if records.len() >= MAX_RECORDS_PER_ROW {
            return Err(format!(
                "sink `{sink}`: row {row} appended more than {MAX_RECORDS_PER_ROW} records"
            ));
        }
        self.bytes += fitted.size();
        records.push(fitted);
        Ok(())
    }
}

/// A sink's objects on one unit (see the module).
pub struct ObjectsStep {
    sink: String,
    destination: ObjectsDestination,
    /// The unit consumer's name: its log and its objects' keys name it.
    unit: String,
    /// False for `weir plugin test`: records are fitted, never written.
    commits: bool,
    /// Opened (the log taken over) at the first batch that adds rows;
    /// shared with the runner's isolation lanes: one owner of the log.
    objects: Arc<tokio::sync::Mutex<Option<Arc<UnitObjects>>>>,
    /// This batch: each input row's sequence.
    sequences: Vec<u64>,
    call: Option<ObjectsCall>,
}

impl ObjectsStep {
    pub fn new(
        destination: ObjectsDestination,
        sink: &str,
        unit: String,
        commits: bool,
    ) -> ObjectsStep {
        ObjectsStep {
            sink: sink.to_string(),
            destination,
            unit,
            commits,
            objects: Arc::default(),
            sequences: Vec::new(),
            call: None,
        }
    }

    /// For the sink's call on rows whose (input row, sequence) are `rows`,
    /// of a batch of `inputs` rows: the buffer its appends go to.
    pub fn give(&mut self, inputs: usize, rows: impl Iterator<Item = (usize, u64)>) -> ObjectsCall {
        let origins = crate::destination::call_rows(inputs, rows, &mut self.sequences);
        ObjectsCall {
            sink: self.sink.clone(),
            grant: self.destination.grant.clone(),
            origins,
            rows: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// After the call: what it appended, for [`ObjectsStep::finish`].
    pub fn took(&mut self, call: Option<ObjectsCall>) {
        self.call = call;
    }

    /// The call failed: nothing of it is written.
    pub fn abandon(&mut self) {
        self.call = None;
    }

    /// Once the call's rows have their verdicts: the records of the input
    /// rows `delivered` go into the unit's objects (taken over first, at
    /// the unit's first batch, while `lease` holds); what the batch waits
    /// for before those rows are acked.
    pub async fn finish(
        &mut self,
        delivered: impl Fn(usize) -> bool,
        lease: &dyn Fence,
    ) -> Result<(Finished, Vec<Waiting>), Fenced> {
        let Some(call) = self.call.take() else {
            return Ok((Finished::Committed, Vec::new()));
        };
        let rows: Vec<Delivered> = call
            .rows
            .into_iter()
            .filter(|(input, _)| delivered(*input))
            .map(|(input, (path, records))| Delivered {
                sequence: self.sequences.get(input).copied().unwrap_or_default(),
                path,
                records,
            })
            .collect();
        if rows.is_empty() || !self.commits {
            return Ok((Finished::Committed, Vec::new()));
        }
        if !lease.held() {
            return Err(Fenced(format!(
                "sink `{}`: the lease ran out before its objects",
                self.sink
            )));
        }
        let mut opened = self.objects.lock().await;
        let objects = match &*opened {
            Some(objects) => objects.clone(),
            None => match self.open(lease).await {
                Ok(objects) => opened.insert(Arc::new(objects)).clone(),
                Err(reason) => return Ok((Finished::Again(reason), Vec::new())),
            },
        };
        match objects.add(rows) {
            Ok(waiting) => Ok((Finished::Committed, waiting)),
            Err(reason) => {
                // The committer stopped: past the lease the unit is another
                // host's; else the objects are opened afresh next time.
                *opened = None;
                if lease.held() {
                    Ok((
                        Finished::Again(format!("sink `{}`: {reason}", self.sink)),
                        Vec::new(),
                    ))
                } else {
                    Err(Fenced(format!("sink `{}`: {reason}", self.sink)))
                }
            }
        }
    }

    /// Seals every object being filled, to be committed now: the unit is
    /// released, or the generation changes.
    pub fn flush(&self) {
        // Between batches: no call holds the lock.
        if let Ok(opened) = self.objects.try_lock()
            && let Some(objects) = &*opened
        {
            objects.flush();
        }
    }

    /// The unit consumer's ack floor: the log forgets entries below it.
    pub fn set_ack_floor(&self, floor: u64) {
        if let Ok(opened) = self.objects.try_lock()
            && let Some(objects) = &*opened
        {
            objects.set_ack_floor(floor);
        }
    }

    /// Puts this step's rows into `other`'s objects: an isolation lane's
    /// step into its runner's, and every runner's step of one sink on a
    /// unit into the first's (canary variants, pipelines sharing a sink):
    /// one owner of the unit's log per host.
    pub fn share(&mut self, other: &ObjectsStep) {
        self.objects = other.objects.clone();
    }

    /// A step of the same sink, unit and objects (what later runners
    /// share).
    pub fn shared_handle(&self) -> ObjectsStep {
        ObjectsStep {
            sink: self.sink.clone(),
            destination: self.destination.clone(),
            unit: self.unit.clone(),
            commits: self.commits,
            objects: self.objects.clone(),
            sequences: Vec::new(),
            call: None,
        }
    }

    /// The sink it fills objects for.
    pub fn sink(&self) -> &str {
        &self.sink
    }

    async fn open(&self, lease: &dyn Fence) -> Result<UnitObjects, String> {
        let writer = format!("{}@claim-{}", self.unit, lease.claim());
        UnitObjects::open(
            &self.destination.store,
            Arc::new(self.destination.grant.target.clone()),
            &self.sink,
            &self.unit,
            writer,
            lease.owned(),
        )
        .await
        .map_err(|err| {
            format!(
                "sink `{}`: taking the unit's objects over: {err}",
                self.sink
            )
        })
    }
}
