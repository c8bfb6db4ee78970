//! Where a row goes: the subject it is published on, and back from a subject
//! to its tenant and table.
//!
//! Subjects are `<prefix>.in.<partition>.<shard>.<tenant>.<table>`. For now
//! every row goes to partition 0, shard 0; the partitioned topology replaces
//! [`Router::route`] without changing the subject layout.

use std::fmt::Write as _;

/// One shard's slice of a partition stream: what a consumer pulls from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unit {
    pub partition: u32,
    pub shard: u32,
}

/// Names every subject, stream and consumer weir uses under one prefix.
#[derive(Debug, Clone)]
pub struct Router {
    prefix: String,
}

/// A subject that is not one of weir's row subjects.
#[derive(Debug, thiserror::Error)]
#[error("subject `{0}` is not a weir row subject")]
pub struct NotARowSubject(pub String);

impl Router {
    pub fn new(prefix: &str) -> Self {
        Router {
            prefix: prefix.to_string(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The unit that stores a table's rows.
    pub fn route(&self, _tenant: &str, _table: &str) -> Unit {
        Unit {
            partition: 0,
            shard: 0,
        }
    }

    /// The subject a row of `tenant`/`table` is published on. Tenant and table
    /// names are validated subject tokens (see `config`).
    pub fn subject(&self, unit: Unit, tenant: &str, table: &str) -> String {
        let mut subject =
            String::with_capacity(self.prefix.len() + tenant.len() + table.len() + 16);
        let _ = write!(
            subject,
            "{}.in.{}.{}.{tenant}.{table}",
            self.prefix, unit.partition, unit.shard
        );
        subject
    }

    /// Tenant and table of a row subject, borrowed from it.
    pub fn parse<'s>(&self, subject: &'s str) -> Result<(&'s str, &'s str), NotARowSubject> {
        let not_row = || NotARowSubject(subject.to_string());
        let rest = subject
            .strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.strip_prefix(".in."))
            .ok_or_else(not_row)?;
        let mut tokens = rest.splitn(4, '.');
        let (_partition, _shard) = (tokens.next(), tokens.next());
        match (tokens.next(), tokens.next()) {
            (Some(tenant), Some(table)) if !tenant.is_empty() && !table.is_empty() => {
                Ok((tenant, table))
            }
            _ => Err(not_row()),
        }
    }

    /// The stream that holds a partition's rows.
    pub fn partition_stream(&self, partition: u32) -> String {
        format!("{}_in_{partition}", self.prefix)
    }

    /// Every subject of a partition stream.
    pub fn partition_subjects(&self, partition: u32) -> String {
        format!("{}.in.{partition}.>", self.prefix)
    }

    /// The durable consumer of a unit; stable as shards are added.
    pub fn unit_consumer(&self, unit: Unit) -> String {
        format!("{}_in_{}_{}", self.prefix, unit.partition, unit.shard)
    }

    /// The subjects a unit's consumer takes.
    pub fn unit_filter(&self, unit: Unit) -> String {
        format!("{}.in.{}.{}.>", self.prefix, unit.partition, unit.shard)
    }

    /// The dead-letter stream.
    pub fn dead_letter_stream(&self) -> String {
        format!("{}_dlq", self.prefix)
    }

    /// The subject a dead row of `tenant`/`table` goes to.
    pub fn dead_letter_subject(&self, tenant: &str, table: &str) -> String {
        format!("{}.dlq.{tenant}.{table}", self.prefix)
    }

    /// Every dead-letter subject.
    pub fn dead_letter_subjects(&self) -> String {
        format!("{}.dlq.>", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_round_trips() {
        let router = Router::new("weir");
        let unit = router.route("acme", "orders");
        let subject = router.subject(unit, "acme", "orders");
        assert_eq!(subject, "weir.in.0.0.acme.orders");
        assert_eq!(router.parse(&subject).unwrap(), ("acme", "orders"));
        assert_eq!(router.unit_consumer(unit), "weir_in_0_0");
        assert_eq!(router.unit_filter(unit), "weir.in.0.0.>");
    }

    #[test]
    fn foreign_subjects_are_refused() {
        let router = Router::new("weir");
        assert!(router.parse("other.in.0.0.a.b").is_err());
        assert!(router.parse("weir.in.0.0.a").is_err());
        assert!(router.parse("weir.dlq.a.b").is_err());
    }
}
