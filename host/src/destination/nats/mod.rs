//! NATS subjects a sink publishes to through the host's own connection
//! (`grants.nats`): what a call publishes is checked and buffered while it
//! runs ([`publisher`]), and sent only for the rows delivered, once they have
//! their verdicts ([`publish`]).

mod publish;
mod publisher;

pub use publish::PublishStep;
pub use publisher::{PublishCall, Publisher};
