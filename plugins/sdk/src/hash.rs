//! A hash that never changes: for keys a plugin stores or sends, which must
//! mean the same to every build and version of the plugin.

/// FNV-1a (64-bit) offset basis.
const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a (64-bit) prime.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The FNV-1a 64 hash of `bytes`: the same on every platform, build and
/// version, so it may be written to disk or sent to another system (unlike
/// `std`'s `DefaultHasher`, whose algorithm may change and whose
/// `RandomState` is seeded per process). Not a defence against a chosen
/// collision: for telling apart rows, not for security.
///
/// ```
/// assert_eq!(weir_plugin::stable_hash64(b"a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn stable_hash64(bytes: &[u8]) -> u64 {
    let mut hash = OFFSET_BASIS;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::stable_hash64;

    /// Golden values (the published FNV-1a 64 test vectors): a change here
    /// breaks every key already written or sent.
    #[test]
    fn is_fnv1a_64() {
        assert_eq!(stable_hash64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_hash64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
