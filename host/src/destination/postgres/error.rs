//! What can go wrong on the way to a granted database: the error a plugin
//! is told ([`StatementError`]) and why a wait ended ([`Failure`]).

use tokio::time::Instant;
use tokio_postgres::error::SqlState;

/// Why a statement failed, as the plugin is told (the WIT `error`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatementError {
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub constraint: Option<String>,
    pub table: Option<String>,
    pub column: Option<String>,
    /// The call cannot commit: every row of it comes back.
    pub retry: bool,
}

impl StatementError {
    /// An error not from the database itself: the call cannot commit.
    pub fn doomed(message: impl Into<String>) -> StatementError {
        StatementError {
            message: message.into(),
            retry: true,
            ..StatementError::default()
        }
    }

    fn from_db(err: &tokio_postgres::Error) -> StatementError {
        let Some(db) = err.as_db_error() else {
            return StatementError::doomed(format!("postgres: {err}"));
        };
        StatementError {
            code: db.code().code().to_string(),
            message: db.message().to_string(),
            detail: db.detail().map(str::to_string),
            constraint: db.constraint().map(str::to_string),
            table: db.table().map(str::to_string),
            column: db.column().map(str::to_string),
            retry: retries(db.code()),
        }
    }
}

impl std::fmt::Display for StatementError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if !self.code.is_empty() {
            write!(f, " ({})", self.code)?;
        }
        Ok(())
    }
}

/// Errors after which the transaction cannot go on, but a later one may
/// succeed: a lost or closed connection, a serialisation failure or a
/// deadlock, a server shutting down or short of resources.
fn retries(code: &SqlState) -> bool {
    let code = code.code();
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57")
        || code.starts_with("58")
        || matches!(code, "40001" | "40P01" | "25P02" | "55P03")
}

/// Why a wait on the database ended without an answer.
pub enum Failure {
    Db(tokio_postgres::Error),
    /// No connection could be had from the pool.
    Pool(String),
    /// The call's connection was lost (and the call doomed) on the way.
    Lost(String),
    /// The call's deadline passed first.
    Late,
}

impl Failure {
    pub fn error(&self) -> StatementError {
        match self {
            Failure::Db(db) => StatementError::from_db(db),
            Failure::Pool(reason) => StatementError::doomed(format!("postgres: {reason}")),
            Failure::Lost(reason) => StatementError::doomed(reason.clone()),
            Failure::Late => {
                StatementError::doomed("the call's deadline passed waiting for the database")
            }
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(err: tokio_postgres::Error) -> Failure {
        Failure::Db(err)
    }
}

/// `work`, given until `ends` (at least a millisecond): a call blocked in
/// the host is not interrupted by the epoch, so this keeps it within its deadline.
pub async fn within<T, E: Into<Failure>>(
    ends: Instant,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, Failure> {
    let left = ends
        .saturating_duration_since(Instant::now())
        .max(std::time::Duration::from_millis(1));
    match tokio::time::timeout(left, work).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(Failure::Late),
    }
}

impl From<Failure> for StatementError {
    fn from(failure: Failure) -> StatementError {
        failure.error()
    }
}
