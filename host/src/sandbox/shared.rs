//! Compiled components shared by the fleet: one host (or `weir plugin
//! push`) compiles a component, seals the native code it made, and every
//! other host with the same engine loads the sealed artifact instead of
//! running Cranelift on the same bytes.
//!
//! The store behind it is the host's to give ([`FleetArtifacts`]: NATS in
//! `reload/releases/compiled.rs`); the sandbox never reaches NATS itself.
//!
//! Architecture invariant: an artifact runs as native code outside the
//! sandbox, so it is loaded only after [`unseal`] has checked that it was
//! made from this exact `.wasm` (its SHA-256), by this engine (the key of
//! its build and settings, as the compiled cache names entries), and that
//! its bytes are the ones sealed (their SHA-256); wasmtime then checks its
//! own header again. The store is one only hosts may write
//! (`topology::permissions`), never a place a tenant or a plugin can.
//!
//! A sealed artifact: [`MAGIC`], the `.wasm`'s SHA-256 (32 bytes), the
//! engine key (32 bytes), the SHA-256 of the native code (32 bytes), then
//! the native code (`Engine::precompile_component`'s bytes).

use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use wasmtime::Engine;

/// The first bytes of every sealed artifact, and its layout's version.
pub const MAGIC: &[u8; 16] = b"weir-compiled-1\n";
const DIGEST: usize = 32;
const HEADER: usize = MAGIC.len() + 3 * DIGEST;

/// A store of sealed artifacts shared by the fleet, and the claims that
/// let one process compile a component while the others wait for it.
/// Errors are reasons: trouble only costs a compilation of one's own.
pub trait FleetArtifacts: Send + Sync {
    /// The sealed artifact kept under `key`, if there is one.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>>;

    /// Keeps the artifact `header` + `code` under `key` (in two parts,
    /// `code` read as it is sent: a big component's code, tens of MB, is
    /// neither copied to be sealed nor held in memory).
    fn put<'a>(
        &'a self,
        key: &'a str,
        header: &'a [u8],
        code: &'a mut (dyn tokio::io::AsyncRead + Unpin + Send),
    ) -> BoxFuture<'a, Result<(), String>>;

    /// Takes the right to compile `key` for the fleet: taken (held while
    /// the guard lives; it lapses by itself if this process dies), or who
    /// holds it.
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Claim, String>>;
}

/// The answer to [`FleetArtifacts::claim`].
pub enum Claim {
    /// This process compiles; dropping the guard gives the claim up.
    Taken(Box<dyn Send + Sync>),
    /// Another process compiles: its name.
    HeldBy(String),
}

/// Where a fleet's artifact of `wasm` for `engine` is kept: the same for
/// every host with this engine, another for any other build or setting.
pub fn key(engine: &Engine, wasm: &[u8]) -> String {
    let engine_key = super::cache::engine_key(engine);
    format!("{}.{}", hex(&Sha256::digest(wasm)), hex(&engine_key[..8]))
}

/// What seals native code whose SHA-256 is `code_digest`, made from
/// `wasm` by `engine`, for the fleet: the artifact is this header
/// followed by the code.
pub fn seal_header(engine: &Engine, wasm: &[u8], code_digest: &[u8; 32]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&Sha256::digest(wasm));
    header.extend_from_slice(&super::cache::engine_key(engine));
    header.extend_from_slice(code_digest);
    header
}

/// The SHA-256 a sealed artifact records of its code.
pub fn code_digest(code: &[u8]) -> [u8; 32] {
    Sha256::digest(code).into()
}

/// Why a sealed artifact is not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a sealed weir artifact")]
    NotSealed,
    #[error("it was compiled from another component")]
    OtherComponent,
    #[error("it was compiled by another engine (another weir build or settings)")]
    OtherEngine,
    #[error("its native code is not the code that was sealed (altered or truncated)")]
    Altered,
}

/// The native code in `sealed`, if it was made from `wasm` by `engine`
/// and is whole.
pub fn unseal<'s>(engine: &Engine, wasm: &[u8], sealed: &'s [u8]) -> Result<&'s [u8], Refusal> {
    if sealed.len() < HEADER || !sealed.starts_with(MAGIC) {
        return Err(Refusal::NotSealed);
    }
    let field = |index: usize| {
        let start = MAGIC.len() + index * DIGEST;
        &sealed[start..start + DIGEST]
    };
    if field(0) != Sha256::digest(wasm).as_slice() {
        return Err(Refusal::OtherComponent);
    }
    if field(1) != super::cache::engine_key(engine).as_slice() {
        return Err(Refusal::OtherEngine);
    }
    let code = &sealed[HEADER..];
    if field(2) != Sha256::digest(code).as_slice() {
        return Err(Refusal::Altered);
    }
    Ok(code)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other_engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        Engine::new(&config).unwrap()
    }

    #[test]
    fn an_artifact_opens_only_for_its_component_its_engine_and_its_bytes() {
        let engine = Engine::default();
        let sealed = [
            seal_header(&engine, b"component", &code_digest(b"native code")),
            b"native code".to_vec(),
        ]
        .concat();
        assert_eq!(
            unseal(&engine, b"component", &sealed),
            Ok(&b"native code"[..])
        );
        assert_eq!(
            unseal(&engine, b"another", &sealed),
            Err(Refusal::OtherComponent)
        );
        assert_eq!(
            unseal(&other_engine(), b"component", &sealed),
            Err(Refusal::OtherEngine)
        );
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(
            unseal(&engine, b"component", &altered),
            Err(Refusal::Altered)
        );
        let truncated = &sealed[..sealed.len() - 1];
        assert_eq!(
            unseal(&engine, b"component", truncated),
            Err(Refusal::Altered)
        );
        assert_eq!(
            unseal(&engine, b"component", &sealed[..HEADER - 1]),
            Err(Refusal::NotSealed)
        );
        assert_eq!(
            unseal(&engine, b"component", b"\0asm...."),
            Err(Refusal::NotSealed)
        );
    }

    #[test]
    fn the_key_names_the_component_and_the_engine() {
        let engine = Engine::default();
        assert_eq!(key(&engine, b"a"), key(&Engine::default(), b"a"));
        assert_ne!(key(&engine, b"a"), key(&engine, b"b"));
        assert_ne!(key(&engine, b"a"), key(&other_engine(), b"a"));
    }
}
