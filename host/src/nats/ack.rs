//! What a delivered JetStream message's `$JS.ACK…` reply subject says, and
//! answers to it (ack, nak, in progress) sent through one shared client.
//!
//! Delivery keeps core messages and answers them here rather than wrapping
//! each in an async-nats `jetstream::Message`, whose per-message
//! `Context` clone costs two allocations per row.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::AckKind;
use async_nats::{Client, Message};

use super::NatsError;

/// Tokens after `$JS.ACK.` in the longest form read (ADR-15 v2 plus a token).
const MAX_TOKENS: usize = 12;

/// The fields of an ack subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckInfo<'a> {
    pub stream: &'a str,
    pub consumer: &'a str,
    /// How many times the message has been delivered (1 the first time).
    pub delivered: i64,
    pub stream_sequence: u64,
    pub consumer_sequence: u64,
    /// When the server stored the message.
    pub created: SystemTime,
    /// Messages left for the consumer after this one.
    pub pending: u64,
}

/// Parses `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>`
/// and its newer form with `<domain>.<account hash>.` before the stream (and
/// possibly more tokens after `<pending>`), without allocating.
pub fn parse(reply: &str) -> Option<AckInfo<'_>> {
    let mut tokens = [""; MAX_TOKENS];
    let mut count = 0;
    for token in reply.strip_prefix("$JS.ACK.")?.split('.') {
        if count == MAX_TOKENS {
            break;
        }
        tokens[count] = token;
        count += 1;
    }
    let fields = match count {
        7 => &tokens[0..7],
        n if n >= 9 => &tokens[2..9],
        _ => return None,
    };
    let number = |index: usize| fields[index].parse::<u64>().ok();
    Some(AckInfo {
        stream: fields[0],
        consumer: fields[1],
        delivered: fields[2].parse::<i64>().ok()?,
        stream_sequence: number(3)?,
        consumer_sequence: number(4)?,
        created: SystemTime::UNIX_EPOCH + Duration::from_nanos(number(5)?),
        pending: number(6)?,
    })
}

/// The ack subject of a delivered message, read.
pub fn info(message: &Message) -> Option<AckInfo<'_>> {
    message.reply.as_deref().and_then(parse)
}

/// Answers a delivered message: ack, nak (with a delay) or in progress.
pub async fn reply(client: &Client, message: &Message, kind: AckKind) -> Result<(), NatsError> {
    let Some(reply) = &message.reply else {
        return Err(NatsError::NotADelivery);
    };
    Ok(client.publish(reply.clone(), kind.into()).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_ack_subject_forms() {
        let old = parse("$JS.ACK.KV_cfg.watch1.1.42.7.1700000000123456789.3");
        let new = parse("$JS.ACK._.ACCHASH.KV_cfg.watch1.1.42.7.1700000000123456789.3.random");
        let expected = AckInfo {
            stream: "KV_cfg",
            consumer: "watch1",
            delivered: 1,
            stream_sequence: 42,
            consumer_sequence: 7,
            pending: 3,
            created: SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789),
        };
        assert_eq!(old, Some(expected.clone()));
        assert_eq!(new, Some(expected));
        assert_eq!(parse("_INBOX.abc"), None);
        assert_eq!(parse("$JS.ACK.KV_cfg.w.1.x.7.1.3"), None);
        assert_eq!(parse("$JS.ACK.KV_cfg.w.1"), None);
    }
}
