//! Structured log lines sent to the host, which attributes them to the plugin.

use crate::transform::weir::plugin::host::{self, Level};

/// Logs `message` at trace level.
pub fn trace(message: &str) {
    host::log(Level::Trace, message);
}

/// Logs `message` at debug level.
pub fn debug(message: &str) {
    host::log(Level::Debug, message);
}

/// Logs `message` at info level.
pub fn info(message: &str) {
    host::log(Level::Info, message);
}

/// Logs `message` at warn level.
pub fn warn(message: &str) {
    host::log(Level::Warn, message);
}

/// Logs `message` at error level.
pub fn error(message: &str) {
    host::log(Level::Error, message);
}
