//! weir's integration tests: ONE test binary, a module per area, helpers in
//! `support`. Every test runs against a real nats-server on a free loopback
//! port and loads real plugins built from `plugins/` for wasm32-wasip2.

mod nats_auth;
mod support;

/// reqwest's TLS (for `weir send` and `weir status` over HTTPS) has no
/// crypto provider of its own: weir's clients bring ring's, and the tests'
/// own `reqwest::Client`s take the process-wide one, installed here before
/// any test runs (as the `ctor` crate would, on Linux).
#[used]
#[unsafe(link_section = ".init_array")]
static INSTALL_RING_PROVIDER: extern "C" fn() = {
    extern "C" fn install() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    install
};

mod authors;
mod boundaries;
mod browser;
mod canary;
mod cli;
mod cluster;
mod cluster_support;
mod compiled;
mod connection;
mod delivery;
mod deploy;
mod destination_faults;
mod dlq;
mod dlq_retention;
mod enrich;
mod fencing;
mod fleet;
mod front_door;
mod front_door_tls;
mod http_sink;
mod idle_cost;
mod kv;
mod lake;
mod logs;
mod metrics;
mod nats_ingest;
mod nats_sink;
mod objects;
mod operator;
mod plugin_tools;
mod policies;
mod postgres;
mod postgres_support;
mod readiness;
mod reload;
mod retries;
mod rollout;
mod stops;
mod sandbox;
mod seaweed_support;
mod secrets;
mod shadow;
mod soak;
mod status;
mod send;
mod state;
mod topology;
mod traces;
