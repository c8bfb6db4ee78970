//! Reading a plugin's answer to one call into what each row it was given
//! became ([`super::Stepped`]).

use crate::delivery::batch::{Answer, Batch, Malformed, Outcome};
use crate::sandbox::bindings::{Delivered, Transformed};

use super::{RowOutcome, Stepped};

/// A plugin's answer to one call.
pub(in crate::delivery) enum Reply {
    Transformed(Transformed),
    Delivered(Delivered),
}

/// Reads a plugin's answer for the rows `given`, every row of it.
pub(in crate::delivery) fn read(reply: &Reply, given: &Batch) -> Result<Stepped, Malformed> {
    let transformed = match reply {
        Reply::Transformed(transformed) => transformed,
        Reply::Delivered(delivered) => {
            let outcomes =
                crate::delivery::batch::delivered_as(delivered, given.len(), RowOutcome::from)?;
            return Ok(Stepped::Changed {
                outcomes,
                rows: Batch::default(),
                parents: Vec::new(),
            });
        }
    };
    let mut answer = Answer::new(transformed, given.len())?;
    // The common answer, every row passed on as it is, keeps the batch.
    if answer.all_ok() {
        return Ok(Stepped::Unchanged);
    }
    let mut outcomes = Vec::with_capacity(given.len());
    let mut rows = Batch::with_capacity(given.len(), transformed.data.len());
    let mut parents = Vec::with_capacity(given.len());
    for row in 0..given.len() {
        let outcome = answer.outcome(row)?;
        match &outcome {
            Outcome::Ok => {
                rows.push_from(given, row);
                parents.push(row);
            }
            Outcome::Emit(emitted) => {
                for new in emitted.clone() {
                    answer.push_emitted(&mut rows, given, row, new)?;
                    parents.push(row);
                }
            }
            Outcome::Retry(_) | Outcome::DeadLetter(_) => {}
        }
        outcomes.push(RowOutcome::from(outcome));
    }
    Ok(Stepped::Changed {
        outcomes,
        rows,
        parents,
    })
}
