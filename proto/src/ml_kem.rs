//! The FIPS 203 input check of an ML-KEM encapsulation (public) key received from elsewhere,
//! shared by the client (which encapsulates to a vault key it was given) and the daemon (which
//! parses ML-KEM SubjectPublicKeyInfo).
//!
//! FIPS 203 section 7.2 requires it before `ML-KEM.Encaps`: the key is `384·k + 32` bytes, and
//! its first `384·k` bytes, read as 12-bit coefficients (`ByteDecode12`), are all below the
//! modulus `q = 3329`; equivalently, decoding and re-encoding them gives the same bytes.
//! aws-lc-rs 1.19 (`EncapsulationKey::new`) does not: it takes a key with a coefficient of 3329
//! or more and encapsulates to it (found by the fuzz targets `pq_spki` and `ml_kem_key`).

use std::fmt;

/// The ML-KEM modulus `q`.
pub const Q: u16 = 3329;

/// Why bytes are not an ML-KEM encapsulation key of the expected parameter set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// Not `384·k + 32` bytes.
    Length {
        /// The parameter set's length.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A coefficient of 3329 or more (FIPS 203 section 7.2, the modulus check).
    Modulus {
        /// Index of the coefficient (0-based, over all `k` polynomials).
        index: usize,
        /// Its 12-bit value.
        value: u16,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length { expected, actual } => {
                write!(f, "encapsulation key is {actual} bytes, not {expected}")
            }
            Self::Modulus { index, value } => write!(
                f,
                "encapsulation key coefficient {index} is {value}, not below the modulus {Q} (FIPS 203 section 7.2)"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

/// Checks `ek` as an encapsulation key of the parameter set with module rank `k` (3 for
/// ML-KEM-768, 4 for ML-KEM-1024): its length and the modulus check.
///
/// # Errors
/// [`KeyError`] naming the first problem.
pub fn check_encapsulation_key(ek: &[u8], k: usize) -> Result<(), KeyError> {
    let expected = 384 * k + 32;
    if ek.len() != expected {
        return Err(KeyError::Length { expected, actual: ek.len() });
    }
    // ByteDecode12: every 3 bytes hold two little-endian 12-bit coefficients. (`ek` is exactly
    // 384·k + 32 bytes, so the first 384·k split into whole 3-byte groups.)
    for (i, b) in ek[..384 * k].chunks_exact(3).enumerate() {
        let c0 = u16::from(b[0]) | (u16::from(b[1] & 0x0f) << 8);
        let c1 = u16::from(b[1] >> 4) | (u16::from(b[2]) << 4);
        for (j, value) in [c0, c1].into_iter().enumerate() {
            if value >= Q {
                return Err(KeyError::Modulus { index: 2 * i + j, value });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::kem::{DecapsulationKey, ML_KEM_1024, ML_KEM_768};

    use super::*;

    #[test]
    fn generated_keys_pass_and_out_of_range_coefficients_fail() {
        for (alg, k) in [(&ML_KEM_768, 3), (&ML_KEM_1024, 4)] {
            let dk = DecapsulationKey::generate(alg).unwrap();
            let ek = dk.encapsulation_key().unwrap().key_bytes().unwrap().as_ref().to_vec();
            assert_eq!(check_encapsulation_key(&ek, k), Ok(()));
            assert!(matches!(check_encapsulation_key(&ek, 7 - k), Err(KeyError::Length { .. })));
            // Coefficient 1 (the high nibble of byte 1 and byte 2) set to 4095.
            let mut bad = ek.clone();
            bad[1] |= 0xf0;
            bad[2] = 0xff;
            assert_eq!(check_encapsulation_key(&bad, k), Err(KeyError::Modulus { index: 1, value: 4095 }));
            // The last coefficient exactly q; rho (the last 32 bytes) is not checked.
            let mut last = ek.clone();
            let at = 384 * k - 3;
            last[at + 1] = (last[at + 1] & 0x0f) | ((Q & 0x0f) << 4) as u8;
            last[at + 2] = (Q >> 4) as u8;
            assert_eq!(check_encapsulation_key(&last, k), Err(KeyError::Modulus { index: 256 * k - 1, value: Q }));
            let mut rho = ek;
            rho[384 * k..].fill(0xff);
            assert_eq!(check_encapsulation_key(&rho, k), Ok(()));
        }
    }
}
