//! What operators read: the JSON status report and the HTTP endpoints
//! beside the front door (status, metrics, health, admin reload).

pub mod http;
pub mod status;
