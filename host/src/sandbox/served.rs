//! The world versions this host runs: today's ([`WIT_VERSION`]) and the
//! previous minor one, so that a plugin built before an upgrade keeps
//! running unchanged (the policy is `wit/README.md`'s).
//!
//! A previous version's imports are today's host functions under its
//! names (`capabilities.rs` links each interface at every version here):
//! an interface a new version changed only by adding functions serves the
//! old import as it is (the component model checks the functions a
//! component imports, not the ones it leaves out). Its exports
//! are bound from the kept copy of its WIT (`bindings::v0_2_0`), and a
//! batch and its answer are converted at the call: 0.2.0 carries their
//! numbers as `list<u32>` where 0.3.0 packs them as little-endian bytes.

use super::bindings::v0_2_0;
use super::bindings::{Batch, Delivered, Transformed};
use crate::sandbox::WIT_VERSION;

/// Every `weir:plugin` version this host runs, today's first.
pub const SERVED_WIT_VERSIONS: &[&str] = &[WIT_VERSION, "0.2.0"];

/// A batch as a 0.2.0 plugin reads it.
pub(super) fn batch_v0_2(rows: &Batch) -> v0_2_0::transform::weir::plugin::types::Batch {
    v0_2_0::transform::weir::plugin::types::Batch {
        data: rows.data.clone(),
        rows: words(&rows.rows),
        sequences: rows
            .sequences
            .chunks_exact(8)
            .map(|n| u64::from_le_bytes([n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]]))
            .collect(),
        attempts: words(&rows.attempts),
        headers: words(&rows.headers),
    }
}

/// A 0.2.0 transform's answer as today's host reads it.
pub(super) fn transformed(
    answer: v0_2_0::transform::weir::plugin::types::Transformed,
) -> Transformed {
    Transformed {
        data: answer.data,
        outcomes: bytes(&answer.outcomes),
        emitted: bytes(&answer.emitted),
        headers: bytes(&answer.headers),
        reasons: answer.reasons,
    }
}

/// A 0.2.0 sink's answer as today's host reads it.
pub(super) fn delivered(answer: v0_2_0::transform::weir::plugin::types::Delivered) -> Delivered {
    Delivered {
        outcomes: bytes(&answer.outcomes),
        reasons: answer.reasons,
    }
}

/// Little-endian u32s (the host packed them: whole numbers of 4 bytes).
fn words(packed: &[u8]) -> Vec<u32> {
    packed
        .chunks_exact(4)
        .map(|n| u32::from_le_bytes([n[0], n[1], n[2], n[3]]))
        .collect()
}

fn bytes(numbers: &[u32]) -> Vec<u8> {
    numbers.iter().flat_map(|n| n.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_and_its_answer_cross_to_0_2_0_number_for_number() {
        let batch = Batch {
            data: b"acme".to_vec(),
            rows: bytes(&[0, 4, 70_000, 1]),
            sequences: [7u64, 1 << 40]
                .iter()
                .flat_map(|n| n.to_le_bytes())
                .collect(),
            attempts: bytes(&[1, 2]),
            headers: Vec::new(),
        };
        let old = batch_v0_2(&batch);
        assert_eq!(old.rows, [0, 4, 70_000, 1]);
        assert_eq!(old.sequences, [7, 1 << 40]);
        assert_eq!(old.attempts, [1, 2]);
        let answer = transformed(v0_2_0::transform::weir::plugin::types::Transformed {
            data: Vec::new(),
            outcomes: vec![0, 3, 2, 500],
            emitted: Vec::new(),
            headers: Vec::new(),
            reasons: vec!["why".into()],
        });
        assert_eq!(words(&answer.outcomes), [0, 3, 2, 500]);
        assert_eq!(answer.reasons, ["why"]);
    }
}
