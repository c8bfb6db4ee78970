//! Structured log lines sent to the host, which attributes them to the plugin.
//! Outside wasm (a plugin's own tests) they go to stderr.

use crate::bindings::host::Level;

fn log(level: Level, message: &str) {
    #[cfg(target_family = "wasm")]
    crate::bindings::host::log(level, message);
    #[cfg(not(target_family = "wasm"))]
    eprintln!("{level:?}: {message}");
}

/// Logs `message` at trace level.
pub fn trace(message: &str) {
    log(Level::Trace, message);
}

/// Logs `message` at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Logs `message` at info level.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Logs `message` at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Logs `message` at error level.
pub fn error(message: &str) {
    log(Level::Error, message);
}
