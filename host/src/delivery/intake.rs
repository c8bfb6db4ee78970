//! A batch's intake: each row decoded once from its message (its ack
//! subject and its row subject), grouped by the pipeline variant that takes
//! it (the tenant's: a canary's candidate or not), and each group packed
//! for the plugins. A row that cannot be decoded is kept with why, to be
//! dead-lettered. What comes after reads rows only from here.

use std::time::SystemTime;

use async_nats::Message;

use crate::delivery::batch::{Batch, Position};
use crate::nats::ack;
use crate::nats::jetstream::is_delivery_header;
use crate::reload::generation::Generation;
use crate::topology::route::{Names, Unit};

/// Largest packed group a worker keeps between batches: more than a
/// default batch of 256 rows of 256 bytes, far less than `batch_bytes`' cap.
const KEPT_MAX_BYTES: usize = 256 << 10;

/// A row's delivery, as its ack subject tells it: read once, here, for
/// every stage after (the plan, the answers, a retried state write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Delivery {
    /// Its sequence in its partition stream.
    pub sequence: u64,
    /// How many times it was delivered.
    pub delivered: i64,
    /// When the stream stored it.
    pub created: SystemTime,
    /// The rows left in the unit after it, as the server counted them.
    pub pending: u64,
}

impl Delivery {
    /// `None` for a message that is no JetStream delivery.
    fn of(message: &Message) -> Option<Delivery> {
        ack::info(message).map(|info| Delivery {
            sequence: info.stream_sequence,
            delivered: info.delivered,
            created: info.created,
            pending: info.pending,
        })
    }
}

/// The rows of one pipeline variant of a batch.
pub(super) struct Group {
    /// The pipeline variant (see `Generation::variant_index`).
    pub variant: usize,
    /// Each row's index in the batch, in batch order.
    pub indexes: Vec<usize>,
    /// The rows, packed for the plugins in the same order.
    pub rows: Batch,
}

/// A batch as delivery runs it.
#[derive(Default)]
pub(super) struct Intake {
    /// Rows of the batch.
    pub rows: usize,
    /// This batch's groups, by first row, then (from `used`) the groups
    /// of earlier batches, kept empty for their buffers.
    groups: Vec<Group>,
    used: usize,
    /// Rows no pipeline can take, and why: their index in the batch.
    pub undeliverable: Vec<(usize, String)>,
}

impl Intake {
    /// An intake of `batch` whose vectors are `spare`'s (the last batch's,
    /// emptied; a batch then costs no allocation of its rows' size), each
    /// message's delivery put in `deliveries` (emptied first), in order.
    pub fn of(
        batch: &[Message],
        deliveries: &mut Vec<Option<Delivery>>,
        router: &Names,
        generation: &Generation,
        unit: Unit,
        mut spare: Intake,
    ) -> Intake {
        spare.rows = batch.len();
        spare.used = 0;
        spare.undeliverable.clear();
        deliveries.clear();
        deliveries.extend(batch.iter().map(Delivery::of));
        for (index, (message, delivery)) in batch.iter().zip(deliveries.iter()).enumerate() {
            let row = match decode(router, generation, unit, message, delivery.as_ref()) {
                Ok(row) => row,
                Err(reason) => {
                    spare.undeliverable.push((index, reason));
                    continue;
                }
            };
            let group = match spare.groups().iter().position(|g| g.variant == row.variant) {
                Some(group) => group,
                None => spare.open_group(row.variant, &batch[index..]),
            };
            let group = &mut spare.groups[group];
            group.indexes.push(index);
            pack(&mut group.rows, message, &row);
        }
        spare
    }

    /// This batch's groups.
    pub fn groups(&self) -> &[Group] {
        &self.groups[..self.used]
    }

    /// A group for `variant`, emptied, sized for the rows `left` (most
    /// batches are one variant's: sized once).
    fn open_group(&mut self, variant: usize, left: &[Message]) -> usize {
        if self.used == self.groups.len() {
            self.groups.push(Group {
                variant,
                indexes: Vec::new(),
                rows: Batch::default(),
            });
        }
        let group = &mut self.groups[self.used];
        group.variant = variant;
        group.indexes.clear();
        group.rows.clear();
        let bytes = left.iter().map(|m| m.payload.len() + 64).sum();
        group.indexes.reserve(left.len());
        group.rows.reserve(left.len(), bytes);
        self.used += 1;
        self.used - 1
    }

    /// Gives back its vectors for the next batch: a group's packed rows are
    /// kept unless they grew large.
    pub fn spare(mut self) -> Intake {
        for group in &mut self.groups {
            if group.rows.capacity() > KEPT_MAX_BYTES {
                group.rows = Batch::default();
            }
        }
        self.used = 0;
        self.undeliverable.clear();
        self
    }
}

/// What delivery needs of a message besides its payload: the variant that
/// takes it and what the plugins are told. Borrows the subject: no copy.
struct Decoded<'a> {
    variant: usize,
    tenant: std::borrow::Cow<'a, str>,
    table: std::borrow::Cow<'a, str>,
    position: Position,
}

fn decode<'a>(
    router: &Names,
    generation: &Generation,
    unit: Unit,
    message: &'a Message,
    delivery: Option<&Delivery>,
) -> Result<Decoded<'a>, String> {
    let delivery = delivery.ok_or("no delivery info: not a JetStream delivery")?;
    let (tenant, table) = router
        .parse(message.subject.as_str())
        .map_err(|err| err.to_string())?;
    let variant = generation
        .variant_index(&table, &tenant, unit)
        .ok_or_else(|| format!("no pipeline takes table `{table}`"))?;
    Ok(Decoded {
        variant,
        tenant,
        table,
        position: Position {
            sequence: delivery.sequence,
            attempt: u32::try_from(delivery.delivered).unwrap_or(u32::MAX),
        },
    })
}

/// Packs one row straight from its message: tenant and table borrowed from
/// the subject, payload and headers (less the server's own) copied once.
fn pack(rows: &mut Batch, message: &Message, row: &Decoded<'_>) {
    let headers = message.headers.iter().flat_map(|headers| {
        headers
            .iter()
            .filter(|(name, _)| !is_delivery_header(name.as_ref()))
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |value| (name.as_ref(), value.as_str()))
            })
    });
    rows.push(
        &row.tenant,
        &row.table,
        &message.payload,
        headers,
        row.position,
    );
}
