//! weir's own tables in a granted database: which claim of each unit may
//! commit (`weir_units`), and which rows each commit applied
//! (`weir_applied`). A commit writes both in the sink's transaction, so a
//! row is applied exactly when its record is, and a host whose claim a
//! later one superseded cannot commit.

use std::collections::HashSet;

use deadpool_postgres::ClientWrapper;
use tokio_postgres::Client;

/// Created once per pool, under an advisory lock so hosts starting
/// together do not race on `CREATE TABLE`.
const CREATE_TABLES: &str = "
BEGIN;
SELECT pg_advisory_xact_lock(7340295513);
CREATE TABLE IF NOT EXISTS weir_units (
    sink text NOT NULL,
    unit text NOT NULL,
    claim bigint NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, unit)
);
CREATE TABLE IF NOT EXISTS weir_applied (
    sink text NOT NULL,
    unit text NOT NULL,
    first_seq bigint NOT NULL,
    last_seq bigint NOT NULL,
    seqs bigint[] NOT NULL,
    claim bigint NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    -- The transaction that applied them: the one that wrote the rows.
    tx bigint NOT NULL DEFAULT txid_current()
);
CREATE INDEX IF NOT EXISTS weir_applied_by_unit ON weir_applied (sink, unit, last_seq);
COMMIT;
";

/// Rows of `seqs` the record says were applied.
const APPLIED_AMONG: &str = "
SELECT s FROM weir_applied, unnest(seqs) AS s
WHERE sink = $1 AND unit = $2 AND last_seq >= $3 AND first_seq <= $4 AND s = ANY($5)";

/// The highest sequence any commit applied on the unit.
const HIGHEST: &str = "SELECT max(last_seq) FROM weir_applied WHERE sink = $1 AND unit = $2";

/// Takes the unit's row lock and moves its claim forward, unless a later
/// claim committed already (no row returned).
const FENCE: &str = "
INSERT INTO weir_units (sink, unit, claim) VALUES ($1, $2, $3)
ON CONFLICT (sink, unit) DO UPDATE SET claim = EXCLUDED.claim, committed_at = now()
WHERE weir_units.claim <= EXCLUDED.claim
RETURNING claim";

/// Records the applied rows unless one of them was applied meanwhile (no
/// row inserted). It runs after [`FENCE`], so its snapshot, taken once the
/// unit's row lock is held, sees any commit that lock waited for.
const RECORD: &str = "
INSERT INTO weir_applied (sink, unit, first_seq, last_seq, seqs, claim)
SELECT $1::text, $2::text, $3::int8, $4::int8, $5::int8[], $6::int8
WHERE NOT EXISTS (
    SELECT 1 FROM weir_applied a, unnest(a.seqs) AS s
    WHERE a.sink = $1 AND a.unit = $2 AND a.last_seq >= $3 AND a.first_seq <= $4 AND s = ANY($5)
)";

/// Rows below the unit consumer's ack floor never come back.
const PRUNE: &str = "DELETE FROM weir_applied WHERE sink = $1 AND unit = $2 AND last_seq < $3";

pub(crate) async fn create_tables(client: &Client) -> Result<(), super::error::Failure> {
    client.batch_execute(CREATE_TABLES).await?;
    Ok(())
}

/// Whose rows a ledger entry is: a sink's on one unit.
#[derive(Debug, Clone)]
pub struct Ledger {
    pub sink: String,
    pub unit: String,
}

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A later claim of the unit committed: this host is past its lease.
    #[error("claim {claim} of {unit} is superseded: a later owner committed")]
    Fenced { unit: String, claim: u64 },
    /// Some rows were applied meanwhile (by the unit's previous owner, woken
    /// past its lease): nothing of this call is, its rows run again.
    #[error("rows of this call were applied meanwhile by an earlier owner of {unit}")]
    AppliedMeanwhile { unit: String },
    #[error("postgres: {0}")]
    Db(String),
}

fn as_i64(sequence: u64) -> i64 {
    i64::try_from(sequence).unwrap_or(i64::MAX)
}

fn bounds(seqs: &[i64]) -> (i64, i64) {
    let first = seqs.iter().copied().min().unwrap_or(0);
    let last = seqs.iter().copied().max().unwrap_or(0);
    (first, last)
}

impl Ledger {
    /// Which of `sequences` a commit applied before.
    pub(crate) async fn applied_among(
        &self,
        client: &Client,
        sequences: &[u64],
    ) -> Result<HashSet<u64>, tokio_postgres::Error> {
        let seqs: Vec<i64> = sequences.iter().copied().map(as_i64).collect();
        let (first, last) = bounds(&seqs);
        let rows = client
            .query(
                APPLIED_AMONG,
                &[&self.sink, &self.unit, &first, &last, &seqs],
            )
            .await?;
        let mut applied = HashSet::with_capacity(rows.len());
        for row in rows {
            let sequence: i64 = row.try_get(0)?;
            applied.insert(u64::try_from(sequence).unwrap_or(0));
        }
        Ok(applied)
    }

    /// The highest sequence a commit applied on the unit (0: none).
    pub(crate) async fn highest(&self, client: &Client) -> Result<u64, tokio_postgres::Error> {
        let row = client.query_one(HIGHEST, &[&self.sink, &self.unit]).await?;
        let highest: Option<i64> = row.try_get(0)?;
        Ok(highest.map_or(0, |seq| u64::try_from(seq).unwrap_or(0)))
    }

    /// In the call's open transaction: fences the unit at `claim`, checks
    /// that none of `applied` was applied meanwhile, records them (and
    /// forgets rows below `floor`), and commits.
    pub(crate) async fn commit(
        &self,
        client: &ClientWrapper,
        claim: u64,
        applied: &[u64],
        floor: Option<u64>,
    ) -> Result<(), CommitError> {
        let db = |err: tokio_postgres::Error| CommitError::Db(err.to_string());
        let claim = as_i64(claim);
        let seqs: Vec<i64> = applied.iter().copied().map(as_i64).collect();
        let (first, last) = bounds(&seqs);
        let (fence, record, prune) = futures::try_join!(
            client.prepare_cached(FENCE),
            client.prepare_cached(RECORD),
            client.prepare_cached(PRUNE),
        )
        .map_err(db)?;
        let floor = floor.map(as_i64);
        let fence_params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&self.sink, &self.unit, &claim];
        // One round trip: the server runs them in order, the record's
        // snapshot after the fence's lock.
        let (fenced, recorded, _) = futures::try_join!(
            client.query_opt(&fence, &fence_params),
            async {
                if seqs.is_empty() {
                    return Ok(1);
                }
                client
                    .execute(
                        &record,
                        &[&self.sink, &self.unit, &first, &last, &seqs, &claim],
                    )
                    .await
            },
            async {
                match &floor {
                    Some(floor) => {
                        client
                            .execute(&prune, &[&self.sink, &self.unit, floor])
                            .await
                    }
                    None => Ok(0),
                }
            },
        )
        .map_err(db)?;
        if fenced.is_none() {
            return Err(CommitError::Fenced {
                unit: self.unit.clone(),
                claim: u64::try_from(claim).unwrap_or(0),
            });
        }
        if recorded == 0 {
            return Err(CommitError::AppliedMeanwhile {
                unit: self.unit.clone(),
            });
        }
        client.batch_execute("COMMIT").await.map_err(db)
    }
}
