//! The length check of an ML-DSA public key received from elsewhere, shared by the client (which
//! verifies with a vault key's SubjectPublicKeyInfo) and the daemon (which parses ML-DSA
//! SubjectPublicKeyInfo and reads its stored keys back).
//!
//! FIPS 204 (table 2) fixes the size of the encoded public key `pk` of each parameter set: 1312
//! bytes for ML-DSA-44, 1952 for ML-DSA-65, 2592 for ML-DSA-87. aws-lc-rs 1.19 takes a key of any
//! other length and fails every verification with it, so without this check a truncated or
//! padded key reads as "signature invalid" instead of "this is not a key".

use std::fmt;

/// An ML-DSA parameter set (FIPS 204).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParameterSet {
    /// ML-DSA-44.
    MlDsa44,
    /// ML-DSA-65.
    MlDsa65,
    /// ML-DSA-87.
    MlDsa87,
}

impl ParameterSet {
    /// The length of an encoded public key `pk`, in bytes.
    pub const fn public_key_len(self) -> usize {
        match self {
            Self::MlDsa44 => 1312,
            Self::MlDsa65 => 1952,
            Self::MlDsa87 => 2592,
        }
    }

    /// The parameter set's name as FIPS 204 spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::MlDsa44 => "ML-DSA-44",
            Self::MlDsa65 => "ML-DSA-65",
            Self::MlDsa87 => "ML-DSA-87",
        }
    }
}

/// A public key of the wrong length for its parameter set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthError {
    /// The parameter set the key was for.
    pub set: ParameterSet,
    /// The length given.
    pub actual: usize,
}

impl fmt::Display for LengthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} public key is {} bytes, not {}", self.set.name(), self.actual, self.set.public_key_len())
    }
}

impl std::error::Error for LengthError {}

/// Checks that `pk` has the length of a `set` public key.
///
/// # Errors
/// [`LengthError`] when it does not.
pub fn check_public_key(pk: &[u8], set: ParameterSet) -> Result<(), LengthError> {
    if pk.len() == set.public_key_len() {
        Ok(())
    } else {
        Err(LengthError { set, actual: pk.len() })
    }
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::signature::{KeyPair, PqdsaKeyPair, ML_DSA_44_SIGNING, ML_DSA_65_SIGNING, ML_DSA_87_SIGNING};

    use super::*;

    #[test]
    fn generated_keys_pass_and_other_lengths_fail() {
        for (alg, set) in [
            (&ML_DSA_44_SIGNING, ParameterSet::MlDsa44),
            (&ML_DSA_65_SIGNING, ParameterSet::MlDsa65),
            (&ML_DSA_87_SIGNING, ParameterSet::MlDsa87),
        ] {
            let kp = PqdsaKeyPair::generate(alg).unwrap();
            let pk = kp.public_key().as_ref().to_vec();
            assert_eq!(check_public_key(&pk, set), Ok(()));
            for len in [0, 1, pk.len() - 1, pk.len() + 1] {
                let mut other = pk.clone();
                other.resize(len, 0);
                assert_eq!(check_public_key(&other, set), Err(LengthError { set, actual: len }));
            }
        }
        assert_eq!(
            check_public_key(&[0; 1951], ParameterSet::MlDsa65).map_err(|e| e.to_string()),
            Err("ML-DSA-65 public key is 1951 bytes, not 1952".to_owned())
        );
        assert!(check_public_key(&[0; 1312], ParameterSet::MlDsa87).is_err());
    }
}
