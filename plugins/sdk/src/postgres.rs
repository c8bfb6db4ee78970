//! PostgreSQL for a sink (`grants.postgres` in the plugin's TOML): the host
//! holds the connection pool and the transaction, the plugin decides what
//! to write. Only the `sink` world imports it.
//!
//! What the host promises (the WIT's `postgres` interface):
//! - every statement of one `deliver` call runs in one transaction, which
//!   the host commits only once the call is answered, and only while this
//!   host still holds the rows' unit, together with a record of the rows
//!   the call applied (in `weir_applied`);
//! - rows are acked after COMMIT; a row applied before (its ack lost, its
//!   unit taken over) is acked again without a call, so a sink writes each
//!   row once without deduplicating anything itself;
//! - a call that answers a row with retry commits nothing: every row of the
//!   call comes back;
//! - a failed statement whose [`Error::retry`] is false was undone alone
//!   (the statements before it stand, the plugin goes on); one whose
//!   `retry` is true means the call cannot commit (connection lost,
//!   serialisation failure, no grant): every row of the call comes back
//!   whatever the plugin answers.
//!
//! Parameters are sent with their own types (see [`Value`]); cast in the
//! statement for others (`$1::jsonb`, `$1::timestamptz`). Outside wasm (a
//! plugin's own tests) there is no database: every call fails with a
//! `retry` error.

// The error is the WIT's record as generated, returned as the import does:
// small on wasm32, over clippy's limit only with a native target's pointers.
#![allow(clippy::result_large_err)]

pub use crate::bindings::postgres::{Error, Value};

/// A row a query returned: each column in PostgreSQL's text format, `None`
/// for NULL.
pub type QueryRow = Vec<Option<String>>;

/// Runs one statement in the call's transaction; the rows it affected.
pub fn execute(statement: &str, params: &[Value]) -> Result<u64, Error> {
    imp::execute(statement, params)
}

/// The rows a statement returns, in the call's transaction.
pub fn query(statement: &str, params: &[Value]) -> Result<Vec<QueryRow>, Error> {
    imp::query(statement, params)
}

/// `COPY … FROM STDIN` with `data` in the statement's format (text or
/// CSV), in the call's transaction; the rows copied.
pub fn copy_in(statement: &str, data: &[u8]) -> Result<u64, Error> {
    imp::copy_in(statement, data)
}

#[cfg(target_family = "wasm")]
use crate::bindings::postgres as imp;

/// No host, no database: what a plugin's native tests get.
#[cfg(not(target_family = "wasm"))]
mod imp {
    use super::{Error, QueryRow, Value};

    pub fn execute(statement: &str, _: &[Value]) -> Result<u64, Error> {
        Err(outside_wasm(statement))
    }

    pub fn query(statement: &str, _: &[Value]) -> Result<Vec<QueryRow>, Error> {
        Err(outside_wasm(statement))
    }

    pub fn copy_in(statement: &str, _: &[u8]) -> Result<u64, Error> {
        Err(outside_wasm(statement))
    }

    fn outside_wasm(statement: &str) -> Error {
        Error {
            code: String::new(),
            message: format!("no PostgreSQL outside the weir host (statement {statement:?})"),
            detail: None,
            constraint: None,
            table: None,
            column: None,
            retry: true,
        }
    }
}

impl Error {
    /// The error as a dead-letter reason names it: the database's message,
    /// then its SQLSTATE and the constraint and column it names, then
    /// its detail, e.g. `duplicate key value violates unique constraint
    /// "orders_pkey" (23505, constraint orders_pkey): Key (id)=(7) already exists.`
    pub fn describe(&self) -> String {
        let mut named = Vec::new();
        if !self.code.is_empty() {
            named.push(self.code.clone());
        }
        // The table is left out: the sink knows which it wrote to.
        for (what, name) in [("constraint", &self.constraint), ("column", &self.column)] {
            if let Some(name) = name {
                named.push(format!("{what} {name}"));
            }
        }
        let mut text = self.message.clone();
        if !named.is_empty() {
            text.push_str(&format!(" ({})", named.join(", ")));
        }
        if let Some(detail) = self.detail.as_deref().filter(|d| !d.is_empty()) {
            text.push_str(": ");
            text.push_str(detail);
        }
        text
    }
}

impl From<&str> for Value {
    fn from(text: &str) -> Value {
        Value::Text(text.to_string())
    }
}

impl From<String> for Value {
    fn from(text: String) -> Value {
        Value::Text(text)
    }
}

impl From<i64> for Value {
    fn from(number: i64) -> Value {
        Value::Int(number)
    }
}

impl From<f64> for Value {
    fn from(number: f64) -> Value {
        Value::Float(number)
    }
}

impl From<bool> for Value {
    fn from(flag: bool) -> Value {
        Value::Boolean(flag)
    }
}

impl From<Vec<u8>> for Value {
    fn from(bytes: Vec<u8>) -> Value {
        Value::Bytes(bytes)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(value: Option<T>) -> Value {
        value.map_or(Value::Null, Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error() -> Error {
        Error {
            code: "23505".into(),
            message: "duplicate key value violates unique constraint \"orders_pkey\"".into(),
            detail: Some("Key (id)=(7) already exists.".into()),
            constraint: Some("orders_pkey".into()),
            table: Some("orders".into()),
            column: None,
            retry: false,
        }
    }

    #[test]
    fn an_error_is_described_with_what_it_names() {
        assert_eq!(
            error().describe(),
            "duplicate key value violates unique constraint \"orders_pkey\" \
             (23505, constraint orders_pkey): Key (id)=(7) already exists."
        );
        let bare = Error {
            code: String::new(),
            detail: None,
            constraint: None,
            table: None,
            message: "connection closed".into(),
            ..error()
        };
        assert_eq!(bare.describe(), "connection closed");
    }

    #[test]
    fn outside_wasm_every_call_asks_for_a_retry() {
        let e = execute("SELECT 1", &[Value::from(1_i64)]).unwrap_err();
        assert!(e.retry && e.code.is_empty(), "{}", e.describe());
        assert!(query("SELECT 1", &[]).unwrap_err().retry);
        assert!(copy_in("COPY t FROM STDIN", b"1\n").unwrap_err().retry);
    }

    #[test]
    fn values_convert_from_rust_types() {
        assert!(matches!(Value::from("a"), Value::Text(t) if t == "a"));
        assert!(matches!(Value::from(Some(2_i64)), Value::Int(2)));
        assert!(matches!(Value::from(None::<bool>), Value::Null));
        assert!(matches!(Value::from(vec![1_u8]), Value::Bytes(b) if b == [1]));
    }
}
