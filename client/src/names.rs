//! The names people type for the API's enums: `ecc-p256`, `sha384`, `pss`, ...
//!
//! The enums themselves are generated in `tpm-vault-proto` (the key algorithms' names are in its
//! table, `tpm_vault_proto::algorithm`); this module only maps them to and from the short
//! lowercase names used by the CLI, the SPEC and JSON output. It does not decide
//! defaults (an `Unspecified` value means "let the daemon choose").

use tpm_vault_proto::algorithm;

use crate::{Error, HashAlgorithm, KeyAlgorithm, KeyUsage, SignatureScheme, TpmState};

/// Short names for the API enums.
///
/// Implemented for [`KeyAlgorithm`], [`HashAlgorithm`], [`SignatureScheme`], [`KeyUsage`] and
/// [`TpmState`].
/// The `Unspecified` value is named `"unspecified"` but is not accepted by
/// [`from_name`](Named::from_name): leave the field unset instead.
///
/// ```
/// use tpm_vault_client::{KeyAlgorithm, Named};
///
/// assert_eq!(KeyAlgorithm::from_name("rsa-3072")?, KeyAlgorithm::Rsa3072);
/// assert_eq!(KeyAlgorithm::EccP384.name(), "ecc-p384");
/// # Ok::<(), tpm_vault_client::Error>(())
/// ```
pub trait Named: Sized + Copy + 'static {
    /// What the values are, for error messages ("key algorithm").
    const KIND: &'static str;
    /// Every value [`from_name`](Named::from_name) accepts, with its name.
    const VALUES: &'static [(&'static str, Self)];

    /// The value's short name, e.g. `"ecc-p256"`.
    fn name(self) -> &'static str;

    /// The names [`from_name`](Named::from_name) accepts, in display order.
    fn names() -> impl Iterator<Item = &'static str> {
        Self::VALUES.iter().map(|(name, _)| *name)
    }

    /// Parses a short name (exact, lowercase).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the accepted values when `name` is not one of them.
    fn from_name(name: &str) -> Result<Self, Error> {
        Self::VALUES.iter().find(|(candidate, _)| *candidate == name).map(|(_, value)| *value).ok_or_else(|| {
            let expected: Vec<&str> = Self::names().collect();
            Error::InvalidInput(format!("unknown {} {:?} (expected one of: {})", Self::KIND, name, expected.join(", ")))
        })
    }
}

/// The names of [`algorithm::ALL`], in its order.
const KEY_ALGORITHM_NAMES: [(&str, KeyAlgorithm); algorithm::ALL.len()] = {
    let mut out = [("", KeyAlgorithm::Unspecified); algorithm::ALL.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = (algorithm::ALL[i].name, algorithm::ALL[i].id);
        i += 1;
    }
    out
};

impl Named for KeyAlgorithm {
    const KIND: &'static str = "key algorithm";
    const VALUES: &'static [(&'static str, Self)] = &KEY_ALGORITHM_NAMES;

    fn name(self) -> &'static str {
        self.info().map_or("unspecified", |a| a.name)
    }
}

impl Named for KeyUsage {
    const KIND: &'static str = "key usage";
    const VALUES: &'static [(&'static str, Self)] =
        &[("sign", KeyUsage::Sign), ("ssh", KeyUsage::Ssh), ("policy", KeyUsage::Policy)];

    fn name(self) -> &'static str {
        match self {
            KeyUsage::Unspecified => "unspecified",
            KeyUsage::Sign => "sign",
            KeyUsage::Ssh => "ssh",
            KeyUsage::Policy => "policy",
        }
    }
}

impl Named for HashAlgorithm {
    const KIND: &'static str = "hash algorithm";
    const VALUES: &'static [(&'static str, Self)] =
        &[("sha256", HashAlgorithm::Sha256), ("sha384", HashAlgorithm::Sha384), ("sha512", HashAlgorithm::Sha512)];

    fn name(self) -> &'static str {
        match self {
            HashAlgorithm::Unspecified => "unspecified",
            HashAlgorithm::Sha256 => "sha256",
            HashAlgorithm::Sha384 => "sha384",
            HashAlgorithm::Sha512 => "sha512",
            HashAlgorithm::Sha1 => "sha1",
        }
    }
}

impl Named for SignatureScheme {
    const KIND: &'static str = "signature scheme";
    const VALUES: &'static [(&'static str, Self)] = &[
        ("ecdsa", SignatureScheme::Ecdsa),
        ("pss", SignatureScheme::RsaPss),
        ("pkcs1", SignatureScheme::RsaPkcs1),
        ("ml-dsa", SignatureScheme::MlDsa),
        ("hybrid", SignatureScheme::Hybrid),
    ];

    fn name(self) -> &'static str {
        match self {
            SignatureScheme::Unspecified => "unspecified",
            SignatureScheme::Ecdsa => "ecdsa",
            SignatureScheme::RsaPss => "pss",
            SignatureScheme::RsaPkcs1 => "pkcs1",
            SignatureScheme::MlDsa => "ml-dsa",
            SignatureScheme::Hybrid => "hybrid",
        }
    }
}

impl Named for TpmState {
    const KIND: &'static str = "TPM state";
    const VALUES: &'static [(&'static str, Self)] =
        &[("ready", TpmState::Ready), ("down", TpmState::Down), ("mismatch", TpmState::Mismatch)];

    fn name(self) -> &'static str {
        match self {
            TpmState::Unspecified => "unspecified",
            TpmState::Ready => "ready",
            TpmState::Down => "down",
            TpmState::Mismatch => "mismatch",
        }
    }
}

/// The hash a key uses when the caller leaves it unspecified (as the daemon does):
/// SHA-384 for P-384 keys, SHA-256 otherwise.
pub fn natural_hash(algorithm: KeyAlgorithm) -> HashAlgorithm {
    algorithm.info().map_or(HashAlgorithm::Sha256, |a| a.default_hash)
}

/// True for keys that sign whole messages, which are therefore never hashed on the client:
/// ML-DSA and hybrid keys (and, for the scheme, `ml-dsa` and `hybrid`).
pub fn signs_whole_messages(algorithm: KeyAlgorithm, scheme: SignatureScheme) -> bool {
    matches!(scheme, SignatureScheme::MlDsa | SignatureScheme::Hybrid)
        || algorithm.info().is_some_and(|a| a.signs_whole_messages())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Named + PartialEq + std::fmt::Debug>() {
        for (name, value) in T::VALUES {
            assert_eq!(value.name(), *name);
            assert_eq!(T::from_name(name).ok(), Some(*value));
        }
    }

    #[test]
    fn names_round_trip() {
        round_trips::<KeyAlgorithm>();
        round_trips::<HashAlgorithm>();
        round_trips::<SignatureScheme>();
        round_trips::<TpmState>();
    }

    #[test]
    fn spec_names() {
        let algs: Vec<_> = KeyAlgorithm::names().collect();
        assert_eq!(
            algs,
            [
                "ecc-p256",
                "ecc-p384",
                "rsa-2048",
                "rsa-3072",
                "ml-dsa-44",
                "ml-dsa-65",
                "ml-dsa-87",
                "ml-kem-768",
                "ml-kem-1024",
                "hybrid-p256-mldsa65"
            ]
        );
        let hashes: Vec<_> = HashAlgorithm::names().collect();
        assert_eq!(hashes, ["sha256", "sha384", "sha512"]);
        let schemes: Vec<_> = SignatureScheme::names().collect();
        assert_eq!(schemes, ["ecdsa", "pss", "pkcs1", "ml-dsa", "hybrid"]);
    }

    #[test]
    fn unknown_and_unspecified_names_are_rejected() {
        let err = KeyAlgorithm::from_name("ecc-p521").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown key algorithm \"ecc-p521\" (expected one of: ecc-p256, ecc-p384, rsa-2048, rsa-3072, ml-dsa-44, \
             ml-dsa-65, ml-dsa-87, ml-kem-768, ml-kem-1024, hybrid-p256-mldsa65)"
        );
        assert!(KeyAlgorithm::from_name("unspecified").is_err());
        assert!(KeyAlgorithm::from_name("ECC-P256").is_err());
        assert!(HashAlgorithm::from_name("sha1").is_err());
        assert!(SignatureScheme::from_name("rsa-pss").is_err());
    }

    #[test]
    fn natural_hashes() {
        assert_eq!(natural_hash(KeyAlgorithm::EccP384), HashAlgorithm::Sha384);
        assert_eq!(natural_hash(KeyAlgorithm::EccP256), HashAlgorithm::Sha256);
        assert_eq!(natural_hash(KeyAlgorithm::Rsa3072), HashAlgorithm::Sha256);
    }
}
