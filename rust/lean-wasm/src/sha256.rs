//! A streaming SHA-256 for lean-js (RustCrypto's `sha2`): a model download is verified chunk by
//! chunk as it streams, and a resumed download compares the digest of the part it already
//! delivered (a [`Sha256::fork`] of the running hash) with the part a server sends again.
use sha2::Digest;
use wasm_bindgen::prelude::*;

/// A SHA-256 in progress: `update` with each chunk, `hex` for the digest of the bytes so far.
#[wasm_bindgen]
#[derive(Clone, Default)]
pub struct Sha256 {
    hasher: sha2::Sha256,
    bytes: f64,
}

#[wasm_bindgen]
impl Sha256 {
    #[wasm_bindgen(constructor)]
    pub fn new() -> Sha256 {
        Sha256::default()
    }

    /// Hashes the next chunk.
    pub fn update(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.bytes += chunk.len() as f64;
    }

    /// An independent copy of this hash's state: both go on from here separately.
    pub fn fork(&self) -> Sha256 {
        self.clone()
    }

    /// How many bytes were hashed.
    #[wasm_bindgen(getter)]
    pub fn bytes(&self) -> f64 {
        self.bytes
    }

    /// The digest of the bytes so far, as 64 lowercase hex digits; the hash can go on after it.
    pub fn hex(&self) -> String {
        let digest = self.hasher.clone().finalize();
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

