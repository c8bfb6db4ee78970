//! One `deliver` call's transaction: the statements a sink issues through
//! the WIT `postgres` interface, each in a savepoint of one transaction on
//! one pooled connection, begun by the first statement. The step
//! (`postgres::commit`) commits or rolls it back once the call is answered.

use std::sync::Arc;

use bytes::Bytes;
use futures::SinkExt;
use tokio::time::Instant;
use tokio_postgres::types::{FromSql, ToSql, Type};

use super::error::{Failure, StatementError, within};
use super::pool::PgPool;

/// A statement parameter, typed as the WIT `value` says.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Null,
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Bytes(Vec<u8>),
}

impl Param {
    fn sql_type(&self) -> Type {
        match self {
            Param::Null | Param::Text(_) => Type::TEXT,
            Param::Int(_) => Type::INT8,
            Param::Float(_) => Type::FLOAT8,
            Param::Bool(_) => Type::BOOL,
            Param::Bytes(_) => Type::BYTEA,
        }
    }

    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        const NULL: Option<&str> = None;
        match self {
            Param::Null => &NULL,
            Param::Text(text) => text,
            Param::Int(int) => int,
            Param::Float(float) => float,
            Param::Bool(boolean) => boolean,
            Param::Bytes(bytes) => bytes,
        }
    }
}

const SAVEPOINT: &str = "SAVEPOINT weir_statement";

/// One call's transaction (see the module).
pub struct PgCall {
    pool: Arc<PgPool>,
    client: Option<deadpool_postgres::Object>,
    began: bool,
    /// Whether `weir_statement` exists (released before the next one).
    savepoint: bool,
    /// Why the call cannot commit, once a statement said so.
    doomed: Option<String>,
    /// The first statement and its BEGIN are on their way.
    first_in_flight: bool,
}

impl PgCall {
    pub fn new(pool: Arc<PgPool>) -> PgCall {
        PgCall {
            pool,
            client: None,
            began: false,
            savepoint: false,
            doomed: None,
            first_in_flight: false,
        }
    }

    /// Whether a statement ran: only then is there anything to commit.
    pub fn began(&self) -> bool {
        self.began
    }

    /// Why the call cannot commit, if a statement said so.
    pub fn doomed(&self) -> Option<&str> {
        self.doomed.as_deref()
    }

    /// The connection, its transaction open, for the commit.
    pub(crate) fn take_connection(&mut self) -> Option<OpenTransaction> {
        self.client
            .take()
            .map(|client| OpenTransaction(Some(client)))
    }

    /// Runs one statement; the rows it affected.
    pub async fn execute(
        &mut self,
        ends: Instant,
        sql: &str,
        params: &[Param],
    ) -> Result<u64, StatementError> {
        self.statement(ends, sql, params, |client, statement, params| {
            Box::pin(async move {
                client
                    .execute_raw(statement, params.iter().map(Param::as_sql))
                    .await
            })
        })
        .await
    }

    /// The rows a statement returns, each column as text (`None`: NULL).
    pub async fn query(
        &mut self,
        ends: Instant,
        sql: &str,
        params: &[Param],
    ) -> Result<Vec<Vec<Option<String>>>, StatementError> {
        let rows = self
            .statement(ends, sql, params, |client, statement, params| {
                Box::pin(async move {
                    client
                        .query(
                            statement,
                            &params.iter().map(Param::as_sql).collect::<Vec<_>>(),
                        )
                        .await
                })
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut columns = Vec::with_capacity(row.len());
            for index in 0..row.len() {
                let AsText(text) = row.try_get(index).map_err(|err| StatementError {
                    message: format!("column {index}: {err}"),
                    ..StatementError::default()
                })?;
                columns.push(text);
            }
            out.push(columns);
        }
        Ok(out)
    }

    /// `COPY … FROM STDIN` with `data`; the rows copied.
    pub async fn copy_in(
        &mut self,
        ends: Instant,
        sql: &str,
        data: Vec<u8>,
    ) -> Result<u64, StatementError> {
        let prelude = self.open(ends).await?;
        let client = self.client.as_ref().ok_or_else(no_connection)?;
        let both = within(ends, async {
            Ok::<_, tokio_postgres::Error>(tokio::join!(client.batch_execute(prelude), async {
                let sink = client.copy_in::<_, Bytes>(sql).await?;
                futures::pin_mut!(sink);
                sink.send(Bytes::from(data)).await?;
                sink.finish().await
            }))
        })
        .await;
        let copied = self.opened(both);
        self.settle(ends, copied).await
    }

    /// Runs `run` on the prepared `sql` right behind this statement's
    /// savepoint, in one round trip (see [`PgCall::open`]).
    async fn statement<T>(
        &mut self,
        ends: Instant,
        sql: &str,
        params: &[Param],
        run: impl for<'a> FnOnce(
            &'a deadpool_postgres::Object,
            &'a tokio_postgres::Statement,
            &'a [Param],
        )
            -> futures::future::BoxFuture<'a, Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StatementError> {
        let prelude = self.open(ends).await?;
        let client = self.client.as_ref().ok_or_else(no_connection)?;
        let types: Vec<Type> = params.iter().map(Param::sql_type).collect();
        let both = within(ends, async {
            Ok::<_, tokio_postgres::Error>(tokio::join!(client.batch_execute(prelude), async {
                let statement = client.prepare_typed_cached(sql, &types).await?;
                run(client, &statement, params).await
            }))
        })
        .await;
        let result = self.opened(both);
        self.settle(ends, result).await
    }

    /// The connection (from the pool, the first time) and what must run
    /// before this statement: its savepoint, and for the first statement
    /// the transaction's BEGIN. The caller sends both at once, and the
    /// server runs them in order.
    async fn open(&mut self, ends: Instant) -> Result<&'static str, StatementError> {
        if let Some(reason) = &self.doomed {
            return Err(StatementError::doomed(format!(
                "the call's transaction cannot commit: {reason}"
            )));
        }
        if self.client.is_none() {
            match within(ends, self.pool.ready_client()).await {
                Ok(client) => self.client = Some(client),
                Err(err) => return Err(self.doom(err)),
            }
        }
        let prelude = match (self.began, self.savepoint) {
            (false, _) => "BEGIN; SAVEPOINT weir_statement",
            (true, true) => "RELEASE SAVEPOINT weir_statement; SAVEPOINT weir_statement",
            (true, false) => SAVEPOINT,
        };
        // Begun as soon as the BEGIN may have reached the server: a call
        // dropped while waiting must close its connection, not pool it.
        let first = !self.began;
        self.began = true;
        self.savepoint = true;
        self.first_in_flight = first;
        Ok(prelude)
    }

    /// The statement's result once its prelude ran; a prelude that failed
    /// (the connection lost) dooms the call.
    fn opened<T>(&mut self, both: Sent<T>) -> Result<T, Failure> {
        let (begun, done) = both?;
        if let Err(err) = begun {
            if done.is_ok() && self.first_in_flight {
                // Only a lost connection fails a BEGIN, and then the
                // statement too: said loudly should it ever not.
                tracing::error!("a statement ran while its transaction's BEGIN failed");
            }
            let reason = self.doom(err).to_string();
            return Err(Failure::Lost(reason));
        }
        self.first_in_flight = false;
        done.map_err(Failure::Db)
    }

    /// A statement's result: an error of the statement alone is undone to
    /// its savepoint, so the statements before it stand.
    async fn settle<T>(
        &mut self,
        ends: Instant,
        result: Result<T, Failure>,
    ) -> Result<T, StatementError> {
        let err = match result {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        let error = err.error();
        if error.retry {
            return Err(self.doom(err));
        }
        let Some(client) = &self.client else {
            return Err(error);
        };
        let undone = within(ends, async {
            client
                .batch_execute("ROLLBACK TO SAVEPOINT weir_statement")
                .await
        })
        .await;
        if let Err(undo) = undone {
            self.doom(undo);
        }
        Err(error)
    }

    /// The call cannot commit any more; the connection, in an unknown
    /// state, is not given back to the pool.
    fn doom(&mut self, err: impl Into<Failure>) -> StatementError {
        let error = StatementError {
            retry: true,
            ..err.into().error()
        };
        self.doomed = Some(error.to_string());
        if let Some(client) = self.client.take() {
            drop(deadpool_postgres::Object::take(client));
        }
        error
    }
}

/// A connection inside a transaction: back to the pool only once the
/// transaction ended ([`OpenTransaction::ended`]); dropped before (a
/// worker aborted mid-commit), its connection is closed, never pooled.
pub(crate) struct OpenTransaction(Option<deadpool_postgres::Object>);

impl OpenTransaction {
    pub(crate) fn client(&self) -> Option<&deadpool_postgres::Object> {
        self.0.as_ref()
    }

    /// COMMIT or ROLLBACK went through: the connection is clean again.
    pub(crate) fn ended(mut self) {
        drop(self.0.take());
    }
}

impl Drop for OpenTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// A call dropped with its transaction open (its worker aborted, its
/// batch abandoned) must not hand that transaction to the pool's next
/// user, who would commit it: the connection is closed instead, and the
/// server rolls it back.
impl Drop for PgCall {
    fn drop(&mut self) {
        if self.began
            && let Some(client) = self.client.take()
        {
            tracing::info!(
                database = %self.pool.shown,
                "a call's transaction was abandoned before its commit: its connection is closed and the database rolls it back"
            );
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// A column of any type as PostgreSQL would print the common ones; a
/// type not read here asks for a cast to text.
struct AsText(Option<String>);

impl<'a> FromSql<'a> for AsText {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<AsText, Box<dyn std::error::Error + Sync + Send>> {
        let text = match *ty {
            Type::BOOL => bool::from_sql(ty, raw)?.to_string(),
            Type::INT2 => i16::from_sql(ty, raw)?.to_string(),
            Type::INT4 => i32::from_sql(ty, raw)?.to_string(),
            Type::INT8 => i64::from_sql(ty, raw)?.to_string(),
            Type::OID => u32::from_sql(ty, raw)?.to_string(),
            Type::FLOAT4 => f32::from_sql(ty, raw)?.to_string(),
            Type::FLOAT8 => f64::from_sql(ty, raw)?.to_string(),
            // jsonb's binary form is a version byte, then the text.
            Type::JSONB => String::from_utf8(raw.get(1..).unwrap_or_default().to_vec())?,
            Type::BYTEA => {
                let mut hex = String::with_capacity(2 + raw.len() * 2);
                hex.push_str("\\x");
                for byte in raw {
                    hex.push_str(&format!("{byte:02x}"));
                }
                hex
            }
            ref other if <&str as FromSql>::accepts(other) || *other == Type::JSON => {
                String::from_utf8(raw.to_vec())?
            }
            ref other => {
                return Err(format!(
                    "a column of type {other} is not read as text here: cast it in the query (`column::text`)"
                )
                .into());
            }
        };
        Ok(AsText(Some(text)))
    }

    fn from_sql_null(_: &Type) -> Result<AsText, Box<dyn std::error::Error + Sync + Send>> {
        Ok(AsText(None))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A statement and its prelude, as they came back.
type Sent<T> = Result<
    (
        Result<(), tokio_postgres::Error>,
        Result<T, tokio_postgres::Error>,
    ),
    Failure,
>;

fn no_connection() -> StatementError {
    StatementError::doomed("the call's connection is gone")
}
