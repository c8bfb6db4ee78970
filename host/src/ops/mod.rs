//! What operators read: the JSON status report, the HTTP endpoints
//! beside the front door (status, metrics, health, admin reload) and the
//! live page at `/`.

//!
//! Exported: the status report and its parts (`StatusReport`,
//! `FleetTotals`, `ReasonCount`, `RowCounts`), how it shows an unknown
//! count (`known`) and the backlog of every unit (`unit_backlogs`).

pub(crate) mod history;
pub(crate) mod http;
pub(crate) mod page;
pub(crate) mod readiness;
pub(crate) mod status;

pub use status::{FleetTotals, ReasonCount, RowCounts, StatusReport, known, unit_backlogs};
