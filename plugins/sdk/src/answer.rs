//! What a transform's and a sink's answers share: one outcome (code and
//! argument, `weir_layout::outcome`) per input row, in order, and the
//! reasons of dead-lettered rows. `Outcomes` and `Deliveries` both write
//! through it, so the two answers are packed by the same code.

use weir_layout::outcome;

/// Outcomes in the order rows were decided, packed.
pub(crate) struct Answer {
    /// [`outcome::BYTES`] bytes (little-endian numbers) per decided row.
    pub outcomes: Vec<u8>,
    pub reasons: Vec<String>,
}

impl Answer {
    /// Room for the outcomes of `rows` rows.
    pub fn with_capacity(rows: usize) -> Answer {
        Answer {
            outcomes: Vec::with_capacity(rows * outcome::BYTES),
            reasons: Vec::new(),
        }
    }

    pub fn ok(&mut self) {
        self.push(outcome::Record::ok());
    }

    /// Replaces the row by the next `rows` emitted rows (transforms only).
    pub fn emit(&mut self, rows: u32) {
        self.push(outcome::Record::emit(rows));
    }

    pub fn retry(&mut self, after_ms: u32) {
        self.push(outcome::Record::retry(after_ms));
    }

    /// Dead-letters the row with `reason`.
    pub fn dead_letter(&mut self, reason: String) {
        self.push(outcome::Record::dead_letter(weir_layout::number(
            self.reasons.len(),
        )));
        self.reasons.push(reason);
    }

    fn push(&mut self, decided: outcome::Record) {
        self.outcomes.extend_from_slice(&decided.encode());
    }

    /// How many rows have been decided.
    pub fn len(&self) -> usize {
        outcome::count(&self.outcomes)
    }

    /// The decisions so far, in order.
    pub fn records(&self) -> impl Iterator<Item = outcome::Record> + '_ {
        outcome::records(&self.outcomes)
    }

    /// Reason `index` (empty if there is none), as a dead letter names it.
    pub fn reason(&self, index: u32) -> String {
        self.reasons
            .get(index as usize)
            .cloned()
            .unwrap_or_default()
    }
}
