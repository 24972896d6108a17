//! Digests, the sampling fingerprint and the per-candidate JSON manifest.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::{Trajectory, TrajectoryError};

/// A SHA-256 digest written `sha256:<64 lowercase hex digits>`.
///
/// ```
/// use trajectory::Digest;
/// let d = Digest::sha256(b"abc");
/// assert_eq!(
///     d.as_str(),
///     "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
/// );
/// assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
/// assert!(Digest::parse("sha256:BA78").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

const SHA256_PREFIX: &str = "sha256:";

impl Digest {
    /// The SHA-256 of `bytes`.
    pub fn sha256(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    fn from_hasher(h: Sha256) -> Self {
        let out = h.finalize();
        let mut s = String::with_capacity(SHA256_PREFIX.len() + 64);
        s.push_str(SHA256_PREFIX);
        for b in out {
            s.push_str(&format!("{b:02x}"));
        }
        Self(s)
    }

    /// Parses `sha256:<64 lowercase hex>`.
    ///
    /// # Errors
    /// [`TrajectoryError::InvalidDigest`].
    pub fn parse(s: &str) -> Result<Self, TrajectoryError> {
        let ok = s.strip_prefix(SHA256_PREFIX).is_some_and(|hex| {
            hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(TrajectoryError::InvalidDigest {
                value: s.to_string(),
            })
        }
    }

    /// The digest as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = TrajectoryError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// Domain separator of the sampling fingerprint (bump when its definition changes).
const FINGERPRINT_DOMAIN: &[u8] = b"flowrl/sampling-fingerprint/v1\0";

/// The sampling fingerprint: a SHA-256 over the sampling configuration and the sigma schedule.
///
/// The configuration is serialised to canonical JSON (object keys sorted at every level, no
/// whitespace, serde_json's number formatting); the sigmas are hashed as their `f32` bits
/// (little-endian), so two schedules that differ in the last bit have different fingerprints —
/// the `1/(2 sigma^2)` factor of the log-density makes such a difference matter.
///
/// Hashed: `domain || canonical_json || 0x00 || len(sigmas) as u64 LE || sigma bits`.
///
/// # Errors
/// [`TrajectoryError::FingerprintConfig`] when the configuration does not serialise,
/// [`TrajectoryError::FingerprintSigma`] for a non-finite sigma.
///
/// ```
/// use std::collections::BTreeMap;
/// use trajectory::sampling_fingerprint;
/// let cfg: BTreeMap<&str, f64> = [("eta", 0.7), ("height", 384.0)].into();
/// let a = sampling_fingerprint(&cfg, &[1.0, 0.5, 0.0]).unwrap();
/// let b = sampling_fingerprint(&cfg, &[1.0, 0.5000001, 0.0]).unwrap();
/// assert_ne!(a, b);
/// assert_eq!(a, sampling_fingerprint(&cfg, &[1.0, 0.5, 0.0]).unwrap());
/// ```
pub fn sampling_fingerprint<C: Serialize + ?Sized>(
    config: &C,
    sigmas: &[f32],
) -> Result<Digest, TrajectoryError> {
    if let Some((index, &value)) = sigmas.iter().enumerate().find(|(_, s)| !s.is_finite()) {
        return Err(TrajectoryError::FingerprintSigma { index, value });
    }
    let value = serde_json::to_value(config)
        .map_err(|source| TrajectoryError::FingerprintConfig { source })?;
    let mut canonical = String::new();
    write_canonical(&value, &mut canonical);
    let mut h = Sha256::new_with_prefix(FINGERPRINT_DOMAIN);
    h.update(canonical.as_bytes());
    h.update([0u8]);
    h.update((sigmas.len() as u64).to_le_bytes());
    for s in sigmas {
        h.update(s.to_bits().to_le_bytes());
    }
    Ok(Digest::from_hasher(h))
}

/// Canonical JSON: sorted object keys, no whitespace.
fn write_canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).expect("a string serialises"));
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The `format` field of a candidate manifest.
pub const MANIFEST_FORMAT: &str = "flowrl.candidate_manifest";
/// The manifest version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// The small JSON manifest each candidate carries in its train metadata: which policy sampled
/// it, under which sampling configuration and weights, and where its sidecar lives.
///
/// ```
/// use trajectory::{CandidateManifest, Digest};
/// let m = CandidateManifest {
///     policy_version: 7,
///     sampling_fingerprint: Digest::sha256(b"sampling"),
///     weight_manifest_hash: Digest::sha256(b"weights"),
///     sample_id: "prompt:42:sample:3".into(),
///     rollout_id: 12,
///     group_index: 5,
///     slot: 3,
/// };
/// let json = m.to_json();
/// assert!(json.contains("\"format_version\":1"));
/// assert_eq!(CandidateManifest::from_json(&json).unwrap(), m);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateManifest {
    /// The policy version the candidate was sampled with.
    pub policy_version: u64,
    /// [`sampling_fingerprint`] of the sampling configuration and sigmas.
    pub sampling_fingerprint: Digest,
    /// Hash of the weight manifest the engine sampled with.
    pub weight_manifest_hash: Digest,
    /// The candidate's stable sample id.
    pub sample_id: String,
    /// The rollout.
    pub rollout_id: u64,
    /// The group (sidecar) within the rollout.
    pub group_index: u64,
    /// The candidate's slot within the group.
    pub slot: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestJson {
    format: String,
    format_version: u32,
    policy_version: u64,
    sampling_fingerprint: Digest,
    weight_manifest_hash: Digest,
    sample_id: String,
    rollout_id: u64,
    group_index: u64,
    slot: u32,
}

impl CandidateManifest {
    /// The manifest as compact JSON (with `format` and `format_version`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&ManifestJson {
            format: MANIFEST_FORMAT.into(),
            format_version: MANIFEST_VERSION,
            policy_version: self.policy_version,
            sampling_fingerprint: self.sampling_fingerprint.clone(),
            weight_manifest_hash: self.weight_manifest_hash.clone(),
            sample_id: self.sample_id.clone(),
            rollout_id: self.rollout_id,
            group_index: self.group_index,
            slot: self.slot,
        })
        .expect("a manifest serialises")
    }

    /// Parses and validates a manifest.
    ///
    /// # Errors
    /// [`TrajectoryError::ManifestJson`] (bad JSON, unknown or missing fields, malformed
    /// digests), [`TrajectoryError::ManifestVersion`].
    pub fn from_json(json: &str) -> Result<Self, TrajectoryError> {
        let m: ManifestJson = serde_json::from_str(json)
            .map_err(|source| TrajectoryError::ManifestJson { source })?;
        if m.format != MANIFEST_FORMAT || m.format_version != MANIFEST_VERSION {
            return Err(TrajectoryError::ManifestVersion {
                format: m.format,
                version: m.format_version,
                expected: MANIFEST_FORMAT,
                supported: MANIFEST_VERSION,
            });
        }
        Ok(Self {
            policy_version: m.policy_version,
            sampling_fingerprint: m.sampling_fingerprint,
            weight_manifest_hash: m.weight_manifest_hash,
            sample_id: m.sample_id,
            rollout_id: m.rollout_id,
            group_index: m.group_index,
            slot: m.slot,
        })
    }

    /// The manifest of candidate `slot` of a trajectory.
    ///
    /// # Errors
    /// [`TrajectoryError::OutOfRange`] for an unknown slot.
    pub fn for_candidate(traj: &Trajectory, slot: usize) -> Result<Self, TrajectoryError> {
        let c = traj
            .common
            .candidates
            .get(slot)
            .ok_or(TrajectoryError::OutOfRange {
                what: "candidate slot",
                index: slot,
                len: traj.num_candidates(),
            })?;
        Ok(Self {
            policy_version: c.policy_version,
            sampling_fingerprint: traj.common.sampling_fingerprint.clone(),
            weight_manifest_hash: traj.common.weight_manifest_hash.clone(),
            sample_id: c.sample_id.clone(),
            rollout_id: traj.common.rollout_id,
            group_index: traj.common.group_index,
            slot: u32::try_from(slot).expect("a group has fewer than 2^32 candidates"),
        })
    }

    /// Checks that this manifest describes candidate `self.slot` of `traj` (the sidecar the
    /// trainer rehydrated): every field must agree.
    ///
    /// # Errors
    /// [`TrajectoryError::ManifestMismatch`] naming the first field that differs, or
    /// [`TrajectoryError::OutOfRange`] when the slot does not exist.
    pub fn check_against(&self, traj: &Trajectory) -> Result<(), TrajectoryError> {
        let other = Self::for_candidate(traj, self.slot as usize)?;
        let mismatch = |field, a: String, b: String| {
            if a == b {
                Ok(())
            } else {
                Err(TrajectoryError::ManifestMismatch {
                    field,
                    manifest: a,
                    sidecar: b,
                })
            }
        };
        mismatch(
            "rollout_id",
            self.rollout_id.to_string(),
            other.rollout_id.to_string(),
        )?;
        mismatch(
            "group_index",
            self.group_index.to_string(),
            other.group_index.to_string(),
        )?;
        mismatch("sample_id", self.sample_id.clone(), other.sample_id.clone())?;
        mismatch(
            "policy_version",
            self.policy_version.to_string(),
            other.policy_version.to_string(),
        )?;
        mismatch(
            "sampling_fingerprint",
            self.sampling_fingerprint.to_string(),
            other.sampling_fingerprint.to_string(),
        )?;
        mismatch(
            "weight_manifest_hash",
            self.weight_manifest_hash.to_string(),
            other.weight_manifest_hash.to_string(),
        )
    }
}
