//! The content hash of a model's weights: independent of file layout (single or sharded) and
//! of the stored float dtype, dependent on names, shapes and values only.
//!
//! Its bytes are recorded in adapter contracts and training checkpoints: **they never change**.
//! The unit tests pin them.

use sha2::{Digest, Sha256};

/// The digest of one tensor for [`hash_tensors`]: sha256 over the key's bytes, a `0` byte, the
/// shape as little-endian `u64`s (count first) and the values as little-endian `f32`, in the
/// checkpoint's layout (PyTorch `[out, in]` for linear weights).
pub fn tensor_digest(key: &str, shape: &[usize], values: &[f32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update([0u8]);
    h.update((shape.len() as u64).to_le_bytes());
    for d in shape {
        h.update((*d as u64).to_le_bytes());
    }
    for v in values {
        h.update(v.to_le_bytes());
    }
    h.finalize().into()
}

/// The content hash: `"sha256:" + hex(sha256(digest_1 || digest_2 || ...))` over the
/// [`tensor_digest`]s sorted by key. It depends on the weights' values (as `f32`), names and
/// shapes only — the same for a single-file and a sharded copy, and for f32 and bf16 files
/// holding the same (bf16-representable) numbers.
pub fn hash_tensors(mut digests: Vec<(String, [u8; 32])>) -> String {
    digests.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Sha256::new();
    for (_, d) in &digests {
        h.update(d);
    }
    let out: [u8; 32] = h.finalize().into();
    format!("sha256:{}", hex(&out))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Collects [`tensor_digest`]s one tensor at a time (while a loader reads them) and gives
/// their [`hash_tensors`] at the end; the order tensors are added in does not matter.
///
/// ```
/// use model_weights::{ContentHasher, hash_tensors, tensor_digest};
///
/// let mut h = ContentHasher::new();
/// h.add("b.weight", &[2], &[1.0, 2.0]);
/// h.add("a.bias", &[1], &[0.5]);
/// let want = hash_tensors(vec![
///     ("a.bias".into(), tensor_digest("a.bias", &[1], &[0.5])),
///     ("b.weight".into(), tensor_digest("b.weight", &[2], &[1.0, 2.0])),
/// ]);
/// assert_eq!(h.finish(), want);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ContentHasher {
    digests: Vec<(String, [u8; 32])>,
}

impl ContentHasher {
    /// An empty hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one tensor: its key, its shape in the checkpoint's layout and its values as `f32`.
    pub fn add(&mut self, key: &str, shape: &[usize], values: &[f32]) {
        self.digests
            .push((key.to_string(), tensor_digest(key, shape, values)));
    }

    /// The [`hash_tensors`] of everything added.
    pub fn finish(self) -> String {
        hash_tensors(self.digests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pinned bytes: these values were produced by `dit-models`' hash before it moved here
    /// and are recorded in adapter contracts; a change here invalidates every contract.
    #[test]
    fn the_hash_bytes_are_pinned() {
        let d1 = tensor_digest("a.b", &[2, 3], &[1.0, -2.5, 3.0, 0.0, 1e-8, f32::MAX]);
        assert_eq!(
            hex(&d1),
            "353ea7506e46aebb5ec4ab794e6f68fbaa1236d2a2b9df277be7a534edd4aaef"
        );
        let d2 = tensor_digest("a", &[], &[0.5]);
        let d3 = tensor_digest("z", &[0], &[]);
        let h = hash_tensors(vec![("z".into(), d3), ("a.b".into(), d1), ("a".into(), d2)]);
        assert_eq!(
            h,
            "sha256:ac6ccb3bf9d4a07c9f0292fa8c8774a6bf15dabadd75abda937b22b0338ab5f1"
        );
        // sha256 of nothing
        assert_eq!(
            hash_tensors(Vec::new()),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let mut c = ContentHasher::new();
        c.add("a", &[], &[0.5]);
        c.add("z", &[0], &[]);
        c.add("a.b", &[2, 3], &[1.0, -2.5, 3.0, 0.0, 1e-8, f32::MAX]);
        assert_eq!(c.finish(), h);
    }
}
