//! What operators read: the JSON status report, the HTTP endpoints
//! beside the front door (status, metrics, health, admin reload) and the
//! live page at `/`.

//!
//! Exported: the status report and its parts (`StatusReport`,
//! `FleetTotals`, `ReasonCount`, `RowCounts`), how it shows an unknown
//! count (`known`), the backlog of every unit (`unit_backlogs`) and how
//! long a host may be behind the fleet's plugins and still be ready
//! (`BEHIND_GRACE`).

pub(crate) mod history;
pub(crate) mod http;
pub(crate) mod page;
pub(crate) mod readiness;
pub(crate) mod status;

pub use readiness::{ANSWER_BOUND, BEHIND_GRACE, PROBE_EVERY};
pub use status::{FleetTotals, ReasonCount, RowCounts, StatusReport, known, unit_backlogs};
