//! The state a plugin call sees: one overlay per scope of the batch, and
//! which scope each row of the batch belongs to.

use crate::state::scope::Overlay;

/// Set on a plugin's store for one call; taken back after it.
#[derive(Debug, Default)]
pub struct BatchState {
    overlays: Vec<Overlay>,
    /// Per row of the call's batch, its scope's index in `overlays`.
    row_scopes: Vec<usize>,
}

impl BatchState {
    pub fn new(overlays: Vec<Overlay>, row_scopes: Vec<usize>) -> BatchState {
        BatchState {
            overlays,
            row_scopes,
        }
    }

    /// The overlay of `row`'s scope, or what the plugin did wrong.
    pub fn scope_of(&mut self, row: u32) -> Result<&mut Overlay, String> {
        let rows = self.row_scopes.len();
        let scope = self
            .row_scopes
            .get(row as usize)
            .copied()
            .ok_or_else(|| format!("row {row} is not in this batch of {rows} rows"))?;
        self.overlays
            .get_mut(scope)
            .ok_or_else(|| format!("row {row} has no state scope"))
    }

    /// The overlays, for the commit after the batch's rows are done.
    pub fn into_overlays(self) -> Vec<Overlay> {
        self.overlays
    }
}
