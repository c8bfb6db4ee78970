//! What operators read: the JSON status report, the HTTP endpoints
//! beside the front door (status, metrics, health, admin reload) and the
//! live page at `/`.

pub mod http;
pub mod page;
pub mod status;
